"""What a model load changes in upstream's modules once they are imported: tables cached across
versions, the Qwen2 backbone's dtype and decode mask under transformers 5, prompts read without
torchcodec, no progress bars, text normalisers built once. Apart from runtime.py, which finds,
imports and constructs the model: these are its corrections to upstream, applied before the
constructor runs and left in place for later loads in the process.
"""

from __future__ import annotations

import importlib
import inspect
import shutil
import sys
import tempfile


def forget_mel_filters() -> None:
    """Drop the mel filters and window Matcha-TTS caches per fmax and device, not per FFT size.

    v1 (n_fft 1024) and v2/v3 (n_fft 1920) share fmax 8000: a process that loaded one version and
    then another would reuse the first one's window, and stft refuses it. A worker loads one
    version, so this matters where one process loads several in turn (tests, probes).
    """
    audio = sys.modules.get("matcha.utils.audio")
    for name in ("mel_basis", "hann_window"):
        table = getattr(audio, name, None)
        if isinstance(table, dict):
            table.clear()


def load_backbone_in_fp32() -> None:
    """Load the Qwen2 backbone (CosyVoice-BlankEN) in fp32, as transformers 4 did.

    transformers 5 loads a checkpoint in the dtype it was saved in: bf16 for the released
    CosyVoice-BlankEN. upstream then copies llm.pt into those bf16 parameters (rounding them) and
    runs them beside fp32 modules, which fails ("mat1 and mat2 must have the same dtype").
    upstream's own fp16 option still casts the llm after this.
    """
    import torch
    import transformers

    llm_module = importlib.import_module("cosyvoice.llm.llm")
    qwen = getattr(llm_module, "Qwen2ForCausalLM", None)
    if qwen is None or getattr(qwen, "convtts_fp32", False):
        return
    keyword = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

    class Qwen2ForCausalLMInFp32(qwen):
        convtts_fp32 = True

        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            if "dtype" not in kwargs and "torch_dtype" not in kwargs:
                kwargs[keyword] = torch.float32
            return qwen.from_pretrained(*args, **kwargs)

    llm_module.Qwen2ForCausalLM = Qwen2ForCausalLMInFp32


def decode_steps_see_the_whole_cache() -> None:
    """Give upstream's Qwen2 decode steps an attention mask that covers the cached tokens too.

    Each decode step hands transformers a mask as long as the new input (one column of ones).
    transformers 4 ignored an all-ones mask; transformers 5 pads a short mask with zeros, so every
    step would attend to the first prompt position only and the model would not hear its own text
    (measured on a random model: logits 0.06 apart from full attention, equal to first-only
    attention). With the mask widened, both versions compute what the model was trained for.
    """
    import torch

    llm_module = importlib.import_module("cosyvoice.llm.llm")
    encoder = getattr(llm_module, "Qwen2Encoder", None)
    step = getattr(encoder, "forward_one_step", None)
    if step is None or getattr(step, "convtts_whole_cache", False):
        return

    def forward_one_step(self, xs, masks, cache=None):
        past = cache.get_seq_length() if cache is not None else 0
        if past and masks.shape[-1] == xs.shape[1]:
            masks = torch.cat([masks.new_ones(masks.shape[0], masks.shape[1], past), masks], dim=-1)
        return step(self, xs, masks, cache)

    forward_one_step.convtts_whole_cache = True
    encoder.forward_one_step = forward_one_step


def read_prompts_with_soundfile() -> None:
    """Read prompt recordings with soundfile where upstream's torchaudio.load cannot.

    The official frontend reads a zero-shot prompt through torchaudio.load, which torchaudio 2.9
    and later route through torchcodec, absent on the GPU machines we know. Same result: the
    channels averaged, resampled to the rate asked for.
    """
    frontend = sys.modules.get("cosyvoice.cli.frontend")
    upstream = getattr(frontend, "load_wav", None)
    if upstream is None or getattr(upstream, "convtts_soundfile", False):
        return

    def load_wav(wav, target_sr, min_sr=16000):
        import soundfile
        import torch
        import torchaudio.functional

        samples, rate = soundfile.read(wav, dtype="float32", always_2d=True)
        speech = torch.from_numpy(samples.mean(axis=1)).unsqueeze(0)
        if rate != target_sr:
            if rate < min_sr:
                raise ValueError(f"{wav}: sample rate {rate} is below {min_sr}")
            speech = torchaudio.functional.resample(speech, rate, target_sr)
        return speech

    load_wav.convtts_soundfile = True
    frontend.load_wav = load_wav


def quiet_progress(module) -> None:
    """Upstream wraps every call in a tqdm bar; in a worker that is one stderr line per utterance."""
    if hasattr(module, "tqdm"):
        module.tqdm = lambda iterable, *args, **kwargs: iterable


_NORMALIZERS: dict = {}


def share_text_normalizers() -> None:
    """Build each text normaliser once per process, when first used, not at every model load.

    Upstream's frontend constructs ZhNormalizer(..., overwrite_cache=True) in every constructor:
    10 s of FST building per load (and per rebuild), written into the installed package's
    directory, which several workers then rewrite at once. The normalisers hold no per-utterance
    state, so one instance per argument set serves every later load in the process; and it is
    built at its first normalize(), so a worker speaking English never builds the Chinese one.
    """
    frontend = sys.modules.get("cosyvoice.cli.frontend")
    for name in ("ZhNormalizer", "EnNormalizer"):
        cls = getattr(frontend, name, None)
        if cls is not None and not getattr(cls, "convtts_shared", False):
            setattr(frontend, name, _shared(cls))


def _shared(cls):
    try:
        takes_cache_dir = "cache_dir" in inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no introspectable signature: pass the arguments through
        takes_cache_dir = False

    def make(args, kwargs):
        if not (kwargs.get("overwrite_cache") and takes_cache_dir and "cache_dir" not in kwargs):
            return cls(*args, **kwargs)
        # Rebuilt from the grammar either way: write the throwaway copy to a private
        # directory instead of the shared package directory (read-only or raced).
        scratch = tempfile.mkdtemp(prefix="convtts-tn-")
        try:
            return cls(*args, cache_dir=scratch, **kwargs)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def build(*args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _NORMALIZERS:
            _NORMALIZERS[key] = _FirstUse(lambda: make(args, kwargs))
        return _NORMALIZERS[key]

    build.convtts_shared = True
    return build


class _FirstUse:
    """An object built at the first use of one of its attributes (normalize)."""

    def __init__(self, make):
        self._make, self._made = make, None

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._made is None:
            self._made = self._make()
        return getattr(self._made, name)
