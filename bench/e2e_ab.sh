#!/usr/bin/env bash
# Two versions of the code on the same job, on the same machine, in one call: the end-to-end figures
# of bench/e2e.py for a baseline (a `git archive` tar of another commit) and for this tree, in
# turns (baseline, this tree, baseline, ...), so that a warm page cache or a busy host favours
# neither; both run from copies under /tmp. Each run's JSON and its slot logs land in $OUT/<label>-<N>-<turn>/.
#
#   git archive -o .whl/base.tar <commit>          # on the developer machine
#   OUT=$OUT BASE=.whl/base.tar SIZES="300 1000" TURNS=1 bash bench/e2e_ab.sh   # on the GPU machine
#
# Knobs: BASE (required), SIZES ["300"], TURNS [1], GPUS [0], ENGINES [bash], MODEL [/tmp/cv300m],
# SETUP [1: bench/gpu_setup.sh first], PACK [0; 1 packs $OUT into $OUT.tgz, with each run's worker
# logs: a device call brings back only a few files].
set -euo pipefail
cd "$(dirname "$0")/.."
here="$PWD" out="${OUT:?set OUT}" base_tar="${BASE:?set BASE to a git archive tar}"
model="${MODEL:-/tmp/cv300m}"
mkdir -p "$out"
if [[ "${SETUP:-1}" != 0 ]]; then
  MODEL_SIZE=full bash bench/gpu_setup.sh .whl "$model"
fi
base=/tmp/e2e-ab-base new=/tmp/e2e-ab-new
rm -rf "$base" "$new" && mkdir -p "$base" "$new" && tar -C "$base" -xf "$base_tar"
# This tree runs from a copy beside the baseline's: run from the repository's root on the device, its
# slots finished their preload 2.4-4 s after the baseline's in every turn of one call (2026-11-26),
# with no change to what they import; a copy next to the baseline's takes the place out of the comparison.
tar -C "$here" --exclude=./.whl --exclude=./.git --exclude='./.venv*' --exclude=./bench/results --exclude=__pycache__ -cf - . | tar -C "$new" -xf -
cp bench/e2e.py "$base/bench/e2e.py"  # one measure for both: this tree's
run() {  # label tree conversations turn
  local dest="$out/$1-$3-$4"
  (cd "$2" && OUT="$dest" WORK="/tmp/e2e-ab-$1-$3-$4" SETUP=0 GPUS="${GPUS:-0}" CONVERSATIONS="$3" \
    ENGINES="${ENGINES:-bash}" MODEL="$model" bash bench/e2e_gpu.sh >"$dest.log" 2>&1) || echo "$1 $3 $4: exit $?"
  grep -hE "end to end|^  slot|^  last rows|^  engine" "$dest.log" | sed "s|^|$1 $3 #$4: |" || true
}
for size in ${SIZES:-300}; do
  for turn in $(seq "${TURNS:-1}"); do
    run base "$base" "$size" "$turn"
    run new "$new" "$size" "$turn"
  done
done
if [[ "${PACK:-0}" == 1 ]]; then
  logs=(/tmp/e2e-ab-*/log-*)
  tar -czf "$out.tgz" "$out" "${logs[@]}" 2>/dev/null && rm -rf "$out"
fi
