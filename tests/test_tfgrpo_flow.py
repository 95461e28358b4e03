"""The TF-GRPO flow through `gym train`, for real: Prefect tasks, MLflow, an OpenAI-compatible HTTP
endpoint on loopback (answering as the simulated policy and optimizer), resume, the papers' flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.cli import main
from flows.commands import method_of
from gym import tracking
from gym.errors import ConfigError
from gym.tfgrpo.injection import load_shipped
from gym.tfgrpo.library import Library
from gym.tfgrpo.sim import SimEnv, SimOptimizer, SimPolicy
from tests.tfgrpo_fakes import FakeEndpoint

ENV = SimEnv(seed=1, families=4, train_per_family=3, eval_per_family=2)


@pytest.fixture
def sim_endpoint():
    """An endpoint serving model "policy" and model "optimizer" as the simulated environment's."""
    policy, optimizer = SimPolicy(ENV), SimOptimizer()

    def answer(body):
        client = policy if body["model"] == "policy" else optimizer
        return client.complete(
            body["messages"], temperature=0, max_tokens=1, seed=body["seed"], n=body["n"]
        ).texts

    endpoint = FakeEndpoint(answer, jitter_s=0.003)
    with endpoint as url:
        endpoint.url = url
        yield endpoint


@pytest.fixture
def puzzles(tmp_path: Path) -> tuple[Path, Path]:
    """The environment's puzzles as question/answer JSON lines."""
    train, held_out = ENV.questions()
    files = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    for file, questions in zip(files, (train, held_out), strict=True):
        file.write_text(
            "".join(json.dumps({"question": q.text, "answer": q.answer}) + "\n" for q in questions)
        )
    return files


def summary_of(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_gym_train_tf_grpo_learns_tracks_ships_and_resumes(
    prefect_server, sim_endpoint, puzzles, gym_home, capsys
):
    train, held_out = puzzles
    argv = (
        f"train --method tf_grpo --endpoint {sim_endpoint.url} --model policy --optimizer.model optimizer "
        f"--dataset {train} --eval_dataset {held_out} --group-size 3 --epochs 1 --batch_size 4 "
        "--reward numeric --json"
    ).split()
    assert main(argv) == 0
    first = summary_of(capsys)
    assert first["metric_name"] == "mean_at_k" and len(first["mean_at_k"]) == 2
    assert first["mean_at_k"][-1] > first["mean_at_k"][0]
    assert first["library_size"] >= 1 and first["library_version"] >= 1 and first["degraded_steps"] == 0
    assert first["llm_calls"] == len(sim_endpoint.requests) and first["tokens"] > 0 and first["steps"] == 3
    # the library ships with the model: a model at an API ships experiences.json (no weights to register)
    library = Library.load(Path(first["run_dir"]) / "library.json")
    assert load_shipped(first["model_dir"]) == library.texts and first["model_version"] is None

    client = MlflowClient(f"sqlite:///{gym_home / 'mlflow' / 'mlflow.db'}")
    parent = client.get_run(first["mlflow_run_id"])
    nested = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    stage = next(r for r in nested if r.info.run_name == "tf_grpo")
    versions = [a.path for a in client.list_artifacts(stage.info.run_id, "libraries")]
    assert len(versions) == first["library_version"]  # every version the run produced
    assert [m.value for m in client.get_metric_history(stage.info.run_id, "heldout_mean_at_k")] == first[
        "mean_at_k"
    ]
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:
        diffs = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["tf-grpo-library-diff"]))
        )
    assert len([d for d in diffs if d.flow_run_id and str(d.flow_run_id) == first["flow_run_id"]]) == 3
    assert any("**added**" in str(d.data) for d in diffs)

    calls = len(sim_endpoint.requests)
    assert main(argv) == 0  # the same run again: every step resumed, every call from the cache
    again = summary_of(capsys)
    assert len(sim_endpoint.requests) == calls and again["paid_calls"] == 0
    assert again["library_hash"] == first["library_hash"] and again["mean_at_k"] == first["mean_at_k"]


@pytest.mark.slow
def test_a_spent_budget_stops_the_flow_with_its_own_message_and_a_resume_finishes(
    prefect_server, sim_endpoint, puzzles, capsys
):
    train, _ = puzzles
    argv = (
        f"train --method tf_grpo --endpoint {sim_endpoint.url} --model policy --optimizer.model optimizer "
        f"--dataset {train} --eval_dataset none --group-size 3 --epochs 1 --batch_size 4 --reward numeric "
        "--json"
    ).split()
    assert main([*argv, "--budget_tokens", "50"]) == 2
    # the run ends with the budget's own message (Prefect's console handler, writing to a stream pytest
    # has closed, may add "Logging error" noise above it: that is the test harness, not the CLI)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: token budget spent") and "raise --budget_tokens" in last
    asked = len(sim_endpoint.requests)
    assert main(argv) == 0  # the budget is not part of what the run learns: the same run, resumed
    out = summary_of(capsys)
    assert out["steps"] == 3 and out["paid_calls"] == len(sim_endpoint.requests) - asked > 0
    bodies = [json.dumps(body, sort_keys=True) for body in sim_endpoint.requests]
    assert len(set(bodies)) == len(bodies)  # no call made before the stop was made again


@pytest.mark.slow
def test_the_papers_command_line(prefect_server, sim_endpoint, puzzles, tmp_path, capsys):
    train, _ = puzzles
    lib_dir, out_dir = tmp_path / "experience_lib", tmp_path / "qwen3-tfgrpo"
    argv = (
        f"train --model_name_or_path policy --dataset {train} --finetuning_type grpo --training_free_grpo "
        f"--group_size 3 --grpo_experience_lib_path {lib_dir} --num_train_epochs 1 --output_dir {out_dir} "
        f"--endpoint {sim_endpoint.url} --optimizer.model optimizer --eval_dataset none --reward numeric "
        "--json"
    ).split()
    assert main(argv) == 0
    shown = capsys.readouterr()
    out = json.loads(shown.out.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["mean_at_k"] == []  # 12 questions in batches of 8, one epoch
    # the console follows the steps, as a training stage's progress does
    assert "tf_grpo: 2 steps\n" in shown.err and "tf_grpo: done, 2 steps in " in shown.err
    final = Library.load(lib_dir / "experiences.json")
    assert (
        final.content_hash() == out["library_hash"] and len(list((lib_dir / "versions").glob("v*.json"))) >= 1
    )
    assert load_shipped(out_dir) == final.texts
    assert {r["model"] for r in sim_endpoint.requests} == {"policy", "optimizer"}


@pytest.mark.parametrize(
    ("argv", "method", "rest"),
    [
        ("--finetuning_type grpo --training_free_grpo --group_size 5", "tf_grpo", "--group_size 5"),
        (
            "--finetuning_type grpo --grpo_training_free --grpo_group_size 5 --grpo_experience_lib_path=./l",
            "tf_grpo",
            "--group_size 5 --experience_lib_path=./l",
        ),
        ("--method tf_grpo --group-size 4", "tf_grpo", "--group-size 4"),
        ("--finetuning_type grpo", "grpo", ""),
        # a boolean flag as every other: `--x true|false` and `--no-x` (false: online GRPO, as asked)
        ("--finetuning_type grpo --training_free_grpo true --group_size 5", "tf_grpo", "--group_size 5"),
        ("--finetuning_type grpo --training_free_grpo false", "grpo", ""),
        ("--finetuning_type grpo --grpo_training_free=false", "grpo", ""),
        ("--finetuning_type grpo --no-training_free_grpo", "grpo", ""),
        ("--finetuning_type lora --method dpo", "dpo", ""),
    ],
)
def test_gym_train_routes_the_training_free_flags(argv, method, rest):
    got, _, remaining = method_of(argv.split())
    assert got == method and remaining == rest.split()


def test_the_command_lines_training_free_false_overrides_a_files_true():
    from flows.commands import methods_of

    assert methods_of(["--training_free_grpo"], ["--finetuning_type", "grpo"], None)[0] == "tf_grpo"
    cli = ["--finetuning_type", "grpo", "--training_free_grpo", "false"]
    assert methods_of(["--training_free_grpo"], cli, None)[0] == "grpo"
    assert methods_of(["--training_free_grpo=false"], ["--finetuning_type", "grpo"], None)[0] == "grpo"
    # a file that contradicts itself is named (the error blamed a flag)
    with pytest.raises(ConfigError, match=r"^run.yaml: --training_free_grpo .* method 'dpo' has no training"):
        methods_of(["--stage=dpo", "--training_free_grpo"], [], Path("run.yaml"))


def test_benchmarks_with_a_policy_behind_an_endpoint_fail_before_any_work(capsys):
    endpoint = "http://127.0.0.1:9/v1"  # nothing listens there: nothing may be asked of it either
    argv = f"train --method tf_grpo --endpoint {endpoint} --model policy --benchmarks mmlu".split()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: benchmarks:") and "weights" in err and "Traceback" not in err


@pytest.mark.slow
def test_benchmarks_score_the_model_before_and_with_its_library_after(prefect_server, tmp_path, capsys):
    from gym.models import resolve
    from gym.tfgrpo.injection import shipped_library
    from gym.tfgrpo.ops import Add, apply
    from tests.eval_fixtures import write_benchmark

    mmlu = write_benchmark("mmlu", tmp_path / "mmlu", n_questions=2, n_dev=1)
    start = apply(Library(), [Add(text="When unsure, answer A."), Add(text="When counting, count twice.")])
    lib_dir, data = tmp_path / "lib", tmp_path / "qa.jsonl"
    start.library.save(lib_dir / "experiences.json")  # the run starts from it; gym-tiny teaches it nothing
    data.write_text('{"question": "2+2?", "answer": "4"}\n{"question": "3+3?", "answer": "6"}\n')
    argv = (
        f"train --method tf_grpo --model gym-tiny --dataset {data} --eval_dataset none --group-size 2 "
        f"--epochs 1 --experience_lib_path {lib_dir} --policy.max_tokens 4 --benchmarks mmlu={mmlu} "
        "--benchmark_options.limit 2 --benchmark_options.shots 1 --json"
    ).split()
    assert main(argv) == 0
    out = summary_of(capsys)
    assert 0 <= out["mmlu_before"] <= 1 and 0 <= out["mmlu_after"] <= 1
    assert out["library_hash"] == start.library.content_hash() and load_shipped(out["model_dir"])

    client = MlflowClient(tracking.tracking_uri())
    parent = client.get_run(out["mlflow_run_id"])
    nested = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    runs = {r.info.run_name: r.info.run_id for r in nested}
    scored = {}
    for label in ("before", "after"):
        path = client.download_artifacts(runs[f"mmlu-{label}"], f"mmlu-{label}.json", str(tmp_path))
        scored[label] = json.loads(Path(path).read_text())
    # before: gym-tiny as it is; after: the shipped model, its library injected into every prompt
    assert scored["before"]["experiences"] is None
    assert scored["after"]["experiences"] == {"hash": out["library_hash"], "version": 1, "size": 2}
    assert scored["after"]["overall"] == out["mmlu_after"]
    tags = client.get_run(runs["mmlu-after"]).data.tags
    assert tags["experiences_hash"] == out["library_hash"] and tags["experiences_size"] == "2"
    assert "experiences_hash" not in client.get_run(runs["mmlu-before"]).data.tags
    # the registered version carries the library too: evaluating or serving models:/... injects it
    registered = resolve(f"models:/{out['model_name']}/{out['model_version']}")
    assert shipped_library(registered.path) == shipped_library(out["model_dir"])
    version_tags = tracking.resolve_model_uri(f"models:/{out['model_name']}/{out['model_version']}")[3]
    assert float(version_tags["score.mmlu_after"]) == out["mmlu_after"]  # the registry has the scores
