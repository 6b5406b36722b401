"""Writes a random-weight Whisper checkpoint directory that transformers loads, offline.

For tests and GPU benchmarks of the quality gate's `hf-whisper` recogniser without released
weights: `config.json`, `generation_config.json`, `model.safetensors`, `preprocessor_config.json`
and the tokenizer files, in the layout of openai/whisper-large-v3-turbo. The tokenizer is a small
byte-level BPE trained on convtts/testing/data/bpe_corpus.txt (testing/bpe.py), padded so that Whisper's
special tokens keep their released ids (<|endoftext|> 50257 ... <|notimestamps|> 50364, then 1501
timestamps: 51866 tokens, as large-v3). What the model hears is noise, and a random decoder rarely
stops on its own (its end-of-text logit is held at 0), so it runs to the length the recogniser
allows: the cost of the gate is realistic (an upper bound on the decoder's share), its transcripts
are not.

    python -m convtts.testing.whisper_model --out models/whisper-turbo --size turbo
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from convtts.testing.bpe import special_entries, train_bpe, write_vocab

END_OF_TEXT = 50257  # the first special token; every id below it is text
MEL_BINS = 128  # large-v3 and its turbo
TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|>
INFO_FILE = "convtts_model.json"

# Weights' spread: at the usual 0.02 a tiny decoder says one token whatever it hears; at 0.3 its
# transcripts differ between inputs and positions, so a row mixed up with another shows.
INIT_STD = {"turbo": 0.02, "tiny": 0.3}
SIZES = {
    # openai/whisper-large-v3-turbo: 809M parameters, 32 encoder layers and 4 decoder layers
    "turbo": dict(
        d_model=1280,
        encoder_layers=32,
        decoder_layers=4,
        encoder_attention_heads=20,
        decoder_attention_heads=20,
        encoder_ffn_dim=5120,
        decoder_ffn_dim=5120,
    ),
    "tiny": dict(
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
    ),
}


def special_tokens() -> list[str]:
    """Whisper large-v3's special tokens in id order, from END_OF_TEXT on."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    names = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{code}|>" for code in LANGUAGES)]
    names += ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    return names + [f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMPS)]


def filler_word(number: int) -> str:
    """A token no merge makes that decodes to a word of letters (' zqbaf'): random transcripts read as words."""
    letters = ""
    while True:
        number, digit = divmod(number, 26)
        letters += chr(ord("a") + digit)
        if not number:
            return "\u0120zq" + letters  # \u0120 is byte-level BPE's space


def write_tokenizer(folder: Path) -> dict[str, int]:
    """vocab.json, merges.txt and tokenizer_config.json; returns the special tokens' ids."""
    vocab, merges = train_bpe()
    filler = (filler_word(i) for i in range(END_OF_TEXT))
    while len(vocab) < END_OF_TEXT:  # tokens no merge produces, so the special ids are the released ones
        vocab.setdefault(next(filler), len(vocab))
    special = {name: END_OF_TEXT + i for i, name in enumerate(special_tokens())}
    write_vocab(folder, vocab, merges)
    added = special_entries({i: name for name, i in special.items()})
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 1024,
        "tokenizer_class": "WhisperTokenizer",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return special


def generation_config(special: dict[str, int]) -> dict:
    """The generation settings transformers' Whisper.generate reads, as the released checkpoints have them.

    suppress_tokens holds every id past <|endoftext|>: a text-only transcript, the rule the gate's
    own decoder applies, so that generate() and the gate decode alike.
    """
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return {
        "decoder_start_token_id": special["<|startoftranscript|>"],
        "bos_token_id": END_OF_TEXT,
        "eos_token_id": END_OF_TEXT,
        "pad_token_id": END_OF_TEXT,
        "max_length": 448,
        "begin_suppress_tokens": [220, END_OF_TEXT],
        "suppress_tokens": list(range(END_OF_TEXT + 1, len(special) + END_OF_TEXT)),
        "is_multilingual": True,
        "lang_to_id": {f"<|{code}|>": special[f"<|{code}|>"] for code in LANGUAGES},
        "task_to_id": {"transcribe": special["<|transcribe|>"], "translate": special["<|translate|>"]},
        "no_timestamps_token_id": special["<|notimestamps|>"],
        "prev_sot_token_id": special["<|startofprev|>"],
        "max_initial_timestamp_index": 50,
    }


def write_weights(folder: Path, size: str, special: dict[str, int], seed: int) -> int:
    """config.json and model.safetensors (fp16 as released for turbo; fp32 for tiny); returns parameters."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=END_OF_TEXT + len(special),
        num_mel_bins=MEL_BINS,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=special["<|startoftranscript|>"],
        pad_token_id=END_OF_TEXT,
        bos_token_id=END_OF_TEXT,
        eos_token_id=END_OF_TEXT,
        begin_suppress_tokens=[220, END_OF_TEXT],
        init_std=INIT_STD[size],
        **SIZES[size],
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # (tied to the output layer) an end-of-text logit of 0, below the best of 50,000 others
        model.get_input_embeddings().weight[END_OF_TEXT] = 0.0
    if size == "turbo":
        model = model.to(torch.float16)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def build_whisper_dir(out: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write the checkpoint directory and return its path; nothing is downloaded."""
    from transformers import WhisperFeatureExtractor

    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    special = write_tokenizer(out)
    parameters = write_weights(out, size, special, seed)
    # over the one save_pretrained derived from the model config: what generate() needs, whole
    (out / "generation_config.json").write_text(json.dumps(generation_config(special), indent=1), encoding="utf-8")
    WhisperFeatureExtractor(feature_size=MEL_BINS).save_pretrained(out)
    info = {
        "generator": "convtts.testing.whisper_model",
        "size": size,
        "seed": seed,
        "parameters": parameters,
        "weights": "random",
        **SIZES[size],
    }
    (out / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m convtts.testing.whisper_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="directory to write (created; files overwritten)")
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="tiny",
        help="turbo: whisper-large-v3-turbo's shapes (1.6 GB in fp16); tiny: loads in a second",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    out = build_whisper_dir(args.out, args.size, args.seed)
    print((out / INFO_FILE).read_text(encoding="utf-8").strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
