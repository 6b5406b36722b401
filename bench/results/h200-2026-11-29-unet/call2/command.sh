#!/usr/bin/env bash
# v1's flow and vocoder passes with the U-Net's and HiFT's kernels (c6950a2) against main before them
# (e6b247e, .whl/base.tar), in turns; then v1's short-turn and Q&A jobs at about the same audio and
# CosyVoice2 on 300 short-turn conversations, the README command with the shipped configs
set -uo pipefail
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
MODEL_SIZE=none bash bench/gpu_setup.sh .whl > /tmp/setup.log 2>&1 || { tail -20 /tmp/setup.log; exit 1; }
export COSYVOICE_ROOT=$PWD/.whl/CosyVoice
python3 -m convtts.testing.cosyvoice_model --version 2 --size full --out /tmp/cv-full-v2 --tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT" > /tmp/build-v2.log 2>&1 &
env -u COSYVOICE_ROOT python3 -m convtts.testing.cosyvoice_model --out /tmp/cv300m --size full --tokens-per-text-token 14 --speakers 英文女,英文男 > /tmp/build-v1.log 2>&1 &
mkdir -p /tmp/base && tar -C /tmp/base -xf .whl/base.tar && cp bench/pass_cost.py /tmp/base/bench/pass_cost.py
wait; echo "set up at $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
for tree in new base; do
  dir=$PWD; profile=--profile; [[ $tree == base ]] && { dir=/tmp/base; profile=; }
  (cd "$dir" && env -u COSYVOICE_ROOT timeout -k 5 90 python3 bench/pass_cost.py --model-dir /tmp/cv300m --rows 16,64 --seconds 1,3 --repeat 3 $profile \
     --out "$OUT/pass-$tree.json" > /tmp/pass-$tree.txt 2>&1)
  echo "v1 passes, $tree, rc $? at $((SECONDS-start)) s"; grep -iE "does not run|from torch here|Error" /tmp/pass-$tree.txt | head -5
  python3 - "$OUT/pass-$tree.json" <<'PY' | cut -c1-900
import json, sys
for p in json.load(open(sys.argv[1]))["passes"]:
    k = p.get("kernels", {})
    print(p["rows"], p["seconds"], p["flow"], p["vocoder"]["one_pass_s"], {part: (k[part]["gpu_ms"], k[part]["launches"], k[part]["by_kind_ms"]) for part in k})
    if k and p["rows"] == 64 and p["seconds"] == 3:
        for part in ("flow", "vocoder"):
            print("  top", part, [(n[:60], ms, c) for n, ms, c in k[part]["top"][:10]])
PY
done
env -u COSYVOICE_ROOT timeout -k 10 300 python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --conversations 1480 \
  --work /tmp/kinds-v1 --out "$OUT/kinds-v1.json" > "$OUT/kinds-v1.txt" 2>&1
echo "v1 kinds rc $? at $((SECONDS-start)) s"
grep -E "ratio|end to end|by row|engine, all" "$OUT/kinds-v1.txt" | cut -c1-420
grep -hiE "does not run|from torch here" -r /tmp/kinds-v1 2>/dev/null | head -3
(cd /tmp/kinds-v1 && find . -maxdepth 2 -name 'log-*' -print0 | tar -czf "$OUT/logs-v1.tgz" --null -T -) 2>/dev/null
left=$((585 - (SECONDS-start)))
if ((left > 100)); then
  timeout -k 10 $((left - 5)) python3 bench/e2e.py --version 2 --model-dir /tmp/cv-full-v2 --text short --conversations 300 \
     --job-limit $((left - 30)) --work /tmp/e2e-v2 --out "$OUT/v2-new.json" > /tmp/v2-new.txt 2>&1
  echo "v2 rc $? at $((SECONDS-start)) s"
  grep -E "end to end|by row|engine, all" /tmp/v2-new.txt | cut -c1-400
fi
kill $smi
echo "done at $((SECONDS-start)) s"
