# run on the warm machine of call 3, right after it
CALL=4; set -uo pipefail; source .whl/setup.sh
timeout -k 10 220 python3 bench/gpu_faults.py --model-dir /tmp/cv300m --conversations 600 --scenarios oom --work /tmp/f4 --out "$OUT/faults-oom.json" > "$OUT/faults-oom.txt" 2>&1
echo "oom exit $? at $((SECONDS-start)) s"
grep -E '^== |"exit_code"|"complete"|"spoken_twice"|"respoken|"out_of_memory"|"forced"|"wall' "$OUT/faults-oom.txt" | cut -c1-250
grep -h "out of memory\|gpu_mb_cap\|rows .* ->" /tmp/f4/oom/log/*/*/slot-*-worker-*.log 2>/dev/null | cut -c1-250 | head -20
keep_logs /tmp/f4
