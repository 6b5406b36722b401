#!/usr/bin/env bash
# the flow's step captured per bucket: pass costs, then both texts at the same words (shipped defaults)
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; git log --oneline -1; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
echo "setup $((SECONDS-start)) s"
timeout -k 5 90 python3 bench/pass_cost.py --model-dir /tmp/cv300m --rows 1,16,64 --seconds 1,3,10 --out "$OUT/pass-cost.json" > "$OUT/pass-cost.txt" 2>&1
echo "pass cost at $((SECONDS-start)) s"; grep '^{' "$OUT/pass-cost.txt" | cut -c1-330
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
timeout -k 10 400 python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --work /tmp/k1000 --out "$OUT/kinds-1000.json" > "$OUT/kinds-1000.txt" 2>&1
echo "kinds at $((SECONDS-start)) s (rc $?)"; grep -E "ratio|end to end|by row|engine, all|^== " "$OUT/kinds-1000.txt" | cut -c1-420
kill $smi
for t in short bench; do echo "== $t"; grep -h "engine:" /tmp/k1000/$t/log-*/*/*/slot-0-worker-*.log | sed 's/.*engine: //' | cut -c1-260; grep -hi "warn\|out of memory\|kernel" /tmp/k1000/$t/log-*/*/*/slot-0-worker-*.log | cut -c1-200 | sort | uniq -c | head -8; done
tar -czf "$OUT/logs.tgz" /tmp/k1000/*/log-* 2>/dev/null
echo "done at $((SECONDS-start)) s"
