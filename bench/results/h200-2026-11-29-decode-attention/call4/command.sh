#!/usr/bin/env bash
# call 4: CosyVoice2, both texts at 300 short-turn conversations' words, shipped defaults
set -uo pipefail
start=$SECONDS
{ nvidia-smi --query-gpu=name --format=csv,noheader; nproc; } 2>&1 | tee "$OUT/machine.txt"
MODEL_SIZE=none bash bench/gpu_setup.sh .whl /tmp/cv300m > /tmp/setup.txt 2>&1 || { tail -20 /tmp/setup.txt; exit 1; }
COSYVOICE_ROOT=$PWD/.whl/CosyVoice OUT=$OUT/v2 VERSIONS=2 CONVERSATIONS=300 timeout -k 10 $((320 - (SECONDS - start))) bash bench/gpu_kinds_versions.sh > "$OUT/v2.txt" 2>&1
echo "v2 at $((SECONDS-start)) s (rc $?)"; grep -E "ratio|end to end|engine, all|^== " "$OUT/v2.txt" | cut -c1-420
