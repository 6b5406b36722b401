"""The quality gate (validate:): real Piper audio, the real pocketsphinx recogniser, real run_all.sh runs.

tests/bad_audio_backend.py gives chosen ids wrong audio on their first takes (silence, or another
sentence spoken), and one id wrong audio on every take: the gate must re-speak the first ones with
new seeds, and settle the last by validate.on_fail: keep its last take (marked), drop it, or fail
it so that a rerun tries again; failures.jsonl records its check and figure each way.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import re
import subprocess
import sys

import numpy as np
import orjson
import pytest

from conftest import REPO, assert_complete, need, read_jsonl, run_all, script_env, write_input
from convtts.config import ConfigError, load_config
from convtts.gate.quality import (
    QualityFailure,
    align_words,
    open_gate,
    split_heard,
    spoken_words,
    take_seed,
    word_error_rate,
)
from convtts.language import is_english

BASE_SEED = 1234  # workers.seed's default
# Piper's noise comes from unseeded random ops in its ONNX graph: without it a text is the same audio in
# every run, so what pocketsphinx hears of a good take does not change from run to run (bad takes are
# injected by seed, tests/bad_audio_backend.py)
STEADY = "{length_scale: 1.0, noise_scale: 0.0, noise_w_scale: 0.0, volume: 1.0}"
GATE = (
    "--set",
    "validate.enabled=true",
    "--set",
    f"tts.piper.voices.joe={STEADY}",
    "--set",
    "tts.piper.voices.joe-slow={length_scale: 1.15, noise_scale: 0.0, noise_w_scale: 0.0, volume: 1.0}",
)


def short_conversations() -> list[dict]:
    """Two conversations of short English turns: six segments, each long enough for the ASR check."""
    return [
        {
            "id": "street",
            "conversations": [
                {"from": "human", "value": "What is the man holding in his left hand?"},
                {"from": "gpt", "value": "He is holding a small red umbrella and a newspaper."},
                {"from": "human", "value": "Where is he standing right now?"},
                {"from": "gpt", "value": "He is standing at a bus stop near the park."},
            ],
        },
        {
            "id": "garage",
            "conversations": [
                {"from": "human", "value": "How many bicycles are hanging on the wall?"},
                {"from": "gpt", "value": "There are three bicycles hanging on the wall."},
            ],
        },
    ]


# -- text and scores --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        ("It costs $12.50, 20% off!", "it costs twelve point five zero dollars twenty percent off"),
        ("About 1,500 people, at 20°C.", "about one thousand five hundred people at twenty degrees c"),
        ("Don't SHOUT: it's 3 AM.", "don't shout it's three am"),
        ("这是测试", "这 是 测 试"),
    ],
)
def test_spoken_words_normalise_case_punctuation_and_numbers(text, words):
    assert spoken_words(text) == words.split()


@pytest.mark.parametrize(
    "text, language, units",
    [
        ("我有12个苹果，花了$3。", "zh", "我 有 12 个 苹 果 花 了 3"),  # digits stay digits: 12 or 十二 is heard
        ("用Python写一个函数", "zh", "用 python 写 一 个 函 数"),  # an embedded word is one unit
        ("東京は晴れです", "ja", "東 京 は 晴 れ で す"),
        ("I have 12 apples", "en", "i have twelve apples"),
    ],
)
def test_a_language_written_in_characters_is_scored_by_characters(text, language, units):
    assert spoken_words(text, language) == units.split()
    heard = spoken_words(text.replace("苹果", "平果"), language)
    if language == "zh" and "苹果" in text:
        assert word_error_rate(spoken_words(text, language), heard) == pytest.approx(1 / len(units.split()))


@pytest.mark.parametrize(
    "text, english",
    [
        ("What is the man doing in the picture?", True),
        ("It costs $12.50 at 06:45 on the 3rd floor.", True),
        ("Quelle est la meilleure saison pour visiter Paris ?", False),
        ("Die Katze ist in dem Haus und schläft.", False),
        ("Привет, как у тебя дела сегодня?", False),
        ("今天天气很好，我们去公园吧。", False),
    ],
)
def test_only_english_segments_get_the_asr_check(text, english):
    need("py3langid", "validate")
    assert is_english(text) is english


def test_word_error_rate_counts_substitutions_deletions_insertions():
    assert word_error_rate("a b c d".split(), "a b c d".split()) == 0
    assert word_error_rate("a b c d".split(), "a x c".split()) == 0.5  # one substitution, one deletion
    assert word_error_rate("a b".split(), "a b c d".split()) == 1.0  # two insertions
    assert word_error_rate([], []) == 0


def test_word_alignment_pairs_deletes_and_inserts_in_order():
    assert align_words("a b c".split(), "a x c d".split()) == [(0, 0), (1, 1), (2, 2), (None, 3)]
    assert align_words("a b c".split(), "a c".split()) == [(0, 0), (1, None), (2, 1)]
    assert align_words("a b".split(), "b a b".split()) == [(None, 0), (0, 1), (1, 2)]
    assert align_words("a b".split(), []) == [(0, None), (1, None)]
    assert align_words([], "x y".split()) == [(None, 0), (None, 1)]
    assert align_words([], []) == []


PACKED = [["the", "cat", "sat"], ["on", "a", "mat"], ["by", "the", "door"]]  # three takes' words, one window


@pytest.mark.parametrize(
    "heard, shares",
    [
        ("the cat sat on a mat by the door", ["the cat sat", "on a mat", "by the door"]),
        ("the cat sat by the door", ["the cat sat", "", "by the door"]),  # the middle take unheard: all deleted
        ("um the cat sat uh er on a mat by the door", ["um the cat sat uh er", "on a mat", "by the door"]),  # babble
        ("the cat sad in a mat by the door", ["the cat sad", "in a mat", "by the door"]),  # substitutions at a boundary
        (
            "the cat sat seven purple engines hum by the door",
            ["the cat sat", "seven purple engines hum", "by the door"],
        ),
        ("seven purple engines hum on a mat by the door", ["seven purple engines hum", "on a mat", "by the door"]),
        ("the cat sat uh by the door", ["the cat sat", "uh", "by the door"]),
        ("", ["", "", ""]),
    ],
)
def test_a_packed_windows_words_are_shared_out_among_its_takes(heard, shares):
    """Each take gets the heard words aligned to its own: a take said wrong, or not at all, takes the
    blame (WER 1), and its good neighbours keep what they said (WER 0 here, or the babble beside them)."""
    assert split_heard(PACKED, heard.split()) == [share.split() for share in shares]


def test_a_packed_takes_wer_is_its_own():
    shares = split_heard(PACKED, "the cat sat by the door".split())
    assert [word_error_rate(words, share) for words, share in zip(PACKED, shares)] == [0, 1.0, 0]
    shares = split_heard(PACKED, "the cat sat seven purple engines hum by the door".split())
    assert [word_error_rate(words, share) for words, share in zip(PACKED, shares)] == [0, 4 / 3, 0]


def test_take_seeds_differ_per_take_and_repeat_per_id():
    import hashlib

    seeds = [take_seed(BASE_SEED, "street-000-00", take) for take in range(5)]
    # take 0 is the seed every utterance had before the gate: blake2b of "base:id", 31 bits
    before = int.from_bytes(hashlib.blake2b(f"{BASE_SEED}:street-000-00".encode(), digest_size=4).digest(), "little")
    assert len(set(seeds)) == 5 and seeds[0] == before & 0x7FFFFFFF
    assert seeds == [take_seed(BASE_SEED, "street-000-00", take) for take in range(5)]


@pytest.fixture(scope="module")
def voice_and_gate():
    from convtts.speak.piper import PiperBackend

    need("pocketsphinx", "validate")
    need("soxr", "validate")
    config = load_config(None, ["validate.enabled=true", "speakers.voices=[joe]", f"tts.piper.voices.joe={STEADY}"])
    return PiperBackend(config), open_gate(config.validate)


def test_gate_passes_real_speech_and_refuses_wrong_audio(voice_and_gate):
    voice, gate = voice_and_gate
    text = "There are three bicycles hanging on the wall."
    good = voice.synthesize(text, "joe", 1)
    scores = gate.judge(good, voice.sample_rate, text)
    assert scores["asr"] == "pocketsphinx" and scores["wer"] < 0.5 and "bicycles" in scores["heard"]
    assert 0.15 < scores["seconds_per_word"] < 0.8 and scores["silence"] < 0.5 and scores["clipped"] < 0.01

    with pytest.raises(QualityFailure) as silent:
        gate.judge(np.zeros(int(voice.sample_rate * 3), np.float32), voice.sample_rate, text)
    assert silent.value.check == "silence" and silent.value.figure == 1.0 and str(silent.value) == "silence 1 > 0.6"

    other = voice.synthesize("Seven purple engines hum quietly beneath the old harbour bridge.", "joe", 1)
    with pytest.raises(QualityFailure) as wrong:
        gate.judge(other, voice.sample_rate, text)
    assert wrong.value.check == "wer" and wrong.value.figure > 0.6 and "purple" in wrong.value.scores["heard"]

    with pytest.raises(QualityFailure) as cut:
        gate.judge(good[: len(good) // 5], voice.sample_rate, text)
    assert cut.value.check == "short"

    clipped = np.clip(good * 20, -1, 1)
    with pytest.raises(QualityFailure) as loud:
        gate.judge(clipped, voice.sample_rate, text)
    assert loud.value.check == "clipped"


def test_a_segment_the_recogniser_does_not_hear_is_unchecked_not_failed(voice_and_gate):
    """pocketsphinx hears English: a French segment (by the language test) and a Chinese one (by its
    plan row's language) pass unchecked, with the reason; an English one gets the check."""
    voice, gate = voice_and_gate
    text = "Quelle est la meilleure saison pour visiter Paris ?"
    scores = gate.judge(voice.synthesize(text, "joe", 1), voice.sample_rate, text)
    assert scores["asr"] == "skipped: language fr: pocketsphinx does not hear it" and "wer" not in scores
    chinese = "今天天气很好，我们去公园散步吧。"
    audio = voice.synthesize("Today the weather is fine, let us walk in the park.", "joe", 1)
    scores = gate.judge(audio, voice.sample_rate, chinese, "park-000-00", "zh")
    assert scores["asr"] == "skipped: language zh: pocketsphinx does not hear it" and "cer" not in scores
    english = "There are three bicycles hanging on the wall."
    assert gate.judge(voice.synthesize(english, "joe", 1), voice.sample_rate, english, "", "en")["wer"] < 0.6


def test_asr_share_samples_ids_deterministically(voice_and_gate):
    from convtts.gate.quality import Gate, in_share

    ids = [f"c{n}-001-00" for n in range(2000)]
    chosen = [uid for uid in ids if in_share(uid, 0.25)]
    assert 0.2 < len(chosen) / len(ids) < 0.3 and chosen == [uid for uid in ids if in_share(uid, 0.25)]
    voice, gate = voice_and_gate
    text = "There are three bicycles hanging on the wall."
    sampled = Gate(dataclasses.replace(gate.cfg, asr_share=0.25), gate.recogniser)
    left_out = next(uid for uid in ids if uid not in chosen)
    assert (
        sampled.judge(voice.synthesize(text, "joe", 1), voice.sample_rate, text, left_out)["asr"]
        == "skipped: not sampled"
    )
    assert sampled.judge(voice.synthesize(text, "joe", 1), voice.sample_rate, text, chosen[0])["asr"] == "pocketsphinx"


@pytest.mark.parametrize(
    "override, message",
    [
        ("validate.max_respeaks=-1", "validate.max_respeaks"),
        ("validate.max_wer=0", "validate.max_wer"),
        ("validate.max_cer=0", "validate.max_cer"),
        ("validate.max_error_by_language={zh: 0}", "validate.max_error_by_language.zh must be"),
        ("validate.max_error_by_language={chinese: 0.3}", "validate.max_error_by_language.chinese must be"),
        ("validate.asr_share=0", "validate.asr_share"),
        ("validate.max_silence_share=1.5", "validate.max_silence_share"),
        ("validate.min_seconds_per_word=2", "validate.min_seconds_per_word"),
        ("validate.silence_db=10", "validate.silence_db"),
        ("validate.recogniser=kaldi", "validate.recogniser must be one of"),
        ("validate.recogniser=whisper", "validate.model_path is required"),
        ("validate.recogniser=faster-whisper", "validate.model_path is required"),
        ("validate.model_path=/x.pt", "only for the Whisper recognisers"),
        ("validate.max_respeak=2", "did you mean 'max_respeaks'"),
        ("validate.asr_pack=maybe", "validate.asr_pack must be true or false"),
        ("validate.on_fail=skip", "validate.on_fail must be one of keep, drop, fail, got 'skip'"),
    ],
)
def test_validate_config_is_checked_up_front(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [override])


def test_whisper_weights_must_exist_locally(tmp_path):
    with pytest.raises(ConfigError, match="validate.model_path not found"):
        load_config(None, ["validate.recogniser=whisper", f"validate.model_path={tmp_path / 'small.pt'}"])
    with pytest.raises(ConfigError, match="must be a model directory"):
        (tmp_path / "model.bin").write_bytes(b"x")
        load_config(None, ["validate.recogniser=faster-whisper", f"validate.model_path={tmp_path / 'model.bin'}"])
    config = load_config(None, ["validate.recogniser=faster-whisper", f"validate.model_path={tmp_path}"])
    assert config.validate.model_path == str(tmp_path)


# -- whole runs -----------------------------------------------------------------------------------


def gated_run(tmp_path, backend: str, bad: str, *extra) -> tuple[subprocess.CompletedProcess, tuple]:
    need("pocketsphinx", "validate")  # the workers' recogniser
    need("soxr", "validate")
    source = write_input(tmp_path / "in.json", short_conversations())
    args = (
        "--input",
        source,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "cpu:1",
        "--workers",
        "1",
        "--set",
        f"tts.backend={backend}",
        *GATE,
        *extra,
    )
    return run_all(*args, env=script_env(CONVTTS_TEST_BAD=bad)), args


@pytest.mark.e2e
def test_turns_the_recogniser_does_not_hear_are_counted_unchecked(tmp_path):
    """A mixed input on a voice that speaks any language, gated by pocketsphinx (English): the English
    rows are scored, the Chinese ones pass unchecked with the reason, and summary.json counts them."""
    need("pocketsphinx", "validate")
    chinese = {
        "id": "park",
        "conversations": [
            {"from": "human", "value": "今天天气怎么样？我们可以去公园散步吗？"},
            {"from": "gpt", "value": "今天天气晴朗，气温二十度左右，很适合去公园散步。"},
        ],
    }
    source = write_input(tmp_path / "in.json", short_conversations()[1:] + [chinese])
    out = tmp_path / "out"
    result = run_all(
        "--input", source, "--output-dir", out, "--gpus", "cpu:1", "--workers", "1",
        "--set", "tts.backend=bad_audio_backend:BatchedBadAudioPiper", *GATE,
        "--set", "validate.max_seconds_per_word=5",  # espeak spells each character out
        env=script_env(CONVTTS_TEST_BAD=""),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {r["id"]: r for r in assert_complete(out)}
    assert {uid: row["language"] for uid, row in rows.items()} == {
        "garage-000-00": "en", "garage-001-00": "en", "park-000-00": "zh", "park-001-00": "zh",
    }  # fmt: skip
    assert all(rows[f"garage-00{n}-00"]["quality"]["wer"] < 0.6 for n in (0, 1))
    unheard = "skipped: language zh: pocketsphinx does not hear it"
    assert [rows[f"park-00{n}-00"]["quality"]["asr"] for n in (0, 1)] == [unheard, unheard]
    quality = orjson.loads((out / "summary.json").read_bytes())["quality"]
    assert quality["asr_skipped"] == {"language zh: pocketsphinx does not hear it": 2}
    assert quality["wer"]["scored"] == 2


def test_an_unknown_on_fail_stops_the_run_in_one_line(tmp_path):
    source = write_input(tmp_path / "in.json", short_conversations())
    result = subprocess.run(
        [sys.executable, "preprocess.py", "--input", source, "--output-dir", tmp_path / "out", "--validate"]
        + ["--set", "validate.on_fail=retry"],
        cwd=REPO,
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: config error: validate.on_fail must be one of keep, drop, fail, got 'retry'"
    ]


@pytest.mark.e2e
def test_gate_respeaks_bad_takes_and_records_the_hopeless_one(tmp_path):
    bad = "street-000-00=silence:1,street-001-00=other:2,garage-000-00=other:all"
    first, args = gated_run(tmp_path, "bad_audio_backend:BadAudioPiper", bad, "--set", "validate.on_fail=fail")
    out = tmp_path / "out"
    assert first.returncode == 1, first.stderr  # one utterance failed: cron sees it
    assert "exited" not in first.stderr  # no slot crashed: the gate refused, and the summary says so
    told = "the quality gate refused every take of 1 utterance (wer: 1): 1 failed: a rerun speaks them again"
    assert f"{told}; see {out / 'failures.jsonl'}" in first.stdout
    rows = {r["id"]: r for r in read_jsonl(out / "manifest.jsonl")}
    assert len(rows) == 5 and "garage-000-00" not in rows

    silent, other = rows["street-000-00"], rows["street-001-00"]
    assert silent["respeaks"] == 1 and silent["respoken_for"] == ["silence 1 > 0.6"]
    assert other["respeaks"] == 2 and all(r.startswith("wer ") for r in other["respoken_for"])
    for row in rows.values():  # the seed of the take that was kept, derived from the id and the take
        assert row["seed"] == take_seed(BASE_SEED, row["id"], row["respeaks"])
        assert row["quality"]["asr"] == "pocketsphinx" and row["quality"]["wer"] <= 0.6
    assert rows["garage-001-00"]["quality"]["wer"] < 0.6 and "wall" in rows["garage-001-00"]["quality"]["heard"]

    failed = [f for f in read_jsonl(out / "failures.jsonl") if f["status"] == "failed"]
    assert [f["id"] for f in failed] == ["garage-000-00"]
    failure = failed[0]
    assert failure["check"] == "wer" and failure["figure"] > 0.6 and failure["limit"] == 0.6
    assert failure["reason"] == f"wer {failure['figure']:.3g} > 0.6" and failure["respeaks"] == 2
    assert len(failure["errors"]) == 3 and "purple" in failure["quality"]["heard"]

    quality = orjson.loads((out / "summary.json").read_bytes())["quality"]
    assert quality["gated"] == 5 and quality["respoken"] >= 2 and quality["failed_by_reason"] == {"wer": 1}
    assert quality["wer"]["scored"] == 5 and 0 <= quality["wer"]["mean"] <= 0.6
    assert "quality gate: 5 passed" in first.stdout

    check_report(out)

    again = run_all(*args, env=script_env())  # the backend speaks well now: the rerun finishes the work
    assert again.returncode == 0, again.stderr
    finished = {r["id"]: r for r in assert_complete(out)}
    assert finished["garage-000-00"]["quality"]["wer"] <= 0.6
    assert {k: v for k, v in finished.items() if k != "garage-000-00"} == rows  # nothing else spoken again


def check_report(out):
    """python -m convtts.results.report writes a page with a real PNG holding the three figures."""
    image = need("matplotlib.image", "validate")
    result = subprocess.run(
        [sys.executable, "-m", "convtts.results.report", str(out)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    page = (out / "report.html").read_text()
    png = base64.b64decode(re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page).group(1))
    picture = image.imread(io.BytesIO(png), format="png")
    assert picture.shape[0] > 300 and picture.shape[1] > 1000 and picture.std() > 0.05  # drawn, not blank
    assert "garage-000-00" in page and "wer 0." in page


@pytest.mark.e2e
def test_takes_refused_on_every_run_are_kept_by_default_and_a_rerun_exits_0(tmp_path):
    bad = "garage-000-00=other:all"  # the recogniser mishears it on every take of every run
    first, args = gated_run(tmp_path, "bad_audio_backend:BadAudioPiper", bad)
    out = tmp_path / "out"
    assert first.returncode == 0, first.stderr
    rows = {r["id"]: r for r in assert_complete(out)}  # every id once, with whole audio
    kept = rows["garage-000-00"]
    assert kept["status"] == "gate-refused-kept" and kept["refused"]["check"] == "wer"
    assert kept["respeaks"] == 2 and kept["seed"] == take_seed(BASE_SEED, "garage-000-00", 2)
    assert kept["quality"]["wer"] > 0.6 and "purple" in kept["quality"]["heard"]
    assert all(r["status"] == "ok" for uid, r in rows.items() if uid != "garage-000-00")
    (failure,) = [f for f in read_jsonl(out / "failures.jsonl") if f["id"] == "garage-000-00"]
    assert failure["status"] == "gate-refused-kept" and failure["audio"] == kept["audio"]
    assert failure["check"] == "wer" and failure["figure"] > 0.6 and failure["quality"] == kept["quality"]
    refused = orjson.loads((out / "summary.json").read_bytes())["quality"]["refused"]
    assert refused == {"utterances": 1, "kept": 1, "dropped": 0, "failed": 0, "by_check": {"wer": 1}}
    line = "the quality gate refused every take of 1 utterance (wer: 1): 1 kept, status gate-refused-kept"
    assert line in first.stdout

    again = run_all(*args, env=script_env(CONVTTS_TEST_BAD=bad))  # the same mishearing: nothing to redo
    assert again.returncode == 0, again.stderr
    assert line in again.stdout and "Run the same command again" not in again.stderr
    assert {r["id"]: r for r in read_jsonl(out / "manifest.jsonl")} == rows
    assert orjson.loads((out / "summary.json").read_bytes())["this_run"]["utterances"] == 0


@pytest.mark.e2e
def test_gate_works_on_the_batched_path_and_drops_the_hopeless_take(tmp_path):
    bad = "street-001-00=silence:1,garage-000-00=other:all"
    settings = ("--set", "validate.max_respeaks=1", "--set", "validate.on_fail=drop")
    first, args = gated_run(tmp_path, "bad_audio_backend:BatchedBadAudioPiper", bad, *settings)
    out = tmp_path / "out"
    assert first.returncode == 0, first.stderr
    rows = {r["id"]: r for r in assert_complete(out)}  # every id once but the dropped one
    assert len(rows) == 5 and rows["street-001-00"]["respoken_for"] == ["silence 1 > 0.6"]
    assert rows["street-001-00"]["seed"] == take_seed(BASE_SEED, "street-001-00", 1)
    dropped = [f for f in read_jsonl(out / "failures.jsonl") if f["status"] == "dropped"]
    assert [(f["id"], f["check"], f["respeaks"]) for f in dropped] == [("garage-000-00", "wer", 1)]
    assert "purple" in dropped[0]["quality"]["heard"] and not list(out.rglob("garage-000-00.*"))
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["complete"] and summary["dropped"] == 1 and summary["done"] == 5
    assert "1 dropped, not spoken" in first.stdout

    again = run_all(*args, env=script_env(CONVTTS_TEST_BAD=bad))  # dropped is final: not spoken again
    assert again.returncode == 0, again.stderr
    assert orjson.loads((out / "summary.json").read_bytes())["this_run"]["utterances"] == 0
    assert [f["id"] for f in read_jsonl(out / "failures.jsonl") if f["status"] == "dropped"] == ["garage-000-00"]


@pytest.mark.e2e
def test_missing_recogniser_package_is_a_config_error(tmp_path):
    """validate on with a recogniser that is not installed: exit 2 before anything is spoken."""
    assert not _installed("faster_whisper"), "this test needs an environment without faster-whisper"
    source = write_input(tmp_path / "in.json", short_conversations())
    result = run_all(
        "--input",
        source,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "cpu:1",
        *GATE,
        "--set",
        "validate.recogniser=faster-whisper",
        "--set",
        f"validate.model_path={tmp_path}",
    )
    assert result.returncode == 2 and "pip install faster-whisper" in result.stderr
    assert not (tmp_path / "out" / "audio").exists()


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_whisper_recogniser_loads_a_local_checkpoint(tmp_path):
    """The openai-whisper path on a random-weight checkpoint of the real architecture (no real weights
    can be had here): the file loads, 16 kHz audio goes in, a transcript comes out and is scored.
    What it hears is noise, so this proves the plumbing, not Whisper's accuracy."""
    import torch

    whisper = need("whisper.model", "cosyvoice")  # openai-whisper
    dims = whisper.ModelDimensions(
        n_mels=80,
        n_audio_ctx=1500,
        n_audio_state=64,
        n_audio_head=2,
        n_audio_layer=1,
        n_vocab=51865,
        n_text_ctx=448,
        n_text_state=64,
        n_text_head=2,
        n_text_layer=1,
    )
    torch.manual_seed(0)
    checkpoint = tmp_path / "whisper-random.pt"
    torch.save({"dims": dataclasses.asdict(dims), "model_state_dict": whisper.Whisper(dims).state_dict()}, checkpoint)
    config = load_config(
        None, ["validate.enabled=true", "validate.recogniser=whisper", f"validate.model_path={checkpoint}"]
    )
    gate = open_gate(config.validate)
    text = "There are three bicycles hanging on the wall."
    speech = (np.random.default_rng(0).standard_normal(22050 * 3) * 0.1).astype(np.float32)
    with pytest.raises(QualityFailure) as heard:
        gate.judge(speech, 22050, text)
    assert heard.value.check == "wer" and heard.value.scores["asr"] == "whisper" and heard.value.scores["heard"]


def test_report_names_speakers_the_chart_font_cannot_draw(tmp_path):
    """CosyVoice's SFT voices have Chinese names: the chart labels them 'speaker N' (no empty boxes,
    no missing-glyph warning) and the page's table gives the real names beside those labels."""
    import warnings

    need("matplotlib", "validate")
    from convtts.results.report import PageFigures, chart_labels, figures_png, page
    from convtts.state.layout import Layout

    rows = [
        {"id": f"c-000-0{i}", "speaker": name, "duration": 3600.0 * (i + 1)}
        for i, name in enumerate(["英文女", "英文男", "joe"])
    ]
    assert chart_labels(["英文女", "joe", "英文男"]) == {"英文女": "speaker 1", "joe": "joe", "英文男": "speaker 3"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for a name it cannot draw
        png = figures_png(PageFigures.of(rows), None)
    text = page(Layout(tmp_path), PageFigures.of(rows), png)
    assert "<td>英文男</td><td>speaker 2</td><td>2.000</td>" in text.replace("\n", "")
    assert "<td>joe</td><td>joe</td><td>3.000</td>" in text.replace("\n", "")
