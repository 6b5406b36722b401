#!/usr/bin/env bash
# What a worker's CUDA context costs with no MPS, under MPS with the server started by the first
# client (as run_all.sh has it), and under MPS with the server started ahead by a client that only
# initialises CUDA on every device and leaves (a warm-up tried on 2026-11-27, not kept: it saved
# 0.27 s a context here and nothing measurable end to end). N processes (default 8) that have
# imported torch make their contexts at the same moment, as a slot's forked workers do. Prints one
# line a case (each process's seconds) and whether the server outlived the warm-up client.
#   bash bench/mps_warm.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-8}" root="$(mktemp -d /tmp/mps-warm.XXXXXX)"
source convtts/run/mps.sh

contexts() {  # N processes import torch, wait for a common moment, then make their context
  local at=$(($(date +%s) + 6)) i
  for ((i = 0; i < n; i++)); do
    python3 -c "
import time, torch
while time.time() < $at: time.sleep(0.005)
started = time.perf_counter()
torch.zeros(1, device='cuda')
torch.cuda.synchronize()
print(f'{time.perf_counter() - started:.2f}')" >"$root/ctx-$i" &
  done
  wait
  echo "$1: $(cat "$root"/ctx-* | sort -n | tr '\n' ' ')"
}

WARM_CLIENT='
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
count, context = ctypes.c_int(0), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0, "CUDA did not initialise"
for device in range(count.value):
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    cuda.cuDevicePrimaryCtxRelease(device)
print(f"server started for {count.value} devices")
'

servers() { echo get_server_list | nvidia-cuda-mps-control 2>/dev/null | wc -l; }

contexts "no MPS"

export CUDA_MPS_PIPE_DIRECTORY="$root/cold/pipe" CUDA_MPS_LOG_DIRECTORY="$root/cold/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && mps_answers && MPS_STARTED=1
contexts "MPS, server started by the first worker"
mps_stop

mps_start on "$root/warm"
started=$SECONDS
python3 -c "$WARM_CLIENT"
echo "warm-up client: $((SECONDS - started)) s; servers after it left: $(servers)"
contexts "MPS, server started ahead by the warm-up client"
mps_stop
rm -rf "$root"
