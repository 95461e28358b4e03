"""How a learned experience library reaches a prompt: one system-prompt block, the same in training,
evaluation and serving.

A TF-GRPO model directory ships its library as `experiences.json` (`{"items": [{"id", "text"}, ...]}`
plus its version and content hash) next to its weights; anything that runs the model calls
`inject(messages, load_shipped(model_dir))`. Prompts that are plain text, not messages (lm-eval's
multiple-choice prompt style), take the block with `inject_text`, where lm-eval puts a system
instruction (`--system_instruction`) when no chat template applies: before everything else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gym.errors import DataError

EXPERIENCE_FILE = "experiences.json"
HEADER = "Experiences learned from earlier attempts (apply those that fit):"
TEXT_DELIMITER = "\n\n"  # between the block and a plain-text prompt (lm-eval's few-shot delimiter)


class ShippedLibrary(BaseModel):
    """The experiences a model ships, with what identifies the library they came from."""

    model_config = ConfigDict(frozen=True)

    texts: list[str]
    hash: str | None = None
    version: int | None = None

    def record(self) -> dict[str, Any]:
        """What results note about the injected library: its content hash, version and size."""
        return {"hash": self.hash, "version": self.version, "size": len(self.texts)}

    def note(self) -> str:
        """One line for a report: the injected library, by size, version and hash."""
        return (
            f"the model's TF-GRPO experience library ({len(self.texts)} experiences, version "
            f"{self.version}, hash {(self.hash or '?')[:12]}) is injected into every prompt"
        )


def experience_block(texts: list[str]) -> str:
    """`[G0]. text` lines under a short header (the papers' display form)."""
    lines = [f"[G{i}]. {t}" for i, t in enumerate(texts)]
    return "\n".join([HEADER, *lines])


def inject(messages: list[dict[str, str]], texts: list[str] | None) -> list[dict[str, str]]:
    """Messages with the experience block appended to the system message (one is added if absent).

    No experiences: the messages are returned unchanged. The input list is never modified.
    """
    if not texts:
        return list(messages)
    block = experience_block(texts)
    if messages and messages[0].get("role") == "system":
        system = {**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}
        return [system, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def inject_text(prompt: str, texts: list[str] | None) -> str:
    """A plain-text prompt with the experience block first, a blank line between (unchanged without
    experiences): the place lm-eval gives a system instruction in a prompt without chat template."""
    if not texts:
        return prompt
    return f"{experience_block(texts)}{TEXT_DELIMITER}{prompt}"


def shipped_library(model_dir: str | Path) -> ShippedLibrary | None:
    """The library a model directory ships (texts in library order); None when it ships none."""
    path = Path(model_dir) / EXPERIENCE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        texts = [str(item["text"]) for item in data.get("items", [])]
        return ShippedLibrary(texts=texts, hash=data.get("hash"), version=data.get("version"))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DataError(
            f"unreadable experience library ({type(exc).__name__}: {exc})",
            file=str(path),
            hint='expected {"items": [{"id": ..., "text": ...}, ...]} as a TF-GRPO run ships it',
        ) from None


def load_shipped(model_dir: str | Path) -> list[str] | None:
    """The experience texts a model directory ships, in library order; None when it ships none."""
    shipped = shipped_library(model_dir)
    return shipped.texts if shipped is not None else None
