#!/usr/bin/env python3
"""The steady state as the cost of more work: jobs of several sizes from one call (bench/e2e.py's JSON files), their
wall times fitted as a fixed part plus audio over a rate.

The busy-window figure of bench/e2e.py (audio finished while every worker was busy) reads high on a job whose
ids go out longest first: the window opens when the first, longest rows finish, work the GPU did before it
opened, and closes with short rows in flight. The slope of wall time against audio has no window to choose:
it is what one more audio second costs once the job is running, and its intercept is what any job pays
(start-up, and the tail beyond the last full batch).

    python3 bench/marginal.py $OUT/shipped-300-1.json $OUT/shipped-1000-1.json $OUT/shipped-2000-1.json
    python3 bench/marginal.py --out fit.json FILE...

Each engine's runs are fitted on their own; jobs that did not exit 0 are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def jobs(paths: list[Path]) -> dict[str, list[dict]]:
    """The runs of the files by engine: audio seconds, wall seconds, the busy-window rate, conversations."""
    found: dict[str, list[dict]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for run in data.get("runs", []):
            if run.get("exit_code") != 0 or not run.get("audio_seconds"):
                continue
            found.setdefault(run["engine"], []).append(
                {
                    "file": path.name,
                    "conversations": data.get("conversations"),
                    "audio": float(run["audio_seconds"]),
                    "wall": float(run["wall_seconds"]),
                    "window": (run.get("steady_state") or {}).get("audio_s_per_s"),
                    "trimmed": run.get("steady_state_trimmed_audio_s_per_s"),
                }
            )
    return found


def fit(runs: list[dict]) -> dict | None:
    """Least squares of wall = fixed + audio / rate; None with fewer than two sizes of job."""
    if len({r["audio"] for r in runs}) < 2:
        return None
    n = len(runs)
    mean_a = sum(r["audio"] for r in runs) / n
    mean_w = sum(r["wall"] for r in runs) / n
    spread = sum((r["audio"] - mean_a) ** 2 for r in runs)
    slope = sum((r["audio"] - mean_a) * (r["wall"] - mean_w) for r in runs) / spread
    if slope <= 0:
        return None  # more audio took no longer: the jobs are too close in size for their noise
    fixed = mean_w - slope * mean_a
    return {"rate": round(1.0 / slope, 1), "fixed_seconds": round(fixed, 1), "jobs": n}


def report(engine: str, runs: list[dict], line: dict | None) -> list[str]:
    if line is None:
        return [f"{engine}: fewer than two sizes of job that exited 0; no fit"]
    out = [
        f"{engine}: steady state {line['rate']} audio s/s as the slope of wall time over audio, "
        f"fixed part {line['fixed_seconds']} s ({line['jobs']} jobs)"
    ]
    for r in sorted(runs, key=lambda r: r["audio"]):
        e2e = r["audio"] / r["wall"]
        out.append(
            f"  {r['conversations']} conversations ({r['file']}): end to end {e2e:.1f} = {e2e / line['rate']:.0%} "
            f"of it; the job's busy-window figure {r['window']} (trimmed {r['trimmed']})"
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, help="write the fits as JSON")
    args = p.parse_args()
    fits = {}
    for engine, runs in jobs(args.files).items():
        fits[engine] = {"fit": fit(runs), "runs": runs}
        print("\n".join(report(engine, runs, fits[engine]["fit"])))
    if args.out:
        args.out.write_text(json.dumps(fits, indent=2))
    return 0 if fits and all(f["fit"] for f in fits.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
