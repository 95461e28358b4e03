"""The workspace: where gym keeps datasets, tokenized data, models, runs, MLflow and Prefect results.

`GYM_HOME` sets the root (default `./.gym`). Content-addressed artifacts live under
`<kind>/<hash>/` and are written through `atomic_dir`, so a crash never leaves a half
artifact under a final name.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KINDS = ("datasets", "tokenized", "models", "runs", "mlflow", "prefect", "services")


def home(create: bool = True) -> Path:
    """Workspace root: `$GYM_HOME`, else `./.gym` in the current directory (made unless `create` is off)."""
    root = Path(os.environ.get("GYM_HOME") or Path.cwd() / ".gym").expanduser().resolve()
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return root


def path(kind: str, *parts: str) -> Path:
    """A path under the workspace, e.g. `path("tokenized", digest)`; parent dirs are created."""
    if kind not in KINDS:
        raise ValueError(f"unknown workspace area {kind!r}; expected one of {KINDS}")
    base = home() / kind
    base.mkdir(parents=True, exist_ok=True)
    return base.joinpath(*parts)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temp dir beside `final`; rename it into place only if the block succeeds.

    If `final` already exists (another run produced the same content), the temp dir is
    discarded: content-addressed artifacts with equal names have equal content. The writer holds a
    lock on a file beside the temp dir while it writes, so a temp dir a killed process left (`kill -9`
    mid-write) is known by its lock being free, and the next write of `final` removes it.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _drop_abandoned(final)
    fd, lock_name = tempfile.mkstemp(prefix=f".{final.name}.tmp-", suffix=LOCK_SUFFIX, dir=final.parent)
    lock = Path(lock_name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        tmp = lock.with_name(lock.name.removesuffix(LOCK_SUFFIX))
        tmp.mkdir()
        try:
            yield tmp
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


LOCK_SUFFIX = ".lock"


def check_writable(folder: Path) -> None:
    """Raise the OSError that writing in `folder` would meet: a temp folder is made and removed in it,
    or in the nearest existing folder above it (where `atomic_dir` makes the missing ones), so a
    read-only file system or another user's folder is found before the work that would write there."""
    folder = Path(folder).expanduser().absolute()
    above = next(p for p in (folder, *folder.parents) if p.exists())
    with tempfile.TemporaryDirectory(prefix=".gym-write-check-", dir=above):
        pass


def _drop_abandoned(final: Path) -> None:
    """Delete the temp dirs of `final` whose writer is gone: their lock file is there and no process holds
    it (a lock works across processes, containers and NFS hosts). Temp dirs without one are left alone."""
    for lock in final.parent.glob(f".{glob.escape(final.name)}.tmp-*{LOCK_SUFFIX}"):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its writer is at work
            os.close(fd)
            continue
        try:
            shutil.rmtree(lock.with_name(lock.name.removesuffix(LOCK_SUFFIX)), ignore_errors=True)
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)


def umask() -> int:
    """This process's umask, read without setting it (`os.umask` sets it, racing other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def shareable(tree: Path) -> None:
    """Give `tree` and everything in it the modes a plain copy would have under this umask: mkdtemp
    makes folders 0700 and safetensors writes 0600, yet a model folder is meant to be read by others
    (served, exported, read by other users' jobs), like a hub cache entry."""
    mask = umask()
    for path in [Path(tree), *Path(tree).rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    """Write a file through a temp name and `os.replace`, so readers never see half of it.

    A symbolic link is written through (its target replaced, the link kept); a path that is not a
    regular file (/dev/stdout, a named pipe) is written to as it is, since nothing can replace it
    atomically (a rename would put a file where the device or pipe was).
    """
    target = Path(target)
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    if target.exists() and not target.is_file() and not target.is_dir():
        with target.open("wb") as f:
            f.write(data)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(target: Path, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


def atomic_write_json(target: Path, obj: Any) -> None:
    atomic_write_text(target, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


if __name__ == "__main__":  # `python -m gym.workspace` prints the workspace root (deployments/prefect.yaml)
    print(home())
