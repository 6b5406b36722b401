"""CosyVoice through its official Python API: v1 SFT speakers, or named zero-shot voices (v1, v2, v3), a few or a
pool of thousands."""

from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path

import numpy as np

from convtts.config import Config, ConfigError
from convtts.speak.base import FEED_WAIT, BatchedBackend, SynthesisError, is_out_of_memory
from convtts.speak.cosyvoice.failures import out_of_memory, raised_at, thread_errors
from convtts.speak.cosyvoice.loading import IMPORTS, CudaContext, LoadClock
from convtts.speak.cosyvoice.prompts import PromptCache, prompted_voices, spoken_prefix
from convtts.speak.cosyvoice.reproducible import seed_everything, weights_checksum
from convtts.speak.cosyvoice.resources import resources as cosyvoice_resources
from convtts.speak.cosyvoice.resources import sized
from convtts.speak.cosyvoice.runtime import load_model, model_version
from convtts.speak.cosyvoice.text_frontend import chunk_budget, normalized
from convtts.speak.cosyvoice.voice_check import check

log = logging.getLogger(__name__)


class _Inline:
    """An executor that runs the call at once (a backend given an engine without its frontend thread)."""

    @staticmethod
    def submit(fn, *args):
        from concurrent.futures import Future

        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future


_INLINE = _Inline()


def decode_options(config: Config):
    """How the batched engine runs the LLM, from tts.cosyvoice (and the KV positions a row needs)."""
    from convtts.speak.cosyvoice.engine.runner import DecodeOptions
    from convtts.speak.cosyvoice.row_memory import row_tokens

    cosy = config.tts.cosyvoice
    return DecodeOptions(
        decode=cosy.decode,
        cuda_graphs=cosy.cuda_graphs,
        compile=cosy.compile,
        sampler=cosy.sampler,
        attention=cosy.attention,
        prefill=cosy.prefill,
        row_tokens=row_tokens(config),
    )


class CosyVoiceBackend(BatchedBackend):
    """One loaded CosyVoice model in a worker; CUDA_VISIBLE_DEVICES is set by the caller beforehand."""

    name = "cosyvoice"
    feed_may_wait = True  # synthesize_many takes FEED_WAIT from its feed (the engine asks again next step)
    check = staticmethod(check)
    resources = staticmethod(cosyvoice_resources)
    sized = staticmethod(sized)

    def __init__(self, config: Config):
        clock = LoadClock()
        self.load_phases = clock.phases  # where the load's time went, for the slot's start-up timeline
        with clock.phase(IMPORTS):
            import torch

        # One intra-op thread: parallelism comes from worker processes (9 s against 0.38 s per
        # v1 call on 2 cores with torch's default thread count).
        torch.set_num_threads(1)
        self.config = config
        self.cosy = config.tts.cosyvoice
        self.uses_cuda = torch.cuda.is_available()
        # the process's CUDA context (the first load pays it), made while the rest of the load begins
        context = CudaContext(clock) if self.uses_cuda and not torch.cuda.is_initialized() else None
        try:
            # checks the directory before upstream can download; a v1 model is built on the GPU
            self.model = load_model(self.cosy, clock, "cuda" if self.uses_cuda else None)
        except BaseException:
            if context is not None:
                context.thread.join()  # the load's own error is the one to report
            raise
        if context is not None:
            context.wait()
        self.sample_rate = int(self.model.sample_rate)
        self.version = model_version(self.cosy.model_dir)
        self.builtin = set(self.model.list_available_spks())
        # Upstream's frontend serves one caller at a time: the batched engine's look-ahead thread,
        # or upstream's own one-at-a-time path.
        self.frontend_lock = threading.Lock()
        self.frontend = None  # the thread that runs the text frontend of the next utterances
        self.frontend_busy = [0, 0.0, 0.0]  # texts, wall and CPU seconds of the frontend's thread
        self.text_budget = 0  # text tokens a chunk may hold (the batched engine's KV plan); 0: no bound
        with clock.phase("engine"):
            self.engine = self._engine()
        self.built_rows = self.batch_rows  # grow_batch never goes past the rows it was built with
        self.prompts = prompted_voices(config)
        self.registered = PromptCache(self.model, self.prompts, self.cosy.prompt_cache)
        for voice in config.speakers.voices if not config.speakers.pool else ():
            if voice not in self.prompts and voice not in self.builtin:
                raise ConfigError(
                    f"speaker {voice!r} is neither a speaker of {self.cosy.model_dir} "
                    f"({sorted(self.builtin) or 'none'}) nor defined in tts.cosyvoice.prompts"
                )

    def _engine(self):
        """The batched engine when batch_size asks for one and the model suits it; else None."""
        from convtts.speak.cosyvoice.engine import engine as cosyvoice_batch
        from convtts.speak.cosyvoice.engine import qwen as cosyvoice_batch_qwen

        rows = self.cosy.batch_size or self._automatic_rows()
        if rows <= 1:
            return None
        for module, engine in (
            (cosyvoice_batch, cosyvoice_batch.BatchEngine),
            (cosyvoice_batch_qwen, cosyvoice_batch_qwen.QwenBatchEngine),
        ):
            if module.supports(self.model):
                from concurrent.futures import ThreadPoolExecutor

                self.frontend = ThreadPoolExecutor(1, thread_name_prefix="cosyvoice-frontend")
                self.text_budget = chunk_budget(self.config)
                return engine(self.model, rows, self.cosy.precision, decode_options(self.config), self.cosy)
        log.warning(
            "batch_size %d ignored: batching runs models in fp32, with the flow in PyTorch (not "
            "TensorRT) and the LLM in PyTorch (not vLLM); speaking one utterance at a time",
            self.cosy.batch_size,
        )
        return None

    def _automatic_rows(self) -> int:
        """batch_size 0 outside a slot (which sets it before workers start): as the slot would for one worker."""
        from convtts.tuning import choose_layout

        device = "cuda" if self.uses_cuda else "cpu"
        row_mb = cosyvoice_resources(self.config, device).row_mb
        _, rows = choose_layout(1, device, 1, self.config.workers.gpu_mb_per_worker, row_mb)
        return rows

    @property
    def batch_rows(self) -> int:
        """How many utterances synthesize_many decodes at once (1: no batched path)."""
        return self.engine.max_rows if self.engine is not None else 1

    def shrink_batch(self) -> int:
        """Halve the rows after a CUDA out-of-memory; returns the new count."""
        self.engine.resize(max(1, self.engine.max_rows // 2))  # its KV cache goes now, before empty_cache
        if self.uses_cuda:
            import torch

            torch.cuda.empty_cache()
        return self.engine.max_rows

    def grow_batch(self) -> int:
        """Double the rows a shrink_batch cut, up to those it was built with; returns the new count. The next
        call allocates the larger KV cache, as it allocated the smaller one after the cut."""
        self.engine.resize(min(self.built_rows, self.engine.max_rows * 2))
        return self.engine.max_rows

    def synthesize_many(self, items):
        """Speak (key, text, speaker, seed) items through the batched engine.

        Reads `items` lazily, as rows free up; yields (key, audio) or (key, exception) per item as
        soon as it is final. A CUDA out-of-memory raises OutOfMemory: items handed over and not yet
        yielded are the caller's to retry.
        """
        from convtts.speak.cosyvoice.engine.requests import Request

        def requests():
            for item in items:
                if item is FEED_WAIT:  # the caller has none to give now (a worker holding its first batch)
                    yield item
                    continue
                key, text, speaker, seed = item
                request = Request(key, [], seed)
                # the frontend runs in its thread while the engine decodes; a refused text fails alone
                request.pending = (self.frontend or _INLINE).submit(self._chunks, text, speaker)
                yield request

        before = list(self.frontend_busy)
        try:
            for request in self.engine.speak(requests(), speed=self.cosy.speed):
                yield request.key, self._result(request)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise out_of_memory(exc) from exc
            raise
        finally:
            texts, wall, cpu = (now - then for now, then in zip(self.frontend_busy, before))
            # beside the engine's line: a busy frontend thread holds the interpreter's lock the loop waits for
            log.info("frontend: %d texts in %.1f s (cpu %.1f s)", texts, wall, cpu)

    def _chunks(self, text: str, speaker: str) -> list[dict]:
        """The frontend inputs of each text chunk, built as inference_sft / inference_zero_shot do."""
        with self.frontend_lock:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return self._frontend_chunks(text, speaker)
            finally:
                busy = self.frontend_busy
                busy[0] += 1
                busy[1] += time.perf_counter() - started
                busy[2] += time.thread_time() - cpu

    def _frontend_chunks(self, text: str, speaker: str) -> list[dict]:
        frontend, tf = self.model.frontend, self.cosy.text_frontend
        if speaker in self.prompts and self.prompts[speaker].mode != "zero_shot":
            return self._other_mode_chunks(text, speaker)
        if speaker in self.prompts:
            key, prompt = self.registered.key(speaker), self.prompts[speaker]
            prompt_text = frontend.text_normalize(prompt.text, split=False, text_frontend=tf)
            # A copy per chunk: some releases hand back the registered voice's own dict with the
            # text set in it, so every chunk of a batch would otherwise speak the last text. The
            # copy also keeps the voice's features for this utterance should the cache let it go.
            # The recording's path stands for the audio: a registered voice's features are used instead.
            return [
                dict(frontend.frontend_zero_shot(part, prompt_text, prompt.audio, self.sample_rate, key))
                for part in normalized(frontend, text, tf, self.text_budget)
            ]
        if speaker in self.builtin:
            parts = normalized(frontend, text, tf, self.text_budget)
            return [dict(frontend.frontend_sft(part, speaker)) for part in parts]
        raise SynthesisError(f"unknown CosyVoice speaker {speaker!r}; known: {self._known()}")

    def _other_mode_chunks(self, text: str, speaker: str) -> list[dict]:
        """A cross-lingual or instruct voice's chunks: its registered features (PromptCache.register,
        as frontend_cross_lingual / frontend_instruct2 build them) and each chunk's text, a cross-lingual
        voice's prefix before it."""
        frontend, prompt, tf = self.model.frontend, self.prompts[speaker], self.cosy.text_frontend
        parts = normalized(frontend, text, tf, self.text_budget)
        if prompt.speaker:  # CosyVoice-300M-Instruct: a built-in speaker told the instruction (inference_instruct)
            instruct = frontend.text_normalize(prompt.instruct, split=False, text_frontend=tf)
            return [dict(frontend.frontend_instruct(part, prompt.speaker, instruct)) for part in parts]
        key = self.registered.key(speaker)
        prefix = spoken_prefix(prompt, self.version) if prompt.mode == "cross_lingual" else ""
        return [
            dict(frontend.frontend_zero_shot(prefix + part, "", prompt.audio, self.sample_rate, key)) for part in parts
        ]

    @staticmethod
    def _result(request):
        if request.error is not None:
            error = request.error
            if isinstance(error, SynthesisError):
                return error
            return SynthesisError(f"{type(error).__name__}: {error}{raised_at(error)}")
        audio = np.concatenate(request.audio) if request.audio else np.zeros(0, np.float32)
        if audio.size == 0:
            return SynthesisError("CosyVoice produced no audio (nothing speakable in the text?)")
        return audio.astype(np.float32, copy=False)

    def prompt_audio(self, speaker: str) -> str | None:
        """The prompt recording a zero-shot voice speaks from (for the manifest); None for a built-in speaker."""
        prompt = self.prompts.get(speaker)
        return str(Path(prompt.audio).resolve()) if prompt is not None and prompt.audio else None

    def _outputs(self, text: str, speaker: str):
        options = dict(stream=False, speed=self.cosy.speed, text_frontend=self.cosy.text_frontend)
        if speaker in self.prompts:
            if self.prompts[speaker].mode != "zero_shot":
                return self._other_mode_outputs(text, speaker)
            key, prompt = self.registered.key(speaker), self.prompts[speaker]
            return self.model.inference_zero_shot(text, prompt.text, prompt.audio, zero_shot_spk_id=key, **options)
        if speaker in self.builtin:
            return self.model.inference_sft(text, speaker, **options)
        raise SynthesisError(f"unknown CosyVoice speaker {speaker!r}; known: {self._known()}")

    def _other_mode_outputs(self, text: str, speaker: str):
        """Upstream's loop of inference_cross_lingual / inference_instruct2 (each chunk through the model's
        tts) on the chunks the batched path takes: some releases' frontend_cross_lingual deletes its
        prompt from the registered voice itself, and upstream speaks a text with a `<|...|>` prefix
        unnormalised and in one piece."""
        for chunk in self._frontend_chunks(text, speaker):  # under synthesize's frontend lock
            yield from self.model.model.tts(**chunk, stream=False, speed=self.cosy.speed)

    def _known(self) -> str:
        known = sorted(self.builtin | set(self.prompts))
        return f"{known[:10]}{f' and {len(known) - 10} more' if len(known) > 10 else ''}"

    def synthesize(self, text: str, speaker: str, seed: int) -> np.ndarray:
        if self.model is None:
            raise SynthesisError("the CosyVoice backend is closed")
        if self.engine is not None and self.engine.casts_llm:
            return self._synthesize_batched(text, speaker, seed)
        seed_everything(seed)
        chunks = []
        try:
            with thread_errors() as caught, self.frontend_lock:
                outputs = self._outputs(text, speaker)
                try:
                    # Run to the end: upstream frees per-call state only after its last yield.
                    chunks = [out["tts_speech"] for out in outputs]
                finally:
                    outputs.close()
            if caught:
                raise caught[0]
        except SynthesisError:
            raise
        except Exception as exc:
            self._forget_calls()
            if is_out_of_memory(exc):
                raise out_of_memory(exc) from exc
            raise SynthesisError(f"{type(exc).__name__}: {exc}") from exc
        if not chunks or sum(c.shape[-1] for c in chunks) == 0:
            raise SynthesisError("CosyVoice produced no audio (nothing speakable in the text?)")
        audio = np.concatenate([c.detach().float().cpu().numpy().reshape(-1) for c in chunks])
        return audio.astype(np.float32, copy=False)

    def _synthesize_batched(self, text: str, speaker: str, seed: int) -> np.ndarray:
        """One utterance through the batched engine: its LLM weights are cast, which upstream's path cannot run."""
        [(_, result)] = list(self.synthesize_many([(0, text, speaker, seed)]))
        if isinstance(result, BaseException):
            raise result
        return result

    def _forget_calls(self) -> None:
        """A failed call leaves its entries in upstream's per-call dicts; nothing else is running."""
        inner = getattr(self.model, "model", None)
        for attr in ("tts_speech_token_dict", "llm_end_dict", "mel_overlap_dict", "flow_cache_dict", "hift_cache_dict"):
            table = getattr(inner, attr, None)
            if isinstance(table, dict):
                table.clear()

    def weights_digest(self) -> str:
        """16 hex digits over every parameter and buffer of the LLM, flow and vocoder (weights_checksum).

        Workers of a slot load the same files and must hold the same weights; the sums are taken
        where the weights live (one small transfer), so the digest costs milliseconds on a GPU.
        """
        inner = self.model.model
        return weights_checksum(
            t for part in (inner.llm, inner.flow, inner.hift) for _, t in sorted(part.state_dict().items())
        )

    def gpu_memory_mb(self, kind: str = "reserved") -> float:
        """torch.cuda's allocated or reserved memory of this process in MiB; 0 without CUDA."""
        if kind not in ("allocated", "reserved"):
            raise ValueError(f"kind must be allocated or reserved, got {kind!r}")
        if not self.uses_cuda:
            return 0.0
        import torch

        used = torch.cuda.memory_allocated() if kind == "allocated" else torch.cuda.memory_reserved()
        return used / 2**20

    def close(self) -> None:
        cache = self.registered
        if cache is not None and cache.made:
            log.info(
                "prompt features: %d voices registered in %.2f s, %d reused (at most %d kept) since the model "
                "was built",
                cache.made,
                cache.seconds,
                cache.reused,
                cache.size,
            )
        if self.frontend is not None:
            self.frontend.shutdown(wait=True)
            self.frontend = None
        self.model = None
        self.engine = None
        self.prompts = {}
        self.registered = None
        self.builtin = set()
        gc.collect()  # the model holds reference cycles; free it now, not at some later collection
        if self.uses_cuda:
            import torch

            # Upstream makes a new CUDA stream at every load, and torch keeps one cuBLAS workspace
            # per stream it has seen (32 MiB on Hopper): an H200 run measured +34 MiB reserved per
            # rebuild until these were dropped. The next cuBLAS call allocates a fresh one.
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()
