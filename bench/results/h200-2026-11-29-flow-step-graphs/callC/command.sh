#!/usr/bin/env bash
# the flow's step captured per bucket against main before it (0400673, base.tar), in turns: v1 short-turn 1,000; v2 short-turn 300
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
python3 -m convtts.testing.cosyvoice_model --version 2 --size full --out /tmp/cv-full-v2 --tokens-per-text-token 7 --runtime-root $PWD/.whl/CosyVoice > /tmp/build-v2.txt 2>&1 || { tail -20 /tmp/build-v2.txt; exit 1; }
mkdir -p /tmp/base && tar -C /tmp/base -xf .whl/base.tar
echo "setup $((SECONDS-start)) s"
nvidia-smi --query-gpu=timestamp,utilization.gpu,power.draw,memory.used --format=csv,noheader -l 2 > "$OUT/power.csv" &
smi=$!
job() {  # name, tree, e2e args...
  local name=$1 tree=$2; shift 2
  (cd $tree && timeout -k 10 170 python3 bench/e2e.py --work /tmp/$name --out "$OUT/$name.json" "$@" > /tmp/$name.txt 2>&1)
  echo "$name at $((SECONDS-start)) s"; grep -E "end to end|by row|engine, all" /tmp/$name.txt | cut -c1-420
}
V2=(--version 2 --model-dir /tmp/cv-full-v2 --runtime-root $PWD/.whl/CosyVoice --text short --conversations 300)
job v1-short-new $PWD --text short --model-dir /tmp/cv300m --conversations 1000
job v1-short-base /tmp/base --text short --model-dir /tmp/cv300m --conversations 1000
job v2-short-base /tmp/base "${V2[@]}"
job v2-short-new $PWD "${V2[@]}"
kill $smi
for name in v1-short-new v1-short-base v2-short-base v2-short-new; do echo "== $name"; grep -h "engine:" /tmp/$name/log-*/*/*/slot-0-worker-*.log 2>/dev/null | sed 's/.*engine: //' | cut -c1-200 | head -3; done
tar -czf "$OUT/logs.tgz" /tmp/v1-short-*/log-* /tmp/v2-short-*/log-* /tmp/v*-short-*.txt 2>/dev/null
echo "done at $((SECONDS-start)) s"
