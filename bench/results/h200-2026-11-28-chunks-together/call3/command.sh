#!/usr/bin/env bash
# v1: the short-turn job on the last commit (base), then text_kinds (short and Q&A) on this tree, both from copies
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
echo "setup $((SECONDS-start)) s"
mkdir -p /tmp/base /tmp/new && tar -C /tmp/base -xf .whl/base.tar
tar --exclude=./.whl --exclude=./.git --exclude=./.carry --exclude=./.gpu -cf - . | tar -C /tmp/new -xf -
cp bench/e2e.py /tmp/base/bench/e2e.py
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 5 > "$OUT/power.csv" &
smi=$!
(cd /tmp/base && timeout -k 10 130 python3 bench/e2e.py --text short --model-dir /tmp/cv300m --conversations 1000 --work /tmp/s-base --out "$OUT/short-base.json" > "$OUT/short-base.txt" 2>&1)
echo "base short at $((SECONDS-start)) s"; grep -E "end to end|by row|engine, all|work audio|rows in flight|last rows" "$OUT/short-base.txt" | cut -c1-400
(cd /tmp/new && timeout -k 10 300 python3 bench/text_kinds.py --model-dir /tmp/cv300m --conversations 1000 --work /tmp/k-new --out "$OUT/kinds-new.json" > "$OUT/kinds-new.txt" 2>&1)
echo "new kinds at $((SECONDS-start)) s"; grep -E "ratio|end to end|by row|engine, all|work audio|rows in flight|last rows" "$OUT/kinds-new.txt" | cut -c1-400
kill $smi
tar -czf "$OUT/logs.tgz" /tmp/s-base/log-* /tmp/k-new/*/log-* 2>/dev/null
