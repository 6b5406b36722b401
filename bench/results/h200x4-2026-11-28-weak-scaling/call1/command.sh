set -uo pipefail
CALL=1; source .whl/setup.sh
timeout -k 10 560 python3 bench/scaling.py --model-dir /tmp/cv300m --gpu-counts 4 --per-gpu 2000 --texts short \
  --engines both --job-limit 270 --work /tmp/sc1 --out "$OUT/scaling-short-4.json" > "$OUT/scaling-short-4.txt" 2>&1
echo "scaling exit $? at $((SECONDS-start)) s"
grep -E "^== |end to end|^text|^short|^bench" "$OUT/scaling-short-4.txt" | cut -c1-300
keep_logs /tmp/sc1
