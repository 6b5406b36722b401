"""A rerun whose plan would differ from the one the output's audio was spoken for is refused, naming
each setting that changed with its old and new value, and the input when that changed."""

from __future__ import annotations

import re

import orjson
import pytest

from conftest import llava_conversations, preprocess, run_all, write_input
from convtts.state.layout import Layout

pytestmark = pytest.mark.e2e

SETTINGS = ["--set", "tts.backend=silence", "--set", "shards.segments_per_shard=20"]


@pytest.fixture
def spoken(tmp_path):
    """(input, output) of a whole run of three real conversations."""
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    out = tmp_path / "out"
    result = run_all("--input", source, "--output-dir", out, "--gpus", "cpu:1", *SETTINGS)
    assert result.returncode == 0, result.stderr
    return source, out


def changes_told(stderr: str) -> list[str]:
    """The changes the refusal lists: 'changed since: a; b; use a new ...'."""
    told = re.search(r"^error: .* holds synthesis work .*; changed since: (.*); use a new --output-dir", stderr, re.M)
    assert told, stderr
    return told.group(1).split("; ")


def test_a_rerun_with_other_settings_names_each_one_old_and_new(spoken):
    source, out = spoken
    plan = (out / "plan" / "plan.json").read_bytes()
    args = ["--input", source, "--output-dir", out, *SETTINGS]
    refused = run_all(*args, "--gpus", "cpu:1", "--set", "text.max_words=12", "--set", "select.fraction=0.5")
    assert refused.returncode == 2 and "holds synthesis work" in refused.stderr, refused.stderr
    assert changes_told(refused.stderr) == ["select.fraction: null -> 0.5", "text.max_words: 30 -> 12"]
    assert set(re.findall(r"--[a-z][a-z-]*", refused.stderr)) == {"--output-dir", "--force-replan"}
    assert (out / "plan" / "plan.json").read_bytes() == plan  # nothing replanned
    kept = preprocess(*args)  # the settings it was made with: the plan stands
    assert kept.returncode == 0 and "is up to date" in kept.stderr, kept.stderr


def test_a_changed_input_is_named_beside_the_settings(spoken):
    source, out = spoken
    write_input(source, llava_conversations(4))
    refused = preprocess("--input", source, "--output-dir", out, *SETTINGS, "--set", "shards.segments_per_shard=9")
    assert refused.returncode == 2, refused.stderr
    told = changes_told(refused.stderr)
    assert told[0].startswith("the input's content: sha256 ") and told[0].endswith(f"({source})")
    assert told[1:] == ["shards.segments_per_shard: 20 -> 9"]


def test_a_plan_that_kept_no_settings_is_compared_with_the_config_beside_it(spoken):
    # plan.json as made before it kept its settings: config.yaml, written by the preprocess that made it, says them
    source, out = spoken
    layout = Layout(out)
    plan = orjson.loads(layout.plan_file.read_bytes())
    del plan["settings"]
    layout.plan_file.write_bytes(orjson.dumps(plan))
    refused = preprocess("--input", source, "--output-dir", out, *SETTINGS, "--set", "text.max_words=12")
    assert refused.returncode == 2, refused.stderr
    assert changes_told(refused.stderr) == ["text.max_words: 30 -> 12"]
