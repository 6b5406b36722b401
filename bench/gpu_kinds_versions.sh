#!/usr/bin/env bash
# Short turns against long answers (bench/text_kinds.py) with CosyVoice3, and v2 or v1 if asked, on a bare
# GPU machine in one command: install the carried wheels, write full-size random-weight model directories
# (v2 and v3 load with the checkout $COSYVOICE_ROOT names, by default .carry/CosyVoice in this repository),
# then run text_kinds.py for each version, one after the other. Each job stops at its time limit, the
# stacks of its Python processes dumped into their logs (kill -USR1); each version's log folders are
# packed into $OUT as they end, with its figures (JSON) and printout.
#
#   OUT=$OUT bash bench/gpu_kinds_versions.sh
#   SETUP=0 MODEL_SIZE=tiny GPUS=cpu:2 CONVERSATIONS=6 PYTHON=.venv/bin/python bash bench/gpu_kinds_versions.sh  # CPU dry run
#
# Knobs (defaults in brackets): VERSIONS ["3"], CONVERSATIONS [300] (short-turn ones; the long text
# matches their words), BENCH_CONVERSATIONS [unset] (Q&A ones: with CONVERSATIONS set too each job takes
# its own count, e.g. 1000 and 1480 for about the same audio; alone, the short-turn job matches its words), JOB_LIMIT [200] (seconds per job, cut to fit DEADLINE [560] seconds for the whole
# script), SETS [""] (group.key=value items added to every command), COMPARE [""] (group.key=value items:
# each job runs again with them, right after, text_kinds.py --compare), GPUS [every GPU], SETUP [1] (0: the
# wheels are installed already), MODEL_SIZE [full] (tiny for a dry run), WHEELS [.whl], PYTHON [python3].
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out="${OUT:-bench/results}"
python="${PYTHON:-python3}"
export PYTHON="$python"  # run_all.sh's interpreter too
export COSYVOICE_ROOT="${COSYVOICE_ROOT:-$PWD/.carry/CosyVoice}"
versions=(${VERSIONS:-3})
size="${MODEL_SIZE:-full}" deadline="${DEADLINE:-560}" job_limit="${JOB_LIMIT:-200}"
mkdir -p "$out"
[[ -d "$COSYVOICE_ROOT/cosyvoice" ]] || { echo "no CosyVoice checkout at $COSYVOICE_ROOT" >&2; exit 2; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
if [[ "${SETUP:-1}" != 0 ]]; then MODEL_SIZE=none bash bench/gpu_setup.sh "${WHEELS:-.whl}"; fi

build() {  # version: the random model directory /tmp/cv-$size-vN, written unless it is there
  local version="$1" dir="/tmp/cv-$size-v$1" args=(--tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT")
  [[ $version == 1 ]] && args=(--tokens-per-text-token 14 --speakers 英文女,英文男)
  [[ -n "$(ls "$dir"/cosyvoice*.yaml 2>/dev/null)" ]] && return 0
  "$python" -m convtts.testing.cosyvoice_model --version "$version" --size "$size" --out "$dir" "${args[@]}"
}
pids=()
for version in "${versions[@]}"; do build "$version" >"$out/build-v$version.log" 2>&1 & pids+=($!); done
for i in "${!versions[@]}"; do
  wait "${pids[$i]}" || { tail -n 30 "$out/build-v${versions[$i]}.log"; exit 1; }
done
echo "models written at $((SECONDS - started)) s"

jobs=2 && [[ -n "${COMPARE:-}" ]] && jobs=4  # each version's jobs: both texts, compared or not
limit_for() {  # versions left: this one's per-job limit, JOB_LIMIT or less to end by DEADLINE
  local share=$(((deadline - (SECONDS - started)) / (jobs * $1) - 20))
  ((share < job_limit)) && echo $((share > 30 ? share : 30)) || echo "$job_limit"
}

run_kinds() {  # version, versions left after it
  local version="$1" work="/tmp/convtts-kinds-v$1" limit sets=() gpus=() counts=()
  limit="$(limit_for "$2")"
  for item in ${SETS:-}; do sets+=(--set "$item"); done
  for item in ${COMPARE:-}; do sets+=(--compare "$item"); done
  [[ -n "${GPUS:-}" ]] && gpus=(--gpus "$GPUS")
  [[ -n "${CONVERSATIONS:-}" || -z "${BENCH_CONVERSATIONS:-}" ]] && counts=(--conversations "${CONVERSATIONS:-300}")
  [[ -n "${BENCH_CONVERSATIONS:-}" ]] && counts+=(--bench-conversations "$BENCH_CONVERSATIONS")
  rm -rf "$work"
  echo "== v$version: ${counts[*]}, jobs limited to $limit s, at $((SECONDS - started)) s"
  local root=(env) && [[ $version == 1 ]] && root=(env -u COSYVOICE_ROOT)  # v1 on the installed package
  "${root[@]}" timeout -k 20 $((jobs * limit + 200)) "$python" bench/text_kinds.py --version "$version" \
    --model-dir "/tmp/cv-$size-v$version" "${counts[@]}" --job-limit "$limit" \
    --work "$work" --out "$out/kinds-v$version.json" "${gpus[@]}" "${sets[@]}" 2>&1 | tee "$out/kinds-v$version.txt" \
    || echo "v$version: text_kinds exited ${PIPESTATUS[0]}"
  (cd "$work" && find . -maxdepth 2 -name 'log-*' -print0 | tar -czf "$out/logs-v$version.tar.gz" --null -T -) || true
  echo "v$version done at $((SECONDS - started)) s"
}

for i in "${!versions[@]}"; do run_kinds "${versions[$i]}" $((${#versions[@]} - i)); done
