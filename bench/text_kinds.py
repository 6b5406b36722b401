#!/usr/bin/env python3
"""Short turns against long answers: the README's command on both kinds of real text, one call.

Runs bench/e2e.py's job on N real short-turn conversations (bench/data/llava15_short_turns.json,
a third of its rows under 2 s of audio) and then on as many LLaVA GPT-4 answers as hold the same
number of words, each from nothing, under the same settings; prints each job's figures (end to end,
steady state, by row length, where the workers' time went), the two end-to-end figures, the audio
of each and their ratio (short over long). The same words are not the same audio: on the random
models (pinned speech tokens per text token) the short-turn text spoke 0.417 s a word against 0.322
for the Q&A text (one H200, 2026-11-29), so 1,920 short-turn conversations matched 1,000 Q&A ones by
words and about 1,480 match them by audio. Both counts given, each job takes its own and nothing is
matched.

    python3 bench/text_kinds.py --model-dir /tmp/cv300m --conversations 1000 --out "$OUT/kinds.json"
    python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --out "$OUT/kinds.json"
    python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --conversations 1480   # ~same audio
    python3 bench/text_kinds.py --size tiny --model-dir /tmp/tiny --conversations 6 --gpus cpu:2 --work /tmp/k
    python3 bench/text_kinds.py --version 3 --model-dir /tmp/cv-v3 --conversations 300 --job-limit 240

--compare group.key=value (repeatable) runs each job a second time with those settings added, right after
the first (the same call and machine, so a change is set against the shipped settings beside it), and
prints both ratios:

    python3 bench/text_kinds.py --model-dir /tmp/cv300m --bench-conversations 1000 --conversations 1480 \
        --compare tts.cosyvoice.flow.attention=torch

--version 2 or 3 runs CosyVoice2 or CosyVoice3 (its config, the runtime of --runtime-root or $COSYVOICE_ROOT,
the config's voices on a quiet-noise prompt); --job-limit stops a job that runs too long, its processes'
stacks dumped into their logs, and goes on to the next (bench/e2e.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import e2e  # bench/ is on sys.path when run as a script

WORD = re.compile(r"\w+")


def words(path: Path) -> int:
    """Words of every turn of a conversations file."""
    return sum(
        len(WORD.findall(turn["value"])) for record in json.loads(path.read_text()) for turn in record["conversations"]
    )


def matching_count(target: int, work: Path, text: str = "bench", largest: int = 100_000) -> int:
    """The fewest conversations of `text` whose words reach `target` (the text repeats, so words grow
    evenly: a bisection over the count)."""
    low, high = 1, largest
    probe = work / "probe.json"
    while low < high:
        middle = (low + high) // 2
        e2e.make_conversations(middle, probe, text)
        if words(probe) >= target:
            high = middle
        else:
            low = middle + 1
    probe.unlink(missing_ok=True)
    return low


def job(args, text: str, count: int, extra: list[str] = (), label: str = "") -> dict:
    """One kind's job in its own folder: e2e.run on `count` conversations of `text`, `extra` settings added."""
    work = Path(args.work) / (f"{text}-{label}" if label else text)
    work.mkdir(parents=True)
    source = work / f"conversations-{count}.json"
    e2e.make_conversations(count, source, text)
    run_args = argparse.Namespace(**{**vars(args), "work": str(work), "set": [*args.set, *extra]})
    figures = e2e.run(args.engine, run_args, source)
    figures.update(text=text, conversations=count, words=words(source), settings=list(extra))
    named = f" ({label}: {' '.join(extra)})" if label else ""
    print(f"== {text}{named}: {count} conversations, {figures['words']} words", flush=True)
    print(e2e.report(figures), flush=True)
    return figures


def ratio_line(runs: list[dict], label: str = "") -> tuple[float | None, str]:
    """Short over long end to end, and the line that says it."""
    short, long = (r["end_to_end_audio_s_per_s"] for r in runs)
    ratio = round(short / long, 3) if short and long else None
    prefix = f"{label}: " if label else ""
    return ratio, (
        f"{prefix}short turns {short} audio s/s ({runs[0]['audio_seconds']} s of audio), long answers {long} "
        f"({runs[1]['audio_seconds']} s): ratio {ratio}"
    )


def counts(args, work: Path) -> tuple[int, int]:
    """Conversations of each text: both as asked, or one side as asked and the other matched by words."""
    if args.bench_conversations and args.conversations:
        return args.conversations, args.bench_conversations
    sized, other = ("bench", "short") if args.bench_conversations else ("short", "bench")
    count = args.bench_conversations or args.conversations or 1000
    source = work / f"{sized}-words.json"
    e2e.make_conversations(count, source, sized)
    matched = matching_count(words(source), work, other)
    source.unlink()
    return (matched, count) if args.bench_conversations else (count, matched)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="/tmp/cv300m")
    p.add_argument("--size", choices=("tiny", "full"), help="write a random-weight model when --model-dir has none")
    p.add_argument(
        "--conversations", type=int, help="short-turn conversations (default 1000; the long text matches their words)"
    )
    p.add_argument(
        "--bench-conversations",
        type=int,
        help="size the long-answer job instead (1000: the Q&A job of docs/PERFORMANCE.md); the short one matches, "
        "unless --conversations is given too",
    )
    p.add_argument("--engine", choices=("bash", "ray"), default="bash")
    p.add_argument("--gpus", help="run_all.sh --gpus (default: every GPU; cpu:N on a CPU machine)")
    p.add_argument("--ray-address", default="local")
    e2e.add_version_args(p)
    p.add_argument("--set", action="append", default=[], help="group.key=value added to both commands")
    p.add_argument(
        "--compare", action="append", default=[], help="group.key=value: each job again with it, after the first"
    )
    p.add_argument("--work", default="/tmp/convtts-kinds", help="a fresh folder")
    p.add_argument("--out", help="write the figures here as JSON")
    args = p.parse_args()
    work = e2e.fresh_work(p, args)
    short_count, long_count = counts(args, work)
    results, compared = [], []
    for text, count in (("short", short_count), ("bench", long_count)):
        results.append(job(args, text, count))
        if args.compare:  # in turns, so that a drift of the machine's speed falls on both alike
            compared.append(job(args, text, count, args.compare, "compared"))
    ratio, line = ratio_line(results)
    print(line, flush=True)
    figures: dict = {"ratio": ratio, "runs": results}
    if compared:
        figures["compared"] = {"settings": args.compare, "runs": compared}
        figures["compared"]["ratio"], line = ratio_line(compared, " ".join(args.compare))
        print(line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0 if all(r["exit_code"] == 0 for r in results + compared) else 1


if __name__ == "__main__":
    sys.exit(main())
