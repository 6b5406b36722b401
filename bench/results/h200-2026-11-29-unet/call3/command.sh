#!/usr/bin/env bash
# The U-Net's, HiFT's and the DiT's kernels at 3c79b46..HEAD: v1's passes (long rows too) and their kernels, v3's
# pass with the Snake kernel in its vocoder; then v1's short-turn and Q&A jobs at about the same audio and
# CosyVoice2 on 300 short-turn conversations, the README command with the shipped configs
set -uo pipefail
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
MODEL_SIZE=none bash bench/gpu_setup.sh .whl > /tmp/setup.log 2>&1 || { tail -20 /tmp/setup.log; exit 1; }
export COSYVOICE_ROOT=$PWD/.whl/CosyVoice
for v in 2 3; do
  python3 -m convtts.testing.cosyvoice_model --version $v --size full --out /tmp/cv-full-v$v --tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT" > /tmp/build-v$v.log 2>&1 &
done
env -u COSYVOICE_ROOT python3 -m convtts.testing.cosyvoice_model --out /tmp/cv300m --size full --tokens-per-text-token 14 --speakers 英文女,英文男 > /tmp/build-v1.log 2>&1 &
wait; echo "set up at $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
show() {  # a pass_cost JSON: each shape's times and kernels by kind
  python3 - "$1" <<'PY' | cut -c1-700
import json, sys
for p in json.load(open(sys.argv[1]))["passes"]:
    k = p.get("kernels", {})
    print(p["rows"], p["seconds"], p["flow"], p["vocoder"], {part: (k[part]["gpu_ms"], k[part]["launches"], k[part]["by_kind_ms"]) for part in k})
    for part in k:
        print("  top", part, [(n[:50], ms, c) for n, ms, c in k[part]["top"][:8]])
PY
}
env -u COSYVOICE_ROOT timeout -k 5 100 python3 bench/pass_cost.py --model-dir /tmp/cv300m --rows 16,64 --seconds 1,3,10 --repeat 3 \
  --out "$OUT/pass-v1.json" > /tmp/pass-v1.txt 2>&1; echo "v1 passes rc $? at $((SECONDS-start)) s"; show "$OUT/pass-v1.json"
env -u COSYVOICE_ROOT timeout -k 5 60 python3 bench/pass_cost.py --model-dir /tmp/cv300m --rows 16 --seconds 3 --repeat 3 --profile \
  --out "$OUT/pass-v1-profile.json" > /tmp/pass-v1p.txt 2>&1; echo "v1 profile rc $? at $((SECONDS-start)) s"; show "$OUT/pass-v1-profile.json"
timeout -k 5 70 python3 bench/pass_cost.py --model-dir /tmp/cv-full-v3 --runtime-root "$COSYVOICE_ROOT" --rows 16 --seconds 3 --repeat 3 --profile \
  --out "$OUT/pass-v3.json" > /tmp/pass-v3.txt 2>&1; echo "v3 pass rc $? at $((SECONDS-start)) s"; show "$OUT/pass-v3.json"
grep -hiE "does not run here|from torch here|Traceback" /tmp/pass-*.txt | head -5
env -u COSYVOICE_ROOT timeout -k 10 290 python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --conversations 1480 \
  --work /tmp/kinds-v1 --out "$OUT/kinds-v1.json" > "$OUT/kinds-v1.txt" 2>&1
echo "v1 kinds rc $? at $((SECONDS-start)) s"
grep -E "ratio|end to end|by row|engine, all" "$OUT/kinds-v1.txt" | cut -c1-420
grep -rhiE "does not run here|from torch here" /tmp/kinds-v1 2>/dev/null | head -3
(cd /tmp/kinds-v1 && find . -maxdepth 2 -name 'log-*' -print0 | tar -czf "$OUT/logs-v1.tgz" --null -T -) 2>/dev/null
left=$((585 - (SECONDS-start)))
if ((left > 90)); then
  timeout -k 10 $((left - 5)) python3 bench/e2e.py --version 2 --model-dir /tmp/cv-full-v2 --text short --conversations 300 \
     --job-limit $((left - 30)) --work /tmp/e2e-v2 --out "$OUT/v2.json" > /tmp/v2.txt 2>&1
  echo "v2 rc $? at $((SECONDS-start)) s"
  grep -E "end to end|by row|engine, all" /tmp/v2.txt | cut -c1-400
  grep -rhiE "does not run here|from torch here" /tmp/e2e-v2 2>/dev/null | head -3
fi
kill $smi
echo "done at $((SECONDS-start)) s"
