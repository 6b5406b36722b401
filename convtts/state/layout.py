"""Where everything lives inside an output directory: the one place that names its files."""

from __future__ import annotations

import os
from pathlib import Path


class Layout:
    """Paths of one output directory.

    plan/plan.json                         summary and fingerprint of the plan
    plan/skipped.jsonl                     turns with nothing speakable, and why
    plan/shards/shard-00042.jsonl          segments to speak, one JSON object a line
    plan/shards/shard-00042.conversations.jsonl   the input records of that shard
    work/shard-00042.w3.manifest.jsonl     spoken segments, appended by worker 3 of the slot alone
    work/shard-00042.w3.failures.jsonl     its failed attempts (the latest per id, by time, counts)
    work/shard-00042.manifest.jsonl        (older outputs: one writer per shard; still read)
    work/shard-00042.crashes.jsonl         worker deaths, written by the slot (a fed slot:
    shard-00042.<run>-s<rank>.crashes.jsonl)
    work/shard-00042.stats.json            written last: the shard's done marker
    audio/shard-00042/<id>.wav             the audio
    merge/00/shard-00042.part              that shard's share of the outputs, as the last merge made it
    manifest.jsonl, failures.jsonl, conversations.json, summary.json, config.yaml
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.plan_dir = self.root / "plan"
        self.plan_file = self.plan_dir / "plan.json"
        self.skipped_file = self.plan_dir / "skipped.jsonl"
        self.shards_dir = self.plan_dir / "shards"
        self.work_dir = self.root / "work"
        self.slots_dir = self.work_dir / "slots"
        self.audio_root = self.root / "audio"
        self.config_file = self.root / "config.yaml"
        self.manifest_file = self.root / "manifest.jsonl"
        self.failures_file = self.root / "failures.jsonl"
        self.conversations_file = self.root / "conversations.json"
        self.summary_file = self.root / "summary.json"
        self.merge_dir = self.root / "merge"
        self.merge_state = self.merge_dir / "state.json"

    def shard_names(self) -> list[str]:
        return sorted(p.name[: -len(".jsonl")] for p in self.shards_dir.glob("shard-?????.jsonl"))

    def shard_file(self, shard: str) -> Path:
        return self.shards_dir / f"{shard}.jsonl"

    def shard_conversations(self, shard: str) -> Path:
        return self.shards_dir / f"{shard}.conversations.jsonl"

    # Several workers speak pieces of one shard at once, each into files of its own: an append
    # from two processes to one file is not atomic on NFS or Lustre, and a writer killed mid-line
    # would leave a fragment the next writer's line is glued to. A file's only writer cuts its
    # torn tail before appending; readers take every file of the shard.
    def manifest(self, shard: str, writer: str | None = None) -> Path:
        return self.work_dir / (f"{shard}.{writer}.manifest.jsonl" if writer else f"{shard}.manifest.jsonl")

    def manifests(self, shard: str) -> list[Path]:
        return _existing(self.manifest(shard), self.work_dir.glob(f"{shard}.*.manifest.jsonl"))

    def failures(self, shard: str, writer: str | None = None) -> Path:
        return self.work_dir / (f"{shard}.{writer}.failures.jsonl" if writer else f"{shard}.failures.jsonl")

    def failure_files(self, shard: str) -> list[Path]:
        return _existing(self.failures(shard), self.work_dir.glob(f"{shard}.*.failures.jsonl"))

    def crashes(self, shard: str, writer: str | None = None) -> Path:
        """A slot's record of worker deaths; a slot fed pieces by the Ray driver keeps its own (`writer`)."""
        return self.work_dir / (f"{shard}.{writer}.crashes.jsonl" if writer else f"{shard}.crashes.jsonl")

    def stats(self, shard: str) -> Path:
        return self.work_dir / f"{shard}.stats.json"

    def audio_dir(self, shard: str) -> Path:
        return self.audio_root / shard

    def merge_part(self, shard: str) -> Path:
        """A thousand shards a folder: a million conversations make tens of thousands of shards."""
        return self.merge_dir / f"{int(shard.rpartition('-')[2]) // 1000:02d}" / f"{shard}.part"

    def slot_status(self, rank: int) -> Path:
        return self.slots_dir / f"slot-{rank}.json"


class WorkListing:
    """work/ listed once, by shard, for a reader of many shards (merge, a slot as it starts): a glob
    per shard lists the whole directory each time, which is quadratic (a million conversations make
    64,670 shards and twice as many work files or more). The same answers as Layout.manifests and
    failure_files, as of the listing: only for shards nobody writes to meanwhile."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.names: dict[str, list[str]] = {}
        try:
            entries = [e.name for e in os.scandir(layout.work_dir)]
        except FileNotFoundError:
            entries = []
        for name in entries:
            if name.startswith("shard-"):  # hidden temporaries start with a dot, as glob skips them
                self.names.setdefault(name.partition(".")[0], []).append(name)

    def manifests(self, shard: str) -> list[Path]:
        return self._files(shard, self.layout.manifest(shard), ".manifest.jsonl")

    def notice(self, shard: str, paths) -> None:
        """Those of `paths` (files of the shard the caller's own processes write) that exist now: the
        listing kept current without listing the folder again."""
        names = self.names.setdefault(shard, [])
        names += [p.name for p in paths if p.name not in names and p.is_file()]

    def failure_files(self, shard: str) -> list[Path]:
        return self._files(shard, self.layout.failures(shard), ".failures.jsonl")

    def _files(self, shard: str, legacy: Path, suffix: str) -> list[Path]:
        # writers' files are {shard}.{writer}{suffix}; the legacy one is {shard}{suffix}
        names = self.names.get(shard, [])
        writers = [
            self.layout.work_dir / n
            for n in names
            if n.endswith(suffix) and n != legacy.name and len(n) >= len(shard) + 1 + len(suffix)
        ]
        return _existing(legacy, writers) if legacy.name in names else sorted(writers)


def _existing(legacy: Path, writers) -> list[Path]:
    return ([legacy] if legacy.is_file() else []) + sorted(writers)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"
