set -uo pipefail
CALL=2; source .whl/setup.sh
timeout -k 10 570 python3 bench/scaling.py --model-dir /tmp/cv300m --gpu-counts 1 --per-gpu 2000 --texts short,bench \
  --engines bash --job-limit 270 --work /tmp/sc2 --out "$OUT/scaling-1.json" > "$OUT/scaling-1.txt" 2>&1
echo "scaling exit $? at $((SECONDS-start)) s"
grep -E "^== |end to end|^text|^short|^bench" "$OUT/scaling-1.txt" | cut -c1-300
keep_logs /tmp/sc2
