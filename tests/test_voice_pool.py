"""Voice pools (speakers.pool): a thousand zero-shot voices read from a manifest or a directory,
assigned by the seeded policy, checked before anything starts, and spoken by tiny random CosyVoice
v1 and v2 models of the real architecture through the installed runtime (a worker keeps only a few
voices' prompt features at a time)."""

from __future__ import annotations

import csv
import random
import shutil
import subprocess
import sys

import numpy as np
import orjson
import pytest
import soundfile as sf

from conftest import REPO, assert_complete, read_jsonl, run_all, script_env, write_input
from convtts.config import Config, ConfigError, CosyVoiceConfig, SpeakerConfig, TTSConfig, load_config
from convtts.plan.freshness import plan_is_fresh
from convtts.plan.planner import make_plan
from convtts.plan.voices import Casting, _pick, voice_names
from convtts.speak.cosyvoice.backend import CosyVoiceBackend
from convtts.speak.cosyvoice.prompts import PromptCache, check_pool
from convtts.speak.pool import read_pool
from convtts.state.layout import Layout
from convtts.testing.cosyvoice_model import build_model_dir
from convtts.testing.cosyvoice_v1 import SPEAKERS

VOICES = 1000
RATIO = 3  # speech tokens per text token: short audio keeps the tests fast
TEXTS = [
    "The weather was lovely this morning.",
    "A cat sat on the mat by the door.",
    "We walked to the harbour and watched the boats.",
    "It weighs three kilograms.",
    "The library opens at nine every day.",
    "Yes, that is the right answer.",
]


def conversations(count: int) -> list[dict]:
    return [
        {
            "id": f"c{n:03d}",
            "conversations": [
                {"from": "human", "value": TEXTS[n % 6]},
                {"from": "gpt", "value": TEXTS[(n + 1) % 6]},
                {"from": "human", "value": TEXTS[(n + 2) % 6]},
            ],
        }
        for n in range(count)
    ]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """Five short recordings spoken by the default Piper voice (22050 Hz, as a user's files would be)."""
    from convtts.speak.piper import PiperBackend

    piper = PiperBackend(load_config(None))
    spoken = [(text, piper.synthesize(text, ("joe", "joe-slow")[n % 2], n)) for n, text in enumerate(TEXTS[:5])]
    piper.close()
    return spoken, piper.sample_rate


@pytest.fixture(scope="module")
def pool(tmp_path_factory, recordings):
    """A JSON-lines pool of 1,000 voices: 1,000 files, each a recording cut to its own length and level."""
    spoken, rate = recordings
    folder = tmp_path_factory.mktemp("pool")
    (folder / "audio").mkdir()
    lines = []
    for n in range(VOICES):
        text, samples = spoken[n % len(spoken)]
        cut = samples[: len(samples) - (n // len(spoken)) * 40] * (0.5 + (n % 7) / 14)
        sf.write(folder / "audio" / f"v{n:04d}.wav", cut.astype(np.float32), rate)
        lines.append({"name": f"voice-{n:04d}", "audio": f"audio/v{n:04d}.wav", "text": text})
    manifest = folder / "voices.jsonl"
    manifest.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    return manifest


# -- reading a pool ------------------------------------------------------------------------------


def test_a_pool_reads_from_jsonl_csv_or_a_directory_sorted_by_name(tmp_path, pool):
    voices = read_pool(pool)
    assert len(voices) == VOICES and [v.name for v in voices] == sorted(v.name for v in voices)
    assert voices[3].audio == str(pool.parent / "audio" / "v0003.wav") and voices[3].text == TEXTS[3]

    table = tmp_path / "voices.csv"
    with open(table, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["audio", "text"])  # no name column: the file name is the voice's name
        writer.writerows([[str(pool.parent / "audio" / "v0002.wav"), "Two."], ["../x/b.wav", "Bee."]])
    assert [(v.name, v.audio, v.text) for v in read_pool(table)] == [
        ("b", str((tmp_path.parent / "x" / "b.wav").resolve()), "Bee."),
        ("v0002", str(pool.parent / "audio" / "v0002.wav"), "Two."),
    ]

    folder = tmp_path / "dir"
    (folder / "en").mkdir(parents=True)
    for name in ("en/anna", "ben"):
        shutil.copy(pool.parent / "audio" / "v0001.wav", folder / f"{name}.wav")
        (folder / f"{name}.txt").write_text(f"  {TEXTS[1]}\n")
    assert [(v.name, v.text) for v in read_pool(folder)] == [("ben", TEXTS[1]), ("en/anna", TEXTS[1])]
    (folder / "cleo.flac").write_bytes((folder / "ben.wav").read_bytes())
    with pytest.raises(ConfigError, match="cleo.flac has no transcript beside it"):
        read_pool(folder)


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            [{"name": "a", "audio": "a.wav", "text": "A."}, {"name": "a", "audio": "b.wav", "text": "B."}],
            "voice 'a' is defined twice (voices.jsonl line 1 and voices.jsonl line 2)",
        ),
        ([{"name": "a", "text": "A."}], "voices.jsonl line 1: no audio path"),
        ([{"name": "a", "audio": "a.wav"}], "voices.jsonl line 1: no text"),
        ([], "holds no voices"),
    ],
)
def test_a_malformed_pool_is_named_where_it_is_wrong(tmp_path, lines, message):
    manifest = tmp_path / "voices.jsonl"
    manifest.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    with pytest.raises(ConfigError) as error:
        read_pool(manifest)
    assert message in str(error.value)


# -- assigning voices ----------------------------------------------------------------------------


def list_rule(cid: str, config: SpeakerConfig) -> dict[str, str]:
    """The rule as the planner wrote it before pools: filtered copies of the voice lists (O(voices) a pick)."""
    if config.policy == "single":
        return dict.fromkeys(("human", "assistant", "system"), config.voices[0])
    human = _pick(list(config.human or config.voices), config.seed, cid, "human")
    pool = list(config.assistant or config.voices)
    assistant = _pick([v for v in pool if v != human] or pool, config.seed, cid, "assistant")
    rest = [v for v in config.voices if v not in (human, assistant)] or [assistant]
    return {"human": human, "assistant": assistant, "system": _pick(rest, config.seed, cid, "system")}


def test_constant_time_picks_are_the_list_rule():
    """Plans made before pools keep their voices: the same pick for every mix of voices, repeats and side
    restrictions."""
    rng = random.Random(0)
    for trial in range(300):
        voices = tuple(rng.choice("abcdefg") for _ in range(rng.randint(1, 6)))
        sides = [tuple(rng.sample(voices, rng.randint(0, len(voices)))) if rng.random() < 0.5 else () for _ in "ha"]
        config = SpeakerConfig(
            voices=voices,
            human=sides[0],
            assistant=sides[1],
            seed=trial,
            policy=rng.choice(["by_role", "per_turn", "single"]),
        )
        casting = Casting.of(config)
        assert all(casting.sides(f"c{n}") == list_rule(f"c{n}", config) for n in range(50)), config


def plan_speakers(out) -> dict[str, str]:
    return {
        row["id"]: row["speaker"]
        for shard in sorted((out / "plan" / "shards").glob("shard-?????.jsonl"))
        for row in read_jsonl(shard)
    }


def test_pool_voices_are_assigned_by_the_seeded_policy_and_stay_on_a_rerun(tmp_path, pool):
    source = write_input(tmp_path / "in.json", conversations(60))
    config = load_config(None, [f"speakers.pool={pool}", "tts.backend=silence"])
    layout = Layout(tmp_path / "out")
    make_plan(source, layout, config)
    first = plan_speakers(layout.root)
    names = set(voice_names(config.speakers))
    assert set(first.values()) <= names and len(set(first.values())) > 90  # 60 conversations x 2 sides
    for n in range(60):  # by_role: one voice per side, the two apart
        human, assistant = first[f"c{n:03d}-000-00"], first[f"c{n:03d}-001-00"]
        assert human != assistant and first[f"c{n:03d}-002-00"] == human

    shuffled = tmp_path / "shuffled" / "voices.jsonl"  # elsewhere, lines in another order: same names
    shuffled.parent.mkdir()
    lines = pool.read_bytes().splitlines()
    random.Random(1).shuffle(lines)
    shuffled.write_bytes(b"\n".join(lines) + b"\n")
    (shuffled.parent / "audio").symlink_to(pool.parent / "audio")
    moved = load_config(None, [f"speakers.pool={shuffled}", "tts.backend=silence"])
    assert plan_is_fresh(source, layout, moved)
    make_plan(source, Layout(tmp_path / "again"), moved)
    assert plan_speakers(tmp_path / "again") == first

    shuffled.write_bytes(b"\n".join(lines[:-1]) + b"\n")  # a voice fewer: other voices for some conversations
    assert not plan_is_fresh(source, layout, moved)
    assert not plan_is_fresh(source, layout, load_config(None, ["tts.backend=silence"]))


def test_sides_restricted_to_pool_voices(tmp_path, pool):
    config = load_config(
        None, [f"speakers.pool={pool}", "tts.backend=silence", "speakers.human=[voice-0007, voice-0008]"]
    )
    casting = Casting.of(config.speakers, voice_names(config.speakers))
    assert {casting.sides(f"c{n}")["human"] for n in range(40)} == {"voice-0007", "voice-0008"}
    with pytest.raises(ConfigError, match="not in speakers.pool"):
        voice_names(
            load_config(None, [f"speakers.pool={pool}", "tts.backend=silence", "speakers.assistant=[anna]"]).speakers
        )
    with pytest.raises(ConfigError, match="needs tts.backend cosyvoice"):
        load_config(None, [f"speakers.pool={pool}", "tts.backend=piper"])


# -- speaking from a pool --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[1, 2], ids=["v1", "v2"])
def model_dir(request, tmp_path_factory):
    return build_model_dir(
        tmp_path_factory.mktemp(f"cv{request.param}") / "tiny",
        "tiny",
        SPEAKERS if request.param == 1 else [],
        tokens_per_text_token=RATIO,
        version=request.param,
    )


def pool_backend(model_dir, pool, cache: int, batch_size: int = 1) -> CosyVoiceBackend:
    cosy = CosyVoiceConfig(model_dir=str(model_dir), batch_size=batch_size, prompt_cache=cache)
    return CosyVoiceBackend(
        Config(speakers=SpeakerConfig(pool=str(pool)), tts=TTSConfig(backend="cosyvoice", cosyvoice=cosy))
    )


def registered(backend) -> list[str]:
    return sorted(k for k in backend.model.frontend.spk2info if k.startswith(PromptCache.PREFIX))


@pytest.mark.cosyvoice
def test_a_worker_keeps_a_few_voices_and_speaks_any_of_the_thousand(model_dir, pool):
    """Twelve voices spoken with room for three: never more than three registered, the least recently
    spoken leaving first; a voice that left speaks as it did the first time (its features made again)."""
    backend = pool_backend(model_dir, pool, cache=3)
    try:
        voices = [f"voice-{n:04d}" for n in range(0, VOICES, 83)][:12]
        first = {}
        for n, voice in enumerate(voices):
            first[voice] = backend.synthesize(TEXTS[n % 6], voice, seed=7)
            assert len(registered(backend)) == min(n + 1, 3)
        assert registered(backend) == sorted(PromptCache.PREFIX + v for v in voices[-3:])
        assert backend.prompt_audio(voices[0]) == str(pool.parent / "audio" / f"v{int(voices[0][6:]):04d}.wav")
        again = backend.synthesize(TEXTS[0], voices[0], seed=7)
        assert np.array_equal(again, first[voices[0]])
        assert not np.array_equal(first[voices[0]][:2000], first[voices[1]][:2000])  # the voices differ
        assert len(registered(backend)) == 3
    finally:
        backend.close()


@pytest.mark.cosyvoice
def test_a_batch_of_more_voices_than_the_cache_holds(model_dir, pool):
    """Six utterances in six voices, four rows, room for two voices: each as it is spoken alone."""
    solo = pool_backend(model_dir, pool, cache=2)
    batched = pool_backend(model_dir, pool, cache=2, batch_size=4)
    try:
        items = [(n, TEXTS[n], f"voice-{n * 151:04d}", 100 + n) for n in range(6)]
        results = dict(batched.synthesize_many(items))
        assert len(registered(batched)) == 2
        tolerance = 2e-2 if "cosyvoice.yaml" in {p.name for p in model_dir.iterdir()} else 1e-3  # v1's padded flow
        for key, text, voice, seed in items:
            alone = solo.synthesize(text, voice, seed)
            assert results[key].shape == alone.shape and np.abs(results[key] - alone).max() < tolerance, voice
    finally:
        solo.close()
        batched.close()


@pytest.mark.e2e
@pytest.mark.cosyvoice
def test_run_all_speaks_a_pool_and_exports_name_and_prompt(tmp_path, pool):
    """A whole run with a v2 model and 1,000 voices; the rerun keeps the plan; the exports carry the voice."""
    model = build_model_dir(tmp_path / "cv2", "tiny", [], tokens_per_text_token=RATIO, version=2)
    source = write_input(tmp_path / "in.json", conversations(4))
    out = tmp_path / "out"
    args = (
        "--input",
        source,
        "--output-dir",
        out,
        "--gpus",
        "cpu:1",
        "--workers",
        "1",
        "--log-dir",
        tmp_path / "log",
        "--config",
        REPO / "configs" / "cosyvoice2.yaml",
        "--set",
        f"tts.cosyvoice.model_dir={model}",
        "--set",
        f"speakers.pool={pool}",
        "--set",
        "tts.cosyvoice.batch_size=2",
        "--set",
        "tts.cosyvoice.prompt_cache=2",
    )
    first = run_all(*args, timeout=900)
    assert first.returncode == 0, first.stderr
    rows = assert_complete(out)
    by_name = {v.name: v.audio for v in read_pool(pool)}
    assert len(rows) == 12 and len({r["speaker"] for r in rows}) == 8
    assert all(r["prompt_audio"] == by_name[r["speaker"]] for r in rows)
    logs = "".join(p.read_text() for p in (tmp_path / "log").rglob("*.log"))
    assert f"speakers.pool {pool}: 1000 voices, every recording read in" in logs

    again = run_all(*args, timeout=900)
    assert again.returncode == 0 and "is up to date" in again.stdout + again.stderr + "".join(
        p.read_text() for p in (tmp_path / "log").rglob("*.log")
    )

    exported = subprocess.run(
        [sys.executable, str(REPO / "export.py"), "--format", "nemo", str(out)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr
    lines = read_jsonl(out / "export" / "nemo" / "manifest.json")
    assert {(line["speaker"], line["prompt_audio"]) for line in lines} == {
        (r["speaker"], r["prompt_audio"]) for r in rows
    }


@pytest.mark.e2e
@pytest.mark.cosyvoice
def test_a_broken_recording_in_the_pool_stops_the_run_before_it_starts(tmp_path, pool):
    """One file of the thousand is not audio: run_all.sh exits 2 naming it, and nothing is spoken.
    Cut short, empty, missing, too long, or without v3's marker: each named too."""
    broken = tmp_path / "pool"
    shutil.copytree(pool.parent, broken)
    manifest, target = broken / "voices.jsonl", broken / "audio" / "v0613.wav"
    target.write_bytes(b"RIFF, but not audio at all")
    model = build_model_dir(tmp_path / "cv2", "tiny", [], tokens_per_text_token=RATIO, version=2)
    source = write_input(tmp_path / "in.json", conversations(2))
    result = run_all(
        "--input",
        source,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "cpu:1",
        "--config",
        REPO / "configs" / "cosyvoice2.yaml",
        "--set",
        f"tts.cosyvoice.model_dir={model}",
        "--set",
        f"speakers.pool={manifest}",
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert (
        "voices.jsonl line 614: voice 'voice-0613'" in result.stderr
        and f"{target} is not readable as audio" in result.stderr
    )
    assert not (tmp_path / "out" / "audio").exists()

    samples, rate = sf.read(pool.parent / "audio" / "v0613.wav", dtype="float32")
    sf.write(target.with_suffix(".flac"), samples, rate)
    whole = target.with_suffix(".flac").read_bytes()
    manifest.write_text(manifest.read_text().replace("v0613.wav", "v0613.flac"))
    cases = [
        (whole[: len(whole) // 2], "is not readable as audio"),  # FLAC cut: the decoder loses sync
        (None, "file not found"),
    ]
    for data, message in cases:
        target.with_suffix(".flac").unlink(missing_ok=True)
        if data is not None:
            target.with_suffix(".flac").write_bytes(data)
        with pytest.raises(ConfigError, match=f"voice 'voice-0613': .*{message}"):
            check_pool(str(manifest), 2)
    sf.write(target.with_suffix(".flac"), samples[: rate // 10], rate)
    with pytest.raises(ConfigError, match="holds 0.10 s of audio; a prompt needs at least 0.2 s"):
        check_pool(str(manifest), 2)
    sf.write(target.with_suffix(".flac"), np.tile(samples, 40)[: rate * 31], rate)
    with pytest.raises(ConfigError, match="is 31.0 s; CosyVoice takes prompts of at most 30 s"):
        check_pool(str(manifest), 2)
    with pytest.raises(ConfigError, match="endofprompt"):
        check_pool(str(pool), 3)
