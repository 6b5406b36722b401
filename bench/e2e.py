#!/usr/bin/env python3
"""End to end against steady state: the README's GPU command on N real short-turn conversations, and where its
start-up went.

For each engine it runs exactly what a user types,

    ./run_all.sh --config configs/cosyvoice.yaml --input CONVS --output-dir OUT --set tts.cosyvoice.model_dir=MODEL

(--engine ray --address local for the Ray engine on this one machine, or --ray-address auto to join a
cluster started beforehand), on N conversations of one
real LLaVA question and its GPT-4 answer each (bench/data/llava_gpt4_qa_30x3.jsonl, repeated under
new ids), and prints from the run's own outputs:

- end to end: audio seconds of the run over the command's wall time (start to exit, merge included);
- steady state of the same job: audio finished while every worker was busy (from the moment each
  had finished an utterance to the moment the first one finished its last) over that window, and
  the 10%-trimmed figure bench/throughput.py gives;
- the start-up timeline (work/slots/slot-N.json): validation, slot start, plan, each worker's
  spawn and load phases, first audio, all workers busy; and the tail after the window.
- per 5 s of the command: rows in flight, audio finished, work under way, and each GPU's power draw
  (nvidia-smi, where there is one).

    python3 bench/e2e.py --model-dir /tmp/cv300m --conversations 300 --out "$OUT/e2e-300.json"
    python3 bench/e2e.py --size tiny --conversations 12 --gpus cpu:2 --work /tmp/e2e-cpu   # a check on a CPU machine

--size tiny|full writes the random-weight CosyVoice-300M-SFT directory (convtts.testing) to
--model-dir when it holds none. Figures go to --out as JSON after each engine.

--version 2 or 3 speaks with CosyVoice2 or CosyVoice3 instead (configs/cosyvoice{2,3}.yaml, the runtime of
--runtime-root, default $COSYVOICE_ROOT): the config's two zero-shot voices get a 4-s quiet-noise prompt
written into --work (for random weights only a prompt's length matters). --job-limit S stops a command
still running after S seconds: every process of it that dumps its stacks on SIGUSR1 writes them into its
log first, the figures say where each was, and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO / "bench" / "data" / "llava_gpt4_qa_30x3.jsonl"
SHORT_TURNS = REPO / "bench" / "data" / "llava15_short_turns.json"
CONFIGS = {version: REPO / "configs" / f"cosyvoice{'' if version == 1 else version}.yaml" for version in (1, 2, 3)}
VOICES = ("anna", "ben")  # the zero-shot voices of configs/cosyvoice2.yaml and cosyvoice3.yaml
PROMPT_TEXT = "This is a short prompt for a new voice, about ten words."
INSTRUCTION = "You are a helpful assistant.<|endofprompt|>"  # CosyVoice3 wants it in every prompt text
PHASES = ("process", "gate", "imports", "cuda", "modules", "frontend", "weights", "engine", "other")


@contextmanager
def cuda_visible(devices: str | None):
    """CUDA_VISIBLE_DEVICES set to `devices` for what starts inside (None: left as it is), restored after."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def make_conversations(count: int, path: Path, text: str = "bench") -> None:
    """`count` conversations in file order, repeated under new ids: `bench`, one question (with its <image>) and
    its GPT-4 answer each; `short`, the real short-turn conversations as they are."""
    if text == "short":
        records = json.loads(SHORT_TURNS.read_text())
        repeated = [
            dict(records[n % len(records)], id=f"{records[n % len(records)]['id']}-{n // len(records)}")
            for n in range(count)
        ]
        path.write_text(json.dumps(repeated))
        return
    pairs = [json.loads(line) for line in TEXT.read_text().splitlines() if line.strip()]
    records = []
    for n in range(count):
        pair = pairs[n % len(pairs)]
        records.append(
            {
                "id": f"{pair['id']}-{pair['type']}-{n // len(pairs)}",
                "image": pair["image"],
                "conversations": [
                    {"from": "human", "value": f"<image>\n{pair['instruction']}"},
                    {"from": "gpt", "value": pair["output"]},
                ],
            }
        )
    path.write_text(json.dumps(records))


def ensure_model(model_dir: Path, size: str | None, version: int = 1, runtime_root: str = "") -> None:
    if (model_dir / CONFIGS[version].name).is_file() or size is None:  # a model's yaml is named as its config
        return
    cmd = [sys.executable, "-m", "convtts.testing.cosyvoice_model", "--out", str(model_dir), "--size", size]
    if version == 1:
        cmd += ["--tokens-per-text-token", "14", "--speakers", "英文女,英文男"]
    else:
        cmd += ["--version", str(version), "--tokens-per-text-token", "7"]
        cmd += ["--runtime-root", runtime_root] if runtime_root else []
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def version_sets(version: int, work: Path, runtime_root: str) -> list[str]:
    """The --set items a v2 or v3 model speaks with: the runtime's checkout, and the config's zero-shot
    voices on a 4-s quiet-noise prompt written into `work` (v3's prompt texts carry its instruction)."""
    if version == 1:
        return []
    import numpy as np
    import soundfile as sf

    prompt = work / "prompt.wav"
    sf.write(prompt, (np.random.default_rng(0).standard_normal(4 * 24000) * 0.05).astype("float32"), 24000)
    text = (INSTRUCTION if version == 3 else "") + PROMPT_TEXT
    sets = [f"tts.cosyvoice.runtime_root={runtime_root}"] if runtime_root else []
    return sets + [f'tts.cosyvoice.prompts.{name}={{audio: "{prompt}", text: "{text}"}}' for name in VOICES]


def command(engine: str, args, source: Path, out: Path) -> list[str]:
    """The README's GPU command; the Ray engine on this machine alone; CPU slots when asked for."""
    cmd = [
        "./run_all.sh",
        "--config",
        str(args.config),
        "--input",
        str(source),
        "--output-dir",
        str(out),
        "--set",
        f"tts.cosyvoice.model_dir={args.model_dir}",
    ]
    if getattr(args, "mps", None):
        cmd += ["--mps", args.mps]
    if engine == "ray":
        cmd += ["--engine", "ray", "--address", args.ray_address]
        if args.gpus and args.gpus.startswith("cpu:"):
            cmd += ["--slot-resource", "CPU"]
    elif args.gpus:
        cmd += ["--gpus", args.gpus]
    for item in args.set:
        cmd += ["--set", item]
    return cmd


def run(engine: str, args, source: Path) -> dict:
    out, log = Path(args.work) / f"out-{engine}", Path(args.work) / f"log-{engine}"
    cmd = command(engine, args, source, out) + ["--log-dir", str(log)]
    sampler = start_gpu_sampler()
    started = time.time()
    limit = getattr(args, "job_limit", None)
    code, stderr, stopped = execute(cmd, limit) if limit else plain(cmd)
    wall = time.time() - started
    power = stop_gpu_sampler(sampler)
    figures = {
        "engine": engine,
        "command": " ".join(cmd),
        "exit_code": code,
        "wall_seconds": round(wall, 2),
        "stderr_tail": stderr[-2000:],
    }
    if stopped:
        figures.update(stopped_after_seconds=limit, stopped_stacks=stack_dumps(log))
    figures.update(measure(out, started, wall))
    figures["gpu_power_w"] = power_by_bin(power, started, wall)
    worker_logs = [path.read_text(errors="replace") for path in log.rglob("slot-*-worker-*.log")]
    figures["out_of_memory"] = out_of_memory(worker_logs)
    figures["engine_stages"] = engine_stages(worker_logs)
    slot_logs = [path for path in log.rglob("slot-*.log") if "-worker-" not in path.name]
    figures["forkserver_imports"] = forkserver_imports(slot_logs)
    return figures


def plain(cmd: list[str]) -> tuple[int, str, bool]:
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    return done.returncode, done.stderr, False


STACKS_WAIT = 3.0  # seconds the processes get to write their stacks before the stop
STOP_WAIT = 60.0  # seconds the command gets to stop its slots (run_all.sh gives each 15) before it is killed


def execute(cmd: list[str], limit: float) -> tuple[int, str, bool]:
    """The command in a session of its own, stopped if it runs past `limit` seconds: its processes' stacks
    dumped into their logs (SIGUSR1), then SIGTERM (the slots stop, the exit is 143), then SIGKILL to all of
    it. Exit code, stderr, and whether it was stopped."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stderr = proc.communicate(timeout=limit)[1]
        return proc.returncode, stderr, False
    except subprocess.TimeoutExpired:
        pass
    dumped = dump_stacks(proc.pid)
    print(f"job past {limit:.0f} s: stacks of {len(dumped)} processes dumped (pids {dumped}); stopping it", flush=True)
    time.sleep(STACKS_WAIT)
    proc.terminate()
    try:
        stderr = proc.communicate(timeout=STOP_WAIT)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            stderr = proc.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:  # a process outside the group holds the pipe: give up on it
            proc.kill()
            stderr = "(stderr lost: the command's pipes stayed open after SIGKILL)"
    return proc.returncode, stderr, True


def descendants(root: int) -> list[int]:
    """Every process under `root` (from /proc), parents before children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo += children.get(pid, [])
    return found


def catches_usr1(pid: int) -> bool:
    """Whether the process is a Python one with a handler for SIGUSR1 (convtts.cli.setup_logging's stack
    dump): only these are sent it, since SIGUSR1 ends a process that has none, and bash (run_all.sh) runs
    its EXIT trap and dies on it."""
    try:
        python = Path(f"/proc/{pid}/exe").resolve().name.startswith("python")
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    if not python:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (signal.SIGUSR1 - 1) & 1)


def dump_stacks(root: int) -> list[int]:
    """SIGUSR1 to each process under `root` that dumps its stacks on it; the pids signalled."""
    dumped = []
    for pid in descendants(root):
        if catches_usr1(pid):
            try:
                os.kill(pid, signal.SIGUSR1)
                dumped.append(pid)
            except OSError:
                pass
    return dumped


STACK_HEAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")


def stack_dumps(log: Path, frames: int = 12) -> dict:
    """The stacks dumped into the logs under `log`, by log file: each thread's innermost `frames` frames."""
    found = {}
    for path in sorted(log.rglob("*.log")):
        lines = path.read_text(errors="replace").splitlines()
        threads = [
            [line.strip() for line in lines[i + 1 : i + 1 + frames] if line.startswith("  ")]
            for i, line in enumerate(lines)
            if STACK_HEAD.match(line)
        ]
        if threads:
            found[str(path.relative_to(log))] = threads
    return found


GPU_QUERY = ["nvidia-smi", "--query-gpu=timestamp,index,power.draw", "--format=csv,noheader,nounits", "-lms", "250"]
BIN = 5.0  # seconds per bin of the timelines


def start_gpu_sampler() -> subprocess.Popen | None:
    """nvidia-smi printing each GPU's power draw every 250 ms while the command runs (None without one):
    how busy the GPU was through start-up, the busy window and the tail."""
    try:
        return subprocess.Popen(GPU_QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def stop_gpu_sampler(sampler: subprocess.Popen | None) -> list[tuple[float, int, float]]:
    if sampler is None:
        return []
    sampler.terminate()
    out, _ = sampler.communicate()
    return parse_power(out)


def parse_power(text: str) -> list[tuple[float, int, float]]:
    """The sampler's lines as (seconds since the epoch, GPU index, watts); a line that is not a sample
    (a GPU without a power reading says [N/A]) is left out."""
    samples = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        try:
            at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # the host's local time
            samples.append((at, int(parts[1]), float(parts[2])))
        except (IndexError, ValueError):
            continue
    return samples


def power_by_bin(samples: list[tuple[float, int, float]], started: float, wall: float) -> dict:
    """Each GPU's mean power draw in watts per BIN seconds of the command (None where a bin got no sample)."""
    bins = int(wall // BIN) + 1
    sums: dict[int, list[list[float]]] = {}
    for at, gpu, watts in samples:
        i = int((at - started) // BIN)
        if 0 <= i < bins:
            got = sums.setdefault(gpu, [[0.0, 0] for _ in range(bins)])[i]
            got[0] += watts
            got[1] += 1
    return {str(gpu): [round(w / n) if n else None for w, n in got] for gpu, got in sorted(sums.items())}


FORKSERVER_LINE = re.compile(r"forkserver imported in ([\d.]+) s \((.*)\)")


def forkserver_imports(slot_logs: list[Path]) -> dict:
    """Each slot's forkserver import, as its log gives it (run/preload.py): seconds in all, and by step."""
    found = {}
    for path in sorted(slot_logs):
        if match := FORKSERVER_LINE.search(path.read_text(errors="replace")):
            steps = {name: float(took) for name, took in re.findall(r"([\w ]+?) ([\d.]+)(?:, |$)", match.group(2))}
            found[path.stem] = {"seconds": float(match.group(1)), "steps": steps}
    return found


ENGINE_LINE = re.compile(r"engine: (\d+) utterances in ([\d.]+) s: (.*)")
STAGE = re.compile(r"(\w+) ([\d.]+) s")
FLOW_GRAPHS = re.compile(r"flow passes (\d+) bucketed: (\d+) replayed, (\d+) captured")
VOCODER_PASSES = re.compile(r"vocoder passes (\d+), (\d+) of one row")
FRONTEND_LINE = re.compile(r"frontend: (\d+) texts in ([\d.]+) s \(cpu ([\d.]+) s\)")


def engine_stages(worker_logs: list[str]) -> dict:
    """Where the batched workers' time went, summed over their engine lines (engine.StageTimer):
    seconds per stage, the loop thread's CPU seconds in each, and the share of the workers' time in
    the engine; and the flow's passes on the GPU, how many replayed a CUDA graph and how many graphs
    were captured."""
    wall, stages, cpu, graphs, vocoder = 0.0, {}, {}, [0, 0, 0], [0, 0]
    for text in worker_logs:
        for match in ENGINE_LINE.finditer(text):
            wall += float(match.group(2))
            timed, _, rest = match.group(3).partition("; cpu ")
            for name, seconds in STAGE.findall(timed):
                stages[name] = stages.get(name, 0.0) + float(seconds)
            for name, seconds in STAGE.findall(rest.partition(";")[0]):
                cpu[name] = cpu.get(name, 0.0) + float(seconds)
            if counts := FLOW_GRAPHS.search(match.group(3)):
                graphs = [total + int(n) for total, n in zip(graphs, counts.groups())]
            if counts := VOCODER_PASSES.search(match.group(3)):
                vocoder = [total + int(n) for total, n in zip(vocoder, counts.groups())]
    share = {name: round(seconds / wall, 3) for name, seconds in stages.items()} if wall else {}
    passes = dict(zip(("passes", "replayed", "captured"), graphs))
    found = [match for text in worker_logs for match in FRONTEND_LINE.findall(text)]
    texts, seconds, cpu_seconds = (sum(float(match[i]) for match in found) for i in range(3))
    return {
        "frontend": {"texts": int(texts), "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1)},
        "seconds": round(wall, 1),
        "stage_seconds": {name: round(seconds, 1) for name, seconds in stages.items()},
        "cpu_seconds": {name: round(seconds, 1) for name, seconds in cpu.items()},
        "share": share,
        "flow_passes": passes,
        "vocoder_passes": dict(zip(("passes", "one_row"), vocoder)),
    }


OUT_OF_MEMORY = re.compile(r"out of memory with \d+ utterances? in flight")


def out_of_memory(worker_logs: list[str]) -> int:
    """Batches a worker lost to a CUDA out-of-memory (each restarts what it had in flight at half its rows):
    the worker's one warning a batch, "out of memory with N utterances in flight (...)"."""
    return sum(len(OUT_OF_MEMORY.findall(text)) for text in worker_logs)


def measure(out: Path, started: float, wall: float) -> dict:
    rows = [
        json.loads(line)
        for path in sorted((out / "work").glob("shard-*.manifest.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    audio = sum(r["duration"] for r in rows)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    window = busy_window(rows)
    last = max((r["finished"] for r in rows), default=0.0)
    return {
        "utterances": len(rows),
        "audio_seconds": round(audio, 1),
        "workers": len({r["worker"] for r in rows}),
        "end_to_end_audio_s_per_s": round(audio / wall, 2) if wall else None,
        "steady_state": window,
        "steady_state_trimmed_audio_s_per_s": trimmed_rate(rows),
        "tail_seconds": round(started + wall - window["ends"], 1) if window.get("ends") else None,
        # the tail in two: workers running out one by one, then the command's end after the last row
        "drain_seconds": round(last - window["ends"], 1) if window.get("ends") else None,
        "after_last_row_seconds": round(started + wall - last, 1) if rows else None,
        "summary_this_run": summary.get("this_run"),
        "startup": startup(out),
        "last_rows": last_rows(rows, started),
        "gpu_mb_peak": gpu_mb_peak(rows),
        "timeline": timeline(rows, started, wall),
        "by_row_length": by_row_length(rows, audio / wall if wall else 0.0),
    }


LENGTH_BUCKETS = (
    (0.0, 1.0, "under 1 s"),
    (1.0, 2.0, "1-2 s"),
    (2.0, 5.0, "2-5 s"),
    (5.0, 10.0, "5-10 s"),
    (10.0, float("inf"), "over 10 s"),
)


def worker_shares(rows: list[dict]) -> list[float]:
    """Each row's share of its worker's time: every moment of a worker is split evenly among the rows it
    has in flight (begun, not finished), as the decode's steps are; a rough gauge, since a row's time in
    flight includes its waits (for the flow, for a refill's prefill)."""
    shares = [0.0] * len(rows)
    by_worker: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_worker.setdefault(row["worker"], []).append(i)
    for members in by_worker.values():
        events = sorted(
            [(rows[i]["finished"] - rows[i]["synthesis_seconds"], 1, i) for i in members]
            + [(rows[i]["finished"], -1, i) for i in members]
        )
        integral, last, live = 0.0, None, 0  # integral of dt / rows in flight, from the worker's first event
        mark: dict[int, float] = {}
        for at, step, i in events:
            if last is not None and live:
                integral += (at - last) / live
            last = at
            live += step
            if step > 0:
                mark[i] = integral
            else:
                shares[i] = integral - mark.get(i, integral)
    return shares


def by_row_length(rows: list[dict], rate: float) -> list[dict]:
    """Per bucket of row length: rows, audio, and the job's audio s/s were every row as costly per audio
    second as this bucket's (end to end, scaled by the bucket's share of the workers' time against its
    share of the audio)."""
    shares = worker_shares(rows)
    audio_all, time_all = sum(r["duration"] for r in rows), sum(shares)
    out = []
    for low, high, name in LENGTH_BUCKETS:
        picked = [i for i, r in enumerate(rows) if low <= r["duration"] < high]
        audio = sum(rows[i]["duration"] for i in picked)
        spent = sum(shares[i] for i in picked)
        scaled = rate * (audio / audio_all) / (spent / time_all) if picked and spent and audio_all else None
        out.append(
            {
                "rows": name,
                "count": len(picked),
                "audio_seconds": round(audio, 1),
                "audio_s_per_s": round(scaled, 1) if scaled else None,
            }
        )
    return out


def timeline(rows: list[dict], started: float, wall: float) -> dict:
    """Per BIN seconds of the command: rows in flight (begun, not finished: decoding or waiting for the flow),
    audio seconds finished, and the work under way, each row's audio spread evenly over its time in flight.
    The work is a rough gauge: a row's time in flight includes its waits in the worker (for a free row, for
    the flow), so it reads low where short rows wait; the GPU's power draw (gpu_power_w) says more about
    how busy the GPU was."""
    bins = int(wall // BIN) + 1
    flight, finished, work = [0.0] * bins, [0.0] * bins, [0.0] * bins
    for row in rows:
        end = row["finished"] - started
        begin = end - row["synthesis_seconds"]
        finished[min(bins - 1, max(0, int(end // BIN)))] += row["duration"]
        rate = row["duration"] / max(row["synthesis_seconds"], 1e-3)
        for i in range(max(0, int(begin // BIN)), min(bins, int(end // BIN) + 1)):
            overlap = min(end, (i + 1) * BIN) - max(begin, i * BIN)
            if overlap > 0:
                flight[i] += overlap / BIN
                work[i] += rate * overlap / BIN
    return {
        "bin_seconds": BIN,
        "rows_in_flight": [round(x) for x in flight],
        "finished_audio_s_per_s": [round(x / BIN, 1) for x in finished],
        "work_audio_s_per_s": [round(x, 1) for x in work],
    }


def gpu_mb_peak(rows: list[dict]) -> dict:
    """Each worker's largest GPU memory over its rows (the manifest's gpu_mb: torch's reserved memory
    by default, workers.gpu_memory), against which workers.max_gpu_mb rebuilds; {} on a CPU."""
    peaks: dict[str, float] = {}
    for row in rows:
        if row.get("gpu_mb"):
            peaks[row["worker"]] = max(peaks.get(row["worker"], 0.0), row["gpu_mb"])
    return dict(sorted(peaks.items()))


def last_rows(rows: list[dict], started: float, count: int = 8) -> list[dict]:
    """The utterances that finished last, seconds from the command's start: whether the end waited for
    a long row begun early (its decode at full load) or for ids begun late."""
    ends = sorted(rows, key=lambda r: r["finished"])[-count:]
    return [
        {
            "worker": r["worker"],
            "audio": r["duration"],
            "began": round(r["finished"] - r["synthesis_seconds"] - started, 1),
            "finished": round(r["finished"] - started, 1),
        }
        for r in ends
    ]


def busy_window(rows: list[dict]) -> dict:
    """Audio finished while every worker was busy: after each had finished an utterance, before any finished its
    last."""
    firsts, lasts = {}, {}
    for row in rows:
        worker, at = row["worker"], row["finished"]
        firsts[worker], lasts[worker] = min(firsts.get(worker, at), at), max(lasts.get(worker, at), at)
    if not firsts:
        return {}
    begins, ends = max(firsts.values()), min(lasts.values())
    inside = [r for r in rows if begins < r["finished"] <= ends]
    span = max(lasts.values()) - min(firsts.values())
    if len(inside) < max(10, len(rows) // 10) or ends - begins < max(5.0, 0.1 * span):  # a burst of a batch or two
        return {
            "begins": begins,
            "ends": ends,
            "audio_s_per_s": None,
            "note": f"every worker was busy for {max(ends - begins, 0):.1f} s only ({len(inside)} utterances)",
        }
    audio = sum(r["duration"] for r in inside)
    return {
        "begins": begins,
        "ends": ends,
        "seconds": round(ends - begins, 1),
        "utterances": len(inside),
        "audio_s_per_s": round(audio / (ends - begins), 2),
    }


def trimmed_rate(rows: list[dict]) -> float | None:
    """bench/throughput.py's steady state: the first and last 10% of utterances by finish time left out."""
    if len(rows) < 10:
        return None
    rows = sorted(rows, key=lambda r: r["finished"])
    cut = len(rows) // 10
    middle = rows[cut : len(rows) - cut]
    span = middle[-1]["finished"] - rows[cut - 1]["finished"]
    return round(sum(r["duration"] for r in middle) / span, 2) if span > 0 else None


def startup(out: Path) -> list[dict]:
    """Each slot's start-up timeline, with its workers' phases summed up (mean and max over workers)."""
    slots = []
    for path in sorted((out / "work" / "slots").glob("slot-*.json")):
        timeline = json.loads(path.read_text()).get("startup") or {}
        workers = list(timeline.get("workers", {}).values())
        ready = [w["ready"] for w in workers if "ready" in w]
        phases = {}
        for name in PHASES:
            seconds = [w.get("phases", {}).get(name) for w in workers if name in w.get("phases", {})]
            if seconds:
                phases[name] = {"mean": round(sum(seconds) / len(seconds), 2), "max": round(max(seconds), 2)}
        slots.append(
            {
                "slot": path.stem,
                "events": timeline.get("events", {}),
                "workers": len(workers),
                "ready_first": min(ready, default=None),
                "ready_last": max(ready, default=None),
                "phases": phases,
            }
        )
    return slots


def report(figures: dict) -> str:
    steady = figures["steady_state"].get("audio_s_per_s")
    lines = [
        f"{figures['engine']}: exit {figures['exit_code']}, {figures['utterances']} utterances, "
        f"{figures['audio_seconds']} s of audio in {figures['wall_seconds']} s: "
        f"{figures['end_to_end_audio_s_per_s']} audio s/s end to end; steady state {steady} "
        f"({figures['steady_state_trimmed_audio_s_per_s']} trimmed); {figures['workers']} workers; "
        f"tail {figures['tail_seconds']} s after the first worker ran out "
        f"(drain {figures.get('drain_seconds')} s, then {figures.get('after_last_row_seconds')} s to the exit); "
        f"{figures.get('out_of_memory')} batches lost to out-of-memory"
    ]
    lines.append(
        "  last rows (audio s, began-finished s): "
        + ", ".join(f"{r['worker']} {r['audio']:.1f} {r['began']}-{r['finished']}" for r in figures["last_rows"])
    )
    lines.append(
        "  by row length (rows, audio s, audio s/s at that cost): "
        + "; ".join(
            f"{b['rows']} {b['count']}, {b['audio_seconds']}, {b['audio_s_per_s']}"
            for b in figures.get("by_row_length", [])
        )
    )
    stages = figures.get("engine_stages") or {}
    if stages.get("share"):
        cpu, spent = stages.get("cpu_seconds") or {}, stages["stage_seconds"]
        shares = ", ".join(
            f"{name} {share:.0%}" + (f" (cpu {cpu[name] / spent[name]:.0%})" if spent.get(name) and name in cpu else "")
            for name, share in sorted(stages["share"].items(), key=lambda x: -x[1])
        )
        passes = stages.get("flow_passes") or {}
        graphs = (
            f"; flow passes on the GPU {passes['passes']}: {passes['replayed']} replayed, {passes['captured']} captured"
            if passes.get("passes")
            else ""
        )
        vocoder = stages.get("vocoder_passes") or {}
        if vocoder.get("passes"):
            graphs += f"; vocoder passes {vocoder['passes']}, {vocoder['one_row']} of one row"
        lines.append(f"  engine, all workers ({stages['seconds']} s): {shares}{graphs}")
        if (frontend := stages.get("frontend") or {}).get("texts"):
            texts, seconds, cpu = frontend["texts"], frontend["seconds"], frontend["cpu_seconds"]
            lines.append(f"  frontend threads: {texts} texts in {seconds} s (cpu {cpu} s)")
    lines += stopped_lines(figures)
    imports = figures.get("forkserver_imports") or {}
    if imports:
        lines.append(
            "  forkserver imports: "
            + "; ".join(
                f"{slot} {got['seconds']:.2f} s ("
                + ", ".join(f"{name} {took:.2f}" for name, took in got["steps"].items())
                + ")"
                for slot, got in imports.items()
            )
        )
    peaks = figures.get("gpu_mb_peak") or {}
    if peaks:
        lines.append(
            f"  GPU memory, each worker's peak: {min(peaks.values()):.0f}-{max(peaks.values()):.0f} MiB "
            f"over {len(peaks)} workers"
        )
    line = figures.get("timeline") or {}
    if line.get("work_audio_s_per_s"):
        lines.append(f"  by {line['bin_seconds']:.0f} s: work audio s/s {line['work_audio_s_per_s']}")
        lines.append(f"  by {line['bin_seconds']:.0f} s: rows in flight {line['rows_in_flight']}")
    for gpu, watts in (figures.get("gpu_power_w") or {}).items():
        lines.append(f"  by {BIN:.0f} s: GPU {gpu} watts {watts}")
    for slot in figures["startup"]:
        events = ", ".join(f"{name} {at:.1f}" for name, at in slot["events"].items())
        phases = ", ".join(f"{name} {p['mean']:.1f}/{p['max']:.1f}" for name, p in slot["phases"].items())
        lines.append(
            f"  {slot['slot']}: {events}; {slot['workers']} workers ready {slot['ready_first']}-{slot['ready_last']} "
            f"s; "
            f"phases mean/max: {phases}"
        )
    return "\n".join(lines)


FRAME = re.compile(r'File "(?:[^"]*?/)?((?:convtts|cosyvoice)/[^"]*|[^/"]*)", line (\d+) in (.*)')


def stopped_lines(figures: dict) -> list[str]:
    """Where a command stopped at --job-limit was: by log, each thread that was in convtts or the runtime,
    at its innermost frame there and its innermost frame of all (threads idle elsewhere are left out)."""
    if "stopped_after_seconds" not in figures:
        return []
    lines = [f"  stopped after {figures['stopped_after_seconds']} s; where its threads were (stacks in the logs):"]
    for name, threads in figures["stopped_stacks"].items():
        for thread in threads:
            frames = [":".join(match.groups()) for line in thread if (match := FRAME.match(line))]
            ours = [frame for frame in frames if frame.startswith(("convtts/", "cosyvoice/"))]
            if ours:
                lines.append(f"    {name}: {ours[0]} (innermost {frames[0]})")
    return lines


def fresh_work(parser: argparse.ArgumentParser, args) -> Path:
    """--work made (it must be empty: every run starts from nothing), the model written if asked for, and
    for v2 or v3 the config, runtime and voices added to the command's settings."""
    work = Path(args.work)
    if work.exists() and any(work.iterdir()):
        parser.error(f"--work {work} is not empty: every run starts from nothing")
    work.mkdir(parents=True, exist_ok=True)
    args.model_dir = Path(args.model_dir).resolve()
    if args.version == 3 and not args.runtime_root:
        parser.error("--version 3 needs a CosyVoice checkout: --runtime-root or $COSYVOICE_ROOT")
    args.config = args.config or str(CONFIGS[args.version])
    ensure_model(args.model_dir, args.size, args.version, args.runtime_root)
    args.set = version_sets(args.version, work.resolve(), args.runtime_root) + args.set
    return work


def add_version_args(p: argparse.ArgumentParser) -> None:
    """The options the whole-job benches share: which CosyVoice, its runtime, the per-job limit, MPS."""
    p.add_argument("--version", type=int, choices=(1, 2, 3), default=1, help="CosyVoice generation of --model-dir")
    p.add_argument(
        "--runtime-root",
        default=os.environ.get("COSYVOICE_ROOT", ""),
        help="v2/v3: a CosyVoice checkout (default $COSYVOICE_ROOT; v2 also runs on the installed package)",
    )
    p.add_argument("--config", help="default: configs/cosyvoice.yaml, cosyvoice2.yaml or cosyvoice3.yaml by --version")
    p.add_argument("--mps", choices=("auto", "on", "off", "per-gpu"), help="run_all.sh --mps (default: its own)")
    p.add_argument(
        "--job-limit",
        type=float,
        help="seconds a command may run: past them its processes' stacks go into their logs and it is stopped",
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="/tmp/cv300m")
    p.add_argument(
        "--size", choices=("tiny", "full"), help="write a random-weight model of this size when --model-dir has none"
    )
    p.add_argument("--conversations", type=int, default=300)
    p.add_argument(
        "--text",
        choices=("bench", "short"),
        default="bench",
        help="bench: LLaVA GPT-4 answers (long rows); short: real short-turn VQA conversations (bench/data/README.md)",
    )
    p.add_argument("--engine", choices=("bash", "ray", "both"), default="bash")
    p.add_argument("--gpus", help="run_all.sh --gpus (default: every GPU; cpu:N on a CPU machine)")
    p.add_argument(
        "--ray-address",
        default="local",
        help="the Ray engine's --address: local starts a cluster of this machine inside the timed command; "
        "auto joins one that is up (ray start --head), as on a cluster",
    )
    add_version_args(p)
    p.add_argument("--set", action="append", default=[], help="group.key=value added to the command")
    p.add_argument("--work", default="/tmp/convtts-e2e", help="a fresh folder: inputs, outputs, logs")
    p.add_argument("--out", help="write the figures here as JSON")
    args = p.parse_args()
    work = fresh_work(p, args)
    source = work / f"conversations-{args.conversations}.json"
    make_conversations(args.conversations, source, args.text)
    results = []
    for engine in ("bash", "ray") if args.engine == "both" else (args.engine,):
        results.append(run(engine, args, source))
        print(report(results[-1]), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps({"conversations": args.conversations, "runs": results}, indent=2))
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
