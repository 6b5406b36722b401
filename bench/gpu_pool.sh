#!/usr/bin/env bash
# A pool of 500 zero-shot voices against 2, in one command on a bare GPU machine: install the carried
# wheels, write a full-size random CosyVoice2-0.5B (the installed runtime; VERSION=1 for the v1 model
# with zero-shot prompts), write 500 prompt recordings of noise (3-8 s) with a JSON-lines manifest
# (bench/make_pool.py), then speak the same text twice under MPS with speakers.pool naming 2 voices and
# then 500 (bench/compare_runs.py, a timed window once every worker is up). Each worker keeps
# tts.cosyvoice.prompt_cache voices' prompt features (64); the table gives each run's audio s/s, the
# voices heard, and the prompt registrations the workers made and their seconds per utterance (from
# the "prompt features:" line each worker logs at every model rebuild).
#
#   bash bench/gpu_pool.sh            # figures land in $OUT (or bench/results): pool.json, and a table on stdout
#
# Knobs (defaults in brackets): VERSION [2], VOICES [500], SETTING [8:on:fp32:32], TTS_SETS [""] (space-separated
# --set items for both runs), SECONDS_WINDOW [60], UTTERANCES [6000], MAX_WORDS [10], REBUILD_EVERY [100],
# MODEL_SIZE [full], GPU [0], SETUP [1], WHEELS [.whl], TEXT [tests/data/llava_style.json], PYTHON [python3].
# A dry run on a CPU machine: SETUP=0 MODEL_SIZE=tiny GPU=cpu:1 SETTING=1:off:fp32:4 VOICES=40 SECONDS_WINDOW=20 UTTERANCES=40
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out="${OUT:-bench/results}"
py="${PYTHON:-python3}"
export PYTHON="$py"
version="${VERSION:-2}" voices="${VOICES:-500}"
mkdir -p "$out"
model="/tmp/cv-v$version-${MODEL_SIZE:-full}" pool=/tmp/convtts-pool-voices work=/tmp/convtts-pool
config=configs/cosyvoice2.yaml tokens=7 rate=24000
[[ "$version" == 1 ]] && config=configs/cosyvoice.yaml tokens=14 rate=22050

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
[[ "${SETUP:-1}" == 1 ]] && MODEL_SIZE=none bash bench/gpu_setup.sh "${WHEELS:-.whl}"
mkdir -p "$work"
if [[ ! -f "$model/convtts_model.json" ]]; then
  "$py" -m convtts.testing.cosyvoice_model --version "$version" --out "$model" --size "${MODEL_SIZE:-full}" \
    --tokens-per-text-token "$tokens" >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log"; exit 1; }
fi
"$py" bench/make_pool.py --out "$pool" --voices "$voices" --also 2 --rate "$rate" --version "$version"
echo "model and $voices voices written at $((SECONDS - started)) s"

common=(); for item in ${TTS_SETS:-}; do common+=(--set "$item"); done
"$py" bench/compare_runs.py --model-dir "$model" --config "$config" --text "${TEXT:-tests/data/llava_style.json}" \
  --gpu "${GPU:-0}" --setting "${SETTING:-8:on:fp32:32}" --seconds "${SECONDS_WINDOW:-60}" \
  --utterances "${UTTERANCES:-6000}" --max-words "${MAX_WORDS:-10}" --rebuild-every "${REBUILD_EVERY:-100}" \
  --work "$work" "${common[@]}" \
  --variant voices-2 "speakers.pool=$pool/pool-2.jsonl" \
  --variant "voices-$voices" "speakers.pool=$pool/pool-$voices.jsonl" \
  --out "$out/pool"
echo "done at $((SECONDS - started)) s"
