#!/usr/bin/env bash
# CosyVoice v1, v2 and v3 side by side on one GPU, in one command on a bare GPU machine: install the
# carried wheels, write full-size random-weight directories of the three (CosyVoice-300M-SFT,
# CosyVoice2-0.5B and Fun-CosyVoice3-0.5B shapes; v2 and v3 load with the checkout $COSYVOICE_ROOT
# names), then speak the same text through run_all.sh with each, under MPS, for a fixed window per setting.
# v2 and v3 speak with two zero-shot voices whose prompt is 4 s of quiet noise: for random weights
# only the prompt's length matters (it is prefilled and conditions the flow), not what it says.
#
#   COSYVOICE_ROOT=/path/to/CosyVoice bash bench/gpu_versions.sh      # figures land in $OUT
#
# Knobs (defaults in brackets): V1 ["v1-batched:8:on:fp32:32"], V2 ["v2-batched:8:on:fp32:32"], V3 ["v3-batched:8:on:fp32:32"]
# (name:workers:mps:precision[:batch] settings of bench/throughput.py, space-separated; empty skips a
# version), SECONDS_WINDOW [60], REBUILD_EVERY [100], MAX_WORDS [10], UTTERANCES [4000], WHEELS [.whl],
# TEXT [tests/data/llava_style.json].
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out="${OUT:-bench/results}"
work=/tmp/convtts-versions
mkdir -p "$out" "$work"
text="${TEXT:-tests/data/llava_style.json}"
checkout="${COSYVOICE_ROOT:?point COSYVOICE_ROOT at a CosyVoice checkout: v3 needs one}"
unset COSYVOICE_ROOT  # v1 runs on the installed package (the batched engine's reference); v2 and v3 on the checkout
V1="${V1-v1-batched:8:on:fp32:32}" V2="${V2-v2-batched:8:on:fp32:32}" V3="${V3-v3-batched:8:on:fp32:32}"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
MODEL_SIZE=none bash bench/gpu_setup.sh "${WHEELS:-.whl}"
pids=()
for version in 1 2 3; do
  root=(--runtime-root "$checkout"); [[ $version == 1 ]] && root=()  # v1 from the installed package
  python3 -m convtts.testing.cosyvoice_model --version "$version" --size full --out "/tmp/cv-v$version" "${root[@]}" \
    --tokens-per-text-token "$([[ $version == 1 ]] && echo 14 || echo 7)" >"$work/build-v$version.log" 2>&1 &
  pids+=($!)
done
for i in 0 1 2; do wait "${pids[$i]}" || { tail -n 30 "$work/build-v$((i + 1)).log"; exit 1; }; done
tail -n 1 "$work"/build-v*.log
echo "models written at $((SECONDS - started)) s"

prompt="$work/prompt.wav"
python3 -c "import numpy as np, soundfile as sf; sf.write('$prompt', (np.random.default_rng(0).standard_normal(4 * 24000) * 0.05).astype('float32'), 24000)"

run_version() {  # version, settings, config, extra --set items
  local version="$1" settings="$2" config="$3"; shift 3
  [[ -n "$settings" ]] || return 0
  local sets=()
  for item in "$@"; do sets+=(--set "$item"); done
  # shellcheck disable=SC2086
  python3 bench/throughput.py --model-dir "/tmp/cv-v$version" --config "$config" --text "$text" \
    --work "$work/v$version" --settings $settings --utterances "${UTTERANCES:-4000}" \
    --max-words "${MAX_WORDS:-10}" --rebuild-every "${REBUILD_EVERY:-100}" --segments-per-shard 200 \
    --seconds "${SECONDS_WINDOW:-60}" "${sets[@]}" --out "$out/v$version" || echo "v$version run failed"
  echo "v$version done at $((SECONDS - started)) s"
}

prompts() {  # the two zero-shot voices of configs/cosyvoice{2,3}.yaml, on the noise prompt
  local head="$1"
  for name in anna ben; do
    echo "tts.cosyvoice.prompts.$name={audio: \"$prompt\", text: \"${head}This is a short prompt for a new voice, about ten words.\"}"
  done
}

run_version 1 "$V1" configs/cosyvoice.yaml
mapfile -t p2 < <(prompts "")
run_version 2 "$V2" configs/cosyvoice2.yaml "tts.cosyvoice.runtime_root=$checkout" "${p2[@]}"
mapfile -t p3 < <(prompts "You are a helpful assistant.<|endofprompt|>")
run_version 3 "$V3" configs/cosyvoice3.yaml "tts.cosyvoice.runtime_root=$checkout" "${p3[@]}"
