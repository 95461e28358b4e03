"""The evaluator's parts against lm-eval's own code: token ids per (context, choice), truncation,
and group aggregates weighted by question count."""

from __future__ import annotations

import logging

import pytest

from gym.eval.mc_data import load_benchmark
from gym.eval.mc_prompt import Encoder, chat_messages, text_context
from gym.eval.mc_score import requests_for
from gym.eval.results import weighted
from gym.models import load_tokenizer, resolve
from gym.templates import render
from tests.eval_fixtures import write_benchmark

pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def tiny():
    return resolve("gym-tiny")


def _with_bos(tokenizer):
    """gym-tiny's tokenizer made to prepend a BOS token, as Llama-style tokenizers do."""
    from tokenizers.processors import TemplateProcessing

    bos = "<|endoftext|>"
    tokenizer.bos_token = bos
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.convert_tokens_to_ids(bos))]
    )
    return tokenizer


@pytest.mark.parametrize("bos", [False, True])
def test_token_ids_equal_lm_evals_encode_pair(tiny, bos, tmp_path):
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    tokenizer = load_tokenizer(tiny)
    if bos:
        tokenizer = _with_bos(tokenizer)
    lm = HFLM(pretrained=AutoModelForCausalLM.from_pretrained(tiny.path), tokenizer=tokenizer, batch_size=1)
    encoder = Encoder(
        tokenizer, render_chat=lambda m: render(tokenizer, m, tiny.template, add_generation_prompt=True)
    )
    checked = 0
    for benchmark in ("mmlu", "cmmlu"):
        data = load_benchmark(benchmark, write_benchmark(benchmark, tmp_path / benchmark))
        for subject in data.subjects:
            for q in subject.questions:
                cases = [(text_context(data.spec, subject, q), " ", "lm-eval")]
                chat = lm.apply_chat_template(chat_messages(data.spec, subject, q))
                cases.append((chat, "", "chat"))
                if bos:  # a context that already starts with the BOS text: lm-eval adds no second one
                    cases.append((tokenizer.bos_token + cases[0][0], " ", None))
                for context, delimiter, style in cases:
                    expected = [lm._encode_pair(context, delimiter + letter) for letter in "ABCD"]
                    ours = (
                        encoder.question(data.spec, subject, q, style)
                        if style
                        else encoder.pair(context, [delimiter + letter for letter in "ABCD"])
                    )
                    assert all(ours.context == c for c, _ in expected)
                    assert list(ours.continuations) == [cont for _, cont in expected]
                    checked += 1
    assert checked >= 48 and encoder.whole_encodes == 0  # every choice came from the short window


def test_requests_truncate_on_the_left_like_lm_eval():
    context, conts = list(range(1, 21)), [[100], [101], [102], [103]]
    (request,) = requests_for(7, context, conts, max_length=8, group=0)
    assert request.tokens == (context + conts[0])[-9:][:-1] == context[-8:]
    assert request.truncated and request.n_scored == 1 and [c for c, _ in request.choices] == [0, 1, 2, 3]
    short = requests_for(7, context[:5], conts, max_length=8, group=0)[0]
    assert short.tokens == context[:5] and not short.truncated
    # Choices that differ before their last token can't share a pass: one request each.
    split = requests_for(7, context, [[5, 100], [6, 101], [5, 102], [5, 103]], max_length=32, group=0)
    assert [r.tokens[-1] for r in split] == [5, 6, 5, 5] and all(len(r.choices) == 1 for r in split)


def test_groups_weigh_subjects_by_question_count():
    correct, sizes = {"a": 1, "b": 30, "c": 5}, {"a": 10, "b": 40, "c": 10}
    groups = {"a": "STEM", "b": "STEM", "c": "Other"}
    assert weighted(correct, sizes, groups) == {"STEM": 31 / 50, "Other": 0.5}
    assert weighted(correct, sizes, dict.fromkeys(sizes, "all")) == {"all": 36 / 60}


def test_prompts_longer_than_the_tokenizers_limit_raise_no_indexing_errors_warning(tiny):
    """transformers warns that a too-long sequence "will result in indexing errors"; the evaluator cuts
    prompts to the window itself (and notes how many), so that warning only misled."""

    class Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    tokenizer = load_tokenizer(tiny)
    long = "word " * (tokenizer.model_max_length + 50)
    collect = Collect()
    library = logging.getLogger("transformers")
    library.addHandler(collect)
    try:
        encoded = Encoder(tokenizer).pair(long, [" A", " B"])
        by_encoder = list(collect.messages)
        tokenizer(long)  # the library's own call warns (once per tokenizer): the check can see it
    finally:
        library.removeHandler(collect)
    assert len(encoded.context) > tokenizer.model_max_length
    assert by_encoder == [], by_encoder
    assert len(collect.messages) == 1 and "indexing errors" in collect.messages[0], collect.messages
