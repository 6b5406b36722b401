#!/usr/bin/env bash
# Node orchestrator: plan (if needed), one parallel_cosyvoice.py per GPU (or CPU slot), wait, merge.
# The steps live in the package (convtts/node.sh, also run by `python -m convtts`); this wrapper
# picks the checkout's Python, its entry scripts, and keeps output/ and log/ in it. See --help.
# Exit codes: 0 all done; 1 some utterances failed or unfinished, or the disk filled (rerun
#             retries them); 2 bad input or config (nothing started); 3 another run holds the lock;
#             130 / 143 stopped by SIGINT (Ctrl-C) / SIGTERM (rerun finishes the work).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
export CONVTTS_HOME="${CONVTTS_HOME:-$HERE}"
export CONVTTS_PROG="$(basename "$0")"  # names this command in --help and in its messages
export CONVTTS_PLAN_SCRIPT="$HERE/preprocess.py" CONVTTS_SLOT_SCRIPT="$HERE/parallel_cosyvoice.py"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's package, whatever is installed
exec "$PYTHON" -m convtts.node "$@"
