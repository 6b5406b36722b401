"""The HiFT vocoder: a decoded row's mel to its samples, as upstream's non-streaming call makes them."""
from __future__ import annotations

import inspect

import numpy as np
import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.requests import Request, own_random_stream


def finalizes(hift) -> bool:
    """v3's HiFT takes `finalize`; v1's and v2's take a source cache."""
    return "finalize" in inspect.signature(hift.inference).parameters


def vocode_one(hift, request: Request, mel: torch.Tensor, speed: float, takes_finalize: bool) -> np.ndarray:
    """Upstream's non-streaming vocoder call for one utterance, its noise drawn from the utterance's seed."""
    if speed != 1.0:
        mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
    if mel.device.type == "cuda":
        torch.cuda.manual_seed(request.seed)  # the vocoder's noise, drawn on the GPU
    with own_random_stream(request):
        if takes_finalize:
            speech, _ = hift.inference(speech_feat=mel, finalize=True)
        else:
            speech, _ = hift.inference(speech_feat=mel, cache_source=torch.zeros(1, 1, 0))
    return speech.float().cpu().numpy().reshape(-1)
