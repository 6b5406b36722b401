#!/usr/bin/env bash
# CosyVoice2's short-turn job of 300 conversations and the Q&A job of the same words, the README command with
# the shipped config (the flow's attention kernel on by default: tts.cosyvoice.flow.attention auto), on a fresh machine
set -uo pipefail
COSYVOICE_ROOT=$PWD/.whl/CosyVoice VERSIONS=2 CONVERSATIONS=300 DEADLINE=300 JOB_LIMIT=90 OUT=$OUT bash bench/gpu_kinds_versions.sh > /tmp/v2.txt 2>&1
echo "rc $?"
grep -E "models written|==|ratio|end to end|by row|engine, all|exited|done at" /tmp/v2.txt | cut -c1-420
grep -rhoE "INFO .*the kernel \(.*\)|WARNING.*(does not run|from torch|out of memory).*" /tmp/convtts-kinds-v2 2>/dev/null | sed 's/^INFO [^:]*: //' | cut -c1-200 | sort | uniq -c
