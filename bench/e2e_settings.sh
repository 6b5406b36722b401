#!/usr/bin/env bash
# bench/e2e.py under several settings of this tree on one machine, in turns, so that every setting
# meets the same host and page cache. Each argument is NAME or NAME:group.key=value,group.key=value
# (a bare NAME runs the shipped config); a pair whose key is an environment variable's name (upper case,
# no dot: NAME:CONVTTS_X=1) is set in the job's environment instead. Figures land in $OUT as NAME-SIZE-ROUND.json/.txt, packed
# into $OUT/e2e-settings.tgz after each run as well (a device call returns only a few files). With several
# SIZES, bench/marginal.py then fits each setting's wall times: its steady state as the slope of wall time
# over audio, and the fixed part every job pays (NAME-marginal.txt/.json).
#
#   OUT=$OUT SIZES="300 1000" bash bench/e2e_settings.sh shipped \
#       wide:tts.cosyvoice.flow.spread=100,tts.cosyvoice.flow.frame_buckets=4
#
# Knobs: SIZES [300] conversations per job, ROUNDS [1], SETUP [1; 0 on a machine already set up],
# WHEELS [.whl], MODEL [/tmp/cv300m], GPUS [0].
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/e2e-settings}" model="${MODEL:-/tmp/cv300m}"
(($#)) || { echo "usage: bash bench/e2e_settings.sh NAME[:k=v,...] ..." >&2; exit 2; }
mkdir -p "$out"
source bench/gpu_prepare.sh
# every figure so far in one file (a device call brings back only a few)
pack() { tar -czf "/tmp/e2e-settings.tgz" -C "$out" --exclude e2e-settings.tgz . && mv /tmp/e2e-settings.tgz "$out/"; }
rc=0
for round in $(seq 1 "${ROUNDS:-1}"); do
  for size in ${SIZES:-300}; do
    for spec in "$@"; do
      name="${spec%%:*}" sets=() envs=()
      if [[ "$spec" == *:* ]]; then
        IFS=, read -ra pairs <<<"${spec#*:}"
        for pair in "${pairs[@]}"; do
          if [[ "${pair%%=*}" =~ ^[A-Z_][A-Z0-9_]*$ ]]; then envs+=("$pair"); else sets+=(--set "$pair"); fi
        done
      fi
      run="$name-$size-$round"
      while [[ -e "$out/$run.json" ]]; do run="$run-again"; done  # a size listed twice keeps both runs
      work="/tmp/e2e-settings/$run"
      rm -rf "$work"
      echo "== $run: ${envs[*]} ${sets[*]:-shipped config}"
      env "${envs[@]}" python3 bench/e2e.py --model-dir "$model" --conversations "$size" --engine bash --gpus "${GPUS:-0}" \
        --work "$work" --out "$out/$run.json" "${sets[@]}" | tee "$out/$run.txt" || rc=1
      pack
    done
  done
done
if (($(wc -w <<<"${SIZES:-300}") > 1)); then  # several sizes: each setting's steady state as the slope (bench/marginal.py)
  for spec in "$@"; do
    name="${spec%%:*}"
    python3 bench/marginal.py --out "$out/$name-marginal.json" "$out/$name"-[0-9]*.json | tee "$out/$name-marginal.txt" || true
  done
  pack
fi
exit $rc
