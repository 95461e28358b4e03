"""Ingest: read a dataset (file, folder, hub id or demo generator), normalize every record, and save
it as an Arrow dataset under `$GYM_HOME/datasets/<digest>/` (plus `meta.json`).

The digest hashes the source content (file bytes, folder contents, hub id + revision + subset, or
generator name + demo.py source), the format, columns, tags, split, num_samples and the code that
shapes records, so the same inputs always land in the same directory and a second call returns it
without reading anything. Artifacts are written through `workspace.atomic_dir`: a bad record raises a
`DataError` and leaves nothing new behind.

    .venv/bin/python -c "from gym.data.ingest import ingest; from gym.data.registry import \\
        resolve_dataset; print(ingest(resolve_dataset('demo_sft')))"
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from gym import workspace
from gym.data import demo, formats, readers
from gym.data.formats import FORMAT_KIND, Where, apply_columns, apply_tags, normalize
from gym.data.registry import DatasetSpec, detect_source_format, resolve_dataset
from gym.errors import REFRESH_HINT, ConfigError, DataError, GymError
from gym.hashing import hash_dir, hash_file, hash_obj, stamp

if TYPE_CHECKING:
    import datasets


@functools.cache
def features(kind: str) -> datasets.Features:
    """The canonical columns of an ingested dataset of record kind `kind`."""
    from datasets import Features, List, Value  # lazy: a fully cached run never needs datasets

    messages = List({"role": Value("string"), "content": Value("string")})
    return {
        "sft": Features({"messages": messages}),
        "preference": Features({"prompt": messages, "chosen": Value("string"), "rejected": Value("string")}),
        "kto": Features({"prompt": messages, "completion": Value("string"), "label": Value("bool")}),
        "prompt": Features({"prompt": messages, "answer": Value("string"), "metadata": Value("string")}),
        "text": Features({"text": Value("string")}),
    }[kind]


_BATCH = 1000
# The code that decides what a record becomes: editing it gives new digests, never stale artifacts.
_CODE = (Path(formats.__file__), Path(readers.__file__), Path(__file__))


class IngestResult(BaseModel):
    """A reference to an ingested dataset: what tasks pass downstream."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    path: Path
    """The `save_to_disk` folder (`datasets.load_from_disk(path)` reads it)."""
    digest: str
    """Content digest naming the folder."""
    kind: str
    """Canonical record kind: sft, preference, kto, prompt or text."""
    num_records: int
    """Number of records written."""


def source_identity(spec: DatasetSpec) -> dict[str, Any]:
    """What identifies the source's content, without reading records."""
    if spec.generator:
        return {"generator": spec.generator, "demo_source": hash_file(Path(demo.__file__))}
    if spec.hub_id:
        commit = readers.hub_commit(spec.hub_id, spec.revision)  # an unpinned dataset that changed: new data
        return {
            "hub_id": spec.hub_id,
            "revision": spec.revision,
            **({"subset": spec.subset} if spec.subset else {}),
            **({"commit": commit} if commit else {}),
        }
    path = Path(spec.file or "")
    if path.is_file():
        return {"file_hash": hash_file(path), "suffix": path.suffix.lower()}
    if path.is_dir():
        return {"dir_hash": hash_dir(path)}
    raise DataError("no such file or folder", file=str(path), hint="check `file` in the dataset registry")


def source_stamp(name: str) -> dict[str, Any]:
    """What dataset `name` resolves to right now, with a cheap stamp (sizes, modification and
    change times) of its files.

    For cache keys: it changes when the registry entry, the working directory's file or the file
    itself changes, without reading any record. Never raises (ingest reports what is wrong).
    """
    try:
        spec = resolve_dataset(name)
    except GymError as e:
        return {"unresolved": str(e)}
    files = stamp(Path(spec.file), ctime=True) if spec.file else None  # ctime: `touch -r`, `cp -p` edits
    commit = readers.hub_commit(spec.hub_id, spec.revision) if spec.hub_id else None  # the hub changed it
    return {"spec": spec.model_dump(mode="json"), "files": files, **({"commit": commit} if commit else {})}


def dataset_digest(spec: DatasetSpec) -> str:
    return hash_obj(
        {
            "source": source_identity(spec),
            "format": spec.format,
            "columns": spec.columns,
            **({"tags": spec.tags} if spec.tags else {}),
            "split": spec.split,
            "num_samples": spec.num_samples,
            "code": [hash_file(p) for p in _CODE],
        }
    )


def demo_file(name: str) -> Path:
    """Write demo dataset `name` as JSON Lines under datasets/demo-files/ (for people to look at)."""
    if name not in demo.DEMO_DATASETS:
        raise ConfigError(f"unknown demo generator {name!r}; expected one of {', '.join(demo.DEMO_DATASETS)}")
    target = workspace.path("datasets", "demo-files", f"{name}.jsonl")
    lines = (json.dumps(r, ensure_ascii=False) for r in demo.demo_records(name))
    workspace.atomic_write_text(target, "".join(f"{line}\n" for line in lines))
    return target


def read_records(spec: DatasetSpec, source: str, fmt: str, path: Path) -> int:
    """Read and normalize up to `num_samples` records into the Arrow file `path`, a batch at a time, so
    memory stays flat whatever the size of the source (the whole table in memory took ~7x the file);
    returns how many records it wrote. A `num_samples` above the source's size repeats its records, in
    order, until there are that many (LLaMA-Factory oversamples such an entry too, at random): how a
    small set is weighted up in a mix."""
    from datasets.arrow_writer import ArrowWriter

    feats = features(FORMAT_KIND[fmt])
    schema = feats.arrow_schema
    guessed = fmt if spec.format is None or spec.format_guessed else None
    batch, count = [], 0
    whole = str(Path(source).expanduser())  # the `file` of each record, unless a folder's files name theirs

    def passes() -> Iterator[tuple[str, int, Any]]:
        first = True
        while first or (spec.num_samples is not None and 0 < count < spec.num_samples):
            first = False
            yield from readers.read_source(
                source, split=spec.split, revision=spec.revision, subset=spec.subset
            )

    with ArrowWriter(features=feats, path=str(path)) as writer:
        for file, no, raw in passes():
            if spec.num_samples is not None and count >= spec.num_samples:
                break
            record = apply_tags(apply_columns(raw, spec.columns), spec.tags)
            try:
                batch.append(normalize(record, fmt, Where(file, no, spec.columns, guessed)))
            except DataError as exc:
                raise other_format(exc, record, fmt, in_folder=file != whole) from None
            count += 1
            if len(batch) == _BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if count == 0:
            raise DataError("the dataset is empty", file=source, hint="add records, or point to another file")
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        writer.finalize()
    return count


def other_format(error: DataError, record: dict[str, Any], fmt: str, in_folder: bool = False) -> DataError:
    """`error` (a record that failed as `fmt`), saying so when the record looks like another format: a
    file mixing formats fails on a field the odd record never had (`output` of an OpenAI record read
    among alpaca ones), and so does a folder whose files hold different formats (`in_folder`)."""
    seen = formats.detect_format(record) if isinstance(record, dict) else None
    if seen is None or seen == fmt:
        return error
    fix = (
        "a folder's files are one dataset in one format: give each format's files as their own dataset, "
        "separated by commas"
        if in_folder
        else "keep one format per file, or name the format the file has"
    )
    hint = (
        f"this record looks like {seen} data (fields {', '.join(map(str, sorted(record)))}), while the "
        f"dataset is read as {fmt}: {fix}"
    )
    hint = f"{hint}; {error.hint}" if error.hint else hint
    return DataError(error.message, file=error.file, record=error.record, field=error.field, hint=hint)


def ingest(spec: DatasetSpec | str | os.PathLike[str]) -> IngestResult:
    """Read, normalize and save `spec`'s records; return the existing artifact when already there.
    `spec` is a DatasetSpec, or what gym.data.registry.resolve_dataset takes (a registry name, a file or
    folder, a hub id), resolved here."""
    import datasets

    if isinstance(spec, str | os.PathLike):
        spec = resolve_dataset(spec)
    elif not isinstance(spec, DatasetSpec):
        raise ConfigError(
            f"dataset is {_shown(spec)}: pass a registry name, a file or folder path or a hub id (a str or "
            "Path), or the DatasetSpec gym.data.registry.resolve_dataset returns"
        )
    digest = dataset_digest(spec)
    final = workspace.path("datasets", digest)
    damaged = final.exists() and saved_problem(final)
    if final.exists() and not damaged:
        meta = load_meta(final, "ingested")
        return IngestResult(path=final, digest=digest, kind=meta["kind"], num_records=meta["num_records"])
    if damaged:  # cut short (a full disk, a copy) or edited: made again, replacing it in one step
        print(f"gym: dataset folder {final} can't be read ({damaged}): ingesting it again", file=sys.stderr)
    source = str(demo_file(spec.generator)) if spec.generator else spec.source
    fmt = spec.format or detect_source_format(source, spec.columns, spec.split, spec.revision, spec.subset)
    kind = FORMAT_KIND[fmt]
    with workspace.atomic_dir(final, replace=bool(damaged)) as tmp:
        # Records stream into a scratch file inside the artifact's temp dir (removed with it if anything
        # fails), then save_to_disk writes the artifact from it memory-mapped.
        scratch = tmp / "scratch"
        scratch.mkdir()
        count = read_records(spec, source, fmt, scratch / "records.arrow")
        meta = {
            "digest": digest,
            "kind": kind,
            "format": fmt,
            "num_records": count,
            "spec": spec.model_dump(mode="json"),
        }
        ds = datasets.Dataset.from_file(str(scratch / "records.arrow"))
        ds.save_to_disk(str(tmp))
        del ds
        shutil.rmtree(scratch)
        workspace.atomic_write_json(tmp / "meta.json", meta)
    return IngestResult(path=final, digest=digest, kind=kind, num_records=count)


def origin(dataset_dir: str | Path) -> str:
    """What the user called an ingested dataset folder, for messages: its file, hub id or registry name
    (with the part of it a val_size split kept, or the datasets a mix joined); else the folder."""
    try:
        meta = load_meta(dataset_dir)
    except ValueError:  # DataError, or a damaged meta.json
        return str(dataset_dir)
    if "split_of" in meta:  # checked first: a split of a mix keeps its parts' `mix_of` too
        of = meta["split_of"]
        part = "training part" if of["part"] == "train" else "held-out part"
        return f"{origin(workspace.path('datasets', of['digest']))} ({part}, val_size={of['val_size']})"
    if "mix_of" in meta:
        return " + ".join(str(part["dataset"]) for part in meta["mix_of"])
    spec = meta.get("spec", {})
    return str(spec.get("file") or spec.get("hub_id") or spec.get("name") or dataset_dir)


# What a dataset folder gym wrote is: ingested (ingest, split, mix: records) or tokenized (token ids).
Stage = Literal["ingested", "tokenized"]
# The function whose returned folder a caller expecting each stage (or either: None) takes.
RETURNED_BY = {
    "ingested": "gym.data.ingest.ingest",
    "tokenized": "gym.data.tokenize.tokenize",
    None: "gym.data.ingest.ingest or gym.data.tokenize.tokenize",
}


def _shown(value: Any) -> str:
    """`value` as a message quotes it: its repr, or its type where that repr is long."""
    text = repr(value)
    return text if len(text) <= 60 else f"a {type(value).__name__}"


def missing_hint(expect: Stage | None = None) -> str:
    """What to do about a dataset folder that is not there, from Python and from a flow."""
    return f"pass a folder {RETURNED_BY[expect]} returned; or, {REFRESH_HINT}"


def dataset_folder(value: Any, argument: str, expect: Stage | None = None) -> Path:
    """`value` as a dataset folder: a path (str or Path), or a result holding one in `path` (IngestResult,
    TokenizeResult). Anything else (None, a name) is a ConfigError naming `argument`."""
    path = value if isinstance(value, str | os.PathLike) else getattr(value, "path", None)
    if isinstance(path, str | os.PathLike) and str(path).strip():
        return Path(path)
    what = f"{expect} dataset folder" if expect else "dataset folder"
    raise ConfigError(
        f"{argument} is {_shown(value)}: pass the {what} {RETURNED_BY[expect]} returned (a str or Path, "
        "or the result itself)"
    )


def load_meta(dataset_dir: str | Path, expect: Stage | None = None) -> dict[str, Any]:
    """The meta.json of a dataset folder gym wrote; with `expect`, refused (naming the folder and what to
    pass instead) unless the folder is an ingested or a tokenized one, as expected."""
    meta_file = Path(dataset_dir) / "meta.json"
    if not Path(dataset_dir).exists():
        raise DataError("no such dataset folder", file=str(dataset_dir), hint=missing_hint(expect))
    if not meta_file.is_file():
        raise DataError(
            f"not {'a tokenized' if expect == 'tokenized' else 'an ingested'} dataset (meta.json missing)",
            file=str(dataset_dir),
            hint=f"pass the path returned by {RETURNED_BY[expect or 'ingested']}",
        )
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except ValueError as exc:  # written atomically, so damaged by hand or by the disk
        raise DamagedDataset(dataset_dir, f"meta.json: {exc}") from None
    if not isinstance(meta, dict):
        raise DamagedDataset(dataset_dir, "meta.json holds no mapping")
    # a tokenized folder's meta.json holds its TokenizeResult (`result`); an ingested one's, its `kind`
    tokenized = "result" in meta
    if expect == "ingested" and tokenized:
        raise DataError(
            "a tokenized dataset folder, not an ingested one",
            file=str(dataset_dir),
            hint="pass the folder gym.data.ingest.ingest returned",
        )
    if expect == "tokenized" and not tokenized and "kind" in meta:
        raise DataError(
            "an ingested dataset folder, not a tokenized one",
            file=str(dataset_dir),
            hint="tokenize it first with gym.data.tokenize.tokenize, and pass the folder it returns",
        )
    body = meta["result"] if tokenized else meta
    if expect is not None and not (isinstance(body, dict) and "kind" in body):
        raise DamagedDataset(dataset_dir, "meta.json names no record kind")
    return meta


# Hint for an artifact folder gym made that can't be read: what the user does about it.
REMAKE = "delete the folder and run the same command again: gym makes it again from its source"


class DamagedDataset(DataError):
    """A dataset folder gym wrote (ingested or tokenized) whose files can't be read: cut short by a full
    disk or a copy, or edited. Says which folder, and to delete it (gym makes it again)."""

    def __init__(self, folder: str | Path, problem: str) -> None:
        self.folder, self.problem = Path(folder), problem
        super().__init__(f"dataset folder {folder} can't be read ({problem}): {REMAKE}")


def load_saved(folder: str | Path) -> datasets.Dataset:
    """`datasets.load_from_disk(folder)` of a folder gym saved (ingested, split, mixed or tokenized): one
    whose files were cut short or edited is a DamagedDataset naming it, not pyarrow's traceback."""
    import datasets
    import pyarrow

    folder = Path(folder)
    if not folder.exists():
        raise DataError("no such dataset folder", file=str(folder), hint=missing_hint())
    try:
        return datasets.load_from_disk(str(folder))
    except PermissionError:
        raise  # the file is whole: another user's folder, said as it is
    # pyarrow: a data file cut short (ArrowInvalid, or OSError "Expected to be able to read N bytes");
    # a data file missing (FileNotFoundError); state.json or dataset_info.json damaged (JSONDecodeError)
    except (OSError, pyarrow.ArrowException, json.JSONDecodeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DamagedDataset(folder, first) from None


def saved_problem(folder: str | Path) -> str | None:
    """Why the dataset folder gym saved at `folder` can't be used (its meta.json or data unreadable), else
    None. Memory-maps the data as training would (no record is read): cheap even for large datasets."""
    try:
        load_meta(folder)
        load_saved(folder)
    except DamagedDataset as exc:
        return exc.problem
    except DataError as exc:  # meta.json missing: a folder left half-made by something other than gym
        return exc.message
    return None
