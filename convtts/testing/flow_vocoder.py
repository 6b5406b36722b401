"""The batched engine's flow and vocoder on decoded rows under a chosen setting, against each row alone in eager fp32.

For the tests (tiny random models on a CPU) and bench/flow_vocoder.py (full-size random models on
a GPU). Rows are what the decode hands the flow: speech tokens (random here, of chosen lengths)
and the frontend's flow inputs (v1: an SFT speaker embedding; v2/v3: a zero-shot prompt's tokens
and mel features and a speaker embedding, of the shapes the frontend makes). The reference is
each row alone through the eager fp32 flow (upstream's estimator) and upstream's vocoder call:
what the engine gives a row with every new path switched off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from convtts.speak.cosyvoice.engine.flow import Flow
from convtts.speak.cosyvoice.engine.requests import Request, Row
from convtts.speak.cosyvoice.engine.solver import ROW_BUCKETS, Captured, GraphCache
from convtts.speak.cosyvoice.engine.vocoder import Vocoder, finalizes, vocode_one


@dataclass(frozen=True)
class Setting:
    """How the flow and the vocoder run (the engine's tts.cosyvoice options, and `bucket` for CPU tests)."""

    name: str
    flow: str = "fp32"  # precision of the flow
    vocoder: str = "fp32"  # precision of the vocoder
    graphs: bool = False
    compile: bool = False
    bucket: bool | None = None  # True: pad passes to the graphs' buckets even without a GPU
    vocoder_rows: int = 16  # 1: upstream's call per row
    max_mb: int = 4096
    max_graphs: int = 32
    spread: float = 1.25  # longest over shortest row in one flow pass
    frame_buckets: int = 8  # widths a doubling of frames is cut into (bucketed passes)
    graph_stand_in: bool = False  # bucketed passes through the graph cache, a graph re-running its step (CPU)
    row_buckets: tuple[int, ...] = ROW_BUCKETS  # the rows a bucketed pass is padded up to


@dataclass
class Rendering:
    audio: list[np.ndarray]
    flow_seconds: float = 0.0
    vocoder_seconds: float = 0.0
    flow_peak_mb: float = 0.0
    vocoder_peak_mb: float = 0.0


def flow_inputs(model, prompt_seconds: float, seed: int = 0) -> dict:
    """The chunk dict the flow reads: an SFT speaker (v1) or a zero-shot prompt of that length (v2/v3)."""
    inner = model.model
    rng = torch.Generator().manual_seed(seed)
    chunk = {"flow_embedding": torch.randn(1, 192, generator=rng).to(inner.device)}
    if type(inner.flow).__name__ != "MaskedDiffWithXvec" and prompt_seconds > 0:
        tokens = int(prompt_seconds * inner.flow.input_frame_rate)
        chunk["flow_prompt_speech_token"] = torch.randint(
            0, inner.flow.vocab_size, (1, tokens), generator=rng, dtype=torch.int32
        ).to(inner.device)
        chunk["prompt_speech_feat"] = torch.randn(1, tokens * inner.flow.token_mel_ratio, 80, generator=rng).to(
            inner.device
        )
    return chunk


def token_lists(model, seconds: list[float], seed: int = 0) -> list[list[int]]:
    """Random speech tokens for rows of these durations."""
    flow = model.model.flow
    rng = np.random.default_rng(seed)
    return [rng.integers(0, flow.vocab_size, max(1, int(s * flow.input_frame_rate))).tolist() for s in seconds]


def make_rows(chunk: dict, tokens: list[list[int]], seed: int = 1000) -> list[Row]:
    """Fresh rows (each request's random stream at its seed) for these token lists."""
    return [
        Row(Request(i, [chunk], seed + i), chunk, index=0, min_len=0, max_len=0, kept=list(t))
        for i, t in enumerate(tokens)
    ]


class StandInGraphs(GraphCache):
    """The flow's graph cache where a 'graph' re-runs the captured step on the buffers it was captured
    with, which is what a CUDA graph replays: the bucketed passes' own path (shared input buffers, the
    step in place, each step's t and dt) on a machine without a GPU."""

    def _capture(self, key, inputs: tuple, step: tuple) -> Captured:
        run = self.step

        class Graph:
            def replay(self) -> None:
                run(*inputs, *step)

        entry = self.graphs[key] = Captured(Graph(), inputs, step)
        self.captures += 1
        return entry


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def build(model, setting: Setting) -> tuple[Flow, Vocoder]:
    """The engine's flow and vocoder under `setting`; keep them across runs (CUDA graphs live in them)."""
    inner = model.model
    flow = Flow(
        inner.flow,
        setting.flow,
        inner.device,
        graphs=setting.graphs,
        compile=setting.compile,
        max_graphs=setting.max_graphs,
        max_mb=setting.max_mb,
        bucket=setting.bucket,
        spread=setting.spread,
        frame_buckets=setting.frame_buckets,
        row_buckets=setting.row_buckets,
    )
    if setting.graph_stand_in:
        flow.solver.graphs = StandInGraphs(flow.solver._step, setting.max_graphs)
    return flow, Vocoder(inner.hift, setting.vocoder, setting.vocoder_rows, setting.max_mb)


def render(model, chunk: dict, tokens: list[list[int]], setting: Setting, parts: tuple | None = None) -> Rendering:
    """Every row's audio through the engine's flow passes and vocoder under `setting`, timed per part."""
    flow, vocoder = parts or build(model, setting)
    rows, device = make_rows(chunk, tokens), model.model.device
    mels = flow_mels(flow, rows, device)
    out = vocode(vocoder, rows, mels.mels, device)
    out.flow_seconds, out.flow_peak_mb = mels.flow_seconds, mels.flow_peak_mb
    return out


@dataclass
class Mels:
    mels: list[torch.Tensor]  # in the order of the rows
    flow_seconds: float = 0.0
    flow_peak_mb: float = 0.0


def flow_mels(flow: Flow, rows: list[Row], device) -> Mels:
    """The engine's flow passes for decoded rows (close lengths together), timed."""
    out, mels = Mels([]), {}
    with torch.inference_mode():
        for group in flow.groups(rows):
            group_mels, seconds, peak = timed(lambda group=group: flow.mels(group), device)
            mels.update({row.request.key: mel for row, mel in zip(group, group_mels)})
            out.flow_seconds += seconds
            out.flow_peak_mb = max(out.flow_peak_mb, peak)
    out.mels = [mels[row.request.key] for row in rows]
    return out


def vocode(vocoder: Vocoder, rows: list[Row], mels: list[torch.Tensor], device) -> Rendering:
    """The engine's vocoder for all rows of a flush, timed; a row's failure is raised."""
    with torch.inference_mode():
        samples, seconds, peak = timed(lambda: vocoder.speak([row.request for row in rows], mels, 1.0), device)
    for result in samples:
        if isinstance(result, BaseException):
            raise result
    return Rendering(samples, vocoder_seconds=seconds, vocoder_peak_mb=peak)


def timed(fn, device):
    """fn's result, its seconds (GPU work included) and the peak MiB allocated meanwhile (0 on a CPU)."""
    cuda = torch.device(device).type == "cuda"
    synchronize(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    started = time.perf_counter()
    result = fn()
    synchronize(device)
    seconds = time.perf_counter() - started
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else 0.0
    return result, seconds, peak


def reference(model, chunk: dict, tokens: list[list[int]]) -> list[np.ndarray]:
    """Each row alone: the eager fp32 flow (upstream's estimator on an unpadded pass) and upstream's vocoder."""
    inner = model.model
    flow = Flow(inner.flow, "fp32", inner.device)
    audio = []
    with torch.inference_mode():
        for row in make_rows(chunk, tokens):
            mel = flow.mels([row])[0]
            audio.append(vocode_one(inner.hift, row.request, mel, 1.0, finalizes(inner.hift)))
    return audio


def deviation(audio: list[np.ndarray], ref: list[np.ndarray]) -> float:
    """Largest sample difference over all rows, in full-scale units (1.0 = the clip level);
    inf when any row's length differs."""
    if len(audio) != len(ref) or any(len(a) != len(r) for a, r in zip(audio, ref)):
        return float("inf")
    return max(float(np.abs(a - r).max()) for a, r in zip(audio, ref))


def audio_seconds(audio: list[np.ndarray], sample_rate: int) -> float:
    return sum(len(a) for a in audio) / sample_rate


def each_alone(forward, frames: list[int], x, mask, mu, t, spks, cond) -> list[torch.Tensor]:
    """An estimator's output for each row of a padded batch run alone at its own `frames` (the rows'
    reference: what a padded pass must give each of them)."""
    return [
        forward(
            x[i : i + 1, :, :n],
            mask[i : i + 1, :, :n],
            mu[i : i + 1, :, :n],
            t[i : i + 1],
            spks[i : i + 1],
            cond[i : i + 1, :, :n],
        )[0]
        for i, n in enumerate(frames)
    ]
