#!/usr/bin/env bash
# CosyVoice3 whole jobs, shipped defaults, the README command: 1,000 Q&A conversations and 1,480 short-turn ones
# (about the same audio) in one call
set -uo pipefail
start=$SECONDS
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
COSYVOICE_ROOT=$PWD/.whl/CosyVoice OUT=$OUT VERSIONS=3 CONVERSATIONS=1480 BENCH_CONVERSATIONS=1000 DEADLINE=620 JOB_LIMIT=250 \
  timeout -k 5 585 bash bench/gpu_kinds_versions.sh > "$OUT/v3.txt" 2>&1
echo "v3 jobs rc $? at $((SECONDS-start)) s"
kill $smi
grep -E "ratio|end to end|by row|engine, all|slot-0:|each worker|^== |limited|written|Error|error" "$OUT/v3.txt" | cut -c1-420
rm -f "$OUT/kinds-v3.txt"  # v3.txt holds the same printout
echo "done at $((SECONDS-start)) s"
