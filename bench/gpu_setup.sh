#!/usr/bin/env bash
# Prepare a bare GPU machine for the benchmarks: install the carried wheels (the CosyVoice runtime's
# imports the image lacks; Ray, when bench/fetch_ray.sh packed it) after the image's own packages, then write the random model
# (MODEL_SIZE full, the CosyVoice-300M shapes, tiny for a dry run on a CPU machine, or none).
#   bash bench/gpu_setup.sh [WHEEL_DIR] [MODEL_DIR]
set -euo pipefail
wheels="${1:-.whl}" model="${2:-/tmp/cv300m}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/*.whl
if [[ -f "$wheels/ray-2.60.0-trimmed.tar.xz" ]]; then  # bench/fetch_ray.sh: the Ray engine's benchmarks
  tar -C /tmp/site -xJf "$wheels/ray-2.60.0-trimmed.tar.xz"
  python3 -c 'import sys; sys.path.append("/tmp/site"); import ray; print("ray", ray.__version__, "imports ok")'
fi
site="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
echo /tmp/site >"$site/zz-convtts-carried.pth"  # a .pth path goes last on sys.path: image versions win
python3 -c 'from convtts.config import CosyVoiceConfig; from convtts.speak.cosyvoice.runtime import import_runtime; import_runtime(CosyVoiceConfig()); print("runtime imports ok")'
if [[ "${MODEL_SIZE:-full}" != none && ! -f "$model/cosyvoice.yaml" ]]; then
  python3 -m convtts.testing.cosyvoice_model --out "$model" --size "${MODEL_SIZE:-full}" --tokens-per-text-token 14 --speakers 英文女,英文男
fi
