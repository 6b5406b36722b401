"""The HiFT vocoder for the engine: decoded rows' mels to samples, several rows per pass, each with its own noise.

A pass of one row is upstream's own non-streaming call (vocode_one). Larger passes run the
masked re-drive of hift.py on a copy of HiFT with its weight norms folded (and its convolutions
cast for bf16/fp16). Each row's noise is drawn from its own utterance's seed, in the shapes and
order upstream draws it (v1: random phases on the CPU stream, then Gaussian noise; v2: initial
phases, then noise; v3: fixed buffers), so a row's audio does not depend on its pass: it matches
its solo rendering within 1e-5 of full scale in fp32 (float rounding of differently shaped kernels).
"""

from __future__ import annotations

import inspect
import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributions.uniform import Uniform

from convtts.speak.base import is_out_of_memory
from convtts.speak.cosyvoice.engine import snake
from convtts.speak.cosyvoice.engine.flow import SPREAD, cheapest_groups, length_groups
from convtts.speak.cosyvoice.engine.hift import samples_per_frame, vocode_rows
from convtts.speak.cosyvoice.engine.pass_memory import hift_widths, rows_within, vocoder_bytes_per_sample
from convtts.speak.cosyvoice.engine.precision import cast_copy, matmul_mode
from convtts.speak.cosyvoice.engine.profiles import PassCosts
from convtts.speak.cosyvoice.engine.requests import Stream, own_random_stream

log = logging.getLogger(__name__)


def finalizes(hift) -> bool:
    """v3's HiFT takes `finalize`; v1's and v2's take a source cache."""
    return "finalize" in inspect.signature(hift.inference).parameters


def stretch(mel: torch.Tensor, speed: float) -> torch.Tensor:
    """Upstream's speed change: the mel resampled in time before the vocoder."""
    return mel if speed == 1.0 else F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")


def vocode_one(hift, stream: Stream, mel: torch.Tensor, speed: float, takes_finalize: bool) -> np.ndarray:
    """Upstream's non-streaming vocoder call for one utterance, its noise drawn from the utterance's seed."""
    mel = stretch(mel, speed)
    if mel.device.type == "cuda":
        torch.cuda.manual_seed(stream.seed)  # the vocoder's noise, drawn on the GPU
    with own_random_stream(stream):
        if takes_finalize:
            speech, _ = hift.inference(speech_feat=mel, finalize=True)
        else:
            speech, _ = hift.inference(speech_feat=mel, cache_source=torch.zeros(1, 1, 0))
    return speech.float().cpu().numpy().reshape(-1)


def draw_noise(gen, stream: Stream, samples: int, device) -> dict:
    """One row's noise as upstream draws it for `samples` samples, from its streams (its utterance's, or
    its chunk's where the chunks of an utterance decode together).

    SineGen (v1): phases (CPU), harmonics' noise, then the unused noise branch; SineGen2 (v2):
    initial phases, noise, noise branch. The unused draws are made all the same: a CPU run
    goes on to sample the utterance's next chunk from the same stream.
    """
    harmonics = gen.harmonic_num + 1
    if torch.device(device).type == "cuda":
        torch.cuda.manual_seed(stream.seed)
    with own_random_stream(stream):
        if type(gen).__name__ == "SineGen":
            phase = Uniform(low=-np.pi, high=np.pi).sample(sample_shape=(1, harmonics, 1)).to(device)
            phase[:, 0, :] = 0
            noise = {"phase": phase, "sine": torch.randn(1, harmonics, samples, device=device)}
        else:
            initial = torch.rand(1, harmonics, device=device)
            initial[:, 0] = 0
            # upstream draws randn_like of a transposed view: same layout, same normal_ kernel, same numbers
            sine = torch.empty(1, harmonics, samples, device=device).transpose(1, 2).normal_()
            noise = {"initial": initial, "sine": sine}
        torch.randn(1, samples, 1, device=device)  # the noise branch upstream draws and the vocoder never reads
    return noise


def fixed_noise(gen, samples: int, device) -> dict:
    """v3's causal SineGen2: the same initial phases and noise buffer for every utterance."""
    return {"initial": gen.rand_ini.to(device), "sine": gen.sine_waves[:, :samples].to(device)}


def batch_noise(gen, rows: list[dict], samples: int) -> dict:
    """Rows' noise stacked, the per-sample noise padded with zeros to `samples` (SineGen keeps time
    last, SineGen2 in the middle)."""
    time = 2 if type(gen).__name__ == "SineGen" else 1
    out = {key: torch.cat([noise[key] for noise in rows]) for key in rows[0] if key != "sine"}
    padded = []
    for noise in rows:
        extra = samples - noise["sine"].shape[time]
        padded.append(F.pad(noise["sine"], (0, extra) if time == 2 else (0, 0, 0, extra)))
    out["sine"] = torch.cat(padded)
    return out


class Vocoder:
    """One engine's vocoder: passes of up to `max_rows` rows (fewer when long: `max_mb` bounds a pass)."""

    def __init__(
        self, hift, precision: str = "fp32", max_rows: int = 16, max_mb: int = 4096, costs: PassCosts | None = None
    ):
        self.hift, self.precision = hift, precision
        self.max_rows, self.max_mb = max_rows, max_mb
        self.costs = costs  # None: passes of close lengths (within SPREAD)
        self.takes_finalize = finalizes(hift)
        # a copy with folded weight norms (and cast convolutions); upstream's own serves passes of one
        self.twin = (
            cast_copy(hift, precision, keep_fp32=("f0_predictor", "m_source"), fold=True) if max_rows > 1 else None
        )
        if self.twin is not None:
            snake.fuse(self.twin)  # its Snakes one kernel each where Triton runs
        self.per_sample = vocoder_bytes_per_sample(hift_widths(hift), precision)
        self.last_passes: list[int] = []  # rows of each pass of the last call (for benchmarks)
        self.passes, self.alone = 0, 0  # passes so far, and how many of them held one row (upstream's call)

    @classmethod
    def configured(cls, hift, precision: str, cosy, costs: PassCosts | None = None) -> Vocoder:
        """The vocoder as tts.cosyvoice configures it (flow.vocoder_rows, flow.max_mb), its passes cut by
        `costs` (flow.pass_costs; None: by SPREAD)."""
        return cls(hift, precision, cosy.flow.vocoder_rows, cosy.flow.max_mb, costs)

    def speak(self, streams: list[Stream], mels: list[torch.Tensor], speed: float) -> list:
        """Each row's samples (1-D float32 numpy), or the exception that row's vocoding raised."""
        out: list = [None] * len(mels)
        passes = self._passes([stretch(m, speed).shape[2] for m in mels])
        self.last_passes = [len(index) for index in passes]
        self.passes += len(passes)
        self.alone += sum(len(index) == 1 for index in passes)
        for index in passes:
            if len(index) == 1:
                out[index[0]] = self._one(streams[index[0]], mels[index[0]], speed)
                continue
            chosen = [streams[i] for i in index]
            states = [r.generator.get_state() for r in chosen]
            try:
                audio = self._batch(chosen, [stretch(mels[i], speed) for i in index])
            except Exception as exc:
                if is_out_of_memory(exc):
                    raise
                log.warning(
                    "a vocoder pass of %d rows failed (%s: %s); vocoding them one at a time",
                    len(index),
                    type(exc).__name__,
                    exc,
                )
                for stream, state in zip(chosen, states):
                    stream.generator.set_state(state)
                audio = [self._one(streams[i], mels[i], speed) for i in index]
            for i, samples in zip(index, audio):
                out[i] = samples
        return out

    def _passes(self, frames: list[int]) -> list[list[int]]:
        """Row indices per pass, each within max_rows and the memory budget: the cheapest cut by the
        passes' costs, or close lengths together (within SPREAD)."""
        spf = samples_per_frame(self.hift)

        def cap(length: int) -> int:
            return min(self.max_rows, rows_within(self.max_mb, length * spf * self.per_sample / 2**20))

        rows = list(range(len(frames)))
        if self.costs is None:
            return length_groups(rows, frames.__getitem__, cap, SPREAD)
        return cheapest_groups(rows, frames.__getitem__, lambda n, longest: self.costs.seconds(n * longest), cap)

    def _one(self, stream: Stream, mel: torch.Tensor, speed: float):
        try:
            return vocode_one(self.hift, stream, mel, speed, self.takes_finalize)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            return exc

    def _batch(self, streams: list[Stream], mels: list[torch.Tensor]) -> list[np.ndarray]:
        device = mels[0].device
        gen = self.twin.m_source.l_sin_gen
        samples = [m.shape[2] * samples_per_frame(self.twin) for m in mels]
        if getattr(gen, "causal", False):
            noise = fixed_noise(gen, max(samples), device)
        else:
            noise = batch_noise(gen, [draw_noise(gen, r, n, device) for r, n in zip(streams, samples)], max(samples))
        with matmul_mode(self.precision):
            audio, lengths = vocode_rows(self.twin, mels, noise)
        audio = host_copy(audio)  # one copy off the GPU for the pass
        return [audio[i, :n].copy() for i, n in enumerate(lengths)]


def host_copy(audio: torch.Tensor) -> np.ndarray:
    """A pass's audio in fp32 on the host. From a GPU it goes through page-locked memory (torch's host cache
    keeps the buffer for the next pass): copied into pageable memory, the 61 MB of an H100's pass of 64
    rows of 10 s took 37 ms (1.7 GB/s) of its 300 ms."""
    if audio.device.type != "cuda":
        return audio.float().numpy()
    host = torch.empty(audio.shape, dtype=torch.float32, pin_memory=True)
    host.copy_(audio)
    return host.numpy()
