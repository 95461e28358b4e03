"""Data tasks: ingest a dataset into an Arrow artifact; template and tokenize it for a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.data.ingest import ingest, source_stamp
from gym.data.registry import resolve_dataset
from gym.data.tokenize import TokenizeSettings, tokenize
from gym.models import ModelRef
from tasks._common import gym_task


@gym_task(name="ingest-dataset", task_run_name="ingest {name}", identity=source_stamp)
def ingest_dataset(name: str) -> Any:
    """Read, validate and normalize a dataset (registry name, path or hub id) into an artifact."""
    return ingest(resolve_dataset(name))


@gym_task(name="tokenize-dataset", task_run_name="tokenize {dataset.digest}")
def tokenize_dataset(dataset: Any, model: ModelRef, settings: TokenizeSettings) -> Any:
    """Render with the model's chat template, tokenize and mask labels into an artifact."""
    return tokenize(Path(dataset.path), model.path, model.template, settings, revision=model.revision)
