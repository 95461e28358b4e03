"""Where a model came from: the facts a registered version carries as tags, and its model card shows.

`describe(...)` gathers them at the end of a flow (base model and its registry entry, method,
datasets with digests, stage digests, hyperparameters, config digest, eval scores, gym version,
Prefect flow run); `Lineage.tags()` flattens them for MLflow (one tag per fact, plus the whole
record as JSON under `gym.lineage`) and `Lineage.from_tags` reads them back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

import gym
from gym.hashing import hash_obj

LINEAGE_TAG = "gym.lineage"
SCORE_PREFIX = "score."
# Training-stage sections of a flow config (gym.pipeline): their fields are the hyperparameters.
STAGE_SECTIONS = ("sft", "dpo", "train")


class Lineage(BaseModel):
    """Facts about a model version (see the module docstring)."""

    base_model: str = Field(description="Registry name or hub id the weights descend from.")
    template: str | None = Field(None, description="gym chat template the model was trained with.")
    method: str | None = Field(None, description="Training method(s), e.g. sft or sft+dpo.")
    registry_entry: str | None = Field(None, description="gym registry entry of the base model.")
    registry_digest: str | None = Field(None, description="Digest of that entry when the model was trained.")
    datasets: dict[str, dict[str, str | None]] = Field(
        default_factory=dict, description="Role (e.g. sft_dataset) -> {name, digest}."
    )
    stages: dict[str, str] = Field(default_factory=dict, description="Stage -> content digest of its inputs.")
    hyperparameters: dict[str, Any] = Field(default_factory=dict, description="Stage -> its training config.")
    config_digest: str | None = Field(None, description="Digest of the whole flow configuration.")
    scores: dict[str, float] = Field(default_factory=dict, description="Evaluation scores (name -> value).")
    gym_version: str = Field(gym.__version__, description="gym version that produced the model.")
    flow_run_id: str | None = Field(None, description="Prefect flow run that produced the model.")
    extra: dict[str, str] = Field(default_factory=dict, description="Other facts the flow recorded, as tags.")

    def tags(self) -> dict[str, str]:
        """Flat MLflow model-version tags (the names earlier gym versions used are kept)."""
        tags: dict[str, str] = {**self.extra, "base_model": self.base_model, "gym_version": self.gym_version}
        for key in ("template", "method", "registry_entry", "registry_digest", "config_digest"):
            if (value := getattr(self, key)) is not None:
                tags[key] = str(value)
        if self.flow_run_id:
            tags["prefect_flow_run_id"] = self.flow_run_id
        for role, ds in self.datasets.items():
            if ds.get("digest"):
                tags[role] = str(ds["digest"])
        tags.update({f"{stage}_stage": digest for stage, digest in self.stages.items()})
        tags.update({f"{SCORE_PREFIX}{k}": repr(float(v)) for k, v in self.scores.items()})
        tags[LINEAGE_TAG] = self.model_dump_json()
        return tags

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Lineage:
        """Read back what `tags()` wrote; versions registered before it existed give what their tags hold."""
        if LINEAGE_TAG in tags:
            return cls.model_validate_json(tags[LINEAGE_TAG])
        datasets = {k: {"name": None, "digest": v} for k, v in tags.items() if k.endswith("dataset")}
        return cls(
            base_model=tags.get("base_model", "unknown"),
            template=tags.get("template"),
            method=tags.get("method"),
            datasets=datasets,
            stages={k.removesuffix("_stage"): v for k, v in tags.items() if k.endswith("_stage")},
            scores=scores_of(tags),
            flow_run_id=tags.get("prefect_flow_run_id"),
        )


def scores_of(tags: Mapping[str, str]) -> dict[str, float]:
    return {k.removeprefix(SCORE_PREFIX): float(v) for k, v in tags.items() if k.startswith(SCORE_PREFIX)}


def eval_scores(stages: Mapping[str, Any], before: Any | None, after: Any | None) -> dict[str, float]:
    """The numbers a version is judged by, named as in the flow summary (exact_match_after,
    dpo_reward_accuracy, sft_loss_last...)."""
    from gym.summary import REWARD_METRICS

    scores: dict[str, float] = {}
    if before is not None:
        scores["exact_match_before"] = float(before.exact_match)
    if after is not None:
        scores["exact_match_after"] = float(after.exact_match)
    for name, result in stages.items():
        if result.loss_last is not None:
            scores[f"{name}_loss_last"] = float(result.loss_last)
        for key, metric in REWARD_METRICS.items():
            if metric in result.eval_after:
                scores[f"{name}_{key}"] = float(result.eval_after[metric])
        if result.metric_last is not None and result.metric_name != "loss":
            scores[f"{name}_{result.metric_name}"] = float(result.metric_last)
    return scores


def describe(
    base_model: str,
    template: str | None,
    lineage: Mapping[str, str],
    config: Mapping[str, Any] | None = None,
    stages: Mapping[str, Any] | None = None,
    before: Any | None = None,
    after: Any | None = None,
    flow_run_id: str | None = None,
) -> Lineage:
    """A Lineage from what a flow has at its end: `lineage` is the flow's own {role: digest} map
    (`sft_dataset`, `dataset`, `sft_stage`...), `config` its configuration (dataset names and
    hyperparameters come from there), `stages` its TrainResults, `before`/`after` its evaluations."""
    from gym.tracking import redact

    config = dict(config or {})
    stages = dict(stages or {})
    datasets = {
        role: {"name": str(config[role]) if config.get(role) else None, "digest": digest}
        for role, digest in lineage.items()
        if role.endswith("dataset")
    }
    stage_digests = {k.removesuffix("_stage"): v for k, v in lineage.items() if k.endswith("_stage")}
    extra = {k: str(v) for k, v in lineage.items() if not k.endswith(("dataset", "_stage"))}
    stage_digests.update({name: result.digest for name, result in stages.items()})
    hyper = {s: redact(config[s]) for s in STAGE_SECTIONS if isinstance(config.get(s), Mapping)}
    entry, entry_digest = _registry_entry(base_model)
    return Lineage(
        base_model=base_model,
        template=template,
        method="+".join(stages) or None,
        registry_entry=entry,
        registry_digest=entry_digest,
        datasets=datasets,
        stages=stage_digests,
        hyperparameters=hyper,
        config_digest=hash_obj(config) if config else None,
        scores=eval_scores(stages, before, after),
        flow_run_id=flow_run_id,
        extra=extra,
    )


def _registry_entry(base_model: str) -> tuple[str | None, str | None]:
    from gym.registry import load_models

    spec = load_models().get(base_model)
    if spec is None:
        return None, None
    return spec.name, hash_obj(json.loads(spec.model_dump_json()))
