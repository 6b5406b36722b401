#!/usr/bin/env python3
"""GPU throughput benchmark: run the real pipeline (run_all.sh) under several settings on one GPU.

Each setting speaks the same realistic English into a fresh output directory and is measured from
its own manifest: audio seconds per wall second in the steady state (first and last 10% of
utterances by finish time left out, so model loading and the tail do not count), utterances per
hour, per-worker GPU memory over time (torch's figure, recorded on every manifest row, and
nvidia-smi's whole-GPU figure, sampled), CPU use, and rebuild cost from the slot log.

    python bench/throughput.py --model-dir /tmp/cv300m --settings seed:8:off:fp32 best:14:on:fp16 \
        --sweep 1,4,8,14 --utterances 300 --out bench/results/h100
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from sample_text import DEFAULT_TEXT, read_conversations, words  # bench/ is this script's own folder on sys.path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Setting:
    name: str
    workers: int
    mps: str  # on | off
    precision: str  # fp16 | fp32: upstream's fp16 flag (the one-at-a-time path)
    batch: int = 1  # tts.cosyvoice.batch_size: utterances each worker decodes at once
    overrides: tuple[str, ...] = ()  # this setting's own group.key=value items

    @classmethod
    def parse(cls, spec: str) -> Setting:
        """name:workers:mps:precision[:batch[:key=value,key=value...]]"""
        name, workers, mps, precision, *rest = spec.split(":")
        batch = int(rest[0]) if rest else 1
        overrides = tuple(item for item in ":".join(rest[1:]).split(",") if item)
        return cls(name, int(workers), mps, precision, batch, overrides)


def make_input(text_file: Path, utterances: int, max_words: int, path: Path) -> None:
    """The conversations of `text_file`, repeated under new ids until about `utterances` segments."""
    source = read_conversations(text_file)
    if not sum(map(words, source)):
        raise SystemExit(f"{text_file}: no turn has any text to speak")
    records, total = [], 0
    budget = utterances * max_words * 0.75  # segments come out at about three quarters full
    copy = 0
    while total < budget:
        for number, record in enumerate(source):
            records.append({**record, "id": f"{record.get('id', number)}-{copy}"})
            total += words(record)
            if total >= budget:
                break
        copy += 1
    path.write_bytes(orjson.dumps(records))


class Sampler(threading.Thread):
    """Samples whole-GPU memory (nvidia-smi) and CPU use (/proc/stat) once a second."""

    def __init__(self, gpu: str):
        super().__init__(daemon=True)
        self.gpu, self.samples, self.stop_flag = gpu, [], threading.Event()

    def run(self) -> None:
        last = _cpu_times()
        while not self.stop_flag.wait(1.0):
            now = _cpu_times()
            busy = 1 - (now[1] - last[1]) / max(now[0] - last[0], 1)
            last = now
            used, util = _gpu_state(self.gpu)
            self.samples.append({"t": time.time(), "gpu_used_mb": used, "gpu_busy": util, "cpu_busy": round(busy, 3)})


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


def _gpu_state(gpu: str) -> tuple[int | None, float | None]:
    """Whole-GPU memory used (MiB) and the share of the last sample period a kernel ran (0-1)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={gpu}", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        used, util = (x.strip() for x in out.strip().split(","))
        return int(used), int(util) / 100
    except (OSError, ValueError, subprocess.SubprocessError):
        return None, None


def run_setting(setting: Setting, args, input_file: Path, work: Path) -> dict:
    out, logs = work / setting.name, work / f"{setting.name}-log"
    for scratch in (out, logs):  # a run again on the same machine starts afresh, not as a resume of the last
        shutil.rmtree(scratch, ignore_errors=True)
    cmd = [
        "bash",
        str(REPO / "run_all.sh"),
        "--input",
        str(input_file),
        "--output-dir",
        str(out),
        "--config",
        str(args.config),
        "--gpus",
        args.gpu,
        "--workers",
        str(setting.workers),
        "--mps",
        setting.mps,
        "--log-dir",
        str(logs),
        "--set",
        f"tts.cosyvoice.model_dir={args.model_dir}",
        "--set",
        f"tts.cosyvoice.fp16={'true' if setting.precision == 'fp16' else 'false'}",
        "--set",
        f"tts.cosyvoice.batch_size={setting.batch}",
        "--set",
        f"text.max_words={args.max_words}",
        "--set",
        f"workers.rebuild_every={args.rebuild_every}",
        "--set",
        f"shards.segments_per_shard={args.segments_per_shard}",
    ]
    for item in [*args.set, *setting.overrides]:
        cmd += ["--set", item]
    sampler = Sampler(args.gpu)
    sampler.start()
    started = time.time()
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    window = timed_window(run, logs, setting.workers, args.seconds) if args.seconds else None
    stdout, stderr = run.communicate()
    wall = time.time() - started
    sampler.stop_flag.set()
    sampler.join()
    rows = (
        [orjson.loads(x) for x in (out / "manifest.jsonl").read_bytes().splitlines()]
        if (out / "manifest.jsonl").exists()
        else []
    )
    if window:  # the run was stopped: measure its work files, which hold every finished row
        rows = [
            orjson.loads(x)
            for p in (out / "work").glob("*.manifest.jsonl")
            for x in p.read_bytes().splitlines()
            if x.strip()
        ]
    if window:
        rate = windowed(rows, *window)
    else:  # a job that failed is no whole job: its figure would count whatever an earlier run left behind
        rate = {**steady_state(rows), **whole_job(rows if run.returncode == 0 else [], wall)}
    report = {
        "setting": asdict(setting),
        "exit_code": run.returncode,
        "wall_seconds": round(wall, 2),
        **rate,
        "memory": memory_report(rows, sampler.samples),
        "rebuilds": rebuild_report(logs),
        "stderr_tail": stderr[-2000:],
    }
    print(f"{setting.name}: {report.get('audio_seconds_per_second')} audio s/s, exit {run.returncode}", flush=True)
    return report


START_GRACE = 150.0  # seconds: past this the window opens once any worker is up, so it always closes


def timed_window(run: subprocess.Popen, logs: Path, workers: int, seconds: float) -> tuple[float, float] | None:
    """Wait until every worker has built its model, let the run go `seconds`, then stop it (SIGTERM)."""
    t0, launched = None, time.time()
    while run.poll() is None:
        built = sum(log.read_text().count("model built (start)") for log in slot_logs(logs))
        if t0 is None and (built >= workers or (built and time.time() - launched > START_GRACE)):
            t0 = time.time()
        if t0 is not None and time.time() - t0 >= seconds:
            t1 = time.time()
            os.killpg(run.pid, signal.SIGTERM)
            return t0, t1
        time.sleep(0.5)
    return None  # it finished first: fall back to the trimmed steady state


def windowed(rows: list[dict], t0: float, t1: float) -> dict:
    """Audio finished between t0 and t1 (all workers up) per second of that window; and the same from
    the moment every worker had written its first row (steady)."""
    inside = [r for r in rows if t0 <= r["finished"] <= t1]
    audio = sum(r["duration"] for r in inside)
    rate = audio / (t1 - t0)
    return {
        "utterances": len(rows),
        "window_seconds": round(t1 - t0, 1),
        "window_utterances": len(inside),
        "audio_seconds_per_second": round(rate, 3) if rate else None,
        "real_time_factor": round(1 / rate, 4) if rate else None,
        "utterances_per_hour": round(len(inside) / (t1 - t0) * 3600),
        "mean_utterance_seconds": round(audio / len(inside), 2) if inside else None,
        **steady_window(inside, t1),
    }


MIN_STEADY_SECONDS = 10.0


def steady_window(inside: list[dict], t1: float) -> dict:
    """Audio per second after every worker's first write (each worker's row field), up to t1.

    A worker that holds finished takes and writes them together (the quality gate judges a batch at
    a time: a packed batch is about 150 takes) writes nothing for a while after it starts, and the
    all-workers-up window counts that wait against it. From the last worker's first write on, each
    worker has passed its first hold; the figure is then off by at most one batch per worker, so a
    window should hold several. None when under MIN_STEADY_SECONDS remain."""
    firsts: dict[str, float] = {}
    for r in inside:
        worker = r.get("worker", "")
        firsts[worker] = min(firsts.get(worker, r["finished"]), r["finished"])
    start = max(firsts.values(), default=t1)
    if t1 - start < MIN_STEADY_SECONDS:
        return {"steady_seconds": round(max(0.0, t1 - start), 1), "steady_audio_seconds_per_second": None}
    audio = sum(r["duration"] for r in inside if r["finished"] > start)
    return {"steady_seconds": round(t1 - start, 1), "steady_audio_seconds_per_second": round(audio / (t1 - start), 3)}


def steady_state(rows: list[dict]) -> dict:
    if len(rows) < 10:
        return {"utterances": len(rows), "audio_seconds_per_second": None}
    rows = sorted(rows, key=lambda r: r["finished"])
    cut = len(rows) // 10
    window = rows[cut : len(rows) - cut]
    span = window[-1]["finished"] - rows[cut - 1]["finished"] if cut else window[-1]["finished"] - window[0]["finished"]
    audio = sum(r["duration"] for r in window)
    rate = audio / span if span > 0 else None
    return {
        "utterances": len(rows),
        "audio_seconds": round(sum(r["duration"] for r in rows), 2),
        "audio_seconds_per_second": round(rate, 3) if rate else None,
        "real_time_factor": round(1 / rate, 4) if rate else None,
        "utterances_per_hour": round(len(window) / span * 3600) if span > 0 else None,
        "mean_utterance_seconds": round(audio / len(window), 2),
    }


def whole_job(rows: list[dict], wall: float) -> dict:
    """A run that went to its end: all its audio over the command's whole wall time (start-up, every
    hold of the gate's batches and the tail included), the figure a user of a finished job sees."""
    audio = sum(r["duration"] for r in rows)
    return {"whole_job_audio_seconds_per_second": round(audio / wall, 3) if rows and wall > 0 else None}


def memory_report(rows: list[dict], samples: list[dict]) -> dict:
    per_worker: dict[str, list] = {}
    for r in sorted(rows, key=lambda r: r["finished"]):
        per_worker.setdefault(r["worker"], []).append((r["finished"], r["gpu_mb"], r["rss_mb"]))
    workers = {}
    for name, series in per_worker.items():
        gpu = [g for _, g, _ in series]
        half = len(gpu) // 2
        workers[name] = {
            "utterances": len(series),
            "gpu_mb_first_half_max": max(gpu[:half] or gpu),
            "gpu_mb_second_half_max": max(gpu[half:]),
            "gpu_mb_min": min(gpu),
            "gpu_mb_max": max(gpu),
            "rss_mb_max": max(r for _, _, r in series),
            "series": [[round(t, 1), g, r] for t, g, r in series[:: max(1, len(series) // 40)]],
        }
    used = [s["gpu_used_mb"] for s in samples if s["gpu_used_mb"] is not None]
    cpu = [s["cpu_busy"] for s in samples]
    busy = [s["gpu_busy"] for s in samples if s.get("gpu_busy") is not None]
    return {
        "workers": workers,
        "gpu_used_mb_max": max(used) if used else None,
        "gpu_used_mb_series": [[round(s["t"], 1), s["gpu_used_mb"]] for s in samples[::5]],
        "cpu_busy_mean": round(sum(cpu) / len(cpu), 3) if cpu else None,
        "gpu_busy_mean": round(sum(busy) / len(busy), 3) if busy else None,
    }


def slot_logs(logs: Path) -> list[Path]:
    """The slots' own logs (slot-0.log), not their workers' (slot-0-worker-3.log)."""
    return [p for p in logs.rglob("slot-*.log") if re.fullmatch(r"slot-\d+\.log", p.name)]


def rebuild_report(logs: Path) -> dict:
    times = []
    for log in slot_logs(logs):
        times += [float(m) for m in re.findall(r"model built \(every [^)]*\) in ([0-9.]+)s", log.read_text())]
    return {
        "count": len(times),
        "mean_seconds": round(sum(times) / len(times), 2) if times else None,
        "max_seconds": max(times) if times else None,
    }


def plot(reports: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mps in ("off", "on"):
        pts = sorted(
            (r["setting"]["workers"], r["audio_seconds_per_second"])
            for r in reports
            if r["setting"]["mps"] == mps and r["setting"]["name"].startswith("sweep") and r["audio_seconds_per_second"]
        )
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"fp16, MPS {mps}")
    for r in reports:
        if not r["setting"]["name"].startswith("sweep") and r["audio_seconds_per_second"]:
            ax.scatter(
                [r["setting"]["workers"]],
                [r["audio_seconds_per_second"]],
                marker="*",
                s=120,
                label=r["setting"]["name"],
            )
    ax.set_xlabel("workers on the GPU")
    ax.set_ylabel("audio seconds per wall second")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--config", default=str(REPO / "configs" / "cosyvoice.yaml"))
    p.add_argument(
        "--text", default=str(DEFAULT_TEXT), help="conversations to speak, in any input format of preprocess.py"
    )
    p.add_argument("--gpu", default="0")
    p.add_argument(
        "--settings",
        nargs="*",
        default=[],
        help="name:workers:mps(on|off):precision(fp16|fp32)[:batch size[:group.key=value,...]]",
    )
    p.add_argument("--sweep", default="", help="worker counts to run with and without MPS, fp16")
    p.add_argument("--utterances", type=int, default=300)
    p.add_argument(
        "--seconds",
        type=float,
        default=0,
        help="stop each setting this long after all its workers are up (0: run to the end)",
    )
    p.add_argument("--max-words", type=int, default=24)
    p.add_argument("--rebuild-every", type=int, default=100)
    p.add_argument("--segments-per-shard", type=int, default=20)
    p.add_argument("--work", default="/tmp/convtts-bench")
    p.add_argument("--set", action="append", default=[], help="group.key=value for every setting's run_all.sh")
    p.add_argument("--out", required=True, help="prefix for the .json and .png results")
    args = p.parse_args()
    settings = [Setting.parse(s) for s in args.settings]
    for k in filter(None, args.sweep.split(",")):
        settings += [Setting(f"sweep-{k}-mps-{m}", int(k), m, "fp16") for m in ("off", "on")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    input_file = work / "input.json"
    make_input(Path(args.text), args.utterances, args.max_words, input_file)
    reports = []
    for setting in settings:
        reports.append(run_setting(setting, args, input_file, work))
        Path(f"{args.out}.json").write_bytes(
            orjson.dumps({"gpu": gpu_name(args.gpu), "reports": reports}, option=orjson.OPT_INDENT_2)
        )
    plot(reports, Path(f"{args.out}.png"))
    print_table(reports)
    return 0


def gpu_name(gpu: str) -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", f"--id={gpu}", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def print_table(reports: list[dict]) -> None:
    print(
        "| setting | workers | batch | MPS | precision | audio s/s | RTF | utt/hour | GPU MiB/worker (max) | GPU "
        "busy | CPU busy | exit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in reports:
        s, mem = r["setting"], r["memory"]
        per_worker = max((w["gpu_mb_max"] for w in mem["workers"].values()), default=None)
        print(
            f"| {s['name']} | {s['workers']} | {s.get('batch', 1)} | {s['mps']} | {s['precision']} | "
            f"{r.get('audio_seconds_per_second')} | "
            f"{r.get('real_time_factor')} | {r.get('utterances_per_hour')} | {per_worker} | "
            f"{mem.get('gpu_busy_mean')} | {mem['cpu_busy_mean']} | {r['exit_code']} |"
        )


if __name__ == "__main__":
    sys.exit(main())
