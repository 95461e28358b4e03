"""Generation evals on held-out data: exact match, BLEU and ROUGE through sacrebleu / rouge-score,
and a custom metric named by dotted path, checked before any model loads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.errors import ConfigError
from gym.eval.exact_match import evaluate
from gym.eval.generation import score
from gym.models import ModelRef, resolve


@pytest.fixture(autouse=True, scope="module")
def absl_leaves_pytest_streams_alone():
    """rouge-score imports absl, whose log handler keeps the stderr of that moment (here a pytest
    capture file) and closes it when logging is reconfigured, as Prefect does in later tests."""
    yield
    absl_logging = sys.modules.get("absl.logging")
    if absl_logging is not None:
        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__


def first_words(predictions, references):
    """A custom metric: share of predictions whose first word is the reference's."""
    pairs = list(zip(predictions, references, strict=True))
    return sum(p.split()[:1] == r.split()[:1] for p, r in pairs) / len(pairs)


def lengths(predictions, references):
    return {"pred_chars": sum(map(len, predictions)) / len(predictions), "ref_chars": 3.0}


def test_metrics_score_what_they_should():
    refs = ["the cat sat on the mat", "a dog barked loudly at night"]
    same = score(["exact_match", "bleu", "rouge"], refs, refs)
    assert same["exact_match"] == 1.0 and same["bleu"] == pytest.approx(100.0)
    assert same["rouge1"] == same["rouge2"] == same["rougeL"] == pytest.approx(1.0)
    near = score(["exact_match", "bleu", "rouge"], ["the cat sat on a mat", "a dog barked at night"], refs)
    assert near["exact_match"] == 0.0 and 0 < near["bleu"] < 100 and 0.5 < near["rouge1"] < 1
    far = score(["bleu", "rouge"], ["zebra", "quantum"], refs)
    assert far["bleu"] < 1 and far["rougeL"] == 0.0
    custom = score(
        ["tests.test_eval_generation:first_words", "tests.test_eval_generation.lengths"],
        ["the dog", "b"],
        refs,
    )
    assert custom == {"first_words": 0.5, "pred_chars": 4.0, "ref_chars": 3.0}


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ("blue", "unknown metric 'blue'"),
        ("no_such_pkg.metrics:f1", "cannot import module 'no_such_pkg.metrics'"),
        ("tests.test_eval_generation:missing", "has no function 'missing'"),
    ],
)
def test_bad_metric_names_fail_before_the_model_loads(metric, message, tmp_path):
    data = ingest(resolve_dataset("demo_sft_eval"))
    ghost = ModelRef(name="ghost", path=str(tmp_path / "none"), template="chatml", digest="x", base_model="x")
    with pytest.raises(ConfigError, match=message):
        evaluate(ghost, Path(data.path), metrics=["exact_match", metric])


def test_generation_eval_reports_every_metric_on_held_out_data():
    data = ingest(resolve_dataset("demo_sft_eval"))
    metrics = ["bleu", "rouge", "tests.test_eval_generation:first_words"]
    result = evaluate(resolve("gym-tiny"), Path(data.path), limit=8, max_new_tokens=8, metrics=metrics)
    assert result.n == 8 and set(result.scores) == {
        "exact_match",
        "bleu",
        "rouge1",
        "rouge2",
        "rougeL",
        "first_words",
    }
    preds = [s["prediction"] for s in result.samples]
    refs = [s["reference"] for s in result.samples]
    assert result.scores["first_words"] == first_words(preds, refs)
    assert result.exact_match == result.scores["exact_match"]


def test_held_out_prompts_open_with_the_training_datas_default_system():
    data = ingest(resolve_dataset("demo_sft_eval"))
    said = "Answer in one word."
    plain, given = (
        evaluate(resolve("gym-tiny"), Path(data.path), limit=2, max_new_tokens=2, system=system)
        for system in (None, said)
    )
    assert all(s["prompt"].startswith(f"<|im_start|>system\n{said}<|im_end|>") for s in given.samples)
    assert not any(said in s["prompt"] for s in plain.samples)


def test_answers_run_as_long_as_the_longest_reference(gym_home, tmp_path):
    """Answers were cut at 32 new tokens: a longer reference could never be matched, and BLEU and ROUGE
    scored the cut answers."""
    import json

    from gym.eval.exact_match import ANSWER_ROOM
    from gym.models import load_tokenizer

    long_answer = " ".join(f"step {i} done" for i in range(25))
    rows = [{"instruction": f"Count {i}", "output": long_answer if i == 0 else "ok"} for i in range(3)]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = ingest(resolve_dataset(str(tmp_path / "long.jsonl")))
    model = resolve("gym-tiny")
    tokens = load_tokenizer(model)
    longest = len(tokens(long_answer, add_special_tokens=False)["input_ids"])
    answers = {
        budget: [s["prediction"] for s in evaluate(model, Path(data.path), max_new_tokens=budget).samples]
        for budget in (None, 32, longest + ANSWER_ROOM)
    }
    assert longest > 32
    assert answers[None] == answers[longest + ANSWER_ROOM], "by default: the longest reference and some room"
    assert len(answers[None][0]) > len(answers[32][0])  # the untrained model never stops: the budget shows


def test_the_training_summary_carries_every_held_out_metric_before_and_after():
    """Only exact match reached it; BLEU and ROUGE were in the nested MLflow runs and the tags alone."""
    from gym.eval.exact_match import ExactMatch
    from gym.summary import summarize
    from gym.train.common import TrainResult

    stage = TrainResult(
        method="sft", digest="d", stage_dir="s", model_dir="m", global_step=1, losses=[(1, 2.0)],
        trainable_params=1, total_params=1,
    )  # fmt: skip
    before, after = (
        ExactMatch(exact_match=e, n=2, samples=[], scores={"exact_match": e, "bleu": b, "rougeL": r})
        for e, b, r in ((0.0, 1.5, 0.1), (0.5, 40.0, 0.6))
    )
    out = summarize({"sft": stage}, before, after, {"name": "x", "version": "1"}, "run", "m", None)
    assert (out["exact_match_before"], out["exact_match_after"]) == (0.0, 0.5)
    assert (out["bleu_before"], out["bleu_after"], out["rougeL_before"], out["rougeL_after"]) == (
        1.5,
        40.0,
        0.1,
        0.6,
    )
