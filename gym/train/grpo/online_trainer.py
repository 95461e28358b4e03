"""The papers' GRPOTrainer with `training_free=False`: online GRPO, weights trained through TRL.

    trainer = GRPOTrainer(model=model, tokenizer=tokenizer, args=training_args,
                          finetuning_args=finetuning_args, training_free=False,
                          train_dataset="demo_prompts", reward_funcs=["final_answer", "answer_format"])
    trainer.train()                                    # TRL's TrainOutput; the weights moved

It is gym's `grpo` method (gym.train.METHODS["grpo"], gym/train/grpo/online.py: TRL's GRPOTrainer
with gym's rewards, group filter and reward statistics) on a model in memory, or on a registry name /
checkpoint directory that gym loads. `args` and `finetuning_args` are read for what applies
(learning_rate, num_train_epochs, max_steps, per_device_train_batch_size, gradient_accumulation_steps,
seed, logging_steps, output_dir; group_size / grpo_group_size / num_generations,
max_completion_length); `reward_funcs` are gym reward specs or importable functions; `rl=` takes any
other `RLSettings` field. The experience manager plays no part: weights, not experiences, are learned.
For the tracked, resumable pipeline stage use `gym train --method grpo`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from gym.errors import ConfigError
from gym.train import rl_common
from gym.train.common import check_hardware
from gym.train.config import TrainConfig

ARGS = (
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "seed",
    "logging_steps",
)
GROUP_SIZE_NAMES = ("group_size", "grpo_group_size", "num_generations")
TRL_GRPO_LEARNING_RATE = 1e-6  # TRL's GRPOConfig default, when `args` names none


def _read(source: Any, *names: str) -> Any:
    for name in names:
        value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
        if value is not None:
            return value
    return None


def reward_spec(reward: Any) -> str:
    """A gym reward spec for `reward`: a spec as it is, an importable function by its dotted path."""
    if isinstance(reward, str):
        return reward
    module, name = getattr(reward, "__module__", None), getattr(reward, "__qualname__", "")
    if not callable(reward) or not module or "<" in name:
        raise ConfigError(
            f"reward {reward!r}: pass a gym reward spec (exact_match, final_answer, regex:..., "
            "pkg.module:function) or a module-level function"
        )
    return f"{module}:{name}"


def config_of(args: Any, finetuning_args: Any, reward_funcs: Any, rl: dict[str, Any] | None) -> TrainConfig:
    """gym's TrainConfig (method grpo) from the papers' argument objects."""
    fields: dict[str, Any] = {name: _read(args, name) for name in ARGS}
    fields = {k: v for k, v in fields.items() if v is not None}
    rl_fields: dict[str, Any] = dict(rl or {})
    group = _read(finetuning_args, *GROUP_SIZE_NAMES)
    if group is not None:
        rl_fields.setdefault("group_size", int(group))
    length = _read(args, "max_completion_length") or _read(finetuning_args, "max_completion_length")
    if length is not None:
        rl_fields.setdefault("max_completion_length", int(length))
    if reward_funcs is not None:
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        rl_fields.setdefault("rewards", [reward_spec(f) for f in funcs])
    fields.setdefault("learning_rate", TRL_GRPO_LEARNING_RATE)
    config = TrainConfig(method="grpo", **fields, rl=rl_fields)
    if config.per_device_train_batch_size is None:  # one prompt's group per step
        group = config.rl.resolved("grpo").group_size  # unset: GRPO's default
        config = config.model_copy(update={"per_device_train_batch_size": group})
    if config.num_train_epochs is None:  # transformers needs a number (max_steps, when set, wins)
        config = config.model_copy(update={"num_train_epochs": 1.0})
    config, _ = check_hardware(config)
    rl_common.check(config)
    return config


def prompt_records(dataset: Any, limit: int | None = None) -> Any:
    """A datasets.Dataset of prompt records (`prompt` messages, `answer`, `metadata` JSON text) from a
    dataset name or path (prompt or sft format), a datasets.Dataset or records."""
    from datasets import Dataset

    if dataset is None:
        raise ConfigError("GRPOTrainer needs train_dataset (a dataset name or path, or records)")
    rows: list[dict[str, Any]]
    if isinstance(dataset, (str, Path)):
        from gym.data.ingest import load_meta, load_saved
        from gym.data.mix import ingest_named
        from gym.tfgrpo.data import dataset_spec

        ingested = ingest_named(str(dataset), resolve=dataset_spec)
        if load_meta(ingested.path)["kind"] == "prompt":
            records = load_saved(ingested.path)
            rows = [{k: r[k] for k in ("prompt", "answer", "metadata")} for r in records]
            return Dataset.from_list(rows[:limit] if limit is not None else rows)
    from gym.train.grpo.trainer import questions_of

    questions, _ = questions_of(dataset, limit)
    rows = [{"prompt": q.prompt, "answer": q.answer or "", "metadata": "{}"} for q in questions]
    return Dataset.from_list(rows)


def train_online(
    model: Any,
    tokenizer: Any,
    args: Any,
    finetuning_args: Any,
    train_dataset: Any,
    template: str | None = None,
    reward_funcs: Any = None,
    rl: dict[str, Any] | None = None,
) -> Any:
    """Online GRPO (gym's `grpo` method) on `model`; returns TRL's TrainOutput. With `args.output_dir`
    the trained model and tokenizer are saved there (safetensors)."""
    from gym.train import METHODS

    config = config_of(args, finetuning_args, reward_funcs, rl)  # checked before any model loads
    data = prompt_records(train_dataset)
    if isinstance(model, (str, Path)):
        from gym.models import load_model, load_tokenizer, resolve
        from gym.train import precision

        ref = resolve(str(model), template)  # loaded and trained in gym's precision, as gym train does
        model, tokenizer = load_model(ref, dtype=precision.load_dtype(config)), load_tokenizer(ref)
        precision.upcast_trainable(model, config)
    elif tokenizer is None:
        raise ConfigError("a transformers model needs tokenizer= too")
    elif template is not None:
        from gym.templates import load_template

        tokenizer.chat_template = load_template(template)  # TRL renders the prompts with it
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    output_dir = _read(args, "output_dir")
    with tempfile.TemporaryDirectory(prefix="gym-grpo-") as scratch:
        trainer = METHODS["grpo"](
            model=model,
            tokenizer=tokenizer,
            config=config,
            train_data=data,
            eval_data=None,
            output_dir=Path(output_dir or scratch) / "checkpoints",
            peft_config=None,
        )
        out = trainer.train()
    if output_dir:
        trainer.model.save_pretrained(Path(output_dir), safe_serialization=True)
        tokenizer.save_pretrained(Path(output_dir))
    return out
