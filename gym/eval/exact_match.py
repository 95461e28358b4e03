"""Generation evals on a held-out split: greedy-generate each prompt, compare with the reference.

The dataset is an ingested sft artifact (canonical `messages`); the prompt is every turn before
the last assistant turn, rendered with the model's chat template, and the reference is that last
assistant turn. Exact match (whitespace-stripped) is always reported; `metrics` adds BLEU, ROUGE
or your own function by dotted path (gym/eval/generation.py), all checked before the model loads.
A TF-GRPO model's shipped experience library is injected into every prompt as training and serving
inject it (gym.tfgrpo.injection: the whole library, or the run's top-k most similar to each example's
last user turn), and named in the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gym import attention
from gym.eval.generation import check_metrics, score
from gym.models import ModelRef, load_model, load_tokenizer
from gym.templates import render
from gym.tfgrpo.injection import inject, query_of, shipped_library


class ExactMatch(BaseModel):
    exact_match: float
    n: int
    samples: list[dict[str, str]]  # a few (prompt, reference, prediction) triples for the report
    scores: dict[str, float] = {}  # every metric asked for (exact_match included), by name
    experiences: dict[str, Any] | None = None  # the injected TF-GRPO library (hash, version, size)


ANSWER_ROOM = 8  # tokens past the longest reference: room for an end-of-turn mark, a trailing space
MAX_ANSWER = 1024  # the most new tokens an answer gets by default


def evaluate(
    model: ModelRef,
    dataset_dir: Path,
    *,
    limit: int | None = None,
    batch_size: int = 32,
    max_new_tokens: int | None = None,
    keep_samples: int = 8,
    metrics: Sequence[str] = ("exact_match",),
    system: str | None = None,
) -> ExactMatch:
    """Greedy answers to the held-out records' last user turns, scored against their last assistant turns;
    `system` opens each conversation that has no system message (the data's default_system in training;
    None: the one the model was trained with, if any). Answers run to `max_new_tokens`, by default the
    longest reference's length in tokens and a few more (ANSWER_ROOM, at most MAX_ANSWER): a fixed cap
    shorter than the references could never match them, and cut BLEU and ROUGE short."""
    import torch

    from gym.data.ingest import load_saved
    from gym.templates import with_system

    check_metrics(metrics)
    system = model.default_system if system is None else system
    records = load_saved(dataset_dir)
    if limit is not None:
        records = records.select(range(min(limit, len(records))))
    shipped = shipped_library(model.path)
    tokenizer = load_tokenizer(model)
    tokenizer.padding_side = "left"
    lm = load_model(model).eval()
    attention.use(lm)  # padded batches: grouped-query heads shared inside SDPA (same answers)
    prompts, refs = [], []
    for rec in records:
        messages = with_system([rec["messages"][:-1]], system)[0]
        if shipped is not None:
            messages = inject(messages, shipped.texts_for(query_of(messages)))
        prompts.append(render(tokenizer, messages, model.template, add_generation_prompt=True))
        refs.append(rec["messages"][-1]["content"])
    if max_new_tokens is None:
        longest = max((len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in refs), default=0)
        max_new_tokens = min(MAX_ANSWER, longest + ANSWER_ROOM)
    preds: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            batch = tokenizer(
                prompts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            )
            out = lm.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new = out[:, batch["input_ids"].shape[1] :]
            preds.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
    samples = [
        {"prompt": prompts[i], "reference": refs[i], "prediction": preds[i]}
        for i in range(min(keep_samples, len(refs)))
    ]
    scores = score(list(dict.fromkeys(["exact_match", *metrics])), preds, refs)
    return ExactMatch(
        exact_match=scores["exact_match"],
        n=len(refs),
        samples=samples,
        scores=scores,
        experiences=shipped.record() if shipped is not None else None,
    )
