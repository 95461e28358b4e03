"""Training precision (gym.train.precision): a bfloat16 checkpoint, as most hub models are stored,
trains with float32 weights, so AdamW's small updates are not rounded away; bf16=True keeps frozen
weights in half precision; pure_bf16 keeps everything in bf16 and loses updates, as documented."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym import train
from gym.errors import ConfigError
from gym.models import ModelRef, load_model, resolve
from gym.train import TrainConfig, precision
from tests.helpers import tiny, tokenized


def copy_in(src: ModelRef, dtype: torch.dtype, folder: Path) -> ModelRef:
    """The model `src` stored in `dtype` (its tokenizer and template files beside it)."""
    load_model(src).to(dtype).save_pretrained(folder, safe_serialization=True)
    for f in Path(src.path).iterdir():
        if f.is_file() and not f.name.startswith(("model", "config")):
            shutil.copy(f, folder / f.name)
    return resolve(str(folder), src.template)


def weights(folder: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


def changed_share(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], names: list[str]) -> float:
    moved = sum(int((before[n].float() != after[n].float()).sum()) for n in names)
    return moved / sum(before[n].numel() for n in names)


@pytest.fixture
def bf16_tiny(tmp_path: Path) -> ModelRef:
    return copy_in(tiny(), torch.bfloat16, tmp_path / "tiny-bf16")


def sft(finetuning_type: str = "full", **fields) -> TrainConfig:
    return TrainConfig(
        method="sft",
        finetuning_type=finetuning_type,
        learning_rate=1e-5,  # a fine-tuning rate: most updates are below bf16's resolution
        max_steps=3,
        per_device_train_batch_size=8,
        logging_steps=1,
        **fields,
    )


def test_a_bf16_checkpoint_trains_float32_master_weights(bf16_tiny, tmp_path):
    # The same weights stored in float32 (an exact upcast) train to the very same model
    as_fp32 = copy_in(bf16_tiny, torch.float32, tmp_path / "tiny-fp32")
    data = tokenized("demo_sft", bf16_tiny, max_samples=32)
    result = train.run(sft(), bf16_tiny, data)
    reference = train.run(sft(), as_fp32, data)
    assert result.choices["precision"].startswith("bfloat16 checkpoint: the model loads in float32")
    before, after = weights(bf16_tiny.path), weights(result.model_dir)
    assert all(t.dtype == torch.float32 for t in after.values())
    assert changed_share(before, after, list(before)) > 0.99, "nearly every weight moved"
    expected = weights(reference.model_dir)
    assert all(torch.equal(after[n], expected[n]) for n in expected), "as if the checkpoint were float32"


def test_bf16_trains_float32_copies_and_keeps_frozen_weights_as_stored(bf16_tiny):
    data = tokenized("demo_sft", bf16_tiny, max_samples=32)
    result = train.run(sft("freeze", bf16=True, freeze={"layers": 1}), bf16_tiny, data)
    assert "frozen ones stay bfloat16" in result.choices["precision"]
    before, after = weights(bf16_tiny.path), weights(result.model_dir)
    trained = [n for n in before if ".layers.1." in n]
    frozen = [n for n in before if ".layers.0." in n]
    assert trained and frozen
    assert all(after[n].dtype == torch.float32 for n in trained)
    assert changed_share(before, after, trained) > 0.99
    assert all(after[n].dtype == torch.bfloat16 and torch.equal(after[n], before[n]) for n in frozen)


def test_pure_bf16_keeps_bf16_weights_and_needs_bf16(bf16_tiny):
    with pytest.raises(ValueError, match="set bf16=True too"):
        sft(pure_bf16=True, bf16=False)
    data = tokenized("demo_sft", bf16_tiny, max_samples=32)
    with pytest.raises(ConfigError, match="no GPU with bfloat16"):  # bf16 unset: off on this CPU
        train.run(sft(pure_bf16=True), bf16_tiny, data)
    from gym import preflight
    from gym.pipeline import TrainFlowConfig

    with pytest.raises(ConfigError, match=r"^train\.pure_bf16 needs bf16"):  # a flow: before anything runs
        preflight.check(TrainFlowConfig(train=sft(pure_bf16=True)))
    result = train.run(sft(bf16=True, pure_bf16=True), bf16_tiny, data)
    assert "pure_bf16" in result.choices["precision"]
    before, after = weights(bf16_tiny.path), weights(result.model_dir)
    assert all(t.dtype == torch.bfloat16 for t in after.values())
    assert changed_share(before, after, list(before)) < 0.5, "bf16 rounds most small updates away"


def test_a_trainer_that_adds_the_adapter_itself_gets_the_base_as_stored(bf16_tiny):
    """PPO's trainer applies the LoRA config (TRL's peft_config): the base it gets is not upcast."""
    from tests.test_online_rl import rl_config

    config = rl_config("ppo", 1, batch=8).model_copy(update={"finetuning_type": "lora", "bf16": True})
    result = train.run(config, bf16_tiny, tokenized("demo_prompts", bf16_tiny, max_samples=8))
    assert "frozen ones stay bfloat16" in result.choices["precision"]
    merged = weights(result.model_dir)
    assert all(t.dtype == torch.bfloat16 for t in merged.values()), "the LoRA merged into the bf16 base"


def test_bf16_unset_is_on_where_a_gpu_supports_it(monkeypatch):
    """No GPU here: what a GPU with bfloat16 would answer is stood in for (torch.cuda's two queries)."""
    config = TrainConfig(method="sft")
    assert config.bf16 is None
    assert precision.resolve(config) == (config.model_copy(update={"bf16": False}), {})  # this CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    resolved, choices = precision.resolve(config)
    assert resolved.bf16 is True and choices["bf16"].startswith("on: this GPU supports bfloat16")
    assert precision.resolve(TrainConfig(method="sft", bf16=False))[0].bf16 is False  # as set
