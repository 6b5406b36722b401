"""Several nodes' run_all.sh on one output directory, as examples/slurm/convtts.sbatch runs them: here
two local processes, each a "node" with one CPU slot, the Piper voice, and a real SIGKILL of one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (
    REPO,
    assert_complete,
    llava_conversations,
    read_jsonl_tolerant,
    run_all,
    script_env,
    wait_for,
    write_input,
)

pytestmark = pytest.mark.e2e

ARGS = ("--gpus", "cpu:1", "--workers", "1", "--set", "shards.segments_per_shard=5")


def start_node(source: Path, out: Path, log: Path, rank: int, slurm: bool = False) -> subprocess.Popen:
    """Node `rank` of two: by --node-rank/--nodes, or by --slurm from the variables srun sets."""
    env = script_env(SLURM_NODEID=rank, SLURM_NNODES=2) if slurm else script_env()
    share = ["--slurm"] if slurm else ["--node-rank", str(rank), "--nodes", "2"]
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
            *ARGS,
            *share,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def shard_index(row: dict) -> int:
    return int(row["audio"].split("/")[1].split("-")[1])


def test_two_nodes_at_once_share_the_shards_plan_once_and_merge_everything(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(4))
    out, log = tmp_path / "out", tmp_path / "log"
    nodes = [start_node(source, out, log, 0), start_node(source, out, log, 1, slurm=True)]
    try:
        wait_for(lambda: (out / "work").is_dir() and any((out / "work").glob("*.manifest.jsonl")))
        whole = run_all("--input", source, "--output-dir", out, *ARGS)
        assert whole.returncode == 3, whole.stderr  # a whole-output run waits out the nodes
        results = [node.communicate(timeout=400) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, (_, stderr) in zip(nodes, results):
        assert node.returncode == 0, stderr.decode()
    rows = assert_complete(out)  # every id once: the last node's merge holds both nodes' work
    planned = [p.read_text() for p in log.rglob("preprocess.log")]
    assert sum("Plan:" in text for text in planned) == 1, planned  # one node planned, the other found it fresh
    assert sum("up to date" in text for text in planned) == 1, planned
    for row in rows:  # each node spoke its share alone: shards[rank::2]
        assert row["run"].endswith(f"-node{shard_index(row) % 2}"), row
    assert {shard_index(r) % 2 for r in rows} == {0, 1}


def test_a_killed_node_is_finished_by_its_rerun(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(4))
    out, log = tmp_path / "out", tmp_path / "log"
    nodes = [start_node(source, out, log, 0), start_node(source, out, log, 1)]

    def node1_spoken() -> int:
        files = (out / "work").glob("shard-????[13579].w*.manifest.jsonl") if (out / "work").is_dir() else []
        return sum(len(read_jsonl_tolerant(p)) for p in files)

    try:
        wait_for(lambda: node1_spoken() >= 3)
        os.killpg(nodes[1].pid, signal.SIGKILL)
        nodes[1].wait()
        stdout, stderr = nodes[0].communicate(timeout=400)
    finally:
        for node in nodes:
            node.kill()
    assert nodes[0].returncode == 0, stderr.decode()  # its own share is done
    assert "outputs are whole once every node has finished" in stdout.decode()
    summary = json.loads((out / "summary.json").read_text())  # merged while node 1's share was unfinished
    assert not summary["complete"] and summary["pending"] > 0

    again = subprocess.run(
        [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(source),
            "--output-dir",
            str(out),
            "--log-dir",
            str(log),
            *ARGS,
            "--node-rank",
            "1",
            "--nodes",
            "2",
        ],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=400,
        stdin=subprocess.DEVNULL,
    )
    assert again.returncode == 0, again.stderr
    assert_complete(out)
