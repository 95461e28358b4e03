"""The papers' ExperienceManager: the experience library as a mutable, versioned object.

    from gym.train.grpo.experience_manager import ExperienceManager
    em = ExperienceManager(library_path="./experience_lib", max_size=100)
    i = em.add("When a problem mentions remainders, reduce modulo the divisor first.")
    em.modify(i, "When remainders appear, reduce modulo the divisor before anything else.")
    j = em.add("When dividing, check the remainder.")
    em.merge([i, j], "When remainders or division appear, reduce modulo the divisor first.")
    em.format_for_prompt()                    # the [G0]. ... block training and serving inject
    em.search("what is 17 mod 5?", k=3)       # embedding similarity (all-MiniLM-L6-v2, `embed` extra)
    em.save("./experience_lib/final.json")

A thin face over gym.tfgrpo: every change goes through the same validated `apply` as training
(stable ids never reused, caps on items and words, a new version per change), and a rejected
change raises ConfigError with its reason. Ids may be given as stable ids (`E3`) or as the
prompt's aliases (`G0`, `[G0]`). `save()` with no path writes `<library_path>/experiences.json`
and keeps every version in `<library_path>/versions/`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gym import workspace
from gym.errors import ConfigError
from gym.tfgrpo.injection import EXPERIENCE_FILE, experience_block, inject, shipped_json
from gym.tfgrpo.library import Library, diff, word_count
from gym.tfgrpo.ops import Add, ApplyResult, Delete, Merge, NoOp, Op, Update, apply
from gym.tfgrpo.parse import parse_ops, read_op, resolve_id


class ExperienceManager:
    """Add, modify, delete and merge experiences; persist them as versioned JSON; format them for prompts."""

    def __init__(
        self,
        library_path: str | Path | None = None,
        max_size: int | None = None,
        max_words: int | None = None,
    ) -> None:
        """`max_size` / `max_words` default to 100 and 32 for a new library; a saved one keeps its own
        unless they are given (they were ignored then), and may not be below what it already holds."""
        for argument, value in (("max_size", max_size), ("max_words", max_words)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(
                    f"ExperienceManager: {argument} must be a whole number of at least 1 (got {value!r}); "
                    "leave it out for the default"
                )
        self.library_path = Path(library_path) if library_path is not None else None
        existing = self.library_path / EXPERIENCE_FILE if self.library_path else None
        if existing is not None and existing.is_file():
            self.library = _with_caps(Library.load(existing), max_size, max_words, existing)
        else:
            self.library = Library(
                max_items=100 if max_size is None else max_size,
                max_words=32 if max_words is None else max_words,
            )
        self._retriever: Any = None

    # -- reading ---------------------------------------------------------------------------------------
    @property
    def experiences(self) -> list[dict[str, str]]:
        """Every experience as {"id": its stable id, "text": its text}, in library order."""
        return [{"id": item.id, "text": item.text} for item in self.library.items]

    @property
    def version(self) -> int:
        """The library's version: the number of changes applied to it so far."""
        return self.library.version

    def __len__(self) -> int:
        return len(self.library.items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.library.texts)

    def get(self, item_id: str) -> str | None:
        """The text of experience `item_id` (a stable id `E3` or an alias `G0`), else None."""
        item = self.library.get(self._id(item_id))
        return item.text if item else None

    # -- changing (each a validated operation; a rejection raises) ------------------------------------
    def add(self, text: str) -> str:
        """Add an experience; returns its new stable id."""
        before = set(self.library.ids)
        self._apply([Add(text=_text(text, "add"))])
        return next(i for i in self.library.ids if i not in before)

    def modify(self, item_id: str, text: str) -> None:
        """Replace the text of experience `item_id`."""
        self._apply([Update(id=self._id(item_id, "modify"), text=_text(text, "modify"))])

    def delete(self, item_id: str) -> None:
        """Remove experience `item_id` (its id is never reused)."""
        self._apply([Delete(id=self._id(item_id, "delete"))])

    def merge(self, item_ids: Sequence[str], text: str) -> str:
        """Replace the experiences `item_ids` (a list of ids) by one with `text`; returns its new id."""
        if isinstance(item_ids, str | bytes) or not isinstance(item_ids, Sequence | set | frozenset):
            raise ConfigError(
                f"merge: item_ids must be a list of experience ids, such as ['E1', 'E2'] (got {item_ids!r})"
            )
        before = set(self.library.ids)
        ids = tuple(self._id(i, "merge") for i in item_ids)
        self._apply([Merge(ids=ids, text=_text(text, "merge"))])
        return next(i for i in self.library.ids if i not in before)

    def apply_operations(self, operations: Sequence[Op | dict[str, Any]] | str) -> ApplyResult:
        """Apply a batch (Op objects, dicts in the LLM's JSON shape, or its raw text); invalid or
        conflicting operations are reported in the result, not applied, and never raise: `rejected`
        (operations that don't apply or conflict) and `unreadable` (what is no operation at all, as
        text or dicts: an unknown id or kind, a missing field)."""
        unreadable: list[str] = []
        if isinstance(operations, str):
            ops, unreadable = parse_ops(operations, self.library.aliases())
        else:
            ops = []
            for n, item in enumerate(operations, start=1):
                if isinstance(item, (Add, Update, Delete, Merge, NoOp)):
                    ops.append(item)
                    continue
                op, problem = read_op(item, self.library.aliases())
                if problem:
                    unreadable.append(f"operation {n}: {problem}")
                elif op is not None:
                    ops.append(op)
        result = apply(self.library, ops)
        self.library = result.library
        return result.model_copy(update={"unreadable": tuple(unreadable)}) if unreadable else result

    def _apply(self, ops: list[Op]) -> None:
        result = apply(self.library, ops)
        if result.rejected:
            raise ConfigError(f"experience change rejected: {result.rejected[0].reason}")
        self.library = result.library

    def _id(self, given: str, method: str = "get") -> str:
        if isinstance(given, bool) or not isinstance(given, str | int):
            raise ConfigError(
                f"{method}: an experience id is a str, such as 'E3' or the prompt's 'G0' (got {given!r})"
            )
        if given in self.library.ids:
            return given
        resolved = resolve_id(given, self.library.aliases())
        return resolved or str(given)  # an unknown id is rejected by `apply`, with its reason

    # -- prompts ---------------------------------------------------------------------------------------
    def format_for_prompt(self, texts: list[str] | None = None) -> str:
        """The experience block, exactly as training and serving put it in the system message."""
        chosen = self.library.texts if texts is None else texts
        return experience_block(chosen) if chosen else ""

    format_context = format_for_prompt

    def inject(
        self, messages: list[dict[str, str]], query: str | None = None, k: int | None = None
    ) -> list[dict[str, str]]:
        """`messages` with the experiences in the system message (the top-k most similar to `query`)."""
        texts = self.library.texts if query is None or k is None else [t for t, _ in self.search(query, k)]
        return inject(messages, texts)

    def search(self, query: str, k: int = 5) -> list[tuple[str, float]]:
        """The k experiences most similar to `query` with their cosine similarity, best first."""
        if self._retriever is None:
            from gym.tfgrpo.retrieval import Retriever

            self._retriever = Retriever()
        texts = self.library.texts
        if not texts:
            return []
        scores = self._retriever.scores(query, texts)
        order = sorted(range(len(texts)), key=lambda i: (-scores[i], i))[:k]
        return [(texts[i], scores[i]) for i in order]

    # -- persistence -----------------------------------------------------------------------------------
    def save(self, path: str | Path | None = None) -> Path:
        """Write the library: to `path` (a .json file, or a folder for experiences.json), else to
        `<library_path>/experiences.json`, keeping this version under `<library_path>/versions/`."""
        if path is not None:
            target = Path(path)
            return self.library.save(target if target.suffix == ".json" else target / EXPERIENCE_FILE)
        if self.library_path is None:
            raise ConfigError("ExperienceManager has no library_path: pass save(path)")
        version = (
            self.library_path / "versions" / f"v{self.library.version:04d}-{self.library.content_hash()}.json"
        )
        self.library.save(version)
        return self.library.save(self.library_path / EXPERIENCE_FILE)

    @classmethod
    def load(cls, path: str | Path) -> ExperienceManager:
        """A manager over a saved library file (or a folder holding experiences.json)."""
        p = Path(path)
        file = p if p.suffix == ".json" else p / EXPERIENCE_FILE
        manager = cls(library_path=file.parent)
        manager.library = Library.load(file)
        return manager

    def versions(self) -> list[Path]:
        """The versions saved under library_path, oldest first."""
        if self.library_path is None:
            return []
        return sorted((self.library_path / "versions").glob("v*.json"))

    def diff_markdown(self, other: ExperienceManager | Library) -> str:
        """What changed from `other` to this library, as markdown."""
        old = other.library if isinstance(other, ExperienceManager) else other
        return diff(old, self.library).markdown()

    def export(self, directory: str | Path, retrieval_top_k: int | None = None) -> Path:
        """Write experiences.json into a model directory (how a model ships its library); with
        `retrieval_top_k`, evaluation and serving inject only the k most relevant per question."""
        target = Path(directory) / EXPERIENCE_FILE
        workspace.atomic_write_text(target, shipped_json(self.library.to_json(), retrieval_top_k))
        return target


def _text(text: Any, method: str) -> str:
    """`text` as an experience's text, refused naming `method` where it is no str."""
    if not isinstance(text, str):
        raise ConfigError(f"{method}: text must be a str, the experience in words (got {text!r})")
    return text


def _with_caps(library: Library, max_size: int | None, max_words: int | None, file: Path) -> Library:
    """A saved library under the caps given (None: its own), refused where it already holds more."""
    caps = {
        "max_items": library.max_items if max_size is None else max_size,
        "max_words": library.max_words if max_words is None else max_words,
    }
    longest = max((word_count(item.text) for item in library.items), default=0)
    if len(library.items) > caps["max_items"] or longest > caps["max_words"]:
        raise ConfigError(
            f"{file} holds {len(library.items)} experiences of up to {longest} words: max_size="
            f"{caps['max_items']}, max_words={caps['max_words']} are below that; give larger caps, or "
            "start a new library (another library_path)"
        )
    return library.model_copy(update=caps)
