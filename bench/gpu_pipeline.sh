#!/usr/bin/env bash
# The CosyVoice pipeline on one GPU, in one command on a bare GPU machine: install the carried
# wheels, write the full-size random-weight CosyVoice-300M-SFT directory, then run run_all.sh with
# K workers under MPS for a fixed window, rebuilding each worker's model every N utterances.
# Reports throughput, per-worker GPU memory over time across rebuilds, and rebuild cost; then, time
# allowing, where one worker's time goes (bench/profile_worker.py) and the seed scripts' recipe
# (8 plain processes, no MPS) on the same text for comparison. Each step writes its own files.
#
#   bash bench/gpu_pipeline.sh            # figures land in $OUT (or bench/results)
#
# Environment knobs (defaults in brackets): WORKERS [8], BATCH [32: tts.cosyvoice.batch_size], SECONDS_WINDOW [200], REBUILD_EVERY [100],
# MAX_WORDS [10], UTTERANCES [1500], MODEL_SIZE [full], WHEELS [.whl], TEXT [tests/data/llava_style.json:
# the conversations to speak, in any input format of preprocess.py],
# PRECISION [fp32], PROFILE_DEADLINE [330] and SEED_DEADLINE [380]: seconds since the start after
# which the profile and the seed-recipe comparison are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out="${OUT:-bench/results}"
mkdir -p "$out"
model="/tmp/cv300m-${MODEL_SIZE:-full}"
text="${TEXT:-tests/data/llava_style.json}"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
MODEL_SIZE="${MODEL_SIZE:-full}" bash bench/gpu_setup.sh "${WHEELS:-.whl}" "$model"
echo "setup done at $((SECONDS - started)) s"

python3 bench/throughput.py --model-dir "$model" --text "$text" --work /tmp/convtts-bench \
  --settings "pipeline:${WORKERS:-8}:on:${PRECISION:-fp32}:${BATCH:-32}" --utterances "${UTTERANCES:-9000}" \
  --max-words "${MAX_WORDS:-10}" --rebuild-every "${REBUILD_EVERY:-100}" --segments-per-shard 200 \
  --seconds "${SECONDS_WINDOW:-200}" --out "$out/pipeline"
echo "pipeline done at $((SECONDS - started)) s"
logs=(/tmp/convtts-bench/pipeline-log/*/*/slot-0.log)
[[ -f "${logs[0]}" ]] && cp "${logs[0]}" "$out/slot-0.log"

if (( SECONDS - started < ${PROFILE_DEADLINE:-330} )); then
  fp16=(); [[ "${PRECISION:-fp32}" == fp16 ]] && fp16=(--fp16)
  python3 bench/profile_worker.py --model-dir "$model" --text "$text" --utterances 8 "${fp16[@]}" \
    --out "$out/profile.json" | tail -n 40
else
  echo "profile skipped: $((SECONDS - started)) s spent"
fi

if (( SECONDS - started < ${SEED_DEADLINE:-380} )); then
  python3 bench/throughput.py --model-dir "$model" --text "$text" --work /tmp/convtts-bench-seed \
    --settings "seed-recipe:8:off:fp32" --utterances "${UTTERANCES:-1500}" --max-words "${MAX_WORDS:-10}" \
    --rebuild-every 0 --segments-per-shard 20 --seconds 60 --out "$out/seed"
else
  echo "seed-recipe comparison skipped: $((SECONDS - started)) s spent"
fi
