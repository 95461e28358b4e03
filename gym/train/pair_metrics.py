"""Held-out preference metrics over pairs (or examples), not over batches.

TRL's preference trainers (DPO, KTO, and CPO/ORPO, which gym's simpo and orpo run) log a held-out metric
as the mean of its per-batch means: the last, smaller batch of an evaluation weighed as much as a full one,
so `reward_accuracy` on 100 held-out pairs in batches of 8 was not a share of the 100 pairs (promotion
compared such numbers). `pair_weighted(cls)` keeps, for each metric a held-out batch adds, the number of
pairs in that batch, and logs the mean weighted by them: the mean over every held-out pair.
`example_weighted(cls)` does the same for KTO, whose batches mix desirable and undesirable examples: a
desirable (`chosen`) metric is weighted by a batch's desirable examples, an undesirable one by its
undesirable ones, and the margin is the difference of the two means.
"""

from __future__ import annotations

from typing import Any


def pair_weighted(trainer_cls: type) -> type:
    """`trainer_cls` (a TRL DPOTrainer, CPOTrainer or ORPOTrainer, or a subclass) whose held-out metrics
    are means over pairs."""
    return _weighted(trainer_cls, lambda inputs: lambda key: _pairs(inputs), margin=False)


def example_weighted(trainer_cls: type) -> type:
    """`trainer_cls` (TRL's KTOTrainer, or a subclass) whose held-out metrics are means over examples:
    desirable ones for `.../chosen`, undesirable ones for `.../rejected`, every one for the rest."""

    def weights(inputs: Any) -> Any:
        labels = [bool(x) for x in inputs["label"]]
        desirable, rows = sum(labels), len(labels)

        def weight(key: str) -> int:
            if key.endswith("/chosen"):
                return desirable
            return rows - desirable if key.endswith("/rejected") else rows

        return weight

    return _weighted(trainer_cls, weights, margin=True)


def _weighted(trainer_cls: type, weights_of: Any, margin: bool) -> type:
    """`trainer_cls` logging each held-out metric as its batch means weighted by `weights_of(inputs)(key)`;
    with `margin`, `rewards/margins` as the weighted `rewards/chosen` minus the weighted `rewards/rejected`
    (a batch without both adds no margin of its own)."""

    class Weighted(trainer_cls):  # type: ignore[misc, valid-type]
        def _held_out_store(self) -> Any:
            """Where TRL appends each held-out batch's metrics: name -> list of batch means."""
            stored = getattr(self, "_stored_metrics", None)  # CPO, ORPO
            return stored["eval"] if stored is not None else self._metrics["eval"]  # DPO

        def prediction_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            before = {k: len(v) for k, v in self._held_out_store().items()}
            out = super().prediction_step(model, inputs, *args, **kwargs)
            weight = weights_of(inputs)
            weights: dict[str, list[int]] = self.__dict__.setdefault("_pair_weights", {})
            for key, values in self._held_out_store().items():
                weights.setdefault(key, []).extend([weight(key)] * (len(values) - before.get(key, 0)))
            return out

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            weights = self.__dict__.pop("_pair_weights", None)  # set by an evaluation: this is its log
            if weights:
                store = self._held_out_store()
                for key, values in store.items():
                    w = weights.get(key, [])
                    if len(w) == len(values) and sum(w) > 0:  # TRL's mean of one value is the value
                        values[:] = [sum(v * n for v, n in zip(values, w, strict=True)) / sum(w)]
                chosen, rejected = store.get("rewards/chosen"), store.get("rewards/rejected")
                if margin and chosen and rejected and len(chosen) == len(rejected) == 1:
                    store["rewards/margins"] = [chosen[0] - rejected[0]]
            super().log(logs, *args, **kwargs)

    return Weighted


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
