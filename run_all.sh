#!/usr/bin/env bash
# Node orchestrator: plan (if needed), one parallel_cosyvoice.py per GPU (or CPU slot), wait, merge.
# Exit codes: 0 all done; 1 some utterances failed or unfinished, or the disk filled (rerun
#             retries them); 2 bad input or config (nothing started); 3 another run holds the lock.
# Its steps exit 4 when the output's filesystem is full; that becomes one line and exit 1 here.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi

usage() {
  cat <<'EOF'
usage: run_all.sh --input FILE [--output-dir DIR] [--config configs/X.yaml]
                  [--gpus 0,1,... | --gpus cpu:N] [--workers K] [--mps auto|on|off]
                  [--fraction F | --count N] [--seed S] [--set group.key=value ...]
                  [--log-dir DIR] [--force-replan]
Speaks every selected conversation turn into OUTPUT_DIR (default: output/). Run it again after
any interruption: it finishes the work and redoes nothing that is done.
Exit codes: 0 all done, 1 some utterances failed or the disk is full (rerun retries them),
2 bad input or config, 3 another run holds the output directory's lock.
EOF
}

bad_usage() { echo "run_all.sh: $*" >&2; echo "try: run_all.sh --help" >&2; exit 2; }
say() { if [[ -t 1 ]]; then echo "$@"; fi; }  # chatter only on a terminal: cron gets the summary alone
DISK_FULL_EXIT=4  # convtts.EXIT_DISK_FULL: preprocess, a slot or merge could not write for want of space
disk_full() {
  echo "run_all.sh: no space left on device in $OUT; free space and run the same command again" >&2
  exit 1
}

INPUT="" OUT="$HERE/output" CONFIG="" GPUS="" WORKERS="" MPS="auto" LOG_ROOT="" FORCE=""
PRE_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --input) INPUT="${2:?--input needs a file}"; shift 2 ;;
    --output-dir) OUT="${2:?--output-dir needs a folder}"; shift 2 ;;
    --config) CONFIG="${2:?--config needs a file}"; shift 2 ;;
    --gpus) GPUS="${2:?--gpus needs a list or cpu:N}"; shift 2 ;;
    --workers) WORKERS="${2:?--workers needs a number}"; shift 2 ;;
    --mps) MPS="${2:?--mps needs auto, on or off}"; shift 2 ;;
    --fraction|--count|--seed) PRE_ARGS+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    --set) PRE_ARGS+=(--set "${2:?--set needs group.key=value}"); shift 2 ;;
    --log-dir) LOG_ROOT="${2:?--log-dir needs a folder}"; shift 2 ;;
    --force-replan) FORCE="--force"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown option: $1" ;;
  esac
done
[[ -n "$INPUT" ]] || bad_usage "--input FILE is required"
[[ -z "$WORKERS" || "$WORKERS" =~ ^[1-9][0-9]*$ ]] || bad_usage "--workers must be a positive integer"
[[ "$MPS" =~ ^(auto|on|off)$ ]] || bad_usage "--mps takes auto, on or off"
[[ -n "$CONFIG" ]] && PRE_ARGS+=(--config "$CONFIG")
[[ -n "$WORKERS" ]] && PRE_ARGS+=(--set "workers.per_slot=$WORKERS")

# --- the slots: GPU ids, or cpu:N ---------------------------------------------------------
SLOT_DEVICES=()
if [[ -z "$GPUS" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && ids="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)" && [[ -n "$ids" ]]; then
    GPUS="$(echo "$ids" | tr -d ' ' | paste -sd, -)"
  else
    GPUS="cpu:1"
  fi
fi
if [[ "$GPUS" =~ ^cpu:([1-9][0-9]*)$ ]]; then
  for ((i = 0; i < BASH_REMATCH[1]; i++)); do SLOT_DEVICES+=("cpu"); done
elif [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  IFS=, read -r -a SLOT_DEVICES <<<"$GPUS"
else
  bad_usage "--gpus takes a list of GPU ids (0,1,2) or cpu:N, got '$GPUS'"
fi
WORLD=${#SLOT_DEVICES[@]}

# --- 1. check config and input; nothing is written yet --------------------------------------
rc=0
checked="$("$PYTHON" "$HERE/preprocess.py" --validate --input "$INPUT" --output-dir "$OUT" "${PRE_ARGS[@]}" 2>&1)" || rc=$?
if [[ $rc -ne 0 ]]; then
  echo "$checked" | grep -v -E '^[0-9]{4}-[0-9]{2}-[0-9]{2} .* INFO ' >&2
  exit 2
fi

# --- 2. lock the output directory ---------------------------------------------------------
CREATED_OUT=""
[[ -d "$OUT" ]] || CREATED_OUT=1
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
if ! flock -n 9; then
  echo "run_all.sh: another run holds the lock on $OUT ($OUT/.lock); not starting" >&2
  exit 3
fi

RUN_ID="$(date +%Y%m%dT%H%M%S)-$$"
STARTED="$(date +%s.%N)"
LOG_DIR="${LOG_ROOT:-$HERE/log}/$(basename "$OUT")/$RUN_ID"
mkdir -p "$LOG_DIR"

# --- 3. plan: made when missing or stale ----------------------------------------------------
set +e
"$PYTHON" "$HERE/preprocess.py" --input "$INPUT" --output-dir "$OUT" $FORCE "${PRE_ARGS[@]}" >"$LOG_DIR/preprocess.log" 2>&1
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
  if [[ $rc -ne $DISK_FULL_EXIT ]]; then
    grep -E '^error:' "$LOG_DIR/preprocess.log" >&2 || tail -n 20 "$LOG_DIR/preprocess.log" >&2
  fi
  if [[ -n "$CREATED_OUT" ]]; then rm -f "$OUT/.lock"; rmdir "$OUT" 2>/dev/null || true; fi
  [[ $rc -eq $DISK_FULL_EXIT ]] && disk_full
  [[ $rc -eq 2 ]] && exit 2
  echo "run_all.sh: preprocessing failed unexpectedly (exit $rc); see $LOG_DIR/preprocess.log" >&2
  exit 1
fi
if [[ -t 1 ]]; then grep -v -E '^[0-9]{4}-' "$LOG_DIR/preprocess.log" || true; fi

# --- 4. MPS, slots, and stopping only what we started ---------------------------------------
# shellcheck source=scripts/mps.sh
source "$HERE/scripts/mps.sh"
SLOT_PIDS=()
MONITOR_PID=""
cleanup() {
  [[ -n "$MONITOR_PID" ]] && kill "$MONITOR_PID" 2>/dev/null || true
  mps_stop
}
on_signal() {
  trap - INT TERM
  echo "run_all.sh: $1 received; stopping this run's slots" >&2
  for pid in "${SLOT_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait || true
  [[ "$1" == INT ]] && exit 130 || exit 143
}
trap cleanup EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

if [[ "${SLOT_DEVICES[0]}" != cpu ]]; then mps_start "$MPS" "$LOG_DIR/mps"; fi

for ((rank = 0; rank < WORLD; rank++)); do
  device="${SLOT_DEVICES[$rank]}"
  if [[ "$device" == cpu ]]; then visible="" kind=cpu; else visible="$device" kind=cuda; fi
  CUDA_VISIBLE_DEVICES="$visible" "$PYTHON" "$HERE/parallel_cosyvoice.py" --output-dir "$OUT" \
    --rank "$rank" --world "$WORLD" --device "$kind" --run-id "$RUN_ID" --log-dir "$LOG_DIR" \
    >"$LOG_DIR/slot-$rank.log" 2>&1 &
  SLOT_PIDS+=($!)
done
say "run $RUN_ID: $WORLD slot(s) on ${GPUS}; logs in $LOG_DIR"
if [[ -t 1 ]]; then
  "$PYTHON" -m convtts.progress "$OUT" --slots "$WORLD" --since "$STARTED" &
  MONITOR_PID=$!
fi

SLOT_FAILED=0 SLOT_DISK_FULL=0
for ((rank = 0; rank < WORLD; rank++)); do
  rc=0
  wait "${SLOT_PIDS[$rank]}" || rc=$?
  if [[ $rc -eq $DISK_FULL_EXIT ]]; then
    SLOT_DISK_FULL=1  # its log names the file; the others stopped or will, on the same disk
  elif [[ $rc -ne 0 ]]; then
    SLOT_FAILED=1
    echo "run_all.sh: slot $rank (${SLOT_DEVICES[$rank]}) exited $rc; see $LOG_DIR/slot-$rank.log" >&2
  fi
done
if [[ -n "$MONITOR_PID" ]]; then kill "$MONITOR_PID" 2>/dev/null || true; wait "$MONITOR_PID" 2>/dev/null || true; MONITOR_PID=""; echo; fi

# --- 5. merge and report ------------------------------------------------------------------
# No merge on a full disk: it would rewrite manifest.jsonl beside the work files and fail too.
[[ $SLOT_DISK_FULL -eq 1 ]] && disk_full
rc=0
"$PYTHON" -m convtts.merge "$OUT" --run-id "$RUN_ID" --started "$STARTED" || rc=$?
[[ $rc -eq $DISK_FULL_EXIT ]] && disk_full
if [[ $rc -ne 0 || $SLOT_FAILED -ne 0 ]]; then
  echo "run_all.sh: not everything was spoken; see $OUT/failures.jsonl. Run the same command again to retry." >&2
  exit 1
fi
exit 0
