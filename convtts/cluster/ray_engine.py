"""The builder on a Ray cluster: one slot per GPU anywhere in the cluster, pieces of shards handed out as slots ask.

run_all.sh --engine ray locks the output, starts this driver and makes the plan, then merges. The
driver starts one SlotProcess actor per unit of the slot resource (a GPU by default), each running
parallel_cosyvoice.py --feed on its node; the slots load their models while the plan is made. It
then hands pieces of shards (convtts.cluster.handout) to whichever slot asks, so fast slots take
more and all finish close together; a slot keeps its workers and models across hand-outs. A slot
whose actor or node dies has its pieces put back in line for the others. The output directory and
the log folder must be on a filesystem every node shares.

Exit codes: 0 every shard finished (merge counts failed utterances); 1 some shards were left unfinished;
2 no cluster, or no slot resource in it; 4 the output's disk is full (run_all.sh says so and exits 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

from convtts.cli import add_config_args, fail, load_config_or_exit, planned_layout, setup_logging, stop_with_parent
from convtts.cluster.driver import NAMESPACE, Driver, Options, first_line
from convtts.config import ConfigError, load_config
from convtts.run.startup import Timeline
from convtts.state.layout import Layout
from convtts.state.shardio import write_atomic

log = logging.getLogger("ray_engine")


class Stopped(Exception):
    """SIGTERM or SIGINT reached the driver."""


# A cluster of our own starts no idle Python workers ahead of need: by default its raylet starts up
# to one per core as the driver connects, each importing Ray, on the cores where the slots'
# forkservers import torch and the runtime at that moment (a slot's workers wait for that import).
# Our actors are few; each waits for a fresh process instead (0.3 s on 2 cores).
LOCAL_CLUSTER = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


def connect(address: str):
    """Ray, connected: `local` starts a one-machine cluster, else `auto` or HOST:PORT joins one."""
    try:
        import ray
    except ImportError:
        fail("--engine ray needs Ray: pip install 'convtts[ray]' (ray 2.60.0)")
    try:
        if address == "local":
            ray.init(
                address="local",  # a cluster of its own even where one already runs on this machine
                namespace=NAMESPACE,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                _system_config=LOCAL_CLUSTER,
            )
        else:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        fail(
            f"cannot join the Ray cluster at {address!r}: {first_line(exc)} "
            "(start one with `ray start --head`, or pass --address local)"
        )
    return ray


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="run the slots of a planned output directory on a Ray cluster")
    p.add_argument("--output-dir", required=True, help="planned output directory, on a filesystem every node shares")
    p.add_argument("--address", default="auto", help="auto, HOST:PORT of the cluster's head, or local")
    p.add_argument(
        "--slot-resource", default="GPU", help="one slot per unit of this resource (GPU: a CUDA slot per GPU)"
    )
    p.add_argument("--mps", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--run-id", default=time.strftime("%Y%m%dT%H%M%S"))
    p.add_argument("--log-dir", required=True, help="slot logs go here: a folder every node can write")
    p.add_argument("--progress", action="store_true", help="print the progress lines on stdout too")
    p.add_argument(
        "--plan-ready",
        metavar="FILE",
        help="start the slots at once, and hand out work once FILE holds "
        "the plan's exit code (run_all.sh); the slots then take this command's --config and --set",
    )
    p.add_argument(
        "--exit-file",
        metavar="FILE",
        help="write the exit code here once every slot has ended, before the slots' actors, the MPS daemons "
        "and Ray are let go (run_all.sh merges meanwhile)",
    )
    p.add_argument(
        "--parent-pid", type=int, default=0, help="stop when this process (run_all.sh) is gone, however it ended"
    )
    p.add_argument("--verify", action="store_true", help="the slots open every audio file of the shards marked done")
    add_config_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    clock = Timeline(-1)  # seconds since run_all.sh started, for where the slots' start goes
    clock.events["driver"] = clock.events.pop("slot")  # this process, its modules imported
    args = parse_args(argv)
    setup_logging()
    if args.parent_pid:  # run_all.sh killed outright: SIGTERM here, and the slots are let go as on a Ctrl-C
        stop_with_parent(args.parent_pid)
    if args.plan_ready:
        layout, settings = Layout(args.output_dir), slot_settings(args)
        config = load_config_or_exit(args)
    else:
        layout, settings = planned_layout(args.output_dir), []
        try:
            config = load_config(layout.config_file)
        except ConfigError as exc:
            fail(f"config error: {exc}")
    clock.mark("config")
    ray = connect(args.address)
    clock.mark("joined")
    count = int(ray.cluster_resources().get(args.slot_resource, 0))
    if count < 1:
        fail(
            f"the Ray cluster has no {args.slot_resource!r} resource to run slots on "
            f"(it has {sorted(k for k in ray.cluster_resources() if not k.startswith('node:'))})"
        )
    options = Options(
        str(layout.root.resolve()),
        args.run_id,
        os.path.abspath(args.log_dir),
        args.slot_resource,
        args.mps,
        args.progress,
        settings,
        os.path.abspath(args.plan_ready) if args.plan_ready else None,
        args.verify,
    )
    driver = Driver(ray, options, config.workers.progress_interval)
    _install_stop_handlers()
    try:
        driver.start(count)
        clock.mark("slots_asked")
        log.info("start-up, seconds since the command: %s", ", ".join(f"{k} {v}" for k, v in clock.events.items()))
        code = driver.run()
        write_exit_code(args.exit_file, code)
        return code
    except Exception as exc:
        stopped = stopped_by(exc)
        if stopped is None:
            raise
        log.error("stopped by %s; ending this run's slots", stopped)
        return 130 if str(stopped) == "SIGINT" else 143
    finally:
        driver.stop()
        ray.shutdown()


def write_exit_code(path: str | None, code: int) -> None:
    """Say the run's outcome before letting the cluster go, which takes a second or more."""
    if not path:
        return
    try:
        write_atomic(Path(path), f"{code}\n".encode())
    except OSError as exc:  # run_all.sh then waits for this process's own exit code
        log.warning("could not write %s: %s", path, exc)


def slot_settings(args: argparse.Namespace) -> list[str]:
    """The --config and --set arguments the slots get (absolute paths: they run in other folders)."""
    settings = ["--config", os.path.abspath(args.config)] if args.config else []
    for item in args.overrides:
        settings += ["--set", item]
    return settings


def stopped_by(exc: BaseException | None) -> Stopped | None:
    """The Stopped behind `exc`: a signal that arrives while Ray waits in its C code raises our Stopped
    there, and Ray's wrapper turns it into a SystemError caused by it."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, Stopped):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _install_stop_handlers() -> None:
    def stop(signum, frame):
        raise Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


if __name__ == "__main__":
    sys.exit(main())
