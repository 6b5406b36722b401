"""The quality gate's GPU recogniser: Whisper through transformers, many takes per call, greedy, in their language.

A local checkpoint directory (validate.model_path, as released: config.json, model.safetensors,
generation_config.json, the tokenizer and feature-extractor files); nothing is downloaded. On CUDA
the weights run in validate.asr_precision (bf16 by default), on the CPU in fp32.

Whisper hears 30 s at a time and pads a shorter take to 30 s, so a 2.5 s take costs the encoder
as much as a 30 s one. With validate.asr_pack (off by default) short takes are packed in
order into shared windows, 0.5 s of silence apart, and the gate shares each window's transcript out
among its takes (convtts/gate/quality.py: split_heard). Each call turns up to validate.asr_batch
windows into log-mel features together (on the model's device), runs the encoder once for all of
them and decodes them together, greedily, as Whisper's own generate() does with the takes' language, task
transcribe and no timestamps. Each row stops at end-of-text or at a length bound taken from its
audio's duration (for a packed window, the sum of its takes' bounds), so a take that babbles, or a
random-weight decoder, cannot run to the model's 448 positions.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from convtts.config import ValidateConfig
from convtts.counts import plural

log = logging.getLogger(__name__)

RATE = 16000
WINDOW = 30 * RATE  # Whisper hears 30 s at a time; a longer take is cut into windows, their texts joined
GAP = RATE // 2  # silence between packed takes: the last word of one is not heard running into the next
TOKENS_PER_SECOND = 7  # about 5 words a second, faster than people speak; 10 more for a short take's tail
SPARE_TOKENS = 10
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Steps between looks at whether every row is done: each look waits for the GPU, and with a dozen
# workers' kernels queued under MPS that wait is long; a done row only repeats end-of-text meanwhile.
DONE_CHECK = 8


def token_limit(samples: int, room: int) -> int:
    """How many tokens a window of `samples` (16 kHz) may decode into, at most `room`."""
    return min(room, math.ceil(samples / RATE * TOKENS_PER_SECOND) + SPARE_TOKENS)


def windows(audio: np.ndarray) -> list[np.ndarray]:
    """The take in windows of at most 30 s (one, almost always: segments are short)."""
    return [audio[start : start + WINDOW] for start in range(0, max(len(audio), 1), WINDOW)]


def pack_takes(lengths: list[int]) -> list[list[int]]:
    """The takes (by number, from their lengths at 16 kHz) grouped into windows, in order: each take
    after the one before it and GAP, a take longer than the room left opening a new window. A take
    over 30 s is a group of its own (heard in 30 s windows, as unpacked)."""
    groups: list[list[int]] = []
    used = 0
    for number, length in enumerate(lengths):
        if not groups or used + length > WINDOW:
            groups.append([])
            used = 0
        groups[-1].append(number)
        used += length + GAP  # past WINDOW after a long take: the next take opens a new window
    return groups


class Heard(NamedTuple):
    """A packed window's transcript and the takes it holds (their numbers in the call, in order)."""

    takes: tuple[int, ...]
    text: str


def pick_device(cfg: ValidateConfig) -> str:
    import torch

    if cfg.asr_device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.asr_device


class TransformersWhisper:
    """Whisper (transformers) on a local checkpoint directory, batched, on the worker's GPU when it has one."""

    def __init__(self, cfg: ValidateConfig):
        import torch
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

        started = time.time()
        self.device = pick_device(cfg)
        self.dtype = getattr(torch, DTYPES[cfg.asr_precision]) if self.device != "cpu" else torch.float32
        path = cfg.model_path
        self.model = (
            WhisperForConditionalGeneration.from_pretrained(path, dtype=self.dtype, local_files_only=True)
            .to(self.device)
            .eval()
        )
        self.features = WhisperFeatureExtractor.from_pretrained(path, local_files_only=True)
        self.tokenizer = WhisperTokenizer.from_pretrained(path, local_files_only=True)
        self.batch = cfg.asr_batch
        self._token_rules()
        self.static = self._static_decoder() if cfg.asr_graphs else None
        log.info(
            "Whisper from %s on %s in %s, %s a batch, loaded in %.1fs",
            path,
            self.device,
            str(self.dtype).removeprefix("torch."),
            plural(self.batch, "window"),
            time.time() - started,
        )

    def _token_rules(self) -> None:
        """The decoder's prompt and what it may not say, from the checkpoint's generation config."""
        import torch

        settings, tokens = self.model.generation_config, self.tokenizer.convert_tokens_to_ids
        self.end = tokens("<|endoftext|>")
        self.multilingual = getattr(settings, "is_multilingual", True)
        self.language_ids = dict(getattr(settings, "lang_to_id", None) or {})
        task = [tokens("<|en|>"), tokens("<|transcribe|>")] if self.multilingual else []
        self.prompt = [
            tokens("<|startoftranscript|>"),
            *task,
            tokens("<|notimestamps|>"),
        ]  # an .en model: no task tokens
        vocab = self.model.config.vocab_size
        # Text only: no special token or timestamp after the prompt, and the checkpoint's own list
        # (the released ones suppress symbols Whisper was not trained to say).
        never = set(getattr(settings, "suppress_tokens", None) or []) | set(range(self.end + 1, vocab))
        first = set(getattr(settings, "begin_suppress_tokens", None) or []) | {self.end}
        self.never = torch.tensor(sorted(t for t in never if t < vocab), device=self.device)
        self.first = torch.tensor(sorted(t for t in first if t < vocab), device=self.device)
        self.room = self.model.config.max_target_positions - len(self.prompt)

    def _static_decoder(self):
        from convtts.gate.whisper_static import StaticDecoder

        return StaticDecoder(self.model, self.batch, self.prompt, self.end, self.never, self.first)

    def hears(self, language: str) -> bool:
        if not self.multilingual:
            return language == "en"
        return f"<|{language}|>" in self.language_ids if self.language_ids else True

    def prompt_for(self, language: str) -> list[int]:
        """The decoder's prompt with the take's language in place of English (an .en model: as it is)."""
        if not self.multilingual or language == "en":
            return self.prompt
        return [self.prompt[0], self.language_ids[f"<|{language}|>"], *self.prompt[2:]]

    def transcribe(self, audio16k: np.ndarray, language: str = "en") -> str:
        return self.transcribe_many([audio16k], language=language)[0]

    def transcribe_many(self, takes: list[np.ndarray], pack: bool = False, language: str = "en") -> list:
        """A transcript per take (16 kHz mono float, all in `language`), asr_batch windows at a time. With
        `pack`, takes share windows (pack_takes), and the answer is a Heard per window, naming its takes."""
        prompt = self.prompt_for(language)
        groups = pack_takes([len(take) for take in takes]) if pack else [[number] for number in range(len(takes))]
        pieces = [
            (number, audio, limit)
            for number, group in enumerate(groups)
            for audio, limit in self._windows(group, takes)
        ]
        texts = [""] * len(groups)
        for start in range(0, len(pieces), self.batch):
            part = pieces[start : start + self.batch]
            heard = self._recognise([audio for _, audio, _ in part], [limit for _, _, limit in part], prompt)
            for (number, _, _), text in zip(part, heard):
                texts[number] = f"{texts[number]} {text.strip()}".lstrip()
        if not pack:
            return texts
        return [Heard(tuple(group), text) for group, text in zip(groups, texts)]

    def _windows(self, group: list[int], takes: list[np.ndarray]) -> list[tuple[np.ndarray, int]]:
        """A group's windows with their token bounds: a take alone in its 30 s windows, as unpacked;
        takes packed together GAP apart in one, bounded by the sum of their own bounds, so that each
        has the room it would have alone."""
        if len(group) == 1:
            return [(window, token_limit(len(window), self.room)) for window in windows(takes[group[0]])]
        silence = np.zeros(GAP, np.float32)
        audio = np.concatenate([part for number in group for part in (silence, takes[number])][1:])
        return [(audio, min(self.room, sum(token_limit(len(takes[number]), self.room) for number in group)))]

    def _recognise(self, audio: list[np.ndarray], limits: list[int], prompt: list[int] | None = None) -> list[str]:
        import torch

        with torch.inference_mode():
            tokens = self._decode(self._encode(self._features(audio)), limits, prompt)
        return self.tokenizer.batch_decode(tokens, skip_special_tokens=True)

    def _features(self, audio: list[np.ndarray]):
        """Log-mel features of each window, padded to 30 s (computed on the model's device)."""
        return self.features(audio, sampling_rate=RATE, return_tensors="pt", device=self.device).input_features

    def _encode(self, features):
        return self.model.model.encoder(features.to(self.device, self.dtype)).last_hidden_state

    def _decode(self, encoded, limits: list[int], prompt: list[int] | None = None) -> list[list[int]]:
        """Each row's tokens: over static buffers (asr_graphs), else over transformers' cache; `prompt`:
        the decoder's prompt for the rows' language (None: English's)."""
        prompt = prompt or self.prompt
        if self.static is not None:
            return self.static.decode(encoded, limits, prompt)
        return self._decode_cached(encoded, limits, prompt)

    def _decode_cached(self, encoded, limits: list[int], prompt: list[int] | None = None) -> list[list[int]]:
        """Greedy decoding of every row together, over one cache; a row is done at end-of-text or its limit."""
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        rows, device = len(limits), self.device
        encoder = BaseModelOutput(last_hidden_state=encoded)
        step_input = torch.tensor([prompt or self.prompt] * rows, device=device)
        limit = torch.tensor(limits, device=device)
        done = torch.zeros(rows, dtype=torch.bool, device=device)
        cache, said = None, []
        for step in range(max(limits)):
            out = self.model(
                encoder_outputs=encoder, decoder_input_ids=step_input, past_key_values=cache, use_cache=True
            )
            cache, logits = out.past_key_values, out.logits[:, -1].float()
            logits[:, self.never] = -math.inf
            if step == 0:
                logits[:, self.first] = -math.inf
            token = torch.where(done, self.end, logits.argmax(-1))
            said.append(token)
            done |= (token == self.end) | (step + 1 >= limit)
            if step % DONE_CHECK == DONE_CHECK - 1 and bool(done.all()):
                break
            step_input = token[:, None]
        return [[t for t in row if t != self.end] for row in torch.stack(said, 1).tolist()]


def checkpoint_parameters(path: Path) -> int:
    """Parameters in a checkpoint's safetensors files, from their headers (nothing else is read)."""
    total = 0
    for weights in sorted(path.glob("model*.safetensors")):
        with open(weights, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
    return total


def recogniser_gpu_mb(cfg: ValidateConfig) -> int:
    """GPU memory an hf-whisper recogniser adds to a worker: its weights at asr_precision and, per
    window of a batch (a take alone, or the takes packed into it), the encoder's widest activation,
    the decoder's cross-attention cache and its self-attention cache at full length (a packed window
    decodes hundreds of tokens, not tens). 0 off the GPU.
    large-v3-turbo in bf16 with 16 windows: 1,543 MiB of weights + 16 x 67 MiB."""
    if not cfg.enabled or cfg.recogniser != "hf-whisper" or cfg.asr_device == "cpu":
        return 0
    path = Path(cfg.model_path)
    dims = json.loads((path / "config.json").read_text(encoding="utf-8"))
    width = 2 if cfg.asr_precision in ("bf16", "fp16") else 4
    frames = dims.get("max_source_positions", 1500)
    tokens = dims.get("max_target_positions", 448)
    per_window = (
        width
        * 2
        * (
            frames * (dims["decoder_layers"] * dims["d_model"] + dims["encoder_ffn_dim"])
            + tokens * dims["decoder_layers"] * dims["d_model"]
        )
    )
    return round((checkpoint_parameters(path) * width + cfg.asr_batch * per_window) / 2**20)
