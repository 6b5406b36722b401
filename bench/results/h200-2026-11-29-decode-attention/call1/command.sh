#!/usr/bin/env bash
# call 1: decode-step kernel check, then short-turn 1,000 base vs new, Q&A 537 new (text_kinds), short new with torch attention
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; python3 -c "import torch, triton; print(torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
echo "setup $((SECONDS-start)) s"
mkdir -p /tmp/base /tmp/new && tar -C /tmp/base -xf .whl/base.tar
tar --exclude=./.whl --exclude=./.git -cf - . | tar -C /tmp/new -xf -
cp bench/e2e.py /tmp/base/bench/e2e.py
(cd /tmp/new && timeout 120 python3 bench/decode_step.py --model-dir /tmp/cv300m --out "$OUT/decode-step.json" > "$OUT/decode-step.txt" 2>&1)
grep -v " INFO \|Warning\|deprecat" "$OUT/decode-step.txt" | tail -12
echo "decode step at $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
(cd /tmp/new && timeout -k 10 300 python3 bench/text_kinds.py --model-dir /tmp/cv300m --conversations 1000 --work /tmp/k-new --out "$OUT/kinds-new.json" > "$OUT/kinds-new.txt" 2>&1)
echo "new kinds at $((SECONDS-start)) s"; grep -E "ratio|end to end|by row|engine, all|triton|Triton" "$OUT/kinds-new.txt" | cut -c1-500
(cd /tmp/base && timeout -k 10 140 python3 bench/e2e.py --text short --model-dir /tmp/cv300m --conversations 1000 --work /tmp/s-base --out "$OUT/short-base.json" > "$OUT/short-base.txt" 2>&1)
echo "base short at $((SECONDS-start)) s"; grep -E "end to end|by row|engine, all" "$OUT/short-base.txt" | cut -c1-500
if (( SECONDS - start < 440 )); then
(cd /tmp/new && timeout -k 10 $((560 - (SECONDS - start))) python3 bench/e2e.py --text short --model-dir /tmp/cv300m --conversations 1000 --set tts.cosyvoice.attention=torch --work /tmp/s-torch --out "$OUT/short-new-torch.json" > "$OUT/short-new-torch.txt" 2>&1)
echo "new short, torch attention, at $((SECONDS-start)) s"; grep -E "end to end|by row|engine, all" "$OUT/short-new-torch.txt" | cut -c1-500
fi
kill $smi
tar -czf "$OUT/logs.tgz" /tmp/s-base/log-* /tmp/k-new/*/log-* /tmp/s-torch/log-* 2>/dev/null
echo "done at $((SECONDS-start)) s"
