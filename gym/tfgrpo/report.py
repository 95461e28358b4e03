"""What a Training-Free GRPO run reports: per-step metrics and library versions to MLflow (through
gym.tracking), and the step's library diff as markdown (the flow publishes it as a Prefect artifact).
"""

from __future__ import annotations

from pathlib import Path

from gym import tracking
from gym.tfgrpo.engine import RunResult, mean_reward
from gym.tfgrpo.library import Library, diff
from gym.tfgrpo.step import StepManifest, library_path


def step_markdown(run_dir: Path, manifest: StepManifest) -> str:
    """The step's library diff, what was rejected and why, and its status."""
    old = Library.load(library_path(run_dir, manifest.version_in, manifest.library_in))
    new = Library.load(library_path(run_dir, manifest.version_out, manifest.library_out))
    lines = [
        f"## TF-GRPO step {manifest.step} (epoch {manifest.epoch + 1}, batch {manifest.batch + 1}): "
        f"{manifest.status}",
        "",
        diff(old, new).markdown(),
    ]
    if manifest.rejected:
        lines += ["", "Rejected operations:"]
        lines += [f"- `{r.op.op}`: {r.reason}" for r in manifest.rejected]
    if manifest.problems:
        lines += ["", "Problems (the step applied only what was valid):"]
        lines += [f"- {p}" for p in manifest.problems]
    calls = ", ".join(f"{stage} {t.calls}" for stage, t in manifest.usage.items())
    lines += ["", f"LLM calls: {calls}; tokens: {manifest.tokens}"]
    return "\n".join(lines)


def track_step(run_dir: Path, manifest: StepManifest, mlflow_run_id: str, uri: str | None = None) -> str:
    """Log the step's numbers (and its new library version, if any) to MLflow; return its markdown."""
    tracking.log_metrics(
        mlflow_run_id,
        {
            "train_reward": mean_reward(manifest),
            "library_size": float(
                len(Library.load(library_path(run_dir, manifest.version_out, manifest.library_out)).items)
            ),
            "library_version": float(manifest.version_out),
            "llm_calls": float(manifest.calls),
            "tokens": float(manifest.tokens),
            "degraded": float(manifest.status == "degraded"),
        },
        step=manifest.step,
        uri=uri,
    )
    if manifest.version_out != manifest.version_in:
        path = library_path(run_dir, manifest.version_out, manifest.library_out)
        tracking.log_artifact(mlflow_run_id, path, "libraries", uri=uri)
    return step_markdown(run_dir, manifest)


def track_run(result: RunResult, mlflow_run_id: str, uri: str | None = None) -> None:
    """Log the final library, the held-out curve and the run's totals, and close the MLflow run."""
    tracking.log_artifact(mlflow_run_id, Path(result.library_file), uri=uri)
    for name, curve in (("heldout_mean_at_k", result.mean_at_k), ("heldout_pass_at_k", result.pass_at_k)):
        # a missing evaluation (its calls failed) is no point of the curve, not a 0
        points = [(i, v) for i, v in enumerate(curve) if v is not None]
        tracking.log_curve(mlflow_run_id, name, points, uri=uri)
    tracking.log_metrics(
        mlflow_run_id,
        {
            "final_library_size": float(result.library_size),
            "final_library_version": float(result.library_version),
            "total_llm_calls": float(result.llm_calls),
            "total_tokens": float(result.tokens),
            "cost_usd": result.cost_usd,
            "degraded_steps": float(result.degraded_steps),
        },
        uri=uri,
    )
    tracking.end_run(mlflow_run_id, uri=uri)
