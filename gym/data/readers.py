"""Read raw records from local files, folders and hub datasets, numbered for error messages.

Supported sources: `.json` (a top-level array, or JSON Lines in a .json file), `.jsonl`, `.csv`,
`.parquet`, `.arrow` (Arrow IPC file or stream), a `datasets.save_to_disk` folder, a folder of
files of one of those types (read in sorted order), a `.txt` file (raw text: one `{"text": line}`
record per line, as `datasets.load_dataset("text")` reads it, blank lines skipped), and hub ids
(`datasets.load_dataset`; only when the name is not a local path). Every reader yields
`(record_no, record)` with 1-based numbers; a text file's numbers (`RecordNo`) know their line too, so
errors say `record 2 (line 4)` where blank lines, a csv header or line breaks in values make the two differ.

    from gym.data.readers import read_source
    for file, no, record in read_source("tests/fixtures/data/alpaca.jsonl"):
        ...
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gym.errors import DataError, RegistryError

EXTENSIONS = (".json", ".jsonl", ".csv", ".parquet", ".arrow")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_BATCH = 1024
# csv's own default field limit (131,072 characters) refuses a long document or conversation; raised
# to the largest a C long holds everywhere (Windows' is 32 bits).
CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)
# What json.loads leaves of a lone surrogate escape ("\ud800"): a str that UTF-8 cannot encode.
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_NUL = "\x00"

Records = Iterator[tuple[int, dict[str, Any]]]
TextReader = Callable[[Path], Records]


class RecordNo(int):
    """A record's 1-based number that also knows the line of its text file where the record is, for
    messages: `str()` (what a DataError prints) says `2 (line 4)` where the two differ; otherwise it
    is the number it is (compares, hashes and serializes as the int)."""

    line: int | None

    def __new__(cls, no: int, line: int | None = None) -> RecordNo:
        self = super().__new__(cls, no)
        self.line = line
        return self

    def __str__(self) -> str:
        no = int(self)
        return f"{no} (line {self.line})" if self.line is not None and self.line != no else str(no)


def _check_dict(record: Any, file: str, no: int) -> dict[str, Any]:
    if not isinstance(record, dict):
        hint = 'each record must be an object like {"instruction": ..., "output": ...}'
        if isinstance(record, list) and file.lower().endswith(".jsonl") and int(no) == 1:
            hint += "; a file holding one JSON array of records is JSON: name it .json"
        raise DataError(
            f"expected a JSON object per record, got {type(record).__name__}",
            file=file,
            record=no,
            hint=hint,
        )
    return record


def _utf8(reader: TextReader) -> TextReader:
    """`reader` of a text file, with a file that is not UTF-8 a DataError naming where (a traceback
    of UnicodeDecodeError, naming neither file nor line, before)."""

    @functools.wraps(reader)
    def read(path: Path) -> Records:
        try:
            yield from reader(path)
        except UnicodeDecodeError:
            raise not_utf8(path) from None

    return read


def not_utf8(path: Path) -> DataError:
    """Where `path` stops being UTF-8: the line and the byte, and what to do."""
    message, hint = utf8_problem(path.read_bytes())
    return DataError(message, file=str(path), hint=hint)


def utf8_problem(data: bytes) -> tuple[str, str]:
    """Why `data` (the bytes of a file that failed to decode) is not UTF-8 text, where (the line and the
    byte), and what to do; for any file gym reads as text (data, dataset_info.json, registries)."""
    hint = "save it as UTF-8, e.g. iconv -f <its encoding> -t UTF-8 FILE > NEW"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "the file is UTF-16 text, not UTF-8", hint.replace("<its encoding>", "UTF-16")
    body = data.removeprefix(b"\xef\xbb\xbf")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body[: exc.start].count(b"\n") + 1
        column = exc.start - (body.rfind(b"\n", 0, exc.start) + 1) + 1
        return f"not UTF-8 text: line {line}, byte {column} is 0x{body[exc.start]:02x} ({exc.reason})", hint
    return "not UTF-8 text", hint


def read_json_file(path: Path) -> Any:
    """A JSON file gym reads settings from (a registry, a dataset_info.json): UTF-8, with or without a
    byte order mark; one that is not, or not valid JSON, is a RegistryError naming the file and where."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError:
        message, hint = utf8_problem(path.read_bytes())
        raise RegistryError(f"{path}: {message} ({hint})") from None
    except json.JSONDecodeError as e:
        raise RegistryError(f"{path}: not valid JSON at line {e.lineno}: {e.msg}") from None


@_utf8
def read_json(path: Path) -> Records:
    """A `.json` file holding a top-level array of objects, or JSON Lines; `.jsonl` is JSON Lines."""
    file = str(path)
    if path.suffix.lower() == ".json":
        text = path.read_text(encoding="utf-8-sig")
        if text.lstrip().startswith("["):
            loads, repeats = _json_decoder()
            try:
                rows = loads(text)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}",
                    file=file,
                    hint="fix the file, or write one object per line as JSON Lines",
                ) from None
            if not isinstance(rows, list):
                raise DataError("expected a top-level array of records", file=file)
            escapes = _SURROGATE_ESCAPE.search(text) is not None
            for no, row in enumerate(rows, 1):
                yield no, _checked(row, file, no, escapes, bool(repeats))
            return
        if "\n" in text.strip() and _one_object(text):
            raise DataError(
                "the file holds a single JSON object spread over several lines, not records",
                file=file,
                hint="put the records in a top-level array, or write one object per line (JSON Lines)",
            )
    yield from _read_json_lines(path)


def _one_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def _read_json_lines(path: Path) -> Records:
    file, no = str(path), 0
    loads, repeats = _json_decoder()
    with open(path, encoding="utf-8-sig") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            no += 1
            text = line.rstrip("\r\n")  # positions in the line, not past its end
            try:
                row = loads(text)
            except json.JSONDecodeError as e:
                cut = ", the line ends before its object does" if e.pos >= len(text.rstrip()) else ""
                raise DataError(
                    f"line {line_no} is not valid JSON (column {e.colno}: {e.msg}{cut})",
                    file=file,
                    record=no,
                    hint="JSON Lines files need one complete JSON object per line",
                ) from None
            no_at = RecordNo(no, line_no)
            escapes = _SURROGATE_ESCAPE.search(text) is not None
            yield no_at, _checked(row, file, no_at, escapes, bool(repeats))


class _Repeated(dict):  # type: ignore[type-arg]
    """A JSON object in which `key` appears more than once (json.loads keeps its last value only)."""

    key: str


def _json_decoder() -> tuple[Callable[[str], Any], list[str]]:
    """json.loads for one data file, and the list of the keys it found repeated within an object, so
    far: such an object is a `_Repeated`, for `_checked` to name (one of its values was dropped)."""
    repeats: list[str] = []

    def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) == len(pairs):
            return found
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                break
            seen.add(key)
        repeated = _Repeated(found)
        repeated.key = key
        repeats.append(key)
        return repeated

    return functools.partial(json.loads, object_pairs_hook=json_object), repeats


def _first_repeated(value: Any) -> _Repeated | None:
    """The first object with a repeated key in a JSON value, or None."""
    if isinstance(value, _Repeated):
        return value
    values = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next(filter(None, map(_first_repeated, values)), None)


def _checked(row: Any, file: str, no: int, escapes: bool, repeats: bool = False) -> dict[str, Any]:
    """A JSON record as a dict; checked for lone surrogates when its text has `\\uD800`-`\\uDFFF` escapes
    (a traceback of UnicodeEncodeError from Arrow, naming neither file nor record, before), and for a
    key given twice in one object when the file has one (`repeats`: json keeps the last value only)."""
    record = _check_dict(row, file, no)
    twice = _first_repeated(record) if repeats else None
    if twice is not None:
        inside = (
            None if twice is record else next(k for k, v in record.items() if _first_repeated(v) is twice)
        )
        where = (
            f"key {twice.key!r} is given twice in one of its objects"
            if inside
            else "given twice in the record"
        )
        raise DataError(
            f"{where}; only its last value would be read",
            file=file,
            record=no,
            field=inside or twice.key,
            hint="keep the key once, with the value you mean",
        )
    for key, value in record.items() if escapes else ():
        bad = _lone_surrogate([key, value])
        if bad is not None:
            raise DataError(
                f"invalid Unicode: lone surrogate \\u{ord(bad):04x} (half of a UTF-16 pair, as left by text "
                "cut in the middle of an emoji), which UTF-8 cannot hold",
                file=file,
                record=no,
                field=key,
                hint="fix the text: a \\uD800-\\uDBFF escape must be followed by a \\uDC00-\\uDFFF one; "
                "or drop the record",
            )
    return record


def _lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in a JSON value (object keys included), or None."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        return found.group() if found else None
    if isinstance(value, dict):
        value = [*value, *value.values()]
    if isinstance(value, list):
        return next(filter(None, map(_lone_surrogate, value)), None)
    return None


@_utf8
def read_text(path: Path) -> Records:
    """Plain text: one `{"text": line}` record per line that is not blank (LLaMA-Factory's wiki_demo.txt)."""
    with open(path, encoding="utf-8-sig") as f:
        no = 0
        for line_no, line in enumerate(f, 1):
            text = line.rstrip("\r\n")
            if text.strip():
                no += 1
                yield RecordNo(no, line_no), {"text": text}


@_utf8
def read_csv(path: Path) -> Records:
    """CSV with a header row; every value is read as text (formats convert labels and numbers). Records
    are numbered from the first row after the header; blank rows are skipped, as csv.DictReader does."""
    file = str(path)
    csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header, no = _csv_row(reader, file, None), 0
        if header is None:
            return
        while True:
            at = RecordNo(no + 1, reader.line_num + 1)  # the line the row starts on
            row = _csv_row(reader, file, at)
            if row is None:
                return
            if not row:
                continue  # a blank line
            no += 1
            if len(row) > len(header):
                raise DataError(
                    "the row has more values than the header has columns",
                    file=file,
                    record=at,
                    hint="quote values that contain commas",
                )
            record = dict(zip(header, row, strict=False)) | {k: None for k in header[len(row) :]}
            for name, value in record.items():
                at_char = value.find(_NUL) + 1 if value is not None else 0
                if at_char:
                    raise DataError(
                        f"the value holds a NUL byte (\\x00) at character {at_char}",
                        file=file,
                        record=at,
                        field=name,
                        hint="remove the NUL bytes (a JSON Lines file with them is refused too); a file "
                        "full of them may be UTF-16 or binary",
                    )
            yield at, record


def _csv_row(reader: Any, file: str, at: RecordNo | None) -> list[str] | None:
    """The next row of a csv reader (None at the end), its errors as a DataError naming record `at` (None:
    the header)."""
    try:
        return next(reader, None)
    except csv.Error as exc:
        where = "" if at else " in the header row"
        raise DataError(
            f"not valid CSV{where}: {exc}",
            file=file,
            record=at,
            hint="check the quoting there: a value holding a quote, comma or line break goes in double "
            "quotes, with its own quotes doubled",
        ) from None


def _batches(batches: Iterator[pa.RecordBatch]) -> Records:
    no = 0
    for batch in batches:
        for row in batch.to_pylist():
            no += 1
            yield no, row


def parquet_file(data: bytes | pa.Buffer) -> pq.ParquetFile:
    """A parquet file over bytes in memory (or a memory map's buffer): reading it starts no thread.

    Arrow starts I/O threads for a file-backed source (a path, `memory_map`, `read_table`, threaded
    reads); they outlive the read, and now and then one aborts the process as it exits, after all
    its work is done ("terminate called without an active exception", exit -6; apache/arrow#34314).
    `gym eval` on hub MMLU did so. A buffer source read with `use_threads=False` starts none.
    """
    return pq.ParquetFile(pa.BufferReader(data))


@contextlib.contextmanager
def _readable(path: Path, kind: str) -> Iterator[None]:
    """Arrow's errors for a damaged or mislabelled file as a DataError naming the file."""
    try:
        yield
    except pa.ArrowException as exc:
        raise DataError(
            f"not a readable {kind} file ({exc})",
            file=str(path),
            hint=f"write it again, or give it the extension of its real format ({', '.join(EXTENSIONS)})",
        ) from None


def read_parquet(path: Path) -> Records:
    with _readable(path, "parquet"), pa.memory_map(str(path)) as mapped:  # zero-copy: see parquet_file
        parquet = parquet_file(mapped.read_buffer())
        yield from _batches(parquet.iter_batches(batch_size=_BATCH, use_threads=False))


def read_arrow(path: Path) -> Records:
    """An Arrow IPC file (random-access format) or stream (what `save_to_disk` writes)."""
    with _readable(path, "Arrow IPC"), pa.memory_map(str(path)) as mapped:
        source = pa.BufferReader(mapped.read_buffer())  # see `parquet_file`: a buffer starts no thread
        try:
            reader = pa.ipc.open_file(source)
        except pa.ArrowInvalid:
            source.seek(0)
            yield from _batches(iter(pa.ipc.open_stream(source)))
            return
        yield from _batches(reader.get_batch(i) for i in range(reader.num_record_batches))


def read_saved(path: Path, split: str) -> Records:
    """A `Dataset.save_to_disk` / `DatasetDict.save_to_disk` folder."""
    import datasets  # lazy here and below: importing datasets costs ~1 s

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(
                f"split {split!r} not found; the saved dataset has {sorted(loaded)}",
                file=str(path),
                hint="set `split` in the dataset registry",
            )
        loaded = loaded[split]
    yield from enumerate(loaded, 1)


_READERS = {
    ".json": read_json,
    ".jsonl": read_json,
    ".csv": read_csv,
    ".parquet": read_parquet,
    ".arrow": read_arrow,
    ".txt": read_text,  # single files only: a folder's .txt files are taken for notes, not data
}


def read_file(path: Path) -> Records:
    """Records of one local file, chosen by its extension."""
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(
            f"unsupported file type {path.suffix or '(none)'!r}",
            file=str(path),
            hint=f"use one of {', '.join(EXTENSIONS)} (or .txt for raw text)",
        )
    return reader(path)


def is_saved_dataset(path: Path) -> bool:
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def folder_files(path: Path) -> list[Path]:
    """The data files of a folder (hidden files skipped), sorted; all must share one extension."""
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    files = [p for p in files if p.suffix.lower() in EXTENSIONS]
    nested = sorted(
        p
        for sub in path.iterdir()
        if sub.is_dir() and not sub.name.startswith(".")
        for p in sub.rglob("*")
        if p.is_file() and p.suffix.lower() in EXTENSIONS and not p.name.startswith(".")
    )
    if nested:  # they were left out, silently
        more = f" and {len(nested) - 1} more" if len(nested) > 1 else ""
        raise DataError(
            f"data files in subfolders ({nested[0].relative_to(path)}{more}), which gym does not read: a "
            "dataset folder's own files are its records",
            file=str(path),
            hint="move them into the folder, or name each folder (a comma-separated list of datasets)",
        )
    if not files:
        raise DataError(f"no data files ({', '.join(EXTENSIONS)}) in the folder", file=str(path))
    kinds = {p.suffix.lower() for p in files}
    if len(kinds) > 1:
        raise DataError(
            f"the folder mixes file types {sorted(kinds)}",
            file=str(path),
            hint="keep one file type per dataset folder",
        )
    return files


def looks_like_hub_id(name: str) -> bool:
    """`owner/name` or `name` that is not a local path and has no data-file extension."""
    return (
        bool(_HUB_ID.match(name))
        and not Path(name).exists()
        and not name.lower().endswith(EXTENSIONS)
        and name not in (".", "..")
    )


@functools.cache
def hub_commit(hub_id: str, revision: str | None) -> str | None:
    """The commit a hub dataset's `revision` (None: its default branch) points to: asked of the hub when
    online, else read from the local Hugging Face cache (where `datasets` downloaded it); None when
    neither knows (then the hub id and revision alone identify it, as before). Once per process.

    An unpinned dataset read again after it changed on the hub is then new data, not the old digest's."""
    from huggingface_hub import constants

    ref = revision or "main"
    if not constants.HF_HUB_OFFLINE:
        try:
            from huggingface_hub import HfApi

            sha = HfApi().dataset_info(hub_id, revision=ref, timeout=10).sha
            if sha:
                return str(sha)
        except Exception:  # no network, a private dataset without a token...: the cache may know
            pass
    cached = Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}" / "refs" / ref
    if cached.is_file():
        return cached.read_text(encoding="utf-8").strip() or None
    return ref if re.fullmatch(r"[0-9a-f]{40}", ref) else None  # a commit pins itself


def read_hub(hub_id: str, split: str, revision: str | None, subset: str | None = None) -> Records:
    """Records of a hub dataset (its configuration `subset`, if given) through `datasets.load_dataset`
    (uses the local HF cache offline)."""
    import datasets

    try:
        loaded = datasets.load_dataset(hub_id, subset, split=split, revision=revision)
    except Exception as e:  # datasets raises many types (ConnectionError, FileNotFoundError, ...)
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        hint = (
            "HF_HUB_OFFLINE is set and the dataset is not in the local cache: download it once online, "
            "or point to a local file"
            if offline
            else "check the hub id, split and revision, your network and HF_TOKEN for private datasets"
        )
        if "/" not in hub_id:  # a bare name is read as a hub id only when nothing else has it
            hint += (
                f". {hub_id!r} was read as a hub id: no registry entry, file, or dataset_info.json entry in "
                "the data dir has that name; LLaMA-Factory's own datasets are named in its "
                "data/dataset_info.json: set dataset_dir (or $GYM_DATA_DIR) to that folder"
            )
        which = f"split {split!r}" + (f", subset {subset!r}" if subset else "")
        raise DataError(f"cannot load hub dataset {hub_id!r} ({which}): {e}", hint=hint) from e
    yield from enumerate(loaded, 1)


def read_source(
    source: str | Path, *, split: str = "train", revision: str | None = None, subset: str | None = None
) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Every record of a file, folder or hub id as `(file, record_no, record)`.

    `file` names the file the record came from (a folder yields each of its files in turn, each
    numbered from 1), so errors can point at it.
    """
    path = Path(source).expanduser()
    plain = path.is_file() or (path.is_dir() and not is_saved_dataset(path))
    if plain and split != "train":  # read whole whatever `split` said, as if it had been honoured
        raise DataError(
            f"split {split!r}: a file or a folder of files is one split, train",
            file=str(source),
            field="split",
            hint="drop `split`, or point to the file that holds that split",
        )
    if path.is_file():
        for no, row in read_file(path):
            yield str(path), no, row
    elif path.is_dir():
        if is_saved_dataset(path):
            for no, row in read_saved(path, split):
                yield str(path), no, row
            return
        for f in folder_files(path):
            for no, row in read_file(f):
                yield str(f), no, row
    elif looks_like_hub_id(str(source)):
        for no, row in read_hub(str(source), split, revision, subset):
            yield str(source), no, row
    else:
        raise DataError(
            "no such file or folder",
            file=str(source),
            hint="check the path (relative paths are resolved from the data dir), or give a hub id",
        )
