#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels a bare GPU machine (Python 3.12, the image described in
# docs/PERFORMANCE.md: torch, torchaudio, transformers, onnxruntime already there) lacks for the
# CosyVoice path (v1, v2 and v3); bench/gpu_setup.sh installs them there. About 24 MiB. Checked on 2026-11-23 against
# an emulation of that image (torch/torchaudio 2.11.0, transformers 5.17.0, huggingface_hub 1.33.0).
#   bash bench/fetch_wheels.sh [DIR]      (default .whl, ignored by git)
set -euo pipefail
dir="${1:-.whl}"
mkdir -p "$dir"
binary=(
  cosyvoice2-eu==0.2.8 orjson==3.13.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12
  hyperpyyaml==1.2.3 ruamel.yaml==0.18.17 ruamel.yaml.clib==0.2.15 conformer==0.3.2 diffusers==0.42.1
  inflect==7.6.0 typeguard==4.4.4 more-itertools==11.2.1 jaraco.functools==4.6.0 omegaconf==2.3.1
  hydra-core==1.3.8 librosa==1.0.0 audioread==3.1.0 soxr==1.1.0 pooch==1.9.0 platformdirs==4.14.7
  decorator==5.3.1 wetext==0.1.8 kaldifst==1.8.3 contractions==0.1.73 textsearch==0.0.24 anyascii==0.3.3
  pyahocorasick==2.3.1 modelscope==1.34.0 gdown==6.5.1 beautifulsoup4==4.15.0 soupsieve==4.1.2
  x-transformers==2.11.24 einx==0.4.3 loguru==0.7.3 frozendict==2.5.1  # CosyVoice3's DiT flow
  py3langid==0.4.0  # the planner's language of a turn
)
# Published as source only: pure Python, built into wheels here.
source_only=(antlr4-python3-runtime==4.9.3 openai-whisper==20250625 wget==3.2)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dir" "${binary[@]}"
python3 -m pip wheel -q --no-deps -w "$dir" "${source_only[@]}"
ls "$dir" | wc -l
du -sh "$dir"
