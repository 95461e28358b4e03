"""Reading MMLU / C-Eval / CMMLU files: layouts, the shipped subject tables, and bad input caught
before any model loads, with the file, record and field named."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from gym.errors import ConfigError, DataError
from gym.eval.benchmarks import BENCHMARKS, CATEGORIES, load_mapping
from gym.eval.mc_data import load_benchmark
from gym.eval.mc_prompt import description
from gym.eval.multiple_choice import MCSettings, evaluate_benchmark
from gym.eval.suite import BenchmarkOptions, check_benchmarks
from gym.models import ModelRef
from tests.eval_fixtures import SUBJECTS, write_benchmark

REAL_MMLU = Path("/work/shared/data/eval/mmlu")


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_folder_and_zip_read_the_same_questions(benchmark, tmp_path):
    folder = load_benchmark(benchmark, write_benchmark(benchmark, tmp_path / "dir"))
    zipped = load_benchmark(benchmark, write_benchmark(benchmark, tmp_path / "zip", as_zip=True))
    assert [s.info.key for s in folder.subjects] == list(SUBJECTS[benchmark])
    assert folder.n_questions == 12 and all(len(s.shots) == 5 for s in folder.subjects)
    for a, b in zip(folder.subjects, zipped.subjects, strict=True):
        assert a.questions == b.questions and a.shots == b.shots
    # Cells come through as written: padding, quotes, newlines, numbers, NA and None stay text.
    cells = {c for s in folder.subjects for q in [*s.shots, *s.questions] for c in q.choices}
    assert {"1.50", "NA", "None", "  padded  ", 'a "quoted", comma', "two\nlines"} & cells


def test_the_digest_names_what_was_asked_not_only_how_many(tmp_path):
    """Two scores over as many questions compare only when they asked the same ones (gym.lineage)."""
    data = write_benchmark("mmlu", tmp_path / "a")
    whole = load_benchmark("mmlu", data, shots=1)
    assert whole.digest() == load_benchmark("mmlu", write_benchmark("mmlu", tmp_path / "b"), shots=1).digest()
    one, other = (load_benchmark("mmlu", data, subjects=[s], limit=6, shots=1) for s in SUBJECTS["mmlu"])
    first_three = load_benchmark("mmlu", data, limit=3, shots=1)
    assert one.n_questions == other.n_questions == 6 == first_three.n_questions
    assert len({whole.digest(), one.digest(), other.digest(), first_three.digest()}) == 4
    assert load_benchmark("mmlu", data, shots=2).digest() != whole.digest()  # other few-shot examples
    both = [
        load_benchmark("mmlu", data, subjects=order, shots=1)
        for order in (SUBJECTS["mmlu"], SUBJECTS["mmlu"][::-1])
    ]
    assert both[0].digest() == both[1].digest() == whole.digest()  # the same set, asked in another order
    reseeded = load_benchmark("mmlu", write_benchmark("mmlu", tmp_path / "c", seed=1), shots=1)
    assert reseeded.n_questions == whole.n_questions and reseeded.digest() != whole.digest()


def test_hub_parquet_layout_reads_like_the_csvs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    original = load_benchmark("mmlu", write_benchmark("mmlu", tmp_path / "csv"))
    hub = tmp_path / "hub"
    for subject in original.subjects:
        for split, rows in (("dev", subject.pool), ("test", subject.questions)):
            table = pa.Table.from_pylist(
                [
                    {
                        "question": q.question,
                        "subject": subject.info.key,
                        "choices": list(q.choices),
                        "answer": q.answer,
                    }
                    for q in rows
                ]
            )
            (hub / subject.info.key).mkdir(parents=True, exist_ok=True)
            pq.write_table(table, hub / subject.info.key / f"{split}-00000-of-00001.parquet")
    (hub / "mapping.json").write_text((tmp_path / "csv" / "mapping.json").read_text())
    read = load_benchmark("mmlu", hub)
    assert [s.questions for s in read.subjects] == [s.questions for s in original.subjects]


def test_shipped_subject_tables_match_lm_evals_task_descriptions():
    from gym.eval.lm_eval_tasks import subject_yaml

    for spec in BENCHMARKS.values():
        table = load_mapping(spec)
        assert len(table) == {"mmlu": 57, "ceval": 52, "cmmlu": 67}[spec.name]
        assert {s.category for s in table.values()} == set(CATEGORIES)
        for key, info in table.items():
            subject = type("S", (), {"info": info})
            assert description(spec, subject) == subject_yaml(spec, key)["description"], key


@pytest.mark.skipif(not REAL_MMLU.is_dir(), reason="the real MMLU is not on this machine")
def test_reads_the_real_mmlu_zip_with_its_mapping():
    data = load_benchmark("mmlu", REAL_MMLU)
    assert len(data.subjects) == 57 and data.n_questions == 14042
    assert all(len(s.shots) == 5 for s in data.subjects)


def _edit_csv(path: Path, line: int, new: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[line] = new
    path.write_text("".join(lines), encoding="utf-8")


def _append(path: Path, row: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(row)


def test_missing_subject_file_is_named(tmp_path):
    root = write_benchmark("mmlu", tmp_path)
    (root / "data/dev/high_school_biology_dev.csv").unlink()
    with pytest.raises(DataError, match=r"missing data/dev/high_school_biology_dev\.csv"):
        load_benchmark("mmlu", root)


def test_malformed_row_names_file_and_record(tmp_path):
    root = write_benchmark("ceval", tmp_path)
    _append(root / "val/accountant_val.csv", "7,only,three\n")
    with pytest.raises(DataError, match=r"accountant_val\.csv, record 7: expected 8 columns .*got 3"):
        load_benchmark("ceval", root)


def test_blank_lines_are_skipped_as_lm_eval_does(tmp_path):
    root = write_benchmark("mmlu", tmp_path)
    before = load_benchmark("mmlu", root).n_questions
    _append(root / "data/test/abstract_algebra_test.csv", "\n\r\n")
    assert load_benchmark("mmlu", root).n_questions == before
    # A line of empty cells is not blank: still a malformed record.
    _append(root / "data/test/abstract_algebra_test.csv", ",,\n")
    with pytest.raises(DataError, match=r"abstract_algebra_test\.csv, record \d+: expected 6 columns"):
        load_benchmark("mmlu", root)


def test_answer_outside_a_to_d_names_file_record_and_field(tmp_path):
    root = write_benchmark("cmmlu", tmp_path)
    _append(root / "test/arts.csv", "6,What is art?,a,b,c,d,E\n")
    with pytest.raises(
        DataError, match=r"arts\.csv, record 7, field 'Answer': answer must be one of A, B, C, D"
    ):
        load_benchmark("cmmlu", root)


def test_mapping_naming_a_subject_without_files(tmp_path):
    root = write_benchmark("mmlu", tmp_path)
    mapping = json.loads((root / "mapping.json").read_text())
    mapping["anatomy"] = {"name": "anatomy", "category": "STEM"}
    (root / "mapping.json").write_text(json.dumps(mapping))
    with pytest.raises(DataError, match="names subject 'anatomy' but there are no files"):
        load_benchmark("mmlu", root)


def test_files_of_a_subject_missing_from_the_mapping(tmp_path):
    root = write_benchmark("mmlu", tmp_path)
    mapping = json.loads((root / "mapping.json").read_text())
    del mapping["abstract_algebra"]
    (root / "mapping.json").write_text(json.dumps(mapping))
    with pytest.raises(DataError, match="'abstract_algebra' has no entry in the mapping"):
        load_benchmark("mmlu", root)


def test_wrong_layout_says_what_was_expected(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    (root / "abstract_algebra_test.csv").write_text("q,a,b,c,d,A\n")
    with pytest.raises(DataError, match=r"not in a mmlu layout: expected test/<subject>_test\.csv"):
        load_benchmark("mmlu", root)
    # A C-Eval folder handed over as CMMLU: its files don't fit CMMLU's names.
    with pytest.raises(DataError, match="not in a cmmlu layout"):
        load_benchmark("cmmlu", write_benchmark("ceval", tmp_path / "ceval"))


def test_mmlu_and_ceval_share_a_layout_the_error_names_the_other(tmp_path):
    with pytest.raises(DataError, match=r"header must be id,.*looks like mmlu's: is the benchmark mmlu\?"):
        load_benchmark("ceval", write_benchmark("mmlu", tmp_path / "mmlu"))
    with pytest.raises(DataError, match=r"record 1: expected 6 columns .*is the benchmark ceval\?"):
        load_benchmark("mmlu", write_benchmark("ceval", tmp_path / "ceval"))


def test_bad_header_and_too_few_shots(tmp_path):
    root = write_benchmark("ceval", tmp_path, n_dev=3)
    with pytest.raises(
        DataError, match="5-shot needs 5 examples, the file has 3: score with --shots 3 or fewer"
    ):
        load_benchmark("ceval", root)
    assert load_benchmark("ceval", root, shots=3).subjects[0].shots
    _edit_csv(root / "dev/accountant_dev.csv", 0, "id,q,A,B,C,D,answer\n")
    with pytest.raises(DataError, match=r"accountant_dev\.csv, record 0: header must be id,question"):
        load_benchmark("ceval", root, shots=3)


def test_zip_error_names_the_member(tmp_path):
    root = write_benchmark("mmlu", tmp_path / "tree")
    _append(root / "data/test/abstract_algebra_test.csv", "q,a,b,c,d,F\n")
    path = tmp_path / "mmlu.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for file in root.rglob("*.csv"):
            zf.write(file, file.relative_to(root).as_posix())
    with pytest.raises(DataError, match=r"mmlu\.zip!data/test/abstract_algebra_test\.csv, record 7"):
        load_benchmark("mmlu", path)


def test_unknown_names_and_offline_hub(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown benchmark 'mmmlu'"):
        load_benchmark("mmmlu", tmp_path)
    with pytest.raises(ConfigError, match="unknown mmlu subject") as e:
        load_benchmark("mmlu", write_benchmark("mmlu", tmp_path), subjects=["astrology"])
    assert "did you mean" not in str(e.value)
    with pytest.raises(ConfigError, match=r"highschool_biology \(did you mean high_school_biology\?\)"):
        load_benchmark("mmlu", write_benchmark("mmlu", tmp_path), subjects=["highschool_biology"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"HF_HUB_OFFLINE=1.*\(dev/<subject>\.csv and test/<subject>\.csv per"
    ):
        load_benchmark("cmmlu")  # haonan-li/cmmlu from the hub


def test_two_entries_reported_under_one_name_are_refused(tmp_path):
    """Both were scored, the second's score, run, tags and artifacts replacing the first's."""
    data = write_benchmark("mmlu", tmp_path)
    with pytest.raises(ConfigError, match=r"'mmlu=.*' and 'mmlu' would both be reported as 'mmlu'"):
        check_benchmarks([f"mmlu={data}", "mmlu"], BenchmarkOptions())
    with pytest.raises(ConfigError, match="would both be reported as 'mmlu'"):
        check_benchmarks([f"mmlu={data}", "lm-eval:mmlu"], BenchmarkOptions())


def test_bad_data_fails_before_the_model_is_loaded(tmp_path):
    root = write_benchmark("mmlu", tmp_path)
    _edit_csv(root / "data/test/abstract_algebra_test.csv", 0, "q,a,b,c,d,Z\n")
    # The model folder doesn't exist: loading it would raise a ConfigError. The data error comes first.
    ghost = ModelRef(
        name="ghost", path=str(tmp_path / "no-model"), template="chatml", digest="x", base_model="x"
    )
    with pytest.raises(DataError, match="record 1"):
        evaluate_benchmark(ghost, MCSettings(data_dir=str(root), progress=False))
