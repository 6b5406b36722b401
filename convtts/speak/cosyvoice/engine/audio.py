"""Decoded sequences to audio: the engine's one caller of the flow (flow.py) and the vocoder (vocoder.py)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from convtts.config import CosyVoiceConfig, PrecisionConfig
from convtts.speak.base import is_out_of_memory
from convtts.speak.cosyvoice.engine.flow import Flow, pass_costs
from convtts.speak.cosyvoice.engine.requests import Sequence, place
from convtts.speak.cosyvoice.engine.vocoder import Vocoder


@contextmanager
def _untimed(stage: str):
    yield


class AudioStage:
    """Flow passes for decoded sequences of close lengths together, then the vocoder for all of them
    (its passes take rows of close lengths across the flow's groups).

    A flow pass that fails is retried row by row, so only the sequence at fault fails (its request
    gets the error); a CUDA out-of-memory goes up to the caller.
    """

    def __init__(self, flow, hift, device, precision: PrecisionConfig, settings: CosyVoiceConfig):
        self.flow_pass = Flow.configured(flow, precision.flow, settings, device)
        costs = pass_costs(flow, settings.flow, device)[1]  # this GPU kind's (profiles.py)
        self.vocoder = Vocoder.configured(hift, precision.vocoder, settings, costs)

    def render(self, seqs: list[Sequence], speed: float, tail: bool = False, timer=None) -> None:
        """Append each sequence's audio to its request (or set the request's error); `tail`: the
        caller has no more input, its flow passes may be wider (flow.tail_spread). `timer`: the
        engine's StageTimer, which counts the flow and the vocoder apart (unsynchronised, the flow's
        GPU work still queued when the vocoder reads its audio back counts as the vocoder's)."""
        timer = timer or _untimed
        with timer("flow"):
            done = [pair for group in self.flow_pass.groups(seqs, tail) for pair in self._mels(group)]
        streams, mels = [seq.stream for seq, _ in done], [mel for _, mel in done]
        with timer("vocoder"):
            spoken = self.vocoder.speak(streams, mels, speed)
        for (seq, _), audio in zip(done, spoken):
            if isinstance(audio, BaseException):
                seq.request.error = audio
            else:
                place(seq.request.audio, seq.index, audio)

    def _mels(self, seqs: list[Sequence]) -> list[tuple[Sequence, torch.Tensor]]:
        """(sequence, mel) for the sequences whose flow pass worked."""
        try:
            return list(zip(seqs, self.flow_pass.mels(seqs)))
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            if len(seqs) == 1:
                seqs[0].request.error = exc
                return []
            return [pair for seq in seqs for pair in self._mels([seq])]  # the others are spoken alone
