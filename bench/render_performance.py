#!/usr/bin/env python3
"""Render the first table of docs/PERFORMANCE.md from bench/results/results.csv.

Each row of the CSV is one measured end-to-end job. The table keeps, for each GPU kind, model
version, text and engine, the latest job that ran the shipped settings of its day; the commands
are listed under it by letter. The page holds the rendering between two marker lines, so a
figure edited there by hand reads as out of date (`--check`, which tests/test_performance_page.py
runs).

    python3 bench/render_performance.py            # rewrite the table in docs/PERFORMANCE.md
    python3 bench/render_performance.py --check    # exit 1 if the page's table is not the CSV's
"""

from __future__ import annotations

import argparse
import csv
import string
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CSV = REPO / "bench" / "results" / "results.csv"
PAGE = REPO / "docs" / "PERFORMANCE.md"
BEGIN = "<!-- rendered from bench/results/results.csv by bench/render_performance.py: edit the CSV -->"
END = "<!-- end of the rendered table -->"
HEADER = (
    "| GPU | model | text | job: conversations (rows, audio s) | end to end, audio s/s (wall s) "
    "| steady state | settings | date | commit | command |"
)


def read_jobs(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def latest_shipped(jobs: list[dict]) -> list[dict]:
    """The latest shipped-settings job of each GPU, model, text and engine (a later line wins a tie)."""
    chosen: dict[tuple, dict] = {}
    for job in jobs:
        if job["shipped"] != "yes":
            continue
        key = (job["gpu"], job["model"], job["text"], job["engine"])
        if key not in chosen or job["date"] >= chosen[key]["date"]:
            chosen[key] = job
    return sorted(chosen.values(), key=order)


def order(job: dict) -> tuple:
    """One GPU before several, the newest first, run_all.sh before Ray."""
    gpus = int(job["gpu"].split(" x ")[0]) if " x " in job["gpu"] else 1
    newest_first = tuple(-int(part) for part in job["date"].split("-"))
    return (gpus, newest_first, job["gpu"], job["model"], job["text"], job["engine"] != "run_all.sh")


def tenths(value: str) -> str:
    """One decimal, halves rounded up as the notes print them (253.95 is 254.0, not float's 253.9)."""
    return str(Decimal(value).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def thousands(value: str) -> str:
    return f"{float(value):,.0f}" if value else ""


def job_cell(job: dict) -> str:
    size = thousands(job["conversations"])
    detail = ", ".join(f"{thousands(job[k])}{unit}" for k, unit in (("rows", " rows"), ("audio_s", " s")) if job[k])
    return f"{size} ({detail})" if detail else size


def figure_cell(job: dict) -> str:
    wall = f" ({tenths(job['wall_s'])})" if job["wall_s"] else ""
    return f"**{tenths(job['audio_s_per_s'])}**{wall}"


def settings_cell(job: dict) -> str:
    parts = [job["settings"]] + ([job["note"]] if job["note"] else [])
    return "; ".join(parts)


def gpu_cell(job: dict) -> str:
    return job["gpu"] if job["engine"] == "run_all.sh" else f"{job['gpu']}, {job['engine']}"


def render(jobs: list[dict]) -> str:
    shown = latest_shipped(jobs)
    letters = command_letters(shown)
    lines = [BEGIN, HEADER, "|" + "---|" * 10]
    for job in shown:
        cells = [
            gpu_cell(job),
            job["model"],
            job["text"],
            job_cell(job),
            figure_cell(job),
            tenths(job["steady_audio_s_per_s"]) if job["steady_audio_s_per_s"] else "",
            settings_cell(job),
            job["date"],
            job["commit"],
            letters[job["command"]],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for command, letter in letters.items():
        lines.append(f"- {letter}: `{command}`")
    lines.append("")
    lines.append(
        f"{len(shown)} of the {len(jobs)} jobs in `bench/results/results.csv` (the others: earlier jobs and "
        "settings that are not shipped); each job's notes and summary JSON in `bench/results/<folder>/`, "
        "the CSV's `folder` column."
    )
    lines.append(END)
    return "\n".join(lines)


def command_letters(jobs: list[dict]) -> dict[str, str]:
    letters: dict[str, str] = {}
    for job in jobs:
        letters.setdefault(job["command"], string.ascii_uppercase[len(letters)])
    return letters


def with_table(page: str, table: str) -> str:
    if BEGIN not in page or END not in page:
        raise SystemExit(f"the page has no rendered table: put the lines {BEGIN!r} and {END!r} where it goes")
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + table + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table is not the CSV's")
    args = parser.parse_args(argv)
    page = args.page.read_text(encoding="utf-8")
    rendered = with_table(page, render(read_jobs(args.csv)))
    if args.check:
        if rendered != page:
            print(
                f"{args.page}: the table differs from {args.csv}; run python3 bench/render_performance.py",
                file=sys.stderr,
            )
            return 1
        return 0
    args.page.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
