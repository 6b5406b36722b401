#!/usr/bin/env bash
# v1's U-Net flow pass and vocoder pass by kernel; then CosyVoice2 on 300 short-turn conversations
# (the README command, configs/cosyvoice2.yaml) at main and at a51f317 (before the batched v2/v3 prompt
# prefill and the cast copy's fp32 parts), in turns
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=none bash bench/gpu_setup.sh .whl > /tmp/setup.log 2>&1 || { tail -20 /tmp/setup.log; exit 1; }
export COSYVOICE_ROOT=$PWD/.whl/CosyVoice
python3 -m convtts.testing.cosyvoice_model --version 2 --size full --out /tmp/cv-full-v2 --tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT" > /tmp/build-v2.log 2>&1 &
env -u COSYVOICE_ROOT python3 -m convtts.testing.cosyvoice_model --out /tmp/cv300m --size full --tokens-per-text-token 14 --speakers 英文女,英文男 > /tmp/build-v1.log 2>&1 &
mkdir -p /tmp/base && tar -C /tmp/base -xf .whl/base.tar
wait; echo "set up at $((SECONDS-start)) s"; tail -2 /tmp/build-v2.log /tmp/build-v1.log
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
env -u COSYVOICE_ROOT timeout -k 5 120 python3 bench/pass_cost.py --model-dir /tmp/cv300m --rows 16,64 --seconds 1,3 --repeat 3 --profile \
  --out "$OUT/pass-cost-v1.json" > "$OUT/pass-cost-v1.txt" 2>&1
echo "v1 passes rc $? at $((SECONDS-start)) s"
python3 - "$OUT/pass-cost-v1.json" <<'PY' | cut -c1-1200
import json, sys
for p in json.load(open(sys.argv[1]))["passes"]:
    k = p.get("kernels", {})
    print(p["rows"], p["seconds"], p["flow"], p["vocoder"]["one_pass_s"])
    for part in ("flow", "vocoder"):
        print("  ", part, k.get(part, {}).get("by_kind_ms"))
    if p["rows"] == 16 and p["seconds"] == 3:
        for part in ("flow", "vocoder"):
            print("  top", part, k.get(part, {}).get("top", [])[:12])
            print("  ops", part, k.get(part, {}).get("by_operator", [])[:12])
PY
for tree in new base; do
  dir=$PWD; [[ $tree == base ]] && dir=/tmp/base
  (cd "$dir" && timeout -k 10 200 python3 bench/e2e.py --version 2 --model-dir /tmp/cv-full-v2 --text short --conversations 300 \
     --job-limit 160 --work /tmp/e2e-v2-$tree --out "$OUT/v2-$tree.json" > /tmp/v2-$tree.txt 2>&1)
  echo "v2 $tree rc $? at $((SECONDS-start)) s"
  grep -E "end to end|by row|engine, all" /tmp/v2-$tree.txt | cut -c1-400 | tee -a "$OUT/v2.txt"
done
kill $smi
echo "done at $((SECONDS-start)) s"
