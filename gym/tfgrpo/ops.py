"""Operations on the experience library, validated and applied by one pure function.

    result = apply(library, [Add(text=...), Update(id="E3", text=...), Merge(ids=("E1", "E4"), text=...)])
    result.library, result.applied, result.rejected      # the input library is never modified

Operations are taken as written, never re-interpreted: an update of an unknown id is rejected, not
turned into an add. Inside one batch the precedence is delete > merge > update: an operation that
touches an id a stronger one claimed is rejected, as are two updates of one id (a conflict the
consolidation stage should have resolved) and two merges sharing an id. Adds that repeat a text
already present, texts over the word cap and adds beyond the item cap are rejected too, each with
its reason. A batch that changes nothing returns the same library (same version and hash).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gym.tfgrpo.library import Experience, Library, normalized, word_count


class _Op(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Add(_Op):
    op: Literal["add"] = "add"
    text: str


class Update(_Op):
    op: Literal["update"] = "update"
    id: str
    text: str


class Delete(_Op):
    op: Literal["delete"] = "delete"
    id: str


class Merge(_Op):
    op: Literal["merge"] = "merge"
    ids: tuple[str, ...]
    text: str


class NoOp(_Op):
    op: Literal["none"] = "none"


Op = Annotated[Add | Update | Delete | Merge | NoOp, Field(discriminator="op")]


class Rejected(BaseModel):
    model_config = ConfigDict(frozen=True)

    op: Op
    reason: str


class ApplyResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    library: Library
    applied: tuple[Op, ...] = ()
    rejected: tuple[Rejected, ...] = ()
    # what could not be read as an operation at all (an unknown id or kind, a missing field: the parser's
    # message for each), when the batch was given as text or dicts (ExperienceManager.apply_operations)
    unreadable: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.applied)


def _text_problem(text: str, max_words: int) -> str | None:
    if not text.strip():
        return "empty text"
    words = word_count(text)
    if words > max_words:
        return f"{words} words, over the cap of {max_words}"
    return None


def apply(library: Library, ops: list[Op] | tuple[Op, ...]) -> ApplyResult:
    """Validate `ops` against `library` and apply the valid, non-conflicting ones (pure)."""
    known = set(library.ids)
    rejected: dict[int, str] = {}
    for i, op in enumerate(ops):
        if reason := _static_problem(op, known, library.max_words):
            rejected[i] = reason
    valid = [(i, op) for i, op in enumerate(ops) if i not in rejected and not isinstance(op, NoOp)]
    accepted: set[int] = set()

    deleted: set[str] = set()
    for i, op in valid:
        if isinstance(op, Delete):
            if op.id in deleted:
                rejected[i] = f"{op.id} already deleted in this batch"
            else:
                deleted.add(op.id)
                accepted.add(i)

    merged: set[str] = set()
    for i, op in valid:
        if isinstance(op, Merge):
            if hit := sorted(set(op.ids) & deleted):
                rejected[i] = f"{', '.join(hit)} deleted in this batch (delete wins)"
            elif hit := sorted(set(op.ids) & merged):
                rejected[i] = f"{', '.join(hit)} already merged by another operation"
            else:
                merged.update(op.ids)
                accepted.add(i)

    updates = Counter(op.id for _, op in valid if isinstance(op, Update))
    for i, op in valid:
        if isinstance(op, Update):
            current = library.get(op.id)
            if op.id in deleted:
                rejected[i] = f"{op.id} deleted in this batch (delete wins)"
            elif op.id in merged:
                rejected[i] = f"{op.id} merged in this batch (merge wins)"
            elif updates[op.id] > 1:
                rejected[i] = f"conflicting updates of {op.id} in one batch"
            elif current is not None and op.text.strip() == current.text:
                rejected[i] = f"{op.id} already has this text"
            else:
                accepted.add(i)

    updated = {op.id: op.text.strip() for i, op in valid if i in accepted and isinstance(op, Update)}
    survivors = [item for item in library.items if item.id not in deleted and item.id not in merged]
    seen = {normalized(updated.get(item.id, item.text)): item.id for item in survivors}
    merges = [op for i, op in valid if i in accepted and isinstance(op, Merge)]
    seen.update({normalized(op.text): "a merge in this batch" for op in merges})
    size = len(survivors) + len(merges)
    for i, op in valid:
        if isinstance(op, Add):
            key = normalized(op.text)
            if key in seen:
                rejected[i] = f"duplicate of {seen[key]}"
            elif size >= library.max_items:
                rejected[i] = f"library full ({library.max_items} items)"
            else:
                seen[key] = "an add in this batch"
                size += 1
                accepted.add(i)

    rejections = tuple(Rejected(op=ops[i], reason=rejected[i]) for i in sorted(rejected))
    if not accepted:
        return ApplyResult(library=library, rejected=rejections)
    applied = tuple(ops[i] for i in sorted(accepted))  # in the order given
    return ApplyResult(
        library=_build(library, applied, deleted, merged, updated), applied=applied, rejected=rejections
    )


def _static_problem(op: Op, known: set[str], max_words: int) -> str | None:
    """What is wrong with `op` on its own (before looking at the rest of the batch)."""
    if isinstance(op, NoOp):
        return None
    if isinstance(op, (Update, Delete)) and op.id not in known:
        return f"unknown id {op.id!r}"
    if isinstance(op, Merge):
        if len(set(op.ids)) < 2:
            return "merge needs at least two distinct ids"
        if missing := sorted(set(op.ids) - known):
            return f"unknown id {', '.join(map(repr, missing))}"
    if isinstance(op, (Add, Update, Merge)):
        return _text_problem(op.text, max_words)
    return None


def _build(
    library: Library, applied: tuple[Op, ...], deleted: set[str], merged: set[str], updated: dict[str, str]
) -> Library:
    version = library.version + 1
    items = [
        item.model_copy(update={"text": updated[item.id], "since": version}) if item.id in updated else item
        for item in library.items
        if item.id not in deleted and item.id not in merged
    ]
    next_id = library.next_id
    for op in applied:
        if isinstance(op, (Add, Merge)):
            sources = tuple(dict.fromkeys(op.ids)) if isinstance(op, Merge) else ()
            items.append(Experience(id=f"E{next_id}", text=op.text.strip(), since=version, sources=sources))
            next_id += 1
    return library.model_copy(update={"version": version, "next_id": next_id, "items": tuple(items)})
