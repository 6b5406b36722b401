#!/usr/bin/env bash
# The flow's attention kernel (tts.cosyvoice.flow.attention=triton) against torch's in whole jobs: v1's short-turn and Q&A jobs at about the same audio, each run again
# right after with the kernel (bench/text_kinds.py --compare), the README command with the shipped configs
set -uo pipefail
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
if [[ ! -d /tmp/site ]]; then MODEL_SIZE=none bash bench/gpu_setup.sh .whl > /tmp/setup.log 2>&1 || { tail -20 /tmp/setup.log; exit 1; }; fi
export COSYVOICE_ROOT=$PWD/.whl/CosyVoice
[[ -f /tmp/cv300m/cosyvoice.yaml ]] || env -u COSYVOICE_ROOT python3 -m convtts.testing.cosyvoice_model --out /tmp/cv300m --size full --tokens-per-text-token 14 --speakers 英文女,英文男 > /tmp/build-v1.log 2>&1 &
[[ -f /tmp/cv-full-v3/cosyvoice3.yaml ]] || python3 -m convtts.testing.cosyvoice_model --version 3 --size full --out /tmp/cv-full-v3 --tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT" > /tmp/build-v3.log 2>&1 &
wait; echo "set up at $((SECONDS-start)) s"; ls /tmp/cv300m /tmp/cv-full-v3 | head -30 | tr '\n' ' '; echo
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
left=$((585 - (SECONDS-start)))
env -u COSYVOICE_ROOT timeout -k 10 $((left - 10)) python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --conversations 1480 \
  --compare tts.cosyvoice.flow.attention=triton --job-limit $(((left - 60) / 4)) --work /tmp/kinds-v1 --out "$OUT/kinds-v1.json" > "$OUT/kinds-v1.txt" 2>&1
echo "v1 kinds rc $? at $((SECONDS-start)) s"
grep -E "ratio|end to end|by row|engine, all" "$OUT/kinds-v1.txt" | cut -c1-420
grep -rhiE "does not run here|from torch here|the kernel \(" /tmp/kinds-v1 2>/dev/null | sort | uniq -c | head -5
(cd /tmp/kinds-v1 && find . -maxdepth 2 -name 'log-*' -print0 | tar -czf "$OUT/logs-v1.tgz" --null -T -) 2>/dev/null
kill $smi
echo "done at $((SECONDS-start)) s"
