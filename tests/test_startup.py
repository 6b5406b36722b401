"""Start-up of real runs: workers load while the plan is made, the timeline says where the time went,
every worker holds the same weights, and a worker that dies while loading neither loses work nor hangs the slot."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from conftest import (
    REPO,
    alive,
    assert_complete,
    forked_workers,
    llava_conversations,
    parent_of,
    run_all,
    script_env,
    wait_for,
    worker_pids,
    write_input,
)

PACED = ("--set", "tts.backend=paced_backend:PacedTone", "--gpus", "cpu:1")

pytestmark = pytest.mark.e2e


def status(out: Path, rank: int = 0) -> dict:
    return orjson.loads((out / "work" / "slots" / f"slot-{rank}.json").read_bytes())


def slot_log(log: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(log.rglob("slot-0.log")))


def test_workers_load_while_the_plan_is_made_and_the_timeline_says_so(tmp_path):
    """The orchestrator as run_all.sh runs it (python -m convtts), with a plan that takes 3 s
    (tests/slow_plan.py): the workers are spawned and loaded before it is done, and start at once."""
    source = write_input(tmp_path / "in.json", llava_conversations(2))
    env = script_env(
        CONVTTS_PLAN_SCRIPT=REPO / "tests" / "slow_plan.py",
        CONVTTS_TEST_LOAD_SECONDS=1,
        CONVTTS_TEST_UTTERANCE_SECONDS=0.05,
    )
    done = subprocess.run(
        [sys.executable, "-m", "convtts", "--input", str(source), "--output-dir", "out", "--workers", "3", *PACED],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert_complete(out)
    timeline = status(out)["startup"]
    events, workers = timeline["events"], timeline["workers"]
    assert list(workers) == ["0", "1", "2"]
    assert 0 < events["validated"] < events["slot"] < events["plan"] < events["first_busy"] <= events["all_busy"]
    assert events["validated"] < events["plan_started"] < events["plan_made"] <= events["plan"]
    assert events["plan_made"] - events["plan_started"] >= 3.0 and events["first_audio"] >= events["first_busy"]
    for worker in workers.values():
        assert worker["spawned"] < worker["ready"] < events["plan"], worker  # loaded while the plan was made
        assert worker["phases"]["process"] > 0 and worker["phases"]["other"] >= 1.0  # the 1 s load
        assert events["plan"] <= worker["busy"] < events["plan"] + 2.0  # speaking as soon as there is work
    text = slot_log(tmp_path / "log")
    assert "slot 0: start-up: all 3 workers busy at" in text and "worker 2 ready at" in text


def test_a_worker_killed_while_loading_is_replaced_and_nothing_is_lost(tmp_path, small_input):
    out, log = tmp_path / "out", tmp_path / "log"
    run = subprocess.Popen(
        [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(small_input),
            "--output-dir",
            str(out),
            "--log-dir",
            str(log),
            "--workers",
            "2",
            *PACED,
        ],
        env=script_env(CONVTTS_TEST_LOAD_SECONDS=4, CONVTTS_TEST_UTTERANCE_SECONDS=0.05),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(worker_pids(run.pid)) == 2, timeout=60)
        time.sleep(1.0)  # they are in their 4 s load
        os.kill(worker_pids(run.pid)[0], signal.SIGKILL)
        _, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, stderr.decode()
    assert_complete(out)
    text = slot_log(log)
    assert "died (exit -9) in None on None" in text, text  # it held no work: nothing to hand back


def test_workers_that_die_loading_every_time_end_the_slot_without_hanging(tmp_path, small_input):
    started = time.time()
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        tmp_path / "out",
        "--log-dir",
        tmp_path / "log",
        "--workers",
        "2",
        *PACED,
        env=script_env(CONVTTS_TEST_LOAD_DIES=1),
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert time.time() - started < 90
    assert "died 3 times in a row without speaking; giving up" in slot_log(tmp_path / "log")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from convtts.testing.cosyvoice_model import build_model_dir

    return build_model_dir(
        tmp_path_factory.mktemp("cv") / "tiny", "tiny", ("英文女", "英文男"), tokens_per_text_token=3
    )


@pytest.mark.cosyvoice
def test_every_worker_holds_the_same_weights_as_the_files(tmp_path, tiny_model):
    """Two CosyVoice workers, rebuilt every 3 utterances: each of their loads (mapped checkpoints,
    zero fills before the weights are copied in) holds what the model's files hold."""
    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    source = write_input(tmp_path / "in.json", llava_conversations(1))
    out, log = tmp_path / "out", tmp_path / "log"
    sets = [f"tts.cosyvoice.model_dir={tiny_model}", "tts.cosyvoice.batch_size=1", "workers.rebuild_every=3"]
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        "--gpus",
        "cpu:1",
        "--workers",
        "2",
        "--config",
        REPO / "configs" / "cosyvoice.yaml",
        *[x for s in sets for x in ("--set", s)],
        timeout=600,
    )
    assert result.returncode == 0, result.stderr + slot_log(log)
    assert_complete(out)
    builds = [
        line for p in log.rglob("slot-0-worker-*.log") for line in p.read_text().splitlines() if "model built" in line
    ]
    digests = {line.rsplit("weights ", 1)[1] for line in builds}
    assert len(builds) >= 4 and any("(every 3 utterances)" in line for line in builds), builds
    assert digests == {files_digest(tiny_model)}, (digests, builds)
    reference = CosyVoiceBackend(load_config(REPO / "configs" / "cosyvoice.yaml", sets))
    try:
        assert reference.weights_digest() in digests
        assert {w["weights"] for w in status(out)["startup"]["workers"].values()} == digests
        # SFT voices need neither of the frontend's ONNX sessions: they were never opened
        reference.synthesize("A short sentence to speak.", "英文女", seed=1)
        frontend = reference.model.frontend
        assert not frontend.campplus_session.opened and not frontend.speech_tokenizer_session.opened
    finally:
        reference.close()
    phases = [line for line in slot_log(log).splitlines() if "ready at" in line]
    assert len(phases) == 2 and all(name in phases[0] for name in ("imports", "modules", "frontend", "weights")), phases


def files_digest(model_dir: Path) -> str:
    """CosyVoiceBackend.weights_digest of the checkpoint files themselves, read plainly with torch.load."""
    import torch

    from convtts.speak.cosyvoice.reproducible import weights_checksum

    tensors = []
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        state = torch.load(model_dir / name, map_location="cpu", weights_only=True)
        state = {key.replace("generator.", ""): value for key, value in state.items()}  # as upstream loads hift
        tensors += [value for _, value in sorted(state.items())]
    return weights_checksum(tensors)


@pytest.mark.cosyvoice
def test_forked_workers_skip_the_imports_are_replaced_and_die_with_their_slot(tmp_path, tiny_model):
    """CosyVoice workers fork from a server that imported torch and the runtime once
    (workers.start_method auto): a killed one is forked again; a slot killed outright takes its
    server and workers with it; the rerun finishes the job with every id once."""
    source = write_input(tmp_path / "in.json", llava_conversations(4))
    out, log = tmp_path / "out", tmp_path / "log"
    sets = [f"tts.cosyvoice.model_dir={tiny_model}", "tts.cosyvoice.batch_size=1"]
    command = [
        "bash",
        str(REPO / "run_all.sh"),
        "--input",
        str(source),
        "--output-dir",
        str(out),
        "--log-dir",
        str(log),
        "--gpus",
        "cpu:1",
        "--workers",
        "2",
        "--config",
        str(REPO / "configs" / "cosyvoice.yaml"),
        *[x for s in sets for x in ("--set", s)],
    ]
    run = subprocess.Popen(
        command,
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(forked_workers(run.pid)) == 2, timeout=120)
        first = forked_workers(run.pid)
        os.kill(first[0], signal.SIGKILL)
        wait_for(lambda: len(set(forked_workers(run.pid)) - set(first)) == 1, timeout=120)  # forked again
        wait_for(lambda: list((out / "work").glob("*.manifest.jsonl")), timeout=120)  # speaking
        workers = forked_workers(run.pid)
        server = parent_of(workers[0])
        os.kill(parent_of(server), signal.SIGKILL)  # the slot, not its group
        wait_for(lambda: not any(alive(pid) for pid in (server, *workers)), timeout=30)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    rerun = run_all(*command[2:], timeout=600)
    assert rerun.returncode == 0, rerun.stderr + slot_log(log)
    assert_complete(out)
    text = slot_log(log)
    assert "workers start by forkserver" in text and "died (exit -9)" in text, text
    # the server says how long its import took and where: torch, then the runtime and the model's modules
    assert re.search(r"forkserver imported in [\d.]+ s \(torch [\d.]+, .*runtime [\d.]+, model modules", text), text
    sys.path.insert(0, str(REPO / "bench"))
    from e2e import forkserver_imports  # bench/ is not a package: the reader of that line for the figures

    runs = [forkserver_imports([path]) for path in log.rglob("slot-0.log")]  # the killed run's and the rerun's
    assert len(runs) == 2, runs
    for imported in runs:
        assert list(imported["slot-0"]["steps"]) == ["torch", "worker", "runtime", "model modules"], imported
    ready = [line for line in text.splitlines() if "ready at" in line]
    assert ready and all("imports 0.0" in line for line in ready), ready  # imported once, in the server
