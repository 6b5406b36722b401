#!/usr/bin/env bash
# the flow's step captured per bucket: CosyVoice3 and CosyVoice2, both texts at 300 short-turn conversations' words; v3 pass costs
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
COSYVOICE_ROOT=$PWD/.whl/CosyVoice OUT=$OUT/v3v2 VERSIONS="3 2" CONVERSATIONS=300 DEADLINE=470 timeout -k 10 480 bash bench/gpu_kinds_versions.sh > "$OUT/v3v2.txt" 2>&1
echo "v3, v2 at $((SECONDS-start)) s (rc $?)"; grep -E "ratio|end to end|engine, all|^== |written" "$OUT/v3v2.txt" | cut -c1-420
kill $smi
for p in bf16 fp32; do
  timeout -k 5 40 python3 bench/pass_cost.py --model-dir /tmp/cv-full-v3 --runtime-root $PWD/.whl/CosyVoice --precision $p --rows 16 --seconds 3 --repeat 2 --out "$OUT/pass-cost-v3-$p.json" 2>&1 | grep '^{' | cut -c1-330
done
for v in 3 2; do echo "== v$v"; for t in short bench; do grep -h "engine:" /tmp/convtts-kinds-v$v/$t/log-*/*/*/slot-0-worker-*.log 2>/dev/null | sed 's/.*engine: //' | cut -c1-230 | head -4; done; done
echo "done at $((SECONDS-start)) s"
