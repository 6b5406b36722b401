#!/usr/bin/env bash
# One GPU machine, both engines on the same input: run_all.sh (one slot per GPU, shards[rank::world])
# and run_all.sh --engine ray (a Ray instance of this machine only, one slot per GPU, shards handed
# out as slots ask). Writes both throughputs (audio seconds per second of wall time) to RESULTS.
#
# usage: bench/ray_gpu.sh INPUT RESULTS.json [run_all.sh options, e.g. --config configs/cosyvoice.yaml
#                         --set tts.cosyvoice.model_dir=/models/CosyVoice-300M-SFT --count 200]
# Needs nvidia-smi and Ray in $PYTHON's environment (pip install 'ray==2.60.0').
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
INPUT="${1:?usage: bench/ray_gpu.sh INPUT RESULTS.json [run_all.sh options]}"
RESULTS="${2:?usage: bench/ray_gpu.sh INPUT RESULTS.json [run_all.sh options]}"
shift 2
export PYTHON="${PYTHON:-python3}"
"$PYTHON" -c "import ray" 2>/dev/null || { echo "bench/ray_gpu.sh: $PYTHON has no ray (pip install 'ray==2.60.0')" >&2; exit 2; }
GPUS="$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)"
[[ "$GPUS" -ge 1 ]] || { echo "bench/ray_gpu.sh: nvidia-smi lists no GPU" >&2; exit 2; }
WORK="${BENCH_WORK:-$(mktemp -d /tmp/convtts-ray-bench.XXXXXX)}"
echo "bench/ray_gpu.sh: $GPUS GPUs; outputs and logs in $WORK" >&2

# Each engine gets a fresh output directory: both speak everything the plan holds.
"$HERE/run_all.sh" --input "$INPUT" --output-dir "$WORK/bash" --log-dir "$WORK/log" "$@"
"$HERE/run_all.sh" --engine ray --address local --input "$INPUT" --output-dir "$WORK/ray" --log-dir "$WORK/log" "$@"

"$PYTHON" - "$WORK" "$RESULTS" "$GPUS" "bench/ray_gpu.sh $INPUT $RESULTS $*" <<'PY'
import json, platform, subprocess, sys, time
work, results, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
def figures(name):
    summary = json.load(open(f"{work}/{name}/summary.json"))
    run = summary["this_run"]
    return {"complete": summary["complete"], "utterances": run["utterances"], "audio_seconds": run["audio_seconds"],
            "wall_seconds": run["wall_seconds"], "audio_seconds_per_second": run["audio_seconds_per_second"]}
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout
out = {"machine": {"host": platform.node(), "gpus": gpus, "gpu": gpu.strip().splitlines()[0]},
       "command": sys.argv[4], "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "bash_engine": figures("bash"), "ray_engine": figures("ray")}
json.dump(out, open(results, "w"), indent=2)
print(json.dumps(out, indent=2))
PY
