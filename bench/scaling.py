#!/usr/bin/env python3
"""Weak scaling on one node: the README's command on 1, 2, ... GPUs with the same work per GPU, both engines,
both kinds of real text, every output checked.

For each text (the real short-turn conversations, and as many LLaVA GPT-4 answers as hold the same
words, so about the same audio) and each GPU count N, it runs bench/e2e.py's job on N x --per-gpu
conversations from nothing: run_all.sh with --gpus 0..N-1, and the Ray engine (--address local, or a
cluster that is up) on the same N GPUs. Each output is checked: every planned id in the manifest once,
every audio file decoding to the length its row says, no stray file. It prints each run's figures,
then a table: end to end, per GPU, per GPU against the one-GPU run of the same text and engine, and
Ray against run_all.sh at the same N.

    python3 bench/scaling.py --model-dir /tmp/cv300m --gpu-counts 1,4 --per-gpu 2000 --out "$OUT/scaling.json"
    python3 bench/scaling.py --size tiny --model-dir /tmp/tiny --cpu --gpu-counts 1,2 --per-gpu 3 --work /tmp/s

--cpu stands CPU slots in for GPUs (run_all.sh --gpus cpu:N, Ray's CPU resource): a check of the
bench itself on a machine without a GPU. --engines picks bash, ray or both; --ray-from N runs the Ray
engine only at N GPUs and more (its one-GPU run is the same job as run_all.sh's, and the time is dear).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import e2e  # bench/ is on sys.path when run as a script
import text_kinds

sys.path.insert(0, str(e2e.REPO))  # this checkout's convtts, run as python3 bench/...
from convtts.state.verify import check_complete

TEXTS = ("short", "bench")


def counts_per_gpu(per_gpu: int, work: Path, bench: int = 0) -> dict[str, int]:
    """Conversations a GPU for each text: `per_gpu` short-turn ones, and `bench` bench-text ones (0: as
    many as hold the same words as the short-turn ones)."""
    if bench:
        return {"short": per_gpu, "bench": bench}
    probe = work / "short-probe.json"
    e2e.make_conversations(per_gpu, probe, "short")
    target = text_kinds.words(probe)
    probe.unlink()
    return {"short": per_gpu, "bench": text_kinds.matching_count(target, work)}


def visible(gpus: int, cpu: bool) -> str:
    return f"cpu:{gpus}" if cpu else ",".join(str(n) for n in range(gpus))


def one_run(args, text: str, gpus: int, engine: str, source: Path) -> dict:
    """One engine's job on `gpus` GPUs in a folder of its own, its output checked."""
    work = Path(args.work) / f"{text}-{gpus}-{engine}"
    work.mkdir(parents=True)
    run_args = argparse.Namespace(**{**vars(args), "work": str(work), "gpus": visible(gpus, args.cpu)})
    ray_gpus = run_args.gpus if engine == "ray" and not args.cpu else None  # the local cluster sees these alone
    with e2e.cuda_visible(ray_gpus):
        figures = e2e.run(engine, run_args, source)
    started = time.time()
    problems = check_complete(work / f"out-{engine}", processes=os.cpu_count() or 1)
    figures.update(
        text=text,
        gpus=gpus,
        problems=len(problems),
        first_problems=problems[:10],
        check_seconds=round(time.time() - started, 1),
    )
    return figures


def table(runs: list[dict]) -> list[dict]:
    """Per GPU against one GPU (same text and engine, else run_all.sh's one-GPU run), Ray against run_all.sh."""
    by = {(r["text"], r["gpus"], r["engine"]): r for r in runs}
    lines = []
    for r in runs:
        rate = r.get("end_to_end_audio_s_per_s") or 0.0
        one = by.get((r["text"], 1, r["engine"])) or by.get((r["text"], 1, "bash"))
        bash = by.get((r["text"], r["gpus"], "bash"))
        lines.append(
            {
                "text": r["text"],
                "gpus": r["gpus"],
                "engine": r["engine"],
                "exit_code": r["exit_code"],
                "utterances": r.get("utterances"),
                "audio_seconds": r.get("audio_seconds"),
                "wall_seconds": r["wall_seconds"],
                "audio_s_per_s": rate,
                "per_gpu": round(rate / r["gpus"], 2),
                "per_gpu_of_one": ratio(rate / r["gpus"], one and one.get("end_to_end_audio_s_per_s")),
                "of_run_all": ratio(rate, bash and bash.get("end_to_end_audio_s_per_s"))
                if r["engine"] == "ray"
                else None,
                "problems": r["problems"],
            }
        )
    return lines


def ratio(value: float, base: float | None) -> float | None:
    return round(value / base, 3) if base else None


def print_table(lines: list[dict]) -> None:
    print("text   GPUs engine exit rows    audio s   wall s  audio-s/s per GPU  of 1 GPU  of run_all  problems")
    for x in lines:
        print(
            f"{x['text']:<6} {x['gpus']:>4} {x['engine']:<6} {x['exit_code']:>4} {x['utterances'] or 0:>6} "
            f"{x['audio_seconds'] or 0:>10.1f} {x['wall_seconds']:>8.1f} {x['audio_s_per_s']:>10.2f} "
            f"{x['per_gpu']:>8.2f} {fmt(x['per_gpu_of_one']):>9} {fmt(x['of_run_all']):>11} {x['problems']:>9}",
            flush=True,
        )


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="/tmp/cv300m")
    p.add_argument("--size", choices=("tiny", "full"), help="write a random-weight model when --model-dir has none")
    p.add_argument("--gpu-counts", default="1,2,4", help="comma-separated GPU counts, each from GPU 0 up")
    p.add_argument("--per-gpu", type=int, default=2000, help="short-turn conversations a GPU (the bench text matches)")
    p.add_argument(
        "--bench-per-gpu", type=int, default=0, help="bench-text conversations a GPU (0: the short-turn text's words)"
    )
    p.add_argument("--texts", default="short,bench", help="short, bench or both, in that order of runs")
    p.add_argument("--engines", choices=("bash", "ray", "both"), default="both")
    p.add_argument("--ray-from", type=int, default=2, help="run the Ray engine only at this many GPUs and more")
    p.add_argument("--ray-address", default="local", help="local: a cluster inside the timed command; auto: one up")
    p.add_argument("--cpu", action="store_true", help="CPU slots stand in for GPUs (a check of the bench)")
    e2e.add_version_args(p)
    p.add_argument("--set", action="append", default=[], help="group.key=value added to every command")
    p.add_argument("--work", default="/tmp/convtts-scaling", help="a fresh folder")
    p.add_argument("--out", help="write the figures here as JSON after each run")
    args = p.parse_args()
    work = e2e.fresh_work(p, args)
    texts = [t for t in args.texts.split(",") if t]
    if not texts or set(texts) - set(TEXTS):
        p.error(f"--texts: short, bench or both, not {args.texts}")
    counts = counts_per_gpu(args.per_gpu, work, args.bench_per_gpu)
    engines = ("bash", "ray") if args.engines == "both" else (args.engines,)
    runs: list[dict] = []
    for text in texts:
        for gpus in sorted({int(n) for n in args.gpu_counts.split(",")}):
            source = work / f"{text}-{gpus}.json"
            e2e.make_conversations(counts[text] * gpus, source, text)
            for engine in engines:
                if engine == "ray" and gpus < args.ray_from:
                    continue
                runs.append(one_run(args, text, gpus, engine, source))
                runs[-1]["conversations"] = counts[text] * gpus
                print(f"== {text}, {gpus} GPUs, {engine}: {counts[text] * gpus} conversations", flush=True)
                print(e2e.report(runs[-1]), flush=True)
                if args.out:
                    Path(args.out).write_text(
                        json.dumps({"per_gpu": counts, "runs": runs, "table": table(runs)}, indent=2)
                    )
    print_table(table(runs))
    return 0 if all(r["exit_code"] == 0 and r["problems"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
