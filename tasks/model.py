"""Model task: resolve a registry name, directory or hub id to a ModelRef (building gym-tiny if needed)."""

from __future__ import annotations

from gym.models import ModelRef, resolve
from tasks._common import gym_task


@gym_task(name="resolve-model", task_run_name="resolve {name}")
def resolve_model(name: str, template: str | None = None, trust_remote_code: bool = False) -> ModelRef:
    return resolve(name, template, trust_remote_code)
