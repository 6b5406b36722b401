"""A decode that never draws its end token: it stops at upstream's bound, fails its utterance alone and holds no
more memory than planned, for v1's runner and v2/v3's (tiny random models, CPU, each in a fresh interpreter)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, need, steady_recording, version_env

need("cosyvoice", "cosyvoice")

import torch  # noqa: E402

from convtts.testing import cosyvoice_qwen, cosyvoice_v1  # noqa: E402

pytestmark = pytest.mark.cosyvoice

PROMPT_TEXT = "Hello, this is a short prompt for a new voice."
INSTRUCTION = "You are a helpful assistant.<|endofprompt|>"  # CosyVoice3 asks for it in every prompt
MAX_RATIO = 20  # upstream's max_token_text_ratio, the bound of every chunk's decode
END_TOKEN = {1: cosyvoice_v1.SPEECH_VOCAB, 2: cosyvoice_qwen.SPEECH_VOCAB, 3: cosyvoice_qwen.SPEECH_VOCAB}
# Of full scale, a row beside others against the same utterance through an engine of one row, in
# fp32: only the order of the sums differs (u = 2**-24 of each result, about sqrt(n) u a layer for
# sums of n ~ 1e3 terms; derived in test_cosyvoice_batch.py); 1e-5 is 170 u. Measured: 0 (rows in
# passes of their own here).
TOLERANCE = 1e-5
OFTEN_DRAWN = 917  # v3: the speech token this random model draws most (9 of 1220 draws in the probe's batch)
ENDLESS = re.compile(r"EndlessDecode: chunk 1 of 1 decoded (\d+) speech tokens")


@pytest.fixture(scope="module", params=[1, 2, 3], ids=["v1", "v2", "v3"])
def endless(request, tmp_path_factory):
    """(version, a model directory whose end token is never drawn, a prompt recording for v2/v3)."""
    version = request.param
    out = tmp_path_factory.mktemp(f"endless-v{version}") / "tiny"
    command = [sys.executable, "-m", "convtts.testing.cosyvoice_model", "--version", str(version), "--out", str(out)]
    done = subprocess.run(
        [*command, "--eos-bias", "low"], env=version_env(version), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return version, out, prompt_recording(tmp_path_factory) if version > 1 else None


def prompt_recording(tmp_path_factory):
    return steady_recording(tmp_path_factory.mktemp("prompt") / "anna.wav", PROMPT_TEXT)


def probe(version: int, model, prompt) -> dict:
    """tests/endless_decode_probe.py's report: each utterance batched, alone through the engine, and upstream's."""
    voice = [] if prompt is None else [str(prompt), (INSTRUCTION if version == 3 else "") + PROMPT_TEXT]
    command = [sys.executable, str(REPO / "tests" / "endless_decode_probe.py"), str(model), *voice]
    done = subprocess.run(command, env=version_env(version), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def samples(version: int, speech_tokens: int) -> int:
    if version == 1:
        return cosyvoice_v1.expected_samples(speech_tokens // MAX_RATIO, MAX_RATIO)
    return cosyvoice_qwen.expected_samples(speech_tokens)


def test_a_decode_without_an_end_token_stops_at_the_bound_and_fails_its_utterance(endless):
    version, model, prompt = endless
    report = probe(version, model, prompt)
    assert report["ratios"] == [2.0, MAX_RATIO]  # upstream's own bounds, read from its inference
    returned = dict(report["returned"])
    assert sorted(returned) == list(range(len(report["texts"])))  # each handed back once: no row stalled
    for key, [text_tokens] in enumerate(report["text_tokens"]):
        decoded = ENDLESS.match(returned[key])
        assert decoded and int(decoded.group(1)) == text_tokens * MAX_RATIO, returned[key]
        assert report["alone"][key] == [returned[key], None]  # the same failure with no neighbour
    # upstream's one-at-a-time path runs to the same bound (and writes its 20 tokens a text token of babble)
    assert report["upstream_samples"] == samples(version, report["text_tokens"][0][0] * MAX_RATIO)
    # the static KV cache held the bound from the start: no row grew it
    assert report["cache_after"] == report["cache_planned"]
    # the shortest of the first rows is handed back first, while the longer ones still decode
    first_rows = range(3)
    shortest = min(first_rows, key=lambda key: report["text_tokens"][key][0])
    assert report["returned"][0][0] == shortest


def reachable_end(model, version: int) -> None:
    """Let the end token be drawn now and then: rows then end on it, or run to the bound, by their draws.

    v1's and v2's heads have a bias, where the builder pushed the end token 1e4 down: now 1 above
    where the random model had it. v3's has none: the end token's row becomes a copy of that of the speech
    token drawn most (OFTEN_DRAWN), which ties it: now and then the draw lands on the end token.
    """
    path = model / "llm.pt"
    state = torch.load(path, map_location="cpu", weights_only=True)
    end = END_TOKEN[version]
    if "llm_decoder.bias" in state:
        state["llm_decoder.bias"][end] += 1.0e4 + 1.0
    else:
        state["llm_decoder.weight"][end] = state["llm_decoder.weight"][OFTEN_DRAWN]
    torch.save(state, path)


def test_rows_that_end_are_spoken_as_alone_beside_rows_that_run_to_the_bound(endless, tmp_path):
    version, model, prompt = endless
    mixed = tmp_path / "mixed"
    shutil.copytree(model, mixed)
    reachable_end(mixed, version)
    report = probe(version, mixed, prompt)
    returned = dict(report["returned"])
    assert sorted(returned) == list(range(len(report["texts"])))
    kinds = set()
    for key, [text_tokens] in enumerate(report["text_tokens"]):
        take, (alone, deviation) = returned[key], report["alone"][key]
        if isinstance(take, str):
            assert ENDLESS.match(take) and alone == take, (take, alone)
            kinds.add("bound")
        else:
            assert take == alone and take < samples(version, text_tokens * MAX_RATIO), (take, alone)
            assert deviation <= TOLERANCE, (key, deviation)
            kinds.add("end token")
    assert kinds == {"bound", "end token"}, report["returned"]  # the batch held both kinds of row


def test_check_model_reports_a_model_that_never_ends(tmp_path):
    """Upstream's path and the engine both run to the bound: the same draws, no audio of the engine's to judge."""
    from convtts.speak.cosyvoice import check
    from convtts.testing.cosyvoice_model import build_model_dir

    model = build_model_dir(tmp_path / "tiny", "tiny", ("英文女", "英文男"), eos_bias="low")
    out = tmp_path / "check.json"
    config = ["--config", str(REPO / "configs" / "cosyvoice.yaml"), "--set", f"tts.cosyvoice.model_dir={model}"]
    assert check.main([*config, "--texts", "2", "--out", str(out)]) == 0
    fp32 = json.loads(out.read_text())["runs"]["fp32"]
    assert fp32["llm"]["verdict"] == "pass" and fp32["llm"]["agree"] == fp32["llm"]["steps"] > 0, fp32
    assert fp32["audio"]["compared"] == 0 and fp32["audio"]["endless"] == 2, fp32
    assert fp32["audio"]["verdict"] == "warn" and fp32["audio"]["missing"] == 0, fp32
