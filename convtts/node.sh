#!/usr/bin/env bash
# The node orchestrator behind run_all.sh and `python -m convtts`: plan (if needed), one slot
# (python -m convtts.run, as parallel_cosyvoice.py) per GPU or CPU slot, wait, merge.
# Started by convtts/node.py with PYTHON set; output/ and log/ default to folders of CONVTTS_HOME
# (run_all.sh: the checkout; python -m convtts: the current directory).
# Exit codes: 0 all done; 1 some utterances failed or unfinished, or the disk filled (rerun
#             retries them); 2 bad input or config (nothing started); 3 another run holds the lock;
#             130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (rerun finishes the work).
# Its steps exit 4 when the output's filesystem is full; that becomes one line and exit 1 here.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"  # the package: run/mps.sh
PYTHON="${PYTHON:-python3}"
PROG="${CONVTTS_PROG:-run_all.sh}"  # the command as typed: run_all.sh, python -m convtts (convtts/node.py)
unset CONVTTS_PROG
HOME_DIR="${CONVTTS_HOME:-$PWD}"
# run_all.sh names its checkout's preprocess.py and parallel_cosyvoice.py; installed, the modules.
PLAN=("$PYTHON" -m convtts.plan) SLOT=("$PYTHON" -m convtts.run)
[[ -n "${CONVTTS_PLAN_SCRIPT:-}" ]] && PLAN=("$PYTHON" "$CONVTTS_PLAN_SCRIPT")
[[ -n "${CONVTTS_SLOT_SCRIPT:-}" ]] && SLOT=("$PYTHON" "$CONVTTS_SLOT_SCRIPT")

usage() {
  local PAD
  PAD="$(printf "%*s" $((${#PROG} + 8)) "")"  # under the first option, whatever the command's name
  cat <<EOF
usage: $PROG --input FILE [--output-dir DIR] [--config configs/X.yaml]
${PAD}[--gpus 0,1,... | --gpus cpu:N] [--workers K] [--mps auto|on|off|per-gpu]
${PAD}[--fraction F | --count N] [--seed S] [--set group.key=value ...]
${PAD}[--log-dir DIR] [--force-replan] [--verify]
${PAD}[--engine ray [--address auto|HOST:PORT|local] [--slot-resource GPU|NAME]]
${PAD}[--node-rank R --nodes N | --slurm]
Speaks every selected conversation turn into OUTPUT_DIR (default: output/). Run it again after
any interruption: it finishes the work and redoes nothing that is done. A finished shard is
trusted by its done marker while its files keep their sizes; --verify opens every audio file.
--engine ray: one slot per GPU of a Ray cluster, shards handed out as slots ask (OUTPUT_DIR and
the log folder on a filesystem every node shares). --node-rank/--nodes (--slurm: from SLURM_NODEID
and SLURM_NNODES): this node speaks shards[R::N], beside the other nodes' run_all.sh.
$PROG check-model --config X --set tts.cosyvoice.model_dir=DIR: the batched engine against
upstream's one-at-a-time path on that model (docs/gpu.md, Checking your model).
Exit codes: 0 all done, 1 some utterances failed or the disk is full (rerun retries them),
2 bad input or config, 3 another run holds the output directory's lock; 130 stopped by Ctrl-C
(SIGINT), 143 by SIGTERM: run the same command again to finish.
EOF
}

bad_input() { echo "$PROG: $*" >&2; exit 2; }  # one line: cron mails it whole
bad_usage() { bad_input "$* (see $PROG --help)"; }
say() { if [[ -t 1 ]]; then echo "$@"; fi; }  # chatter only on a terminal: cron gets the summary alone
plural() { if [[ "$1" == 1 ]]; then echo "1 $2"; else echo "$1 ${3:-$2s}"; fi; }  # 1 slot, 2 slots
DISK_FULL_EXIT=4  # convtts.EXIT_DISK_FULL: preprocess, a slot or merge could not write for want of space
disk_full() {
  echo "$PROG: no space left on device in $OUT; free space and run the same command again" >&2
  exit 1
}

STARTED="$(date +%s.%N)"  # the command's start: slots time their start-up from it
INPUT="" OUT="$HOME_DIR/output" CONFIG="" GPUS="" WORKERS="" MPS="auto" LOG_ROOT="" FORCE=""
ENGINE="bash" ADDRESS="" SLOT_RESOURCE="" NODE_RANK="" NODES="" SLURM="" VERIFY=()
PRE_ARGS=() SETS=()
# An option's value, or one line and exit 2 when it is missing or empty (--gpus '').
needs() { [[ -n "$val" ]] || bad_usage "$opt needs $*"; }
while [[ $# -gt 0 ]]; do
  opt="$1" val="${2-}"
  case "$1" in
    --input) needs a file; INPUT="$val"; shift 2 ;;
    --output-dir) needs a folder; OUT="$val"; shift 2 ;;
    --config) needs a file; CONFIG="$val"; shift 2 ;;
    --gpus) needs "a list of GPU ids (0,1,2) or cpu:N"; GPUS="$val"; shift 2 ;;
    --workers) needs a number; WORKERS="$val"; shift 2 ;;
    --mps) needs "auto, on, off or per-gpu"; MPS="$val"; shift 2 ;;
    --fraction|--count|--seed) needs a value; PRE_ARGS+=("$1" "$val"); shift 2 ;;
    --set) needs group.key=value; SETS+=(--set "$val"); shift 2 ;;
    --log-dir) needs a folder; LOG_ROOT="$val"; shift 2 ;;
    --force-replan) FORCE="--force"; shift ;;
    --verify) VERIFY=(--verify); shift ;;
    --engine) needs "bash or ray"; ENGINE="$val"; shift 2 ;;
    --address) needs "auto, HOST:PORT or local"; ADDRESS="$val"; shift 2 ;;
    --slot-resource) needs "a Ray resource name"; SLOT_RESOURCE="$val"; shift 2 ;;
    --node-rank) needs a number; NODE_RANK="$val"; shift 2 ;;
    --nodes) needs a number; NODES="$val"; shift 2 ;;
    --slurm) SLURM=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown option: $1" ;;
  esac
done
[[ -n "$INPUT" ]] || bad_usage "--input FILE is required"
[[ -z "$WORKERS" || "$WORKERS" =~ ^[1-9][0-9]*$ ]] || bad_usage "--workers must be a positive integer"
[[ "$MPS" =~ ^(auto|on|off|per-gpu)$ ]] || bad_usage "--mps takes auto, on, off or per-gpu"
[[ "$ENGINE" =~ ^(bash|ray)$ ]] || bad_usage "--engine takes bash or ray"
if [[ "$ENGINE" != ray && ( -n "$ADDRESS" || -n "$SLOT_RESOURCE" ) ]]; then bad_usage "--address and --slot-resource go with --engine ray"; fi
if [[ "$ENGINE" == ray && "$MPS" == per-gpu ]]; then bad_usage "--mps per-gpu is for run_all.sh's own slots; --engine ray starts one MPS daemon a node"; fi
if [[ "$ENGINE" == ray && -n "$GPUS" ]]; then bad_usage "--gpus is for one machine; --engine ray runs a slot per GPU of the cluster (or per --slot-resource)"; fi
if [[ -n "$SLURM" ]]; then
  [[ -n "${SLURM_NODEID:-}" && -n "${SLURM_NNODES:-}" ]] || bad_usage "--slurm needs SLURM_NODEID and SLURM_NNODES (run it under srun)"
  NODE_RANK="$SLURM_NODEID" NODES="$SLURM_NNODES"
fi
if [[ -n "$NODE_RANK$NODES" ]]; then
  [[ "$NODE_RANK" =~ ^[0-9]+$ && "$NODES" =~ ^[1-9][0-9]*$ ]] || bad_usage "--node-rank R and --nodes N go together (0 <= R < N)"
  (( NODE_RANK < NODES )) || bad_usage "--node-rank must be below --nodes, got $NODE_RANK of $NODES"
  [[ "$ENGINE" == bash ]] || bad_usage "--node-rank/--nodes/--slurm share shards between nodes by rank; --engine ray hands them out itself"
fi
[[ -n "$CONFIG" ]] && SETS=(--config "$CONFIG" "${SETS[@]}")
[[ -n "$WORKERS" ]] && SETS+=(--set "workers.per_slot=$WORKERS")
PRE_ARGS+=("${SETS[@]}")  # the plan's settings; a slot gets SETS alone (it has no use for the selection)

# --- the slots: GPU ids, or cpu:N ---------------------------------------------------------
SLOT_DEVICES=()
if [[ -z "$GPUS" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && ids="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)" && [[ -n "$ids" ]]; then
    GPUS="$(echo "$ids" | tr -d ' ' | paste -sd, -)"
  else
    GPUS="cpu:1"
  fi
fi
# GPUs named on the command line must be this machine's: a missing one would run on the CPU.
check_gpus() {
  local listed id
  command -v nvidia-smi >/dev/null 2>&1 || bad_usage "--gpus $1: this machine has no nvidia-smi, so no GPU to run on (--gpus cpu:N runs on the CPU)"
  listed="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ' | paste -sd, -)" || listed=""
  [[ -n "$listed" ]] || bad_usage "--gpus $1: nvidia-smi lists no GPU on this machine (--gpus cpu:N runs on the CPU)"
  for id in ${1//,/ }; do
    [[ ",$listed," == *",$id,"* ]] || bad_usage "--gpus $1: this machine has no GPU $id; nvidia-smi lists $listed"
  done
}
if [[ "$GPUS" =~ ^cpu:([1-9][0-9]*)$ ]]; then
  for ((i = 0; i < BASH_REMATCH[1]; i++)); do SLOT_DEVICES+=("cpu"); done
elif [[ "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
  check_gpus "$GPUS"
  IFS=, read -r -a SLOT_DEVICES <<<"$GPUS"
else
  bad_usage "--gpus takes a list of GPU ids (0,1,2) or cpu:N, got '$GPUS'"
fi
WORLD=${#SLOT_DEVICES[@]}

# --- 1. check config and input; nothing is written yet --------------------------------------
rc=0
checked="$("${PLAN[@]}" --validate --input "$INPUT" --output-dir "$OUT" "${PRE_ARGS[@]}" 2>&1)" || rc=$?
if [[ $rc -ne 0 ]]; then
  echo "$checked" | grep -v -E '^[0-9]{4}-[0-9]{2}-[0-9]{2} .* INFO ' >&2
  exit 2
fi
export CONVTTS_RUN_STARTED="$STARTED" CONVTTS_VALIDATED="$(date +%s.%N)"

# --- 2. lock the output directory ---------------------------------------------------------
CREATED_OUT=""
[[ -d "$OUT" ]] || CREATED_OUT=1
made="$(mkdir -p "$OUT" 2>&1)" || bad_input "cannot create the output folder $OUT (${made##*: })"
{ exec 9>"$OUT/.lock"; } 2>/dev/null || bad_input "cannot write in the output folder $OUT (no $OUT/.lock)"
# A node of a multi-node run shares the output's lock with its sibling nodes (a whole-output run
# still excludes them all) and holds its own node's lock alone.
LOCK_MODE="-x"
[[ -n "$NODES" ]] && LOCK_MODE="-s"
if ! flock -n "$LOCK_MODE" 9; then
  echo "$PROG: another run holds the lock on $OUT ($OUT/.lock); not starting" >&2
  exit 3
fi
if [[ -n "$NODES" ]]; then
  exec 8>"$OUT/.lock-node-$NODE_RANK"
  if ! flock -n 8; then
    echo "$PROG: another run of node $NODE_RANK holds $OUT/.lock-node-$NODE_RANK; not starting" >&2
    exit 3
  fi
fi

RUN_ID="$(date +%Y%m%dT%H%M%S)-$$${NODES:+-node$NODE_RANK}"
# Outputs of one name in different folders (/a/out, /b/out) keep their logs apart: the folder's
# name for people, a hash of its absolute path to tell them apart.
OUT_ABS="$(cd "$OUT" && pwd -P)"
LOG_DIR="${LOG_ROOT:-$HOME_DIR/log}/$(basename "$OUT_ABS")-$(printf %s "$OUT_ABS" | sha1sum | cut -c1-8)/$RUN_ID"
made="$(mkdir -p "$LOG_DIR" 2>&1)" || bad_input "cannot create the log folder $LOG_DIR (${made##*: })"
# The first line of each log names its output and run, in the logs' own format (terminal filters drop it).
log_header() { echo "$(date '+%Y-%m-%d %H:%M:%S') $PROG INFO: output $OUT_ABS, run $RUN_ID, logs $LOG_DIR" >"$1"; }

# --- 3. MPS and the slots, stopping only what we started --------------------------------------
# The slots start before the plan is made: their workers load their models meanwhile, and read the
# plan once preprocess has written its exit code to PLAN_EXIT (the Ray driver's slots too).
# shellcheck source=run/mps.sh
source "$HERE/run/mps.sh"
SLOT_PIDS=()
MONITOR_PID="" PLAN_PID=""
PLAN_EXIT="$LOG_DIR/plan.exit"
DRIVER_PID=""
STOP_GRACE=15  # seconds a slot has to stop its workers (it gives them 10) before it is killed
cleanup() {
  stop_monitor
  [[ -n "$DRIVER_PID" ]] && wait "$DRIVER_PID" 2>/dev/null || true  # it may still be letting the cluster go
  mps_stop
}
stop_monitor() {  # the bars: a loop that ends only when told
  if [[ -n "$MONITOR_PID" ]]; then kill "$MONITOR_PID" 2>/dev/null || true; wait "$MONITOR_PID" 2>/dev/null || true; fi
  MONITOR_PID=""
}
# TERM to the slots (and the plan, if it is still being made), then wait for those alone, killing
# any still there after STOP_GRACE: a bare `wait` would wait for every child, the bars included.
stop_slots() {
  local pid pids=("${SLOT_PIDS[@]}" $PLAN_PID) deadline=$((SECONDS + STOP_GRACE))
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
on_signal() {
  trap - INT TERM
  echo "$PROG: $1 received; stopping this run's slots" >&2
  stop_monitor
  stop_slots
  echo "$PROG: stopped; what was spoken is kept: run the same command again to finish" >&2
  [[ "$1" == INT ]] && exit 130 || exit 143
}
trap cleanup EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

if [[ "$ENGINE" == ray ]]; then
  # The driver starts the slots (and each node's MPS daemon) on the cluster; it is this run's only child.
  DRIVER_EXIT="$LOG_DIR/driver.exit"
  RAY_ARGS=(--output-dir "$OUT" --address "${ADDRESS:-auto}" --slot-resource "${SLOT_RESOURCE:-GPU}" --mps "$MPS"
            --run-id "$RUN_ID" --log-dir "$LOG_DIR" --plan-ready "$PLAN_EXIT" --exit-file "$DRIVER_EXIT"
            --parent-pid $$ ${VERIFY[@]+"${VERIFY[@]}"} "${SETS[@]}")
  if [[ -t 1 ]]; then RAY_ARGS+=(--progress); fi
  log_header "$LOG_DIR/driver.log"
  "$PYTHON" -m convtts.cluster.ray_engine "${RAY_ARGS[@]}" 2>>"$LOG_DIR/driver.log" &
  DRIVER_PID=$!
  SLOT_PIDS+=("$DRIVER_PID")
else
  if [[ "${SLOT_DEVICES[0]}" != cpu ]]; then
    mps_start "$MPS" "$LOG_DIR/mps" "${SLOT_DEVICES[@]}"
    export CONVTTS_MPS_READY="$(date +%s.%N)"
  fi
  NODE_ARGS=()
  [[ -n "$NODES" ]] && NODE_ARGS=(--node-rank "$NODE_RANK" --nodes "$NODES")
  for ((rank = 0; rank < WORLD; rank++)); do
    device="${SLOT_DEVICES[$rank]}"
    if [[ "$device" == cpu ]]; then visible="" kind=cpu; else visible="$device" kind=cuda; fi
    log_header "$LOG_DIR/slot-$rank.log"
    mps_slot_env "$device"
    env ${MPS_SLOT_ENV[@]+"${MPS_SLOT_ENV[@]}"} CUDA_VISIBLE_DEVICES="$visible" "${SLOT[@]}" --output-dir "$OUT" --plan-ready "$PLAN_EXIT" "${SETS[@]}" \
      --rank "$rank" --world "$WORLD" --device "$kind" --run-id "$RUN_ID" --log-dir "$LOG_DIR" "${NODE_ARGS[@]}" \
      ${VERIFY[@]+"${VERIFY[@]}"} \
      --parent-pid $$ >>"$LOG_DIR/slot-$rank.log" 2>&1 &
    SLOT_PIDS+=($!)
  done
fi

# --- 4. plan: made when missing or stale ----------------------------------------------------
set +e
PLAN_STARTED="$(date +%s.%N)"
# Nodes starting together plan one at a time: the first makes the plan, the others find it fresh.
[[ -n "$NODES" ]] && exec 7>"$OUT/.lock-plan" && flock 7
log_header "$LOG_DIR/preprocess.log"
# In the background, waited for: a signal's trap then runs at once, not once the plan is made.
"${PLAN[@]}" --input "$INPUT" --output-dir "$OUT" $FORCE "${PRE_ARGS[@]}" >>"$LOG_DIR/preprocess.log" 2>&1 &
PLAN_PID=$!
wait "$PLAN_PID"
rc=$?
PLAN_PID=""
[[ -n "$NODES" ]] && exec 7>&-
echo "$rc $PLAN_STARTED $(date +%s.%N)" >"$PLAN_EXIT.tmp" && mv "$PLAN_EXIT.tmp" "$PLAN_EXIT"  # exit code, start, end
set -e
if [[ $rc -ne 0 ]]; then
  stop_slots  # they have written nothing: they were waiting for the plan
  if [[ $rc -ne $DISK_FULL_EXIT ]]; then
    grep -E '^error:' "$LOG_DIR/preprocess.log" >&2 || tail -n 20 "$LOG_DIR/preprocess.log" >&2
  fi
  if [[ -n "$CREATED_OUT" && -z "$NODES" ]]; then rm -f "$OUT/.lock"; rmdir "$OUT" 2>/dev/null || true; fi
  [[ $rc -eq $DISK_FULL_EXIT ]] && disk_full
  [[ $rc -eq 2 ]] && exit 2
  echo "$PROG: preprocessing failed unexpectedly (exit $rc); see $LOG_DIR/preprocess.log" >&2
  exit 1
fi
if [[ -t 1 ]]; then grep -v -E '^[0-9]{4}-' "$LOG_DIR/preprocess.log" || true; fi

# --- 5. the run ---------------------------------------------------------------------------
if [[ "$ENGINE" == ray ]]; then
  say "run $RUN_ID: slots on the Ray cluster at ${ADDRESS:-auto}; logs in $LOG_DIR (driver.log, slot-N.log)"
else
  say "run $RUN_ID: $(plural "$WORLD" slot) on ${GPUS}${NODES:+, node $NODE_RANK of $NODES}; logs in $LOG_DIR"
fi
if [[ -t 1 && "$ENGINE" == bash ]]; then
  # It holds no lock (7-9 closed): after a kill -9 of this run only the slots, which stop with it, do.
  "$PYTHON" -m convtts.run.progress "$OUT" --slots "$WORLD" --since "$STARTED" --parent-pid $$ 7>&- 8>&- 9>&- &
  MONITOR_PID=$!
fi

SLOT_FAILED=0 SLOT_DISK_FULL=0 INTERRUPTED=0
if [[ "$ENGINE" == ray ]]; then
  # Once every slot has ended the driver writes its exit code, then lets the cluster go (a second or
  # more); the merge runs meanwhile, and the driver is waited for before this run exits.
  while [[ ! -s "$DRIVER_EXIT" ]] && kill -0 "$DRIVER_PID" 2>/dev/null; do sleep 0.1; done
  rc=0
  if [[ -s "$DRIVER_EXIT" ]]; then rc="$(<"$DRIVER_EXIT")"; else wait "$DRIVER_PID" || rc=$?; fi
  if [[ $rc -eq 2 ]]; then  # no cluster, or no slot resource in it: its line says which
    grep -E '^error:' "$LOG_DIR/driver.log" >&2 || tail -n 5 "$LOG_DIR/driver.log" >&2
    exit 2
  elif [[ $rc -eq $DISK_FULL_EXIT ]]; then
    SLOT_DISK_FULL=1
  elif [[ $rc -ne 0 ]]; then
    SLOT_FAILED=1
    echo "$PROG: the Ray driver exited $rc; see $LOG_DIR/driver.log" >&2
  fi
  WORLD=0  # no slots of its own to wait for
fi
for ((rank = 0; rank < WORLD; rank++)); do
  rc=0
  wait "${SLOT_PIDS[$rank]}" || rc=$?
  if [[ $rc -eq $DISK_FULL_EXIT ]]; then
    SLOT_DISK_FULL=1  # its log names the file; the others stopped or will, on the same disk
  elif [[ $rc -eq 130 || $rc -eq 143 ]]; then
    INTERRUPTED=$rc  # the slot was stopped by INT or TERM (a terminal's Ctrl-C reaches the slots too)
  elif [[ $rc -ne 0 ]]; then
    SLOT_FAILED=1
    echo "$PROG: slot $rank (${SLOT_DEVICES[$rank]}) exited $rc; see $LOG_DIR/slot-$rank.log" >&2
  fi
done
if [[ -n "$MONITOR_PID" ]]; then stop_monitor; echo; fi
if [[ $INTERRUPTED -ne 0 ]]; then  # as on_signal ends, should the signal have reached the slots alone
  [[ $INTERRUPTED -eq 130 ]] && sig=INT || sig=TERM
  echo "$PROG: $sig received by the slots; stopped; what was spoken is kept: run the same command again to finish" >&2
  exit "$INTERRUPTED"
fi

# --- 6. merge and report ------------------------------------------------------------------
# No merge on a full disk: it would rewrite manifest.jsonl beside the work files and fail too.
[[ $SLOT_DISK_FULL -eq 1 ]] && disk_full
rc=0
# Sibling nodes merge one at a time; the last to finish writes outputs that hold every node's work.
[[ -n "$NODES" ]] && exec 7>"$OUT/.lock-merge" && flock 7
"$PYTHON" -m convtts.results.merge "$OUT" --run-id "$RUN_ID" --started "$STARTED" --log-dir "$LOG_DIR" || rc=$?
[[ $rc -eq $DISK_FULL_EXIT ]] && disk_full
if [[ -n "$NODES" && $rc -eq 1 && $SLOT_FAILED -eq 0 ]]; then
  echo "node $NODE_RANK of $NODES: its shards are all spoken; the outputs are whole once every node has finished"
  exit 0
fi
if [[ $rc -ne 0 || $SLOT_FAILED -ne 0 ]]; then
  echo "$PROG: not everything was spoken; see $OUT/failures.jsonl. Run the same command again to retry." >&2
  exit 1
fi
exit 0
