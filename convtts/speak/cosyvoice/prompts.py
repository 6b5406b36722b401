"""Zero-shot prompts: their recordings checked before anything starts, and a worker's bounded cache of registered
voices."""

from __future__ import annotations

import inspect
import logging
import time
from collections import OrderedDict
from pathlib import Path

from convtts.config import Config, ConfigError, CosyVoiceConfig, PromptVoice
from convtts.speak.pool import read_pool

log = logging.getLogger(__name__)

END_OF_PROMPT = "<|endofprompt|>"  # v3 asserts it in every prompt text
MAX_PROMPT_SECONDS = 30.0  # upstream's speech tokenizer refuses longer prompts
MIN_PROMPT_SECONDS = 0.2  # shorter gives the model 5 speech tokens of the voice (v2/v3: 25 a second), or none
PROMPT_RATE = 16000  # rate of the prompt audio the frontend expects


def check_prompt(where: str, audio: str, text: str, version: int) -> None:
    """A prompt recording reads whole as audio of at most 30 s, and its transcript is there (with v3's marker)."""
    check_recording(where, audio)
    if not text.strip():
        raise ConfigError(f"{where}: the transcript is empty")
    if version == 3 and END_OF_PROMPT not in text:
        raise ConfigError(f"{where}: the transcript must contain {END_OF_PROMPT} for a CosyVoice3 model")


def check_voice(where: str, prompt: PromptVoice, version: int, keyed: bool = True) -> None:
    """A voice has what its mode needs: its recording, and the transcript (zero_shot) or the
    instruction (instruct, CosyVoice2/3) the model is told. `keyed`: errors name the key at fault
    (a voice of tts.cosyvoice.prompts), else the voice (a pool's)."""
    audio, instruct = (f"{where}.audio", f"{where}.instruct") if keyed else (where, where)
    if prompt.speaker:
        if version != 1:
            raise ConfigError(
                f"{where}: a built-in speaker told an instruction is CosyVoice-300M-Instruct's; a CosyVoice{version} "
                "instruct voice is a recording (audio) with its instruction"
            )
        if not prompt.instruct.strip():
            raise ConfigError(f"{instruct}: mode instruct needs the instruction")
        return
    if prompt.mode == "zero_shot":
        check_prompt(audio, prompt.audio, prompt.text, version)
        return
    check_recording(audio, prompt.audio)
    if prompt.mode == "instruct":
        if version == 1:
            raise ConfigError(
                f"{where}: mode instruct with a recording needs a CosyVoice2 or CosyVoice3 model (instruct2); "
                "a CosyVoice-300M-Instruct model tells a built-in speaker (speaker: 中文男) instead"
            )
        if not prompt.instruct.strip():
            raise ConfigError(
                f"{instruct}: mode instruct needs the instruction, e.g. '用四川话说这句话{END_OF_PROMPT}'"
            )
    if version == 3 and END_OF_PROMPT not in spoken_prefix(prompt, version):
        raise ConfigError(f"{instruct}: the instruction must contain {END_OF_PROMPT} for a CosyVoice3 model")


V3_SYSTEM_PROMPT = "You are a helpful assistant." + END_OF_PROMPT  # upstream's own, before a cross-lingual text


def spoken_prefix(prompt: PromptVoice, version: int) -> str:
    """What a cross-lingual voice puts before each chunk's text (CosyVoice3 needs its marker there,
    the transcript being left out); an instruct voice's instruction."""
    if prompt.mode == "cross_lingual" and version == 3 and not prompt.instruct:
        return V3_SYSTEM_PROMPT
    return prompt.instruct


def check_recording(where: str, audio: str) -> None:
    """A prompt recording reads whole as audio of 0.2 to 30 s."""
    import soundfile

    if not Path(audio).is_file():
        raise ConfigError(f"{where}: file not found: {audio}")
    try:
        info = soundfile.info(audio)
        frames = len(soundfile.read(audio, dtype="float32", always_2d=True)[0])
    except Exception as exc:
        raise ConfigError(f"{where}: {audio} is not readable as audio: {exc}") from None
    if frames < info.frames:
        raise ConfigError(
            f"{where}: {audio} holds {frames} of the {info.frames} frames its header announces (cut short?)"
        )
    if (
        frames < MIN_PROMPT_SECONDS * info.samplerate
    ):  # a WAV cut short reads as a short one: libsndfile sizes it by the file
        raise ConfigError(
            f"{where}: {audio} holds {frames / info.samplerate:.2f} s of audio; a prompt needs at least "
            f"{MIN_PROMPT_SECONDS} s"
        )
    if info.duration > MAX_PROMPT_SECONDS:
        raise ConfigError(f"{where}: {audio} is {info.duration:.1f} s; CosyVoice takes prompts of at most 30 s")


def check_prompts(cosy: CosyVoiceConfig, voices: list[str], version: int) -> None:
    """Every prompted voice of tts.cosyvoice.prompts has a readable audio file of at most 30 s and a transcript."""
    for voice in voices:
        check_voice(f"tts.cosyvoice.prompts.{voice}", cosy.prompts[voice], version)


def check_pool(pool: str, version: int) -> int:
    """Every recording of the voice pool, before anything starts: the first bad one is named. Returns the count."""
    started = time.time()
    voices = read_pool(pool)
    for voice in voices:
        check_voice(f"speakers.pool {voice.where}: voice {voice.name!r}", as_prompt(voice), version, keyed=False)
    log.info("speakers.pool %s: %d voices, every recording read in %.1f s", pool, len(voices), time.time() - started)
    return len(voices)


def load_prompt_16k(path: str):
    """A prompt file as a [1, N] float tensor at 16 kHz, read with soundfile (no torchcodec)."""
    import soundfile
    import torch
    import torchaudio.functional

    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    audio = torch.from_numpy(samples.mean(axis=1)).unsqueeze(0)
    return torchaudio.functional.resample(audio, rate, PROMPT_RATE) if rate != PROMPT_RATE else audio


def as_prompt(voice) -> PromptVoice:
    """A pool's voice (convtts.speak.pool.PoolVoice) as a prompt of tts.cosyvoice.prompts."""
    return PromptVoice(voice.audio, voice.text, voice.mode, voice.instruct, voice.language)


def prompted_voices(config: Config) -> dict[str, PromptVoice]:
    """The zero-shot voices by name: the pool's (speakers.pool), or those of speakers.voices in
    tts.cosyvoice.prompts."""
    if config.speakers.pool:
        return {voice.name: as_prompt(voice) for voice in read_pool(config.speakers.pool)}
    prompts = config.tts.cosyvoice.prompts
    return {voice: prompts[voice] for voice in config.speakers.voices if voice in prompts}


class PromptCache:
    """The zero-shot voices registered with the model's frontend: at most `size`, the least recently spoken leaving
    first.

    Registering computes a voice's prompt features (upstream's add_zero_shot_spk: the speech tokens,
    mel frames and speaker embedding of its recording) and keeps them in the frontend's spk2info
    under a key of ours, so no pool voice can replace a built-in speaker of the same name. A voice
    that left is registered again when next spoken, with the same features.
    """

    PREFIX = "convtts-prompt:"

    def __init__(self, model, voices: dict[str, PromptVoice], size: int):
        self.model, self.voices, self.size = model, voices, size
        self.order: OrderedDict[str, None] = OrderedDict()
        self.made, self.reused, self.seconds = 0, 0, 0.0  # for the log line at close: a pool's cost
        # Official code since 2025 takes the prompt as a file path (prompt_wav); older releases
        # and cosyvoice2-eu take a 16 kHz tensor (prompt_speech_16k).
        self.takes_path = list(inspect.signature(model.add_zero_shot_spk).parameters)[1] == "prompt_wav"

    def key(self, voice: str) -> str:
        """The voice's key in spk2info, registered now if it is not."""
        if voice in self.order:
            self.order.move_to_end(voice)
            self.reused += 1
        else:
            self.register(voice)
        return self.PREFIX + voice

    def register(self, voice: str) -> None:
        started = time.perf_counter()
        prompt = self.voices[voice]
        audio = prompt.audio if self.takes_path else load_prompt_16k(prompt.audio)
        if prompt.mode == "zero_shot":
            self.model.add_zero_shot_spk(prompt.text, audio, self.PREFIX + voice)
        else:
            self.model.frontend.spk2info[self.PREFIX + voice] = self.mode_features(prompt, audio)
        self.order[voice] = None
        self.made += 1
        self.seconds += time.perf_counter() - started
        while len(self.order) > self.size:
            gone, _ = self.order.popitem(last=False)
            del self.model.frontend.spk2info[self.PREFIX + gone]

    def mode_features(self, prompt: PromptVoice, audio) -> dict:
        """A cross-lingual or instruct voice's features as the runtime's own frontend builds them for
        its mode (add_zero_shot_spk's, less what the mode leaves out of the LLM; instruct2's prompt text
        is its instruction, which releases mark differently), its text left to each chunk."""
        frontend, rate = self.model.frontend, self.model.sample_rate
        if prompt.mode == "instruct":
            features = frontend.frontend_instruct2("", prompt.instruct, audio, rate, "")
        else:
            features = frontend.frontend_cross_lingual("", audio, rate, "")
        return {name: value for name, value in features.items() if name not in ("text", "text_len")}
