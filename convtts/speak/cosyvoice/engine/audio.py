"""Decoded sequences to audio: the engine's one caller of the flow (flow.py) and the vocoder (vocoder.py)."""
from __future__ import annotations

import numpy as np
import torch

from convtts.speak.base import is_out_of_memory
from convtts.speak.cosyvoice.engine.flow import flow_batch, flow_batch_causal, length_groups
from convtts.speak.cosyvoice.engine.requests import Request, Sequence
from convtts.speak.cosyvoice.engine.vocoder import finalizes, vocode_one


class AudioStage:
    """Flow passes for decoded sequences of close lengths together, then the vocoder per sequence.

    A pass that fails is retried row by row, so only the sequence at fault fails (its request
    gets the error); a CUDA out-of-memory goes up to the caller.
    """

    def __init__(self, flow, hift, device, causal: bool):
        self.flow, self.hift, self.device = flow, hift, device
        self.batch_flow = flow_batch_causal if causal else flow_batch
        self.hift_finalizes = finalizes(hift)

    def render(self, seqs: list[Sequence], speed: float) -> None:
        """Append each sequence's audio to its request (or set the request's error)."""
        for group in length_groups(seqs):
            self._vocode(group, speed)

    def _vocode(self, seqs: list[Sequence], speed: float) -> None:
        try:
            mels = self.batch_flow(self.flow, seqs, self.device)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            if len(seqs) == 1:
                seqs[0].request.error = exc
                return
            for seq in seqs:  # find the row that fails: the others are spoken alone
                self._vocode([seq], speed)
            return
        for seq, mel in zip(seqs, mels):
            try:
                seq.request.audio.append(self._hift(seq.request, mel, speed))
            except Exception as exc:
                if is_out_of_memory(exc):
                    raise
                seq.request.error = exc

    def _hift(self, request: Request, mel: torch.Tensor, speed: float) -> np.ndarray:
        return vocode_one(self.hift, request, mel, speed, self.hift_finalizes)
