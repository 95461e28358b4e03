"""Shared test helpers: the embedded model and small tokenized demo datasets in the test's workspace."""

from __future__ import annotations

from pathlib import Path

from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.data.tokenize import TokenizeSettings, tokenize
from gym.models import ModelRef, resolve


def tiny() -> ModelRef:
    return resolve("gym-tiny")


def tokenized(name: str, model: ModelRef, max_samples: int | None = None, **settings) -> Path:
    data = ingest(resolve_dataset(name))
    return Path(
        tokenize(
            data.path, model.path, model.template, TokenizeSettings(max_samples=max_samples, **settings)
        ).path
    )
