"""The experience block reaches the system message, the same way wherever the model runs: training,
serving (tests/test_serve_engine.py) and evaluation (generation evals, MMLU-style multiple choice in
both prompt styles)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from gym.errors import DataError
from gym.models import derived, load_tokenizer, resolve
from gym.templates import render
from gym.tfgrpo.injection import (
    EXPERIENCE_FILE,
    HEADER,
    experience_block,
    inject,
    load_shipped,
    shipped_library,
)
from gym.tfgrpo.library import Library
from gym.tfgrpo.ops import Add, apply
from tests.eval_fixtures import write_benchmark


def test_inject_appends_to_an_existing_system_message_without_touching_the_input():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    out = inject(messages, ["When adding, carry tens."])
    assert (
        out[0]["content"].startswith("Be brief.\n\n")
        and "[G0]. When adding, carry tens." in out[0]["content"]
    )
    assert messages[0]["content"] == "Be brief." and out[1] == messages[1]


def test_inject_adds_a_system_message_and_is_a_no_op_without_experiences():
    messages = [{"role": "user", "content": "hi"}]
    assert inject(messages, None) == messages and inject(messages, []) == messages
    out = inject(messages, ["a", "b"])
    assert out[0]["role"] == "system" and "[G1]. b" in out[0]["content"] and out[1:] == messages


def test_load_shipped_reads_the_library_in_order(tmp_path):
    assert load_shipped(tmp_path) is None
    (tmp_path / EXPERIENCE_FILE).write_text(
        json.dumps({"items": [{"id": "e2", "text": "x"}, {"id": "e1", "text": "y"}]})
    )
    assert load_shipped(tmp_path) == ["x", "y"]


def test_a_malformed_shipped_library_is_a_data_error_naming_the_file(tmp_path):
    (tmp_path / EXPERIENCE_FILE).write_text('{"items": [{"id": "e1"}]}')
    with pytest.raises(DataError, match=f"{EXPERIENCE_FILE}.*unreadable experience library"):
        load_shipped(tmp_path)


# ---- evaluation injects the shipped library, as training and serving do ------------------------------

RULES = ["When adding, carry tens.", "When unsure, answer with one word."]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> SimpleNamespace:
    """gym-tiny as it is, and a copy shipping a two-experience library (what a TF-GRPO run ships)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(tmp_path_factory.mktemp("home")))
        plain = resolve("gym-tiny")
    folder = tmp_path_factory.mktemp("shipped") / "model"
    shutil.copytree(plain.path, folder)
    library = apply(Library(), [Add(text=t) for t in RULES]).library
    library.save(folder / EXPERIENCE_FILE)
    return SimpleNamespace(plain=plain, shipped=derived(plain, folder, "shipped"), library=library)


def test_shipped_library_carries_its_hash_and_version(models):
    shipped = shipped_library(models.shipped.path)
    assert shipped is not None and shipped.texts == RULES
    assert shipped.record() == {"hash": models.library.content_hash(), "version": 1, "size": 2}
    assert shipped_library(models.plain.path) is None


def test_generation_eval_renders_the_prompt_with_the_library_injected(models, tmp_path):
    from datasets import load_from_disk

    from gym.data.ingest import ingest
    from gym.data.registry import resolve_dataset
    from gym.eval.exact_match import evaluate

    data = Path(ingest(resolve_dataset("demo_sft_eval")).path)
    plain = evaluate(models.plain, data, limit=2, max_new_tokens=2)
    shipped = evaluate(models.shipped, data, limit=2, max_new_tokens=2)
    tokenizer = load_tokenizer(models.plain)
    for rec, a, b in zip(
        load_from_disk(str(data)).select(range(2)), plain.samples, shipped.samples, strict=True
    ):
        question = rec["messages"][:-1]
        assert a["prompt"] == render(tokenizer, question, models.plain.template, add_generation_prompt=True)
        assert b["prompt"] == render(
            tokenizer, inject(question, RULES), models.plain.template, add_generation_prompt=True
        )
        assert experience_block(RULES) in b["prompt"] and HEADER not in a["prompt"]
    assert plain.experiences is None and shipped.experiences == {
        "hash": models.library.content_hash(),
        "version": 1,
        "size": 2,
    }


@pytest.mark.parametrize("style", ["lm-eval", "chat"])
def test_multiple_choice_prompts_inject_the_library_and_still_score(models, style, tmp_path):
    from lm_eval.api.utils import maybe_delimit

    from gym.eval.mc_data import load_benchmark
    from gym.eval.mc_prompt import Encoder, chat_messages, text_context
    from gym.eval.multiple_choice import MCSettings, build_requests, evaluate_benchmark

    root = write_benchmark("mmlu", tmp_path / "mmlu", n_questions=2, n_dev=1)
    settings = MCSettings(data_dir=str(root), shots=1, limit=2, style=style, progress=False)
    data = load_benchmark("mmlu", str(root), limit=2, shots=1)
    tokenizer = load_tokenizer(models.plain)
    subject, q = data.subjects[0], data.subjects[0].questions[0]
    chat = lambda msgs: render(tokenizer, msgs, models.plain.template, add_generation_prompt=True)  # noqa: E731
    context = Encoder(tokenizer, render_chat=chat, experiences=RULES).context(data.spec, subject, q, style)
    if style == "chat":  # the system message (the subject's description) gets the block appended
        assert context == chat(inject(chat_messages(data.spec, subject, q), RULES))
    else:  # first, as lm-eval's --system_instruction: lm-eval's own joining gives the same text
        description = data.spec.description.format(name=subject.info.name)
        assert context == maybe_delimit(experience_block(RULES), description, "\n\n") + text_context(
            data.spec, subject, q
        ).removeprefix(description)

    plain_requests, _ = build_requests(data, tokenizer, models.plain, settings)
    shipped_requests, _ = build_requests(data, tokenizer, models.shipped, settings)
    block = tokenizer.decode(tokenizer.encode(experience_block(RULES), add_special_tokens=False))
    assert all(block in tokenizer.decode(r.tokens) for r in shipped_requests)
    assert not any(HEADER in tokenizer.decode(r.tokens) for r in plain_requests)

    result = evaluate_benchmark(models.shipped, settings)
    assert result.n_questions == len(data.subjects) * 2 and 0.0 <= result.overall <= 1.0
    assert result.experiences == {"hash": models.library.content_hash(), "version": 1, "size": 2}
    assert result.summary()["experiences"] == result.experiences
    assert result.notes[0].startswith("the model's TF-GRPO experience library (2 experiences, version 1")


def test_gym_and_lm_eval_pick_the_same_answers_with_the_library_injected(tmp_path):
    """The plain-style prompt with the block first is lm-eval's with `system_instruction`: gym's evaluator
    and lm-eval through the bridge (which passes the block so) choose alike, question by question."""
    pytest.importorskip("lm_eval")
    from gym.eval.lm_eval_tasks import run_on_local_files
    from gym.eval.multiple_choice import MCSettings, evaluate_benchmark
    from tests.eval_fixtures import varied_tiny

    folder = varied_tiny(tmp_path / "varied")  # gym-tiny whose choice varies with the prompt
    apply(Library(), [Add(text=t) for t in RULES]).library.save(folder / EXPERIENCE_FILE)
    shipped = resolve(str(folder), template="chatml")
    root = write_benchmark("mmlu", tmp_path / "mmlu", n_questions=4, n_dev=1)
    settings = MCSettings(data_dir=str(root), shots=1, batch_size=4, progress=False)
    ours, theirs = evaluate_benchmark(shipped, settings), run_on_local_files(shipped, settings)
    assert ours.predictions == theirs.predictions and ours.n_questions == theirs.n_questions == 8
    record = {
        "hash": apply(Library(), [Add(text=t) for t in RULES]).library.content_hash(),
        "version": 1,
        "size": 2,
    }
    assert ours.experiences == theirs.experiences == record
