#!/usr/bin/env bash
# The README's GPU command as a new user types it, on N conversations (default 100) of the
# repository's sample text, with every setting at its default: wall time and the run's summary.
#   bash bench/readme_run.sh MODEL_DIR OUT_DIR [N]
set -euo pipefail
cd "$(dirname "$0")/.."
model="$1" out="$2" count="${3:-100}"
input="$(mktemp --suffix=.json)"
python3 - "$count" "$input" <<'PY'
import sys, orjson
sys.path.insert(0, "bench")
from sample_text import DEFAULT_TEXT, read_conversations
records, source = [], read_conversations(DEFAULT_TEXT)
while len(records) < int(sys.argv[1]):
    record = source[len(records) % len(source)]
    records.append({**record, "id": f"{record['id']}-{len(records) // len(source)}"})
open(sys.argv[2], "wb").write(orjson.dumps(records))
PY
started=$SECONDS
rc=0
./run_all.sh --config configs/cosyvoice.yaml --input "$input" --output-dir "$out" --set "tts.cosyvoice.model_dir=$model" || rc=$?
echo "exit $rc after $((SECONDS - started)) s for $count conversations"
cat "$out/summary.json"
