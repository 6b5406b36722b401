#!/usr/bin/env bash
# v3's DiT flow pass before (ec72a3b) and after its blocks were re-driven, with each pass's kernels; then v1's
# short-turn text against the Q&A text at about the same audio (shipped defaults, the README command)
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=none bash bench/gpu_setup.sh .whl > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export COSYVOICE_ROOT=$PWD/.whl/CosyVoice
python3 -m convtts.testing.cosyvoice_model --version 3 --size full --out /tmp/cv-full-v3 --tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT" > "$OUT/build-v3.log" 2>&1 &
env -u COSYVOICE_ROOT python3 -m convtts.testing.cosyvoice_model --out /tmp/cv300m --size full --tokens-per-text-token 14 --speakers 英文女,英文男 > "$OUT/build-v1.log" 2>&1 &
mkdir -p /tmp/base && tar -C /tmp/base -xf .whl/base.tar && cp bench/pass_cost.py /tmp/base/bench/pass_cost.py
wait; echo "set up at $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
for tree in new base; do
  dir=$PWD; [[ $tree == base ]] && dir=/tmp/base
  (cd "$dir" && timeout -k 5 110 python3 bench/pass_cost.py --model-dir /tmp/cv-full-v3 --runtime-root "$COSYVOICE_ROOT" \
     --rows 1,16,64 --seconds 1,3,10 --repeat 3 --profile --out "$OUT/pass-cost-v3-$tree.json" > "$OUT/pass-cost-v3-$tree.txt" 2>&1)
  echo "v3 passes, $tree, rc $? at $((SECONDS-start)) s"
  python3 -c "import json,sys; [print(p['rows'], p['seconds'], p['flow'], p['vocoder']['one_pass_s'], p.get('kernels',{}).get('flow',{}).get('by_kind_ms')) for p in json.load(open(sys.argv[1]))['passes']]" "$OUT/pass-cost-v3-$tree.json" | cut -c1-330
done
python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['passes']; [print(x['rows'], x['seconds'], x['kernels']['flow']['top'][:8]) for x in p if x['rows']==16 and x['seconds']==3]" "$OUT/pass-cost-v3-new.json" | cut -c1-1500
python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['passes']; [print(x['rows'], x['seconds'], x['kernels']['flow']['top'][:8]) for x in p if x['rows']==16 and x['seconds']==3]" "$OUT/pass-cost-v3-base.json" | cut -c1-1500
env -u COSYVOICE_ROOT timeout -k 10 $((575 - (SECONDS-start))) python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --conversations 1480 \
  --work /tmp/kinds-v1 --out "$OUT/kinds-v1.json" > "$OUT/kinds-v1.txt" 2>&1
echo "v1 kinds rc $? at $((SECONDS-start)) s"
kill $smi
grep -E "ratio|end to end|by row|engine, all" "$OUT/kinds-v1.txt" | cut -c1-400
(cd /tmp/kinds-v1 && find . -maxdepth 2 -name 'log-*' -print0 | tar -czf "$OUT/logs-v1.tgz" --null -T -) 2>/dev/null
echo "done at $((SECONDS-start)) s"
