#!/usr/bin/env python3
"""What the import stand-ins save: a slot's forkserver import, in fresh processes, with and without each.

Each run is a new interpreter that does what a slot's forkserver does before its first worker can fork
(convtts.run.preload: torch, the worker module, the CosyVoice runtime, the modules the model's yaml
names), with the stand-ins of convtts.speak.cosyvoice.standins as shipped or with one of them left
out, and prints the seconds from its first import to the end of the preload, and the process's CPU
seconds (user and system), which other load on the machine changes less. The cases run in turns
(shipped, then each left out, then the next round); the figure to read is each case's median less
the shipped median.

    python3 bench/import_standins.py --version 1 --rounds 5 --out F.json
    COSYVOICE_ROOT=/path/to/CosyVoice python3 bench/import_standins.py --version 3

--model-dir names a model directory of that version (its yaml is all that is read); without it a
tiny random one is written to a temporary folder first (convtts.testing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# case: the parts of the stand-ins left out (none: as shipped)
CASES = {
    "shipped": (),
    # v1 only (v2/v3 import transformers anyway); transformers' model classes import torch._dynamo
    "no transformers stand-in": ("transformers", "dynamo"),
    "torch._dynamo not hidden": ("dynamo",),
    "no library stand-ins": ("libraries",),
    "no matcha.utils stand-in": ("matcha",),
    "none": ("transformers", "dynamo", "libraries", "matcha"),
}
# libraries whose presence after the preload says which stand-ins were in place
WATCHED = (
    "transformers.utils",
    "torch._dynamo",
    "sympy",
    "modelscope",
    "scipy.signal",
    "whisper.model",
    "librosa.filters",
    "numba",
    "scipy.io",
    "lightning",
    "matplotlib.pyplot",
)

CHILD = r"""
import contextlib, json, resource, sys, time
started = time.perf_counter()
left_out, wanted = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])
from convtts.speak.cosyvoice import matcha_utils, runtime, standins

@contextlib.contextmanager
def held_back(version):
    v1 = version == 1
    with standins.transformers_deferred(v1 and "transformers" not in left_out), \
         standins.dynamo_hidden(v1 and "dynamo" not in left_out), \
         (standins.kept_out() if "libraries" not in left_out else contextlib.nullcontext()):
        yield

runtime.held_back = held_back
if "matcha" in left_out:
    matcha_utils.install = lambda: False
from convtts.run.preload import preload
phases = preload(wanted)
total = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime  # the interpreter's own start included: the same in every case
real = [n for n in json.loads(sys.argv[3]) if type(sys.modules.get(n)).__name__ == "module"]
print(json.dumps({"total": total, "cpu": cpu, "phases": phases, "imported": real}))
"""


def one_run(left_out: tuple, wanted: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    args = [sys.executable, "-c", CHILD, json.dumps(left_out), json.dumps(wanted), json.dumps(WATCHED)]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the import failed ({left_out}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_dir(version: int, given: str | None, scratch: Path) -> str:
    if given:
        return given
    from convtts.testing.cosyvoice_model import build_model_dir

    root = os.environ.get("COSYVOICE_ROOT", "")
    return str(build_model_dir(scratch / f"v{version}", "tiny", version=version, runtime_root=root))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", type=int, default=1, choices=(1, 2, 3))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model-dir")
    p.add_argument("--out")
    args = p.parse_args()
    cases = {k: v for k, v in CASES.items() if args.version == 1 or not ({"transformers", "dynamo"} & set(v))}
    if args.version != 1:
        cases["none"] = ("libraries", "matcha")
    with tempfile.TemporaryDirectory() as scratch:
        model = model_dir(args.version, args.model_dir, Path(scratch))
        wanted = {
            "cosyvoice": True,
            "cosyvoice_root": os.environ.get("COSYVOICE_ROOT", ""),
            "version": args.version,
            "model_dir": model,
            "whisper": False,
        }
        one_run(cases["shipped"], wanted)  # untimed: the page cache warmed for every case alike
        runs: dict[str, list[dict]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, left_out in cases.items():
                runs[name].append(one_run(left_out, wanted))
    shipped = {k: statistics.median(r[k] for r in runs["shipped"]) for k in ("total", "cpu")}
    report = {
        "version": args.version,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "cases": {},
    }
    print(f"CosyVoice v{args.version}, a forkserver's import, {args.rounds} rounds: median seconds (min-max)")
    print(f"{'case':28s} {'wall':>18s} {'CPU':>18s}   saved by the stand-in: wall, CPU")
    for name, got in runs.items():
        figures = {}
        for key in ("total", "cpu"):
            values = sorted(r[key] for r in got)
            figures[key] = {"values": values, "median": statistics.median(values)}
        wall, cpu = figures["total"], figures["cpu"]
        saved = {k: figures[k]["median"] - shipped[k] for k in ("total", "cpu")}
        report["cases"][name] = {
            **figures,
            "saved": saved,
            "imported": got[-1]["imported"],
            "phases": got[-1]["phases"],
        }
        line = f"{name:28s} {wall['median']:6.2f} ({wall['values'][0]:.2f}-{wall['values'][-1]:.2f})"
        line += f" {cpu['median']:6.2f} ({cpu['values'][0]:.2f}-{cpu['values'][-1]:.2f})"
        if name != "shipped":
            line += f"   {saved['total']:+.2f}, {saved['cpu']:+.2f}"
        print(line)
    print(f"load average {report['load_average'][0]:.1f} on {report['cpus']} cores")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
