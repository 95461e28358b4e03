"""The precision a stage trains in: float32 weights for the optimizer, bf16 compute where a GPU has it.

Hub checkpoints are mostly stored in bfloat16. Trained as loaded, AdamW's updates land on bf16
weights, whose 8-bit mantissa rounds away any update below ~0.4% of a weight: at a fine-tuning
learning rate (1e-5) most of them. So, as LLaMA-Factory does (and TRL, which loads a model path in
float32 and trains it under bf16 autocast by default):
- bf16=False (or unset on a machine without a GPU with bfloat16): the model loads in float32 (a bf16
  checkpoint upcasts exactly) and trains in float32;
- bf16=True (or unset where a GPU supports bfloat16, TRL's default): weights load as stored (frozen
  ones stay bf16: a LoRA base costs half the memory), the trainable ones are upcast to float32
  (master weights) and the forward runs under bf16 autocast;
- pure_bf16=True (with bf16): everything, optimizer states included, stays bf16: half the memory of
  full fine-tuning, at the cost above (LLaMA-Factory's pure_bf16).
QLoRA's loading (gym.train.quant) sets its own compute dtype; PEFT upcasts LoRA weights itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym.errors import ConfigError
from gym.models import ModelRef
from gym.train.config import TrainConfig

HALF = ("bfloat16", "float16")


def gpu_bf16() -> bool:
    """Whether this machine has a GPU with bfloat16 (Ampere or newer)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def bf16_on(config: TrainConfig) -> bool:
    """Whether the stage trains with bf16: as set, or (None) where a GPU supports it."""
    return gpu_bf16() if config.bf16 is None else config.bf16


def resolve(config: TrainConfig) -> tuple[TrainConfig, dict[str, str]]:
    """The config with `bf16` decided (None: on where a GPU supports it), and the choice in words when
    gym made it; pure_bf16 without bf16 is refused here."""
    choices = {}
    told_off = config.bf16 is False
    if config.bf16 is None:
        config = config.model_copy(update={"bf16": gpu_bf16()})
        if config.bf16:
            choices["bf16"] = "on: this GPU supports bfloat16 (--train.bf16 false trains in float32)"
    if config.pure_bf16 and not config.bf16:
        why = "bf16 is off" if told_off else "this machine has no GPU with bfloat16 (bf16 is off)"
        raise ConfigError(
            f"pure_bf16 needs bf16, and {why}: turn bf16 on too (--train.bf16; on a CPU it trains, "
            "slowly on most), or pure_bf16 off"
        )
    return config, choices


def load_dtype(config: TrainConfig) -> Any:
    """The `dtype` the stage's model loads with (gym.models.load_model)."""
    import torch

    if config.pure_bf16:
        return torch.bfloat16
    return "auto" if bf16_on(config) else torch.float32


def upcast_trainable(model: Any, config: TrainConfig) -> int:
    """Give every trainable half-precision tensor a float32 copy to train (unless pure_bf16); returns
    how many were upcast. Tied tensors (one Parameter) stay tied."""
    import torch

    if config.pure_bf16:
        return 0
    upcast = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()
            upcast += 1
    return upcast


def stored_dtype(model: ModelRef) -> str | None:
    """The dtype the checkpoint's config.json records (`dtype`, or `torch_dtype` before transformers 5)."""
    path = Path(model.path) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = config.get("dtype") or config.get("torch_dtype")
    return str(found) if found else None


def choice(config: TrainConfig, model: ModelRef) -> dict[str, str]:
    """The precision choice in words, for a half-precision checkpoint (nothing to say otherwise)."""
    stored = stored_dtype(model)
    if stored not in HALF or config.finetuning_type == "qlora":
        return {}
    if config.pure_bf16:
        how = "weights and optimizer states stay bfloat16 (pure_bf16)"
    elif bf16_on(config):
        how = f"trainable weights train in float32 (master weights), frozen ones stay {stored}, bf16 autocast"
    else:
        how = "the model loads in float32 and trains in float32 (with bf16, frozen weights stay as stored)"
    return {"precision": f"{stored} checkpoint: {how}"}
