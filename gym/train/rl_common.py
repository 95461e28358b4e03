"""What the online RL methods (ppo.py, grpo/online.py, gspo.py) share: checks made before any model
loads, the held-out reward evaluation their trainers run as `evaluate()`, and the sample log.

Each logging step appends its metrics (reward mean/min/max/std, each reward's mean, KL, clip
fraction, completion length...) to `<stage>/checkpoints/metrics.jsonl` and a few sampled
completions (prompt, completion, reward, per-reward scores) to `samples.jsonl`; `track` logs them to
MLflow as curves and a table. The main metric is `mean_reward`: the weighted reward of completions
sampled for held-out prompts (gym.rewards.evaluate), before and after training.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, MissingExtraError
from gym.rewards import Reward, load_rewards
from gym.rewards.evaluate import reward_eval
from gym.train.config import TrainConfig
from gym.train.rl_config import ONLINE_METHODS, RLSettings

METRIC = "mean_reward"
SAMPLES_FILE = "samples.jsonl"
METRICS_FILE = "metrics.jsonl"


def samples_file(stage_dir: str | Path) -> Path:
    """Where a stage's sample completions are logged."""
    return Path(stage_dir) / "checkpoints" / SAMPLES_FILE


def metrics_file(stage_dir: str | Path) -> Path:
    """Where a stage's per-logging-step metrics are logged."""
    return Path(stage_dir) / "checkpoints" / METRICS_FILE


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def track(run_id: str, stage_dir: str | Path, uri: str | None = None) -> None:
    """Log an online stage's metric curves and sample completions to its MLflow run."""
    from gym import tracking

    by_step: dict[int, dict[str, Any]] = {}
    for row in _read_jsonl(metrics_file(stage_dir)):
        # Merged per step: the end-of-training log shares the last step; a resumed run logs some steps
        # twice, and the later values count.
        by_step.setdefault(int(row["step"]), {}).update(row)
    keys = sorted({k for row in by_step.values() for k, v in row.items() if _number(v)} - {"step"})
    for key in keys:
        points = [(step, row[key]) for step, row in sorted(by_step.items()) if _number(row.get(key))]
        tracking.log_curve(run_id, f"train/{key}", points, uri=uri)
    tracking.log_table(run_id, _read_jsonl(samples_file(stage_dir)), "samples.json", uri=uri)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # not NaN


def load_environment(spec: str) -> Callable[..., Any]:
    """The multi-turn environment callback named `pkg.module:function`."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), attr, None) if module_name else None
    except ImportError as e:
        raise ConfigError(f"environment {spec!r}: cannot import {module_name!r} ({e})") from None
    if not callable(fn):
        raise ConfigError(f"environment {spec!r}: expected pkg.module:function naming a callable")
    return fn  # type: ignore[no-any-return]


def check(config: TrainConfig) -> None:
    """Fail before any model loads when an online RL stage cannot run as configured."""
    if config.method not in ONLINE_METHODS:
        return
    rl = config.rl
    load_rewards(rl.rewards, rl.reward_weights)
    if config.method == "ppo":
        if rl.environment:
            raise ConfigError("multi-turn environments need grpo or gspo; PPO samples one turn")
        if rl.use_vllm:
            raise ConfigError("use_vllm applies to grpo and gspo (TRL's PPO generates with transformers)")
        if rl.group_size != type(rl).model_fields["group_size"].default:  # it was accepted, and unused
            raise ConfigError(
                f"group_size={rl.group_size}: PPO samples one completion per prompt and learns from a value "
                "model, not from groups; drop it, or use grpo or gspo"
            )
        return
    batch = (config.per_device_train_batch_size or 0) * config.gradient_accumulation_steps
    if batch and batch % rl.group_size:
        raise ConfigError(
            f"{config.method}: per_device_train_batch_size x gradient_accumulation_steps = {batch} "
            f"completions is not a multiple of group_size={rl.group_size}; make it one (each prompt gets "
            "group_size completions)"
        )
    if rl.environment:
        load_environment(rl.environment)
    if rl.use_vllm and importlib.util.find_spec("vllm") is None:
        raise MissingExtraError(
            "use_vllm=True needs vLLM and a CUDA GPU: pip install 'gym[vllm]' on a GPU machine, "
            "or set use_vllm=False"
        )


def check_data(config: TrainConfig, n_train: int) -> None:
    """Enough prompts for one batch (`config` after distributed.resolve). TRL drops an incomplete batch:
    PPO would wait for a full one forever, GRPO and GSPO would train 0 steps and save the model as it was."""
    if config.method not in ONLINE_METHODS:
        return
    per_device, accumulation = config.per_device_train_batch_size or 8, config.gradient_accumulation_steps
    processes = int(config.distributed.num_processes) if config.distributed.num_processes != "auto" else 1
    group = 1 if config.method == "ppo" else config.rl.group_size
    needed = per_device * accumulation * processes // group  # prompts in one batch
    if n_train >= needed:
        return
    per_group = f" / group_size={group} completions per prompt" if group > 1 else ""
    fits = n_train * group // (accumulation * processes) // group * group  # the largest batch that fits
    advice = f"lower per_device_train_batch_size to {fits} or less, or add prompts" if fits else "add prompts"
    times = f" x {processes} processes" if processes > 1 else ""
    raise ConfigError(
        f"{config.method}: the training data has {n_train} prompt(s), fewer than one batch takes "
        f"(per_device_train_batch_size={per_device} x gradient_accumulation_steps={accumulation}{times}"
        f"{per_group} = {needed} prompt(s)), and an incomplete batch is never trained on: {advice}"
    )


class SampleLog:
    """Appends each logging step's metrics, and a few sampled completions, to JSON Lines files."""

    def __init__(self, output_dir: Path, keep: int):
        self.path = Path(output_dir) / SAMPLES_FILE
        self.metrics_path = Path(output_dir) / METRICS_FILE
        self.keep = keep

    def _append(self, path: Path, rows: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False, default=float) + "\n" for row in rows)

    def write(self, step: int, rows: list[dict[str, Any]]) -> None:
        if self.keep and rows:
            self._append(self.path, [{"step": step, **row} for row in rows[: self.keep]])

    def write_metrics(self, step: int, logs: dict[str, Any]) -> None:
        self._append(self.metrics_path, [{"step": step, **{k: v for k, v in logs.items() if _number(v)}}])


class RewardEval:
    """The held-out evaluation every online trainer runs as `evaluate()`: gym's reward eval."""

    def __init__(self, prompts: Any, rewards: list[Reward], weights: list[float], rl: RLSettings, seed: int):
        self.prompts, self.rewards, self.weights, self.rl, self.seed = prompts, rewards, weights, rl, seed
        self.samples: list[dict[str, Any]] = []

    def __call__(self, model: Any, tokenizer: Any) -> dict[str, float]:
        if self.prompts is None:
            return {}
        metrics, self.samples = reward_eval(
            model,
            tokenizer,
            self.prompts,
            self.rewards,
            self.weights,
            samples=self.rl.eval_samples,
            temperature=self.rl.temperature,
            max_new_tokens=self.rl.max_completion_length,
            seed=self.seed,
        )
        return metrics
