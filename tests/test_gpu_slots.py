"""GPU slots: tasks that put a model on the accelerator take a slot of the `gym-gpu` concurrency limit
where the Prefect API has one (`gym up` sets it), and ask for nothing where it has none."""

from __future__ import annotations

from typing import Any

import pytest
from prefect import flow
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.context import TaskRunContext
from prefect.exceptions import ObjectNotFound

from tasks import _common
from tasks._common import GPU_TAG, GpuTask, gym_task


def _active_slots() -> int | None:
    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(f"tag:{GPU_TAG}").active_slots
        except ObjectNotFound:
            return None


@gym_task(gpu=True, cache_policy=NO_CACHE, persist_result=False)
def on_gpu() -> tuple[list[str], int | None]:
    ctx = TaskRunContext.get()
    assert ctx is not None
    return sorted(ctx.task_run.tags), _active_slots()


@flow
def twice() -> list[tuple[list[str], int | None]]:
    return [on_gpu(), on_gpu.submit().result()]


def test_a_gpu_task_holds_a_slot_only_where_the_api_limits_the_tag(prefect_server: Any):
    asked: list[int] = []
    real = _common._has_gpu_limit

    def counting() -> bool:
        asked.append(1)
        return real()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_common, "_has_gpu_limit", counting)
        assert twice() == [([], None), ([], None)], "no limit: no tag, no slot"
        assert len(asked) == 1, "the API is asked once per flow run"
        with get_client(sync_client=True) as client:
            client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=1)
        try:
            # Both calls (direct and submitted) run holding the one slot, which is free again after.
            assert twice() == [([GPU_TAG], 1), ([GPU_TAG], 1)]
            assert len(asked) == 2
            assert _active_slots() == 0
        finally:
            with get_client(sync_client=True) as client:
                client.delete_concurrency_limit_by_tag(GPU_TAG)


def test_the_tasks_that_load_a_model_onto_the_accelerator_are_gpu_tasks():
    from tasks.evaluate import benchmark_eval, exact_match
    from tasks.train import train_stage

    for task in (train_stage, exact_match, benchmark_eval):
        assert isinstance(task, GpuTask), task.name
        assert GPU_TAG not in task.tags, "tagged at call time, where the API limits the tag"
