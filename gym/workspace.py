"""The workspace: where gym keeps datasets, tokenized data, models, runs, MLflow and Prefect results.

`GYM_HOME` sets the root (default `./.gym`). Content-addressed artifacts live under
`<kind>/<hash>/` and are written through `atomic_dir`, so a crash never leaves a half
artifact under a final name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
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

from gym import errors

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
def atomic_dir(final: Path, replace: bool = False) -> Iterator[Path]:
    """Yield a temp dir beside `final`; rename it into place only if the block succeeds.

    If `final` already exists (another run produced the same content), the temp dir is
    discarded: content-addressed artifacts with equal names have equal content. With `replace`
    (a rebuild of a damaged artifact: equal names, but the one there can't be read) the new dir takes
    its place in one atomic swap, so `final` is always either the old folder or the new one, and the
    old one is removed after. The writer holds a lock on a file beside the temp dir while it writes,
    so a temp dir a killed process left (`kill -9` mid-write) is known by its lock being free, and the
    next write of `final` removes it. A full disk is one line naming `final` (errors.DiskFullError).
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
            if replace and final.exists() and _exchange(tmp, final):
                shutil.rmtree(tmp, ignore_errors=True)  # now the old folder, under the temp name
                return
            if replace and final.exists():  # no atomic swap here: the old one aside, then the new in
                old = tmp.with_name(tmp.name + ".old")  # a killed process's is removed with its temp dir
                os.rename(final, old)
                try:
                    os.rename(tmp, final)
                except OSError:
                    os.rename(old, final)
                    raise
                shutil.rmtree(old, ignore_errors=True)
                return
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if errors.disk_full(exc) is not None and not isinstance(exc, errors.GymError):
                raise errors.disk_full_error(exc, final) from exc
            raise
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux's renameat2 with RENAME_EXCHANGE); False where the system or
    the file system has no such call (macOS, some network file systems), so the caller renames twice."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def discard(folder: Path) -> None:
    """Remove a folder gym wrote (a damaged artifact about to be made again) without ever leaving half
    of it under its name: it is renamed to a temp name first, with a free lock file beside it, so if this
    process dies while deleting, the next `atomic_dir` write of `folder` removes the rest."""
    folder = Path(folder)
    if not folder.exists():
        return
    fd, lock_name = tempfile.mkstemp(prefix=f".{folder.name}.tmp-", suffix=LOCK_SUFFIX, dir=folder.parent)
    os.close(fd)
    aside = Path(lock_name.removesuffix(LOCK_SUFFIX))
    os.rename(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)
    Path(lock_name).unlink(missing_ok=True)


def weights_problem(folder: Path) -> str | None:
    """What makes the safetensors weights of a model, adapter or checkpoint folder unreadable, in words;
    None when they look whole. Cheap (headers only, no tensor is read): each `*.safetensors` file must hold
    its header and all the data its header declares (a copy or save cut short by a full disk, a kill, a
    `truncate` fails here), the shards a `*.safetensors.index.json` names must be there, and a folder with
    a config.json / adapter_config.json must hold at least one weights file."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    for index in sorted(folder.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{index.name} can't be read ({exc})"
        if missing := sorted(s for s in shards if not (folder / s).is_file()):
            return f"{missing[0]} is missing ({index.name} names it)"
    configs = ("config.json", "adapter_config.json")
    if not files and any((folder / c).is_file() for c in configs) and not _other_weights(folder):
        return "it holds no weights file"
    for file in files:
        if problem := _safetensors_problem(file):
            return f"{file.name} {problem}"
    return None


def _other_weights(folder: Path) -> bool:
    """Weights in another format beside the config (pickles, which gym.models refuses on its own)."""
    return any(p.suffix in (".bin", ".pt", ".pth", ".gguf") for p in folder.iterdir())


def _safetensors_problem(file: Path) -> str | None:
    """Why a safetensors file is not whole, else None: an 8-byte header length, the JSON header, then the
    data, whose end the header's largest `data_offsets` gives."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 0 or 8 + length > size:
                return f"is cut short ({size:,} bytes, too few for its header)"
            header = json.loads(f.read(length))
    except (OSError, ValueError) as exc:
        return f"can't be read ({exc})"
    if not isinstance(header, dict):
        return "has no valid header"
    ends = [
        int(t["data_offsets"][1])
        for name, t in header.items()
        if name != "__metadata__" and isinstance(t, dict) and len(t.get("data_offsets") or ()) == 2
    ]
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        return f"is cut short ({size:,} of {needed:,} bytes)"
    return None


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
            tmp = lock.with_name(lock.name.removesuffix(LOCK_SUFFIX))
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(tmp.with_name(tmp.name + ".old"), ignore_errors=True)  # a replaced one, set aside
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
