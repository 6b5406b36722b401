#!/usr/bin/env bash
# the short-turn job (1,000 conversations) under several settings, one after another, same machine
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
echo "setup $((SECONDS-start)) s"
run() {  # label, sets...
  local label=$1; shift
  local sets=(); for s in "$@"; do sets+=(--set "$s"); done
  timeout -k 10 125 python3 bench/e2e.py --text short --model-dir /tmp/cv300m --conversations 1000 --work /tmp/s-$label \
    --out "$OUT/short-$label.json" "${sets[@]}" > "$OUT/short-$label.txt" 2>&1
  echo "$label at $((SECONDS-start)) s: $(grep -E 'end to end' "$OUT/short-$label.txt" | cut -c1-200)"
  grep -E "engine, all|by row length|rows in flight|work audio" "$OUT/short-$label.txt"
}
run flush1 tts.cosyvoice.flow.flush_share=1.0
run pass150 tts.cosyvoice.flow.pass_ms=150
run w10 workers.per_slot=10
run shipped
tar -czf "$OUT/logs.tgz" /tmp/s-*/log-* 2>/dev/null
