"""Read MMLU, C-Eval or CMMLU questions from their original layouts, checked before any model loads.

    load_benchmark("mmlu", "/data/mmlu")            # a folder, a .zip, or a hub dataset id

Accepted layouts (EVAL.md), in a folder or a zip, at any depth (e.g. `data/` inside mmlu.zip):
the original CSVs (`<split>/<subject>_<split>.csv`, or `<split>/<subject>.csv` for CMMLU),
the hub's parquet files (`<subject>/<split>-*.parquet`) and a `datasets` save_to_disk copy of them
(`<subject>/<split>/data-*.arrow`). A hub id is downloaded with huggingface_hub and read the same
way; a path starting with `/`, `./`, `../` or `~` is always local. Subject names and categories come
from a mapping.json beside the data (or inside the zip), else from the copy gym ships. Every error
names the file, the record and what to do; nothing is loaded or logged before the whole benchmark
has been read.
"""

from __future__ import annotations

import csv
import difflib
import io
import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, DataError
from gym.eval.benchmarks import (
    BENCHMARKS,
    LETTERS,
    BenchmarkSpec,
    SubjectInfo,
    get_spec,
    load_mapping,
    parse_mapping,
)


@dataclass(frozen=True)
class Question:
    question: str
    choices: tuple[str, str, str, str]
    answer: int  # 0..3


@dataclass
class SubjectData:
    info: SubjectInfo
    shots: list[Question]  # the first examples of the few-shot split (lm-eval's first_n sampler)
    questions: list[Question]
    pool: list[Question] = field(default_factory=list)  # the whole few-shot split
    files: list[str] = field(default_factory=list)


@dataclass
class BenchmarkData:
    spec: BenchmarkSpec
    source: str
    subjects: list[SubjectData]

    @property
    def n_questions(self) -> int:
        return sum(len(s.questions) for s in self.subjects)

    def digest(self) -> str:
        """What was asked: each subject's name in the prompts, its few-shot examples and its questions
        (text, choices, answer). Two scores compare only when this is equal (gym.lineage.setup_of):
        other subjects, or other questions of the same count, are another measurement."""
        from dataclasses import asdict

        from gym.hashing import hash_obj

        return hash_obj(
            [
                [s.info.key, s.info.name, [asdict(q) for q in s.shots], [asdict(q) for q in s.questions]]
                for s in sorted(self.subjects, key=lambda s: s.info.key)  # the set: --subjects b a is a b
            ],
            length=12,
        )


TABLE_SUFFIXES = (".csv", ".parquet", ".arrow")
# The hub's layouts, as a subject's file name pattern (glob) and a regex matching it.
HUB_LAYOUTS = {
    ".parquet": ("{subject}/{split}-*.parquet", r"(?P<subject>[^/]+)/(?P<split>[a-z]+)-[^/]*\.parquet"),
    ".arrow": (  # `datasets` save_to_disk of a subject's splits (load_from_disk reads the same)
        "{subject}/{split}/data-*.arrow",
        r"(?P<subject>[^/]+)/(?P<split>[a-z]+)/data-[^/]*\.arrow",
    ),
}


class _Tree:
    """Files of a folder or a zip as relative POSIX paths."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            self.zip = zipfile.ZipFile(root) if root.is_file() else None
        except (zipfile.BadZipFile, OSError) as exc:  # cut short, or not a zip at all
            raise DataError(
                f"not a readable zip file ({exc}): download it again, or give the folder it unpacks to",
                file=str(root),
            ) from None
        if self.zip is not None:
            self.files = [n for n in self.zip.namelist() if not n.endswith("/")]
        else:
            self.files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    def read(self, rel: str) -> bytes:
        if self.zip is not None:
            try:
                return self.zip.read(rel)
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:  # a damaged member
                raise DataError(
                    f"damaged in the zip ({exc}): download the zip again", file=self.show(rel)
                ) from None
        return (self.root / rel).read_bytes()

    def show(self, rel: str) -> str:
        return f"{self.root}!{rel}" if self.zip is not None else str(self.root / rel)


def load_benchmark(
    benchmark: str,
    data_dir: str | Path | None = None,
    *,
    subjects: Sequence[str] | None = None,
    limit: int | None = None,
    shots: int = 5,
    mapping: str | Path | None = None,
) -> BenchmarkData:
    """Read and check every requested subject: `shots` examples from the few-shot split and (the
    first `limit` of) the scored split's questions. `data_dir` None reads the benchmark's hub id."""
    spec = get_spec(benchmark)
    if not 0 <= shots <= 5:
        raise ConfigError(f"shots must be between 0 and 5, got {shots}")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1 question per subject, got {limit}")
    root = _local_root(spec, data_dir)
    tree = _Tree(root)
    table, mapped = _mapping(spec, root, tree, mapping)
    zips = [f for f in tree.files if f.endswith(".zip")]
    if tree.zip is None and len(zips) == 1 and not any(f.endswith(TABLE_SUFFIXES) for f in tree.files):
        tree = _Tree(root / zips[0])  # a folder holding the zip and its mapping.json (shared/data/eval/mmlu)
    chosen = list(table) if not subjects else list(subjects)
    unknown = [s for s in chosen if s not in table]
    if unknown:
        close = [m for s in unknown for m in difflib.get_close_matches(s, list(table), n=1)]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        source = f" in mapping file {mapping}" if mapping is not None else ""
        raise ConfigError(
            f"unknown {spec.name} subject(s) {', '.join(unknown)}{source}{hint}; known: {', '.join(table)}"
        )
    files = _layout(spec, tree, table, every=not subjects)
    out = []
    for key in chosen:
        split_rows = {}
        for split in spec.splits:
            rel = files.get((key, split))
            if rel is None:
                raise _missing(spec, tree, files, key, split, mapped)
            split_rows[split] = _read_split(spec, tree, rel)
        few, scored = split_rows[spec.fewshot_split], split_rows[spec.scored_split]
        if len(few) < shots:
            rel = files[(key, spec.fewshot_split)]
            raise DataError(
                f"{shots}-shot needs {shots} examples, the file has {len(few)}: score with --shots "
                f"{len(few)} or fewer (flows: --benchmark_options.shots), or add examples to the file",
                file=tree.show(rel),
            )
        if not scored:
            raise DataError("no questions", file=tree.show(files[(key, spec.scored_split)]))
        out.append(
            SubjectData(
                info=table[key],
                shots=few[:shots],
                questions=scored[:limit] if limit else scored,
                pool=few,
                files=[tree.show(files[(key, s)]) for s in spec.splits],
            )
        )
    return BenchmarkData(spec=spec, source=str(root), subjects=out)


def _local_root(spec: BenchmarkSpec, data_dir: str | Path | None) -> Path:
    target = str(data_dir) if data_dir is not None else spec.hub_id
    local = Path(target).expanduser()
    if local.exists():
        return local
    if data_dir is not None and not _hub_id_like(data_dir):
        raise _does_not_exist(spec, target)
    return _download(spec, target)


def _hub_id_like(data_dir: str | Path) -> bool:
    """`owner/name`: one `/`, not a path written as one (absolute, or starting with ./ ../ ~)."""
    text = str(data_dir)
    if isinstance(data_dir, Path) or Path(text).is_absolute() or text.startswith((".", "~")):
        return False
    return text.count("/") == 1


def _does_not_exist(spec: BenchmarkSpec, target: str) -> ConfigError:
    return ConfigError(f"{spec.name} data {target} does not exist (a folder, a .zip or a hub dataset id)")


def _download(spec: BenchmarkSpec, repo_id: str) -> Path:
    import os

    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    per_subject = " and ".join(spec.file_name("<subject>", s) for s in spec.splits)
    give = (
        f"give the files ({per_subject} per subject) as a folder or .zip: --data-dir DIR (gym eval) or "
        f"{spec.name}=DIR (--benchmarks)"
    )
    try:  # offline (HF_HUB_OFFLINE=1), a copy downloaded earlier is found in the hub cache
        return Path(
            snapshot_download(
                repo_id,
                repo_type="dataset",
                allow_patterns=["*.csv", "*.parquet", "*.arrow", "*.zip", "*.json"],
            )
        )
    except HFValidationError:  # not a valid repo id either (`a b/c`)
        raise _does_not_exist(spec, repo_id) from None
    except LocalEntryNotFoundError as exc:
        cause = exc.__cause__
        if isinstance(cause, OfflineModeIsEnabled) or (cause is None and constants.HF_HUB_OFFLINE):
            value = os.environ.get("HF_HUB_OFFLINE")
            why = f"offline mode is on (HF_HUB_OFFLINE={value})" if value else "offline mode is on"
            retry = f"unset HF_HUB_OFFLINE to download {repo_id}"
        else:
            why = "the hub could not be reached" + (f" ({_first_line(cause)})" if cause is not None else "")
            retry = f"run again where huggingface.co can be reached to download {repo_id}"
        raise ConfigError(
            f"{spec.name}: {repo_id} is not a local folder nor in the hub cache, and {why}: {give}, "
            f"or {retry}"
        ) from None
    except RepositoryNotFoundError as exc:  # online: no such dataset, or one that is private or gated
        if not isinstance(exc, GatedRepoError):
            raise _does_not_exist(spec, repo_id) from None
        failed: HfHubHTTPError = exc
    except HfHubHTTPError as exc:  # unauthorized, the hub down
        failed = exc
    raise ConfigError(
        f"{spec.name}: hub dataset {repo_id} could not be downloaded ({_first_line(failed)}): {give}, or "
        "log in (hf auth login) if it is gated"
    ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _mapping(
    spec: BenchmarkSpec, root: Path, tree: _Tree, explicit: str | Path | None
) -> tuple[dict[str, SubjectInfo], bool]:
    """An explicit mapping file, else mapping.json beside the data or inside the zip, else gym's copy;
    and whether it was one of the first three (False: gym's copy)."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"mapping file {path} does not exist")
        return load_mapping(spec, path), True
    beside = (root if root.is_dir() else root.parent) / "mapping.json"
    if beside.is_file():
        return load_mapping(spec, beside), True
    if tree.zip is not None and "mapping.json" in tree.files:
        return parse_mapping(tree.read("mapping.json").decode("utf-8"), tree.show("mapping.json")), True
    return load_mapping(spec), False


def _layout(
    spec: BenchmarkSpec, tree: _Tree, table: dict[str, SubjectInfo], every: bool = True
) -> dict[tuple[str, str], str]:
    """(subject, split) -> file, for the CSV layout, the hub's parquet layout or its save_to_disk copy.
    `every`: all the mapping's subjects are scored, so files of a subject it lacks are an error (a
    mapping that misses one); with chosen subjects they are left alone."""
    pattern = re.escape(spec.file_pattern).replace(r"\{split\}", "(?P<split>[a-z]+)", 1)
    pattern = pattern.replace(r"\{split\}", "(?P=split)").replace(r"\{subject\}", r"(?P<subject>[^/]+?)")
    regexes = [pattern, *(regex for _, regex in HUB_LAYOUTS.values())]
    for regex in (re.compile(rf"(?P<prefix>(?:.*/)?){r}") for r in regexes):
        found: dict[str, dict[tuple[str, str], str]] = {}
        for rel in tree.files:
            m = regex.fullmatch(rel)
            if m and m["split"] in spec.splits:
                files = found.setdefault(m["prefix"], {})
                key = (m["subject"], m["split"])
                if key in files:  # a split sharded over several files: one of them was read, silently
                    raise DataError(
                        f"subject {key[0]!r}: its {key[1]} split is in several files ({files[key]}, {rel}); "
                        "gym reads one file per split: join them into one (e.g. datasets' to_parquet)",
                        file=tree.show(rel),
                    )
                files[key] = rel
        if found:
            prefix = max(found, key=lambda p: len(found[p]))  # the folder holding most of them
            files = found[prefix]
            if not {s for s, _ in files} & set(table):
                continue  # file names of another layout (e.g. C-Eval's given as CMMLU)
            stray = sorted({s for s, _ in files} - set(table) - {"all", "auxiliary_train"})
            if stray and every:
                raise DataError(
                    f"subject {stray[0]!r} has no entry in the mapping (name and category): add it to "
                    "mapping.json or remove its files",
                    file=tree.show(next(r for (s, _), r in files.items() if s == stray[0])),
                )
            return files
    sample = ", ".join(tree.files[:3]) or "no files"
    example = spec.file_name("<subject>", spec.scored_split)
    hub = " or ".join(_file_name(spec, kind, "<subject>", spec.scored_split) for kind in HUB_LAYOUTS)
    raise DataError(
        f"not in a {spec.name} layout: expected {example} and {spec.file_name('<subject>', 'dev')} "
        f"(original CSVs), or {hub} (hub parquet, datasets save_to_disk); found {sample}",
        file=str(tree.root),
    )


def _file_name(spec: BenchmarkSpec, kind: str, subject: str, split: str) -> str:
    """A subject's file for one split, in the layout of files ending in `kind`."""
    if kind in HUB_LAYOUTS:
        return HUB_LAYOUTS[kind][0].format(subject=subject, split=split)
    return spec.file_name(subject, split)


def _missing(
    spec: BenchmarkSpec,
    tree: _Tree,
    files: dict[tuple[str, str], str],
    key: str,
    split: str,
    mapped: bool = False,
) -> DataError:
    (subject, part), rel = next(iter(files.items()))
    kind = next((k for k in HUB_LAYOUTS if rel.endswith(k)), ".csv")
    depth = _file_name(spec, kind, subject, part).count("/") + 1  # path parts of a subject's file
    prefix = rel.rsplit("/", depth)[0] + "/" if rel.count("/") >= depth else ""
    expected = prefix + _file_name(spec, kind, key, split)
    if not any(s == key for s, _ in files):
        present = sorted({s for s, _ in files})
        which = "the mapping" if mapped else f"gym's {spec.name} mapping (no mapping.json here)"
        have = f" ({', '.join(present)})" if len(present) <= 5 else ""
        return DataError(
            f"{which} names subject {key!r} but there are no files for it (expected {expected}): add its "
            f"files, score only the subjects there are with gym eval --subjects{have}, or put a "
            "mapping.json naming only those beside the data (a flow's way)",
            file=str(tree.root),
        )
    other = next(r for (s, _), r in files.items() if s == key)
    return DataError(f"missing {expected} (subject {key!r} has {other})", file=str(tree.root))


def _read_split(spec: BenchmarkSpec, tree: _Tree, rel: str) -> list[Question]:
    if rel.endswith((".parquet", ".arrow")):
        return _read_table(spec, tree, rel)
    shown = tree.show(rel)
    try:
        text = tree.read(rel).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=shown) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    columns = ["question", *LETTERS, "answer"]
    if spec.header is not None:
        header = next(reader, None)
        if header is None or tuple(header[: len(spec.header)]) != spec.header or len(header) > 8:
            raise DataError(
                f"header must be {','.join(spec.header)} (then optional columns), got {header}"
                f"{_other_benchmark(spec, header)}",
                file=shown,
                record=0,
            )
        columns = header
    index = {
        "question": columns.index(spec.question_col if spec.header else "question"),
        "answer": columns.index(spec.answer_col if spec.header else "answer"),
    }
    choice_at = [columns.index(c) for c in spec.choice_cols]
    out = []
    for number, row in enumerate(reader, start=1):
        if not row:  # a blank line (often the last one), skipped as lm-eval's CSV reader does
            continue
        if len(row) != len(columns):
            raise DataError(
                f"expected {len(columns)} columns ({','.join(columns)}), got {len(row)} "
                f"(line {reader.line_num}){_other_benchmark(spec, row) if number == 1 else ''}",
                file=shown,
                record=number,
            )
        answer = row[index["answer"]]
        if answer not in LETTERS:
            raise DataError(
                f"answer must be one of A, B, C, D, got {answer!r} (line {reader.line_num})",
                file=shown,
                record=number,
                field=spec.answer_col,
            )
        choices = (row[choice_at[0]], row[choice_at[1]], row[choice_at[2]], row[choice_at[3]])
        out.append(Question(row[index["question"]], choices, LETTERS.index(answer)))
    return out


def _other_benchmark(spec: BenchmarkSpec, first: list[str] | None) -> str:
    """A hint when a file's first row is another benchmark's: C-Eval and MMLU share a file layout."""
    if not first:
        return ""
    for other in BENCHMARKS.values():
        if other is spec:
            continue
        headed = other.header is not None and tuple(first[: len(other.header)]) == other.header
        headless = other.header is None and len(first) == 6 and first[-1] in LETTERS
        if headed or headless:
            return f"; the file looks like {other.name}'s: is the benchmark {other.name}?"
    return ""


def _read_table(spec: BenchmarkSpec, tree: _Tree, rel: str) -> list[Question]:
    """A hub parquet file or a save_to_disk arrow file (Arrow's IPC stream, as `datasets` writes it)."""
    import pyarrow as pa

    from gym.data.readers import parquet_file

    shown = tree.show(rel)
    kind = "parquet" if rel.endswith(".parquet") else "arrow"
    try:
        data = tree.read(rel)
        if kind == "parquet":
            table = parquet_file(data).read(use_threads=False)
        else:
            options = pa.ipc.IpcReadOptions(use_threads=False)
            table = pa.ipc.open_stream(pa.BufferReader(data), options=options).read_all()
        rows: list[dict[str, Any]] = table.to_pylist()
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise DataError(f"not a readable {kind} file ({exc})", file=shown) from None
    out = []
    for number, row in enumerate(rows, start=1):
        hub_mmlu = "choices" in row  # cais/mmlu: question, subject, choices[4], answer 0..3
        question = row.get("question" if hub_mmlu else spec.question_col)
        choices = row.get("choices") if hub_mmlu else [row.get(c) for c in spec.choice_cols]
        raw = row.get("answer" if hub_mmlu else spec.answer_col)
        if hub_mmlu:
            answer = raw if isinstance(raw, int) and 0 <= raw < 4 else None
        else:  # ceval-exam / cmmlu: the CSV columns, the answer a letter
            answer = LETTERS.index(raw) if raw in LETTERS else None
        if not isinstance(question, str) or not isinstance(choices, list) or len(choices) != 4:
            raise DataError("expected a question and four choices", file=shown, record=number)
        if not all(isinstance(c, str) for c in choices):
            raise DataError("choices must be text", file=shown, record=number)
        if answer is None:
            raise DataError(
                f"answer must be one of A, B, C, D (0-3), got {raw!r}",
                file=shown,
                record=number,
                field="answer" if hub_mmlu else spec.answer_col,
            )
        out.append(Question(question, (choices[0], choices[1], choices[2], choices[3]), answer))
    return out
