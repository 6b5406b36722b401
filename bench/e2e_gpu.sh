#!/usr/bin/env bash
# End to end against steady state on a GPU machine, in one call: install the carried wheels (and
# Ray, when bench/fetch_ray.sh packed it), write the full-size random CosyVoice-300M-SFT, then run
# bench/e2e.py: the README's command on N real short-turn conversations, with its steady state and
# its start-up timeline. Figures (e2e.json, e2e.txt) and the slots' logs land in $OUT (else bench/results/e2e).
#
#   bash bench/e2e_gpu.sh                                      # one GPU: 300 conversations, run_all.sh
#   CONVERSATIONS=1000 ENGINES=both bash bench/e2e_gpu.sh      # several GPUs: run_all.sh, then --engine ray
#
# Knobs: CONVERSATIONS [300], ENGINES [bash | ray | both], RAY_CLUSTER [local: the Ray engine starts
# a cluster of this machine within the timed command; up: one is started first (ray start --head),
# settled and joined once, then joined with --address auto as on a cluster that is up, and stopped after], WHEELS [.whl], SETUP [1; 0 skips the
# install and the model on a machine already set up], WORK [/tmp/convtts-e2e-<engines>-<N>: must not exist],
# MODEL [/tmp/cv300m], GPUS [every GPU; cpu:N for a dry run on a CPU machine, with SETUP=0 and a tiny MODEL],
# PACK [0; 1 packs $OUT into $OUT.tgz, with every log of the run (worker logs too): a device call brings
# back only a few files, and four runs' unpacked figures and logs were more than it did on 2026-11-27],
# SETS [config overrides for the job, space-separated: SETS="tts.cosyvoice.batch_size_with_room=0"].
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/e2e}"
count="${CONVERSATIONS:-300}" engines="${ENGINES:-bash}" model="${MODEL:-/tmp/cv300m}"
work="${WORK:-/tmp/convtts-e2e-$engines-$count}"
mkdir -p "$out"
source bench/gpu_prepare.sh
rc=0
gpus=(); [[ -n "${GPUS:-}" ]] && gpus=(--gpus "$GPUS")
sets=(); for pair in ${SETS:-}; do sets+=(--set "$pair"); done
address=local
if [[ "${RAY_CLUSTER:-local}" == up ]]; then
  address=auto
  python3 -m ray.scripts.scripts start --head --include-dashboard=false --disable-usage-stats >"$out/ray-start.txt" 2>&1
  trap 'python3 -m ray.scripts.scripts stop >/dev/null 2>&1 || true' EXIT
  # A cluster that is up has settled and served a driver before: on two H200s the first driver to
  # join a new cluster took 1.75 s to connect, the next 0.07 s. That first driver also makes the
  # cluster start an idle Python worker per core (once in its life), which then import Ray: they are
  # given 5 s to do so (not done in the 2026-11-27 calls 3-4 of bench/results/h200x2-2026-11-27-ray-end, in git history).
  sleep 5
  python3 -c 'import ray; ray.init(address="auto", log_to_driver=False); ray.shutdown()' >>"$out/ray-start.txt" 2>&1
  sleep 5
fi
python3 bench/e2e.py --model-dir "$model" --conversations "$count" --engine "$engines" --work "$work" "${gpus[@]}" \
  --ray-address "$address" --out "$out/e2e-$engines-$count.json" "${sets[@]}" | tee "$out/e2e-$engines-$count.txt" || rc=$?
for log in "$work"/log-*/*/*/slot-?.log "$work"/log-*/*/*/driver.log; do  # start-up lines, hand-backs, rebuilds
  [[ -f "$log" ]] && cp "$log" "$out/$(basename "$(dirname "$(dirname "$(dirname "$log")")")")-$(basename "$log")"
done
if [[ "${PACK:-0}" == 1 ]]; then
  tar -czf "$out.tgz" "$out" "$work"/log-*/*/*/*.log 2>/dev/null && rm -rf "$out"
fi
exit $rc
