"""Held-out pair metrics over pairs, not over batches.

TRL's preference trainers (DPO, and CPO/ORPO, which gym's simpo and orpo run) log a held-out metric as
the mean of its per-batch means: the last, smaller batch of an evaluation weighed as much as a full one,
so `reward_accuracy` on 100 held-out pairs in batches of 8 was not a share of the 100 pairs (promotion
compared such numbers). `pair_weighted(cls)` keeps, for each metric a held-out batch adds, the number of
pairs in that batch, and logs the mean weighted by them: the mean over every held-out pair.
"""

from __future__ import annotations

from typing import Any


def pair_weighted(trainer_cls: type) -> type:
    """`trainer_cls` (a TRL DPOTrainer, CPOTrainer or ORPOTrainer, or a subclass) whose held-out metrics
    are means over pairs."""

    class PairWeighted(trainer_cls):  # type: ignore[misc, valid-type]
        def _held_out_store(self) -> Any:
            """Where TRL appends each held-out batch's metrics: name -> list of batch means."""
            stored = getattr(self, "_stored_metrics", None)  # CPO, ORPO
            return stored["eval"] if stored is not None else self._metrics["eval"]  # DPO

        def prediction_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            before = {k: len(v) for k, v in self._held_out_store().items()}
            out = super().prediction_step(model, inputs, *args, **kwargs)
            pairs = _pairs(inputs)
            weights: dict[str, list[int]] = self.__dict__.setdefault("_pair_weights", {})
            for key, values in self._held_out_store().items():
                weights.setdefault(key, []).extend([pairs] * (len(values) - before.get(key, 0)))
            return out

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            weights = self.__dict__.pop("_pair_weights", None)  # set by an evaluation: this is its log
            if weights:
                store = self._held_out_store()
                for key, values in store.items():
                    w = weights.get(key, [])
                    if len(w) == len(values) and sum(w) > 0:  # TRL's mean of one value is the value
                        values[:] = [sum(v * n for v, n in zip(values, w, strict=True)) / sum(w)]
            super().log(logs, *args, **kwargs)

    return PairWeighted


def _pairs(inputs: Any) -> int:
    """How many pairs a collated batch holds: the rows of its first tensor or list (DPO's chosen and
    rejected rows come in equal numbers, a constant factor the weights don't see)."""
    if isinstance(inputs, dict):
        for value in inputs.values():
            shape = getattr(value, "shape", None)
            if shape is not None and len(shape) > 0:
                return int(shape[0])
            if isinstance(value, list):
                return len(value)
    return 1
