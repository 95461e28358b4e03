"""Datasets named in LLaMA-Factory's dataset_info.json, so its users' `dataset: a,b` carry over.

    gym train --dataset identity,my_data          # entries of ./data/dataset_info.json
    gym train lf.yaml                              # `dataset_dir: my/dir` is looked in instead

A dataset name that is neither in gym's registry nor a local path is looked up in
`dataset_info.json` in the data dir (`dataset_dir` / `$GYM_DATA_DIR`, else the current directory),
then in its `data/` folder (LLaMA-Factory's default `dataset_dir`). The entry is read as
LLaMA-Factory reads it and becomes a gym dataset spec:

- `file_name` (relative to the dataset_info.json's folder) or `hf_hub_url` (+ `subset`, `split`);
- `formatting` alpaca or sharegpt; `ranking: true` makes preference pairs, a `kto_tag` column
  KTO records;
- an alpaca entry whose `columns` name only `prompt` is pretraining text (stage pt), read as gym's
  `text` records: `{"prompt": "text"}` is every pt entry of LLaMA-Factory's own dataset_info.json
  (c4_demo, wiki_demo, fineweb, the_stack, ...), while its instruction entries that rename `prompt`
  rename `response` too. LLaMA-Factory decides by the stage instead; the one entry read otherwise is an
  instruction entry naming only `prompt` and keeping answers in the default `output` column, and that
  is caught where gym can look: a local file whose first record has `output` stays alpaca (a hub
  entry like it needs `"response": "output"` spelled out to be read as instructions);
- `columns` (prompt, query, response, history, system, messages, chosen, rejected, kto_tag) and
  `tags` (role_tag, content_tag, user_tag, assistant_tag, ...) say where the fields are; `system` and
  alpaca's `history` are read only when `columns` names them, as LLaMA-Factory reads them.

`num_samples` keeps the first N records, and repeats them in order up to N when the file has fewer
(LLaMA-Factory samples N at random, oversampling a smaller file); a `split` other than train of a
local file is refused (it has one). What gym cannot train
on (images, videos, audios, tool descriptions) or read (ModelScope/Modelers hubs, loading scripts,
cloud files, hub folders) fails naming the file, the entry and the field.
"""

from __future__ import annotations

import difflib
import functools
import itertools
from pathlib import Path
from typing import Any

from gym.data.readers import read_json_file, read_source
from gym.errors import DataError, RegistryError

INFO_FILE = "dataset_info.json"

# LLaMA-Factory's column names -> gym's canonical field names, per `formatting`
COLUMNS = {
    "alpaca": {"prompt": "instruction", "query": "input", "response": "output", "history": "history"},
    "sharegpt": {"messages": "conversations"},
}
SHARED_COLUMNS = {"system": "system", "chosen": "chosen", "rejected": "rejected", "kto_tag": "label"}
# Fields LLaMA-Factory reads only when an entry's `columns` names them (its defaults are None): a record's
# `system` or alpaca `history` it was not told about is left out, not trained on.
UNREAD_UNLESS_NAMED = {"alpaca": ("system", "history"), "sharegpt": ("system",)}
# Columns gym has no use for yet, and what to do instead.
UNSUPPORTED_COLUMNS = {
    "images": "gym trains text-only models: remove the media columns",
    "videos": "gym trains text-only models: remove the media columns",
    "audios": "gym trains text-only models: remove the media columns",
    "tools": "gym does not train tool use yet: remove `tools` to train without the tool descriptions",
}
TAGS = (
    "role_tag",
    "content_tag",
    "user_tag",
    "assistant_tag",
    "system_tag",
    "observation_tag",
    "function_tag",
)
# Sources gym does not read, and what to give instead.
UNSUPPORTED_SOURCES = {
    "ms_hub_url": "gym reads the Hugging Face hub: give hf_hub_url, or download the data and give file_name",
    "om_hub_url": "gym reads the Hugging Face hub: give hf_hub_url, or download the data and give file_name",
    "script_url": "loading scripts are not supported: convert the data to files and give file_name",
    "cloud_file_name": "gym reads local files and the Hugging Face hub: download it and give file_name",
}
OTHER_KEYS = ("file_name", "hf_hub_url", "formatting", "ranking", "subset", "split", "folder")
KNOWN_KEYS = (*OTHER_KEYS, "num_samples", "columns", "tags", *UNSUPPORTED_SOURCES)


def info_files(root: Path) -> list[Path]:
    """The dataset_info.json files looked in, first to last: the data dir's, then its data/ folder's."""
    return [path for path in (root / INFO_FILE, root / "data" / INFO_FILE) if path.is_file()]


def load_info(path: Path) -> dict[str, Any]:
    entries = read_json_file(path)
    if not isinstance(entries, dict):
        raise RegistryError(
            f"{path}: expected an object of dataset name -> entry, got {type(entries).__name__}"
        )
    return entries


def entry_names(root: Path) -> list[str]:
    """Every dataset name the dataset_info.json files under `root` define (for "did you mean")."""
    names: list[str] = []
    for path in info_files(root):
        names += [name for name in load_info(path) if name not in names]
    return names


def find(name: str, root: Path) -> dict[str, Any] | None:
    """Dataset `name`'s entry in the first dataset_info.json under `root` that has it, as the fields of a
    gym dataset spec (see gym.data.registry.DatasetSpec); None when no file names it."""
    for path in info_files(root):
        entries = load_info(path)
        if name in entries:
            return translate(name, entries[name], path)
    return None


def translate(name: str, entry: Any, info_file: Path) -> dict[str, Any]:
    """A LLaMA-Factory dataset_info.json entry as the fields of a gym dataset spec."""

    def fail(detail: str, field: str | None = None) -> RegistryError:
        where = f"entry {name!r}" + (f", field {field!r}" if field else "")
        return RegistryError(f"{info_file}: {where}: {detail}")

    if not isinstance(entry, dict):
        raise fail(f"expected an object, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(KNOWN_KEYS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], KNOWN_KEYS, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(KNOWN_KEYS)}"
        raise fail(f"unknown field; {hint}", unknown[0])
    for key in ("file_name", "hf_hub_url", "formatting", "subset", "split", "folder"):
        if key in entry and not (isinstance(entry[key], str) and entry[key].strip()):
            raise fail(f"must be a non-empty string, got {entry[key]!r:.60}", key)
    spec: dict[str, Any] = {"description": f"LLaMA-Factory dataset {name!r} of {info_file}"}
    if "hf_hub_url" in entry:  # LLaMA-Factory's order: a hub, then a script, a cloud file, a local file
        spec["hub_id"] = entry["hf_hub_url"]
        if "subset" in entry:
            spec["subset"] = entry["subset"]
        if "folder" in entry:
            raise fail(
                "gym reads a hub dataset's subsets, not its folders: give subset, or download it", "folder"
            )
    else:
        source = next((key for key in UNSUPPORTED_SOURCES if key in entry), None)
        if source is not None:
            raise fail(UNSUPPORTED_SOURCES[source], source)
        if "file_name" not in entry:
            raise fail("no source: give file_name (a file or folder next to this file) or hf_hub_url")
        spec["file"] = str((info_file.parent / entry["file_name"]).expanduser().resolve())
        if not Path(spec["file"]).exists():
            raise fail(
                f"no such file or folder {spec['file']} (file_name is relative to this file)", "file_name"
            )
    formatting = entry.get("formatting", "alpaca")
    if formatting not in COLUMNS:
        raise fail(f"expected alpaca or sharegpt, got {formatting!r}", "formatting")
    ranking = entry.get("ranking", False)
    if not isinstance(ranking, bool):
        raise fail(f"must be true or false, got {ranking!r}", "ranking")
    columns = _columns(entry.get("columns", {}), formatting, fail)
    spec["format"] = "preference" if ranking else "kto" if "label" in columns else formatting
    if spec["format"] == "alpaca" and set(columns) == {"instruction"} and not _has_output(spec.get("file")):
        spec["format"], columns = "text", {"text": columns["instruction"]}  # pretraining text (stage pt)
    if spec["format"] != "text":  # as LLaMA-Factory: read only when `columns` names them
        columns |= {name: "" for name in UNREAD_UNLESS_NAMED[formatting] if name not in columns}
    spec["columns"] = columns
    tags = entry.get("tags", {})
    if not isinstance(tags, dict) or set(tags) - set(TAGS):
        raise fail(f"expected an object with keys among {', '.join(TAGS)}, got {tags!r:.80}", "tags")
    if not all(isinstance(v, str) and v for v in tags.values()):
        raise fail(f"tag values must be non-empty strings, got {tags!r:.80}", "tags")
    if tags:
        spec["tags"] = tags
    if "split" in entry:
        spec["split"] = entry["split"]
    if "num_samples" in entry:
        samples = entry["num_samples"]
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise fail(f"must be a whole number of at least 1, got {samples!r}", "num_samples")
        spec["num_samples"] = samples
    return spec


def _has_output(file: str | None) -> bool:
    """Whether a local file's first record has alpaca's default answer column `output` (False for a hub
    dataset, or a file that can't be read: ingest reports what is wrong with it)."""
    if file is None:
        return False
    path = Path(file).expanduser()
    try:
        stat = path.stat()
    except OSError:
        return False
    # A dataset resolves several times per run (preflight, cache key, ingest), and reading the first
    # record of a .json file parses all of it: remembered while the file is unchanged.
    return _first_has_output(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _first_has_output(file: str, mtime_ns: int, size: int) -> bool:
    try:
        return any("output" in record for _, _, record in itertools.islice(read_source(file), 1))
    except (DataError, OSError, ValueError):
        return False


def _columns(given: Any, formatting: str, fail: Any) -> dict[str, str]:
    """gym's `columns` (canonical -> source) from LLaMA-Factory's (its name -> source)."""
    if not isinstance(given, dict):
        raise fail(f"expected an object of column name -> source column, got {given!r:.60}", "columns")
    names = {**COLUMNS[formatting], **SHARED_COLUMNS}
    columns: dict[str, str] = {}
    for key, source in given.items():
        if source is None:
            continue  # LLaMA-Factory's "no such column" (e.g. "kto_tag": null)
        field = f"columns.{key}"
        if key in UNSUPPORTED_COLUMNS:
            raise fail(UNSUPPORTED_COLUMNS[key], field)
        if key not in names:
            other = next((f for f, n in COLUMNS.items() if key in n), None)
            detail = (
                f"is a column of {other} formatting, not {formatting}"
                if other
                else f"unknown column; {formatting} entries name {', '.join(names)}"
            )
            raise fail(detail, field)
        if not (isinstance(source, str) and source):
            raise fail(f"must be a column name, got {source!r:.60}", field)
        columns[names[key]] = source
    return columns
