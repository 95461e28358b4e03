"""Content hashes that name artifacts: same inputs, same name; any change, a new name."""

from __future__ import annotations

import functools
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
    """Digest of every file's relative path and content under `path` (sorted; hidden files and
    Python bytecode skipped)."""
    h = hashlib.sha256()
    root = Path(path)
    for f in sorted(p for p in root.rglob("*") if p.is_file() and not _skipped(p)):
        h.update(str(f.relative_to(root)).encode())
        h.update(hash_file(f, 64).encode())
    return h.hexdigest()[:length]


def _skipped(p: Path) -> bool:
    return p.name.startswith(".") or "__pycache__" in p.parts or p.suffix in (".pyc", ".pyo")


def stamp(path: Path, ctime: bool = False) -> Any:
    """Cheap identity of a file or folder: relative names, sizes and modification times.

    Not a content hash (that would read every byte): rewriting or touching any file changes it. With
    `ctime`, the change time counts too: an edit that keeps size and mtime (`touch -r`), or an older copy
    put back with its mtime (`cp -p`, `git checkout`, `rsync -t`), changes it, and no program can set
    it back; but so do a chmod or a hard link, so it is for files whose re-reading is cheap (a dataset
    is ingested again into the same content-addressed artifact), not for model folders that name
    training stages. A missing path has an identity too, so callers never fail on it.
    """
    p = Path(path).expanduser()
    if p.is_file():
        return {"path": str(p.resolve()), **_file_stamp(p, ctime)}
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and not _skipped(f))
        return {
            "path": str(p.resolve()),
            "files": [(f.relative_to(p).as_posix(), *_file_stamp(f, ctime).values()) for f in files],
        }
    return {"missing": str(p)}


def _file_stamp(file: Path, ctime: bool) -> dict[str, int]:
    st = file.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, **({"ctime_ns": st.st_ctime_ns} if ctime else {})}


@functools.cache
def library_digest() -> str:
    """Digest of gym's own code and shipped data (package sources, assets, registry/).

    Part of every cached task's key, so upgrading gym or editing a template or registry entry
    never serves a result computed by other code or data.
    """
    from gym.paths import registry_dir

    return hash_obj([hash_dir(Path(__file__).resolve().parent), hash_dir(registry_dir())])
