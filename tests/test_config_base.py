"""A config that names a base: its groups merged over the base's, key by key; loops and bad bases refused."""

from __future__ import annotations

import pytest

from convtts.config import ConfigError, load_config


def test_a_config_changes_its_base_key_by_key(tmp_path):
    (tmp_path / "node.yaml").write_text("workers: {per_slot: 3, max_attempts: 5}\ntext: {max_words: 30}\n")
    (tmp_path / "mine.yaml").write_text("base: node.yaml\nworkers: {per_slot: 2}\nspeakers: {voices: [joe]}\n")
    config = load_config(tmp_path / "mine.yaml")
    assert config.workers.per_slot == 2  # the file's own
    assert config.workers.max_attempts == 5 and config.text.max_words == 30  # the base's, beside it
    assert config.speakers.voices == ("joe",)  # a list is replaced, not merged


def test_a_base_may_be_a_shipped_config_and_the_command_line_still_wins(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: cosyvoice2\ntts: {cosyvoice: {batch_size: 32}}\n")
    config = load_config(tmp_path / "mine.yaml", ["tts.cosyvoice.speed=1.1"])
    shipped = load_config("cosyvoice2")
    assert config.tts.cosyvoice.batch_size == 32 and config.tts.cosyvoice.speed == 1.1
    assert config.tts.cosyvoice.model_dir == shipped.tts.cosyvoice.model_dir
    assert config.tts.cosyvoice.prompts == shipped.tts.cosyvoice.prompts


def test_bases_that_come_back_to_a_file_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "a.yaml")
    assert "its bases come back to it" in str(refused.value)


@pytest.mark.parametrize(
    ("base", "said"), [("nowhere.yaml", "config file not found: nowhere.yaml"), ("[1]", "base must name")]
)
def test_a_base_that_is_no_config_is_named(tmp_path, base, said):
    (tmp_path / "mine.yaml").write_text(f"base: {base}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "mine.yaml")
    assert said in str(refused.value)
