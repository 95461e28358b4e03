"""How a learned experience library reaches a prompt: one system-prompt block, the same in training,
evaluation and serving.

A TF-GRPO model directory ships its library as `experiences.json` (`{"items": [{"id", "text"}, ...]}`
plus metadata) next to its weights; anything that runs the model calls
`inject(messages, load_shipped(model_dir))`.
"""

from __future__ import annotations

import json
from pathlib import Path

EXPERIENCE_FILE = "experiences.json"
HEADER = "Experiences learned from earlier attempts (apply those that fit):"


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


def load_shipped(model_dir: str | Path) -> list[str] | None:
    """The experience texts a model directory ships, in library order; None when it ships none."""
    path = Path(model_dir) / EXPERIENCE_FILE
    if not path.is_file():
        return None
    items = json.loads(path.read_text(encoding="utf-8")).get("items", [])
    return [str(item["text"]) for item in items]
