"""How a run goes: workers, the outputs, the quality gate."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from convtts.config.errors import ConfigError
from convtts.config.plan import LANGUAGE_CODE

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
            if not LANGUAGE_CODE.fullmatch(language) or limit <= 0:
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
