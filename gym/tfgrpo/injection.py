"""How a learned experience library reaches a prompt: one system-prompt block, the same in training,
evaluation and serving.

A TF-GRPO model directory ships its library as `experiences.json` (`{"items": [{"id", "text"}, ...]}`
plus its version and content hash) next to its weights; anything that runs the model calls
`inject(messages, shipped_library(model_dir).texts_for(query_of(messages)))`: with the run's
`retrieval_top_k` recorded in the file, only the k experiences most similar to the question are
injected, by the same rule as in training (gym.tfgrpo.retrieval.select); without it, all of them.
`load_shipped` gives the whole library (what a Space or a single system instruction can carry).
Prompts that are plain text, not messages (lm-eval's multiple-choice prompt style), take the block
with `inject_text`, where lm-eval puts a system instruction (`--system_instruction`) when no chat
template applies: before everything else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gym.errors import DataError
from gym.tfgrpo.retrieval import select

EXPERIENCE_FILE = "experiences.json"
HEADER = "Experiences learned from earlier attempts (apply those that fit):"
TEXT_DELIMITER = "\n\n"  # between the block and a plain-text prompt (lm-eval's few-shot delimiter)


class ShippedLibrary(BaseModel):
    """The experiences a model ships, with what identifies the library they came from."""

    model_config = ConfigDict(frozen=True)

    texts: list[str]
    hash: str | None = None
    version: int | None = None
    retrieval_top_k: int | None = None  # the run's setting: None injects the whole library

    @property
    def retrieves(self) -> bool:
        """Prompts get a per-question selection, not the whole library (more experiences than k)."""
        return self.retrieval_top_k is not None and len(self.texts) > self.retrieval_top_k

    def texts_for(self, query: str) -> list[str]:
        """The experiences injected for a question (`query`: its text, the last user turn, as in
        training): all of them, or the `retrieval_top_k` most similar, in library order."""
        return select(query, self.texts, self.retrieval_top_k, cache_query=False)

    def record(self) -> dict[str, Any]:
        """What results note about the injected library: its content hash, version and size (and the
        retrieval's k when the run set one)."""
        record: dict[str, Any] = {"hash": self.hash, "version": self.version, "size": len(self.texts)}
        if self.retrieval_top_k is not None:
            record["retrieval_top_k"] = self.retrieval_top_k
        return record

    def note(self) -> str:
        """One line for a report: the injected library, by size, version and hash."""
        where = (
            f"its {self.retrieval_top_k} experiences most similar to each question are injected into "
            "that question's prompt"
            if self.retrieves
            else "is injected into every prompt"
        )
        return (
            f"the model's TF-GRPO experience library ({len(self.texts)} experiences, version "
            f"{self.version}, hash {(self.hash or '?')[:12]}) {where}"
        )


def query_of(messages: list[dict[str, str]]) -> str:
    """The question a conversation asks, as training retrieves for it: its last user turn ("" if none)."""
    return next((str(m["content"]) for m in reversed(messages) if m.get("role") == "user"), "")


RUN_KEY = "tf_grpo_run"  # in an experience_lib_path's library: the run that wrote it (RunOrigin)


def shipped_json(
    library_json: str, retrieval_top_k: int | None, run: dict[str, str | None] | None = None
) -> str:
    """A library file's JSON as a model ships it: with the run's `retrieval_top_k` when set, so that
    whatever runs the model injects what training injected, and (`run`: its config hash and the hash
    of the library it started from) the run that wrote it, so that re-running the command that wrote
    it resumes that run instead of learning on from its output. Neither is part of the library's hash."""
    if retrieval_top_k is None and run is None:
        return library_json
    data = json.loads(library_json)
    if retrieval_top_k is not None:
        data["retrieval_top_k"] = retrieval_top_k
    if run is not None:
        data[RUN_KEY] = run
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def written_by(path: str | Path) -> dict[str, str | None] | None:
    """The run a library file records as its writer (shipped_json's `run`), None when none is recorded
    or the file can't be read."""
    try:
        run = json.loads(Path(path).read_text(encoding="utf-8")).get(RUN_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(run, dict) or not isinstance(run.get("config_hash"), str):
        return None
    start = run.get("start")
    return {"config_hash": run["config_hash"], "start": start if isinstance(start, str) else None}


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
        k = data.get("retrieval_top_k")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"retrieval_top_k must be a positive integer or null, got {k!r}")
        return ShippedLibrary(
            texts=texts, hash=data.get("hash"), version=data.get("version"), retrieval_top_k=k
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DataError(
            f"unreadable experience library ({type(exc).__name__}: {exc})",
            file=str(path),
            hint='expected {"items": [{"id": ..., "text": ...}, ...]} as a TF-GRPO run ships it',
        ) from None


def load_shipped(model_dir: str | Path) -> list[str] | None:
    """The experience texts a model directory ships, in library order; None when it ships none.

    The whole library, whatever `retrieval_top_k` the run set: for what has no question to retrieve
    for (a Space's fixed system prompt). Prompts per question use `shipped_library(...).texts_for`."""
    shipped = shipped_library(model_dir)
    return shipped.texts if shipped is not None else None
