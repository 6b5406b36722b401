#!/usr/bin/env bash
# The flow's attention kernel (tts.cosyvoice.flow.attention=triton) against torch's: v1's passes alone, one
# profiled pass with the kernel, the models for the whole jobs written
set -uo pipefail
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
if [[ ! -d /tmp/site ]]; then MODEL_SIZE=none bash bench/gpu_setup.sh .whl > /tmp/setup.log 2>&1 || { tail -20 /tmp/setup.log; exit 1; }; fi
export COSYVOICE_ROOT=$PWD/.whl/CosyVoice
[[ -f /tmp/cv300m/cosyvoice.yaml ]] || env -u COSYVOICE_ROOT python3 -m convtts.testing.cosyvoice_model --out /tmp/cv300m --size full --tokens-per-text-token 14 --speakers 英文女,英文男 > /tmp/build-v1.log 2>&1 &
[[ -f /tmp/cv-full-v3/cosyvoice3.yaml ]] || python3 -m convtts.testing.cosyvoice_model --version 3 --size full --out /tmp/cv-full-v3 --tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT" > /tmp/build-v3.log 2>&1 &
wait; echo "set up at $((SECONDS-start)) s"; ls /tmp/cv300m /tmp/cv-full-v3 | head -30 | tr '\n' ' '; echo
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
show() {  # a pass_cost JSON: each shape's times, and its kernels by kind when profiled
  python3 - "$1" <<'PY' | cut -c1-600
import json, sys
for p in json.load(open(sys.argv[1]))["passes"]:
    k = p.get("kernels", {})
    print(p["rows"], p["seconds"], p["flow"], p["vocoder"], {part: (k[part]["gpu_ms"], k[part]["launches"], k[part]["by_kind_ms"]) for part in k})
    for part in k:
        print("  top", part, [(n[:50], ms, c) for n, ms, c in k[part]["top"][:8]])
PY
}
for a in torch triton; do
  env -u COSYVOICE_ROOT timeout -k 5 90 python3 bench/pass_cost.py --model-dir /tmp/cv300m --rows 16,64 --seconds 3,10 --repeat 3 \
    --attention $a --out "$OUT/pass-$a.json" > /tmp/pass-$a.txt 2>&1; echo "v1 passes $a rc $? at $((SECONDS-start)) s"; show "$OUT/pass-$a.json"
done
env -u COSYVOICE_ROOT timeout -k 5 60 python3 bench/pass_cost.py --model-dir /tmp/cv300m --rows 16 --seconds 3 --repeat 3 --profile \
  --attention triton --out "$OUT/pass-triton-profile.json" > /tmp/pass-p.txt 2>&1; echo "v1 profile rc $? at $((SECONDS-start)) s"; show "$OUT/pass-triton-profile.json"
if grep -qiE "does not run here|from torch here|Traceback" /tmp/pass-*.txt; then
  grep -hiE -B3 "does not run here|from torch here|Error" /tmp/pass-*.txt | head -30; kill $smi; exit 1
fi
kill $smi
echo "done at $((SECONDS-start)) s"
