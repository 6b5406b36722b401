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
import yaml

from convtts.state.layout import Layout
from convtts.state.shardio import DROPPED, KEPT, read_json, read_jsonl
from convtts.words import plural


@dataclass
class QualityTally:
    """What the quality gate said about the rows and failures merge writes."""

    gated: int = 0
    respoken: int = 0
    respeaks: int = 0
    gate_seconds: float = 0.0
    wers: list = field(default_factory=list)
    cers: list = field(default_factory=list)  # character error rates: zh, ja, ko, yue
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
            self.wers.append(scores["wer"])
        elif scores.get("cer") is not None:
            self.cers.append(scores["cer"])
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

    def summary(self) -> dict | None:
        """None when the gate was off and nothing failed: no figures to give."""
        if not self.gated and not self.failed_by_reason and not self.refused:
            return None
        return {
            "gated": self.gated,
            "respoken": self.respoken,
            "respoken_share": round(self.respoken / self.gated, 4) if self.gated else None,
            "respeaks": self.respeaks,
            "wer": _spread(self.wers),
            **({"cer": _spread(self.cers)} if self.cers else {}),
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


def _spread(values: list) -> dict:
    """How many error rates were scored, their mean, percentiles and maximum."""
    rates = np.asarray(values, dtype=float)
    if not rates.size:
        return {"scored": 0}
    figures = {"scored": int(rates.size), "mean": _round(rates.mean())}
    figures.update({f"p{q}": _round(np.percentile(rates, q)) for q in (50, 90, 99)})
    return {**figures, "max": _round(rates.max())}


def _round(value) -> float:
    return round(float(value), 4)


# -- the page ------------------------------------------------------------------------------------


def figures_png(rows: list[dict], max_wer: float | None) -> bytes:
    """Durations, WER (where scored) and hours per speaker, side by side, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    left.hist([r["duration"] for r in rows], bins=40, color="#4477aa")
    left.set(title=f"Duration of {plural(len(rows), 'utterance')}", xlabel="seconds", ylabel="utterances")
    wers = [r["quality"]["wer"] for r in rows if (r.get("quality") or {}).get("wer") is not None]
    if wers:
        middle.hist(wers, bins=np.linspace(0, max(1.0, max(wers)), 41), color="#228833")
        if max_wer is not None:
            middle.axvline(max_wer, color="#cc3311", linestyle="--", label=f"max_wer {max_wer:g}")
            middle.legend()
    else:
        middle.text(0.5, 0.5, "no ASR scores\n(validate off, or no English segments)", ha="center", va="center")
    middle.set(title=f"ASR round-trip WER ({len(wers)} scored)", xlabel="word error rate", ylabel="utterances")
    hours = speaker_hours(rows)
    labels = chart_labels(list(hours))
    right.barh([labels[n] for n in hours], list(hours.values()), color="#aa3377")
    right.invert_yaxis()
    right.set(title="Hours per speaker", xlabel="hours")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def speaker_hours(rows: list[dict]) -> dict[str, float]:
    """Hours of audio per speaker, most first."""
    hours = Counter()
    for r in rows:
        hours[r.get("speaker") or "?"] += r["duration"] / 3600
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


def page(layout: Layout, rows: list[dict], failures: list[dict], png: bytes) -> str:
    summary = read_json(layout.summary_file) or {}
    figures = {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}
    quality = summary.get("quality") or {}
    failed = [f for f in failures if f.get("status") in ("failed", KEPT, DROPPED)]  # skipped turns apart
    respoken = [r for r in rows if r.get("respeaks")]
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>convtts report: {html.escape(str(layout.root))}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}</style>",
        f"<h1>{html.escape(str(layout.root))}</h1>",
        f"<img alt='duration and WER histograms, hours per speaker' "
        f"src='data:image/png;base64,{base64.b64encode(png).decode()}'>",
        "<h2>Summary</h2>",
        _table(["figure", "value"], figures.items()),
        "<h2>Hours per speaker</h2>",
        _speaker_table(rows),
        "<h2>Quality gate</h2>",
        _table(["figure", "value"], _flat(quality)) if quality else "<p>validate was off.</p>",
        f"<h2>Failed or refused by the gate ({len(failed)})</h2>",
        _table(
            ["id", "status", "reason", "text"],
            [(f["id"], f.get("status"), f.get("reason"), f.get("text")) for f in failed[:200]],
        ),
        f"<h2>Re-spoken ({len(respoken)})</h2>",
        _table(
            ["id", "takes refused", "heard at last"],
            [(r["id"], "; ".join(r.get("respoken_for", [])), r["quality"].get("heard", "")) for r in respoken[:200]],
        ),
    ]
    return "\n".join(parts) + "\n"


def _speaker_table(rows: list[dict]) -> str:
    hours = speaker_hours(rows)
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
    rows = read_jsonl(layout.manifest_file)
    failures = read_jsonl(layout.failures_file) if layout.failures_file.is_file() else []
    target = target or layout.root / "report.html"
    text = page(layout, rows, failures, figures_png(rows, max_wer_of(layout)))
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
