#!/usr/bin/env python3
"""Variants of one setting side by side on one GPU: the same text through run_all.sh, each variant with its own --set
items.

Each variant is measured as bench/throughput.py measures a setting (audio seconds per second over a
timed window once every worker is up, GPU memory per worker, GPU and CPU busy), in its own output
directory. The report adds, from the variant's own rows and worker logs: what the quality gate
spent (quality.gate_seconds per utterance and per audio second, which takes got the ASR check, how
many were re-spoken, retried after an error or failed), the workers' out-of-memory events, which
voices spoke, and how many prompt registrations the workers made and how long they took (a voice
pool's cost); and each variant's throughput against the first's.
Figures go to OUT.json after every variant, so a run cut short keeps what it measured.

    python bench/compare_runs.py --model-dir /tmp/cv300m --setting 8:on:fp32:32 --seconds 60 \\
        --variant gate-off --variant gate-on validate.enabled=true validate.recogniser=hf-whisper \\
        validate.model_path=/tmp/whisper-turbo --out bench/results/gate
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import orjson

from throughput import (  # bench/ is this script's own folder on sys.path
    REPO,
    Setting,
    gpu_name,
    make_input,
    run_setting,
)

SHRUNK = re.compile(r"CUDA out of memory with \d+ utterances in flight; now (\d+) rows")  # run/batching.py
REGISTERED = re.compile(r"prompt features: (\d+) voices registered in ([0-9.]+) s, (\d+) reused")  # at each rebuild


def rows_of(out: Path) -> tuple[list[dict], list[dict]]:
    """Every row and failure the workers wrote (their own files: a run stopped by the window has no merge)."""

    def read(pattern: str) -> list[dict]:
        return [
            orjson.loads(line)
            for path in sorted((out / "work").glob(pattern))
            for line in path.read_bytes().splitlines()
            if line.strip()
        ]

    # takes refused after every re-speak count as failed whatever validate.on_fail made of them:
    # kept (a manifest row with audio) or dropped (a manifest row without)
    rows = read("*.manifest.jsonl")
    refused = [r for r in rows if r.get("status") in ("gate-refused-kept", "dropped")]
    failed = [f for f in read("*.failures.jsonl") if f.get("status") == "failed"]
    return [r for r in rows if r.get("status") != "dropped"], failed + refused


def gate_report(rows: list[dict], failures: list[dict]) -> dict | None:
    gated = [r for r in rows if r.get("quality")]
    if not gated:
        return None
    seconds = [r["quality"]["gate_seconds"] for r in gated if "gate_seconds" in r["quality"]]
    kinds: dict[str, int] = {}
    for r in gated:
        kinds[r["quality"].get("asr", "?")] = kinds.get(r["quality"].get("asr", "?"), 0) + 1
    audio = sum(r["duration"] for r in gated)
    by_check: dict[str, int] = {}
    for f in failures:
        check = f.get("check") or (f.get("refused") or {}).get("check") or "error"
        by_check[check] = by_check.get(check, 0) + 1
    return {
        "gated": len(gated),
        "asr": kinds,
        "respoken": sum(1 for r in gated if r.get("respeaks")),
        "retried": sum(1 for r in gated if r.get("attempts", 1) > 1),  # after an error: the recogniser's counts
        "failed": by_check,
        "gate_seconds_mean": round(statistics.fmean(seconds), 4) if seconds else None,
        "gate_seconds_p90": round(sorted(seconds)[int(0.9 * (len(seconds) - 1))], 4) if seconds else None,
        "gate_seconds_per_audio_second": round(sum(seconds) / audio, 4) if audio else None,
        "wer_mean": round(statistics.fmean([r["quality"]["wer"] for r in gated if "wer" in r["quality"]] or [0]), 3),
    }


def voice_report(rows: list[dict], logs: list[str]) -> dict:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.get("speaker")] = counts.get(r.get("speaker"), 0) + 1
    registered = [REGISTERED.search(line) for text in logs for line in text.splitlines()]
    registered = [m for m in registered if m]
    made, reused = sum(int(m.group(1)) for m in registered), sum(int(m.group(3)) for m in registered)
    seconds = sum(float(m.group(2)) for m in registered)
    # logged when a model closes (a rebuild): utterances spoken over those models = registrations + reuses
    return {
        "voices": len(counts),
        "rows_per_voice_max": max(counts.values(), default=0),
        "prompt_registrations": made,
        "prompt_reuses": reused,
        "prompt_seconds": round(seconds, 2),
        "prompt_seconds_per_utterance": round(seconds / max(1, made + reused), 4),
    }


def memory_events(logs: list[str]) -> dict:
    """Out-of-memory events the workers logged: each halves a worker's rows for the rest of its model
    (a run that fills the GPU can lose most of its rows this way without failing an utterance)."""
    shrunk = [int(m.group(1)) for text in logs for m in SHRUNK.finditer(text)]
    return {"out_of_memory": len(shrunk), "fewest_rows": min(shrunk, default=None)}


SETTING_ITEMS = ("workers", "batch")  # a variant's items without a dot change its setting, not its config


def run_variant(name: str, items: list[str], args, input_file: Path, work: Path) -> dict:
    """One variant: the call's setting, with a variant's `workers=N` or `batch=N` in its place (the
    gate on, 16 Whisper copies may not leave room for all of gate off's workers), and its --set items."""
    workers, mps, precision, *batch = args.setting.split(":")
    fields = {"workers": int(workers), "batch": int(batch[0]) if batch else 1}
    sets = []
    for item in items:
        key, _, value = item.partition("=")
        if key in SETTING_ITEMS:
            fields[key] = int(value)
        else:
            sets.append(item)
    setting = Setting(name, fields["workers"], mps, precision, fields["batch"])
    variant_args = argparse.Namespace(**{**vars(args), "set": [*args.set, *sets]})
    report = run_setting(setting, variant_args, input_file, work)
    rows, failures = rows_of(work / name)
    logs = [log.read_text(errors="replace") for log in (work / f"{name}-log").rglob("*.log")]  # read once, for both
    report.update(
        variant={"name": name, "sets": items},
        gate=gate_report(rows, failures),
        voices=voice_report(rows, logs),
        memory_events=memory_events(logs),
    )
    return report


def against(value, base) -> str:
    """A figure as a share of the first variant's, or - where either is missing."""
    return f"{value / base:.3f}" if value and base else "-"


def print_table(reports: list[dict]) -> None:
    first = reports[0].get("audio_seconds_per_second")
    first_steady = reports[0].get("steady_audio_seconds_per_second")
    first_whole = reports[0].get("whole_job_audio_seconds_per_second")
    print(
        "| variant | audio s/s | vs first | steady audio s/s (s) | vs first | whole job audio s/s | vs first | "
        "gate s/utt (mean, p90) | "
        "gate s per audio s | ASR checked | re-spoken (retried after an error) | failed | voices | "
        "prompt registrations (s/utt) | GPU MiB/worker | out of memory (fewest rows) | GPU busy | CPU busy | exit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in reports:
        rate, gate, voices, memory = r.get("audio_seconds_per_second"), r["gate"] or {}, r["voices"], r["memory"]
        events = r.get("memory_events") or {"out_of_memory": "-", "fewest_rows": "-"}
        steady = r.get("steady_audio_seconds_per_second")
        whole = r.get("whole_job_audio_seconds_per_second")
        per_worker = max((w["gpu_mb_max"] for w in memory["workers"].values()), default=None)
        checked = sum(n for kind, n in gate.get("asr", {}).items() if not kind.startswith(("skipped", "off")))
        print(
            f"| {r['variant']['name']} | {rate} | {against(rate, first)} | "
            f"{steady} ({r.get('steady_seconds')}) | {against(steady, first_steady)} | "
            f"{whole} | {against(whole, first_whole)} | "
            f"{gate.get('gate_seconds_mean')}, "
            f"{gate.get('gate_seconds_p90')} | "
            f"{gate.get('gate_seconds_per_audio_second')} | {checked}/{gate.get('gated', 0)} | "
            f"{gate.get('respoken')} ({gate.get('retried')}) | "
            f"{gate.get('failed')} | {voices['voices']} | {voices['prompt_registrations']} "
            f"({voices['prompt_seconds_per_utterance']}) | {per_worker} | "
            f"{events['out_of_memory']} ({events['fewest_rows']}) | {memory.get('gpu_busy_mean')} | "
            f"{memory['cpu_busy_mean']} | {r['exit_code']} |"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--config", default=str(REPO / "configs" / "cosyvoice.yaml"))
    p.add_argument("--text", default=str(REPO / "tests" / "data" / "llava_style.json"))
    p.add_argument("--gpu", default="0", help="the GPU's index (or cpu:N for a dry run)")
    p.add_argument(
        "--setting",
        default="8:on:fp32:32",
        help="workers:mps(on|off):precision(fp16|fp32)[:batch size], for every variant",
    )
    p.add_argument(
        "--variant",
        nargs="+",
        action="append",
        required=True,
        metavar="NAME [KEY=VALUE ...]",
        help="a name, then the --set items of this variant only (workers=N, batch=N: its own setting)",
    )
    p.add_argument("--utterances", type=int, default=6000)
    p.add_argument("--seconds", type=float, default=60, help="the timed window (0: run to the end)")
    p.add_argument("--max-words", type=int, default=10)
    p.add_argument("--rebuild-every", type=int, default=100)
    p.add_argument("--segments-per-shard", type=int, default=200)
    p.add_argument("--work", default="/tmp/convtts-compare")
    p.add_argument("--set", action="append", default=[], help="group.key=value for every variant")
    p.add_argument("--out", required=True, help="prefix of the .json result")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    input_file = work / "input.json"
    make_input(Path(args.text), args.utterances, args.max_words, input_file)
    reports = []
    for name, *sets in args.variant:
        reports.append(run_variant(name, sets, args, input_file, work))
        Path(f"{args.out}.json").write_bytes(
            orjson.dumps(
                {"gpu": gpu_name(args.gpu), "setting": args.setting, "common_sets": args.set, "reports": reports},
                option=orjson.OPT_INDENT_2,
            )
        )
    print_table(reports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
