"""The CosyVoice-BlankEN folder of a random-weight CosyVoice2 or CosyVoice3 model directory: a Qwen2
config, random weights in bf16 as released, and the tokenizer files transformers loads. The tokenizer
is a small byte-level BPE (testing/bpe.py), padded so that Qwen's special
tokens keep their released ids (CosyVoice3 checks for `<|endofprompt|>` = 151646). Apart from
cosyvoice_qwen.py, which writes the rest of the directory: the backbone is a transformers model of its
own, built with none of the CosyVoice runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

from convtts.testing.bpe import special_entries, train_bpe, write_vocab

QWEN_VOCAB = 151936  # the released Qwen2 embedding rows
QWEN_SPECIAL = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}

QWEN = {  # Qwen2-0.5B, the backbone both released models build on; tiny loads in a second
    "full": dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864
    ),
    "tiny": dict(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
    ),
}


def write_tokenizer(folder: Path) -> None:
    """vocab.json, merges.txt and tokenizer_config.json, the files the Qwen2 tokenizer class loads.

    The vocabulary is padded with tokens no merge produces, so that Qwen's special tokens keep
    their released ids (151643..) and the ones CosyVoice adds follow them as in the real model.
    """
    vocab, merges = train_bpe()
    first_special = min(QWEN_SPECIAL)
    filler = (f"<|convtts_unused_{i}|>" for i in range(first_special))
    while len(vocab) < first_special:
        vocab.setdefault(next(filler), len(vocab))
    write_vocab(folder, vocab, merges)
    added = special_entries(QWEN_SPECIAL)
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


def write_blank_en(folder: Path, size: str, seed: int) -> None:
    """The Qwen2 backbone (config, random weights in bf16 as released) and its tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen2Config(
        vocab_size=QWEN_VOCAB,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151643,
        **QWEN[size],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    write_tokenizer(folder)
