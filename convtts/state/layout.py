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

    A plan of more than FAN_OUT_SHARDS shards keeps them a thousand a folder, and so do its work
    and audio: plan/shards/01/shard-01042.jsonl, work/01/shard-01042.w3.manifest.jsonl,
    audio/01/shard-01042/<id>.wav (a million conversations make about 65,000 shards). Whether an
    output is laid out so is read from its plan (fanned): outputs made before keep their layout.
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

    def fanned(self) -> bool:
        """Whether the plan keeps its shards (and the output its work and audio) a thousand a folder."""
        return (self.shards_dir / shard_folder(shard_name(0))).is_dir()

    def _folder(self, root: Path, shard: str) -> Path:
        return root / shard_folder(shard) if self.fanned() else root

    def shard_names(self) -> list[str]:
        pattern = "*/shard-?????.jsonl" if self.fanned() else "shard-?????.jsonl"
        return sorted(p.name[: -len(".jsonl")] for p in self.shards_dir.glob(pattern))

    def shard_file(self, shard: str) -> Path:
        return self._folder(self.shards_dir, shard) / f"{shard}.jsonl"

    def shard_conversations(self, shard: str) -> Path:
        return self._folder(self.shards_dir, shard) / f"{shard}.conversations.jsonl"

    def work_folders(self) -> list[Path]:
        """The folders that hold work files of shards: work/, or its thousand-shard folders."""
        if not self.fanned():
            return [self.work_dir]
        try:
            return sorted(Path(e.path) for e in os.scandir(self.work_dir) if e.is_dir() and e.name.isdigit())
        except FileNotFoundError:
            return []

    # Several workers speak pieces of one shard at once, each into files of its own: an append
    # from two processes to one file is not atomic on NFS or Lustre, and a writer killed mid-line
    # would leave a fragment the next writer's line is glued to. A file's only writer cuts its
    # torn tail before appending; readers take every file of the shard.
    def manifest(self, shard: str, writer: str | None = None) -> Path:
        name = f"{shard}.{writer}.manifest.jsonl" if writer else f"{shard}.manifest.jsonl"
        return self._folder(self.work_dir, shard) / name

    def manifests(self, shard: str) -> list[Path]:
        legacy = self.manifest(shard)
        return _existing(legacy, legacy.parent.glob(f"{shard}.*.manifest.jsonl"))

    def failures(self, shard: str, writer: str | None = None) -> Path:
        name = f"{shard}.{writer}.failures.jsonl" if writer else f"{shard}.failures.jsonl"
        return self._folder(self.work_dir, shard) / name

    def failure_files(self, shard: str) -> list[Path]:
        legacy = self.failures(shard)
        return _existing(legacy, legacy.parent.glob(f"{shard}.*.failures.jsonl"))

    def crashes(self, shard: str, writer: str | None = None) -> Path:
        """A slot's record of worker deaths; a slot fed pieces by the Ray driver keeps its own (`writer`)."""
        name = f"{shard}.{writer}.crashes.jsonl" if writer else f"{shard}.crashes.jsonl"
        return self._folder(self.work_dir, shard) / name

    def stats(self, shard: str) -> Path:
        return self._folder(self.work_dir, shard) / f"{shard}.stats.json"

    def all_manifests(self) -> list[Path]:
        """Every shard's manifest files in work/."""
        return sorted(p for folder in self.work_folders() for p in folder.glob("shard-*.manifest.jsonl"))

    def audio_dir(self, shard: str) -> Path:
        return self._folder(self.audio_root, shard) / shard

    def merge_part(self, shard: str) -> Path:
        """A thousand shards a folder: a million conversations make tens of thousands of shards."""
        return self.merge_dir / shard_folder(shard) / f"{shard}.part"

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
        for folder in layout.work_folders():
            try:
                entries = [e.name for e in os.scandir(folder)]
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
            legacy.parent / n
            for n in names
            if n.endswith(suffix) and n != legacy.name and len(n) >= len(shard) + 1 + len(suffix)
        ]
        return _existing(legacy, writers) if legacy.name in names else sorted(writers)


def _existing(legacy: Path, writers) -> list[Path]:
    return ([legacy] if legacy.is_file() else []) + sorted(writers)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


FAN_OUT_SHARDS = 1000  # a plan of more shards keeps them a thousand a folder (Layout.fanned)


def shard_folder(shard: str) -> str:
    """The thousand-shard folder of a shard: '01' for shard-01042."""
    return f"{int(shard.rpartition('-')[2]) // 1000:02d}"
