"""Whether a plan on disk is this input's and these settings': its fingerprint (the input's content,
the plan's settings, the text rules' digest) and the versions of the plan's files."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import orjson

from convtts.config import PLAN_GROUPS, Config, TextConfig, to_dict
from convtts.plan.conversation import plan_conversation
from convtts.plan.reader import InputError
from convtts.plan.voices import casting_for, names_digest
from convtts.speak import voice_languages
from convtts.state.layout import Layout

PLAN_VERSION = 5  # bump when the plan's files change; the text rules are fingerprinted (RULES_SINCE)
# Plans from this version on give the same ids for the same input and settings, so remaking one of
# them keeps the spoken work (2: source_text only on a turn's first segment; 3: the fingerprint
# knows the input by its content; 4: each turn's language, Chinese, Japanese and Korean cut by
# characters, math and operators said as words, a conversation longer than a shard cut across
# shards; 5: the text rules' digest, same ids and texts). Raise it to PLAN_VERSION when a change of
# the plan's files gives different ids or texts.
SAME_IDS_SINCE = 4
# Plans from this version on know their input by a hash of its bytes; older ones by path, size and
# modification time, so a touched or moved input looked like another one.
CONTENT_SINCE = 3
# Plans from this version on carry a digest of what the text rules make of fixed conversations
# (plan/canary.py, at the default text settings): a plan made by other cleaning or splitting reads
# as stale by itself.
RULES_SINCE = 5
HASH_BLOCK = 1 << 20  # sha256 over 1 MiB reads: 1.2 GB/s on a busy 2-core machine (OpenSSL's SHA
# extensions); blake2b, pure software there, ran at 0.5 to 0.6 GB/s


def input_info(path: str | Path) -> dict:
    """The input file's identity on disk: enough to see that it changed while a plan was being made."""
    try:
        st = Path(path).stat()
    except OSError as exc:
        raise InputError(f"cannot read input file {path}: {exc.strerror or exc}") from None
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


_digests: dict[tuple, str] = {}  # content_digest's answers, by the file's identity on disk


def content_digest(path: str | Path) -> str:
    """The sha256 of the file's bytes, read in HASH_BLOCK pieces; asked again for the same unchanged
    file (path, inode, size, mtime), the answer it gave: a run asks several times."""
    try:
        st = os.stat(path)
        key = (str(Path(path).resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _digests:
            _digests[key] = _sha256_of(path)
    except OSError as exc:
        raise InputError(f"cannot read input file {path}: {exc.strerror or exc}") from None
    return _digests[key]


def _sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    block = bytearray(HASH_BLOCK)
    view = memoryview(block)
    with open(path, "rb") as fh:
        while size := fh.readinto(block):
            digest.update(view[:size])
    return digest.hexdigest()


def fingerprint(input_path: str | Path, config: Config, info: dict | None = None, version: int = PLAN_VERSION) -> str:
    """What the plan depends on: the input file's content and the config groups in PLAN_GROUPS.

    A plan of a version before CONTENT_SINCE knew its input by path, size and modification time
    (`info`, else read now): that fingerprint is made the same way, to recognise such a plan.
    """
    if version >= CONTENT_SINCE:
        source = {"sha256": content_digest(input_path)}
    else:
        source = info or input_info(input_path)
    data = {"version": version, "input": source, "config": plan_settings(config)}
    if version >= RULES_SINCE:
        data["rules"] = rules_digest(config)
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


def rules_digest(config: Config) -> str:
    """A digest of the segments (ids, texts, languages) the text rules make of plan/canary.py's
    conversations at the default text settings: it changes when the rules' code does (the settings
    are the fingerprint's own part, so a changed setting is named as itself, not as the rules)."""
    global _RULES_DIGEST
    if _RULES_DIGEST is None:  # a preprocess asks several times; the code does not change meanwhile
        from convtts.plan.canary import CANARY

        defaults = dataclasses.replace(config, text=TextConfig())
        said = []
        for record in CANARY:
            segments, _ = plan_conversation(record["id"], record, defaults)
            said += [(s["id"], s["text"], s.get("language")) for s in segments]
        _RULES_DIGEST = hashlib.sha256(orjson.dumps(said)).hexdigest()[:16]
    return _RULES_DIGEST


_RULES_DIGEST: str | None = None


def rules_changed(layout: Layout, config: Config) -> bool:
    """Whether the plan in `layout` was made by text rules that say the canary otherwise (a plan of
    a version before RULES_SINCE does not say: False)."""
    made_by = read_plan(layout).get("rules")
    return isinstance(made_by, str) and made_by != rules_digest(config)


def plan_settings(config: Config) -> dict:
    """The config groups in PLAN_GROUPS; a voice pool by the names of its voices, not its path (a
    pool moved elsewhere, or a recording or transcript changed, assigns the same voices)."""
    groups = to_dict(config)
    settings = {group: groups[group] for group in PLAN_GROUPS}
    casting = casting_for(config)
    pool = settings["speakers"].pop("pool")  # without a pool, the settings of plans made before pools
    if pool:
        settings["speakers"]["pool"] = names_digest(casting.voices)
    # the voices each language takes, as cast (explicit or said by the voices); none: the settings of
    # plans made before languages had voices
    del settings["speakers"]["by_language"]
    groups = {lang: of.voices for lang, of in casting.by_language.items()}
    if groups:
        settings["speakers"]["by_language"] = {
            lang: list(names) if len(names) <= 32 else names_digest(names) for lang, names in groups.items()
        }
    # Links said as their domain (the default; link_phrase unused): the settings of plans made before
    # text.links, so that an output in progress stays fresh after an upgrade and goes on speaking its
    # own plan's texts.
    if config.text.links == "domain":
        del settings["text"]["links"], settings["text"]["link_phrase"]
    # Likewise the text settings added since at their defaults: an English plan's segments are what they were.
    for key, default in TEXT_DEFAULTS.items():
        if settings["text"][key] == default:
            del settings["text"][key]
    return settings


_ADDED_TEXT_KEYS = (
    "language", "max_chars", "chars_per_minute", "code_phrase", "figure_phrase", "dense_math_phrase", "dense_math_words"
)  # fmt: skip
TEXT_DEFAULTS = {key: to_dict(TextConfig())[key] for key in _ADDED_TEXT_KEYS}


def plan_is_fresh(input_path: str | Path, layout: Layout, config: Config) -> bool:
    return plan_matches(input_path, layout, config) and not missing_plan_files(layout)


def plan_matches(input_path: str | Path, layout: Layout, config: Config) -> bool:
    """plan.json was made from this input file with these plan settings (its files may be gone)."""
    plan = read_plan(layout)
    try:
        return plan.get("fingerprint") == fingerprint(input_path, config) and same_voice_languages(plan, config)
    except InputError:
        return False


def same_voice_languages(plan: dict, config: Config) -> bool:
    """Whether the configured voice leaves out the languages the plan left out (skipped_languages),
    of those the input holds: another voice may speak turns the plan skipped, or not speak some it kept."""
    skipped = set(plan.get("skipped_languages") or ())
    speaks = voice_languages(config)
    seen = set(plan.get("languages") or ()) | skipped
    return skipped == {language for language in seen if speaks is not None and language not in speaks}


def earlier_version_with_same_ids(input_path: str | Path, layout: Layout, config: Config) -> int | None:
    """The version of a plan made from this input and settings by an earlier convtts whose ids and
    texts are ours (SAME_IDS_SINCE), or None: remaking such a plan keeps the spoken work."""
    plan = read_plan(layout)
    version = plan.get("version")
    if not isinstance(version, int) or not SAME_IDS_SINCE <= version < PLAN_VERSION:
        return None
    try:
        return version if plan.get("fingerprint") == fingerprint(input_path, config, version=version) else None
    except InputError:
        return None


def missing_plan_files(layout: Layout) -> list[Path]:
    """Shard files plan.json lists that are not there (deleted by hand, or lost with a disk)."""
    shards = read_plan(layout).get("shards", [])
    return [p for s in shards for p in (layout.shard_file(s), layout.shard_conversations(s)) if not p.is_file()]


def read_plan(layout: Layout) -> dict:
    try:
        plan = orjson.loads(layout.plan_file.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return plan if isinstance(plan, dict) else {}
