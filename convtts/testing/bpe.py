"""The byte-level BPE the random models' tokenizers share (the Qwen2 backbone's, Whisper's), trained on our corpus."""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = Path(__file__).with_name("data") / "bpe_corpus.txt"
BPE_VOCAB = 2000


def train_bpe() -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE trained on our corpus: (token -> id from 0, merges as 'a b' lines)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS.read_text(encoding="utf-8").splitlines(), trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return model["vocab"], merges


def write_vocab(folder: Path, vocab: dict[str, int], merges: list[str]) -> None:
    """vocab.json and merges.txt, as transformers' byte-level BPE tokenizers read them."""
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")


def special_entries(tokens: dict[int, str]) -> dict[str, dict]:
    """tokenizer_config.json's added_tokens_decoder for these special tokens (id -> text)."""
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    return {str(i): {"content": text, **flags} for i, text in tokens.items()}
