#!/usr/bin/env bash
# v1's short-turn and Q&A jobs at about the same audio with flushes twice as large (flow.flush_share 1.0), the
# code of call 3, on call 3's machine where it is still held (set up again where it is not)
set -uo pipefail
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
if ! [[ -f /tmp/cv300m/llm.pt ]] || ! python3 -c "import cosyvoice, orjson" 2>/dev/null; then
  MODEL_SIZE=none bash bench/gpu_setup.sh .whl > /tmp/setup.log 2>&1 || { tail -20 /tmp/setup.log; exit 1; }
  env -u COSYVOICE_ROOT python3 -m convtts.testing.cosyvoice_model --out /tmp/cv300m --size full --tokens-per-text-token 14 --speakers 英文女,英文男 > /tmp/build-v1.log 2>&1
fi
echo "set up at $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
rm -rf /tmp/kinds-v1-flush
env -u COSYVOICE_ROOT timeout -k 10 $((570 - (SECONDS-start))) python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --conversations 1480 \
  --set tts.cosyvoice.flow.flush_share=1.0 --work /tmp/kinds-v1-flush --out "$OUT/kinds-v1-flush.json" > "$OUT/kinds-v1-flush.txt" 2>&1
echo "v1 kinds rc $? at $((SECONDS-start)) s"
grep -E "ratio|end to end|by row|engine, all" "$OUT/kinds-v1-flush.txt" | cut -c1-420
kill $smi
echo "done at $((SECONDS-start)) s"
