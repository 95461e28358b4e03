"""gym's MMLU / C-Eval / CMMLU evaluator against lm-eval itself, question by question.

lm-eval runs its own `mmlu_*`, `ceval-valid_*` and `cmmlu_*` task YAMLs, pointed at fixture files
the test writes in the original layouts (gym/eval/lm_eval_tasks.py), with `log_samples`; gym reads
the same files. For every question both pick the same answer, and their four log-likelihoods agree
to float rounding (1e-5): the same forward pass, in batches of another shape (lm-eval's own
numbers move by ~1e-6 when its batch size changes), with or without gym's prompt-prefix cache.
The model is gym-tiny with its answer letters' rows redrawn so that its choice varies with the
prompt (tests/eval_fixtures.py `varied_tiny`); both tools load the same directory.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from gym.eval.mc_data import load_benchmark
from gym.eval.mc_score import Scorer
from gym.eval.multiple_choice import MCSettings, build_requests, evaluate_benchmark
from gym.models import load_model, load_tokenizer, resolve
from tests.eval_fixtures import lm_eval_samples, varied_tiny, write_benchmark

pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return resolve(str(varied_tiny(tmp_path_factory.mktemp("varied-tiny"))), template="chatml")


@pytest.fixture(scope="module")
def lm(tiny):
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    return HFLM(pretrained=tiny.path, batch_size=4, device="cpu")


CASES = [("mmlu", 0), ("mmlu", 5), ("ceval", 0), ("ceval", 5), ("cmmlu", 0), ("cmmlu", 5)]


@pytest.mark.parametrize(("benchmark", "shots"), CASES)
def test_gym_picks_the_answer_lm_eval_picks_for_every_question(benchmark, shots, tiny, lm, tmp_path):
    path = write_benchmark(benchmark, tmp_path / benchmark, as_zip=benchmark == "cmmlu")
    data = load_benchmark(benchmark, path, shots=shots)
    reference = lm_eval_samples(lm, data, shots, tmp_path / "lm-eval")

    settings = MCSettings(benchmark=benchmark, data_dir=str(path), shots=shots, batch_size=3, progress=False)
    result = evaluate_benchmark(tiny, settings)
    for subject, lls in reference.items():
        expected = [int(np.argmax(q)) for q in lls]
        assert result.predictions[subject] == expected, subject
        gold = [q.answer for s in data.subjects if s.info.key == subject for q in s.questions]
        assert result.subjects[subject] == np.mean([p == g for p, g in zip(expected, gold, strict=True)])
    assert len({tuple(q) for lls in reference.values() for q in lls}) == data.n_questions  # prompts matter

    # The numbers behind the choices: the same log-likelihoods, with and without the prefix cache.
    tokenizer = load_tokenizer(tiny)
    requests, _ = build_requests(data, tokenizer, tiny, settings)
    model = load_model(tiny).eval()
    plain = Scorer(model, batch_size=5, prefix_cache=False).run(requests)
    cached_scorer = Scorer(model, batch_size=2, prefix_cache=True)
    cached = cached_scorer.run(requests)
    flat = [q for subject in data.subjects for q in reference[subject.info.key]]
    for key, expected_lls in enumerate(flat):
        assert np.allclose([plain[key][i] for i in range(4)], expected_lls, atol=1e-5, rtol=0)
        assert np.allclose([cached[key][i] for i in range(4)], expected_lls, atol=1e-5, rtol=0)
    if shots == 5:
        assert cached_scorer.cached > 0  # the prefix cache took part


def test_chat_style_matches_lm_eval_with_the_chat_template(tiny, lm, tmp_path):
    path = write_benchmark("mmlu", tmp_path / "mmlu")
    data = load_benchmark("mmlu", path, shots=3)
    reference = lm_eval_samples(lm, data, 3, tmp_path / "lm-eval", chat=True)
    settings = MCSettings(data_dir=str(path), shots=3, style="chat", progress=False)
    result = evaluate_benchmark(tiny, settings)
    for subject, lls in reference.items():
        assert result.predictions[subject] == [int(np.argmax(q)) for q in lls], subject


def test_a_mapping_that_adds_or_renames_subjects_keeps_the_engines_agreeing(tiny, lm, tmp_path):
    """A subject lm-eval has no task for crashed `--engine lm-eval` (FileNotFoundError on its YAML); a
    subject the mapping renamed got lm-eval's description there and gym's here: every prompt differed."""
    import json
    import shutil

    path = write_benchmark("cmmlu", tmp_path / "cmmlu")
    mapping = json.loads((path / "mapping.json").read_text(encoding="utf-8"))
    first, second = list(mapping)[:2]
    for split in ("dev", "test"):
        shutil.copy(path / split / f"{first}.csv", path / split / "my_subject.csv")
    mapping["my_subject"] = {"name": "我的科目", "category": "Other"}
    mapping[second]["name"] = "农业科学"
    (path / "mapping.json").write_text(json.dumps(mapping, ensure_ascii=False), encoding="utf-8")
    data = load_benchmark("cmmlu", path, shots=2)
    reference = lm_eval_samples(lm, data, 2, tmp_path / "lm-eval")
    assert set(reference) == set(mapping)

    settings = MCSettings(benchmark="cmmlu", data_dir=str(path), shots=2, batch_size=3, progress=False)
    requests, _ = build_requests(data, load_tokenizer(tiny), tiny, settings)
    scored = Scorer(load_model(tiny).eval(), batch_size=5, prefix_cache=False).run(requests)
    flat = [q for subject in data.subjects for q in reference[subject.info.key]]
    for key, expected_lls in enumerate(flat):  # the same prompts: the same log-likelihoods
        assert np.allclose([scored[key][i] for i in range(4)], expected_lls, atol=1e-5, rtol=0), key
