"""What every training method shares: TRL argument mapping, PEFT adapters, checkpoints, results.

A stage's directory is content-addressed by its inputs (method, config, start model, data), so
a re-run of an interrupted stage finds its checkpoints and resumes, and a finished stage is
returned as it is. A file lock keeps two runs from writing the same directory.
"""

from __future__ import annotations

import ast
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from gym.errors import ConfigError
from gym.train import precision, speed
from gym.train.config import TrainConfig
from gym.train.rl_config import ONLINE_METHODS

logger = logging.getLogger("gym.train")
# Timing numbers of each evaluation, left out of the curves of held-out metrics.
EVAL_TIMINGS = (
    "eval_runtime",
    "eval_samples_per_second",
    "eval_steps_per_second",
    "eval_model_preparation_time",
)


class TrainResult(BaseModel):
    """What a finished stage hands to the next task (references and numbers, no live objects)."""

    method: str
    digest: str = Field(description="Content digest of the stage's inputs; names its directory.")
    stage_dir: str
    model_dir: str = Field(description="Full (merged) model ready for from_pretrained.")
    adapter_dir: str | None = Field(None, description="The PEFT adapter alone, for LoRA stages.")
    global_step: int
    losses: list[tuple[int, float]] = Field(description="(step, training loss) as logged.")
    evals: dict[str, list[tuple[int, float]]] = Field(
        default_factory=dict,
        description="Held-out metrics at each evaluation during training (eval_steps, eval_strategy): "
        "name (eval_loss...) -> (step, value).",
    )
    eval_before: dict[str, float] = Field(default_factory=dict)
    eval_after: dict[str, float] = Field(default_factory=dict)
    trainable_params: int
    total_params: int
    resumed_from: str | None = None
    train_seconds: float = 0.0
    tokens_seen: int = Field(0, description="Input tokens the trainer processed, padding excluded.")
    tokens_at_resume: int = Field(
        0, description="Of tokens_seen, those processed before the checkpoint a resumed stage started from."
    )
    metric_name: str = Field(
        "loss", description="The method's main training signal (loss, reward_accuracy, mean_reward...)."
    )
    metric_first: float | None = Field(None, description="The signal at the start (held-out where possible).")
    metric_last: float | None = Field(None, description="The signal at the end.")
    choices: dict[str, str] = Field(
        default_factory=dict,
        description="Choices gym made for this stage (QLoRA bit width, reference mode...), in words.",
    )
    hyperparameters: dict[str, Any] = Field(
        default_factory=dict,
        description="What the stage trained with: its config made concrete, the settings it reads "
        "(gym.train.config.hyperparameters).",
    )
    datasets: dict[str, dict[str, str | None]] = Field(
        default_factory=dict,
        description="The data it trained on (`dataset`) and held out (`eval_dataset`): each one's name and "
        "the digest of its ingested records, as a model card lists them.",
    )

    @model_validator(mode="after")
    def _loss_is_its_own_signal(self) -> TrainResult:
        """A stage whose signal is the training loss reports its first and last logged values."""
        if self.metric_name == "loss":
            self.metric_first = self.loss_first if self.metric_first is None else self.metric_first
            self.metric_last = self.loss_last if self.metric_last is None else self.metric_last
        return self

    @property
    def loss_first(self) -> float | None:
        return self.losses[0][1] if self.losses else None

    @property
    def loss_last(self) -> float | None:
        return self.losses[-1][1] if self.losses else None

    @property
    def tokens_per_second(self) -> float | None:
        """Real (unpadded) training tokens per second of the run that finished the stage (a resumed one:
        the tokens since the resume, over its time); None for tokens uncounted or none trained."""
        ran = self.tokens_seen - self.tokens_at_resume
        if self.train_seconds <= 0 or ran <= 0:
            return None
        return round(ran / self.train_seconds, 1)


def trl_args(config: TrainConfig, output_dir: Path, *, held_out: bool = False) -> dict[str, Any]:
    """Keyword arguments common to every TRL *Config (they all extend TrainingArguments).

    `held_out`: the trainer gets held-out data (an eval_dataset) to evaluate during training as
    eval_steps / eval_strategy ask (see `eval_strategy`).
    """
    return {
        "output_dir": str(output_dir),
        "learning_rate": config.learning_rate,
        "max_steps": config.max_steps,
        "num_train_epochs": config.num_train_epochs,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "per_device_eval_batch_size": config.per_device_eval_batch_size or config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "lr_scheduler_type": config.lr_scheduler_type,
        "lr_scheduler_kwargs": config.lr_scheduler_kwargs,
        "warmup_steps": warmup(config),
        "neftune_noise_alpha": config.neftune_noise_alpha,
        "weight_decay": config.weight_decay,
        "max_grad_norm": config.max_grad_norm,
        "adam_beta1": config.adam_beta1,
        "adam_beta2": config.adam_beta2,
        "adam_epsilon": config.adam_epsilon,
        "seed": config.seed,
        "data_seed": config.seed,
        "logging_steps": config.logging_steps,
        "logging_first_step": True,
        "save_strategy": "steps",
        "save_steps": config.save_steps,
        "save_total_limit": config.save_total_limit,
        "eval_strategy": eval_strategy(config, held_out),
        "eval_steps": config.eval_steps,  # transformers: logging_steps when unset
        "bf16": bool(config.bf16),  # decided by precision.resolve (gym.train.plan, check_hardware)
        "gradient_checkpointing": bool(config.gradient_checkpointing),  # None: gym.train.plan decides
        "report_to": "none",
        # Distributed stages (gym.train.distributed): every trainable parameter takes part in the loss,
        # so DDP need not search the graph for unused ones at each step (transformers' default does).
        "ddp_find_unused_parameters": False,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "use_cpu": not _cuda_available(),
        **({"optim": config.optim} if config.optim else {}),  # else transformers' default AdamW
        **speed.trainer_args(speed.resolve(config), config.method),
    }


def warmup(config: TrainConfig) -> float | int:
    """TrainingArguments' warmup_steps (transformers 5 takes a float < 1 as a ratio of the total steps).

    Warmup's first step has learning rate 0, so warmup_ratio would make a one-step run (a smoke test)
    change nothing: it gets none. Warmup steps the user set are kept as they are.
    """
    if config.warmup_steps is not None:
        return config.warmup_steps
    return 0 if config.max_steps == 1 else config.warmup_ratio


# Schedulers that step on held-out metrics: the stage must evaluate during training (checked by
# gym.preflight for the strategy, by gym.train.plan for the held-out data).
EVAL_SCHEDULERS = {
    name: f"{name} steps on the held-out loss: it needs evaluations during training (an eval_strategy or "
    "eval_steps, and held-out data: val_size or method_eval_dataset; online RL methods have none)"
    for name in ("reduce_lr_on_plateau", "greedy")
}


def check_eval_schedule(config: TrainConfig, n_eval: int) -> None:
    """A scheduler that steps on held-out loss, in a stage that won't evaluate during training."""
    if config.lr_scheduler_type in EVAL_SCHEDULERS and (
        not n_eval or config.method in ONLINE_METHODS or eval_strategy(config, True) == "no"
    ):
        raise ConfigError(f"lr_scheduler_type: {EVAL_SCHEDULERS[config.lr_scheduler_type]}")


def eval_strategy(config: TrainConfig, held_out: bool) -> str:
    """transformers' eval_strategy for the stage: the config's (default: steps when eval_steps is set,
    else no), or no, with a warning, where the stage can't evaluate during training: it has no held-out
    data, or it is an online RL method (their `evaluate()` samples completions and scores rewards, held
    out before and after training only)."""
    wanted = config.eval_strategy or ("steps" if config.eval_steps else "no")
    if wanted == "no":
        return "no"
    asked = f"eval_strategy {wanted}" + (f", eval_steps {config.eval_steps}" if wanted == "steps" else "")
    if config.method in ONLINE_METHODS:
        logger.warning(
            "%s: %s ignored: online RL methods evaluate held-out rewards before and after training only",
            config.method,
            asked,
        )
        return "no"
    if not held_out:
        logger.warning(
            "%s: %s ignored: the stage has no held-out data (give val_size or method_eval_dataset)",
            config.method,
            asked,
        )
        return "no"
    return wanted


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_hardware(config: TrainConfig) -> tuple[TrainConfig, dict[str, str]]:
    """Fail before loading anything when the config asks for what this machine can't do; return it with
    bf16 decided (and that choice in words, when gym made it)."""
    import torch

    if config.bf16 and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ConfigError("bf16=True needs a GPU with bfloat16 support (Ampere or newer); set bf16=False")
    config, choices = precision.resolve(config)
    speed.resolve(config)  # GPU-only speed options asked for where they can't run
    return config, choices


def count_params(model: Any) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total


# The training loss as trainers log it: TRL's PPOTrainer logs its policy loss under the second name.
LOSS_KEYS = ("loss", "loss/policy_avg")


def losses_from(log_history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, training loss) at each logged step."""
    losses = []
    for entry in log_history:
        key = next((k for k in LOSS_KEYS if k in entry), None)
        if key is not None and "step" in entry:
            losses.append((int(entry["step"]), float(entry[key])))
    return losses


def evals_from(log_history: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Each held-out metric the trainer logged (`eval_*`, timings left out) as (step, value) points."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for entry in log_history:
        if "step" not in entry:
            continue
        for key, value in entry.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and key.startswith("eval_") and key not in EVAL_TIMINGS:
                curves.setdefault(key, []).append((int(entry["step"]), float(value)))
    return curves


# transformers' words when a resumed checkpoint lacks some of the model's keys
# (Trainer._issue_warnings_after_load)
MISSING_KEYS = "There were missing keys in the checkpoint model loaded: "


@contextlib.contextmanager
def tied_keys_not_missing(model: Any) -> Iterator[None]:
    """Resuming a model whose output layer shares the input embedding's weight (gym-tiny, Qwen2.5-0.5B,
    Gemma...), transformers warns that the checkpoint lacks `lm_head.weight`: safetensors saves a
    shared tensor once, and loading it restores both names. Only that warning is dropped, only when
    every key it names is such a second name of a loaded tensor; any other missing key still warns."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    tied = every - {name for name, _ in model.named_parameters()}
    log = logging.getLogger("transformers.trainer")

    def keep(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(MISSING_KEYS):
            return True
        try:
            keys = ast.literal_eval(message.removeprefix(MISSING_KEYS).rstrip("."))
        except (ValueError, SyntaxError):
            return True
        return not (tied and set(keys) <= tied)

    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)
