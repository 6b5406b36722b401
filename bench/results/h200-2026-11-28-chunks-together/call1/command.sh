#!/usr/bin/env bash
# v1 short turns against Q&A on this tree, then the Q&A job on the chunk-split commit and on this tree, from copies
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > "$OUT/setup.txt" 2>&1 || { tail -20 "$OUT/setup.txt"; exit 1; }
echo "setup $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 5 > "$OUT/power.csv" &
smi=$!
timeout -k 10 300 python3 bench/text_kinds.py --model-dir /tmp/cv300m --conversations 1000 --work /tmp/k-new --out "$OUT/kinds-new.json" > "$OUT/kinds-new.txt" 2>&1
echo "kinds done $((SECONDS-start)) s"; grep -E "ratio|end to end" "$OUT/kinds-new.txt"
mkdir -p /tmp/base /tmp/new && tar -C /tmp/base -xf .whl/base.tar
tar --exclude=./.whl --exclude=./.git --exclude=./.carry --exclude=./.gpu -cf - . | tar -C /tmp/new -xf -
cp bench/e2e.py /tmp/base/bench/e2e.py
for tree in base new; do
  (cd /tmp/$tree && timeout -k 10 140 python3 bench/e2e.py --model-dir /tmp/cv300m --conversations 537 --work /tmp/qa-$tree --out "$OUT/qa-$tree.json" > "$OUT/qa-$tree.txt" 2>&1)
  echo "qa $tree done $((SECONDS-start)) s"; grep -E "end to end" "$OUT/qa-$tree.txt"
done
kill $smi
tar -czf "$OUT/logs.tgz" /tmp/k-new/*/log-* /tmp/qa-*/log-* 2>/dev/null
ls -la "$OUT"
