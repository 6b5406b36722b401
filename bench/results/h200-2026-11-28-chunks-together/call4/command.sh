#!/usr/bin/env bash
# v1 Q&A job: last commit (base) then this tree, from copies; then CosyVoice3 short turns and Q&A (text_kinds) on this tree
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } | tee "$OUT/machine.txt"
MODEL_SIZE=full bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
echo "setup $((SECONDS-start)) s"
mkdir -p /tmp/base /tmp/new && tar -C /tmp/base -xf .whl/base.tar
tar --exclude=./.whl --exclude=./.git --exclude=./.carry --exclude=./.gpu -cf - . | tar -C /tmp/new -xf -
cp bench/e2e.py /tmp/base/bench/e2e.py
for tree in base new; do
  (cd /tmp/$tree && timeout -k 10 110 python3 bench/e2e.py --model-dir /tmp/cv300m --conversations 537 --work /tmp/qa-$tree --out "$OUT/qa-$tree.json" > "$OUT/qa-$tree.txt" 2>&1)
  echo "qa $tree at $((SECONDS-start)) s"; grep -E "end to end|engine, all|slot-0:" "$OUT/qa-$tree.txt" | cut -c1-300
done
tar -czf "$OUT/logs-qa.tgz" /tmp/qa-*/log-* 2>/dev/null
OUT="$OUT/v3" SETUP=0 VERSIONS=3 CONVERSATIONS=300 JOB_LIMIT=150 DEADLINE=$((545 - (SECONDS-start))) bash bench/gpu_kinds_versions.sh 2>&1 | grep -vE "^\s+by 5 s" | cut -c1-400
echo "all at $((SECONDS-start)) s"
