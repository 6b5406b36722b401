"""The shapes a conversation record may have, and its turns read out of whichever it has: ShareGPT /
LLaVA's `conversations`, OpenAI's `messages`, Alpaca's instruction and output. Apart from reader.py,
which finds the records in the file's bytes: this module sees one parsed value at a time.
"""

from __future__ import annotations


def record_problem(value) -> str | None:
    """Why a top-level value cannot be a conversation record, or None."""
    if not isinstance(value, dict):
        return f"record is {json_type(value)}, not an object"
    for key in TURN_LISTS:
        if key in value:
            turns = value[key]
            if not isinstance(turns, list):
                return f"{key!r} is {json_type(turns)}, not a list"
            return None if turns else f"{key!r} is empty"
    if "instruction" in value or "output" in value:
        return _alpaca_problem(value)
    return "record has no 'conversations' or 'messages' list, nor Alpaca's 'instruction' and 'output'"


def _alpaca_problem(value: dict) -> str | None:
    for key in ("instruction", "output"):
        if not isinstance(value.get(key), str):
            return f"Alpaca record's {key!r} is {json_type(value.get(key))}, not a string"
    extra = value.get("input")
    return None if extra is None or isinstance(extra, str) else f"Alpaca record's 'input' is {json_type(extra)}"


# The lists a record's turns may come in, in this order: ShareGPT / LLaVA's, then OpenAI's chat
# format (LLaMA-Factory's sharegpt with `messages`, role / content).
TURN_LISTS = ("conversations", "messages")


def conversation_turns(record: dict) -> list:
    """The record's turns, one for each item of its turn list (so a turn's number is its place there).

    `conversations` as it is; `messages` with each content given as text: a list of parts
    ([{"type": "text", "text": "..."}, {"type": "image_url", ...}]) becomes its text parts joined by a
    line break. An Alpaca record {"instruction", "input", "output"} is two turns: instruction and input
    (a line apart, as LLaMA-Factory joins them) from the human, output from gpt.
    """
    if "conversations" in record:
        return record["conversations"]
    if "messages" in record:
        return [_message_turn(item) for item in record["messages"]]
    prompt = record["instruction"] + ("\n" + record["input"] if record.get("input") else "")
    return [{"from": "human", "value": prompt}, {"from": "gpt", "value": record["output"]}]


def _message_turn(item):
    if not isinstance(item, dict) or not isinstance(item.get("content"), list):
        return item
    texts = [p.get("text") for p in item["content"] if isinstance(p, dict) and p.get("type") == "text"]
    return {**item, "content": "\n".join(t for t in texts if isinstance(t, str))}


_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def json_type(value) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)
