#!/usr/bin/env bash
# The quality gate at GPU speed, in one command on a bare GPU machine: install the carried wheels, write
# the full-size random CosyVoice-300M-SFT (v1) and a random Whisper of large-v3-turbo's shapes (128 mel
# bins, d_model 1280, 32 encoder and 4 decoder layers; 1.6 GB in fp16), then speak the same text twice
# under MPS, gate off and gate on, each for a timed window once every worker is up (bench/compare_runs.py).
# Gate on: hf-whisper in each worker on the same GPU (bf16), every utterance's take transcribed
# (assume_english; segments of 10 words), judged in batches of the finished takes. A random Whisper
# hears random words and a random CosyVoice speaks noise, so every limit that would refuse a take is
# opened (max_wer 1000, silence and length limits off): the gate's cost is what is measured, and
# "re-spoken" should read 0. The random decoder never says end-of-text: each take decodes to its
# bound (7 tokens a second of audio + 10), an upper bound on what real weights cost.
#
#   bash bench/gpu_gate.sh            # figures land in $OUT (or bench/results): gate.json, and a table on stdout
#
# Knobs (defaults in brackets): SETTING [8:on:fp32:32] (workers:mps:precision:batch, for both runs),
# TTS_SETS [""] (space-separated --set items for both runs: the speed work's best settings, e.g.
# "tts.cosyvoice.precision.llm=bf16 tts.cosyvoice.precision.flow=bf16"), GATE_SETS [""] (more for the
# gated run, e.g. "validate.asr_batch=32"; workers=N or batch=N give the gated runs their own setting: 16
# copies of Whisper beside 16 x 64 rows fill an H200), SECONDS_WINDOW [60; packed takes are written
# about 150 at a time per worker, so give it 150: the table's steady column starts at the last worker's first write;
# 0 runs each job to its end, and the table adds the whole job's audio over its wall time], UTTERANCES [6000], MAX_WORDS [10],
# REBUILD_EVERY [100], PACKED [0; 1 adds a gated run with validate.asr_pack=true], SYNCS [auto; "auto block"
# runs each pair again with workers.cuda_sync=block], MODEL_SIZE [full], WHISPER_SIZE [turbo], GPU [0], SETUP [1: install the carried
# wheels; 0 on a machine that has the packages], WHEELS [.whl], TEXT [tests/data/llava_style.json], PYTHON [python3].
# A dry run on a CPU machine: SETUP=0 MODEL_SIZE=tiny WHISPER_SIZE=tiny GPU=cpu:1 SETTING=1:off:fp32:4 SECONDS_WINDOW=20 UTTERANCES=40
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out="${OUT:-bench/results}"
py="${PYTHON:-python3}"
export PYTHON="$py"
mkdir -p "$out"
model="/tmp/cv300m-${MODEL_SIZE:-full}" whisper="/tmp/whisper-${WHISPER_SIZE:-turbo}" work=/tmp/convtts-gate

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
[[ "${SETUP:-1}" == 1 ]] && MODEL_SIZE=none bash bench/gpu_setup.sh "${WHEELS:-.whl}"
mkdir -p "$work"
pids=()
if [[ ! -f "$model/cosyvoice.yaml" ]]; then
  "$py" -m convtts.testing.cosyvoice_model --out "$model" --size "${MODEL_SIZE:-full}" --tokens-per-text-token 14 \
    --speakers 英文女,英文男 >"$work/build-tts.log" 2>&1 &
  pids+=($!)
fi
if [[ ! -f "$whisper/config.json" ]]; then
  "$py" -m convtts.testing.whisper_model --out "$whisper" --size "${WHISPER_SIZE:-turbo}" >"$work/build-whisper.log" 2>&1 &
  pids+=($!)
fi
for pid in "${pids[@]}"; do wait "$pid" || { tail -n 30 "$work"/build-*.log; exit 1; }; done
echo "models written at $((SECONDS - started)) s"

common=(); for item in ${TTS_SETS:-}; do common+=(--set "$item"); done
read -r -a more <<<"${GATE_SETS:-}"
gate=(validate.enabled=true validate.recogniser=hf-whisper "validate.model_path=$whisper" validate.assume_english=true
  validate.max_wer=1000 validate.max_silence_share=1 validate.min_seconds_per_word=0 validate.max_seconds_per_word=1000)
variants=()
for sync in ${SYNCS:-auto}; do  # SYNCS="auto block": each pair again with workers.cuda_sync=block, in the same call
  tag="" sets=(); [[ "$sync" != auto ]] && tag="-$sync" sets=("workers.cuda_sync=$sync")
  variants+=(--variant "gate-off$tag" "${sets[@]}" --variant "gate-on$tag" "${gate[@]}" "${sets[@]}" "${more[@]}")
  # PACKED=1: also the gate with short takes packed into shared 30 s windows (validate.asr_pack=true)
  [[ "${PACKED:-0}" == 1 ]] && variants+=(--variant "gate-on-packed$tag" "${gate[@]}" validate.asr_pack=true "${sets[@]}" "${more[@]}")
done
"$py" bench/compare_runs.py --model-dir "$model" --config configs/cosyvoice.yaml --text "${TEXT:-tests/data/llava_style.json}" \
  --gpu "${GPU:-0}" --setting "${SETTING:-8:on:fp32:32}" --seconds "${SECONDS_WINDOW:-60}" \
  --utterances "${UTTERANCES:-6000}" --max-words "${MAX_WORDS:-10}" --rebuild-every "${REBUILD_EVERY:-100}" \
  --work "$work" "${common[@]}" "${variants[@]}" --out "$out/gate"
echo "done at $((SECONDS - started)) s"
