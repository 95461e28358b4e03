"""Training-Free GRPO against gym's own OpenAI-compatible server (gym.serve: Engine + build_app on a
loopback port 0) serving gym-tiny: the tiny model's nonsense must end in degraded-but-safe steps
(never a crash, never a corrupted library); the local transformers client; GRPOTrainer over a
transformers model in memory.

One server per module. In the flow test the policy is the simulated environment's (scripted, over
tests/tfgrpo_fakes.py): gym-tiny solves nothing, so only a policy that sometimes succeeds makes groups
informative and sends gym-tiny, as the optimizer, prompts whose junk replies must be survived."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flows.cli import main
from gym.models import ModelRef, load_model, load_tokenizer, resolve
from gym.tfgrpo.clients import LLMError, LocalClient, OpenAIClient
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import load_questions
from gym.tfgrpo.engine import train
from gym.tfgrpo.injection import load_shipped
from gym.tfgrpo.library import Library
from gym.tfgrpo.runtime import Runtime
from gym.tfgrpo.sim import SimEnv, SimPolicy
from gym.tfgrpo.step import load_manifest, manifest_path
from gym.train.grpo import GRPOTrainer
from gym.train.grpo.experience_manager import ExperienceManager
from tests.tfgrpo_fakes import FakeEndpoint

MSG = [{"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def tiny_ref(tmp_path_factory) -> ModelRef:
    """gym-tiny, built once for the module (its ModelRef points at an absolute directory)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(tmp_path_factory.mktemp("tiny_home")))
        return resolve("gym-tiny")


@pytest.fixture(scope="module")
def served(tiny_ref):
    """gym serve's engine over gym-tiny and the base URL of its API (…/v1)."""
    from gym.serve import Engine
    from gym.serve.app import build_app
    from gym.serve.server import serve_in_thread

    engine = Engine.load(tiny_ref.path, template=tiny_ref.template, name="gym-tiny")
    with engine, serve_in_thread(build_app(engine)) as url:
        yield SimpleNamespace(engine=engine, url=f"{url}/v1")


@pytest.fixture()
def tiny_url(served):
    return served.url


def test_local_client_is_seeded_and_batched(tiny_ref):
    client = LocalClient(tiny_ref)
    a = client.complete(MSG, temperature=1.0, max_tokens=6, seed=3, n=3)
    b = client.complete(MSG, temperature=1.0, max_tokens=6, seed=3, n=3)
    assert a == b and len(a.texts) == 3 and a.usage.completion_tokens > 0
    assert client.identity.startswith("local:gym-tiny@")


def test_local_client_batches_calls_made_at_once_each_as_if_alone(tiny_ref):
    """Calls from several threads (TF-GRPO's rollouts and optimizer stages) share the engine's batches;
    each reply is the one the call gets alone, and no reply runs past gym-tiny's 512-token window."""
    from concurrent.futures import ThreadPoolExecutor

    client = LocalClient(tiny_ref)
    asks = [[{"role": "user", "content": f"item {i}: " + "word " * (i % 4)}] for i in range(12)]

    def call(messages):
        return client.complete(messages, temperature=0.0, max_tokens=8, seed=0, n=2)

    alone = [call(m) for m in asks]
    engine = client._load()[0]
    before = engine.stats["batches"]
    with ThreadPoolExecutor(12) as pool:
        together = list(pool.map(call, asks))
    assert together == alone
    assert engine.stats["batches"] - before < len(asks) and engine.stats["largest_batch"] > 2
    long = client.complete(MSG, temperature=1.0, max_tokens=2000, seed=5)  # the engine alone refuses 2000
    assert long.usage.prompt_tokens + long.usage.completion_tokens <= 512
    with pytest.raises(LLMError, match=r"the prompt has \d+ tokens and the model's context window is 512"):
        client.complete([{"role": "user", "content": "word " * 600}], temperature=0.0, max_tokens=5, seed=1)


def test_local_client_stops_at_the_model_window(tiny_ref):
    """Replies end where the model's positions do (as gym serve's limit does) instead of running past
    them; a prompt that fills the window is a failed call that says why."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gym.tfgrpo.clients import LoadedClient

    tokenizer = load_tokenizer(tiny_ref)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=64,
                         tie_word_embeddings=False)  # fmt: skip
    model = LlamaForCausalLM(config)
    model.generation_config.suppress_tokens = [tokenizer.eos_token_id]  # only a limit ends a reply
    client = LoadedClient(model, tokenizer, template="chatml")
    out = client.complete(MSG, temperature=0.0, max_tokens=500, seed=1, n=2)
    assert out.usage.prompt_tokens + out.usage.completion_tokens // 2 == 64, out.usage
    short = client.complete(MSG, temperature=0.0, max_tokens=5, seed=1)
    assert short.usage.completion_tokens == 5  # room enough: max_tokens as asked
    with pytest.raises(LLMError, match=r"the prompt has \d+ tokens and the model's context window is 64"):
        client.complete([{"role": "user", "content": "word " * 80}], temperature=0.0, max_tokens=5, seed=1)


def test_tiny_model_over_http_as_policy_and_judge_degrades_safely(served, tmp_path):
    questions, digest = load_questions("demo_sft", limit=3)
    settings = TfGrpoSettings(
        group_size=2, epochs=1, batch_size=3, reward="judge", policy={"max_tokens": 12}, seed=4
    )

    def run(where: Path) -> tuple[Runtime, Any]:
        clients = {"policy": OpenAIClient(served.url, "gym-tiny", max_n=2)}
        rt = Runtime(settings, model="gym-tiny", dataset=digest, clients=clients, run_dir=where,
                     cache_dir=where / "calls")  # fmt: skip
        return rt, train(rt, questions)

    rows = served.engine.stats["rows"]
    rt, result = run(tmp_path / "run")
    # 3 rollout calls of n=2 and 6 judge calls, all answered by gym serve's engine
    assert served.engine.stats["rows"] - rows == 12
    manifest = load_manifest(rt.run_dir, 0)
    assert all(r.text is not None for g in manifest.groups for r in g.rollouts)
    # the judge's replies are nonsense: no verdict, rewards unknown, no group may teach anything
    assert manifest.status == "degraded" and all(g.reason.startswith("incomplete") for g in manifest.groups)
    assert set(manifest.usage) == {"rollout", "judge"} and manifest.usage["rollout"].calls == 3
    assert manifest.usage["judge"].calls == 6 and result.library_version == 0
    assert Library.load(result.library_file) == Library()
    # seeded calls: a fresh run (no cache) gets the same replies from the server, the same manifest
    again, _ = run(tmp_path / "again")
    assert served.engine.stats["rows"] - rows == 24
    assert manifest_path(again.run_dir, 0).read_bytes() == manifest_path(rt.run_dir, 0).read_bytes()


def test_a_run_gym_serve_refused_for_context_length_says_so_and_names_max_tokens(served, tmp_path):
    """Every policy call refused with a 400 (max_tokens past gym-tiny's 512-token context) ended with
    "check that the endpoint is up and reachable and its API key is set", which points the wrong way."""
    from gym.errors import ConfigError

    questions, digest = load_questions("demo_sft", limit=2)
    settings = TfGrpoSettings(
        endpoint=served.url, group_size=2, epochs=1, batch_size=2, policy={"max_tokens": 1000}, seed=4
    )  # under the server's cap (1,024), past the model's context (512)
    rt = Runtime(settings, model="gym-tiny", dataset=digest, run_dir=tmp_path / "run", cache_dir=tmp_path)
    with pytest.raises(ConfigError) as caught:
        train(rt, questions)
    message = str(caught.value)
    assert (
        "the endpoint refused the requests (HTTP 400: this model's maximum context length is 512" in message
    )
    assert "lower the policy's max_tokens (now 1000: --policy.max_tokens N" in message
    assert "reachable" not in message


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
        for m in informative:
            groups = [g for g in m.groups if g.informative]
            # gym-tiny's junk summaries are free text, kept as they are; the extract prompt quoting them
            # exceeds gym-tiny's context window, which gym serve refuses (400): recorded, not retried
            # with a repair prompt, nothing applied, no consolidation
            assert all(s for g in groups for s in g.summaries)
            assert all(g.extraction and "maximum context length" in g.extraction.errors[0] for g in groups)
            assert "extract_repair" not in m.usage and "consolidate" not in m.usage
            assert m.library_out == m.library_in
        assert first["degraded_steps"] == len(informative) and first["library_version"] == 0
        assert Library.load(run_dir / "library.json") == Library() and load_shipped(first["model_dir"]) == []

        assert main(argv) == 0  # a resume redoes the degraded steps with fresh optimizer calls
        again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        redone = [load_manifest(run_dir, m.step) for m in informative]
        assert all(r.attempt == 1 and r.status == "degraded" for r in redone)
        # every completed call (rollouts, summaries) came from the cache; the refused ones were asked again
        assert again["paid_calls"] == 0
        asked = sum(m.usage["extract"].calls for m in informative)
        assert sum(r.usage["extract"].calls for r in redone) == asked
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


REWARD_CALLS: list[int] = []


def distinct_characters(completion: str) -> float:
    """A reward that differs between gym-tiny's random completions (so advantages are not all 0)."""
    REWARD_CALLS.append(1)
    return len(set(completion)) / 10


def test_grpo_trainer_without_training_free_runs_online_grpo(tiny_ref, tmp_path):
    import torch

    model, tokenizer = load_model(tiny_ref), load_tokenizer(tiny_ref)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    em = ExperienceManager(library_path=tmp_path / "lib")
    trainer = GRPOTrainer(
        model=model,
        tokenizer=tokenizer,
        args=SimpleNamespace(max_steps=2, learning_rate=1e-2, output_dir=str(tmp_path / "out"), seed=3),
        finetuning_args=SimpleNamespace(grpo_group_size=4, max_completion_length=8),
        experience_manager=em,
        training_free=False,
        train_dataset=[{"question": "2+2?", "answer": "4"}, {"question": "3+3?", "answer": "6"}],
        template=tiny_ref.template,
        reward_funcs=[distinct_characters],
    )
    out = trainer.train()
    assert out.global_step == 2 and len(REWARD_CALLS) >= 8  # two steps of one group of 4
    moved = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert moved and em.library == Library() and not (tmp_path / "out" / "experiences.json").exists()
    assert (tmp_path / "out" / "model.safetensors").is_file()


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


def test_gym_serve_names_what_it_serves_and_the_client_keys_its_calls_by_it(served, tmp_path):
    """Another model served under the same URL and name reused the first one's cached calls: gym serve
    lists a digest of what answers (weights, template, library), and the client's identity holds it."""
    assert served.engine.digest
    client = OpenAIClient(served.url, "gym-tiny")
    assert client.identity == f"openai:{served.url}#gym-tiny@{served.engine.digest}"


def test_a_local_optimizer_past_its_window_is_told_what_fills_it_not_to_check_an_endpoint(tiny_ref, tmp_path):
    """A model run in this process (no endpoint) whose extract prompt, quoting its own summaries, fills its
    512-token window: the run said "check that the endpoint is up and reachable and its API key is set",
    and to use "fewer experiences, a shorter question", neither of which is in that prompt. Now it names
    what is."""
    env = SimEnv(seed=1, families=4, train_per_family=2, eval_per_family=0)
    train_q, _ = env.questions()
    settings = TfGrpoSettings(group_size=4, epochs=1, batch_size=4, reward="numeric", seed=2)
    clients = {"policy": SimPolicy(env), "optimizer": LocalClient(tiny_ref.path, template=tiny_ref.template)}
    rt = Runtime(settings, model=None, clients=clients, run_dir=tmp_path / "run", cache_dir=tmp_path / "c")
    with pytest.warns(RuntimeWarning, match="all 1 steps degraded") as caught:
        train(rt, train_q, max_steps=1)
    message = str(caught[0].message)
    assert "context window is 512: nothing is left to generate" in message
    fix = "the extract prompt quotes the optimizer's earlier replies, each up to its max_tokens (now 1024): "
    assert fix + "lower --optimizer.max_tokens" in message
    assert "endpoint" not in message and "API key" not in message and "shorter question" not in message
