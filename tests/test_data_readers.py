"""Readers: every file type, folders, saved datasets, hub ids offline, and unreadable input.

Run: .venv/bin/pytest tests/test_data_readers.py
"""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gym.data import readers
from gym.data.readers import looks_like_hub_id, read_source
from gym.errors import DataError

DATA = Path(__file__).parent / "fixtures" / "data"


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))


def rows(source: str | Path, **kw) -> list[tuple[str, int, dict]]:
    return list(read_source(source, **kw))


def alpaca_table() -> pa.Table:
    records = json.loads((DATA / "alpaca.json").read_text(encoding="utf-8"))
    return pa.Table.from_pylist(
        [{k: r.get(k, "") for k in ("instruction", "input", "output")} for r in records]
    )


def test_json_array_and_json_lines_agree():
    array = rows(DATA / "alpaca.json")
    lines = rows(DATA / "alpaca.jsonl")
    assert [r for _, _, r in array] == [r for _, _, r in lines]
    assert [n for _, n, _ in lines] == [1, 2, 3]  # blank lines are not records
    assert array[1][2]["instruction"] == "把下面的句子翻译成英文。"


def test_json_lines_in_a_json_file():
    got = rows(DATA / "alpaca_lines.json")
    assert [n for _, n, _ in got] == [1, 2]
    assert got[1][2]["input"] == "你好，世界"


def test_csv_reads_text():
    got = rows(DATA / "alpaca.csv")
    assert got[0][2] == {"instruction": "Add the numbers.", "input": "2 3", "output": "5"}
    assert got[1][2]["output"] == "Hello, world"  # quoted comma


def test_parquet(tmp_path: Path):
    pq.write_table(alpaca_table(), tmp_path / "a.parquet", row_group_size=2)
    got = rows(tmp_path / "a.parquet")
    assert [n for _, n, _ in got] == [1, 2, 3]
    assert got[1][2]["input"] == "你好，世界"


@pytest.mark.parametrize("writer", [pa.ipc.new_file, pa.ipc.new_stream])
def test_arrow_file_and_stream(tmp_path: Path, writer):
    table = alpaca_table()
    with pa.OSFile(str(tmp_path / "a.arrow"), "wb") as sink, writer(sink, table.schema) as w:
        w.write_table(table)
    assert [r for _, _, r in rows(tmp_path / "a.arrow")] == table.to_pylist()


def test_reading_parquet_and_arrow_starts_no_thread(tmp_path: Path):
    # Arrow's reader threads outlive a read and now and then abort the process at exit (exit -6,
    # apache/arrow#34314), so gym's readers must not start any. Counted in a fresh process, after
    # pyarrow's import has started its own allocator thread; a path or memory-map source starts 1-2.
    table = pa.Table.from_pylist([{"text": f"row {i}"} for i in range(3000)])
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=1000)
    for name, writer in (("file.arrow", pa.ipc.new_file), ("stream.arrow", pa.ipc.new_stream)):
        with pa.OSFile(str(tmp_path / name), "wb") as sink, writer(sink, table.schema) as w:
            w.write_table(table)
    script = (
        "import os, sys\nfrom gym.data.readers import read_source\n"
        "threads = lambda: len(os.listdir('/proc/self/task'))\n"
        "for path in sys.argv[1:]:\n"
        "    before = threads()\n"
        "    print(path, len(list(read_source(path))), threads() - before)\n"
    )
    names = ("a.parquet", "file.arrow", "stream.arrow")
    proc = subprocess.run(
        [sys.executable, "-c", script, *(str(tmp_path / n) for n in names)],
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [part for n in names for part in (str(tmp_path / n), "3000", "0")]


def test_save_to_disk_folder_and_dataset_dict(tmp_path: Path):
    table = alpaca_table()
    datasets.Dataset(table).save_to_disk(str(tmp_path / "one"))
    assert [r for _, _, r in rows(tmp_path / "one")] == table.to_pylist()
    dd = datasets.DatasetDict({"train": datasets.Dataset(table), "test": datasets.Dataset(table.slice(0, 1))})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert len(rows(tmp_path / "dict", split="test")) == 1
    with pytest.raises(DataError, match="split 'validation' not found"):
        rows(tmp_path / "dict", split="validation")


def test_folder_reads_files_in_order():
    got = rows(DATA / "alpaca_folder")
    assert [(Path(f).name, n) for f, n, _ in got] == [("part-0.jsonl", 1), ("part-1.jsonl", 1)]


def test_folder_with_mixed_types_is_rejected(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "b.csv").write_text("x\n1\n")
    with pytest.raises(DataError, match="mixes file types"):
        rows(tmp_path)


def test_data_files_in_a_subfolder_are_refused_not_left_out(tmp_path: Path):
    """A folder's subfolders were skipped silently: 3 of 6 records read."""
    (tmp_path / "a.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text('{"instruction": "c", "output": "d"}\n')
    with pytest.raises(DataError, match=r"data files in subfolders \(sub/b.jsonl\), which gym does not read"):
        rows(tmp_path)
    (tmp_path / "sub" / "b.jsonl").rename(tmp_path / "sub" / "notes.md")  # no data file there: fine
    assert len(rows(tmp_path)) == 1


def test_a_json_array_in_a_jsonl_file_says_to_name_it_json(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    path.write_text('[{"instruction": "a", "output": "b"}]\n')
    with pytest.raises(
        DataError, match=r"record 1: expected a JSON object per record, got list.*name it \.json"
    ):
        rows(path)
    (tmp_path / "records.json").write_text(path.read_text())
    assert len(rows(tmp_path / "records.json")) == 1


def test_unparsable_json_line_names_file_and_line():
    with pytest.raises(DataError) as e:
        rows(DATA / "bad" / "bad_line.jsonl")
    assert e.value.record == 3 and e.value.file.endswith("bad_line.jsonl")
    assert "line 3 is not valid JSON" in str(e.value)


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        (
            "a.jsonl",
            b'{"instruction": "a", "output": "b"}\n{"instruction": "caf\xe9", "output": "x"}\n',
            "line 2, byte 21 is 0xe9",
        ),
        (
            "a.json",
            b'[{"instruction": "a", "output": "b"},\n {"instruction": "caf\xe9"}]',
            "line 2, byte 22 is 0xe9",
        ),
        ("a.csv", b"\xef\xbb\xbfinstruction,output\na,b\ncaf\xe9,x\n", "line 3, byte 4 is 0xe9"),
        ("a.txt", b"fine\n\xff\n", "line 2, byte 1 is 0xff"),
        ("a.jsonl", '{"instruction": "a", "output": "b"}\n'.encode("utf-16"), "UTF-16 text, not UTF-8"),
    ],
)
def test_a_file_that_is_not_utf8_names_the_file_line_and_byte(tmp_path: Path, name, content, says):
    """It was a UnicodeDecodeError traceback naming neither the file nor where."""
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=says) as e:
        rows(tmp_path / name)
    assert e.value.file == str(tmp_path / name) and "-t UTF-8" in str(e.value)


def test_broken_json_array_names_line(tmp_path: Path):
    (tmp_path / "a.json").write_text('[{"a": 1},\n{"a": 2,,}]')
    with pytest.raises(DataError, match="line 2"):
        rows(tmp_path / "a.json")


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("a.parquet", b"", "not a readable parquet file"),
        ("a.parquet", b'{"a": 1}\n', "not a readable parquet file"),  # JSON Lines named .parquet
        ("a.arrow", b"PAR1 not arrow", "not a readable Arrow IPC file"),
    ],
)
def test_an_unreadable_parquet_or_arrow_file_names_the_file(tmp_path: Path, name, content, says):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=says) as e:
        rows(tmp_path / name)
    assert e.value.file == str(tmp_path / name)


def test_non_object_record(tmp_path: Path):
    (tmp_path / "a.json").write_text('[{"a": 1}, [1, 2]]')
    with pytest.raises(DataError) as e:
        rows(tmp_path / "a.json")
    assert e.value.record == 2


def test_unsupported_extension_and_missing_path(tmp_path: Path):
    (tmp_path / "a.docx").write_text("hello")
    with pytest.raises(DataError, match="unsupported file type"):
        rows(tmp_path / "a.docx")
    with pytest.raises(DataError, match="no such file"):
        rows(tmp_path / "missing.jsonl")


def test_hub_id_offline_fails_fast_with_clear_message(monkeypatch: pytest.MonkeyPatch):
    # "Fast" means no network attempt (no retries, no timeouts to wait out): any lookup is recorded.
    lookups: list[object] = []
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        lookups.append(host)
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(DataError) as e:
        rows("gym-test-org/no-such-dataset")
    assert lookups == []
    assert "gym-test-org/no-such-dataset" in str(e.value) and "HF_HUB_OFFLINE" in str(e.value)
    assert "dataset_info.json" not in str(e.value)
    # A bare name (LLaMA-Factory's `identity`) is a hub id only because nothing else has it: say so.
    with pytest.raises(DataError) as e:
        rows("identity")
    assert "'identity' was read as a hub id" in str(e.value) and "set dataset_dir" in str(e.value)


def test_hub_id_detection(tmp_path: Path):
    assert looks_like_hub_id("tatsu-lab/alpaca") and looks_like_hub_id("squad")
    assert not looks_like_hub_id("data/train.jsonl") and not looks_like_hub_id("a/b/c")
    assert not looks_like_hub_id(str(DATA / "alpaca_folder"))


def test_single_pretty_printed_object_is_not_taken_for_records(tmp_path: Path):
    (tmp_path / "a.json").write_text('{\n  "train": [{"instruction": "a", "output": "b"}]\n}\n')
    with pytest.raises(DataError, match="single JSON object"):
        rows(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('{"instruction": "a", "output": "b"}\n')
    assert rows(tmp_path / "b.json")[0][2] == {"instruction": "a", "output": "b"}


def test_truncated_json_line_points_at_its_end(tmp_path: Path):
    """A line cut short is reported where it ends, not at column 1 of the next line."""
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n{"a": 2, "b": "x"\r\n{"a": 3}\n')
    with pytest.raises(DataError) as e:
        rows(tmp_path / "a.jsonl")
    assert e.value.record == 2
    expected = "line 2 is not valid JSON (column 18: Expecting ',' delimiter, the line ends before its object"
    assert expected in str(e.value)


def test_bad_json_inside_a_line_names_its_column(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text('{"a": 1}\n{"a": tru, "b": 2}\n')
    with pytest.raises(DataError) as e:
        rows(tmp_path / "a.jsonl")
    assert "line 2 is not valid JSON (column 7: Expecting value)" in str(e.value)


def test_a_csv_field_over_csvs_default_limit_is_read(tmp_path: Path):
    """csv refuses fields over 131,072 characters by default: a `_csv.Error` traceback."""
    long = "x" * 200_000
    (tmp_path / "a.csv").write_text(f'instruction,output\nhi,"{long}"\n', encoding="utf-8")
    assert rows(tmp_path / "a.csv")[0][2] == {"instruction": "hi", "output": long}


def test_a_csv_error_names_the_file_record_and_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(readers, "CSV_FIELD_LIMIT", 12)
    limit = csv.field_size_limit(12)  # the one csv error a well-quoted file can still meet
    try:
        (tmp_path / "a.csv").write_text("instruction,output\na,b\n\nc,0123456789abc\n", encoding="utf-8")
        with pytest.raises(DataError, match="not valid CSV: field larger than field limit") as e:
            rows(tmp_path / "a.csv")
    finally:
        csv.field_size_limit(limit)
    assert e.value.file == str(tmp_path / "a.csv") and e.value.record == 2
    assert "record 2 (line 4)" in str(e.value) and "quotes" in str(e.value)


def test_a_nul_byte_in_a_csv_value_is_refused_as_in_json(tmp_path: Path):
    (tmp_path / "a.csv").write_text("instruction,output\nhi,a\x00b\n", encoding="utf-8")
    with pytest.raises(DataError, match="NUL byte") as e:
        rows(tmp_path / "a.csv")
    assert e.value.file == str(tmp_path / "a.csv") and e.value.record == 1 and e.value.field == "output"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("a.jsonl", '{"instruction": "a\\ud800b", "output": "c"}\n'),
        ("a.json", '[{"instruction": "ok", "output": "c"}, {"instruction": "x", "output": ["\\udc00"]}]'),
    ],
)
def test_a_lone_surrogate_names_the_file_record_and_field(tmp_path: Path, name: str, content: str):
    """json.loads reads `\\ud800` alone into a str that UTF-8 (so Arrow) cannot encode: a traceback."""
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="invalid Unicode: lone surrogate") as e:
        rows(tmp_path / name)
    assert e.value.file == str(tmp_path / name)
    assert (e.value.record, e.value.field) == ((1, "instruction") if name == "a.jsonl" else (2, "output"))


TOP = "given twice in the record"


@pytest.mark.parametrize(
    ("name", "content", "record", "field", "says"),
    [
        ("a.jsonl", '{"instruction": "a", "output": "first", "output": "second"}\n', 1, "output", TOP),
        ("a.json", '[{"instruction": "a", "output": "b"}, {"instruction": "a", "output": "b", '
         '"instruction": "c"}]', 2, "instruction", TOP),
        ("a.jsonl", '{"instruction": "a", "output": "b"}\n{"messages": [{"role": "user", "content": "x", '
         '"content": "y"}]}\n', 2, "messages", "key 'content' is given twice in one of its objects"),
    ],
)  # fmt: skip
def test_a_key_given_twice_in_a_record_names_it(tmp_path: Path, name, content, record, field, says):
    """json.loads keeps a repeated key's last value: the first answer of a record was dropped silently."""
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as e:
        rows(tmp_path / name)
    assert (e.value.file, e.value.record, e.value.field) == (str(tmp_path / name), record, field)
    assert str(e.value.message).startswith(f"{says}; only its last value would be read")


def test_a_surrogate_pair_is_one_character(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text('{"instruction": "\\ud83d\\ude00", "output": "c"}\n', encoding="utf-8")
    assert rows(tmp_path / "a.jsonl")[0][2]["instruction"] == "\U0001f600"


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("a.jsonl", '{"a": 1}\n\n\n[2]\n', "record 2 (line 4): expected a JSON object"),
        ("a.csv", 'instruction,output\na,b\n\n\n"c\nd",e,f\n', "record 2 (line 5): the row has more values"),
        ("a.jsonl", '{"a": 1}\n[2]\n', "record 2: expected a JSON object"),  # the same number: said once
    ],
)
def test_a_record_of_a_text_file_is_named_with_its_line(tmp_path: Path, name, content, says):
    """Blank lines, a csv header or line breaks in values made "record N" point elsewhere than line N."""
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as e:
        rows(tmp_path / name)
    assert e.value.record == 2 and says in str(e.value)


def test_text_file_records_know_their_line(tmp_path: Path):
    (tmp_path / "a.txt").write_text("one\n\n\ntwo\n", encoding="utf-8")
    assert [(n, n.line, r["text"]) for _, n, r in rows(tmp_path / "a.txt")] == [(1, 1, "one"), (2, 4, "two")]
