"""run_all.sh --engine ray on a real local Ray cluster: several raylet nodes on this machine, a custom
resource (or declared GPUs) standing in for GPUs, the Piper voice, real kills of a node and of the driver."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from conftest import (
    REPO,
    alive,
    assert_complete,
    llava_conversations,
    lock_free,
    mps_requests,
    need,
    read_jsonl_tolerant,
    run_all,
    script_env,
    wait_for,
    write_fake_mps,
    write_input,
)

Cluster = need("ray.cluster_utils", "ray").Cluster
pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]

SLOT = "convtts_slot"  # the custom resource standing in for a GPU: one slot per unit
SMALL = {"num_cpus": 1, "object_store_memory": 80 * 2**20}  # two cores on this machine, shared


@pytest.fixture
def cluster(monkeypatch):
    """make(*nodes) starts a head (no slots, it runs the driver) and one raylet per node given.

    Ray's processes inherit this environment: the branch's convtts on PYTHONPATH, and PATH.
    """
    monkeypatch.setenv("PYTHONPATH", script_env()["PYTHONPATH"])
    made = []

    def make(*nodes: dict):
        head = Cluster(initialize_head=True, head_node_args={**SMALL, "include_dashboard": False})
        made.append(head)
        return head, [head.add_node(**SMALL, **node) for node in nodes]

    yield make
    for one in made:
        one.shutdown()


def ray_args(address: str, resource: str = SLOT, workers: int = 1) -> list[str]:
    return [
        "--engine",
        "ray",
        "--address",
        address,
        "--slot-resource",
        resource,
        "--workers",
        str(workers),
        "--set",
        "shards.segments_per_shard=5",
    ]


def start(source: Path, out: Path, log: Path, args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(source),
            "--output-dir",
            str(out),
            "--log-dir",
            str(log),
            *args,
        ],
        env=env or script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the test kills run_all.sh and its driver together
    )


def driver_log(log: Path) -> str:
    found = sorted(log.rglob("driver.log"))
    return found[-1].read_text() if found else ""


def slots_started(text: str) -> dict[int, tuple[str, int, str]]:
    """rank -> (node id prefix, pid, CUDA_VISIBLE_DEVICES), from the driver's 'slot N running on' lines."""
    pattern = r"slot (\d+) running on \S+ \(node (\w+), pid (\d+), CUDA_VISIBLE_DEVICES=([\d,]*)\)"
    return {int(m[1]): (m[2], int(m[3]), m[4]) for m in re.finditer(pattern, text)}


def writer_rows(out: Path, pattern: str = "*") -> dict[str, list[dict]]:
    """Rows of the workers' own manifest files, by file name."""
    return {p.name: read_jsonl_tolerant(p) for p in (out / "work").glob(f"shard-*.{pattern}.manifest.jsonl")}


def midway(out: Path, log: Path, node_id: str) -> bool:
    """The slot on this node has spoken part of a shard it has not finished: killing it now loses work in hand."""
    run_dir = next(log.rglob("driver.log"), None)
    started = slots_started(driver_log(log))
    victim = [rank for rank, (node, _, _) in started.items() if node_id.startswith(node)]
    if run_dir is None or not victim:
        return False
    for name, rows in writer_rows(out, f"{run_dir.parent.name}-s{victim[0]}-w*").items():
        shard = name.split(".")[0]
        planned = len(read_jsonl_tolerant(out / "plan" / "shards" / f"{shard}.jsonl"))
        # some of the shard spoken and some not: a shard the slot has just finished leaves it no work in hand
        if 2 <= len(rows) < planned and not (out / "work" / f"{shard}.stats.json").exists():
            return True
    return False


def test_a_node_killed_mid_run_has_its_shards_redone_by_the_others(tmp_path, cluster):
    source = write_input(tmp_path / "in.json", llava_conversations(4))
    head, (_, victim) = cluster({"resources": {SLOT: 1}}, {"resources": {SLOT: 1}})
    out, log = tmp_path / "out", tmp_path / "log"
    run = start(source, out, log, ray_args(head.address))
    try:
        wait_for(lambda: midway(out, log, victim.node_id), timeout=240)
        head.remove_node(victim)  # its raylet and everything on it: the node is gone
        _, stderr = run.communicate(timeout=400)
    finally:
        run.kill()
    text = driver_log(log)
    assert run.returncode == 0, stderr.decode() + text
    rows = assert_complete(out)  # every id once, every audio whole
    assert re.search(r"slot \d+ on \S+ lost: .*node", text), text
    assert re.search(r"slot \d+ lost: \d+ pieces \(\d+ utterances\).* go back in line", text), text
    slot_logs = "\n".join(p.read_text() for p in log.rglob("slot-?.log"))
    assert re.search(r"piece \d+ of shard-\d+ \(a lost slot's\): \d+ already spoken, \d+ to speak", slot_logs), (
        slot_logs
    )
    lost_pid = [pid for node, pid, _ in slots_started(text).values() if victim.node_id.startswith(node)]
    wait_for(lambda: not alive(lost_pid[0]), timeout=30)  # the lost slot's process did not outlive its node
    # Nothing was spoken twice, but for at most the one utterance the lost slot's worker had in flight.
    spoken = Counter(r["id"] for file_rows in writer_rows(out).values() for r in file_rows)
    assert sum(spoken.values()) - len(rows) <= 1, [uid for uid, n in spoken.items() if n > 1]
    assert len({r["run"] for r in rows}) == 1


def test_one_shard_is_spoken_by_every_slot_in_pieces_and_its_stats_written_once(tmp_path, cluster):
    """The driver hands out pieces, not shards: two slots share a one-shard job, each writing files
    of its own, and the shard is marked done once, after its last piece."""
    source = write_input(tmp_path / "in.json", llava_conversations(4))
    head, _ = cluster({"resources": {SLOT: 1}}, {"resources": {SLOT: 1}})
    out, log = tmp_path / "out", tmp_path / "log"
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        *ray_args(head.address),
        "--set",
        "shards.segments_per_shard=200",
    )
    text = driver_log(log)
    assert result.returncode == 0, result.stderr + text
    rows = assert_complete(out)
    assert len(list((out / "plan" / "shards").glob("shard-?????.jsonl"))) == 1
    by_slot = Counter(
        name.split(".")[1].rsplit("-w", 1)[0][-2:] for name, file_rows in writer_rows(out).items() for _ in file_rows
    )
    assert set(by_slot) == {"s0", "s1"} and min(by_slot.values()) >= 0.25 * len(rows), by_slot
    finished = re.findall(r"shard-00000 finished: (\d+) of (\d+) spoken \((\d+) now, in (\d+) pieces\), 0 failed", text)
    assert len(finished) == 1 and finished[0][0] == finished[0][1] == str(len(rows)) and int(finished[0][3]) >= 4, text
    stats = orjson.loads((out / "work" / "shard-00000.stats.json").read_bytes())
    assert stats["done"] == stats["segments"] == len(rows) and stats["failed"] == 0 and stats["pending"] == 0


def test_driver_killed_then_rerun_completes_and_a_second_driver_is_refused(tmp_path, cluster):
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    head, _ = cluster({"resources": {SLOT: 1}})
    out, log = tmp_path / "out", tmp_path / "log"

    missing = run_all(
        "--input",
        source,
        "--output-dir",
        tmp_path / "other",
        "--log-dir",
        tmp_path / "log-other",
        *ray_args(head.address, "no_such_thing"),
    )
    assert missing.returncode == 2 and "no 'no_such_thing' resource" in missing.stderr, missing.stderr

    run = start(source, out, log, ray_args(head.address))
    try:
        wait_for(lambda: sum(map(len, writer_rows(out).values())) >= 4 if (out / "work").is_dir() else False)
        second = run_all("--input", source, "--output-dir", out, *ray_args(head.address))
        assert second.returncode == 3, second.stderr  # the driver holds the output's lock
        os.killpg(run.pid, signal.SIGKILL)  # run_all.sh and the driver; the slots live under Ray
        run.wait()
    finally:
        run.kill()
    slot_pids = [pid for _, pid, _ in slots_started(driver_log(log)).values()]
    assert slot_pids
    wait_for(lambda: not any(alive(pid) for pid in slot_pids), timeout=60)  # Ray ends a dead driver's slots
    before = {r["id"]: r for rows in writer_rows(out).values() for r in rows}
    assert 4 <= len(before)

    again = run_all("--input", source, "--output-dir", out, "--log-dir", log, *ray_args(head.address))
    assert again.returncode == 0, again.stderr + driver_log(log)
    rows = {r["id"]: r for r in assert_complete(out)}
    kept = [uid for uid, row in before.items() if rows[uid]["run"] == row["run"]]
    assert len(kept) == len(before), "finished work was spoken again"


def test_kill_9_of_run_all_alone_stops_the_driver_and_frees_the_lock(tmp_path, cluster):
    """The driver learns of run_all.sh's death (a parent-death signal) and lets its slots go as on a
    Ctrl-C, so the output's lock is free and a rerun finishes the job."""
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    head, _ = cluster({"resources": {SLOT: 1}})
    out, log = tmp_path / "out", tmp_path / "log"
    run = start(source, out, log, ray_args(head.address))
    try:
        wait_for(lambda: sum(map(len, writer_rows(out).values())) >= 2 if (out / "work").is_dir() else False)
        os.kill(run.pid, signal.SIGKILL)  # run_all.sh alone: no trap runs, its driver is orphaned
        run.wait()
        wait_for(lambda: "stopped by SIGTERM" in driver_log(log), timeout=30)
        wait_for(lambda: lock_free(out), timeout=30)
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)  # what is left of the run, should the test fail
        except ProcessLookupError:
            pass
    again = run_all("--input", source, "--output-dir", out, "--log-dir", log, *ray_args(head.address))
    assert again.returncode == 0, again.stderr + driver_log(log)
    assert_complete(out)


def test_gpu_slots_one_per_gpu_and_one_mps_daemon_per_node(tmp_path, cluster, monkeypatch):
    """Nodes that declare GPUs (none is touched: Piper runs on the CPU): Ray gives each slot its own
    device, and each node's slots share one MPS daemon, started and stopped once (a stand-in
    nvidia-cuda-mps-control on PATH records the requests)."""
    bin_dir = tmp_path / "bin"
    write_fake_mps(bin_dir)
    record = tmp_path / "mps.log"
    monkeypatch.setenv("MPS_TEST_LOG", str(record))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    source = write_input(tmp_path / "in.json", llava_conversations(2))
    head, (two, one) = cluster({"num_gpus": 2}, {"num_gpus": 1})
    out, log = tmp_path / "out", tmp_path / "log"

    result = run_all("--input", source, "--output-dir", out, "--log-dir", log, *ray_args(head.address, "GPU"))
    text = driver_log(log)
    assert result.returncode == 0, result.stderr + text
    assert_complete(out)
    started = slots_started(text)
    by_node = {
        n.node_id[:8]: sorted(gpu for node, _, gpu in started.values() if n.node_id.startswith(node))
        for n in (two, one)
    }
    assert by_node == {two.node_id[:8]: ["0", "1"], one.node_id[:8]: ["0"]}, text
    assert sorted(mps_requests(record)) == sorted(["start", "get_server_list", "quit"] * 2)
    pipes = [line.split()[1] for line in record.read_text().splitlines() if line.startswith("start")]
    assert len(set(pipes)) == 2  # a private daemon per node
    # pytest's long log path gives each daemon a short pipe folder in /tmp: gone once the run ends
    folders = [pipe.removeprefix("pipe=") for pipe in pipes]
    assert all(f.startswith("/tmp/convtts-mps.") and not Path(f).exists() for f in folders), folders
    assert len(list(log.rglob("slot-?.log"))) == 3


def test_address_local_runs_the_job_on_a_cluster_of_its_own(tmp_path, cluster):
    # the driver starts Ray itself, with its own system config (ray_engine.LOCAL_CLUSTER), and stops
    # it, even beside another cluster on this machine (which Ray would otherwise join)
    cluster()
    source = write_input(tmp_path / "in.json", llava_conversations(images=3))
    out, log = tmp_path / "out", tmp_path / "log"
    args = ["--engine", "ray", "--address", "local", "--slot-resource", "CPU", "--workers", "1"]
    run = start(source, out, log, [*args, "--set", "shards.segments_per_shard=5"])
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr.decode()[-3000:]
    assert_complete(out)
    assert len(slots_started(driver_log(log))) == os.cpu_count()  # one slot per core of this machine
    # the merge ran on the driver's word (driver.exit), but the run waited for the driver to stop Ray
    assert [f.read_text() for f in log.rglob("driver.exit")] == ["0\n"]
    drivers = subprocess.run(["pgrep", "-f", f"convtts.cluster.ray_engine --output-dir {out}"], capture_output=True)
    assert drivers.stdout == b"", drivers.stdout


def test_verify_reaches_the_ray_slots_and_finds_damage_that_keeps_the_size(tmp_path, cluster):
    head, _ = cluster({"resources": {SLOT: 1}})
    source = write_input(tmp_path / "in.json", llava_conversations(images=2))
    out = tmp_path / "out"
    args = ray_args(head.address)
    first = start(source, out, tmp_path / "log", args)
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr.decode()[-3000:]
    rows = {r["id"]: r for r in assert_complete(out)}
    row = next(iter(rows.values()))
    audio = out / row["audio"]
    data = audio.read_bytes()
    audio.write_bytes(b"XXXX" + data[4:])  # the header overwritten in place: the same size, no WAV
    # without --verify the slots would trust the marker's sizes, and only the merge would see it (exit 1)
    verified = start(source, out, tmp_path / "log-verify", [*args, "--verify"])
    _, stderr = verified.communicate(timeout=300)
    assert verified.returncode == 0, stderr.decode()[-3000:]
    assert audio.read_bytes()[:4] == b"RIFF"  # spoken again (Piper's takes differ: its noise is unseeded)
    again = {r["id"]: r for r in assert_complete(out)}
    assert again[row["id"]]["run"] != row["run"]
    assert all(again[uid]["run"] == first_row["run"] for uid, first_row in rows.items() if uid != row["id"])
