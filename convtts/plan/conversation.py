"""One conversation planned: its turns cleaned, each in its language, split into segments, with voices."""

from __future__ import annotations

from convtts.config import Config
from convtts.language import counts_characters, detect, spoken_units
from convtts.plan.record_shapes import conversation_turns, json_type
from convtts.plan.segments import split_characters
from convtts.plan.textclean import clean, split_segments
from convtts.plan.voices import Casting, casting_for

ROLES = {
    "human": "human",
    "user": "human",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


def turn_problem(item, side: str | None, config: Config) -> str | None:
    """Why a turn is not spoken before its text is even cleaned, or None."""
    if not isinstance(item, dict):
        return f"turn is {json_type(item)}, not an object"
    role = item.get("from", item.get("role"))
    if side is None:
        return f"unknown role {role!r}" if role is not None else "turn has no 'from' role"
    if side not in config.text.speak_roles:
        return f"role {side} is not in text.speak_roles"
    value = item.get("value", item.get("content"))
    if not isinstance(value, str):
        return f"value is {json_type(value)}, not a string"
    if len(value) > config.text.max_turn_chars:
        return f"turn is longer than text.max_turn_chars ({len(value)} > {config.text.max_turn_chars})"
    return None


def plan_conversation(
    cid: str, record: dict, config: Config, casting: Casting | None = None, speaks: frozenset[str] | None = None
) -> tuple[list[dict], list[dict]]:
    """(segments to speak, skipped turns) of one record; ids are {conversation}-{turn:03d}-{segment:02d}.

    `casting` is Casting.of(config.speakers, voice_names(...)) when there is a pool; `speaks` the
    languages of the voice (voice_languages(config); None: any): a turn in another one is skipped.
    """
    casting = casting or casting_for(config)
    sides: dict[str | None, dict[str, str]] = {}  # the conversation's voices for each language it speaks
    link, phrases = config.text.link_words(), config.text.phrases()
    segments, skipped = [], []
    for turn, item in enumerate(conversation_turns(record)):
        role = item.get("from", item.get("role")) if isinstance(item, dict) else None
        side = ROLES.get(role.strip().lower()) if isinstance(role, str) else None
        reason = turn_problem(item, side, config)
        language = None
        if reason is None:
            source = item.get("value", item.get("content"))
            language = detect(source) if config.text.language == "auto" else config.text.language
            text, reason = clean(source, link, language=language, phrases=phrases)
            if reason is None and speaks is not None and language not in speaks:
                reason = f"language {language}: the voice speaks {', '.join(sorted(speaks))}"
        if reason is not None:
            skipped.append(
                {
                    "id": f"{cid}-{turn:03d}",
                    "conversation_id": cid,
                    "source_id": record.get("id"),
                    "turn": turn,
                    "role": role,
                    "status": "skipped",
                    "reason": reason,
                    "language": language,
                }
            )
            continue
        if language not in sides:
            sides[language] = casting.sides(cid, language)
        speaker = casting.turn(cid, turn, side, sides[language], language)
        for number, piece in enumerate(split_turn(text, language, config)):
            segment = {
                "id": f"{cid}-{turn:03d}-{number:02d}",
                "conversation_id": cid,
                "source_id": record.get("id"),
                "turn": turn,
                "segment": number,
                "role": role,
                "side": side,
                "speaker": speaker,
                "language": language,
                "text": piece,
                "source_text": source,
                "words": spoken_units(piece, language),
            }
            if number:  # the turn's text once, on its first segment: the plan grows with the text
                del segment["source_text"]
            segments.append(segment)
    return segments, skipped


def split_turn(text: str, language: str, config: Config) -> list[str]:
    """Segments in the language's own unit: characters for Chinese, Japanese, Korean; words otherwise."""
    if counts_characters(language):
        return split_characters(text, config.text.max_chars)
    return split_segments(text, config.text.max_words)
