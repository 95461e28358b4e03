"""Where a model came from: the facts a registered version carries as tags, and its model card shows.

`describe(...)` gathers them at the end of a flow (base model and its registry entry, method,
datasets with digests, stage digests, hyperparameters, config digest, eval scores, gym version,
Prefect flow run); `Lineage.tags()` flattens them for MLflow (one tag per fact, plus the whole
record as JSON under `gym.lineage`) and `Lineage.from_tags` reads them back.

Score names (tags `score.<name>`, the model card's Evaluation table, `gym promote --metric <name>`):

- `<metric>_before` / `<metric>_after`: held-out generation metrics a training flow measured on its
  base model and on the trained model (`exact_match_after`, `bleu_after`, `rougeL_after`...);
- `<benchmark>_before` / `<benchmark>_after`: a benchmark's overall score (`mmlu_after`, `ceval_after`,
  `arc_easy_after` for `lm-eval:arc_easy`), and `<benchmark>_after.<category>` per category (or
  lm-eval group) in lower snake case (`mmlu_after.stem`, `mmlu_after.social_sciences`);
- `<stage>_loss_last`, `<stage>_reward_accuracy`...: training signals of each stage;
- without a suffix (`mmlu`, `mmlu.stem`, `exact_match`): measured later by flows/evaluate.py on the
  registered version itself (`--model models:/name@alias`); a later evaluation replaces an earlier one.

How each benchmark score was measured (engine, shots, questions) is the tag `score_setup.<name>`:
promotion compares two versions only on scores measured the same way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field, field_validator

import gym
from gym.hashing import hash_obj

LINEAGE_TAG = "gym.lineage"
SCORE_PREFIX = "score."
SETUP_PREFIX = "score_setup."
# Training-stage sections of a flow config (gym.pipeline): their fields are the hyperparameters.
STAGE_SECTIONS = ("sft", "dpo", "train")


class Lineage(BaseModel):
    """Facts about a model version (see the module docstring)."""

    base_model: str = Field(description="Registry name or hub id the weights descend from.")
    template: str | None = Field(None, description="gym chat template the model was trained with.")
    default_system: str | None = Field(
        None, description="System message the model was trained with where a conversation had none."
    )
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
    score_setups: dict[str, str] = Field(
        default_factory=dict,
        description="Benchmark score name -> how it was measured (engine, shots, questions).",
    )
    gym_version: str = Field(gym.__version__, description="gym version that produced the model.")
    flow_run_id: str | None = Field(None, description="Prefect flow run that produced the model.")
    extra: dict[str, str] = Field(default_factory=dict, description="Other facts the flow recorded, as tags.")

    @field_validator("scores", mode="before")
    @classmethod
    def _measured(cls, scores: Any) -> Any:
        """A NaN or infinite score (every reward of a run NaN or None) was not measured: left out. JSON
        wrote it as null, which a version registered so still holds and must read back."""
        if not isinstance(scores, Mapping):
            return scores
        return {k: v for k, v in scores.items() if isinstance(v, int | float) and math.isfinite(v)}

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
        tags.update({f"{SETUP_PREFIX}{k}": v for k, v in self.score_setups.items()})
        tags[LINEAGE_TAG] = self.model_dump_json()
        return tags

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Lineage:
        """Read back what `tags()` wrote; versions registered before it existed give what their tags hold.
        The `score.*` tags are the truth for scores (a later evaluation adds some)."""
        if LINEAGE_TAG in tags:
            lineage = cls.model_validate_json(tags[LINEAGE_TAG])
            return lineage.model_copy(
                update={
                    "scores": {**lineage.scores, **scores_of(tags)},
                    "score_setups": {**lineage.score_setups, **setups_of(tags)},
                }
            )
        datasets = {k: {"name": None, "digest": v} for k, v in tags.items() if k.endswith("dataset")}
        return cls(
            base_model=tags.get("base_model", "unknown"),
            template=tags.get("template"),
            method=tags.get("method"),
            datasets=datasets,
            stages={k.removesuffix("_stage"): v for k, v in tags.items() if k.endswith("_stage")},
            scores=scores_of(tags),
            score_setups=setups_of(tags),
            flow_run_id=tags.get("prefect_flow_run_id"),
        )


def scores_of(tags: Mapping[str, str]) -> dict[str, float]:
    """The `score.*` tags as numbers (a NaN or infinite one, never measured, left out)."""
    scores = {k.removeprefix(SCORE_PREFIX): _number(v) for k, v in tags.items() if k.startswith(SCORE_PREFIX)}
    return {k: v for k, v in scores.items() if math.isfinite(v)}


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def setups_of(tags: Mapping[str, str]) -> dict[str, str]:
    return {k.removeprefix(SETUP_PREFIX): v for k, v in tags.items() if k.startswith(SETUP_PREFIX)}


def slug(text: str) -> str:
    """A score-name part: lower snake case (`Social Sciences` -> `social_sciences`)."""
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")


def setup_of(result: Any) -> str:
    """How a benchmark result was measured; two scores compare only when this is equal."""
    shots = "default" if result.shots is None else result.shots
    chat = ", chat template" if getattr(result, "style", "lm-eval") == "chat" else ""
    asked = getattr(result, "questions_digest", None)
    which = f" ({QUESTIONS} {asked})" if asked else ""
    return f"{result.engine}, {shots}-shot, {result.n_questions} questions{which}{chat}"


QUESTIONS = "set"  # how setup_of names the digest of what was asked (see same_setup)


def same_setup(ours: str | None, theirs: str | None) -> bool:
    """Two setups (setup_of) are one measurement; a score recorded before gym named which questions it
    asked compares on the rest of its setup."""
    if ours == theirs:
        return True
    if ours is None or theirs is None:
        return False
    unnamed = re.compile(rf" \({QUESTIONS} [0-9a-f]+\)")
    if unnamed.search(ours) and unnamed.search(theirs):
        return False  # both name their questions, and they differ (or the rest does)
    return unnamed.sub("", ours) == unnamed.sub("", theirs)


def heldout_scores(result: Any, suffix: str) -> dict[str, float]:
    """A generation evaluation's metrics (exact match, BLEU, ROUGE, custom) as `<metric><suffix>`."""
    metrics = {"exact_match": result.exact_match, **result.scores}
    return {f"{name}{suffix}": float(value) for name, value in metrics.items()}


HELD_OUT_SETUP = "held-out"  # how a held-out metric's setup begins (see heldout_setups)


def heldout_setups(result: Any, suffix: str) -> dict[str, str]:
    """How each of `heldout_scores` was measured: on how many held-out records (an exact match over 5
    records and one over 200 are not compared when promoting)."""
    return {name: f"{HELD_OUT_SETUP}, {result.n} records" for name in heldout_scores(result, suffix)}


def benchmark_scores(result: Any, suffix: str) -> tuple[dict[str, float], dict[str, str]]:
    """A benchmark result (gym.eval.results.EvalResult) as scores `<benchmark><suffix>` (overall) and
    `<benchmark><suffix>.<category>`, and the setup of the overall one."""
    name = f"{slug(result.benchmark)}{suffix}"
    scores = {name: float(result.overall)}
    scores.update({f"{name}.{slug(cat)}": float(v) for cat, v in result.categories.items()})
    return scores, {name: setup_of(result)}


def eval_scores(
    stages: Mapping[str, Any],
    before: Any | None,
    after: Any | None,
    benchmarks: Mapping[str, Sequence[Any]] | None = None,
) -> tuple[dict[str, float], dict[str, str]]:
    """The numbers a version is judged by, named as in the module docstring (exact_match_after,
    mmlu_after, mmlu_after.stem, dpo_reward_accuracy, sft_loss_last...), and the benchmarks' setups.
    `benchmarks` maps a phase (`before`, `after`) to the benchmark results of that phase."""
    from gym.summary import REWARD_METRICS

    scores: dict[str, float] = {}
    setups: dict[str, str] = {}
    for result, suffix in ((before, "_before"), (after, "_after")):
        if result is not None:
            scores.update(heldout_scores(result, suffix))
            setups.update(heldout_setups(result, suffix))
    for phase, results in (benchmarks or {}).items():
        for result in results:
            if result is not None:
                named, setup = benchmark_scores(result, f"_{phase}")
                scores.update(named)
                setups.update(setup)
    for name, result in stages.items():
        if result.loss_last is not None:
            scores[f"{name}_loss_last"] = float(result.loss_last)
        for key, metric in REWARD_METRICS.items():
            if metric in result.eval_after:
                scores[f"{name}_{key}"] = float(result.eval_after[metric])
        if result.metric_last is not None and result.metric_name != "loss":
            scores[f"{name}_{result.metric_name}"] = float(result.metric_last)
    return scores, setups


def describe(
    base_model: str,
    template: str | None,
    lineage: Mapping[str, str],
    config: Mapping[str, Any] | None = None,
    stages: Mapping[str, Any] | None = None,
    before: Any | None = None,
    after: Any | None = None,
    flow_run_id: str | None = None,
    benchmarks: Mapping[str, Sequence[Any]] | None = None,
    default_system: str | None = None,
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
    # What each stage trained with (its settings made concrete), else the flow config's section for it
    hyper = {
        name: redact(r.hyperparameters) for name, r in stages.items() if getattr(r, "hyperparameters", 0)
    }
    if not hyper:
        hyper = {s: redact(config[s]) for s in STAGE_SECTIONS if isinstance(config.get(s), Mapping)}
    entry, entry_digest = registry_entry(base_model)
    scores, setups = eval_scores(stages, before, after, benchmarks)
    return Lineage(
        base_model=base_model,
        template=template,
        default_system=default_system,
        method="+".join(stages) or None,
        registry_entry=entry,
        registry_digest=entry_digest,
        datasets=datasets,
        stages=stage_digests,
        hyperparameters=hyper,
        config_digest=hash_obj(config) if config else None,
        scores=scores,
        score_setups=setups,
        flow_run_id=flow_run_id,
        extra=extra,
    )


def registry_entry(base_model: str) -> tuple[str | None, str | None]:
    """The registry entry `base_model` names and its digest, if it is one (else None, None)."""
    from gym.registry import load_models

    spec = load_models().get(base_model)
    if spec is None:
        return None, None
    return spec.name, hash_obj(json.loads(spec.model_dump_json()))
