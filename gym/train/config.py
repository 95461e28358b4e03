"""Typed training configuration shared by every method (one stage = one method run).

Defaults follow the papers and TRL where those exist (DPO beta 0.1, sigmoid loss; LoRA
r=8, alpha=16); the learning-rate/step defaults suit the embedded gym-tiny model so the
zero-set-up flow finishes in minutes on a CPU. Field descriptions show in the Prefect UI
form and in `gym train --help`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gym.train.rl_config import RLSettings
from gym.train.speed import SpeedSettings

# Every method gym knows by name; `gym.train.METHODS` holds the ones implemented (one file each).
Method = Literal[
    "sft",
    "dpo",
    "ipo",
    "cdpo",
    "hinge",
    "kto",
    "orpo",
    "simpo",
    "ppo",
    "grpo",
    "gspo",
    "tf_grpo",
]
# How the weights are adapted; the LoRA family are PEFT adapters.
FinetuningType = Literal["full", "freeze", "lora", "rslora", "dora", "pissa", "loraplus", "longlora", "qlora"]


class LoraSettings(BaseModel):
    """PEFT LoRA adapter settings (used when finetuning_type is `lora`)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: int = Field(
        16, ge=1, description="LoRA scaling numerator (scale = alpha / r, or alpha / sqrt(r) with rslora)."
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] | None = Field(
        None, description="Module names to adapt; default: the registry entry's lora_target_modules."
    )
    use_rslora: bool = Field(False, description="Rank-stabilised scaling alpha/sqrt(r) (rsLoRA).")
    use_dora: bool = Field(False, description="Weight-decomposed LoRA (DoRA).")
    init: Literal["default", "pissa", "gaussian"] = Field(
        "default",
        description="Adapter initialisation: PEFT default, PiSSA (principal singular vectors) or gaussian.",
    )


class TrainConfig(BaseModel):
    """One training stage: which method, how to adapt the weights, and the optimiser schedule."""

    model_config = ConfigDict(extra="forbid")

    method: Method = Field("sft", description="Training method; see gym.train.METHODS.")
    finetuning_type: FinetuningType = Field(
        "full", description="Update all weights (full) or train a LoRA adapter."
    )
    learning_rate: float | None = Field(
        None,
        gt=0,
        description="Peak learning rate; default: the model's registry train_defaults, else the method's.",
    )
    max_steps: int = Field(-1, description="Optimiser steps; -1 means use num_train_epochs.")
    num_train_epochs: float | None = Field(
        None, gt=0, description="Epochs over the data when max_steps is -1; default as for learning_rate."
    )
    per_device_train_batch_size: int | None = Field(
        None, ge=1, description="Sequences (or pairs) per device per step; default as for learning_rate."
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches accumulated per optimiser step."
    )
    lr_scheduler_type: str = Field(
        "cosine", description="transformers scheduler name (cosine, linear, constant...)."
    )
    warmup_ratio: float = Field(
        0.05, ge=0, lt=1, description="Fraction of steps spent warming the learning rate up."
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    seed: int = Field(42, description="Seed for data order and initialisation of new weights.")
    logging_steps: int = Field(5, ge=1, description="Log the loss every N steps.")
    save_steps: int = Field(
        100, ge=1, description="Checkpoint every N steps (training resumes from the last one)."
    )
    save_total_limit: int = Field(2, ge=1, description="Checkpoints kept in the run directory.")
    bf16: bool = Field(False, description="bfloat16 mixed precision (needs hardware support).")
    gradient_checkpointing: bool = Field(False, description="Trade compute for activation memory.")
    lora: LoraSettings = Field(
        default_factory=LoraSettings, description="LoRA settings (finetuning_type=lora)."
    )
    beta: float = Field(0.1, gt=0, description="DPO: strength of the KL constraint to the reference model.")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field(
        "sigmoid", description="DPO: sigmoid (DPO), ipo (IPO) or hinge (SLiC) loss."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="DPO: assumed label-noise rate; > 0 gives conservative DPO (cDPO)."
    )
    speed: SpeedSettings = Field(
        default_factory=SpeedSettings,
        description="Throughput: attention kernel, padding-free or packed batches, Liger, Unsloth, compile.",
    )
    rl: RLSettings = Field(
        default_factory=RLSettings,
        description="Online RL (ppo, grpo, gspo): rewards, rollouts, KL, clipping.",
    )


# Defaults per method and finetuning type where the user and the model's registry entry are silent:
# TRL's defaults for full fine-tuning (SFT 2e-5, DPO 1e-6, batch 8), and the learning rates
# LLaMA-Factory's LoRA examples use (higher: only the adapter moves).
METHOD_DEFAULTS: dict[str, dict[str, dict[str, float]]] = {
    "sft": {
        "full": {"learning_rate": 2e-5, "num_train_epochs": 3, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-4, "num_train_epochs": 3, "per_device_train_batch_size": 8},
    },
    "dpo": {
        "full": {"learning_rate": 1e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 5e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
    # Online RL: TRL's GRPO (1e-6) and PPO (3e-6) rates for full fine-tuning; the batch counts
    # completions (GRPO: group_size per prompt, so it must be a multiple of it).
    "grpo": {
        "full": {"learning_rate": 1e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-5, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
    "gspo": {
        "full": {"learning_rate": 1e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-5, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
    "ppo": {
        "full": {"learning_rate": 3e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-5, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
}


def with_defaults(config: TrainConfig, model_defaults: dict[str, dict[str, float]]) -> TrainConfig:
    """Fill the fields the user left unset: the model's measured values first, then the method's."""
    method_defaults = METHOD_DEFAULTS[config.method][config.finetuning_type]
    chosen = {**method_defaults, **model_defaults.get(config.method, {})}
    unset = {k: v for k, v in chosen.items() if getattr(config, k) is None}
    if "per_device_train_batch_size" in unset:
        unset["per_device_train_batch_size"] = int(unset["per_device_train_batch_size"])
    return config.model_copy(update=unset)
