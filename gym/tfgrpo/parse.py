"""A tolerant parser for the operations an LLM writes; it never raises.

    ops, errors = parse_ops(llm_text, library.aliases())

Accepts fenced or bare JSON with prose around it, `//`, `#` and `/* */` comments, trailing commas,
single quotes, a list or an object holding one (`{"operations": [...]}`), operation names in any
case with common synonyms (modify -> update, remove -> delete, ...), the field names of the
reference implementation (`option`, `experience`, `modified_from`, `merged_from`, `delete_id`), and
ids written as display aliases (`G3`, `[G3]`, `3`) or stable ids (`E7`). Anything that cannot be
read as a valid operation becomes an error message instead (unknown ids included); only
operations that are well-formed on their own come out. Whether they fit together is `ops.apply`'s
job.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from gym.tfgrpo.ops import Add, Delete, Merge, NoOp, Op, Update

_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([\]}])")
_ALIAS_PREFIX = re.compile(r"^\s*\[?G\d+\]?[.:)]\s*", re.IGNORECASE)
_ID = re.compile(r"^\[?\s*([A-Za-z]?)\s*(\d+)\s*\]?\.?$")

OP_NAMES = {
    "add": "add", "insert": "add", "create": "add", "new": "add", "append": "add",
    "update": "update", "modify": "update", "edit": "update", "revise": "update", "replace": "update",
    "rewrite": "update", "delete": "delete", "remove": "delete", "drop": "delete", "merge": "merge",
    "combine": "merge", "none": "none", "noop": "none", "no_op": "none", "no-op": "none", "keep": "none",
    "skip": "none", "no change": "none",
}  # fmt: skip
OP_KEYS = ("operation", "option", "op", "action", "type")
TEXT_KEYS = ("text", "experience", "content", "insight", "new_text", "rule")
ID_KEYS = ("id", "target", "target_id", "experience_id", "modified_from", "delete_id", "update_id", "source")
IDS_KEYS = ("ids", "merged_from", "merge_ids", "sources", "source_ids", "from")
LIST_KEYS = ("operations", "ops", "updates", "changes", "experiences", "actions")


def parse_ops(text: str, aliases: Mapping[str, str]) -> tuple[list[Op], list[str]]:
    """The valid operations in `text` and a message for everything else; never raises."""
    try:
        return _parse(text, aliases)
    except Exception as exc:  # the parser's promise: junk in, errors out
        return [], [f"unreadable output ({type(exc).__name__}: {exc})"]


def _parse(text: str, aliases: Mapping[str, str]) -> tuple[list[Op], list[str]]:
    value, error = load_json_like(text)
    if error:
        return [], [error]
    items = _items(value)
    if items is None:
        return [], [f"expected a JSON list of operations, got {type(value).__name__}"]
    ops: list[Op] = []
    errors: list[str] = []
    for n, item in enumerate(items, start=1):
        op, problem = _op(item, aliases)
        if problem:
            errors.append(f"operation {n}: {problem}")
        elif op is not None:
            ops.append(op)
    return ops, errors


def load_json_like(text: str) -> tuple[Any, str | None]:
    """The first list of operations (or object holding them) in `text`: (value, None), or
    (None, what went wrong). Fenced blocks are tried first, then the bare text."""
    if not isinstance(text, str) or not text.strip():
        return None, "empty output"
    for candidate in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        starts = [i for i, ch in enumerate(candidate) if ch in "[{"][:MAX_STARTS]
        for start in starts:
            value = _decode(candidate[start:])
            if value is not _FAILED and _items(value) is not None:
                more = _more_ops(candidate[start:])
                if not more:
                    return value, None
                if all(_items(v) == [v] for v in [value, *more]):  # one operation per line (JSON Lines)
                    return [value, *more], None
                return None, (
                    f"{1 + len(more)} separate lists of operations; write every operation in one JSON list"
                )
    return None, "no JSON list of operations found"


def _more_ops(chunk: str) -> list[Any]:
    """The values after the first JSON value of `chunk` that are operations or lists of them (lines of
    JSON Lines, a second list): nothing when the first one is not plain JSON."""
    cleaned = _cleaned(chunk)
    decoder = json.JSONDecoder()
    try:
        end = decoder.raw_decode(cleaned)[1]
    except json.JSONDecodeError:
        return []
    found: list[Any] = []
    starts = [i for i in range(end, len(cleaned)) if cleaned[i] in "[{"][:MAX_STARTS]
    for i in starts:
        if i < end:  # inside the value found last
            continue
        try:
            value, end = decoder.raw_decode(cleaned, i)
        except json.JSONDecodeError:
            continue
        items = _items(value)
        if items and all(isinstance(item, dict) and _first(item, OP_KEYS) is not None for item in items):
            found.append(value)
    return found


MAX_STARTS = 64
_FAILED = object()


def _decode(chunk: str) -> Any:
    """Decode the JSON-ish value at the start of `chunk` (text after it is ignored)."""
    cleaned = _cleaned(chunk)
    try:
        return json.JSONDecoder().raw_decode(cleaned)[0]
    except json.JSONDecodeError:
        pass
    end = cleaned.rfind("]" if cleaned[0] == "[" else "}")
    literal = re.sub(r"\btrue\b", "True", cleaned[: end + 1])
    literal = re.sub(r"\bnull\b", "None", re.sub(r"\bfalse\b", "False", literal))
    try:
        return ast.literal_eval(literal)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _FAILED


def _cleaned(chunk: str) -> str:
    """`chunk` as JSON can read it: comments outside strings and trailing commas removed."""
    return _TRAILING_COMMA.sub(r"\1", strip_comments(chunk))


def strip_comments(text: str) -> str:
    """Remove //, # and /* */ comments that are outside string literals."""
    out: list[str] = []
    i, quote = 0, ""
    while i < len(text):
        ch = text[i]
        if quote:
            out.append(ch)
            if ch == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
            out.append(ch)
        elif text.startswith("//", i) or ch == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = len(text) if close == -1 else close + 2
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _items(value: Any) -> list[Any] | None:
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        for key in LIST_KEYS:
            found = _get(value, key)
            if isinstance(found, list):
                return found
        if any(_get(value, key) is not None for key in OP_KEYS):
            return [value]
    return None


def _get(item: dict[str, Any], key: str) -> Any:
    for k, v in item.items():
        if isinstance(k, str) and k.strip().lower() == key:
            return v
    return None


def _first(item: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        value = _get(item, key)
        if value is not None:
            return value
    return None


def resolve_id(raw: Any, aliases: Mapping[str, str]) -> str | None:
    """A stable id from `G3`, `[G3]`, `3`, `E7` (a stable id in the library); None if unknown."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        return None
    match = _ID.match(str(raw).strip())
    if not match:
        return None
    letter, number = match.group(1).upper(), match.group(2)
    if letter in ("", "G"):
        return aliases.get(f"G{int(number)}")
    stable = f"{letter}{int(number)}"
    return stable if stable in set(aliases.values()) else None


def _clean_text(raw: Any) -> str | None:
    if not isinstance(raw, str):
        return None
    return _ALIAS_PREFIX.sub("", raw).strip() or None


def read_op(item: Any, aliases: Mapping[str, str]) -> tuple[Op | None, str | None]:
    """One operation in the LLM's JSON shape (a dict): (the op, None), (None, what is wrong with it), or
    (None, None) for a no-op; never raises."""
    try:
        return _op(item, aliases)
    except Exception as exc:  # as parse_ops: junk in, an error out
        return None, f"unreadable ({type(exc).__name__}: {exc})"


def _op(item: Any, aliases: Mapping[str, str]) -> tuple[Op | None, str | None]:
    if not isinstance(item, dict):
        return None, f"not an object: {str(item)[:60]!r}"
    raw_name = _first(item, OP_KEYS)
    name = OP_NAMES.get(str(raw_name).strip().lower()) if raw_name is not None else None
    if name is None:
        return None, f"unknown operation {raw_name!r} (use add, update, delete, merge or none)"
    if name == "none":
        return NoOp(), None
    text = _clean_text(_first(item, TEXT_KEYS))
    if name in ("add", "update", "merge") and text is None:
        return None, f"{name} without text"
    if name == "add":
        return Add(text=text or ""), None
    if name == "merge":
        raw_ids = _first(item, IDS_KEYS)
        if not isinstance(raw_ids, list) or not raw_ids:
            return None, "merge without a list of ids"
        ids = [resolve_id(r, aliases) for r in raw_ids]
        if unknown := [r for r, i in zip(raw_ids, ids, strict=True) if i is None]:
            return None, f"merge of unknown id(s) {', '.join(map(str, unknown))}"
        return Merge(ids=tuple(i for i in ids if i), text=text or ""), None
    raw_id = _first(item, ID_KEYS)
    if isinstance(raw_id, list) and len(raw_id) == 1:
        raw_id = raw_id[0]
    item_id = resolve_id(raw_id, aliases)
    if item_id is None:
        return None, f"{name} of unknown id {raw_id!r}"
    if name == "delete":
        return Delete(id=item_id), None
    return Update(id=item_id, text=text or ""), None
