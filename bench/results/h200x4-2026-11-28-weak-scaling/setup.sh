# sourced by each call: the machine, then setup once per machine (a warm one keeps it)
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; hostname; uptime; } | tee "$OUT/machine.txt"
if [[ ! -f /tmp/cv300m/cosyvoice.yaml ]]; then
  MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
  echo "setup $((SECONDS-start)) s"
else
  echo "warm machine: setup kept"
fi
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 5 > "$OUT/power-$CALL.csv" &
SMI=$!
keep_logs() {  # the slot and driver logs (the workers' logs are read into the JSON by bench/e2e.py)
  find "$@" -name '*.log' ! -name '*worker*' -print0 2>/dev/null | tar --null -czf "$OUT/logs-$CALL.tgz" -T - 2>/dev/null
  kill $SMI 2>/dev/null
}
