"""A TF-GRPO model shipped with `retrieval_top_k` injects, wherever it runs (generation and multiple-choice
evals, the serving engine and its HTTP API), only the experiences most similar to each question, as its
training did; a library shipped without the setting still injects all of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from gym.errors import ConfigError, DataError
from gym.models import derived, load_tokenizer, resolve
from gym.templates import render
from gym.tfgrpo.injection import (
    EXPERIENCE_FILE,
    experience_block,
    inject,
    inject_text,
    shipped_json,
    shipped_library,
)
from gym.tfgrpo.library import Library
from gym.tfgrpo.ops import Add, apply
from tests.eval_fixtures import write_benchmark

ADD = "When adding two numbers, carry the tens digit."
CAPITAL = "When asked for a country's capital city, name the city."
ARITHMETIC_Q = "What is 17 + 25?"
CAPITAL_Q = "What is the capital city of France?"


def library_of(*texts: str) -> Library:
    return apply(Library(), [Add(text=t) for t in texts]).library


def ship(folder: Path, library: Library, k: int | None) -> Path:
    (folder / EXPERIENCE_FILE).write_text(shipped_json(library.to_json(), k), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> SimpleNamespace:
    """gym-tiny, and copies shipping [ADD, CAPITAL] with retrieval_top_k=1 and without the key."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(tmp_path_factory.mktemp("home")))
        plain = resolve("gym-tiny")
    library = library_of(ADD, CAPITAL)
    top1 = tmp_path_factory.mktemp("top1") / "model"
    every = tmp_path_factory.mktemp("every") / "model"
    for folder, k in ((top1, 1), (every, None)):
        shutil.copytree(plain.path, folder)
        ship(folder, library, k)
    return SimpleNamespace(
        plain=plain,
        top1=derived(plain, top1, "top1"),
        every=derived(plain, every, "every"),
        library=library,
    )


def test_the_shipped_file_records_k_and_picks_the_related_experience(models, tmp_path):
    top1 = shipped_library(models.top1.path)
    assert top1 is not None and top1.retrieval_top_k == 1 and top1.retrieves
    assert top1.texts_for(ARITHMETIC_Q) == [ADD] and top1.texts_for(CAPITAL_Q) == [CAPITAL]
    assert top1.record()["retrieval_top_k"] == 1 and "most similar to each question" in top1.note()
    # The library inside is unchanged: same hash, and it still loads as a library (to train on from it).
    assert Library.load(Path(models.top1.path) / EXPERIENCE_FILE) == models.library
    assert json.loads((Path(models.top1.path) / EXPERIENCE_FILE).read_text())["hash"] == top1.hash

    every = shipped_library(models.every.path)
    assert every is not None and every.retrieval_top_k is None and not every.retrieves
    assert every.texts_for(ARITHMETIC_Q) == [ADD, CAPITAL] and "retrieval_top_k" not in every.record()
    # k no smaller than the library: everything, as in training.
    wide = shipped_library(ship(tmp_path, models.library, 2))
    assert wide is not None and not wide.retrieves and wide.texts_for(CAPITAL_Q) == [ADD, CAPITAL]

    (tmp_path / EXPERIENCE_FILE).write_text(json.dumps({"items": [], "retrieval_top_k": 0}))
    with pytest.raises(DataError, match="retrieval_top_k must be a positive integer"):
        shipped_library(tmp_path)


def test_experience_manager_export_records_k(tmp_path):
    from gym.train.grpo.experience_manager import ExperienceManager

    manager = ExperienceManager()
    manager.library = library_of(ADD, CAPITAL)
    manager.export(tmp_path, retrieval_top_k=1)
    assert shipped_library(tmp_path).retrieval_top_k == 1  # type: ignore[union-attr]


def test_a_shipped_run_records_its_retrieval_top_k(tmp_path):
    from gym.tfgrpo.config import TfGrpoSettings
    from gym.train.tf_grpo import ship as ship_run

    library = library_of(ADD, CAPITAL)
    library_file = library.save(tmp_path / "library.json")
    result = SimpleNamespace(library_hash=library.content_hash(), library_file=str(library_file))
    for k, tag in ((1, "a"), (None, "b")):
        run = SimpleNamespace(config_hash=tag * 16, settings=TfGrpoSettings(retrieval_top_k=k), model="m")
        shipped = shipped_library(ship_run(run, result, None))  # type: ignore[arg-type]
        assert shipped is not None and shipped.retrieval_top_k == k and shipped.hash == library.content_hash()


def test_generation_eval_injects_each_example_its_own_experience(models, tmp_path):
    from datasets import Dataset

    from gym.eval.exact_match import evaluate

    records = [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
        for q, a in ((ARITHMETIC_Q, "42"), (CAPITAL_Q, "Paris"))
    ]
    Dataset.from_list(records).save_to_disk(str(tmp_path / "data"))
    tokenizer = load_tokenizer(models.plain)

    def prompt(question: str, texts: list[str]) -> str:
        messages = inject([{"role": "user", "content": question}], texts)
        return str(render(tokenizer, messages, models.plain.template, add_generation_prompt=True))

    top1 = evaluate(models.top1, tmp_path / "data", max_new_tokens=1)
    assert [s["prompt"] for s in top1.samples] == [prompt(ARITHMETIC_Q, [ADD]), prompt(CAPITAL_Q, [CAPITAL])]
    assert top1.experiences is not None and top1.experiences["retrieval_top_k"] == 1
    every = evaluate(models.every, tmp_path / "data", max_new_tokens=1)
    assert [s["prompt"] for s in every.samples] == [
        prompt(ARITHMETIC_Q, [ADD, CAPITAL]),
        prompt(CAPITAL_Q, [ADD, CAPITAL]),
    ]


@pytest.mark.parametrize("style", ["lm-eval", "chat"])
def test_multiple_choice_injects_the_experience_related_to_each_question(models, style, tmp_path):
    from gym.eval.mc_data import load_benchmark
    from gym.eval.mc_prompt import Encoder, chat_messages, format_question, text_context
    from gym.eval.multiple_choice import MCSettings, build_requests

    root = write_benchmark("mmlu", tmp_path / "mmlu", n_questions=2, n_dev=1)
    data = load_benchmark("mmlu", str(root), limit=2, shots=1)
    subject, q = data.subjects[0], data.subjects[0].questions[0]
    related = f"Remember this question: {q.question.strip()}"
    folder = tmp_path / "model"
    shutil.copytree(models.plain.path, folder)
    ship(folder, library_of(CAPITAL, related), 1)
    shipped = shipped_library(folder)
    assert shipped is not None and shipped.texts_for(format_question(data.spec, q)) == [related]

    tokenizer = load_tokenizer(models.plain)
    chat = lambda msgs: render(tokenizer, msgs, models.plain.template, add_generation_prompt=True)  # noqa: E731
    context = Encoder(tokenizer, render_chat=chat, experiences=shipped).context(data.spec, subject, q, style)
    if style == "chat":
        assert context == chat(inject(chat_messages(data.spec, subject, q), [related]))
    else:
        assert context == inject_text(text_context(data.spec, subject, q), [related])

    settings = MCSettings(data_dir=str(root), shots=1, limit=2, style=style, progress=False)
    requests, _ = build_requests(data, tokenizer, derived(models.plain, folder, "mc"), settings)
    first = tokenizer.decode(next(r for r in requests if r.key == 0).tokens)
    assert related in first and CAPITAL not in first


def test_lm_eval_refuses_a_library_retrieved_per_question_before_loading(models):
    from gym.eval.lm_eval_bridge import LmEvalSettings, run_lm_eval

    with pytest.raises(ConfigError, match=r"retrieval_top_k=1.*single system instruction.*--engine gym"):
        run_lm_eval(models.top1, LmEvalSettings(tasks=["no_such_task_needed"]))


def test_serving_injects_each_request_its_own_experience(models):
    import openai

    from gym.serve.app import build_app
    from gym.serve.engine import Engine
    from gym.serve.server import serve_in_thread

    arithmetic = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": ARITHMETIC_Q}]
    capital = [{"role": "user", "content": CAPITAL_Q}]
    with Engine.load(models.top1.path) as engine, Engine.load(models.every.path) as every:
        assert experience_block([ADD]) in engine.render_chat(arithmetic)
        assert CAPITAL not in engine.render_chat(arithmetic) and ADD not in engine.render_chat(capital)
        assert experience_block([ADD, CAPITAL]) in every.render_chat(capital)
        raw = f"Question: {CAPITAL_Q}\nAnswer:"
        prefixed = engine.encode_text(inject_text("", [CAPITAL])) + engine.encode_text(raw)
        assert engine.encode_completion(raw, experiences=True) == prefixed
        assert engine.encode_completion(engine.encode_text(raw), experiences=True) == prefixed
        # where the caller's prompt begins (an echoed completion shows and scores it from there)
        assert engine.completion_ids(raw, experiences=True)[1] == len(prefixed) - len(engine.encode_text(raw))

        with serve_in_thread(build_app(engine, completion_experiences="prefix")) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            for messages, related in ((arithmetic, ADD), (capital, CAPITAL)):
                got = client.chat.completions.create(
                    model=engine.name,
                    messages=messages,
                    max_tokens=1,
                    temperature=0,  # type: ignore[arg-type]
                )
                expected = engine.encode_text(
                    str(
                        engine._encoder.apply_chat_template(
                            inject(messages, [related]),
                            chat_template=engine.chat_template,
                            add_generation_prompt=True,
                            tokenize=False,
                        )
                    )
                )
                assert got.usage is not None and got.usage.prompt_tokens == len(expected)
            got = client.completions.create(model=engine.name, prompt=raw, max_tokens=1, temperature=0)
            assert got.usage is not None and got.usage.prompt_tokens == len(prefixed)
