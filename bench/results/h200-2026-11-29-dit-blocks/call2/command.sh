#!/usr/bin/env bash
# v3's DiT passes with the Triton gated-modulate kernel (kernels by operator), then v3 whole jobs, shipped defaults:
# 1,000 Q&A conversations against 1,480 short-turn ones (about the same audio) in one call
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=none bash bench/gpu_setup.sh .whl > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export COSYVOICE_ROOT=$PWD/.whl/CosyVoice
python3 -m convtts.testing.cosyvoice_model --version 3 --size full --out /tmp/cv-full-v3 --tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT" > "$OUT/build-v3.log" 2>&1
echo "set up at $((SECONDS-start)) s"
timeout -k 5 75 python3 bench/pass_cost.py --model-dir /tmp/cv-full-v3 --runtime-root "$COSYVOICE_ROOT" \
  --rows 16,64 --seconds 1,3 --repeat 3 --profile --out "$OUT/pass-cost-v3.json" > "$OUT/pass-cost-v3.txt" 2>&1
echo "v3 passes rc $? at $((SECONDS-start)) s"
python3 -c "
import json,sys
for p in json.load(open(sys.argv[1]))['passes']:
    print(p['rows'], p['seconds'], p['flow'], p['vocoder']['one_pass_s'], p['kernels']['flow']['gpu_ms'], p['kernels']['flow']['by_kind_ms'])
    if p['rows'] == 16 and p['seconds'] == 3:
        [print('   ', o) for o in p['kernels']['flow']['by_operator']]
" "$OUT/pass-cost-v3.json" | cut -c1-400
tail -3 "$OUT/pass-cost-v3.txt" | grep -iv "^{" | cut -c1-600
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
left=$((590 - (SECONDS-start)))
OUT=$OUT/v3 VERSIONS=3 SETUP=0 CONVERSATIONS=1480 BENCH_CONVERSATIONS=1000 DEADLINE=$((left - 10)) JOB_LIMIT=240 \
  timeout -k 5 $left bash bench/gpu_kinds_versions.sh > "$OUT/v3.txt" 2>&1
echo "v3 jobs rc $? at $((SECONDS-start)) s"
kill $smi
grep -E "ratio|end to end|by row|engine, all|slot-0:|^== |limited|Error|error" "$OUT/v3.txt" | cut -c1-420
for t in short bench; do grep -h "engine:" /tmp/convtts-kinds-v3/$t/log-*/*/*/slot-0-worker-*.log 2>/dev/null | sed 's/.*engine: //' | cut -c1-230 | head -2; done
echo "done at $((SECONDS-start)) s"
