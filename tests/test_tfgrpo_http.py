"""Training-Free GRPO against a real OpenAI-compatible server serving gym-tiny on loopback: the tiny
model's nonsense must end in degraded-but-safe steps (never a crash, never a corrupted library);
the local transformers client; GRPOTrainer over a transformers model in memory."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.cli import main
from gym.models import ModelRef, load_model, load_tokenizer, resolve
from gym.tfgrpo.clients import LocalClient, OpenAIClient
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import load_questions
from gym.tfgrpo.engine import train
from gym.tfgrpo.injection import load_shipped
from gym.tfgrpo.library import Library
from gym.tfgrpo.runtime import Runtime
from gym.tfgrpo.sim import SimEnv, SimPolicy
from gym.tfgrpo.step import load_manifest
from gym.train.grpo import GRPOTrainer
from gym.train.grpo.experience_manager import ExperienceManager
from tests.tfgrpo_fakes import FakeEndpoint
from tests.tfgrpo_server import TinyServer

MSG = [{"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def tiny_ref(tmp_path_factory) -> ModelRef:
    """gym-tiny, built once for the module (its ModelRef points at an absolute directory)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(tmp_path_factory.mktemp("tiny_home")))
        return resolve("gym-tiny")


@pytest.fixture(scope="module")
def tiny_url(tiny_ref):
    with TinyServer(tiny_ref) as url:
        yield url


def test_local_client_is_seeded_and_batched(tiny_ref):
    client = LocalClient(tiny_ref)
    a = client.complete(MSG, temperature=1.0, max_tokens=6, seed=3, n=3)
    b = client.complete(MSG, temperature=1.0, max_tokens=6, seed=3, n=3)
    assert a == b and len(a.texts) == 3 and a.usage.completion_tokens > 0
    assert client.identity.startswith("local:gym-tiny@")


def test_tiny_model_over_http_as_policy_and_judge_degrades_safely(tiny_url, tmp_path):
    questions, digest = load_questions("demo_sft", limit=3)
    settings = TfGrpoSettings(
        group_size=2, epochs=1, batch_size=3, reward="judge", policy={"max_tokens": 12}, seed=4
    )
    clients = {"policy": OpenAIClient(tiny_url, "gym-tiny", max_n=2)}
    rt = Runtime(settings, model="gym-tiny", dataset=digest, clients=clients, run_dir=tmp_path / "run")
    result = train(rt, questions)
    manifest = load_manifest(rt.run_dir, 0)
    # the judge's replies are nonsense: no verdict, rewards unknown, no group may teach anything
    assert manifest.status == "degraded" and all(g.reason.startswith("incomplete") for g in manifest.groups)
    assert set(manifest.usage) == {"rollout", "judge"} and manifest.usage["rollout"].calls == 3
    assert manifest.usage["judge"].calls == 6 and result.library_version == 0
    assert Library.load(result.library_file) == Library()


@pytest.mark.slow
def test_flow_over_http_with_gym_tiny_optimizer_degrades_safely(prefect_server, tiny_url, tmp_path, capsys):
    env = SimEnv(seed=1, families=4, train_per_family=2, eval_per_family=0)
    policy = SimPolicy(env)
    train_q, _ = env.questions()
    data = tmp_path / "puzzles.jsonl"
    data.write_text("".join(json.dumps({"question": q.text, "answer": q.answer}) + "\n" for q in train_q))
    endpoint = FakeEndpoint(
        lambda body: (
            policy.complete(
                body["messages"], temperature=0, max_tokens=1, seed=body["seed"], n=body["n"]
            ).texts
        )
    )
    with endpoint as policy_url:
        argv = (
            f"train --method tf_grpo --endpoint {policy_url} --model policy --optimizer.endpoint {tiny_url} "
            f"--optimizer.model gym-tiny --optimizer.max_tokens 24 --dataset {data} --eval_dataset none "
            "--group-size 4 --epochs 1 --batch_size 4 --reward numeric --json"
        ).split()
        assert main(argv) == 0
        first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        run_dir = Path(first["run_dir"])
        manifests = [load_manifest(run_dir, i) for i in range(first["steps"])]
        informative = [m for m in manifests if any(g.informative for g in m.groups)]
        assert informative and all(m.status == "degraded" for m in informative)
        for m in informative:  # junk, then one repair, then only what was valid (nothing)
            assert m.usage["extract"].calls == m.usage["extract_repair"].calls >= 1
            assert "consolidate" not in m.usage and m.library_out == m.library_in
        assert first["degraded_steps"] == len(informative) and first["library_version"] == 0
        assert Library.load(run_dir / "library.json") == Library() and load_shipped(first["model_dir"]) == []

        assert main(argv) == 0  # a resume redoes the degraded steps with fresh optimizer calls
        again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert again["paid_calls"] == sum(m.usage["extract"].calls * 2 for m in informative)
        assert all(load_manifest(run_dir, m.step).attempt == 1 for m in informative)
        assert again["library_hash"] == first["library_hash"]


def test_grpo_trainer_over_a_transformers_model_in_memory(tiny_ref, tmp_path):
    import torch

    model, tokenizer = load_model(tiny_ref), load_tokenizer(tiny_ref)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    em = ExperienceManager(library_path=tmp_path / "lib")
    trainer = GRPOTrainer(
        model=model,
        tokenizer=tokenizer,
        args=SimpleNamespace(num_train_epochs=1, output_dir=str(tmp_path / "out")),
        experience_manager=em,
        training_free=True,
        train_dataset=[{"question": "2+2?", "answer": "4"}, {"question": "3+3?", "answer": "6"}],
        template=tiny_ref.template,
        group_size=2,
        policy={"max_tokens": 8},
        optimizer={"max_tokens": 16},
    )
    result = trainer.train()
    assert result.steps == 1 and result.llm_calls >= 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no weight moved
    out = tmp_path / "out"
    assert (out / "model.safetensors").is_file() and load_shipped(out) == em.library.texts


def test_gym_train_run_selects_tf_grpo_and_ships_the_library_with_the_model(tiny_ref, tmp_path):
    from gym.data.ingest import ingest
    from gym.tfgrpo.data import dataset_spec
    from gym.train import TrainConfig, run

    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "2+2?", "answer": "4"}\n')
    ingested = ingest(dataset_spec(str(data)))
    result = run(TrainConfig(method="tf_grpo", num_train_epochs=1), tiny_ref, ingested.path)
    assert result.method == "tf_grpo" and result.global_step == 1 and result.trainable_params == 0
    shipped = Path(result.model_dir)
    assert (shipped / "model.safetensors").is_file() and load_shipped(shipped) is not None
    assert json.loads((shipped / "gym_model.json").read_text())["method"] == "tf_grpo"
    assert resolve(str(shipped)).template == tiny_ref.template  # loads like any gym model
