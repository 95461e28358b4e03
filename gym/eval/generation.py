"""Metrics for generated answers on the user's held-out data: exact match, BLEU, ROUGE, or your own.

    score(["exact_match", "bleu", "rouge", "my_pkg.metrics:f1"], predictions, references)
    # {"exact_match": 0.5, "bleu": 31.2, "rouge1": 0.61, "rouge2": 0.40, "rougeL": 0.58, "f1": 0.7}

BLEU is sacrebleu's corpus BLEU (0-100, its default 13a tokenizer; "bleu_zh" uses its Chinese
tokenizer), ROUGE is rouge-score's mean F1 of rouge1/rouge2/rougeL with stemming (it keeps only
ASCII letters and digits, so use it for English). A custom metric is named by dotted path,
`package.module:function` or `package.module.function`, and is called as
`function(predictions, references)`; it returns a number, or a dict of named numbers.
Every name is resolved by `check_metrics` before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gym.errors import ConfigError, MissingExtraError
from gym.user_code import load_callable

BUILTIN = ("exact_match", "bleu", "bleu_zh", "rouge")
Metric = Callable[[Sequence[str], Sequence[str]], Any]


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Share of predictions equal to their reference, whitespace-stripped."""
    hits = [p.strip() == r.strip() for p, r in zip(predictions, references, strict=True)]
    return sum(hits) / max(len(hits), 1)


def bleu(predictions: Sequence[str], references: Sequence[str], tokenize: str = "13a") -> float:
    try:
        import sacrebleu
    except ImportError as exc:
        raise MissingExtraError("BLEU needs sacrebleu: pip install 'gym[eval]'") from exc
    return float(sacrebleu.corpus_bleu(list(predictions), [list(references)], tokenize=tokenize).score)


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    try:
        from rouge_score import rouge_scorer
    except ImportError as exc:
        raise MissingExtraError("ROUGE needs rouge-score: pip install 'gym[eval]'") from exc
    kinds = ["rouge1", "rouge2", "rougeL"]
    scorer = rouge_scorer.RougeScorer(kinds, use_stemmer=True)
    totals = dict.fromkeys(kinds, 0.0)
    for p, r in zip(predictions, references, strict=True):
        for kind, value in scorer.score(r, p).items():
            totals[kind] += value.fmeasure
    return {k: v / max(len(predictions), 1) for k, v in totals.items()}


def _bleu_zh(predictions: Sequence[str], references: Sequence[str]) -> float:
    return bleu(predictions, references, tokenize="zh")


_BUILTIN: dict[str, Metric] = {"exact_match": exact_match, "bleu": bleu, "bleu_zh": _bleu_zh, "rouge": rouge}


def resolve_metric(name: str) -> Metric:
    """A built-in metric, or a function named by dotted path (`pkg.mod:fn` or `pkg.mod.fn`)."""
    if name in _BUILTIN:
        return _BUILTIN[name]
    module_name, sep, attr = name.partition(":") if ":" in name else name.rpartition(".")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"unknown metric {name!r}: use one of {', '.join(BUILTIN)} "
            "or a dotted path like my_pkg.metrics:f1"
        )
    return load_callable(name, "metric", "my_pkg.metrics:f1")


def check_metrics(names: Sequence[str]) -> dict[str, Metric]:
    if not names:
        raise ConfigError("no metric asked for: use exact_match, bleu, rouge or a dotted path")
    return {name: resolve_metric(name) for name in names}


def score(names: Sequence[str], predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Every metric's value(s), flat: a metric returning a dict contributes each of its keys."""
    out: dict[str, float] = {}
    for name, fn in check_metrics(names).items():
        value = fn(predictions, references)
        label = name.replace(":", ".").rsplit(".", 1)[-1]
        if isinstance(value, dict):
            out.update({str(k): float(v) for k, v in value.items()})
        elif isinstance(value, (int, float)):
            out[label] = float(value)
        else:
            raise ConfigError(f"metric {name!r} returned {type(value).__name__}; expected a number or a dict")
    return out
