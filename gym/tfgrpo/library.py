"""The experience library: versioned, capped, content-hashed, persisted as JSON.

A library is an immutable value. Items have stable ids (`E0`, `E1`, ...) handed out from a counter
that only grows, so an id is never reused, even after its item is deleted or merged away; the
prompt shows display aliases (`[G0]`, `[G1]` ...) that `aliases()` maps back to ids. `version`
counts the changes applied (a batch of operations that changes nothing keeps the version).

    from gym.tfgrpo.library import Library
    lib = Library.load("experiences.json")           # or Library(max_items=100, max_words=32)
    lib.save("experiences.json")                     # atomic write; load_shipped reads `items`
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gym import workspace
from gym.errors import DataError
from gym.hashing import hash_obj

FORMAT = "gym.tfgrpo.library"
FORMAT_VERSION = 1


class Experience(BaseModel):
    """One insight: a stable id, its text, the library version that wrote it, and its lineage."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Stable id (`E<n>`), never reused.")
    text: str = Field(description="The insight, ideally 'When [condition], [do X]'.")
    since: int = Field(0, ge=0, description="Library version that wrote this text.")
    sources: tuple[str, ...] = Field((), description="Ids this item was merged from (lineage).")


class Library(BaseModel):
    """An immutable experience library; operations produce new libraries (see gym.tfgrpo.ops)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(0, ge=0, description="Number of changes applied so far.")
    next_id: int = Field(0, ge=0, description="Counter for new ids; only ever grows.")
    max_items: int = Field(100, ge=1, description="Cap on the number of items.")
    max_words: int = Field(32, ge=1, description="Cap on the words of one item.")
    items: tuple[Experience, ...] = ()

    @property
    def texts(self) -> list[str]:
        return [item.text for item in self.items]

    @property
    def ids(self) -> list[str]:
        return [item.id for item in self.items]

    def get(self, item_id: str) -> Experience | None:
        return next((item for item in self.items if item.id == item_id), None)

    def aliases(self) -> dict[str, str]:
        """Display alias (`G0`, `G1`, ... in library order, as the prompt shows them) -> stable id."""
        return {f"G{i}": item.id for i, item in enumerate(self.items)}

    def content_hash(self) -> str:
        """Digest of what the library holds (items, id counter and caps); the version is not part."""
        return hash_obj(
            {
                "items": [item.model_dump(mode="json") for item in self.items],
                "next_id": self.next_id,
                "caps": [self.max_items, self.max_words],
            }
        )

    def to_json(self) -> str:
        """Canonical JSON: the same library always gives the same bytes."""
        body: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **self.model_dump(mode="json"),
            "hash": self.content_hash(),
        }
        return json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Library:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"not JSON: {exc}", file=source, hint="an experience library file") from exc
        # A library written by hand may leave out the header, as a shipped one may (injection.py).
        bare = isinstance(data, dict) and "format" not in data and isinstance(data.get("items"), list)
        if not isinstance(data, dict) or (data.get("format") != FORMAT and not bare):
            raise DataError(
                f'not an experience library (expected "format": "{FORMAT}", or at least "items": [...])',
                file=source,
                field="format",
            )
        stored_hash = data.pop("hash", None)
        data.pop("format", None)
        data.pop("format_version", None)
        data.pop("retrieval_top_k", None)  # how a shipped model injects it (injection.shipped_json)
        data.pop("tf_grpo_run", None)  # the run that wrote it (injection.shipped_json)
        try:
            library = cls.model_validate(data)
        except ValidationError as exc:
            raise DataError(f"invalid experience library: {exc}", file=source) from exc
        if stored_hash is not None and stored_hash != library.content_hash():
            raise DataError(
                "content hash does not match the items (edited by hand or truncated)",
                file=source,
                field="hash",
                hint="restore the file from the run's libraries/ folder",
            )
        if stored_hash is not None:  # written by gym (the hash matches): as valid as when it was saved
            return library
        library.check_items(source)
        numbered = [int(i[1:]) for i in library.ids if i[:1] == "E" and i[1:].isdigit()]
        if numbered and library.next_id <= max(numbered):  # a hand-written file: new ids follow its own
            library = library.model_copy(update={"next_id": max(numbered) + 1})
        return library

    def check_items(self, source: str) -> None:
        """Raise a DataError naming the item of a loaded library that gym could not have written: an id
        given twice (one delete would remove both), an empty text, or one over the caps."""
        seen: set[str] = set()
        for n, item in enumerate(self.items):
            where = f"items[{n}] (id {item.id!r})"
            if item.id in seen:
                raise DataError(
                    f"{where}: id given twice; ids must be unique",
                    file=source,
                    field="id",
                    hint="give each experience its own id (E0, E1, ...)",
                )
            seen.add(item.id)
            if not item.text.strip():
                raise DataError(f"{where}: empty text", file=source, field="text", hint="remove the item")
            if (words := word_count(item.text)) > self.max_words:
                raise DataError(
                    f"{where}: {words} words, over the library's max_words of {self.max_words}",
                    file=source,
                    field="text",
                    hint="shorten it, or raise max_words in the file",
                )
        if len(self.items) > self.max_items:
            raise DataError(
                f"{len(self.items)} items, over the library's max_items of {self.max_items}",
                file=source,
                field="items",
                hint="remove some, or raise max_items in the file",
            )

    def save(self, path: str | Path) -> Path:
        """Write atomically (a reader never sees half a file)."""
        target = Path(path)
        workspace.atomic_write_text(target, self.to_json())
        return target

    @classmethod
    def load(cls, path: str | Path) -> Library:
        p = Path(path)
        if not p.is_file():
            raise DataError("no such experience library file", file=str(p))
        return cls.from_json(p.read_text(encoding="utf-8"), source=str(p))


class LibraryRef(BaseModel):
    """A library version by reference (what Prefect tasks pass): its file, hash and version."""

    model_config = ConfigDict(frozen=True)

    path: str
    hash: str
    version: int
    size: int

    @classmethod
    def of(cls, library: Library, path: Path) -> LibraryRef:
        return cls(
            path=str(path), hash=library.content_hash(), version=library.version, size=len(library.items)
        )

    def load(self) -> Library:
        return _load_cached(self.path, self.hash)


@functools.lru_cache(maxsize=64)
def _load_cached(path: str, content_hash: str) -> Library:
    library = Library.load(path)
    if library.content_hash() != content_hash:
        raise DataError(f"library changed on disk (expected hash {content_hash})", file=path)
    return library


def word_count(text: str) -> int:
    return len(text.split())


def normalized(text: str) -> str:
    """Case- and whitespace-insensitive form of a text, to spot duplicates."""
    return " ".join(text.casefold().split()).rstrip(".")


class LibraryDiff(BaseModel):
    """What changed between two versions of a library."""

    model_config = ConfigDict(frozen=True)

    version_from: int
    version_to: int
    added: tuple[Experience, ...] = ()
    removed: tuple[Experience, ...] = ()
    changed: tuple[tuple[Experience, Experience], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def markdown(self) -> str:
        lines = [f"### Experience library v{self.version_from} → v{self.version_to}", ""]
        if self.empty:
            return "\n".join([*lines, "No change."])
        for item in self.added:
            merged = f" (merged from {', '.join(item.sources)})" if item.sources else ""
            lines.append(f"- **added** `{item.id}`{merged}: {item.text}")
        for old, new in self.changed:
            lines.append(f"- **updated** `{new.id}`: ~~{old.text}~~ → {new.text}")
        for item in self.removed:
            lines.append(f"- **removed** `{item.id}`: ~~{item.text}~~")
        return "\n".join(lines)


def diff(old: Library, new: Library) -> LibraryDiff:
    before = {item.id: item for item in old.items}
    after = {item.id: item for item in new.items}
    return LibraryDiff(
        version_from=old.version,
        version_to=new.version,
        added=tuple(item for item in new.items if item.id not in before),
        removed=tuple(item for item in old.items if item.id not in after),
        changed=tuple(
            (before[i], after[i]) for i in after if i in before and before[i].text != after[i].text
        ),
    )
