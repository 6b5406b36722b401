set -uo pipefail
CALL=3; source .whl/setup.sh
timeout -k 10 290 python3 bench/scaling.py --model-dir /tmp/cv300m --gpu-counts 4 --per-gpu 2000 --texts bench \
  --engines both --job-limit 140 --work /tmp/sc3 --out "$OUT/scaling-bench-4.json" > "$OUT/scaling-bench-4.txt" 2>&1
echo "scaling exit $? at $((SECONDS-start)) s"
grep -E "^== |end to end|^text|^short|^bench" "$OUT/scaling-bench-4.txt" | cut -c1-300
timeout -k 10 $((585 - SECONDS + start)) python3 bench/gpu_faults.py --model-dir /tmp/cv300m --conversations 600 \
  --work /tmp/f3 --out "$OUT/faults.json" > "$OUT/faults.txt" 2>&1
echo "faults exit $? at $((SECONDS-start)) s"
grep -E '^== |"exit_code"|"complete"|"spoken_twice"|"respoken|"out_of_memory"|lost' "$OUT/faults.txt" | cut -c1-250
keep_logs /tmp/sc3 /tmp/f3
