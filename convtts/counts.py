"""Counts in the lines people read: '1 shard', '2 shards'."""

from __future__ import annotations


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """'1 shard', '0 shards', '1,200 shards'; plural_form for nouns that do not take an s ('1 entry', '2 entries')."""
    word = noun if count == 1 else plural_form or noun + "s"
    return f"{count:,} {word}"
