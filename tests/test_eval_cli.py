"""`gym eval` through the console's own entry point: gym's evaluator, lm-eval on the same files,
any lm-eval task by name (here a task YAML of our own), and user errors as `error:` + exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flows.cli import main
from tests.eval_fixtures import write_benchmark

pytest.importorskip("lm_eval")


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_gym_eval_prints_a_table_and_one_json_line(tmp_path, capsys):
    data = write_benchmark("ceval", tmp_path / "ceval")
    argv = ["eval", "--model", "gym-tiny", "--benchmark", "ceval", "--data-dir", str(data), "--no-progress"]
    assert main([*argv, "--shots", "2", "--output", str(tmp_path / "r.json"), "--json"]) == 0
    out = capsys.readouterr().out
    summary = last_json(out)
    assert {"benchmark", "overall", "categories", "subjects", "n_questions", "seconds"} <= set(summary)
    assert summary["benchmark"] == "ceval" and summary["n_questions"] == 12 and summary["shots"] == 2
    assert set(summary["subjects"]) == {"accountant", "college_physics"}
    assert set(summary["categories"]) == {"Other", "STEM"}  # the mapping's categories of those two
    assert "accountant" in out.split("\n{")[0]  # the table comes first
    full = json.loads((tmp_path / "r.json").read_text())
    assert [len(p) for p in full["predictions"].values()] == [6, 6]

    # The flows' form of the same benchmark, NAME=DATA: the same run.
    short = ["eval", "--model", "gym-tiny", "--benchmark", f"ceval={data}", "--no-progress", "--shots", "2"]
    assert main([*short, "--json"]) == 0
    assert {k: v for k, v in last_json(capsys.readouterr().out).items() if k != "seconds"} == {
        k: v for k, v in summary.items() if k != "seconds"
    }

    # lm-eval itself on the same files, through the same command: the same scores.
    assert main([*argv, "--shots", "2", "--engine", "lm-eval", "--json"]) == 0
    theirs = last_json(capsys.readouterr().out)
    assert theirs["engine"] == "lm-eval"
    assert theirs["subjects"] == summary["subjects"] and theirs["overall"] == summary["overall"]
    # The result says which prompt it scored: lm-eval's plain text unless asked for the chat template.
    assert summary["style"] == theirs["style"] == "lm-eval"
    assert main([*argv, "--shots", "2", "--style", "chat", "--json"]) == 0
    assert last_json(capsys.readouterr().out)["style"] == "chat"


TOY_TASK = """
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def _toy_tasks(folder: Path) -> Path:
    folder.mkdir()
    rows = [
        {"question": f"which colour is number {i}", "choices": ["red", "green", "blue"], "answer": i % 3}
        for i in range(7)
    ]
    for name, part in (("toy_a", rows[:4]), ("toy_b", rows[4:])):
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in part))
        (folder / f"{name}.yaml").write_text(TOY_TASK.format(name=name, data=data))
    group = "group: toy\ntask: [toy_a, toy_b]\n"
    group += "aggregate_metric_list:\n  - {metric: acc, weight_by_size: true}\n"
    (folder / "toy.yaml").write_text(group)
    return folder


def test_any_lm_eval_task_by_name_in_the_same_result_format(tmp_path, capsys):
    tasks = _toy_tasks(tmp_path / "tasks")
    argv = ["eval", "--model", "gym-tiny", "--lm-eval-task", "toy", "--include-path", str(tasks)]
    assert main([*argv, "--output", str(tmp_path / "r.json"), "--json"]) == 0
    summary = last_json(capsys.readouterr().out)
    assert summary["engine"] == "lm-eval" and summary["benchmark"] == "toy" and summary["n_questions"] == 7
    assert set(summary["subjects"]) == {"toy_a", "toy_b"} and set(summary["categories"]) == {"toy"}
    full = json.loads((tmp_path / "r.json").read_text())
    # The reported accuracy is the share of predictions that hit the answer, weighted by size.
    for name, gold in (("toy_a", [0, 1, 2, 0]), ("toy_b", [1, 2, 0])):
        hits = [p == g for p, g in zip(full["predictions"][name], gold, strict=True)]
        assert summary["subjects"][name] == sum(hits) / len(hits)
    assert summary["overall"] == pytest.approx(
        (summary["subjects"]["toy_a"] * 4 + summary["subjects"]["toy_b"] * 3) / 7
    )
    # What was asked, from the hashes lm-eval logs per document: what promotion compares setups by.
    assert re.fullmatch("[0-9a-f]{12}", summary["questions_digest"]) and full["questions_digest"]
    other = tmp_path / "other"
    _toy_tasks(other)
    (other / "toy_b.jsonl").write_text((other / "toy_b.jsonl").read_text().replace("colour", "color", 1))
    argv = ["eval", "--model", "gym-tiny", "--lm-eval-task", "toy", "--include-path", str(other), "--json"]
    assert main(argv) == 0
    assert last_json(capsys.readouterr().out)["questions_digest"] != summary["questions_digest"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--benchmark", "mmlu", "--data-dir", "{bad}"], "record 7, field 'answer'"),
        (["--benchmark", "mmlu", "--data-dir", "{good}", "--shots", "9"], "--shots"),
        (["--benchmark", "mmlu", "--data-dir", "{good}", "--subjects", "astrology"], "unknown mmlu subject"),
        (["--lm-eval-task", "toy", "--include-path", "{good}/nowhere"], "is not a folder"),
        (["--benchmark", "mmlu", "--data-dir", "{good}", "--device", "cuda:3"], "no CUDA GPU"),
        # each was accepted: a window of 0 or fewer tokens, flags that do nothing for what was asked, and
        # an --output folder that failed after the whole evaluation
        (["--benchmark", "mmlu", "--data-dir", "{good}", "--max-length", "0"], "greater than or equal to 1"),
        (
            ["--lm-eval-task", "toy", "--subjects", "x", "--mapping", "m.json"],
            "--subjects and --mapping choose",
        ),
        (["--lm-eval-task", "toy", "--engine", "gym"], "--engine gym scores --benchmark only"),
        (
            ["--benchmark", "mmlu", "--data-dir", "{good}", "--include-path", "{good}"],
            "--include-path indexes",
        ),
        (["--benchmark", "mmlu", "--data-dir", "{good}", "--output", "{good}"], "name a JSON file"),
    ],
)
def test_user_errors_end_with_error_and_status_2(tmp_path, capsys, extra, message):
    good = write_benchmark("mmlu", tmp_path / "good")
    bad = write_benchmark("mmlu", tmp_path / "bad")
    with (bad / "data/test/abstract_algebra_test.csv").open("a") as fh:
        fh.write("q,a,b,c,d,E\n")
    args = [a.format(good=good, bad=bad) for a in extra]
    assert main(["eval", "--model", "gym-tiny", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "gym_home" / "models").exists()  # failed before resolving (building) the model


@pytest.mark.parametrize(
    ("benchmark", "extra", "message"),
    [
        ("mmmlu", [], "invalid choice: 'mmmlu' (choose from mmlu, ceval, cmmlu, optionally as NAME=DATA)"),
        ("mmlu=", [], "--benchmark mmlu=: name the data after '='"),
        ("mmlu=a", ["--data-dir", "b"], "--benchmark mmlu=a and --data-dir b name two data sources"),
    ],
)
def test_a_benchmark_and_its_data_are_checked_as_arguments(capsys, benchmark, extra, message):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--model", "gym-tiny", "--benchmark", benchmark, *extra])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_mlflow_model_version_scores_like_the_model_it_registered(tmp_path, capsys):
    from gym import tracking
    from gym.models import resolve

    base = resolve("gym-tiny")
    run_id = tracking.start_run("register")
    tracking.register_model(
        run_id, Path(base.path), "tiny-eval", {"template": "chatml", "base_model": "gym-tiny"}
    )
    data = write_benchmark("mmlu", tmp_path / "mmlu")
    argv = ["eval", "--benchmark", "mmlu", "--data-dir", str(data), "--shots", "1", "--no-progress", "--json"]
    assert main([*argv, "--model", "models:/tiny-eval@challenger"]) == 0
    registered = last_json(capsys.readouterr().out)
    assert main([*argv, "--model", "gym-tiny"]) == 0
    local = last_json(capsys.readouterr().out)
    assert registered["model"] == "models:/tiny-eval@challenger"
    assert registered["subjects"] == local["subjects"] and registered["n_questions"] == 12


def test_progress_in_a_log_file_is_lines_of_questions_not_a_redrawn_bar(tmp_path, capsys):
    """stderr to a file (CI, nohup): a line per quarter, counted in questions, no carriage returns."""
    data = write_benchmark("ceval", tmp_path / "ceval")
    assert (
        main(["eval", "--model", "gym-tiny", "--benchmark", "ceval", "--data-dir", str(data), "--shots", "2"])
        == 0
    )
    err = capsys.readouterr().err
    assert "\rceval" not in err and "ceval questions:" not in err  # tqdm's redrawn bar, before
    lines = [line for line in err.splitlines() if line.startswith("ceval:")]
    assert lines[0] == "ceval: 12 questions" and lines[-1].startswith("ceval: done, 12 questions in ")
    assert any(line.startswith("ceval: 50% (question 6/12)") for line in lines)


def test_lm_eval_requests_it_cannot_serve_are_one_error_line(tmp_path, capsys):
    """More shots than a task has examples, and a hub task offline, were lm-eval tracebacks."""
    from gym.errors import ConfigError
    from gym.eval.lm_eval_bridge import LmEvalSettings, _user_errors

    tasks = _toy_tasks(tmp_path / "tasks")
    argv = ["eval", "--model", "gym-tiny", "--lm-eval-task", "toy_a", "--include-path", str(tasks)]
    assert main([*argv, "--shots", "99", "--limit", "1"]) == 2
    err = capsys.readouterr().err  # after the model loaded: building gym-tiny may have drawn a progress bar
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: --shots 99: more few-shot examples than the task toy_a")
    assert "Traceback" not in err
    offline = LmEvalSettings(tasks=["arc_easy"])
    with pytest.raises(ConfigError, match="arc_easy: its data could not be fetched"), _user_errors(offline):
        raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (OfflineModeIsEnabled)")
    with pytest.raises(ValueError, match="something else"), _user_errors(LmEvalSettings(tasks=["t"])):
        raise ValueError("something else")


def test_a_subject_named_twice_is_scored_once():
    from gym.eval.multiple_choice import MCSettings

    assert MCSettings(subjects=["anatomy", "virology", "anatomy"]).subjects == ["anatomy", "virology"]
