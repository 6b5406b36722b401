#!/usr/bin/env bash
# The engine's parts against the machine (bench/part_account.py) and whole jobs of one text (bench/e2e.py),
# on a bare GPU machine, in steps a call names; what each step writes goes into $OUT/results.tgz (the logs
# of whole jobs included) and its printout into $OUT/summary.txt.
#
#   OUT=$OUT STEPS="setup account:1 account:2 account:3 job:2:bench:1000:250" bash bench/gpu_account.sh
#   OUT=$OUT STEPS="job:2:short:1480:250 job:3:bench:1000:250" bash bench/gpu_account.sh   # the same machine, later
#   PYTHON=.venv-test/bin/python MODEL_SIZE=tiny EXTRA="--gpus cpu:2" ACCOUNT_ARGS="--decode-rows 2 --prefill-rows 2 \
#     --flow-rows 2 --seconds 0.5" STEPS="models account:2 job:2:short:4:200" bash bench/gpu_account.sh  # CPU check
#
# Steps: setup (the carried wheels, then models), models (random v1, v2 and v3 directories of MODEL_SIZE, full
# by default, at /tmp/cv-full-vN),
# account:V[:group.key=value,...], check:V[:TEXTS[:group.key=value,...]] (convtts check-model against upstream, all 20 texts by default),
# job:V:TEXT:CONVERSATIONS:LIMIT[:group.key=value,...] (TEXT bench or short; LIMIT seconds, past which the
# job is stopped and not counted). The runtime: $COSYVOICE_ROOT, by default .whl/CosyVoice.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/account-out}" raw=/tmp/account-raw started=$SECONDS size="${MODEL_SIZE:-full}"
export COSYVOICE_ROOT="${COSYVOICE_ROOT:-$PWD/.whl/CosyVoice}" PYTHONUNBUFFERED=1 PYTHON="${PYTHON:-python3}"
mkdir -p "$out" "$raw"
say() { echo "$*" | tee -a "$out/summary.txt"; }

setup() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; } >"$raw/machine.txt" 2>&1
  MODEL_SIZE=none bash bench/gpu_setup.sh .whl >"$raw/setup.log" 2>&1 || { tail -n 20 "$raw/setup.log"; return 1; }
  models
}

models() {
  local pids=() version
  for version in ${MODELS:-1 2 3}; do
    local args=(--tokens-per-text-token 7 --runtime-root "$COSYVOICE_ROOT")
    [[ $version == 1 ]] && args=(--tokens-per-text-token 14 --speakers 英文女,英文男)
    [[ -n "$(ls /tmp/cv-$size-v$version/cosyvoice*.yaml 2>/dev/null)" ]] && continue
    "$PYTHON" -m convtts.testing.cosyvoice_model --version $version --size $size --out /tmp/cv-$size-v$version \
      "${args[@]}" >"$raw/build-v$version.log" 2>&1 & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || return 1; done
}

runtime() {  # v1 on the installed package, v2 and v3 on the checkout
  [[ $1 == 1 ]] && echo "env -u COSYVOICE_ROOT" || echo env
}

account() {  # version [settings, comma-separated]
  local name="account-v$1${2:+-set}" sets=()
  IFS=, read -ra items <<<"${2:-}"
  for item in "${items[@]}"; do sets+=(--set "$item"); done
  $(runtime "$1") timeout -k 10 "${ACCOUNT_LIMIT:-150}" "$PYTHON" bench/part_account.py --version "$1" --model-dir "/tmp/cv-$size-v$1" ${ACCOUNT_ARGS:-} \
    "${sets[@]}" --out "$raw/$name.json" >"$raw/$name.txt" 2>&1
  local rc=$?
  say "rc $rc account v$1 ${2:-}"
  grep -E '^(machine|decode|prefill|flow|vocoder|kernels) ' "$raw/$name.txt" | cut -c1-1500 | tee -a "$out/summary.txt"
  ((rc == 0)) || tail -n 15 "$raw/$name.txt"
}

check() {  # version [texts] [settings, comma-separated]: convtts check-model on the random model, the shipped config
  local sets=() config=configs/cosyvoice$([[ $1 == 1 ]] || echo "$1").yaml work=/tmp/check-v$1 name="check-v$1${3:+-set}"
  mkdir -p "$work"
  mapfile -t sets < <("$PYTHON" -c 'import sys; sys.path.insert(0, "bench"); from pathlib import Path; from e2e import version_sets
for item in version_sets(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]): print(f"--set\n{item}")' "$1" "$work" "$COSYVOICE_ROOT")
  IFS=, read -ra items <<<"${3:-}"
  for item in "${items[@]}"; do sets+=(--set "$item"); done
  $(runtime "$1") timeout -k 10 "${CHECK_LIMIT:-300}" "$PYTHON" -m convtts check-model --config "$config" \
    --set "tts.cosyvoice.model_dir=/tmp/cv-$size-v$1" "${sets[@]}" ${2:+--texts "$2"} --out "$raw/$name.json" \
    >"$raw/$name.txt" 2>&1
  say "rc $? check v$1 ${3:-}"
  grep -E '^(part|llm|audio) |failed|error' "$raw/$name.txt" | grep -v INFO | cut -c1-330 | tee -a "$out/summary.txt"
}

job() {  # version text conversations limit [settings, comma-separated]
  local name="v$1-$2-$3${5:+-set}" sets=()
  IFS=, read -ra items <<<"${5:-}"
  for item in "${items[@]}"; do sets+=(--set "$item"); done
  rm -rf "/tmp/job-$name"
  $(runtime "$1") timeout -k 20 $(($4 + 120)) "$PYTHON" bench/e2e.py --version "$1" --model-dir "/tmp/cv-$size-v$1" ${EXTRA:-} \
    --text "$2" --conversations "$3" --job-limit "$4" --work "/tmp/job-$name" --out "$raw/job-$name.json" \
    "${sets[@]}" >"$raw/job-$name.txt" 2>&1
  say "rc $? job $name ${5:-}"
  grep -E "exit|end to end|by row|engine, all|frontend threads|start-up|tail" "$raw/job-$name.txt" | cut -c1-420 | tee -a "$out/summary.txt"
  (cd "/tmp/job-$name" && find . -maxdepth 2 -name 'log-*' -print0 | tar -czf "$raw/logs-$name.tgz" --null -T -) || true
}

for step in ${STEPS:-setup}; do
  say "== $step at $((SECONDS - started)) s"
  IFS=: read -r what a b c d e <<<"$step"
  case $what in
    setup) setup || say "setup failed" ;;
    models) models || say "models failed" ;;
    account) account "$a" "$b" ;;
    check) check "$a" "$b" "$c" ;;
    job) job "$a" "$b" "$c" "$d" "$e" ;;
  esac
done
say "== done at $((SECONDS - started)) s"
tar -C "$raw" -czf "$out/results.tgz" .
