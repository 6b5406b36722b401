#!/usr/bin/env python3
"""Faults on a node of several GPUs, both engines: each scenario kills or starves part of a real run of the
README's command, reruns it once if it did not finish, and checks the output.

Scenarios (--scenarios, in this order):

- slot: run_all.sh on every GPU; once a quarter of the rows are spoken, kill -9 slot 0's process. The
  other slots must finish and the run exit 1; the rerun must exit 0.
- ray-actor: run_all.sh --engine ray --address local; kill -9 the Ray worker process that holds one
  slot's actor (its slot process dies with it). The driver hands the slot's pieces to the others.
- ray-node: a Ray cluster of a head without GPUs and two nodes on this host, each given half the GPUs;
  the driver joins it, and one node is removed mid-run (its raylet and every process on it). Its
  slots' pieces go back in line for the other node. MPS is off here: both nodes share one host.
- oom: run_all.sh on GPU 0 with every worker's allocations capped (workers.gpu_mb_cap, --oom-cap-mb)
  below what its rows and passes take: CUDA out-of-memory mid-run, recovered by a rebuild and fewer rows.

Each scenario ends with a complete output (every planned id once in the manifest, every audio file
whole and as long as its row says) after at most one rerun; it also counts the ids spoken twice in
the workers' own files (a row in flight when its process died may be spoken again: none is kept
twice) and the ids the rerun spoke that were already whole before it (none should be).

    python3 bench/gpu_faults.py --model-dir /tmp/cv300m --conversations 300 --out "$OUT/faults.json"
    python3 bench/gpu_faults.py --size tiny --model-dir /tmp/tiny --cpu --conversations 6 --work /tmp/f
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import e2e  # bench/ is on sys.path when run as a script
from soak import Proc, processes

sys.path.insert(0, str(e2e.REPO))  # this checkout's convtts, run as python3 bench/...
from convtts.state.layout import Layout
from convtts.state.verify import check_complete

SCENARIOS = ("slot", "ray-actor", "ray-node", "oom")
SLOT_RESOURCE = "convtts_slot"  # what a CPU check's Ray nodes offer in place of GPUs
KILL_AT = 0.25  # share of the planned rows spoken before the fault
RUN_LIMIT = 900.0  # seconds a run may take before the bench stops it


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def rows_spoken(out: Path) -> int:
    return (
        sum(p.read_bytes().count(b"\n") for p in (out / "work").glob("shard-*.manifest.jsonl") if p.is_file())
        if (out / "work").is_dir()
        else 0
    )


def planned(out: Path) -> int:
    try:
        return json.loads(Layout(out).plan_file.read_text()).get("segments") or 0
    except (OSError, ValueError):
        return 0


def whole_rows(out: Path) -> dict[str, list[dict]]:
    """Whole rows of the workers' own manifest files, by id (a torn last line is not a row)."""
    rows: dict[str, list[dict]] = {}
    for path in (out / "work").glob("shard-*.manifest.jsonl"):
        for line in path.read_bytes().split(b"\n"):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            rows.setdefault(row["id"], []).append(row)
    return rows


def args_of(proc: Proc) -> list[str]:
    return proc.cmdline.decode(errors="replace").split("\0")


def slot_process(rank: int) -> Proc | None:
    """The slot process of `rank` (run_all.sh's parallel_cosyvoice.py, or a Ray actor's python -m convtts.run)."""
    for proc in processes():
        args = args_of(proc)
        slot = any(a.endswith("parallel_cosyvoice.py") for a in args) or "convtts.run" in args
        if slot and "--rank" in args and args[args.index("--rank") + 1 : args.index("--rank") + 2] == [str(rank)]:
            return proc
    return None


def actor_process(slot: Proc) -> Proc | None:
    """The Ray worker process whose child is this slot process (the SlotProcess actor)."""
    parent = next((proc for proc in processes() if proc.pid == slot.ppid), None)
    if parent and any("SlotProcess" in a or a.startswith("ray::") for a in args_of(parent)):
        return parent
    return None


class Scenario:
    def __init__(self, args, name: str):
        self.args, self.name = args, name
        self.work = Path(args.work) / name
        self.work.mkdir(parents=True)
        self.out, self.log = self.work / "out", self.work / "log"
        self.figures: dict = {"scenario": name, "runs": []}

    def command(self, engine_args: list[str], sets: list[str] = ()) -> list[str]:
        cmd = ["./run_all.sh", "--config", str(self.args.config), "--input", str(self.args.source)]
        cmd += ["--mps", self.args.mps] if self.args.mps else []  # before engine_args: theirs win
        cmd += ["--output-dir", str(self.out), "--log-dir", str(self.log), *engine_args]
        for item in [f"tts.cosyvoice.model_dir={self.args.model_dir}", *self.args.set, *sets]:
            cmd += ["--set", item]
        return cmd

    def start(self, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        self.figures["command"] = " ".join(cmd)
        self.started = time.time()
        return subprocess.Popen(
            cmd,
            cwd=e2e.REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.work / f"stderr-{len(self.figures['runs'])}.txt", "wb"),
            start_new_session=True,
        )

    def wait_share(self, run: subprocess.Popen, share: float = KILL_AT) -> bool:
        """Until `share` of the planned rows are spoken; False if the run ended first."""
        while run.poll() is None:
            total = planned(self.out)
            if total and rows_spoken(self.out) >= share * total:
                return True
            time.sleep(0.2)
        return False

    def finish(self, run: subprocess.Popen, fault: str | None = None) -> int:
        try:
            code = run.wait(timeout=RUN_LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            code = run.wait()
        self.figures["runs"].append(
            {"exit_code": code, "wall_seconds": round(time.time() - self.started, 1), "fault": fault}
        )
        return code

    def rerun_and_check(self, cmd: list[str], env: dict | None = None) -> dict:
        """The same command once more if the first did not exit 0; then the output's checks."""
        before = whole_rows(self.out)
        if self.figures["runs"][-1]["exit_code"] != 0:
            self.finish(self.start(cmd, env))
        after = whole_rows(self.out)
        problems = check_complete(self.out, processes=os.cpu_count() or 1)
        rerun_ids = {uid for uid, rows in after.items() if len(rows) > len(before.get(uid, []))}
        self.figures.update(
            rows=len(after),
            spoken_twice=sum(len(rows) > 1 for rows in after.values()),
            respoken_by_rerun=len(rerun_ids & set(before)),
            problems=len(problems),
            first_problems=problems[:10],
            complete=not problems,
            final_exit_code=self.figures["runs"][-1]["exit_code"],
        )
        return self.figures


def kill(proc: Proc | None, what: str, figures: dict) -> None:
    if proc is None:
        raise SystemExit(f"gpu_faults: no {what} to kill")
    os.kill(proc.pid, signal.SIGKILL)
    figures.setdefault("killed", []).append({"what": what, "pid": proc.pid, "cmdline": " ".join(args_of(proc))[:200]})


def slot_scenario(args) -> dict:
    s = Scenario(args, "slot")
    cmd = s.command(["--gpus", args.gpus])
    run = s.start(cmd)
    if s.wait_share(run):
        kill(slot_process(0), "slot 0", s.figures)
    s.finish(run, "kill -9 slot 0")
    s.figures["first_run_exit_1"] = s.figures["runs"][0]["exit_code"] == 1
    return s.rerun_and_check(cmd)


def ray_engine_args(args, address: str) -> list[str]:
    resource = ["--slot-resource", SLOT_RESOURCE] if args.cpu else []
    return ["--engine", "ray", "--address", address, *resource]


def kill_an_actor(s: Scenario, run: subprocess.Popen, *_) -> None:
    """Once a quarter is spoken: kill -9 the Ray worker process holding slot 0's actor."""
    if s.wait_share(run):
        slot = slot_process(0)
        kill(actor_process(slot) if slot else None, "the Ray worker process of slot 0's actor", s.figures)


def remove_a_node(s: Scenario, run: subprocess.Popen, head, nodes: list) -> None:
    """Once a quarter is spoken: the last node taken away, its raylet and every process on it."""
    if s.wait_share(run):
        head.remove_node(nodes[-1])
        s.figures.setdefault("killed", []).append({"what": "the second Ray node (its raylet and processes)"})


def ray_actor_scenario(args) -> dict:
    s = Scenario(args, "ray-actor")
    if args.cpu:  # the stand-in resource needs a cluster of its own
        return ray_cluster_run(args, s, [{"resources": {SLOT_RESOURCE: 1}}] * 2, kill_an_actor)
    cmd = s.command(ray_engine_args(args, "local"))
    run = s.start(cmd)
    kill_an_actor(s, run)
    s.finish(run, kill_an_actor.__name__)
    s.figures["slots"] = slots_started(s.log)
    return s.rerun_and_check(cmd)


def ray_node_scenario(args) -> dict:
    s = Scenario(args, "ray-node")
    if args.cpu:
        return ray_cluster_run(args, s, [{"resources": {SLOT_RESOURCE: 1}}] * 2, remove_a_node)
    gpus = [str(n) for n in range(args.gpu_total)]
    half = len(gpus) // 2
    nodes = [{"num_gpus": half, "_gpus": gpus[:half]}, {"num_gpus": len(gpus) - half, "_gpus": gpus[half:]}]
    return ray_cluster_run(args, s, nodes, remove_a_node)


def ray_cluster_run(args, s: Scenario, nodes: list[dict], fault) -> dict:
    """The Ray engine joining a cluster of this host (a head without slots and `nodes`), `fault` mid-run.
    MPS is off: the nodes share one host."""
    from ray.cluster_utils import Cluster

    head = Cluster(initialize_head=True, head_node_args={"num_gpus": 0, "include_dashboard": False})
    try:
        made = [add_node(head, dict(node)) for node in nodes]
        cmd = s.command([*ray_engine_args(args, head.address), "--mps", "off"])
        env = {**os.environ, "PYTHONPATH": str(e2e.REPO)}  # Ray's workers import this checkout's convtts
        run = s.start(cmd, env)
        fault(s, run, head, made)
        s.finish(run, fault.__name__)
        s.figures["slots"] = slots_started(s.log)
        return s.rerun_and_check(cmd, env)
    finally:
        head.shutdown()


def add_node(head, node: dict):
    """A raylet on this host; `_gpus`: the GPU ids it offers (its GPU ids are read as it starts)."""
    gpus = node.pop("_gpus", None)
    with e2e.cuda_visible(",".join(gpus) if gpus is not None else None):
        return head.add_node(**node)


def slots_started(log: Path) -> list[str]:
    """The driver's lines on its slots: where each ran (and on which GPU), and those it lost."""
    text = "\n".join(p.read_text(errors="replace") for p in log.rglob("driver.log"))
    return re.findall(r"slot \d+ (?:running on|on \S+ lost:|lost:) .*", text)


def oom_scenario(args) -> dict:
    s = Scenario(args, "oom")
    cmd = s.command(["--gpus", args.gpus.split(",")[0]], [f"workers.gpu_mb_cap={args.oom_cap_mb}"])
    s.finish(s.start(cmd), f"workers.gpu_mb_cap={args.oom_cap_mb}")
    figures = s.rerun_and_check(cmd)
    logs = [p.read_text(errors="replace") for p in s.log.rglob("slot-*-worker-*.log")]
    figures["out_of_memory"] = e2e.out_of_memory(logs)
    figures["forced"] = figures["out_of_memory"] > 0
    return figures


RUNNERS = {"slot": slot_scenario, "ray-actor": ray_actor_scenario, "ray-node": ray_node_scenario, "oom": oom_scenario}


def passed(figures: dict) -> bool:
    """Complete after at most one rerun, and the fault did happen: a kill landed mid-run (the slot's run
    then exited 1), or the cap forced an out-of-memory."""
    happened = figures.get("forced") if figures["scenario"] == "oom" else bool(figures.get("killed"))
    exit_1 = figures.get("first_run_exit_1", True)
    return bool(figures["complete"] and happened and exit_1 and len(figures["runs"]) <= 2)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="/tmp/cv300m")
    p.add_argument("--size", choices=("tiny", "full"), help="write a random-weight model when --model-dir has none")
    p.add_argument("--conversations", type=int, default=300, help="real short-turn conversations a scenario")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--cpu", action="store_true", help="two CPU slots stand in for GPUs (a check of the bench)")
    p.add_argument("--oom-cap-mb", type=int, default=14500, help="the oom scenario's workers.gpu_mb_cap")
    e2e.add_version_args(p)
    p.add_argument("--set", action="append", default=[], help="group.key=value added to every command")
    p.add_argument("--work", default="/tmp/convtts-faults", help="a fresh folder")
    p.add_argument("--out", help="write the figures here as JSON after each scenario")
    args = p.parse_args()
    work = e2e.fresh_work(p, args)
    scenarios = [name for name in args.scenarios.split(",") if name]
    if set(scenarios) - set(SCENARIOS):
        p.error(f"--scenarios: some of {', '.join(SCENARIOS)}")
    args.gpu_total = 2 if args.cpu else gpu_count()
    if args.gpu_total < 2:
        p.error("the faults need a node of at least two GPUs (or --cpu)")
    args.gpus = "cpu:2" if args.cpu else ",".join(str(n) for n in range(args.gpu_total))
    args.source = work / "conversations.json"
    e2e.make_conversations(args.conversations, args.source, "short")
    results = []
    for name in scenarios:
        if args.cpu and name == "oom":
            print("== oom: needs a GPU (skipped on --cpu)", flush=True)
            continue
        results.append(RUNNERS[name](args))
        print(f"== {name}: {'passed' if passed(results[-1]) else 'FAILED'}", flush=True)
        print(json.dumps(results[-1], indent=2), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=2))
    return 0 if all(passed(r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
