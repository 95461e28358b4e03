"""Prefect's task cache never serves a stale result: a changed file, registry or gym code re-runs the task."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task
from prefect.settings import PREFECT_TASKS_REFRESH_CACHE

import tasks._common
from flows.runner import main
from gym.data.ingest import load_meta
from gym.pipeline import TrainFlowConfig
from tasks._common import workspace_settings
from tasks.data import ingest_dataset
from tasks.model import resolve_model


@flow(name="test-ingest")
def ingest_flow(name: str) -> tuple[str, Any]:
    state = ingest_dataset(name, return_state=True)
    return state.name, state.result()


def run(name: str, refresh_cache: bool = False) -> tuple[str, Any]:
    with workspace_settings(refresh_cache=refresh_cache):
        return ingest_flow(name)


def write_records(path: Path, n: int) -> None:
    rows = [{"instruction": f"say {i}", "input": "", "output": str(i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "mine.jsonl"
    write_records(path, 3)
    return path


def test_editing_a_dataset_file_reruns_ingest(prefect_server, data_file):
    state, first = run(str(data_file))
    assert state == "Completed" and first.num_records == 3
    state, again = run(str(data_file))
    assert state == "Cached" and again.digest == first.digest

    write_records(data_file, 4)  # same name, new content: the cached artifact would be stale
    state, edited = run(str(data_file))
    assert state == "Completed" and edited.num_records == 4 and edited.digest != first.digest


def test_same_relative_name_in_another_directory_is_another_dataset(prefect_server, tmp_path, monkeypatch):
    for sub, n in (("a", 2), ("b", 5)):
        (tmp_path / sub).mkdir()
        write_records(tmp_path / sub / "data.jsonl", n)
    monkeypatch.chdir(tmp_path / "a")
    assert run("data.jsonl")[1].num_records == 2
    monkeypatch.chdir(tmp_path / "b")
    state, other = run("data.jsonl")
    assert state == "Completed" and other.num_records == 5


def test_a_change_to_gyms_code_or_registry_reruns_tasks(prefect_server, data_file, monkeypatch):
    run(str(data_file))
    assert run(str(data_file))[0] == "Cached"
    monkeypatch.setattr(tasks._common, "library_digest", lambda: "another-gym-version")
    assert run(str(data_file))[0] == "Completed"


def test_a_cached_result_whose_artifact_was_deleted_is_rebuilt(prefect_server, data_file):
    import shutil

    _, first = run(str(data_file))
    shutil.rmtree(first.path)  # deleted from the workspace; Prefect's cache still points at it
    state, rebuilt = run(str(data_file))
    assert state == "Completed" and rebuilt.digest == first.digest  # was "Cached": a path to nothing
    assert load_meta(rebuilt.path)["num_records"] == 3
    assert run(str(data_file))[0] == "Cached"  # the rebuilt result is served from then on

    shutil.rmtree(rebuilt.path)
    state, again = run(str(data_file), refresh_cache=True)
    assert state == "Completed" and load_meta(again.path)["num_records"] == 3


def test_an_edit_that_keeps_size_and_mtime_or_an_old_copy_put_back_reruns_ingest(prefect_server, data_file):
    import os
    import shutil

    original = data_file.with_suffix(".orig")
    shutil.copy2(data_file, original)
    _, first = run(str(data_file))
    data_file.write_text(data_file.read_text().replace('"say 1"', '"SAY 1"'))  # same size
    os.utime(data_file, ns=(original.stat().st_atime_ns, original.stat().st_mtime_ns))  # touch -r
    state, edited = run(str(data_file))
    assert state == "Completed" and edited.digest != first.digest
    shutil.copy2(original, data_file)  # cp -p: the old bytes with their old mtime
    state, restored = run(str(data_file))
    assert state == "Completed" and restored.digest == first.digest  # was the edited version's artifact


def test_a_copied_workspace_is_not_served_results_naming_the_old_ones_files(
    prefect_server, data_file, gym_home, monkeypatch
):
    import shutil

    _, first = run(str(data_file))
    copy = gym_home.parent / "copied_home"
    shutil.copytree(gym_home, copy)  # prefect/results with it
    monkeypatch.setenv("GYM_HOME", str(copy))
    state, there = run(str(data_file))
    assert state == "Completed" and Path(there.path).is_relative_to(copy) and there.digest == first.digest


def test_a_temp_folder_a_killed_process_left_is_removed_by_the_next_write(tmp_path):
    import subprocess
    import sys

    from gym import workspace

    # A writer killed mid-write (kill -9) leaves its temp dir and lock file; one still writing holds its lock.
    writer = (
        "import sys, time; from pathlib import Path; from gym import workspace\n"
        "with workspace.atomic_dir(Path(sys.argv[1])) as tmp:\n"
        "    (tmp / 'part').write_text('x'); print(tmp, flush=True); time.sleep(60)\n"
    )
    killed = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path / "art")], stdout=subprocess.PIPE)
    left = Path(killed.stdout.readline().decode().strip())  # type: ignore[union-attr]
    killed.kill()
    killed.wait()
    assert left.is_dir()
    live = subprocess.Popen([sys.executable, "-c", writer, str(tmp_path / "art")], stdout=subprocess.PIPE)
    try:
        writing = Path(live.stdout.readline().decode().strip())  # type: ignore[union-attr]
        assert not left.exists() and writing.is_dir()  # the next write of `art` removed it
        with workspace.atomic_dir(tmp_path / "art") as tmp:
            (tmp / "x").write_text("1")
        assert writing.exists() and (tmp_path / "art" / "x").is_file()  # a live writer's stays
    finally:
        live.kill()
        live.wait()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".art")) == [
        writing.name,
        writing.name + ".lock",
    ]


def test_a_reward_functions_code_is_part_of_an_online_stage_identity(tmp_path, monkeypatch):
    from gym.rewards.base import identity
    from gym.train import TrainConfig, stage_digest
    from tests.helpers import tiny

    (tmp_path / "myreward.py").write_text("def fn(completion):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = TrainConfig(method="grpo")
    config.rl.rewards = ["myreward:fn", "exact_match"]
    before, digest = identity(config.rl.rewards), stage_digest(config, tiny(), Path("t"), None)
    (tmp_path / "myreward.py").write_text("def fn(completion):\n    return 0.25\n")
    monkeypatch.delitem(sys.modules, "myreward")  # as the next run's process loads it
    assert identity(config.rl.rewards) != before and identity(["exact_match"]) == ["exact_match"]
    assert stage_digest(config, tiny(), Path("t"), None) != digest


def test_model_resolution_is_never_served_from_cache(prefect_server):
    @flow
    def resolve_twice() -> list[str]:
        return [resolve_model("gym-tiny", return_state=True).name for _ in range(2)]

    with workspace_settings():
        assert resolve_twice() == ["Completed", "Completed"]


def test_stamp_sees_edits_without_reading_content_and_library_digest_is_stable(tmp_path):
    import os

    from gym.hashing import library_digest, stamp

    f = tmp_path / "d" / "x.jsonl"
    assert stamp(f) == {"missing": str(f)}
    f.parent.mkdir()
    f.write_text("a")
    before_file, before_dir, with_ctime = stamp(f), stamp(f.parent), stamp(f, ctime=True)
    f.chmod(0o600)  # a chmod or a hard link changes only the ctime: a model folder's stamp stays
    assert stamp(f) == before_file and stamp(f.parent) == before_dir and stamp(f, ctime=True) != with_ctime
    os.utime(f, ns=(1, 1))  # same bytes, touched: treated as changed
    assert stamp(f) != before_file and stamp(f.parent) != before_dir
    assert library_digest() == library_digest.__wrapped__()  # computed the same way every time


@flow(name="probe")
def probe(config: TrainFlowConfig) -> dict[str, Any]:
    return {"refresh": PREFECT_TASKS_REFRESH_CACHE.value()}


def test_refresh_cache_flag_reaches_prefect(prefect_server, capsys):
    for argv, expected in (([], False), (["--refresh-cache"], True)):
        assert main(probe, TrainFlowConfig, [*argv, "--json"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["refresh"] is expected and summary["cached_tasks"] == 0


@task(name="recorded-late")
def recorded_late() -> None:
    """Never run: the test records its task runs through the API directly."""


@flow(name="recorded-late")
def recorded_late_flow() -> None:
    """Never run: it names the flow run the test records task runs for."""


def test_the_cached_count_waits_for_task_runs_the_api_has_not_recorded_yet(prefect_server):
    """A busy server (a temporary API working through its events) records a flow's task runs late:
    reads that find none of them yet are not the answer."""
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Pending

    from flows.runner import cached_task_count

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(recorded_late_flow)

    def record_later() -> None:
        time.sleep(1.0)  # five settle intervals with nothing recorded
        with get_client(sync_client=True) as client:
            runs = [
                client.create_task_run(recorded_late, flow_run.id, str(i), state=Pending()) for i in range(2)
            ]
            for run in runs:
                client.set_task_run_state(run.id, Completed(name="Cached"), force=True)

    recorder = threading.Thread(target=record_later)
    recorder.start()
    try:
        assert cached_task_count(str(flow_run.id), timeout_s=30) == 2
    finally:
        recorder.join()


@flow(name="test-train-cached")
def train_flow() -> tuple[str, Any]:
    from gym.data.tokenize import TokenizeSettings
    from gym.train import TrainConfig
    from tasks.data import tokenize_dataset
    from tasks.train import train_stage

    model = resolve_model("gym-tiny")
    data = tokenize_dataset(ingest_dataset("demo_sft"), model, TokenizeSettings(max_samples=32))
    state = train_stage(TrainConfig(method="sft", max_steps=2), model, data, return_state=True)
    return state.name, state.result()[0]


def test_a_cached_training_result_whose_weights_were_cut_short_is_trained_again(prefect_server, gym_home):
    from gym import workspace

    with workspace_settings():
        state, first = train_flow()
    weights = Path(first.model_dir) / "model.safetensors"
    whole = weights.read_bytes()
    with weights.open("r+b") as f:
        f.truncate(len(whole) // 2)  # a copy or a full disk cut it short; Prefect's cache still names it
    with workspace_settings():
        state, again = train_flow()
    assert state == "Completed", "was Cached: the damaged weights were handed on to register and serve"
    assert again.model_dir == first.model_dir and weights.read_bytes() == whole
    assert workspace.weights_problem(Path(again.model_dir)) is None
    with workspace_settings():
        assert train_flow()[0] == "Cached"


def test_adapter_settings_the_finetuning_type_does_not_read_leave_the_stage_as_it_is():
    # `--finetuning_type full --lora_rank 16` trained a new stage of the same weights (a note said the
    # settings were unused)
    from gym.train import TrainConfig, stage_digest
    from tests.helpers import tiny

    def digest(**settings) -> str:
        return stage_digest(TrainConfig(**settings), tiny(), Path("t"), None)

    full = digest(finetuning_type="full")
    assert digest(finetuning_type="full", lora={"r": 16}, freeze={"layers": 1}) == full
    assert digest(finetuning_type="full", quant={"bits": 8}, longlora={"shift_attention": False}) == full
    lora = digest(finetuning_type="lora")
    assert digest(finetuning_type="lora", lora={"r": 16}) != lora, "read: a stage of its own"
    assert digest(finetuning_type="lora", freeze={"layers": 1}) == lora
    assert digest(finetuning_type="freeze", freeze={"layers": 1}) != digest(finetuning_type="freeze")
    # and the checkpoints a run keeps: a run killed with save_steps 100 resumes with save_steps 20
    assert digest(finetuning_type="full", save_steps=20, save_total_limit=5) == full
    assert digest(finetuning_type="full", logging_steps=1) != full, "its recorded curve differs"
