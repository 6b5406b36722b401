# Sourced by the GPU bench scripts once $out and $model are set: the machine's GPUs and cores into
# $out/machine.txt, then the carried wheels installed and the full-size random model written
# (bench/gpu_setup.sh), unless SETUP=0 says the machine is set up already. WHEELS [.whl].
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; nproc; } | tee "$out/machine.txt"
if [[ "${SETUP:-1}" != 0 ]]; then
  started=$SECONDS
  MODEL_SIZE=full bash bench/gpu_setup.sh "${WHEELS:-.whl}" "$model"
  echo "setup done in $((SECONDS - started)) s"
fi
