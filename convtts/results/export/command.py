"""Export a finished output directory for training: Hugging Face datasets, lhotse, WebDataset or NeMo.

Exit codes: 0 exported; 2 bad arguments or an output that cannot be exported (no manifest, a broken
row, a missing audio file); 3 another export is writing the destination; 4 the disk is full. A rerun
after a kill or a failure finishes the export without redoing the parts already written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from convtts import EXIT_DISK_FULL, EXIT_LOCKED, EXIT_OK
from convtts.cli import fail, setup_logging
from convtts.counts import plural
from convtts.results.export.formats import FORMATS, MissingLibrary
from convtts.results.export.runner import ExportLocked, ExportOptions, export
from convtts.results.export.source import SourceError
from convtts.state.layout import Layout
from convtts.state.shardio import disk_full_text, is_disk_full


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir", help="a run_all.sh output directory (manifest.jsonl, audio/, plan/)")
    parser.add_argument("--format", required=True, choices=list(FORMATS), help="what to write")
    parser.add_argument("--dest", help="where (default: OUTPUT_DIR/export/FORMAT)")
    parser.add_argument("--shard-rows", type=int, default=5000, help="most rows in one shard file (default 5000)")
    parser.add_argument(
        "--shard-mb",
        type=float,
        default=500.0,
        help="a shard file is closed once it holds this much audio, in MB (default 500)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    layout = Layout(args.output_dir)
    dest = Path(args.dest) if args.dest else layout.root / "export" / args.format
    try:
        options = ExportOptions(args.format, dest, args.shard_rows, args.shard_mb)
    except ValueError as exc:
        fail(str(exc))
    try:
        result = export(layout, options)
    except SourceError as exc:
        fail(f"cannot export {layout.root}: {exc}")
    except MissingLibrary as exc:
        fail(str(exc))
    except ExportLocked as exc:
        fail(str(exc), EXIT_LOCKED)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        fail(f"{disk_full_text(exc)}; free space and run the same command again", EXIT_DISK_FULL)
    rate = result.rows / result.seconds if result.seconds else 0.0
    print(
        f"exported {plural(result.rows, 'row')} to {dest} ({args.format}): {plural(result.files, 'file')}, "
        f"{plural(result.written_units, 'unit')} written, {result.skipped_units} already up to date; "
        f"{result.seconds:.1f} s, {rate:.0f} rows/s"
    )
    if result.not_spoken:
        print(
            f"note: {_not_spoken(result.not_spoken)} (see failures.jsonl) and not in the export; "
            "after run_all.sh speaks them, the same command exports them"
        )
    return EXIT_OK


def _not_spoken(count: int) -> str:
    if count == 1:
        return "1 segment of the output is failed or pending"
    return f"{count:,} segments of the output are failed or pending"


if __name__ == "__main__":
    sys.exit(main())
