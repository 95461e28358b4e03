"""End-to-end: the flows on the embedded model, through Prefect and MLflow for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from gym.lineage import Lineage

REPO = Path(__file__).resolve().parents[1]
KEYS = {
    "sft_loss_first",
    "sft_loss_last",
    "dpo_reward_accuracy",
    "exact_match_before",
    "exact_match_after",
    "mlflow_run_id",
    "model_name",
    "model_version",
    "flow_run_id",
    "cached_tasks",
}


def run_script(args: list[str], gym_home: Path, timeout: int = 900, logs: list[str] | None = None) -> dict:
    """Run a command the way a user does and return its final JSON line (its stderr into `logs`)."""
    env = {
        **os.environ,
        "GYM_HOME": str(gym_home),
        "PREFECT_HOME": str(gym_home / "prefect-home"),
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    }
    env.pop("PREFECT_API_URL", None)  # the script starts its own ephemeral API, as a user's would
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if logs is not None:
        logs.append(proc.stderr)
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last)


@pytest.mark.slow
def test_sft_then_dpo_default_run_learns_registers_and_reruns_from_cache(gym_home):
    first = run_script([sys.executable, "flows/sft_then_dpo.py", "--json"], gym_home)
    assert set(first) >= KEYS
    assert first["sft_loss_last"] < 0.5 * first["sft_loss_first"]
    assert first["exact_match_after"] > first["exact_match_before"] + 0.1
    assert first["dpo_reward_accuracy"] > max(0.5, first["dpo_reward_accuracy_before"])
    assert first["dpo_reward_margin"] > first["dpo_reward_margin_before"]
    assert first["model_name"] == "gym-tiny-sft-dpo" and first["model_version"] == "1"
    assert first["cached_tasks"] == 0

    client = MlflowClient(f"sqlite:///{gym_home / 'mlflow' / 'mlflow.db'}")
    version = client.get_model_version_by_alias("gym-tiny-sft-dpo", "challenger")
    assert str(version.version) == "1"
    assert version.tags["prefect_flow_run_id"] == first["flow_run_id"]
    assert version.tags["base_model"] == "gym-tiny" and len(version.tags["sft_dataset"]) == 16
    # The card's hyperparameters are what each stage trained with (the registry's and the paper's values,
    # not the flow's unset None), only those the stage reads (no RL settings for SFT or DPO).
    card = version.description
    assert "| `sft.learning_rate` | `0.003` |" in card and "| `dpo.beta` | `0.1` |" in card
    assert "`None`" not in card and ".rl." not in card and "`sft.beta`" not in card
    parent = client.get_run(first["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.params["model"] == "gym-tiny"
    assert parent.data.metrics["exact_match_after"] == pytest.approx(first["exact_match_after"])
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    names = {c.data.tags["mlflow.runName"]: c for c in children}
    assert {"sft", "dpo", "eval-before", "eval-after", "register"} <= set(names)
    sft_run = names["sft"]
    assert len(client.get_metric_history(sft_run.info.run_id, "train_loss")) >= 10
    assert "loss.png" in [a.path for a in client.list_artifacts(sft_run.info.run_id)]

    second = run_script([sys.executable, "flows/sft_then_dpo.py", "--json"], gym_home)
    assert second["cached_tasks"] >= 10, "every pipeline task is served from cache"
    assert second["model_version"] == "1", "nothing changed, so nothing new is registered"
    for key in ("sft_loss_last", "exact_match_after", "dpo_reward_accuracy"):
        assert second[key] == first[key]
    assert second["flow_run_id"] != first["flow_run_id"]

    third = run_script(
        [sys.executable, "flows/sft_then_dpo.py", "--json", "--dpo.learning_rate", "2e-4"], gym_home
    )
    assert third["model_version"] == "2"
    assert third["sft_loss_last"] == first["sft_loss_last"], "SFT is reused when only DPO changed"
    assert 0 < third["cached_tasks"] < second["cached_tasks"]


def test_gym_train_cli_runs_a_single_method_flow(gym_home):
    out = run_script(
        [
            str(Path(sys.executable).parent / "gym"),
            "train",
            "--method",
            "dpo",
            "--max-steps",
            "3",
            "--eval_limit",
            "8",
            "--output_dir",
            str(gym_home / "export"),
            "--data.default_system",
            "Answer briefly.",
            "--json",
        ],
        gym_home,
    )
    assert set(out) >= KEYS
    assert out["model_name"] == "gym-tiny-dpo" and out["model_version"] == "1"
    assert out["sft_loss_first"] is None and out["dpo_reward_accuracy"] is not None
    exported = gym_home / "export"
    assert (exported / "model.safetensors").is_file() and (exported / "gym_model.json").is_file()
    # the system message it trained with goes with the model: into the export and the registered version
    assert json.loads((exported / "gym_model.json").read_text())["default_system"] == "Answer briefly."
    uri = f"sqlite:///{gym_home / 'mlflow' / 'mlflow.db'}"
    version = MlflowClient(uri).get_model_version_by_alias("gym-tiny-dpo", "challenger")
    assert Lineage.from_tags(version.tags).default_system == "Answer briefly."


def test_gym_train_accepts_the_papers_flags_on_a_custom_dataset(gym_home, tmp_path):
    custom = tmp_path / "custom_dataset.jsonl"
    rows = [{"instruction": f"Double {i}.", "input": "", "output": str(2 * i)} for i in range(64)]
    custom.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    logs: list[str] = []
    out = run_script(
        [
            str(Path(sys.executable).parent / "gym"),
            "train",
            "--model_name_or_path",
            "gym-tiny",
            "--template",
            "chatml",
            "--dataset",
            str(custom),
            "--finetuning_type",
            "lora",
            "--num_train_epochs",
            "1",
            "--output_dir",
            str(gym_home / "out"),
            "--json",
        ],
        gym_home,
        logs=logs,
    )
    assert out["model_name"] == "gym-tiny-sft" and out["sft_loss_last"] is not None
    assert (gym_home / "out" / "model.safetensors").is_file()
    # Your own data is not scored on the demo's held-out tasks (eval_dataset: auto); the log says how to
    # score held-out data of your own.
    assert out["exact_match_before"] is None and out["exact_match_after"] is None
    assert "no exact match before/after" in logs[0] and "--eval_dataset" in logs[0]


def test_gym_train_explains_an_unavailable_model_offline(gym_home):
    env = {**os.environ, "GYM_HOME": str(gym_home), "PREFECT_HOME": str(gym_home / "ph")}
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "gym"),
            "train",
            "--model_name_or_path",
            "Qwen/Qwen3-7B",
            "--dataset",
            "demo_sft",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "Qwen/Qwen3-7B" in proc.stderr and "--template" in proc.stderr
