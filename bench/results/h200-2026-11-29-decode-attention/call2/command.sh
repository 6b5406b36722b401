#!/usr/bin/env bash
# call 2: decode-step kernel (split) check; short-turn 1,000 and Q&A 537, attention triton vs torch, in turns
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
echo "setup $((SECONDS-start)) s"
timeout 120 python3 bench/decode_step.py --model-dir /tmp/cv300m --out "$OUT/decode-step.json" > "$OUT/decode-step.txt" 2>&1
grep "^{" "$OUT/decode-step.txt"; grep -i "error\|Traceback" "$OUT/decode-step.txt" | head -5
echo "decode step at $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
for job in short:1000:triton short:1000:torch bench:537:torch bench:537:triton; do
  IFS=: read text count attention <<< "$job"
  name="$text-$attention"
  timeout -k 10 170 python3 bench/e2e.py --text "$text" --model-dir /tmp/cv300m --conversations "$count" --set tts.cosyvoice.attention=$attention --work /tmp/$name --out "$OUT/$name.json" > /tmp/$name.txt 2>&1
  echo "$name at $((SECONDS-start)) s"; grep -E "end to end|by row|engine, all" /tmp/$name.txt | cut -c1-420
done
kill $smi
grep -h "attention\|Triton" /tmp/*/log-*/*.log 2>/dev/null | sort | uniq -c | head -5
tar -czf "$OUT/logs.tgz" /tmp/short-*/log-* /tmp/bench-*/log-* /tmp/*.txt 2>/dev/null
echo "done at $((SECONDS-start)) s"
