"""docs/PERFORMANCE.md's first table is bench/render_performance.py's rendering of bench/results/results.csv:
a figure edited by hand on the page, or a job added to the CSV and not rendered, fails here."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "render_performance.py"
CSV = REPO / "bench" / "results" / "results.csv"
PAGE = REPO / "docs" / "PERFORMANCE.md"
PAGE_MOST_LINES = 250


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO)


def test_the_page_holds_the_csvs_rendering():
    checked = render("--check")
    assert checked.returncode == 0, checked.stderr + "\nrun: python3 bench/render_performance.py"


def test_the_page_stays_short():
    assert len(PAGE.read_text(encoding="utf-8").splitlines()) <= PAGE_MOST_LINES


def test_a_figure_edited_on_the_page_reads_as_out_of_date(tmp_path):
    page = tmp_path / "PERFORMANCE.md"
    newest = max(reversed(shipped_jobs()), key=lambda job: job["date"])  # a later line wins a tie, as rendered
    figure = f"**{Decimal(newest['audio_s_per_s']).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)}**"
    text = PAGE.read_text(encoding="utf-8")
    assert figure in text, f"the newest shipped job's figure {figure} is not on the page"
    page.write_text(text.replace(figure, "**999.9**", 1), encoding="utf-8")
    checked = render("--check", "--page", str(page))
    assert checked.returncode == 1 and "differs" in checked.stderr


def test_a_newer_job_in_the_csv_takes_its_row(tmp_path):
    jobs, page = tmp_path / "results.csv", tmp_path / "PERFORMANCE.md"
    shutil.copy(CSV, jobs)
    shutil.copy(PAGE, page)
    older = next(job for job in shipped_jobs() if job["gpu"] == "H200" and job["model"] == "v2")
    newer = dict(older, date="2099-01-01", audio_s_per_s="123.45", commit="abc1234")
    with jobs.open("a", newline="", encoding="utf-8") as f:
        csv.DictWriter(f, fieldnames=list(older)).writerow(newer)
    assert render("--check", "--csv", str(jobs), "--page", str(page)).returncode == 1
    assert render("--csv", str(jobs), "--page", str(page)).returncode == 0
    rendered = page.read_text(encoding="utf-8")
    row = next(line for line in rendered.splitlines() if "2099-01-01" in line)
    assert "**123.5**" in row and "abc1234" in row and f"| {older['text']} |" in row
    assert rendered.count(f"| H200 | v2 | {older['text']} |") == 1, "the older job of that key is still shown"
    assert render("--check", "--csv", str(jobs), "--page", str(page)).returncode == 0


def shipped_jobs() -> list[dict]:
    with CSV.open(newline="", encoding="utf-8") as f:
        return [job for job in csv.DictReader(f) if job["shipped"] == "yes"]
