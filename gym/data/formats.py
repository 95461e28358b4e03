"""Normalize raw records into gym's three canonical record kinds, with errors that say where and why.

Canonical kinds (what `ingest` writes and `tokenize` reads):

- `sft`: `{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}`: an optional
  system message, then user/assistant turns alternating, ending with an assistant turn.
- `preference`: `{"prompt": [messages ending with a user turn], "chosen": str, "rejected": str}`.
- `kto`: `{"prompt": [messages ending with a user turn], "completion": str, "label": bool}`.
- `prompt`: `{"prompt": [messages ending with a user turn], "answer": str | None, "metadata": JSON text}`:
  what online RL (PPO, GRPO, GSPO) samples completions for; `answer` is the optional ground truth
  reward functions compare against, `metadata` any extra fields they may use (a JSON object).
- `text`: `{"text": str}`: raw text for continued pretraining (method pt), trained on as it is.

Source formats (the `format` of a dataset registry entry) and the kind each gives:

- `alpaca` (sft): instruction, input (optional), output, system (optional), history
  `[[query, answer], ...]` (optional). The user turn is `instruction + "\\n" + input`, or whichever of
  the two is non-empty, as LLaMA-Factory does.
- `sharegpt` / `openai` (sft): `conversations` (`{"from", "value"}`) or `messages` (`{"role", "content"}`),
  plus an optional top-level `system`. Roles human/user, gpt/assistant, system (OpenAI's developer
  too). OpenAI content may be a list of text parts (`[{"type": "text", "text": ...}]`, joined by
  newlines); other parts (images, audio) are rejected. Tool turns (observation, function_call, tool,
  or a message with `tool_calls` / `function_call`) are rejected: gym does not train tool calls yet.
- `preference`: TRL style `{prompt, chosen, rejected}` (strings or message lists), TRL implicit prompt
  (`chosen`/`rejected` as full conversations sharing every turn but the last), or LLaMA-Factory style:
  alpaca fields + `chosen`/`rejected` strings, or `conversations` + `chosen`/`rejected` message objects.
- `kto`: alpaca fields + `output` + `label`, TRL style `{prompt, completion, label}`, or a conversation
  whose last turn is the completion, + `label`. Labels: booleans, 0/1, or "true"/"false" (csv).
- `prompt`: a prompt (`prompt` text or messages, alpaca instruction/input, or a conversation ending with
  a user turn), an optional `answer` (text or number) and an optional `metadata` object.
- `text`: one non-empty `text` string per record (LLaMA-Factory's pretraining data, e.g. c4_demo).

`columns` (from the dataset registry) renames source fields first: `{"output": "answer"}` reads the
canonical field `output` from the source column `answer`. `tags` then reads messages spelled
otherwise (LLaMA-Factory's tags: `{"role_tag": "speaker", "user_tag": "me"}`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gym.errors import ConfigError, DataError

FORMAT_KIND = {
    "alpaca": "sft",
    "sharegpt": "sft",
    "openai": "sft",
    "preference": "preference",
    "kto": "kto",
    "prompt": "prompt",
    "text": "text",
}
# Methods and the record kind each trains on; preference-tuning variants all read the same kind.
METHOD_KIND = {
    "sft": "sft",
    "dpo": "preference",
    "ipo": "preference",
    "cdpo": "preference",
    "hinge": "preference",
    "orpo": "preference",
    "simpo": "preference",
    "rm": "preference",  # a reward model scores chosen above rejected
    "kto": "kto",
    "ppo": "prompt",
    "grpo": "prompt",
    "gspo": "prompt",
    "pt": "text",
}
KIND_FORMATS = {
    "sft": "alpaca, sharegpt or openai",
    "preference": "preference",
    "kto": "kto",
    "prompt": "prompt",
    "text": "text",
}
# The columns a record of each kind needs, for errors that say what a method wants.
KIND_COLUMNS = {
    "sft": "instruction and output, conversations, or messages, ending with an assistant turn",
    "preference": "a prompt (prompt, instruction/input or conversations) with chosen and rejected answers",
    "kto": "a prompt (prompt, instruction/input or conversations), one completion (completion or output) "
    "and a boolean label (true: desirable)",
    "prompt": "a prompt (prompt, instruction/input or a conversation ending with a user turn), optionally "
    "an answer",
    "text": "a non-empty text column (map another column to it with `columns`)",
}
# Tokenized sft data given to online RL (the flows tokenize an sft dataset for it as prompts).
SFT_AS_PROMPTS = (
    ". Tokenize it as prompts (gym.data.tokenize's as_prompts=True: the turns before the last assistant "
    "turn, that turn as the answer), as the train flow does for ppo, grpo and gspo"
)
ROLES = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system message
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
}
TOOL_ROLES = ("observation", "function_call", "function", "tool", "tool_call", "ipython")
TOOL_KEYS = ("tool_calls", "function_call")  # OpenAI's keys for an assistant message calling tools
TOOL_HINT = "drop tool turns from the conversation, or use a dataset without tool calls"
MAPPING_HINT = "map other column names with `columns` in the dataset registry"
# Where the format of a file was guessed from its first record's fields and a record then failed.
GUESS_HINT = (
    "format {fmt} was guessed from the first record's fields; to read another, describe the file in an "
    "entry of registry/datasets.json (`format`) or of dataset_info.json (`formatting`) and pass its name"
)


@dataclass
class Where:
    """The place a record came from, and the column mapping in force, for error messages."""

    file: str
    record: int
    columns: dict[str, str] = field(default_factory=dict)
    guessed: str | None = None
    """The format, when it was guessed from the first record's fields (errors then say how to name it)."""

    def error(
        self, message: str, name: str | None = None, hint: str | None = None, *, shape: bool = False
    ) -> DataError:
        """`shape`: the record lacks a field or holds one of the wrong type, which a wrongly guessed
        format explains (only then do errors in a guessed format say how to name another)."""
        source = self.columns.get(name, name) if name else None
        if source and source != name:
            message = f"{message} (read as {name!r} through `columns`)"
        if self.guessed and (shape or hint == MAPPING_HINT):
            hint = "; ".join(filter(None, [hint, GUESS_HINT.format(fmt=self.guessed)]))
        return DataError(message, file=self.file, record=self.record, field=source, hint=hint)


# The fields gym's formats read: what a dataset entry's `columns` may map (canonical name -> source column).
CANONICAL_FIELDS = (
    *("instruction", "input", "output", "system", "history", "messages", "conversations"),
    *("prompt", "chosen", "rejected", "completion", "label", "answer", "metadata", "text"),
)


def check_columns(columns: Mapping[str, Any]) -> None:
    """ValueError for a `columns` key no format reads (a typo, or the mapping written source -> canonical):
    the record's own field would be renamed away, and the error then blamed a field the file has."""
    for key in columns:
        if key not in CANONICAL_FIELDS:
            close = difflib.get_close_matches(str(key), CANONICAL_FIELDS, n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            names = ", ".join(CANONICAL_FIELDS)
            raise ValueError(
                f"columns.{key}: no field gym reads is called {key!r}; {guess}columns maps gym's name to the "
                f'file\'s column ({{"instruction": "question"}}), gym\'s names being {names}'
            )


def apply_columns(record: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """Rename source columns to canonical names: `columns` maps canonical -> source; an empty source
    leaves the canonical field unread (LLaMA-Factory reads `system` and `history` only when named), and
    so does a source the record lacks: the record's own field of the canonical name is not read in its
    place (a mistyped `"prompt": "quest"` trained on the file's `instruction`), so a required field is
    said missing, naming the mapping."""
    if not columns:
        return record
    out = dict(record)
    renamed = {name: record[source] for name, source in columns.items() if source and source in record}
    for canonical, source in columns.items():
        if source and source in record:
            out.pop(source, None)
        elif canonical not in columns.values() and canonical != source:
            out.pop(canonical, None)
    return out | renamed  # after every source left: a swap (a <- b, b <- a) keeps both


# LLaMA-Factory's tags (how a conversation spells message keys and roles) and their defaults there.
TAG_DEFAULTS = {
    "role_tag": "from",
    "content_tag": "value",
    "user_tag": "human",
    "assistant_tag": "gpt",
    "system_tag": "system",
    "observation_tag": "observation",
    "function_tag": "function_call",
}
_TAG_ROLES = {
    "user_tag": "user",
    "assistant_tag": "assistant",
    "system_tag": "system",
    "observation_tag": "observation",
    "function_tag": "function_call",
}
_MESSAGE_FIELDS = ("conversations", "messages", "prompt", "chosen", "rejected")


TAGGED_ROLES = "_tagged_roles"  # on a message whose role its entry's tags don't spell (apply_tags)


def apply_tags(record: dict[str, Any], tags: Mapping[Any, str]) -> dict[str, Any]:
    """Messages spelled with `tags` (LLaMA-Factory's role_tag, content_tag, user_tag, ...; unset ones
    at LLaMA-Factory's defaults) as gym's `{"role", "content"}` messages. A message without the role
    key is left as it is, for `parse_message` to report."""
    if not tags:
        return record
    spelled = {**TAG_DEFAULTS, **tags}
    role_key, content_key = spelled["role_tag"], spelled["content_tag"]
    roles = {spelled[tag]: role for tag, role in _TAG_ROLES.items()}

    def message(msg: Any) -> Any:
        if not isinstance(msg, dict) or role_key not in msg:
            return msg
        role = msg[role_key]
        if not isinstance(role, str) or role in roles or role in ROLES:
            return {
                "role": roles.get(role, role) if isinstance(role, str) else role,
                "content": msg.get(content_key),
            }
        # a role the entry's tags don't spell: parse_message names the ones they do
        return {"role": role, "content": msg.get(content_key), TAGGED_ROLES: sorted(roles)}

    out = dict(record)
    for name in _MESSAGE_FIELDS:
        value = record.get(name)
        if isinstance(value, list):
            out[name] = [message(m) for m in value]
        elif isinstance(value, dict):
            out[name] = message(value)
    return out


def _text(rec: dict[str, Any], name: str, w: Where, need: str, *, required: bool = True) -> str:
    value = rec.get(name)
    if value is None:
        if required:
            raise w.error(f"missing; {need}", name, MAPPING_HINT)
        return ""
    if not isinstance(value, str):
        raise w.error(f"must be a string, got {type(value).__name__} {value!r:.60}", name, need, shape=True)
    if required and not value.strip():
        raise w.error("is empty", name, "remove the record or fill in the text")
    return value


def _history(rec: dict[str, Any], w: Where) -> list[dict[str, str]]:
    value = rec.get("history")
    if value is None:
        return []
    msgs: list[dict[str, str]] = []
    ok = isinstance(value, list)
    for pair in value if ok else []:
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            ok = False
            break
        msgs += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    if not ok:
        raise w.error("must be a list of [query, answer] string pairs", "history", shape=True)
    return msgs


def alpaca_prompt(rec: dict[str, Any], w: Where, need: str) -> list[dict[str, str]]:
    """system + history + the user turn: instruction and input joined by a newline, or whichever of the
    two is non-empty (LLaMA-Factory's); instruction is required only when input is empty."""
    extra = _text(rec, "input", w, need, required=False)
    instruction = _text(rec, "instruction", w, need, required=not extra.strip())
    system = _text(rec, "system", w, need, required=False)
    msgs = [{"role": "system", "content": system}] if system.strip() else []
    msgs += _history(rec, w)
    msgs.append({"role": "user", "content": "\n".join(t for t in (instruction, extra) if t.strip())})
    return msgs


def parse_message(msg: Any, name: str, i: int, w: Where) -> dict[str, str]:
    """One `{"from", "value"}` or `{"role", "content"}` message, roles mapped to system/user/assistant."""
    if not isinstance(msg, dict):
        raise w.error(f"message {i} must be an object with role/content or from/value", name, shape=True)
    role = msg.get("role", msg.get("from"))
    content = msg.get("content", msg.get("value"))
    if not isinstance(role, str):
        raise w.error(f"message {i} needs its role as a string, got {role!r:.60}", name, shape=True)
    if role in TOOL_ROLES:
        raise w.error(f"message {i} has role {role!r}; tool turns are not supported", name, TOOL_HINT)
    calls = next((key for key in TOOL_KEYS if msg.get(key)), None)
    if calls is not None:
        raise w.error(f"message {i} ({role}) has {calls!r}; tool turns are not supported", name, TOOL_HINT)
    if role not in ROLES:
        expected = msg.get(TAGGED_ROLES) or sorted(ROLES)
        spelled = " (as the entry's tags spell them)" if TAGGED_ROLES in msg else ""
        raise w.error(f"message {i} has unknown role {role!r}; expected one of {expected}{spelled}", name)
    weight = msg.get("weight")
    if weight is not None and weight != 1:  # OpenAI's fine-tuning format: 0 = not trained on
        raise w.error(
            f"message {i} ({role}) has weight {weight!r}; gym trains every assistant turn (or with "
            "--data.mask_history only the last) and has no per-message weights",
            name,
            "drop the weight, and the turns you do not want trained (or their records)",
        )
    if isinstance(content, list):
        content = _text_parts(content, f"message {i} ({role})", name, w)
    if not isinstance(content, str) or not content.strip():
        raise w.error(f"message {i} ({role}) needs non-empty text content, got {content!r:.60}", name)
    return {"role": ROLES[role], "content": content}


def _text_parts(parts: list[Any], what: str, name: str, w: Where) -> str:
    """OpenAI content given as parts (`[{"type": "text", "text": ...}, ...]`): the text parts joined by
    newlines; any other part (an image, audio, a file) is refused."""
    texts = []
    for j, part in enumerate(parts, 1):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(kind, str) and kind != "text":
            raise w.error(
                f"{what}: content part {j} is of type {kind!r}; gym trains on text only",
                name,
                "drop the non-text parts (or the record), or use a text-only dataset",
            )
        else:
            raise w.error(
                f'{what}: content part {j} must be an object like {{"type": "text", "text": ...}}, '
                f"got {part!r:.60}",
                name,
            )
    return "\n".join(texts)


def parse_messages(value: Any, name: str, w: Where) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise w.error(f"must be a non-empty list of messages, got {value!r:.60}", name, shape=True)
    return [parse_message(m, name, i, w) for i, m in enumerate(value, 1)]


def check_turns(msgs: list[dict[str, str]], name: str, w: Where, *, ends_with: str) -> None:
    """Optional system first, then user/assistant alternating from user, ending with `ends_with`."""
    turns = msgs[1:] if msgs and msgs[0]["role"] == "system" else msgs
    for i, m in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if m["role"] != expected:
            raise w.error(
                f"turns must alternate user/assistant (after an optional first system message); "
                f"turn {i + 1} is {m['role']}, expected {expected}",
                name,
            )
    if not turns or turns[-1]["role"] != ends_with:
        article = "an" if ends_with[0] in "aeiou" else "a"
        raise w.error(f"the conversation must end with {article} {ends_with} turn", name)


def _chat_field(rec: dict[str, Any]) -> str | None:
    return next((k for k in ("messages", "conversations") if rec.get(k) is not None), None)


def _with_system(rec: dict[str, Any], msgs: list[dict[str, str]], w: Where) -> list[dict[str, str]]:
    system = _text(rec, "system", w, "", required=False)
    if system.strip() and not (msgs and msgs[0]["role"] == "system"):
        return [{"role": "system", "content": system}, *msgs]
    return msgs


def _conversation(rec: dict[str, Any], w: Where, need: str) -> tuple[str, list[dict[str, str]]]:
    name = _chat_field(rec)
    if name is None:
        raise w.error(f"no 'conversations' or 'messages' list; {need}", "conversations", MAPPING_HINT)
    return name, _with_system(rec, parse_messages(rec[name], name, w), w)


def to_sft(rec: dict[str, Any], fmt: str, w: Where) -> dict[str, Any]:
    if fmt == "alpaca":
        need = "alpaca records need instruction and output"
        answer = {"role": "assistant", "content": _text(rec, "output", w, need)}
        msgs = [*alpaca_prompt(rec, w, need), answer]
        name = "output"
    else:
        name, msgs = _conversation(rec, w, f"{fmt} records need a list of messages")
    check_turns(msgs, name, w, ends_with="assistant")
    return {"messages": msgs}


def completion(value: Any, name: str, w: Where, need: str) -> str:
    """A completion given as text, one assistant message, or a list holding one assistant message."""
    if value is None:
        raise w.error(f"missing; {need}", name, MAPPING_HINT)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    elif isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        raise w.error(
            f"must be one assistant message, got {len(value)} messages",
            name,
            "the turns before the answer belong in the prompt"
            + (
                "; or give chosen and rejected as whole conversations sharing every turn but the last, with "
                "no prompt"
                if name in ("chosen", "rejected")
                else ""
            ),
        )
    if isinstance(value, dict):
        msg = parse_message(value, name, 1, w)
        if msg["role"] != "assistant":
            raise w.error(f"must be an assistant message, got role {msg['role']!r}", name)
        return msg["content"]
    return _text({name: value}, name, w, need)


def prompt_of(rec: dict[str, Any], w: Where, need: str) -> list[dict[str, str]]:
    """The prompt of a preference/kto record: alpaca fields, a conversation, or a TRL `prompt`."""
    if rec.get("instruction") is not None:
        return alpaca_prompt(rec, w, need)
    if _chat_field(rec) is not None:
        name, msgs = _conversation(rec, w, need)
    elif isinstance(rec.get("prompt"), str):
        name, msgs = "prompt", [{"role": "user", "content": _text(rec, "prompt", w, need)}]
    elif rec.get("prompt") is not None:
        name, msgs = "prompt", _with_system(rec, parse_messages(rec["prompt"], "prompt", w), w)
    else:
        raise w.error(f"missing; {need}", "prompt", MAPPING_HINT)
    check_turns(msgs, name, w, ends_with="user")
    return msgs


def _implicit_prompt(rec: dict[str, Any], w: Where, need: str) -> dict[str, Any]:
    """TRL implicit prompt: chosen and rejected are whole conversations differing in the last turn."""
    chosen = parse_messages(rec["chosen"], "chosen", w)
    rejected = parse_messages(rec["rejected"], "rejected", w)
    check_turns(chosen, "chosen", w, ends_with="assistant")
    check_turns(rejected, "rejected", w, ends_with="assistant")
    if chosen[:-1] != rejected[:-1]:
        raise w.error(
            "chosen and rejected conversations must share every turn but the last", "rejected", need
        )
    return {"prompt": chosen[:-1], "chosen": chosen[-1]["content"], "rejected": rejected[-1]["content"]}


def to_preference(rec: dict[str, Any], w: Where) -> dict[str, Any]:
    need = (
        "preference records need chosen and rejected, plus a prompt (prompt, instruction/input or "
        "conversations) unless chosen and rejected are whole conversations"
    )
    has_prompt = any(rec.get(k) is not None for k in ("instruction", "prompt", "messages", "conversations"))
    chosen, rejected = rec.get("chosen"), rec.get("rejected")
    if not has_prompt and isinstance(chosen, list) and isinstance(rejected, list) and len(chosen) > 1:
        return _implicit_prompt(rec, w, need)
    prompt = prompt_of(rec, w, need)
    return {
        "prompt": prompt,
        "chosen": completion(rec.get("chosen"), "chosen", w, need),
        "rejected": completion(rec.get("rejected"), "rejected", w, need),
    }


def parse_label(value: Any, w: Where) -> bool:
    """A real boolean; also 0/1 and "true"/"false"/"0"/"1" (csv has no booleans)."""
    if is_label(value):
        return value.strip().lower() in ("true", "1") if isinstance(value, str) else bool(value)
    if value is None:
        raise w.error("missing; kto records need a boolean label", "label", MAPPING_HINT)
    raise w.error(
        f"must be a boolean, got {type(value).__name__} {value!r:.60}",
        "label",
        "use true/false (or 1/0); true marks a desirable completion",
        shape=True,
    )


def to_kto(rec: dict[str, Any], w: Where) -> dict[str, Any]:
    need = "kto records need a prompt (instruction/input, prompt or conversations), a completion and a label"
    if rec.get("instruction") is None and rec.get("prompt") is None and _chat_field(rec) is not None:
        name, msgs = _conversation(rec, w, need)
        check_turns(msgs, name, w, ends_with="assistant")
        prompt, text = msgs[:-1], msgs[-1]["content"]
    else:
        prompt = prompt_of(rec, w, need)
        key = "output" if rec.get("instruction") is not None else "completion"
        text = completion(rec.get(key), key, w, need)
    return {"prompt": prompt, "completion": text, "label": parse_label(rec.get("label"), w)}


def to_prompt(rec: dict[str, Any], w: Where) -> dict[str, Any]:
    need = (
        "prompt records need a prompt (prompt, instruction/input or a conversation ending with a user turn)"
    )
    msgs = prompt_of(rec, w, need)
    answer = rec.get("answer")
    if isinstance(answer, bool) or not (answer is None or isinstance(answer, str | int | float)):
        raise w.error(
            f"must be text or a number, got {type(answer).__name__} {answer!r:.60}", "answer", shape=True
        )
    metadata = rec.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise w.error(
            f"must be an object of extra fields, got {type(metadata).__name__}", "metadata", shape=True
        )
    return {
        "prompt": msgs,
        "answer": None if answer is None else str(answer),
        "metadata": json.dumps(metadata or {}, ensure_ascii=False, sort_keys=True),
    }


def to_text(rec: dict[str, Any], w: Where) -> dict[str, Any]:
    return {"text": _text(rec, "text", w, "text records need a non-empty `text` string")}


MEDIA_COLUMNS = ("images", "videos", "audios")  # LLaMA-Factory's multimodal columns


def normalize(record: dict[str, Any], fmt: str, where: Where) -> dict[str, Any]:
    """One raw record (columns already mapped) as a canonical record of kind `FORMAT_KIND[fmt]`."""
    if fmt not in FORMAT_KIND:
        raise ConfigError(f"unknown dataset format {fmt!r}; expected one of {', '.join(FORMAT_KIND)}")
    kind = FORMAT_KIND[fmt]
    for media in MEDIA_COLUMNS:  # dropped, a record's <image> placeholders would be trained on as text
        if record.get(media) not in (None, "", [], {}):
            raise where.error(
                f"holds {media}: gym trains text-only models", media, "remove the media column, or the record"
            )
    if kind == "sft":
        return to_sft(record, fmt, where)
    if kind == "preference":
        return to_preference(record, where)
    if kind == "prompt":
        return to_prompt(record, where)
    if kind == "text":
        return to_text(record, where)
    return to_kto(record, where)


def is_label(value: Any) -> bool:
    """Whether `value` reads as a KTO label (what `parse_label` takes)."""
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return True
    return isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0")


def detect_format(record: Mapping[str, Any] | Iterable[str]) -> str | None:
    """Guess the format from a record (or just its field names); None when nothing fits.

    A `label` makes KTO data unless it sits beside alpaca, sharegpt or messages fields with a value that
    is no KTO label (e.g. a category): that is an extra column, ignored as LLaMA-Factory ignores extra
    columns. Given names alone, a `label` is taken for a KTO label.
    """
    cols = set(record)
    if {"chosen", "rejected"} & cols:  # one without the other: a pair missing half (said as such)
        return "preference"
    chat = bool({"messages", "conversations"} & cols) or {"instruction", "output"} <= cols
    if "label" in cols and (
        not chat or "completion" in cols or not isinstance(record, Mapping) or is_label(record["label"])
    ):
        return "kto"
    if "messages" in cols:
        return "openai"
    if "conversations" in cols:
        return "sharegpt"
    if {"instruction", "output"} <= cols:
        return "alpaca"
    if "prompt" in cols or {"instruction", "answer"} <= cols:
        return "prompt"
    if "text" in cols:
        return "text"
    return None


def methods_for(kind: str) -> list[str]:
    """The methods that train on records of `kind`: online RL and TF-GRPO read sft data as prompts too."""
    readers = [m for m, k in METHOD_KIND.items() if k == kind]
    if kind == "sft":
        readers += [m for m, k in METHOD_KIND.items() if k == "prompt"]
    return readers + (["tf_grpo"] if kind in ("sft", "prompt") else [])


def require_kind(dataset_kind: str, method: str, dataset: str | None = None) -> None:
    """Raise ConfigError unless `method` trains on datasets of kind `dataset_kind`."""
    if method not in METHOD_KIND:
        raise ConfigError(f"unknown training method {method!r}; expected one of {', '.join(METHOD_KIND)}")
    need = METHOD_KIND[method]
    if dataset_kind != need:
        name = f"dataset {dataset!r}" if dataset else "the dataset"
        others = ", ".join(methods_for(dataset_kind))
        hint = SFT_AS_PROMPTS if (dataset_kind, need) == ("sft", "prompt") else ""
        raise ConfigError(
            f"method {method!r} needs a {need} dataset (format {KIND_FORMATS[need]}: records with "
            f"{KIND_COLUMNS[need]}), but {name} is {dataset_kind} data; pick a {need} dataset, "
            f"or a method that trains on {dataset_kind} data ({others}){hint}"
        )
