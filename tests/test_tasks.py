"""Task layer: each task's function (`task.fn`) calls gym and tracks in MLflow, without a Prefect server."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from gym import tracking
from gym.data.tokenize import TokenizeSettings
from gym.train import TrainConfig
from tasks.data import ingest_dataset, tokenize_dataset
from tasks.evaluate import exact_match
from tasks.model import resolve_model
from tasks.register import register_model
from tasks.train import train_stage


def test_tasks_chain_by_reference_and_track_in_nested_runs(gym_home):
    parent = tracking.start_run("flow")
    model = resolve_model.fn("gym-tiny")
    raw = ingest_dataset.fn("demo_sft")
    data = tokenize_dataset.fn(raw, model, TokenizeSettings(max_samples=256))
    assert data.kind == "sft" and data.num_records == 256

    config = TrainConfig(method="sft", learning_rate=3e-3, max_steps=20, per_device_train_batch_size=16)
    result, trained = train_stage.fn(config, model, data, None, parent)
    assert trained.path == result.model_dir and trained.digest == result.digest != model.digest
    assert trained.template == model.template and trained.base_model == "gym-tiny"

    held_out = ingest_dataset.fn("demo_sft_eval")
    em = exact_match.fn(trained, held_out, "after", 16, parent)
    assert em.n == 16 and 0.0 <= em.exact_match <= 1.0

    lineage = {"dataset": raw.digest}
    registered = register_model.fn(trained, "tiny-test", "challenger", lineage, parent, "flow-123")

    client = MlflowClient(tracking.tracking_uri())
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )
    by_name = {c.data.tags["mlflow.runName"]: c for c in children}
    assert {"sft", "eval-after", "register"} <= set(by_name)
    sft = by_name["sft"]
    assert sft.data.params["learning_rate"] == "0.003" and sft.data.params["dataset_digest"] == data.digest
    # Every setting the stage trained with has a value: the ones left unset read "None" before.
    concrete = tracking.redact(result.hyperparameters)
    assert not [k for k in concrete if sft.data.params.get(k, "None") == "None"]
    unset = [k for k, v in tracking.redact(config.model_dump()).items() if v == "None" and k in concrete]
    assert unset and all(sft.data.params[k] == concrete[k] for k in unset)
    curve = client.get_metric_history(sft.info.run_id, "train_loss")
    assert curve[-1].value < curve[0].value
    assert "loss.png" in [a.path for a in client.list_artifacts(sft.info.run_id)]
    version = client.get_model_version_by_alias("tiny-test", "challenger")
    assert str(version.version) == registered["version"] == "1"
    assert version.tags["dataset"] == raw.digest and version.tags["prefect_flow_run_id"] == "flow-123"
    assert version.tags["base_model"] == "gym-tiny"

    # The registered version is the trained model: same logits after a round trip through MLflow.
    import mlflow
    import torch
    from transformers import AutoModelForCausalLM

    with tracking.using_uri(tracking.tracking_uri()):
        loaded = mlflow.transformers.load_model("models:/tiny-test@challenger", return_type="components")
    ids = torch.tensor([[1, 872, 198, 2]])
    original = AutoModelForCausalLM.from_pretrained(trained.path)
    with torch.no_grad():
        assert torch.allclose(loaded["model"](ids).logits, original(ids).logits, atol=1e-6)


def test_a_registered_version_resolves_by_alias_and_loads_the_same_weights(gym_home):
    import torch

    from gym import tracking
    from gym.errors import ConfigError
    from gym.models import load_model, resolve

    base = resolve("gym-tiny")
    run_id = tracking.start_run("register")
    tracking.register_model(
        run_id, Path(base.path), "tiny-uri", {"template": "chatml", "base_model": "gym-tiny"}
    )
    ref = resolve("models:/tiny-uri@challenger")
    assert ref.template == "chatml" and ref.base_model == "gym-tiny"
    assert resolve("models:/tiny-uri/1").digest == ref.digest
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(load_model(base)(ids).logits, load_model(ref)(ids).logits)
    with pytest.raises(ConfigError, match="not found"):
        resolve("models:/tiny-uri@champion")


def test_a_model_uri_can_name_the_newest_version_and_a_missing_one_says_what_is_there(gym_home):
    """`models:/NAME/latest` (MLflow's own form) was "not found"; so was an alias the model lacks, without
    saying which it has."""
    from gym import tracking
    from gym.errors import ConfigError

    base, other = tiny_copies(gym_home)
    for folder in (base, other):
        tracking.register_model(tracking.start_run("register"), folder, "tiny-latest", {"template": "chatml"})
    assert tracking.resolve_model_uri("models:/tiny-latest/latest")[1] == "2"
    assert tracking.resolve_model_uri("models:/tiny-latest/LATEST")[1] == "2"
    for missing in ("models:/tiny-latest@nope", "models:/tiny-latest/7"):
        with pytest.raises(ConfigError) as caught:
            tracking.resolve_model_uri(missing)
        assert str(caught.value) == (
            f"MLflow model {missing!r} not found: 'tiny-latest' has aliases challenger -> 2; versions 1, 2"
        )
    with pytest.raises(ConfigError, match="not found in sqlite:"):
        tracking.resolve_model_uri("models:/nobody/latest")


def tiny_copies(root: Path) -> tuple[Path, Path]:
    """gym-tiny's folder and a copy with one weight changed (distinct content)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from gym.models import resolve

    base = Path(resolve("gym-tiny").path)
    other = Path(shutil.copytree(base, root / "tiny-other"))
    weights = load_file(other / "model.safetensors")
    first = next(iter(weights))
    weights[first] = weights[first] + 1
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    return base, other


def test_the_tokenize_task_run_is_named_for_the_records_max_samples_lets_through(gym_home, prefect_server):
    # It was named "tokenize 6000 sft records ..." when max_samples took 16 of them
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    @flow
    def names() -> str:
        from prefect.runtime import flow_run

        model, raw = resolve_model.fn("gym-tiny"), ingest_dataset.fn("demo_sft")
        tokenize_dataset(raw, model, TokenizeSettings(max_samples=16))
        tokenize_dataset(raw, model, TokenizeSettings(max_samples=16), as_prompts=True)
        return str(flow_run.get_id())

    run_id = names()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    got = sorted(r.name.split(" for ")[0] for r in runs)
    total = ingest_dataset.fn("demo_sft").num_records
    assert got == [f"tokenize 16 of {total} sft records", f"tokenize 16 of {total} sft records as prompts"]
