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


ARCHITECTURES = {  # families in registry/ (config-built, tiny): their own masks, windows, norms, heads
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 8}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "eos_token_id": 1}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 8, "sliding_window": 4}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 8, "sliding_window": 4}),
}


HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_snapshot(cache: Path, repo_id: str, kind: str = "models") -> Path:
    """The (empty) snapshot folder of `repo_id` (a model, or `kind` "datasets") at main in Hugging Face
    cache `cache`, as a finished download leaves it."""
    storage = cache / f"{kind}--{repo_id.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(HUB_COMMIT)
    snapshot = storage / "snapshots" / HUB_COMMIT
    snapshot.mkdir(parents=True)
    return snapshot
