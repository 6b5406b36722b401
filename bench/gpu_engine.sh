#!/usr/bin/env bash
# The batched engine's decode settings side by side for one worker alone, on a bare GPU machine, in one command:
# install the carried wheels, write a full-size random-weight model per version (once: /tmp survives while the
# machine stays warm), then bench/batch_engine.py per version (figures into $OUT as each measurement ends) and,
# when MEMORY_UTTERANCES is set, bench/engine_memory.py. v1 runs on the installed runtime, v2 and v3 on the
# checkout COSYVOICE_ROOT names. Each version takes a few minutes: run them in separate calls.
#
#   bash bench/gpu_engine.sh                                               # v1: 5 settings x 32 and 64 rows
#   COSYVOICE_ROOT=/path/to/CosyVoice VERSIONS=2 bash bench/gpu_engine.sh  # then v2, then VERSIONS=3
#   VERSIONS=1 SETTINGS=bf16 ROWS=64 MEMORY_UTTERANCES=5000 bash bench/gpu_engine.sh   # memory over 10 rebuilds
#
# Knobs (defaults in brackets): VERSIONS ["1"], SETTINGS [v1: today,static,graphs,gpu-sampler,bf16; v2/v3:
# today,gpu-sampler,bf16], ROWS ["32,64"], UTTERANCES [192], MAX_WORDS [10], EXTRA (more --set items for
# batch_engine.py, space-separated), MEMORY_UTTERANCES [0: skip], MEMORY_REBUILD_EVERY [500], WHEELS [.whl],
# SIZE [full; tiny for a dry run], SETUP [1; 0 where the runtime is installed already].
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out="${OUT:-bench/results}"
mkdir -p "$out"
checkout="${COSYVOICE_ROOT:-}"
unset COSYVOICE_ROOT
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
[[ "${SETUP:-1}" == 0 ]] || MODEL_SIZE=none bash bench/gpu_setup.sh "${WHEELS:-.whl}"
extra=()
for item in ${EXTRA:-}; do extra+=(--set "$item"); done

for version in ${VERSIONS:-1}; do
  runtime=() settings="${SETTINGS:-today,static,graphs,gpu-sampler,bf16}"
  if [[ $version != 1 ]]; then
    [[ -n "$checkout" ]] || { echo "v$version needs COSYVOICE_ROOT (a CosyVoice checkout); skipped"; continue; }
    runtime=(COSYVOICE_ROOT="$checkout") settings="${SETTINGS:-today,gpu-sampler,bf16}"
  fi
  env "${runtime[@]}" python3 bench/batch_engine.py --version "$version" --size "${SIZE:-full}" --settings "$settings" \
    --batch-sizes "${ROWS:-32,64}" --utterances "${UTTERANCES:-192}" --max-words "${MAX_WORDS:-10}" "${extra[@]}" \
    --out "$out/engine-v$version.json" 2>"$out/engine-v$version.log" || { echo "v$version failed:"; tail -n 30 "$out/engine-v$version.log"; }
  echo "v$version settings done at $((SECONDS - started)) s"
  if [[ "${MEMORY_UTTERANCES:-0}" != 0 ]]; then
    rows="${ROWS:-64}"
    env "${runtime[@]}" python3 bench/engine_memory.py --version "$version" --size "${SIZE:-full}" --rows "${rows##*,}" \
      --utterances "$MEMORY_UTTERANCES" --rebuild-every "${MEMORY_REBUILD_EVERY:-500}" --max-words "${MAX_WORDS:-10}" \
      "${extra[@]}" --out "$out/memory-v$version.json" 2>"$out/memory-v$version.log" \
      || { echo "v$version memory run failed:"; tail -n 30 "$out/memory-v$version.log"; }
    echo "v$version memory done at $((SECONDS - started)) s"
  fi
done
