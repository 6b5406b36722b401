"""Check the config and input, then make (or keep) the plan: which segments to speak, in which shards."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

from convtts import EXIT_DISK_FULL, EXIT_OK
from convtts.cli import add_config_args, fail, load_config_or_exit, setup_logging
from convtts.config import ConfigError, dump_yaml
from convtts.counts import plural
from convtts.gate.quality import check_gate
from convtts.language import counts_characters
from convtts.plan.changes import plan_changes
from convtts.plan.freshness import (
    PLAN_VERSION,
    earlier_version_with_same_ids,
    missing_plan_files,
    plan_is_fresh,
    plan_matches,
    rules_changed,
)
from convtts.plan.planner import make_plan
from convtts.plan.reader import InputError
from convtts.speak import check_backend
from convtts.state.layout import Layout
from convtts.state.shardio import disk_full_text, is_disk_full, read_json, read_jsonl, write_atomic

log = logging.getLogger("preprocess")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--input",
        required=True,
        help="conversations (LLaVA / ShareGPT `conversations`, OpenAI `messages`, or Alpaca records): "
        "a JSON array or JSON lines, plain, gzip'ed or zstd'ed",
    )
    parser.add_argument("--output-dir", required=True, help="where plan/, work/ and audio/ go")
    add_config_args(parser)
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--fraction", type=float, help="speak this share of the conversations (select.fraction)")
    chosen.add_argument("--count", type=int, help="speak this many conversations (select.count)")
    parser.add_argument("--seed", type=int, help="selection seed (select.seed)")
    parser.add_argument("--validate", action="store_true", help="check config and input, write nothing")
    parser.add_argument(
        "--force-replan",
        "--force",
        dest="force",
        action="store_true",
        help="replan even though synthesis work from another plan exists (that work is deleted); "
        "run_all.sh's flag of the same name",
    )
    return parser.parse_args(argv)


def selection_overrides(args: argparse.Namespace) -> list[str]:
    """--fraction and --count replace each other, whatever the config file chose."""
    extra = []
    if args.fraction is not None:
        extra += [f"select.fraction={args.fraction}", "select.count=null"]
    if args.count is not None:
        extra += [f"select.count={args.count}", "select.fraction=null"]
    if args.seed is not None:
        extra.append(f"select.seed={args.seed}")
    return extra


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging()
    config = load_config_or_exit(args, selection_overrides(args))
    try:
        check_backend(config)
        check_gate(config.validate)  # the quality gate's recogniser runs in the same workers
    except ConfigError as exc:
        fail(f"config error: {exc}")
    source = Path(args.input)
    if not source.exists():
        fail(f"input file not found: {source}")
    if not source.is_file():
        fail(f"input is not a file: {source}")
    if args.validate:
        log.info("config and input look usable")
        return EXIT_OK
    layout = Layout(args.output_dir)
    try:
        update_plan(source, layout, config, args.force)
        write_config(layout, config)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        fail(f"{disk_full_text(exc)}; free space and run again", EXIT_DISK_FULL)
    return EXIT_OK


def update_plan(source: Path, layout: Layout, config, force: bool) -> None:
    """Keep a plan that is up to date, remake one whose files went missing, or make a new one."""
    if plan_is_fresh(source, layout, config):
        log.info("the plan in %s is up to date with %s and the plan settings", layout.plan_dir, source)
        return
    missing = missing_plan_files(layout) if plan_matches(source, layout, config) else []
    if missing:
        log.warning(
            "plan files missing: %s; remaking the plan from %s: the same input and settings give the "
            "same shards, so the work spoken for them is kept",
            ", ".join(p.name for p in missing),
            source,
        )
    older = earlier_version_with_same_ids(source, layout, config)
    if older is not None:
        log.warning(
            "the plan in %s is in the format of plan version %d; remaking it in version %d from %s: "
            "the ids are the same, so the work spoken for them is kept",
            layout.plan_dir,
            older,
            PLAN_VERSION,
            source,
        )
    print(describe(build(source, layout, config, force, same_plan=bool(missing) or older is not None)))


class DifferentPlan(Exception):
    """The plan just made is not the one the output's work was spoken for."""


def build(source: Path, layout: Layout, config, force: bool, same_plan: bool = False) -> dict:
    """Make a new plan; refuse to orphan audio spoken from a different plan unless forced.

    A plan of an earlier version, or of other text rules, cannot say whether its work is this plan's
    (before CONTENT_SINCE it knew its input by path, size and modification time; later versions, or
    a changed cleaner or splitter, cut the text otherwise): the new plan is made, and kept with the
    work when every shard holds the old plan's utterances (the same ids, texts and voices, in order).
    """
    stale_work = [] if same_plan else layout.all_manifests()
    version = plan_version(layout)
    other_rules = rules_changed(layout, config)
    compare = bool(stale_work) and not force and (version < PLAN_VERSION or other_rules)
    changes = plan_changes(source, layout, config) if stale_work and not force else []
    if stale_work and not force and not compare:
        refuse(layout, stale_work, changes)

    def before_install(staging: Layout) -> None:
        if compare and not same_shards(staging, layout):
            raise DifferentPlan
        if stale_work and not compare:
            discard_work(layout)

    created = not layout.root.exists()
    try:
        plan = make_plan(source, layout, config, before_install=before_install)
    except DifferentPlan:
        refuse(layout, stale_work, changes)
    except (InputError, OSError) as exc:
        if created:
            shutil.rmtree(layout.root, ignore_errors=True)
        if is_disk_full(exc):
            raise
        fail(f"bad input: {exc}" if isinstance(exc, InputError) else f"plan not made: {exc}")
    if compare:
        log.warning(
            "the plan in %s is %s; the plan made now from %s has the same shards, so the "
            "work spoken for them is kept (the same ids, texts and voices)",
            layout.plan_dir,
            "of other text rules" if other_rules and version == PLAN_VERSION else f"of plan version {version}",
            source,
        )
    return plan


def refuse(layout: Layout, stale_work: list[Path], changes: list[str]) -> None:
    """Say what changed since the plan the work was spoken for, on one line: run_all.sh shows the
    error lines of preprocess's log."""
    work = f"{layout.root} holds synthesis work ({plural(len(stale_work), 'shard manifest')})"
    if changes:
        told = f"{work} spoken for another plan; changed since: {'; '.join(changes)}"
    else:
        told = f"{work} from a different input or different plan settings (select, text, speakers, shards)"
    fail(f"{told}; use a new --output-dir, or --force-replan to replan and delete that work")


def plan_version(layout: Layout) -> int:
    """The version of the plan in the output (PLAN_VERSION when there is none to speak of)."""
    plan = read_json(layout.plan_file)
    version = plan.get("version") if isinstance(plan, dict) else None
    return version if isinstance(version, int) else PLAN_VERSION


def same_shards(new: Layout, old: Layout) -> bool:
    """Whether two plans give every shard the same utterances: ids, texts and voices, in order. The
    audio spoken for one plan is then the other's; fields a later version adds (a row's language)
    change nothing of it."""
    names = new.shard_names()
    if names != old.shard_names():
        return False
    return all(_utterances(new.shard_file(n)) == _utterances(old.shard_file(n)) for n in names)


def _utterances(path: Path) -> list[tuple] | None:
    if not path.is_file():
        return None
    return [(row["id"], row["text"], row.get("speaker")) for row in read_jsonl(path)]


def discard_work(layout: Layout) -> None:
    """Audio and manifests of the old plan would pass as done under the new one: remove them."""
    log.warning("--force-replan: deleting the synthesis work of the previous plan in %s", layout.root)
    for path in (layout.work_dir, layout.audio_root):
        shutil.rmtree(path, ignore_errors=True)
    for path in (layout.manifest_file, layout.failures_file, layout.conversations_file, layout.summary_file):
        path.unlink(missing_ok=True)


def write_config(layout: Layout, config) -> None:
    """The resolved config beside the output, written whole or not at all."""
    layout.root.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.config_file, dump_yaml(config).encode())


def describe(plan: dict) -> str:
    shards = plan["shards"]
    names = shards[0] if len(shards) == 1 else f"{shards[0]} .. {shards[-1]}"
    return (
        f"Plan: {plural(plan['conversations'], 'conversation')} "
        f"({plural(plan['skipped_records'], 'unusable record')} skipped), "
        f"{plural(plan['turns'], 'turn')} to speak ({plan['skipped_turns']:,} skipped{unspoken(plan)}, "
        "see plan/skipped.jsonl), "
        f"{plural(plan['segments'], 'segment')}, {plural(plan['words'], 'word')}{in_characters(plan)}, "
        f"about {audio_length(plan['estimated_hours'])} of audio, in {plural(len(shards), 'shard')} ({names})."
    )


def in_characters(plan: dict) -> str:
    """` (characters in zh)` where some turns are counted in characters (convtts/language.py)."""
    counted = [language for language in plan.get("languages") or () if counts_characters(language)]
    return f" (characters in {', '.join(counted)})" if counted else ""


def unspoken(plan: dict) -> str:
    """`, 3 of them in zh, which the voice does not speak`, or nothing."""
    languages = plan.get("skipped_languages") or {}
    if not languages:
        return ""
    told = ", ".join(f"{n:,} in {language}" for language, n in languages.items())
    return f", {told}: the voice does not speak it"


def audio_length(hours: float) -> str:
    return f"{hours:,.1f} hours" if hours >= 1 else plural(round(hours * 60), "minute")


if __name__ == "__main__":
    sys.exit(main())
