"""MMLU, C-Eval and CMMLU with gym's own evaluator: lm-eval's scores, question for question, faster.

    from gym.eval.multiple_choice import MCSettings, evaluate_benchmark
    evaluate_benchmark(resolve("gym-tiny"), MCSettings(benchmark="mmlu", data_dir="/data/mmlu"))

    gym eval --model gym-tiny --benchmark mmlu --data-dir /data/mmlu --limit 20 --json

Order of work: read and check every file (gym/eval/mc_data.py), load the tokenizer, build and
tokenize every prompt (gym/eval/mc_prompt.py), and only then load the model and score
(gym/eval/mc_score.py). Results per subject, per category and overall, each weighted by
question count as lm-eval's groups are. A TF-GRPO model's shipped experience library is injected
into every prompt (gym/eval/mc_prompt.py) and named in the result.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gym import attention
from gym.eval.mc_data import BenchmarkData, load_benchmark
from gym.eval.mc_prompt import Encoder, max_length
from gym.eval.mc_score import Request, Scorer, requests_for, resolve_device
from gym.eval.results import EvalResult, weighted
from gym.models import ModelRef, load_config, load_model, load_tokenizer
from gym.tfgrpo.injection import shipped_library

TIE = 1e-5  # log-likelihood gap below which float rounding decides


class MCSettings(BaseModel):
    """One multiple-choice benchmark run."""

    model_config = ConfigDict(extra="forbid")

    benchmark: Literal["mmlu", "ceval", "cmmlu"] = Field("mmlu", description="Which benchmark.")
    data_dir: str | None = Field(
        None, description="Folder, .zip or hub dataset id with the benchmark's files; default: its hub id."
    )
    subjects: list[str] | None = Field(None, description="Only these subjects (default: every subject).")
    shots: int = Field(5, ge=0, le=5, description="Few-shot examples from the dev split, in file order.")
    limit: int | None = Field(None, ge=1, description="Score only the first N questions of each subject.")
    batch_size: int = Field(16, ge=1, description="Questions per forward pass.")
    style: Literal["lm-eval", "chat"] = Field(
        "lm-eval", description="lm-eval's plain prompt, or few-shot turns through the chat template."
    )
    max_length: int | None = Field(
        None, ge=1, description="Context window in tokens (default: the model's, as lm-eval reads it)."
    )
    prefix_cache: bool = Field(True, description="Run a subject's shared prompt prefix once (same scores).")
    device: str = Field("auto", description="cpu, cuda, cuda:1 ... (auto: cuda when there is one).")
    mapping: str | None = Field(None, description="mapping.json with subject names and categories.")
    progress: bool = Field(True, description="Show a progress bar.")

    @field_validator("subjects")
    @classmethod
    def _once_each(cls, value: list[str] | None) -> list[str] | None:
        """A subject named twice is scored once (it was scored, and its prompts built, twice)."""
        return list(dict.fromkeys(value)) if value is not None else None


def evaluate_benchmark(model: ModelRef, settings: MCSettings) -> EvalResult:
    start = time.perf_counter()
    data = load_benchmark(
        settings.benchmark,
        settings.data_dir,
        subjects=settings.subjects,
        limit=settings.limit,
        shots=settings.shots,
        mapping=settings.mapping,
    )
    tokenizer = load_tokenizer(model)
    requests, notes = build_requests(data, tokenizer, model, settings)
    lm = load_model(model).to(resolve_device(settings.device)).eval()
    attention.use(lm)  # padded batches: grouped-query heads shared inside SDPA (same scores)
    scorer = Scorer(lm, batch_size=settings.batch_size, prefix_cache=settings.prefix_cache)
    scores = scorer.run(requests, progress=_progress(data.spec.name, requests) if settings.progress else None)
    if scorer.rescored:
        notes.append(f"{scorer.rescored} close calls re-scored without the prefix cache")
    ties = sum(1 for lls in scores.values() if _gap(lls) < TIE)
    if ties:
        notes.append(
            f"{ties} questions have their two best choices within {TIE:g} in log-likelihood: float rounding "
            "(batch shapes, devices) can flip them between tools, lm-eval with another batch size included"
        )
    return _result(model, data, settings, scores, notes, time.perf_counter() - start)


def _progress(name: str, requests: list[Request]) -> Callable[[int], None]:
    """Questions done, as training shows steps (a bar on a terminal, a few lines in a log file).

    A question whose choices don't fit one request counts when its last request is scored.
    """
    from gym.progress import Progress

    left = Counter(r.key for r in requests)
    bar = Progress(name, len(left), unit="question")

    def scored(key: int) -> None:
        left[key] -= 1
        if left[key] == 0:
            bar.update(bar.step + 1)
            if bar.step == bar.total:
                bar.done()

    return scored


def _gap(lls: dict[int, float]) -> float:
    ranked = sorted(lls.values(), reverse=True)
    return ranked[0] - ranked[1] if len(ranked) > 1 else float("inf")


def build_requests(
    data: BenchmarkData, tokenizer: Any, model: ModelRef, settings: MCSettings
) -> tuple[list[Request], list[str]]:
    """Every question's forward-pass request(s), keyed by its position in the benchmark."""
    from gym.templates import render

    window = settings.max_length or max_length(load_config(model), tokenizer)
    shipped = shipped_library(model.path)
    encoder = Encoder(
        tokenizer,
        render_chat=lambda msgs: _render_chat(tokenizer, msgs, model.template, render),
        experiences=shipped,
    )
    requests: list[Request] = []
    key = truncated = split = 0
    for group, subject in enumerate(data.subjects):
        for q in subject.questions:
            enc = encoder.question(data.spec, subject, q, settings.style)
            made = requests_for(key, enc.context, enc.continuations, window, group)
            truncated += made[0].truncated
            split += len(made) > 1
            requests.extend(made)
            key += 1
    notes = []
    if truncated:
        notes.append(
            f"{truncated} of {key} prompts exceed the {window}-token window and lose tokens on the left "
            "(as in lm-eval)"
        )
    if encoder.whole_encodes:
        notes.append(
            f"{encoder.whole_encodes} choices needed their whole prompt tokenized (this tokenizer's window "
            "check failed): same token ids as lm-eval, slower"
        )
    if split:
        notes.append(
            f"{split} questions: this tokenizer spells the answer letters with several differing tokens, "
            "so each choice is scored in its own pass (same scores as lm-eval, slower)"
        )
    return requests, notes


def _render_chat(tokenizer: Any, messages: list[dict[str, str]], template: str, render: Any) -> str:
    import jinja2

    try:
        return str(render(tokenizer, messages, template, add_generation_prompt=True))
    except jinja2.exceptions.TemplateError:
        # Templates without a system role: lm-eval drops the system message and retries; so do we.
        return str(
            render(
                tokenizer,
                [m for m in messages if m["role"] != "system"],
                template,
                add_generation_prompt=True,
            )
        )


def _result(
    model: ModelRef,
    data: BenchmarkData,
    settings: MCSettings,
    scores: dict[int, dict[int, float]],
    notes: list[str],
    seconds: float,
) -> EvalResult:
    key = 0
    correct: dict[str, int] = {}
    sizes: dict[str, int] = {}
    predictions: dict[str, list[int]] = {}
    answers: dict[str, list[int]] = {}
    for subject in data.subjects:
        chosen = []
        for q in subject.questions:
            lls = [scores[key][i] for i in range(len(q.choices))]
            chosen.append(max(range(len(lls)), key=lambda i: (lls[i], -i)))  # first of ties, as np.argmax
            key += 1
        name = subject.info.key
        predictions[name] = chosen
        answers[name] = [q.answer for q in subject.questions]
        sizes[name] = len(chosen)
        correct[name] = sum(c == q.answer for c, q in zip(chosen, subject.questions, strict=True))
    categories = {s.info.key: s.info.category for s in data.subjects}
    shipped = shipped_library(model.path)
    if shipped is not None:
        notes = [shipped.note(), *notes]
    return EvalResult(
        benchmark=data.spec.name,
        model=model.name,
        overall=sum(correct.values()) / sum(sizes.values()),
        categories=weighted(correct, sizes, categories),
        subjects={k: correct[k] / sizes[k] for k in sizes},
        sizes=sizes,
        subject_categories=categories,
        n_questions=sum(sizes.values()),
        seconds=seconds,
        shots=settings.shots,
        questions_digest=data.digest(),
        engine="gym",
        style=settings.style,
        notes=notes,
        predictions=predictions,
        answers=answers,
        experiences=shipped.record() if shipped is not None else None,
    )
