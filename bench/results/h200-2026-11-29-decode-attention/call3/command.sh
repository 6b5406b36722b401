#!/usr/bin/env bash
# call 3: the bar: Q&A 1,000 and short-turn at the same words, shipped defaults; then CosyVoice3 both texts at 300 short
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
echo "setup $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
timeout -k 10 380 python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --work /tmp/k1000 --out "$OUT/kinds-1000.json" > "$OUT/kinds-1000.txt" 2>&1
echo "kinds at $((SECONDS-start)) s"; grep -E "ratio|end to end|by row|engine, all|^== " "$OUT/kinds-1000.txt" | cut -c1-420
left=$((585 - (SECONDS - start)))
if (( left > 200 )); then
  COSYVOICE_ROOT=$PWD/.whl/CosyVoice OUT=$OUT/v3 VERSIONS=3 CONVERSATIONS=300 timeout -k 10 $left bash bench/gpu_kinds_versions.sh > "$OUT/v3.txt" 2>&1
  echo "v3 at $((SECONDS-start)) s (rc $?)"; grep -E "ratio|end to end|engine, all|^== " "$OUT/v3.txt" | cut -c1-420
fi
kill $smi
tar -czf "$OUT/logs.tgz" /tmp/k1000/*/log-* 2>/dev/null
echo "done at $((SECONDS-start)) s"
