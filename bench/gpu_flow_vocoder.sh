#!/usr/bin/env bash
# The batched engine's flow and vocoder alone, v1, v2 and v3 on one GPU, in one command on a bare GPU
# machine: install the carried wheels, write full-size random-weight models (CosyVoice-300M-SFT,
# CosyVoice2-0.5B and Fun-CosyVoice3-0.5B shapes; kept in /tmp for later calls on the same machine),
# then bench/flow_vocoder.py for each version: audio seconds per second of the flow and of the
# vocoder per precision, CUDA graphs off/on and vocoder rows per pass, with each setting's deviation
# from the rows rendered alone in eager fp32. Figures land in $OUT as each setting finishes.
#
#   COSYVOICE_ROOT=/path/to/CosyVoice bash bench/gpu_flow_vocoder.sh
#
# Knobs (defaults in brackets): VERSIONS ["1 2 3"], ROWS [32], SECONDS_RANGE [2:6], PROMPT_SECONDS [3],
# FLOW [fp32,tf32,bf16,fp16], GRAPHS [off,on], VOCODER [fp32:1,fp32:16,tf32:16,bf16:16,fp16:16],
# COMPILE [unset; 1 adds torch.compile settings], REPEAT [3], MAX_MB [4096], WHEELS [.whl].
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out="${OUT:-bench/results}"
mkdir -p "$out"
checkout="${COSYVOICE_ROOT:?point COSYVOICE_ROOT at a CosyVoice checkout: v3 needs one}"
unset COSYVOICE_ROOT  # v1 runs on the installed package, v2 and v3 on the checkout
versions="${VERSIONS:-1 2 3}"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
MODEL_SIZE=none bash bench/gpu_setup.sh "${WHEELS:-.whl}"
pids=()
for version in $versions; do
  [[ -f "/tmp/cv-v$version/convtts_model.json" ]] && continue
  root=(--runtime-root "$checkout"); [[ $version == 1 ]] && root=()
  speakers=(); [[ $version == 1 ]] && speakers=(--speakers 英文女)
  python3 -m convtts.testing.cosyvoice_model --version "$version" --size full --out "/tmp/cv-v$version" "${root[@]}" \
    "${speakers[@]}" >"$out/build-v$version.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { tail -n 30 "$out"/build-v*.log; exit 1; }; done
echo "models ready at $((SECONDS - started)) s"

for version in $versions; do
  root=(--runtime-root "$checkout"); [[ $version == 1 ]] && root=()
  python3 bench/flow_vocoder.py --version "$version" --model-dir "/tmp/cv-v$version" "${root[@]}" \
    --rows "${ROWS:-32}" --seconds "${SECONDS_RANGE:-2:6}" --prompt-seconds "${PROMPT_SECONDS:-3}" \
    --flow "${FLOW:-fp32,tf32,bf16,fp16}" --graphs "${GRAPHS:-off,on}" \
    --vocoder "${VOCODER:-fp32:1,fp32:16,tf32:16,bf16:16,fp16:16}" ${COMPILE:+--compile} \
    --repeat "${REPEAT:-3}" --max-mb "${MAX_MB:-4096}" --out "$out/flow_vocoder-v$version.json" \
    2>"$out/flow_vocoder-v$version.log" | grep '^{"setting"' || echo "v$version failed: see $out/flow_vocoder-v$version.log"
  echo "v$version done at $((SECONDS - started)) s"
done
