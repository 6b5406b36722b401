#!/usr/bin/env bash
# The flow's attention kernel in CosyVoice3's whole jobs: short-turn and Q&A at about the same audio, each run
# again right after with the kernel (bench/gpu_kinds_versions.sh COMPARE), the README command with the shipped config
set -uo pipefail
setup=1 && [[ -d /tmp/site ]] && setup=0
COSYVOICE_ROOT=$PWD/.whl/CosyVoice SETUP=$setup VERSIONS=3 CONVERSATIONS=1480 BENCH_CONVERSATIONS=1000 \
  COMPARE=tts.cosyvoice.flow.attention=triton DEADLINE=575 JOB_LIMIT=150 OUT=$OUT bash bench/gpu_kinds_versions.sh > /tmp/v3.txt 2>&1
echo "rc $?"
grep -E "models written|==|ratio|end to end|by row|engine, all|exited|done at" /tmp/v3.txt | cut -c1-420
grep -rhiE "does not run here|from torch here|the kernel \(" /tmp/convtts-kinds-v3 2>/dev/null | sort | uniq -c | head -5
