"""One device slot: synthesise this slot's shards with K worker processes (started by run_all.sh)."""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import time

from convtts import EXIT_DISK_FULL, EXIT_FAILURES
from convtts.cli import add_config_args, fail, load_config_or_exit, planned_layout, setup_logging, stop_with_parent
from convtts.config import ConfigError, load_config
from convtts.gate.quality import check_gate
from convtts.gate.whisper import recogniser_gpu_mb
from convtts.speak import backend_resources, check_backend, sized
from convtts.state.layout import Layout
from convtts.state.shardio import disk_full_text, is_disk_full


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--output-dir", required=True, help="output directory holding plan/ (made by preprocess.py)")
    p.add_argument("--rank", type=int, default=0, help="this slot's index: it takes shards[rank::world]")
    p.add_argument("--world", type=int, default=1, help="number of slots sharing the shards")
    p.add_argument("--shards", help="comma-separated shard names instead of rank/world")
    p.add_argument(
        "--node-rank", type=int, default=0, help="this node's index: the node takes shards[node_rank::nodes]"
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes sharing the shards; rank/world split the node's share")
    p.add_argument(
        "--feed",
        action="store_true",
        help="take shards one at a time from a driver: requests on stdout, answers on stdin (convtts.run.feed)",
    )
    p.add_argument("--workers", type=int, default=0, help="worker processes (default: config, else automatic)")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") else "cpu"
    )
    p.add_argument("--slots-on-node", type=int, default=0, help="slots sharing this node's cores (default: world)")
    p.add_argument("--log-dir", help="folder for the workers' own log files")
    p.add_argument(
        "--parent-pid", type=int, default=0, help="stop when this process (run_all.sh) is gone, however it ended"
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="open every audio file of the shards marked done, instead of trusting their markers' sizes",
    )
    p.add_argument("--run-id", default=time.strftime("%Y%m%dT%H%M%S"), help="tags this run's manifest rows")
    p.add_argument(
        "--plan-ready",
        metavar="FILE",
        help="start the workers at once and read the plan once FILE holds its maker's exit code (run_all.sh); "
        "the config is then this command's own (--config, --set), not the output's config.yaml",
    )
    add_config_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    started = time.time()
    args = parse_args(argv)
    if args.parent_pid:
        stop_with_parent(args.parent_pid)
    setup_logging()
    layout = Layout(args.output_dir) if args.plan_ready else planned_layout(args.output_dir)
    if args.config is None and not args.plan_ready:
        args.config = str(layout.config_file)
    config = load_config_or_exit(args)
    try:
        check_gate(config.validate, args.device)  # quick: a gate this slot cannot run stops it before any worker
    except ConfigError as exc:
        fail(str(exc))
    if not 0 <= args.node_rank < args.nodes:
        fail(f"--node-rank must be in 0..{args.nodes - 1} (--nodes {args.nodes}), got {args.node_rank}")
    feed = open_feed() if args.feed else None
    prepare_environment(args.device)
    say_mps(args)

    from convtts.run.slot import SlotStopped, install_stop_handlers

    slot = make_slot(args, layout, config, feed, started)
    install_stop_handlers()
    try:
        slot.start_workers()  # they load their models while the backend is checked and the plan is made
        check_backend(config)  # a model's speakers are read with torch: seconds, spent meanwhile
        return slot.run(args.plan_ready)
    except ConfigError as exc:
        slot.stop_workers()
        fail(str(exc))
    except SlotStopped as exc:
        print(f"slot {args.rank}: stopped by {exc}", file=sys.stderr)
        return 130 if str(exc) == "SIGINT" else 143
    except Exception as exc:
        import logging

        if is_disk_full(exc):  # outside the run loop, e.g. making the status folder before workers start
            logging.getLogger("slot").error("slot %d: stopped: %s", args.rank, disk_full_text(exc))
            return EXIT_DISK_FULL
        logging.getLogger("slot").exception("slot %d failed", args.rank)
        return EXIT_FAILURES
    finally:
        slot.stop_workers()


def make_slot(args: argparse.Namespace, layout: Layout, config, feed, started: float):
    from convtts.run.slot import Slot, SlotOptions
    from convtts.run.startup import Timeline

    workers, workers_config = size_workers(config, args)
    # A fed slot's workers write files named by run and slot: should a slot the driver gave up for
    # lost (its node cut off, not dead) still be writing, it never shares a file with the slot
    # that took over its shards (docs/ARCHITECTURE.md, Many nodes).
    writer_prefix = f"{args.run_id}-s{args.rank}-" if feed else ""
    # Pieces of one shard are written from several nodes, whose pids may be the same: a fed slot's
    # workers name their temporary files after their host too, and clean up only their own.
    tag = "-h" + hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest() if feed else ""
    options = SlotOptions(args.rank, workers, args.run_id, args.log_dir, writer_prefix, tag, args.verify)

    def share() -> list[str]:
        if args.plan_ready:
            check_plan_config(layout, config)  # as given: sizing may have set the rows
        shards = [] if feed else args.shards.split(",") if args.shards else node_share(layout, args)
        unknown = [s for s in shards if not layout.shard_file(s).is_file()]
        if unknown:
            raise ConfigError(f"unknown shards: {unknown[:5]}")
        return shards

    needs = backend_resources(workers_config, args.device)
    timeline = Timeline(args.rank, started)
    return Slot(layout, workers_config, share, options, feed=feed, timeline=timeline, resources=needs)


def size_workers(config, args: argparse.Namespace):
    """The slot's worker count and the config its workers get: rows set when the backend's are automatic (0),
    or grown where the GPU's memory holds more (tts.cosyvoice.batch_size_with_room), and passes fitted."""
    from convtts.tuning import (
        choose_layout,
        choose_workers,
        fit_passes,
        free_gpu_mb,
        rows_with_room,
        worker_gpu_mb,
    )

    requested = args.workers or config.workers.per_slot
    slots = args.slots_on_node or args.world
    needs = backend_resources(config, args.device)
    rows = needs.rows
    base = config.workers.gpu_mb_per_worker
    base += recogniser_gpu_mb(config.validate) if args.device == "cuda" else 0  # each worker's own Whisper
    if rows == 0:
        workers, rows = choose_layout(requested, args.device, slots, base, needs.row_mb)
        return workers, sized(config, rows)
    passes = needs.passes if args.device == "cuda" and rows > 1 else None
    if passes is not None:  # the pass budget shrinks so that the workers fit the GPU's memory
        free = free_gpu_mb()
        workers, pass_mb = fit_passes(requested, slots, base, rows, *passes, config.workers.rows_per_gpu, free)
        grown, pass_mb = rows_with_room(workers, base, rows, needs.rows_with_room, *passes, pass_mb, free)
        return workers, sized(config, grown, pass_mb)
    per_worker = worker_gpu_mb(base, config.workers.gpu_mb_per_row, rows)
    return choose_workers(requested, args.device, slots, per_worker), config


def check_plan_config(layout: Layout, config) -> None:
    """The workers started before the plan was made, with this slot's own config: it must be the
    plan's (config.yaml, written with it) in everything but the selection."""
    planned = load_config(layout.config_file)
    differ = [
        group
        for group in ("text", "speakers", "shards", "tts", "workers", "output", "validate")
        if getattr(planned, group) != getattr(config, group)
    ]
    if differ:
        raise ConfigError(
            f"the plan in {layout.plan_dir} was made with other {', '.join(differ)} settings "
            f"than this slot was given ({layout.config_file})"
        )


def node_share(layout: Layout, args: argparse.Namespace) -> list[str]:
    """This slot's fixed share: the node's shards[node_rank::nodes], then its slot's [rank::world] of those."""
    return layout.shard_names()[args.node_rank :: args.nodes][args.rank :: args.world]


def open_feed():
    """The driver's pipes are stdin and stdout; stdout then becomes the log too, so that a stray print
    from a library can never be read as a request."""
    from convtts.run.feed import ShardFeed

    requests = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    return ShardFeed(0, requests)


def say_mps(args: argparse.Namespace) -> None:
    """Which MPS daemon this slot's workers reach (its pipe folder), or that there is none: one a node,
    or one a GPU with run_all.sh --mps per-gpu."""
    if args.device != "cuda":
        return
    import logging

    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    where = f"the MPS daemon of {pipe}" if pipe else "no MPS daemon"
    logging.getLogger("slot").info("slot %d: GPU %s, %s", args.rank, visible or "(all)", where)


def prepare_environment(device: str) -> None:
    """Set before any worker starts (spawned workers inherit it): one thread each, and the device."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # never let a CPU slot's workers grab a GPU


if __name__ == "__main__":
    sys.exit(main())
