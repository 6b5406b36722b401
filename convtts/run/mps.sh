# NVIDIA MPS for run_all.sh: one control daemon per run (per-gpu: one per GPU, each serving that GPU's
# slot alone), private pipe and log folders, stopped on every exit path. Never touches the GPU's
# compute mode or any other device setting.
# Sourced, not run. mps_start MODE DIR [GPU...] (MODE auto|on|off|per-gpu; the GPUs for per-gpu);
# mps_slot_env GPU (sets MPS_SLOT_ENV: what a slot on GPU needs to reach its own daemon, for per-gpu); mps_stop.

MPS_PIPES=()       # the pipe folder of each daemon this run started
MPS_TEMP_PIPES=()  # of those, the short ones made in /tmp
MPS_SLOT_ENV=()
declare -A MPS_GPU_PIPE=() MPS_GPU_LOG=()  # per-gpu: each GPU's daemon's folders

mps_start() {
  local mode="$1" dir="$2" gpu
  shift 2
  [[ "$mode" == off ]] && return 0
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "run_all.sh: MPS unavailable (no nvidia-cuda-mps-control); running without it" >&2
    return 0
  fi
  if [[ "$mode" != per-gpu ]]; then
    if mps_daemon "$dir/pipe" "$dir/log" ""; then
      export CUDA_MPS_PIPE_DIRECTORY="${MPS_PIPES[0]}" CUDA_MPS_LOG_DIRECTORY="$dir/log"
      echo "MPS control daemon started (pipes ${MPS_PIPES[0]}, logs $dir/log)" >"$dir/status"
      return 0
    fi
    mps_not_started "$mode" "$dir/log"
    return 0
  fi
  for gpu in "$@"; do
    if ! mps_daemon "$dir/pipe-$gpu" "$dir/log-$gpu" "$gpu"; then
      mps_not_started "$mode" "$dir/log-$gpu"  # and the GPUs' daemons started so far stopped: all or none
      return 0
    fi
    MPS_GPU_PIPE[$gpu]="${MPS_PIPES[-1]}" MPS_GPU_LOG[$gpu]="$dir/log-$gpu"
    echo "MPS control daemon of GPU $gpu started (pipes ${MPS_PIPES[-1]}, logs $dir/log-$gpu)" >>"$dir/status"
  done
}

# One daemon with its pipe folder (a short one in /tmp where the path is long) and log folder,
# seeing only GPU `visible` where one is given. True once it answers.
mps_daemon() {
  local pipe="$1" log="$2" visible="$3"
  # The pipe folder holds a unix socket, whose path must stay short (about 100 bytes).
  if [[ ${#pipe} -gt 80 ]]; then pipe="$(mktemp -d /tmp/convtts-mps.XXXXXX)" MPS_TEMP_PIPES+=("$pipe"); fi
  mkdir -p "$pipe" "$log"
  # The daemon outlives a run killed with SIGKILL: it must not hold the output's locks (fds 7-9).
  if (
    export CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$log"
    [[ -n "$visible" ]] && export CUDA_VISIBLE_DEVICES="$visible"
    nvidia-cuda-mps-control -d 7>&- 8>&- 9>&- && mps_answers
  ); then
    MPS_PIPES+=("$pipe")
    return 0
  fi
  return 1
}

# A daemon that did not start: said, and every daemon this run started stopped (each told to quit
# through its pipe folder before the short ones in /tmp are removed).
mps_not_started() {
  echo "run_all.sh: MPS control daemon did not start (see $2); running without MPS" >&2
  [[ "$1" == on || "$1" == per-gpu ]] && echo "run_all.sh: --mps $1 was asked for; continuing without it" >&2
  mps_stop
}

mps_answers() {  # the daemon takes requests: asked every 0.05 s for up to 5 s (it is up in a fraction of one)
  local i
  for ((i = 0; i < 100; i++)); do
    echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}

# MPS_SLOT_ENV: the assignments a slot on GPU $1 is started with (none unless each GPU has its daemon).
mps_slot_env() {
  MPS_SLOT_ENV=()
  if [[ -n "${MPS_GPU_PIPE[$1]:-}" ]]; then
    MPS_SLOT_ENV=("CUDA_MPS_PIPE_DIRECTORY=${MPS_GPU_PIPE[$1]}" "CUDA_MPS_LOG_DIRECTORY=${MPS_GPU_LOG[$1]}")
  fi
}

mps_stop() {
  local pipe
  if ((${#MPS_PIPES[@]})); then
    for pipe in "${MPS_PIPES[@]}"; do
      echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" nvidia-cuda-mps-control >/dev/null 2>&1 || true
    done
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY  # what this run exported for its own daemon
  fi
  MPS_PIPES=()
  MPS_GPU_PIPE=() MPS_GPU_LOG=()
  mps_forget_pipes
}

mps_forget_pipes() {  # the short pipe folders made in /tmp for a long log path: one per daemon, not left behind
  local pipe
  for pipe in ${MPS_TEMP_PIPES[@]+"${MPS_TEMP_PIPES[@]}"}; do rm -rf "$pipe"; done
  MPS_TEMP_PIPES=()
}
