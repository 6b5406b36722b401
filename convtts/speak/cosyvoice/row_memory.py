"""What one row of the batched decode holds in GPU memory, from the config and the model directory alone (no torch).

The static KV cache gives every row a fixed number of positions: the longest prompt plus the
most speech tokens upstream lets a chunk decode (20 per text token by default). Both follow from
text.max_words and the zero-shot prompts, so the slot can size workers and rows before any
worker loads a model (convtts.tuning). The batched path cuts a chunk of more text tokens
(chunks.py); a row that still needs more (one very long word) grows the cache.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml

from convtts.config import Config
from convtts.speak.cosyvoice.runtime import model_version

log = logging.getLogger(__name__)

BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
TOKEN_RATE = {1: 50, 2: 25, 3: 25}  # speech tokens per second of prompt audio
TEXT_TOKENS_PER_WORD = 2  # plus TEXT_TOKENS_EXTRA per segment: numbers read out, punctuation, odd words
TEXT_TOKENS_EXTRA = 8
MAX_TOKENS_PER_TEXT_TOKEN = 20  # upstream's default decode bound (max_token_text_ratio)
CHARS_PER_TEXT_TOKEN = 3
SPECIAL_POSITIONS = 3  # sos, speaker embedding or nothing, task id
DEFAULT_SHAPES = {1: (14, 1024), 2: (24, 128), 3: (24, 128)}  # CosyVoice-300M; Qwen2-0.5B (2 key heads of 64)
# A row's share of the batched flow's and the vocoder's working memory: an estimate until measured
# (bench/engine_memory.py); the KV cache is computed.
FLOW_MB_PER_ROW = 200


def row_tokens(config: Config) -> int:
    """KV positions one row needs for the longest chunk the config allows (tts.cosyvoice.max_row_tokens wins)."""
    cosy = config.tts.cosyvoice
    if cosy.max_row_tokens:
        return cosy.max_row_tokens
    text = TEXT_TOKENS_PER_WORD * config.text.max_words + TEXT_TOKENS_EXTRA
    return SPECIAL_POSITIONS + prompt_tokens(config) + text + text * MAX_TOKENS_PER_TEXT_TOKEN


def text_tokens(config: Config) -> int:
    """Text tokens one chunk may hold within row_tokens: the batched path cuts a longer chunk (chunks.py)."""
    cosy = config.tts.cosyvoice
    if not cosy.max_row_tokens:
        return TEXT_TOKENS_PER_WORD * config.text.max_words + TEXT_TOKENS_EXTRA
    room = cosy.max_row_tokens - SPECIAL_POSITIONS - prompt_tokens(config)
    return max(1, room // (1 + MAX_TOKENS_PER_TEXT_TOKEN))


def prompt_tokens(config: Config) -> int:
    """The longest zero-shot prompt the voices use, in LLM positions (its text and its speech tokens)."""
    cosy = config.tts.cosyvoice
    voices = [cosy.prompts[v] for v in config.speakers.voices if v in cosy.prompts]
    if not voices:
        return 0
    import soundfile

    rate = TOKEN_RATE.get(_version(cosy.model_dir), 25)
    longest = 0
    for prompt in voices:
        try:
            seconds = soundfile.info(prompt.audio).duration if prompt.audio else 0.0  # a told built-in speaker: none
        except Exception:  # checked before any worker starts; an estimate needs no error of its own
            seconds = 30.0
        longest = max(longest, int(seconds * rate) + len(prompt.text + prompt.instruct) // CHARS_PER_TEXT_TOKEN + 1)
    return longest


def row_kv_mb(config: Config) -> float:
    """MiB of keys and values one row of the static cache holds, at the LLM's precision."""
    layers, width = llm_shape(config.tts.cosyvoice.model_dir)
    bytes_ = BYTES[config.tts.cosyvoice.precision.llm]
    return layers * 2 * width * row_tokens(config) * bytes_ / 2**20


def llm_shape(model_dir: str) -> tuple[int, int]:
    """(decoder layers, key width per position) of the model's LLM; the released sizes if unreadable."""
    version = _version(model_dir)
    try:
        if version == 1:
            return _v1_shape(Path(model_dir) / "cosyvoice.yaml")
        config = json.loads((Path(model_dir) / "CosyVoice-BlankEN" / "config.json").read_text())
        dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        return int(config["num_hidden_layers"]), int(config["num_key_value_heads"]) * int(dim)
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        log.info("LLM shape of %s not readable (%s): taking the released model's", model_dir, exc)
        return DEFAULT_SHAPES.get(version, DEFAULT_SHAPES[1])


def _version(model_dir: str) -> int:
    try:
        return model_version(model_dir)
    except ValueError:
        return 1


class _TagsAsData(yaml.SafeLoader):
    """Reads hyperpyyaml as plain data: !new:/!name: nodes as their mappings, !ref <key> as ("ref", key)."""


def _tagged(loader, suffix, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    value = loader.construct_scalar(node)
    return ("ref", value.strip("<> ")) if suffix == "ref" else value


_TagsAsData.add_multi_constructor("!", _tagged)


def _v1_shape(path: Path) -> tuple[int, int]:
    """num_blocks and output_size of the TransformerLM's decoder (llm.llm), !ref values resolved."""
    top = yaml.load(path.read_text(encoding="utf-8"), Loader=_TagsAsData)
    decoder = top["llm"]["llm"]

    def value(key):
        raw = decoder[key]
        return int(top[raw[1]]) if isinstance(raw, tuple) else int(raw)

    return value("num_blocks"), value("output_size")
