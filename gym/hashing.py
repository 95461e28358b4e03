"""Content hashes that name artifacts: same inputs, same name; any change, a new name."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel


def _default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"cannot hash {type(obj).__name__}")


def hash_obj(obj: Any, length: int = 16) -> str:
    """Stable hex digest of a JSON-able object (dict keys sorted)."""
    blob = json.dumps(obj, sort_keys=True, default=_default, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def hash_file(path: Path, length: int = 16, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:length]


def hash_dir(path: Path, length: int = 16) -> str:
    """Digest of every file's relative path and content under `path` (sorted, hidden files skipped)."""
    h = hashlib.sha256()
    root = Path(path)
    for f in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        h.update(str(f.relative_to(root)).encode())
        h.update(hash_file(f, 64).encode())
    return h.hexdigest()[:length]
