"""The summary a flow run prints and returns: one flat dict of numbers and references.

Keys every flow provides (None where they don't apply): sft_loss_first, sft_loss_last,
dpo_reward_accuracy, exact_match_before, exact_match_after, mlflow_run_id, model_name,
model_version, flow_run_id, and the last stage's main signal: metric_name, metric_first,
metric_last (the training loss unless the method reports another). Each stage adds
`<method>_loss_first/last` and `<method>_tokens_per_second` (real training tokens/s), and
stages with held-out data add `<method>_eval_loss[_before]`, and those evaluated on preference
pairs `<method>_reward_accuracy[_before]` and `<method>_reward_margin[_before]`. Registration
adds `model_alias` and `model_reused` (model_version is the version the alias points to now); a
promotion adds `promoted`, `champion_version` and `promotion_reason`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gym.eval.exact_match import ExactMatch
from gym.train.common import TrainResult

REQUIRED = (
    "sft_loss_first", "sft_loss_last", "dpo_reward_accuracy", "exact_match_before", "exact_match_after",
    "mlflow_run_id", "model_name", "model_version", "flow_run_id",
)  # fmt: skip
REWARD_METRICS = {"reward_accuracy": "eval_rewards/accuracies", "reward_margin": "eval_rewards/margins"}


def summarize(
    stages: Mapping[str, TrainResult],
    before: ExactMatch | None,
    after: ExactMatch | None,
    registered: Mapping[str, str],
    mlflow_run_id: str,
    model_dir: str,
    flow_run_id: str | None,
    promotion: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(REQUIRED)
    for name, result in stages.items():
        out[f"{name}_loss_first"] = result.loss_first
        out[f"{name}_loss_last"] = result.loss_last
        out[f"{name}_tokens_per_second"] = result.tokens_per_second
        if "eval_loss" in result.eval_after:  # a stage with held-out data
            out[f"{name}_eval_loss"] = result.eval_after["eval_loss"]
            out[f"{name}_eval_loss_before"] = result.eval_before.get("eval_loss")
        for key, metric in REWARD_METRICS.items():
            if metric in result.eval_after:
                out[f"{name}_{key}"] = result.eval_after[metric]
                out[f"{name}_{key}_before"] = result.eval_before.get(metric)
    last = list(stages.values())[-1]
    out.update(
        metric_name=last.metric_name,
        metric_first=last.metric_first,
        metric_last=last.metric_last,
        exact_match_before=before.exact_match if before else None,
        exact_match_after=after.exact_match if after else None,
        mlflow_run_id=mlflow_run_id,
        model_name=registered["name"],
        model_version=registered["version"],
        model_dir=model_dir,
        flow_run_id=flow_run_id,
        model_alias=registered.get("alias"),
        model_reused=registered.get("reused"),
    )
    for side, held_out in (("before", before), ("after", after)):  # --eval_metrics beyond exact match
        for metric, value in (held_out.scores if held_out else {}).items():
            out.setdefault(f"{metric}_{side}", value)
    if promotion is not None:
        out.update(
            promoted=promotion["promoted"],
            champion_version=promotion["champion"],
            promotion_reason=promotion["reason"],
        )
    return out
