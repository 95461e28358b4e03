"""Model task: resolve a registry name, directory or hub id to a ModelRef (building gym-tiny if needed)."""

from __future__ import annotations

from prefect.cache_policies import NO_CACHE

from gym.models import ModelRef, resolve
from gym.vocab import extend
from tasks._common import IO_RETRIES, MODEL_TIMEOUT_S, gym_task


# Never cached: resolving is a lookup (~0.1 s) that must see the registry, a local model folder
# and the built gym-tiny as they are now. Its ModelRef's digest keys every task downstream.
# It may download a registered MLflow version: retried on transient errors, with a timeout.
@gym_task(
    name="resolve-model",
    task_run_name="resolve {name}",
    cache_policy=NO_CACHE,
    persist_result=False,
    timeout_seconds=MODEL_TIMEOUT_S,
    **IO_RETRIES,
)
def resolve_model(
    name: str,
    template: str | None = None,
    trust_remote_code: bool = False,
    new_special_tokens: list[str] | None = None,
) -> ModelRef:
    """The model; with `new_special_tokens`, its copy with them in its vocabulary (gym.vocab)."""
    return extend(resolve(name, template, trust_remote_code), new_special_tokens or [])
