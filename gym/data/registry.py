"""The dataset registry (registry/datasets.json) and `resolve_dataset`: a name, path or hub id -> DatasetSpec.

Entries look like LLaMA-Factory's dataset_info.json:

    "my_qa": {"file": "qa.jsonl", "format": "alpaca", "columns": {"instruction": "question",
              "output": "answer"}, "split": "train", "num_samples": 1000, "description": "..."}

One source per entry: `file` (absolute, or relative to the data dir: `data_dir=`, else
`$GYM_DATA_DIR`, else the current directory), `hub_id` (+ `revision`, `subset`), or `generator` (a
demo dataset of gym/data/demo.py). `num_samples` keeps the first N records, in file order
(repeating them, in order, when there are fewer). `tags`
reads conversations whose messages use other keys or role names (LLaMA-Factory's tags).
Every entry is checked against registry/datasets.schema.json.

A name that is not in gym's registry nor a local path is looked up in LLaMA-Factory's
dataset_info.json in the data dir, or in its data/ folder (LLaMA-Factory's default `dataset_dir`),
before it is taken for a hub id: gym/data/llamafactory.py.

    .venv/bin/python -c "from gym.data.registry import resolve_dataset; print(resolve_dataset('demo_sft'))"
"""

from __future__ import annotations

import difflib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gym.data import llamafactory
from gym.data.demo import DEMO_DATASETS
from gym.data.formats import FORMAT_KIND, apply_columns, check_columns, detect_format
from gym.data.readers import EXTENSIONS, looks_like_hub_id, read_json_file, read_source
from gym.errors import ConfigError, DataError, GymWarning, RegistryError
from gym.paths import registry_dir

Format = Literal["alpaca", "sharegpt", "openai", "preference", "kto", "prompt", "text"]
TagName = Literal[
    "role_tag", "content_tag", "user_tag", "assistant_tag", "system_tag", "observation_tag", "function_tag"
]

# A held-out dataset parameter's default: the demo's held-out split when the run trains on demo data.
AUTO = "auto"
# An empty dataset name is Path(""), the current directory: it read every data file there.
EMPTY_NAME = (
    "the dataset name is empty; give a registry name, a file or folder (`.` for the current directory), "
    "or a hub id"
)


class DatasetSpec(BaseModel):
    """Where a dataset's records come from and how to read them: the input of `ingest`."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    name: str
    """Registry name, or the path / hub id as given."""
    file: str | None = None
    """Local file or folder (absolute once resolved)."""
    hub_id: str | None = None
    """Hugging Face hub dataset id, read with `datasets.load_dataset`."""
    revision: str | None = None
    """Hub revision (branch, tag or commit); None means the default branch."""
    subset: str | None = None
    """Hub dataset configuration (`datasets.load_dataset`'s name); None means its default one."""
    generator: str | None = None
    """Name of a demo dataset in gym/data/demo.py."""
    format: Format | None = None
    """Source format; None means detect it from the first record's fields."""
    format_guessed: bool = Field(default=False, exclude=True)
    """Whether `format` was detected from the first record's fields (a record that fails then says so, and
    how to name the format); left out of dumps, so of cache keys and meta.json."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Canonical field name -> source column name, e.g. {"output": "answer"}."""
    tags: dict[TagName, str] = Field(default_factory=dict)
    """How a conversation's messages spell keys and roles, LLaMA-Factory's `tags`, e.g. {"role_tag":
    "speaker", "user_tag": "me"}; unset tags read gym's usual role/content or from/value messages."""
    split: str = "train"
    """Split to read (hub datasets and saved DatasetDicts)."""
    num_samples: int | None = Field(default=None, ge=1)
    """Keep only the first N records (file order); None keeps all."""
    description: str = ""
    """What the dataset is, for people browsing the registry."""

    @field_validator("columns")
    @classmethod
    def _known_fields(cls, columns: dict[str, str]) -> dict[str, str]:
        check_columns(columns)
        return columns

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        given = [k for k in ("file", "hub_id", "generator") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of file, hub_id, generator (got {given or 'none'})")
        for field in ("revision", "subset"):
            if getattr(self, field) and not self.hub_id:
                raise ValueError(f"{field} applies only to hub_id datasets")
        return self

    @property
    def kind(self) -> str | None:
        """Canonical record kind (sft, preference, kto, prompt, text), or None while the format is unknown."""
        return FORMAT_KIND[self.format] if self.format else None

    @property
    def source(self) -> str:
        return self.file or self.hub_id or self.generator or ""


def registry_file() -> Path:
    return registry_dir() / "datasets.json"


def _schema() -> dict[str, Any]:
    return json.loads((registry_dir() / "datasets.schema.json").read_text(encoding="utf-8"))


def _schema_error(error: jsonschema.ValidationError, file: Path) -> RegistryError:
    path = list(error.absolute_path)
    entry = path[0] if path else None
    field = ".".join(str(p) for p in path[1:]) or None
    if error.validator == "oneOf":
        detail = "give exactly one of file, hub_id, generator"
    elif error.validator == "additionalProperties" and entry is not None:
        detail = f"{error.message}; allowed fields: {', '.join(_schema()['$defs']['entry']['properties'])}"
    else:
        detail = error.message
    where = f"entry {entry!r}" if entry is not None else "the top level"
    where += f", field {field!r}" if field else ""
    return RegistryError(f"{file}: {where}: {detail}")


def load_registry(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The registry's raw entries, validated against the JSON Schema."""
    path = Path(path) if path else registry_file()
    entries = read_json_file(path)
    errors = sorted(
        jsonschema.Draft202012Validator(_schema()).iter_errors(entries),
        key=lambda e: [str(p) for p in e.path],
    )
    if errors:
        raise _schema_error(errors[0], path)
    return entries


def held_out(given: str | None, trained_on: str, demo_split: str) -> str | None:
    """The held-out dataset a flow parameter names: `given` as it is, except AUTO, which means
    `demo_split` when `trained_on` is one of gym's demo datasets (a registry entry with a `generator`:
    they share its tasks) and nothing otherwise. Held-out data of other tasks would score a
    model trained on your data on questions it never trained for, so none is picked for you:
    name yours (`--eval_dataset my_test.jsonl`)."""
    if given != AUTO:
        return given
    entry = load_registry().get(trained_on)
    return demo_split if entry and entry.get("generator") else None


def data_dir(given: str | Path | None = None) -> Path:
    """Where relative `file` entries live: `given`, else `$GYM_DATA_DIR`, else the current directory."""
    return Path(given or os.environ.get("GYM_DATA_DIR") or Path.cwd()).expanduser().resolve()


def spec_from_entry(name: str, entry: dict[str, Any], data_root: str | Path | None = None) -> DatasetSpec:
    entry = dict(entry)
    if "generator" in entry and entry["generator"] not in DEMO_DATASETS:
        raise RegistryError(
            f"dataset registry entry {name!r}, field 'generator': unknown demo dataset "
            f"{entry['generator']!r}; expected one of {', '.join(DEMO_DATASETS)}"
        )
    if isinstance(entry.get("columns"), dict):
        try:
            check_columns(entry["columns"])
        except ValueError as exc:
            raise RegistryError(f"dataset registry entry {name!r}, field {exc}") from None
    if "file" in entry:
        entry["file"] = str(data_dir(data_root) / Path(entry["file"]).expanduser())
    return DatasetSpec(name=name, **entry)


# Labels a user may have given KTO data (a `label` column with other values, a category, is an extra
# column, ignored quietly as LLaMA-Factory ignores extra columns).
YES_OR_NO = {"yes", "no", "y", "n", "good", "bad", "positive", "negative", "pos", "neg", "desirable"}
YES_OR_NO |= {"undesirable", "accept", "accepted", "reject", "rejected", "t", "f", "+", "-", "+1", "-1"}


def _yes_or_no(label: Any) -> bool:
    return (isinstance(label, str) and label.strip().lower() in YES_OR_NO) or label == -1


def detect_source_format(
    source: str,
    columns: dict[str, str],
    split: str = "train",
    revision: str | None = None,
    subset: str | None = None,
) -> Format:
    """The format of a dataset, from its first record's fields (after the column mapping)."""
    for file, no, record in read_source(source, split=split, revision=revision, subset=subset):
        mapped = apply_columns(record, columns)
        fmt = detect_format(mapped)  # the record: a label's value counts
        if fmt not in (None, "kto") and _yes_or_no(mapped.get("label")):  # KTO data, read as fmt
            warnings.warn(
                GymWarning(
                    f"{file}: its 'label' column (record {no}: {mapped['label']!r:.40}) is no KTO label "
                    f"(true/false or 1/0), so the data is read as {fmt} and the column ignored; for KTO, "
                    "write its labels as true/false"
                ),
                stacklevel=2,
            )
        if fmt is None:
            raise DataError(
                f"cannot tell the dataset format from the fields {sorted(record)}",
                file=file,
                record=no,
                hint="expected messages, conversations, chosen/rejected, label, instruction/output, prompt "
                "(online RL's prompts, with an optional answer) or text; "
                "rename the fields, or describe the file (its format and `columns`) in an entry of "
                "registry/datasets.json or of a dataset_info.json in the data dir (LLaMA-Factory's "
                "`formatting` and `columns`), and pass that entry's name",
            )
        return fmt  # type: ignore[return-value]
    raise DataError("the dataset is empty", file=source, hint="add records, or point to another file")


def resolve_dataset(
    name_or_path: str | os.PathLike[str],
    *,
    format: Format | None = None,
    columns: dict[str, str] | None = None,
    split: str = "train",
    data_root: str | Path | None = None,
    registry: Path | None = None,
) -> DatasetSpec:
    """A registry name, a local file/folder, a LLaMA-Factory dataset_info.json name, or a hub id as a
    DatasetSpec, looked up in that order.

    Registry entries are taken as written (their `file` resolved against the data dir). A local
    path gets `format` detected from its first record when not given. A dataset_info.json entry is
    read as LLaMA-Factory reads it (gym/data/llamafactory.py). A hub id keeps `format` None when
    not given; `ingest` detects it then.
    """
    if not isinstance(name_or_path, str | os.PathLike):  # str() made None a hub id 'None'
        shown = repr(name_or_path) if len(repr(name_or_path)) <= 60 else f"a {type(name_or_path).__name__}"
        raise ConfigError(
            f"dataset is {shown}: pass a registry name, a local file or folder path, or a hub id "
            "(a str or Path)"
        )
    name = str(name_or_path)
    if not name.strip():
        raise ConfigError(EMPTY_NAME)
    try:
        check_columns(columns or {})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    entries = load_registry(registry)
    if name in entries:
        return spec_from_entry(name, entries[name], data_root)
    local = Path(name).expanduser()
    if not local.is_absolute() and not local.exists():
        local = data_dir(data_root) / local
    if local.exists():
        path = str(local.resolve())
        fmt = format or detect_source_format(path, columns or {}, split)
        return DatasetSpec(
            name=name, file=path, format=fmt, columns=columns or {}, split=split, format_guessed=not format
        )
    if local.is_symlink() or Path(name).expanduser().is_symlink():  # to a missing target
        raise ConfigError(_no_such_path(name, data_dir(data_root)))
    lf_entry = llamafactory.find(name, data_dir(data_root))
    if lf_entry is not None:
        return DatasetSpec(name=name, **lf_entry)
    known = [*entries, *llamafactory.entry_names(data_dir(data_root))]
    close = difflib.get_close_matches(name, known, n=3)
    # A bare word close to a registry name is a typo more likely than a legacy hub id like "squad".
    if looks_like_hub_id(name) and ("/" in name or not close):
        return DatasetSpec(name=name, hub_id=name, format=format, columns=columns or {}, split=split)
    if not looks_like_hub_id(name) and (os.sep in name or name.lower().endswith(EXTENSIONS)):
        raise ConfigError(_no_such_path(name, data_dir(data_root)))
    raise ConfigError(
        f"dataset {name!r} is neither a registry entry, a local file or folder, nor a hub id"
        + (f"; did you mean {', '.join(close)}?" if close else f"; registry entries: {', '.join(entries)}")
    )


def _no_such_path(name: str, root: Path) -> str:
    """Why local path `name` (looked up in the current directory, then in the data dir `root`) is not
    there: a broken symlink, or a missing file, with the close names in its folder."""
    given = Path(name).expanduser()
    places = [given] if given.is_absolute() else [given, root / given]
    link = next((p for p in places if p.is_symlink()), None)
    if link is not None:
        return (
            f"{name!r} is a symlink pointing to a missing target ({os.readlink(link)}); "
            "fix the link, or give the data's real path"
        )
    close: list[str] = []
    for place in places:
        folder = place.parent
        if folder.is_dir():
            names = [p.name for p in folder.iterdir() if not p.name.startswith(".") and p.exists()]
            matches = difflib.get_close_matches(place.name, names, n=3, cutoff=0.8)
            close += [str(Path(name).parent / match) for match in matches]
    if any(c in given.name for c in "*?["):  # a pattern the shell left alone (quoted), or no shell at all
        return (
            f"no such file or folder {name!r}: gym does not expand wildcards; give the folder that holds "
            "the files (all of them are read), or list them separated by commas"
        )
    guess = f"; did you mean {', '.join(repr(c) for c in dict.fromkeys(close))}?" if close else ""
    if given.is_absolute():  # looked up there only: where relative paths are looked up is beside the point
        return f"no such file or folder {name!r}{guess}"
    return (
        f"no such file or folder {name!r}{guess} (relative paths are looked up in the current directory, "
        f"then in the data dir {root}: set it with --dataset_dir, data_root= in Python, or $GYM_DATA_DIR)"
    )
