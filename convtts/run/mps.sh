# NVIDIA MPS for run_all.sh: one control daemon per run, private pipe and log folders, stopped on
# every exit path. Never touches the GPU's compute mode or any other device setting.
# Sourced, not run. mps_start MODE DIR (MODE auto|on|off); mps_stop.

MPS_STARTED="" MPS_TEMP_PIPE=""

mps_start() {
  local mode="$1" dir="$2"
  [[ "$mode" == off ]] && return 0
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "run_all.sh: MPS unavailable (no nvidia-cuda-mps-control); running without it" >&2
    return 0
  fi
  # The pipe folder holds a unix socket, whose path must stay short (about 100 bytes).
  local pipe="$dir/pipe"
  if [[ ${#pipe} -gt 80 ]]; then pipe="$(mktemp -d /tmp/convtts-mps.XXXXXX)" MPS_TEMP_PIPE="$pipe"; fi
  mkdir -p "$pipe" "$dir/log"
  export CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$dir/log"
  # The daemon outlives a run killed with SIGKILL: it must not hold the output's locks (fds 7-9).
  if nvidia-cuda-mps-control -d 7>&- 8>&- 9>&- && mps_answers; then
    MPS_STARTED=1
    echo "MPS control daemon started (pipes $pipe, logs $dir/log)" >"$dir/status"
    return 0
  fi
  echo "run_all.sh: MPS control daemon did not start (see $dir/log); running without MPS" >&2
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  mps_forget_pipe
  [[ "$mode" == on ]] && echo "run_all.sh: --mps on was asked for; continuing without it" >&2
  return 0
}

mps_answers() {  # the daemon takes requests: asked every 0.05 s for up to 5 s (it is up in a fraction of one)
  local i
  for ((i = 0; i < 100; i++)); do
    echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  return 1
}

mps_stop() {
  if [[ -n "$MPS_STARTED" ]]; then
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    MPS_STARTED=""
  fi
  mps_forget_pipe
}

mps_forget_pipe() {  # the short pipe folder made in /tmp for a long log path: one per run, not left behind
  [[ -n "$MPS_TEMP_PIPE" ]] && rm -rf "$MPS_TEMP_PIPE"
  MPS_TEMP_PIPE=""
}
