"""Quality figures for summary.json (QualityTally, fed by merge) and report.html: `python -m convtts.results.report
OUT`."""

from __future__ import annotations

import argparse
import base64
import html
import io
import sys
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import orjson
import yaml

from convtts.counts import plural
from convtts.state.layout import Layout
from convtts.state.shardio import DROPPED, KEPT, read_json


@dataclass
class QualityTally:
    """What the quality gate said about the rows and failures merge writes; tallies of shards add up."""

    gated: int = 0
    respoken: int = 0
    respeaks: int = 0
    gate_seconds: float = 0.0
    wers: Counter = field(default_factory=Counter)  # each WER value, and how many rows scored it
    cers: Counter = field(default_factory=Counter)  # character error rates (zh, ja, ko, yue) alike
    asr_skipped: Counter = field(default_factory=Counter)
    failed_by_reason: Counter = field(default_factory=Counter)
    # utterances whose every take was refused, by what validate.on_fail made of them, and by check
    refused: Counter = field(default_factory=Counter)
    refused_by_check: Counter = field(default_factory=Counter)

    def add_row(self, row: dict) -> None:
        scores = row.get("quality")
        if not scores:
            return
        if row.get("status") == KEPT:
            self.add_refused(row)
            return
        self.gated += 1
        self.respoken += row.get("respeaks", 0) > 0
        self.respeaks += row.get("respeaks", 0)
        self.gate_seconds += scores.get("gate_seconds", 0.0)
        if scores.get("wer") is not None:
            self.wers[float(scores["wer"])] += 1
        elif scores.get("cer") is not None:
            self.cers[float(scores["cer"])] += 1
        elif str(scores.get("asr", "")).startswith("skipped"):
            self.asr_skipped[scores["asr"].partition(": ")[2]] += 1

    def add_failure(self, row: dict) -> None:
        """`wer`, `silence`, `short`, ... for takes the gate refused; `error` for errors and crashes."""
        if row.get("status") == "failed":
            self.failed_by_reason[row.get("check") or "error"] += 1
            if row.get("check"):
                self.add_refused(row)

    def add_refused(self, row: dict) -> None:
        """An utterance whose every take the gate refused: a KEPT or DROPPED row, or a failed one."""
        fate = {KEPT: "kept", DROPPED: "dropped"}.get(row.get("status"), "failed")
        self.refused[fate] += 1
        self.refused_by_check[row.get("check") or (row.get("refused") or {}).get("check") or "?"] += 1

    def add(self, other: QualityTally) -> None:
        self.gated += other.gated
        self.respoken += other.respoken
        self.respeaks += other.respeaks
        self.gate_seconds += other.gate_seconds
        for name in _COUNTERS:
            getattr(self, name).update(getattr(other, name))

    def to_json(self) -> dict:
        """The tally as JSON values (a shard's, kept with its merged part); error rates as [value, rows] pairs."""
        data = {name: dict(getattr(self, name)) for name in _COUNTERS[2:]}
        data.update(sums=[self.gated, self.respoken, self.respeaks], gate_seconds=self.gate_seconds)
        data.update(wers=list(self.wers.items()), cers=list(self.cers.items()))
        return data

    @classmethod
    def from_json(cls, data: dict) -> QualityTally:
        gated, respoken, respeaks = data["sums"]
        tally = cls(gated, respoken, respeaks, data["gate_seconds"], Counter(dict(map(tuple, data["wers"]))))
        tally.cers = Counter(dict(map(tuple, data.get("cers", []))))
        for name in _COUNTERS[2:]:
            setattr(tally, name, Counter(data[name]))
        return tally

    def summary(self) -> dict | None:
        """None when the gate was off and nothing failed: no figures to give."""
        if not self.gated and not self.failed_by_reason and not self.refused:
            return None
        scored = sum(self.wers.values())
        return {
            "gated": self.gated,
            "respoken": self.respoken,
            "respoken_share": round(self.respoken / self.gated, 4) if self.gated else None,
            "respeaks": self.respeaks,
            "wer": _rate_figures(self.wers) if scored else {"scored": 0},
            **({"cer": _rate_figures(self.cers)} if self.cers else {}),
            "asr_skipped": dict(self.asr_skipped),
            "failed_by_reason": dict(self.failed_by_reason),
            "refused": {
                "utterances": sum(self.refused.values()),
                **{fate: self.refused[fate] for fate in ("kept", "dropped", "failed")},
                "by_check": dict(self.refused_by_check),
            }
            if self.refused
            else None,
            "gate_seconds": round(self.gate_seconds, 3),
        }


_COUNTERS = ("wers", "cers", "asr_skipped", "failed_by_reason", "refused", "refused_by_check")


def _rate_figures(wers: Counter) -> dict:
    """How many error rates were scored, their mean, percentiles and maximum."""
    values = np.array(sorted(wers), dtype=float)
    counts = np.array([wers[v] for v in sorted(wers)], dtype=np.int64)
    return {
        "scored": int(counts.sum()),
        "mean": _round((values * counts).sum() / counts.sum()),
        "p50": _round(percentile(values, counts, 50)),
        "p90": _round(percentile(values, counts, 90)),
        "p99": _round(percentile(values, counts, 99)),
        "max": _round(values[-1]),
    }


def percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """numpy's default (linear) percentile of the rows, given their distinct sorted values and counts."""
    position = q / 100 * (counts.sum() - 1)
    ends = np.cumsum(counts)  # rows up to and including each value
    low = int(np.searchsorted(ends, np.floor(position), side="right"))
    high = int(np.searchsorted(ends, np.ceil(position), side="right"))
    return values[low] + (values[high] - values[low]) * (position - np.floor(position))


def iter_jsonl(path):
    """The complete lines of a JSON-lines file, one at a time (read_jsonl without holding them all)."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # only a torn tail can be invalid: every writer writes whole lines


def _round(value) -> float:
    return round(float(value), 4)


# -- the page ------------------------------------------------------------------------------------

SHOWN = 200  # rows the page lists of the failed and of the re-spoken


@dataclass
class PageFigures:
    """What the page draws and lists, gathered a row at a time: memory bounded by the distinct
    durations (in milliseconds), WER values and speakers, not by the rows."""

    utterances: int = 0
    durations: Counter = field(default_factory=Counter)  # milliseconds: rows
    shortest: float | None = None
    longest: float | None = None
    wers: Counter = field(default_factory=Counter)  # WER value: rows
    speaker_seconds: Counter = field(default_factory=Counter)  # in order of first appearance
    respoken: int = 0
    respoken_rows: list = field(default_factory=list)  # the first SHOWN: (id, takes refused, heard at last)
    failed: int = 0
    failed_rows: list = field(default_factory=list)  # the first SHOWN: (id, status, reason, text)

    @classmethod
    def of(cls, rows, failures=()) -> PageFigures:
        figures = cls()
        for row in rows:
            figures.add_row(row)
        for row in failures:
            figures.add_failure(row)
        return figures

    def add_row(self, row: dict) -> None:
        seconds = row["duration"]
        self.utterances += 1
        self.durations[round(seconds * 1000)] += 1
        self.shortest = seconds if self.shortest is None else min(self.shortest, seconds)
        self.longest = seconds if self.longest is None else max(self.longest, seconds)
        wer = (row.get("quality") or {}).get("wer")
        if wer is not None:
            self.wers[wer] += 1
        self.speaker_seconds[row.get("speaker") or "?"] += seconds
        if row.get("respeaks"):
            self.respoken += 1
            if len(self.respoken_rows) < SHOWN:
                refused = "; ".join(row.get("respoken_for", []))
                self.respoken_rows.append((row["id"], refused, row["quality"].get("heard", "")))

    def add_failure(self, row: dict) -> None:
        if row.get("status") in ("failed", KEPT, DROPPED):  # skipped turns apart
            self.failed += 1
            if len(self.failed_rows) < SHOWN:
                self.failed_rows.append((row["id"], row.get("status"), row.get("reason"), row.get("text")))

    def duration_histogram(self) -> tuple[list, list]:
        """(values, rows) for a weighted histogram, each value kept inside the true shortest and longest."""
        values = [min(max(ms / 1000, self.shortest), self.longest) for ms in self.durations]
        return values, list(self.durations.values())


def figures_png(figures: PageFigures, max_wer: float | None) -> bytes:
    """Durations, WER (where scored) and hours per speaker, side by side, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    values, weights = figures.duration_histogram()
    left.hist(values, bins=40, weights=weights, color="#4477aa")
    left.set(title=f"Duration of {plural(figures.utterances, 'utterance')}", xlabel="seconds", ylabel="utterances")
    scored = sum(figures.wers.values())
    if scored:
        bins = np.linspace(0, max(1.0, max(figures.wers)), 41)
        middle.hist(list(figures.wers), bins=bins, weights=list(figures.wers.values()), color="#228833")
        if max_wer is not None:
            middle.axvline(max_wer, color="#cc3311", linestyle="--", label=f"max_wer {max_wer:g}")
            middle.legend()
    else:
        middle.text(0.5, 0.5, "no ASR scores\n(validate off, or no English segments)", ha="center", va="center")
    middle.set(title=f"ASR round-trip WER ({scored} scored)", xlabel="word error rate", ylabel="utterances")
    hours = speaker_hours(figures)
    labels = chart_labels(list(hours))
    right.barh([labels[n] for n in hours], list(hours.values()), color="#aa3377")
    right.invert_yaxis()
    right.set(title="Hours per speaker", xlabel="hours")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def speaker_hours(figures: PageFigures) -> dict[str, float]:
    """Hours of audio per speaker, most first."""
    hours = {name: seconds / 3600 for name, seconds in figures.speaker_seconds.items()}
    return dict(sorted(hours.items(), key=lambda item: item[1], reverse=True))


def chart_labels(names: list[str]) -> dict[str, str]:
    """Each speaker's label in the chart: its name where the chart's font can draw it, else
    'speaker N' (the page's table names it). CosyVoice's SFT voices are Chinese names, which
    matplotlib's default font draws as empty boxes."""
    from matplotlib import font_manager, ft2font

    charmap = ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap()
    return {
        name: name if all(ord(c) in charmap for c in name) else f"speaker {number}"
        for number, name in enumerate(names, 1)
    }


def page(layout: Layout, figures: PageFigures, png: bytes) -> str:
    summary = read_json(layout.summary_file) or {}
    table = {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}
    quality = summary.get("quality") or {}
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>convtts report: {html.escape(str(layout.root))}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}</style>",
        f"<h1>{html.escape(str(layout.root))}</h1>",
        f"<img alt='duration and WER histograms, hours per speaker' "
        f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>",
        "<h2>Summary</h2>",
        _table(["figure", "value"], table.items()),
        "<h2>Hours per speaker</h2>",
        _speaker_table(figures),
        "<h2>Quality gate</h2>",
        _table(["figure", "value"], _flat(quality)) if quality else "<p>validate was off.</p>",
        f"<h2>Failed or refused by the gate ({figures.failed})</h2>",
        _table(["id", "status", "reason", "text"], figures.failed_rows),
        f"<h2>Re-spoken ({figures.respoken})</h2>",
        _table(["id", "takes refused", "heard at last"], figures.respoken_rows),
    ]
    return "\n".join(parts) + "\n"


def _speaker_table(figures: PageFigures) -> str:
    hours = speaker_hours(figures)
    labels = chart_labels(list(hours))
    return _table(["speaker", "in the chart", "hours"], [(n, labels[n], f"{h:.3f}") for n, h in hours.items()])


def _flat(data: dict, prefix: str = ""):
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _table(header, rows) -> str:
    def cells(tag, values):
        return "<tr>" + "".join(f"<{tag}>{html.escape(str(v))}</{tag}>" for v in values) + "</tr>"

    return "<table>" + cells("th", header) + "".join(cells("td", r) for r in rows) + "</table>"


def max_wer_of(layout: Layout) -> float | None:
    try:
        config = yaml.safe_load(layout.config_file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    validate = config.get("validate") or {}
    return validate.get("max_wer") if validate.get("enabled") else None


def write_report(layout: Layout, target=None):
    """The page from the manifest and failures read a line at a time."""
    figures = PageFigures.of(iter_jsonl(layout.manifest_file), iter_jsonl(layout.failures_file))
    target = target or layout.root / "report.html"
    text = page(layout, figures, figures_png(figures, max_wer_of(layout)))
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    return target


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="write OUT/report.html: duration and WER histograms, hours per speaker, failures"
    )
    p.add_argument("output_dir")
    args = p.parse_args(argv)
    layout = Layout(args.output_dir)
    if not layout.manifest_file.is_file():
        print(
            f"error: no manifest.jsonl in {layout.root} (run run_all.sh, or python -m convtts.results.merge, first)",
            file=sys.stderr,
        )
        return 2
    try:
        print(write_report(layout))
    except ImportError as exc:  # matplotlib: the report extra (validate has it too)
        print(
            f"error: the report needs matplotlib ({exc}): pip install matplotlib, or in the convtts checkout "
            "pip install '.[report]'",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
