#!/usr/bin/env bash
# CosyVoice3, both texts at 300 short-turn conversations' words, shipped defaults (the flow's step captured per bucket)
set -uo pipefail
start=$SECONDS
COSYVOICE_ROOT=$PWD/.whl/CosyVoice OUT=$OUT/v3 VERSIONS=3 CONVERSATIONS=300 DEADLINE=375 JOB_LIMIT=150 timeout -k 10 385 bash bench/gpu_kinds_versions.sh > "$OUT/v3.txt" 2>&1
echo "v3 at $((SECONDS-start)) s (rc $?)"; grep -E "ratio|end to end|by row|engine, all|^== |written|limited" "$OUT/v3.txt" | cut -c1-420
for t in short bench; do grep -h "engine:" /tmp/convtts-kinds-v3/$t/log-*/*/*/slot-0-worker-*.log 2>/dev/null | sed 's/.*engine: //' | cut -c1-200 | head -3; done
rm -f $OUT/v3/*.tar.gz
