#!/usr/bin/env bash
# Ray for a bare GPU machine (run here, with PyPI): its cp312 wheel is 79 MB, over what a command
# can carry, so it is unpacked, stripped of what the Ray engine never imports (java jars, rllib,
# tune, train, serve, llm, data, the dashboard's source maps) and packed as ray-2.60.0-trimmed.tar.xz
# (about 21 MB) beside the four small wheels it needs that the image lacks. bench/gpu_setup.sh
# unpacks it into the carried site folder.
#   bash bench/fetch_ray.sh [DIR]      (default .whl, ignored by git)
set -euo pipefail
dir="$(mkdir -p "${1:-.whl}" && cd "${1:-.whl}" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$tmp" \
  ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py
mv "$tmp"/jsonschema*.whl "$tmp"/referencing*.whl "$tmp"/rpds_py*.whl "$dir"/
mkdir "$tmp/tree"
# unpacked keeping each file's mode: the raylet and GCS server are executables
python3 - "$tmp"/ray-2.60.0-*.whl "$tmp/tree" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for info in wheel.infolist():
        path = wheel.extract(info, sys.argv[2])
        mode = info.external_attr >> 16
        if mode:
            os.chmod(path, mode & 0o7777)
PY
rm -rf "$tmp"/tree/ray/{jars,rllib,tune,train,serve,llm,data}
find "$tmp/tree/ray/dashboard" -name '*.map' -delete
tar -C "$tmp/tree" -cf - . | xz -9 -T0 >"$dir/ray-2.60.0-trimmed.tar.xz"
ls -la "$dir"/ray-2.60.0-trimmed.tar.xz "$dir"/jsonschema*.whl "$dir"/referencing*.whl "$dir"/rpds_py*.whl
