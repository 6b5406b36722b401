"""The Ray driver's loop: one SlotProcess actor per unit of the slot resource (each running
parallel_cosyvoice.py --feed on its node), pieces to whichever slot asks (convtts.cluster.handout),
a lost slot's pieces back in line for the others. The command around it is convtts.cluster.ray_engine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field

from convtts import EXIT_DISK_FULL, EXIT_FAILURES, EXIT_OK
from convtts.cluster.handout import HANDBACK_GRACE, Book
from convtts.cluster.ray_actors import NodeMPS, SlotProcess
from convtts.run.startup import plan_exit_code
from convtts.state.layout import Layout
from convtts.state.shardio import read_json

log = logging.getLogger("ray_engine")

NAMESPACE = "convtts"
PLACEMENT_TIMEOUT = 600.0  # no slot running and none placed for this long: the cluster has no room
ASKS_A_SECOND = 200  # at most, from slots told to wait (at the end, while others finish), every 0.1 s or slower


@dataclass
class SlotState:
    rank: int
    actor: object
    node: str | None = None
    host: str = "?"
    opening: str | None = None  # the shard it was told to open and has not reported on
    code: int | None = None  # its exit code, once it ended
    lost: str | None = None  # why the driver gave up on it
    sizes: tuple[int, int] = (0, 0)  # the rows it decodes at once and a worker's, as it last said

    def running(self) -> bool:
        return self.node is not None and self.code is None and self.lost is None


@dataclass
class Options:
    out: str
    run_id: str
    log_dir: str
    resource: str
    mps: str
    progress: bool
    settings: list = field(default_factory=list)  # --config/--set for the slots, which start before the plan
    plan_ready: str | None = None  # the file run_all.sh writes preprocess's exit code to
    verify: bool = False  # the slots open every audio file of the shards marked done (--verify)


class Driver:
    def __init__(self, ray, options: Options, interval: float):
        self.ray, self.o, self.interval = ray, options, interval
        self.layout = Layout(options.out)
        self.book: Book | None = None  # once the plan is made
        self.slots: dict[int, SlotState] = {}
        self.calls: dict = {}  # ObjectRef -> (rank, what it is)
        self.asking: list[int] = []  # slots that asked before the plan was made
        self.mps: dict[str, tuple] = {}  # node id -> (NodeMPS actor, env for its slots; None while it starts)
        self.mps_waiting: dict[str, list[int]] = {}  # node id -> slots placed there, waiting for its MPS daemon
        self.disk_full = False
        self.started = time.time()
        self.key = hashlib.blake2b(str(self.layout.root.resolve()).encode(), digest_size=4).hexdigest()

    # -- starting ------------------------------------------------------------------------------
    def start(self, count: int) -> None:
        self.remove_leftovers()
        actor = self.ray.remote(SlotProcess)
        for rank in range(count):
            handle = actor.options(namespace=NAMESPACE, name=f"slot-{self.key}-{rank}", **self.needs()).remote()
            self.slots[rank] = SlotState(rank, handle)
            self.call(rank, "where", handle.where.remote())
        for info in self.ray.nodes():  # their daemons start while the slots' processes do
            if info.get("Alive") and info["Resources"].get(self.o.resource, 0) > 0:
                self.start_mps(info["NodeID"])
        log.info("%d slots (one per %s); output %s", count, self.o.resource, self.o.out)

    def needs(self) -> dict:
        """What one slot takes from its node: a GPU, a CPU, or one unit of a custom resource."""
        if self.o.resource == "GPU":
            return {"num_gpus": 1, "num_cpus": 0}  # its workers' cores are shared out by --slots-on-node
        if self.o.resource == "CPU":
            return {"num_cpus": 1}
        return {"num_cpus": 0, "resources": {self.o.resource: 1}}

    def remove_leftovers(self) -> None:
        """Slots a killed driver left on this output (Ray ends them when it notices): gone before any new one writes."""
        mine = f"slot-{self.key}-"
        deadline = time.time() + 60
        while time.time() < deadline:
            left = [
                a["name"]
                for a in self.ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE and a["name"].startswith(mine)
            ]
            if not left:
                return
            log.warning("slots of an earlier driver on this output are still alive: %s; ending them", left)
            for name in left:
                try:
                    self.ray.kill(self.ray.get_actor(name, namespace=NAMESPACE))
                except ValueError:
                    pass  # gone meanwhile
            time.sleep(1.0)
        raise RuntimeError(f"slots of an earlier driver would not end: {left}")

    def slot_args(self, slot: SlotState) -> list[str]:
        on_node = self.slots_on_node(slot.node)
        ready = ["--plan-ready", self.o.plan_ready] if self.o.plan_ready else []
        return [
            "--output-dir",
            self.o.out,
            "--rank",
            str(slot.rank),
            "--world",
            str(len(self.slots)),
            "--device",
            "cuda" if self.o.resource == "GPU" else "cpu",
            "--run-id",
            self.o.run_id,
            "--log-dir",
            self.o.log_dir,
            "--slots-on-node",
            str(on_node),
            *ready,
            *(["--verify"] if self.o.verify else []),
            *self.o.settings,
        ]

    def slots_on_node(self, node: str) -> int:
        """Slots that will share this node's cores: its units of the slot resource."""
        for info in self.ray.nodes():
            if info["NodeID"] == node:
                return max(1, int(info["Resources"].get(self.o.resource, 1)))
        return 1

    def start_mps(self, node: str) -> None:
        """Start the node's MPS daemon (GPU slots only), once; its slots start when it has."""
        if self.o.resource != "GPU" or self.o.mps == "off" or node in self.mps:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = (
            self.ray.remote(NodeMPS)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
            .remote()
        )
        self.mps[node] = (actor, None)
        self.calls[actor.start.remote(self.o.mps, f"{self.o.log_dir}/mps-{node[:8]}")] = (node, "mps")

    def on_mps(self, node: str, ref) -> None:
        try:
            env, said = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # the node went meanwhile: its slots' start fails next
            env, said = {}, f"not started: {first_line(exc)}"
        log.info("MPS on node %s: %s", node[:8], said)
        self.mps[node] = (self.mps[node][0], env)
        for rank in self.mps_waiting.pop(node, []):
            self.start_slot(self.slots[rank])

    def node_env(self, node: str) -> dict | None:
        """What a slot on this node needs to reach its MPS daemon; None while the daemon starts."""
        if self.o.resource != "GPU" or self.o.mps == "off":
            return {}
        return self.mps[node][1]

    # -- the loop ------------------------------------------------------------------------------
    def call(self, rank: int, what: str, ref) -> None:
        self.calls[ref] = (rank, what)

    def run(self) -> int:
        last = time.time()
        while self.calls:
            ready, _ = self.ray.wait(list(self.calls), num_returns=1, timeout=1.0)
            for ref in ready:
                self.on_result(ref)
            self.read_plan()
            if self.book is not None:
                self.book.release_returning()
            self.give_up_on_unplaced()
            if time.time() - last >= self.interval:
                last = time.time()
                self.report()
        self.report()
        return self.exit_code()

    def read_plan(self) -> None:
        """Once the plan is made: the book of its shards, and answers for the slots that asked meanwhile."""
        code = plan_exit_code(self.o.plan_ready) if self.o.plan_ready else 0
        if self.book is not None or code is None:
            return
        if code != 0:
            log.error("the plan was not made (exit %d); ending the slots", code)
            self.calls.clear()
            return
        self.book = Book(self.layout, self.layout.shard_names(), self.o.run_id)
        log.info("%d shards to hand out in pieces to %d slots", self.book.total, len(self.slots))
        asking, self.asking = self.asking, []
        for rank in asking:
            self.answer(self.slots[rank], self.hand_out(self.slots[rank]))

    def on_result(self, ref) -> None:
        rank, what = self.calls.pop(ref)
        if what == "mps":
            self.on_mps(rank, ref)  # rank: the node id
            return
        slot = self.slots[rank]
        try:
            value = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # its actor or node died, or the slot could not start
            self.lose(slot, first_line(exc))
            return
        if what == "where":
            slot.node = value
            self.start_mps(value)  # a node that joined after the driver started
            if self.node_env(value) is None:
                self.mps_waiting.setdefault(value, []).append(rank)
            else:
                self.start_slot(slot)
        elif what == "start":
            pid, slot.host, gpu = value
            log.info(
                "slot %d running on %s (node %s, pid %d, CUDA_VISIBLE_DEVICES=%s); log %s/slot-%d.log",
                rank,
                slot.host,
                slot.node[:8],
                pid,
                gpu,
                self.o.log_dir,
                rank,
            )
            self.answer(slot, None)
        else:
            self.on_line(slot, value)

    def start_slot(self, slot: SlotState) -> None:
        log_file = f"{self.o.log_dir}/slot-{slot.rank}.log"
        # the command's start, so that the slots' start-up timelines count from it as on one node
        env = {k: os.environ[k] for k in ("CONVTTS_RUN_STARTED", "CONVTTS_VALIDATED") if k in os.environ}
        env.update(self.node_env(slot.node))
        self.call(slot.rank, "start", slot.actor.start.remote(self.slot_args(slot), env, log_file))

    def answer(self, slot: SlotState, line: str | None) -> None:
        """Send the slot an answer (None: none is due) and wait for its next line."""
        self.call(slot.rank, "line", slot.actor.exchange.remote(line))

    def on_line(self, slot: SlotState, line: tuple) -> None:
        kind = line[0] if line else ""
        if kind == "next" and len(line) == 3 and line[1].isdigit() and line[2].isdigit():  # "next ROWS WORKER_ROWS"
            slot.sizes = (int(line[1]), int(line[2]))
        if kind == "exit":
            self.on_exit(slot, int(line[1]))
            return
        if kind in ("next", "opened") and self.book is None:
            self.asking.append(slot.rank)  # answered once the plan is made
            return
        answer = None
        if kind == "next":
            answer = self.hand_out(slot)
        elif kind == "opened" and len(line) >= 5:
            slot.opening = None
            self.book.opened(line[1], int(line[2]), int(line[3]), float(line[4]), list(line[5:]))
            answer = self.hand_out(slot)
        elif kind == "done" and len(line) == 5:
            self.book.done(int(line[1]), int(line[2]), int(line[3]), float(line[4]))
        else:
            log.warning("slot %d said something unexpected: %r", slot.rank, " ".join(line)[:200])
        self.answer(slot, answer)

    def hand_out(self, slot: SlotState) -> str:
        """A piece or a shard to open for this slot; "wait" while what others hold may yet come back
        ("ending" once every id is out); "" (no more)."""
        if self.disk_full:
            return ""
        self.book.sized(slot.rank, *slot.sizes)
        answer = self.book.hand_out(slot.rank, [s.rank for s in self.slots.values() if s.running()])
        if answer.startswith("open "):
            slot.opening = answer.split()[1]
        if answer:
            return answer
        others_opening = any(s.opening for s in self.slots.values() if s is not slot)
        if not (self.book.busy() or others_opening):
            return ""
        ending = " ending" if self.book.all_out() and not others_opening else ""
        return f"wait {self.ask_again_in():.2f}{ending}"

    def ask_again_in(self) -> float:
        """Seconds before a slot told to wait asks again: soon, so that the last work's end is seen at once."""
        return min(1.0, max(0.1, len(self.slots) / ASKS_A_SECOND))

    def on_exit(self, slot: SlotState, code: int) -> None:
        slot.code = code
        if code == EXIT_DISK_FULL:
            self.disk_full = True  # its log names the file; the others get no more work
            log.error("slot %d: the output's disk is full; handing out no more work", slot.rank)
        elif code != EXIT_OK:
            log.error(
                "slot %d on %s exited %d; see %s/slot-%d.log", slot.rank, slot.host, code, self.o.log_dir, slot.rank
            )
        self.hand_back(slot, f"exited {code} holding them")

    def lose(self, slot: SlotState, why: str) -> None:
        slot.lost = why
        log.warning("slot %d on %s lost: %s", slot.rank, slot.host, why)
        self.hand_back(slot, "lost")

    def hand_back(self, slot: SlotState, why: str) -> None:
        if self.book is None:
            return
        opening, slot.opening = slot.opening, None
        pieces, ids = self.book.give_back(slot.rank, opening)
        if pieces or opening:
            log.warning(
                "slot %d %s: %d pieces (%d utterances)%s go back in line in %.0f s",
                slot.rank,
                why,
                pieces,
                ids,
                f" and {opening}, which it was opening," if opening else "",
                HANDBACK_GRACE,
            )

    def give_up_on_unplaced(self) -> None:
        """Slots Ray has not placed (no free GPU) are not waited for once nothing needs them."""
        waiting = [r for r, what in self.calls.values() if what == "where"]
        if not waiting or len(waiting) != len(self.calls):
            return
        left = self.book is None or self.book.left()
        if left and time.time() - self.started < PLACEMENT_TIMEOUT:
            return
        for rank in waiting:
            self.ray.kill(self.slots[rank].actor)
            self.slots[rank].lost = "never placed"
        self.calls.clear()
        if left:
            log.error(
                "no slot is running and %d were never placed in %.0f s: the cluster has no free %s",
                len(waiting),
                PLACEMENT_TIMEOUT,
                self.o.resource,
            )

    # -- reporting and the end -----------------------------------------------------------------
    def report(self) -> None:
        done = failed = 0
        audio = 0.0
        for rank in self.slots:
            status = read_json(self.layout.slot_status(rank))
            if isinstance(status, dict) and status.get("started", 0) >= self.started:
                done, failed, audio = done + status["done"], failed + status["failed"], audio + status["audio_seconds"]
        running = sum(s.running() for s in self.slots.values())
        lost = sum(s.lost is not None for s in self.slots.values())
        rate = audio / max(time.time() - self.started, 1e-6)
        book = self.book
        shards = "waiting for the plan" if book is None else book.progress()
        line = (
            f"{shards}; this run {done} utterances ({failed} failed), {audio / 3600:.3f} h audio, "
            f"{rate:.2f} audio s/s; slots {running} running, {lost} lost"
        )
        log.info("%s", line)
        if self.o.progress:
            print(line, flush=True)

    def exit_code(self) -> int:
        if self.disk_full:
            return EXIT_DISK_FULL
        if self.book is None:
            log.error("the plan was not made; no work was handed out")
            return EXIT_FAILURES
        unfinished = self.book.total - len(self.book.finished)
        if unfinished:
            log.error("%d of %d shards were not finished: no slot was left to take them", unfinished, self.book.total)
            return EXIT_FAILURES
        # Every shard has its stats: failed utterances, if any, are for merge to count and report. A
        # slot that died or ended badly had its pieces finished by others, so a rerun has nothing to add.
        return EXIT_OK

    def stop(self) -> None:
        """End every slot this driver started (Linux ends their workers) and the MPS daemons."""
        for slot in self.slots.values():
            if slot.code is None:
                self.ray.kill(slot.actor)
        for actor, _ in self.mps.values():  # one still starting is stopped once it has
            try:
                self.ray.get(actor.stop.remote(), timeout=60)
            except Exception as exc:
                log.warning("MPS daemon not stopped: %s", first_line(exc))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(text[:1] + [t.strip() for t in text if "died because" in t])[:300]
