"""What the online RL methods (ppo.py, grpo/online.py, gspo.py) share: checks made before any model
loads, the prompts a stage samples from (`prompt_data`), the held-out reward evaluation their trainers
run as `evaluate()`, and the sample log.

`prompt_data` (each trainer's build_trainer; `check_prompt_data` does the same from the tokenized
folders before any model loads) refuses data without a single `answer` for rewards that compare with
it (exact_match, numeric_match, final_answer), and leaves out prompts that leave no room for a whole
completion (`rl.max_completion_length` tokens) within the window, the smaller of `cutoff_len` and
the model's context, with one warning line naming the first few records; a DataError if none is left.

Each logging step appends its metrics (reward mean/min/max/std, each reward's mean, KL, clip
fraction, completion length...) to `<stage>/checkpoints/metrics.jsonl` and a few sampled
completions (prompt, completion, reward, per-reward scores) to `samples.jsonl`; `track` logs them to
MLflow as curves and a table. The main metric is `mean_reward`: the weighted reward of completions
sampled for held-out prompts (gym.rewards.evaluate), before and after training.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, DataError, MissingExtraError
from gym.rewards import Reward, load_rewards
from gym.rewards.evaluate import reward_eval
from gym.train.config import TrainConfig
from gym.train.rl_config import GROUP_ONLY, ONLINE_METHODS, PPO_ONLY, RLSettings
from gym.user_code import load_callable
from gym.workspace import atomic_write_text

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
    keys = sorted({k for row in by_step.values() for k, v in row.items() if number(v)} - {"step"})
    for key in keys:
        points = [(step, row[key]) for step, row in sorted(by_step.items()) if number(row.get(key))]
        tracking.log_curve(run_id, f"train/{key}", points, uri=uri)
    tracking.log_table(run_id, _read_jsonl(samples_file(stage_dir)), "samples.json", uri=uri)


def number(value: Any) -> bool:
    """A logged value that is a number (an int or float, not a bool, not NaN)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value  # not NaN


def load_environment(spec: str) -> Callable[..., Any]:
    """The multi-turn environment callback named `pkg.module:function`."""
    return load_callable(spec, "environment")


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
        if rl.group_size is not None:  # any value the user gave, the default's too: it was ignored
            raise ConfigError(
                f"group_size={rl.group_size}: PPO samples one completion per prompt and learns from a value "
                "model, not from groups; drop it, or use grpo or gspo"
            )
        _refuse_unread(rl, GROUP_ONLY, "ppo", "GRPO/GSPO", "grpo or gspo")
        return
    _refuse_unread(rl, PPO_ONLY, config.method, "PPO", "ppo")
    rl = rl.resolved(config.method)
    batch = (config.per_device_train_batch_size or 0) * config.gradient_accumulation_steps
    if batch and batch % int(rl.group_size or 1):
        raise ConfigError(
            f"{config.method}: per_device_train_batch_size x gradient_accumulation_steps = {batch} "
            f"completions is not a multiple of group_size={rl.group_size}; make it one (each prompt gets "
            "group_size completions)"
        )
    if rl.environment:
        load_environment(rl.environment)
        if int(rl.max_turns or 1) < 2:  # the last turn gets no reply: with one turn it was never called
            raise ConfigError(
                f"environment {rl.environment!r} with max_turns={rl.max_turns or 1}: the environment replies "
                "between assistant turns, so one turn never calls it; set --train.rl.max_turns 2 or more"
            )
    elif rl.max_turns is not None and rl.max_turns > 1:
        raise ConfigError(
            f"max_turns={rl.max_turns} without an environment: each turn after the first answers the "
            "environment's reply; name one with --train.rl.environment pkg.module:function"
        )
    if rl.use_vllm and importlib.util.find_spec("vllm") is None:
        raise MissingExtraError(
            "use_vllm=True needs vLLM and a CUDA GPU: pip install 'gym[vllm]' on a GPU machine, "
            "or set use_vllm=False"
        )


def _refuse_unread(rl: RLSettings, names: tuple[str, ...], method: str, owner: str, instead: str) -> None:
    """A ConfigError naming the settings of `names` the user gave (not None: RLSettings leaves them unset
    by default), whatever their value: `method` does not read them (they were accepted, and had no
    effect; a value equal to the other method's default was accepted silently)."""
    given = [f"rl.{n}={getattr(rl, n)!r}" for n in rl.given(names)]
    if given:
        raise ConfigError(
            f"{method} does not read {', '.join(given)} ({owner} setting{'s' if len(given) > 1 else ''}); "
            f"drop {'them' if len(given) > 1 else 'it'}, or use {instead}"
        )


def check_data(config: TrainConfig, n_train: int) -> None:
    """Enough prompts for one batch (`config` after distributed.resolve). TRL drops an incomplete batch:
    PPO would wait for a full one forever, GRPO and GSPO would train 0 steps and save the model as it was."""
    if config.method not in ONLINE_METHODS:
        return
    per_device, accumulation = config.per_device_train_batch_size or 8, config.gradient_accumulation_steps
    processes = int(config.distributed.num_processes) if config.distributed.num_processes != "auto" else 1
    group = int(config.rl.resolved(config.method).group_size or 1)  # PPO: None, one per prompt
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


def data_name(data: Any, role: str) -> str:
    """`role` ("the training data") with what the user called the tokenized dataset `data`, for messages:
    its file, hub id or registry name (nothing more for records gym did not tokenize)."""
    from gym import workspace
    from gym.data.ingest import load_meta, origin

    try:
        folder = Path(data.cache_files[0]["filename"]).parent
        return f"{role} ({origin(workspace.path('datasets', load_meta(folder)['dataset']))})"
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return role


def check_answers(rewards: list[Reward], data: Any, name: str, method: str, warn: bool = True) -> None:
    """A DataError when a reward compares completions with the records' `answer` and `data` has none;
    records that lack one are left out of that reward (it returns None for them), with a note if `warn`."""
    needing = [r.spec for r in rewards if r.needs_answer]
    if not needing or data is None or len(data) == 0:
        return
    which, one = " and ".join(needing), len(needing) == 1
    missing = data.with_format("arrow")["answer"].null_count if "answer" in data.column_names else len(data)
    if missing == len(data):
        raise DataError(
            f"reward {which} compare{'s' if one else ''} each completion with its record's `answer`, and "
            f"{name} has none: add an `answer` field (the ground truth) to its records, or pick a reward "
            "that needs none (reward_model:SOURCE, answer_format, regex:PATTERN, length_penalty:MAX, or your "
            "own pkg.module:function)"
        )
    if missing and warn and not (method == "ppo" and unscorable(rewards)):  # else scorable_prompts says
        print(
            f"gym: {method}: note: {missing} of {len(data)} record(s) of {name} have no `answer`: {which} "
            f"leave{'s' if one else ''} their completions unscored (None, as TRL reads it)",
            file=sys.stderr,
            flush=True,
        )


def unscorable(rewards: list[Reward]) -> bool:
    """Whether a record without an `answer` gets no reward at all: every reward compares with one."""
    return all(r.needs_answer for r in rewards)


def scorable_prompts(data: Any, rewards: list[Reward], name: str, warn: bool = True) -> Any:
    """PPO's training prompts: without the records no reward can score (no `answer`, and every reward
    compares with one), with one warning line counting them. TRL's PPO needs a reward for every
    completion; it got 0 for these and learned from that, where GRPO/GSPO leave an unscored completion
    out of the loss (README: such records are left out of those rewards, not scored 0).
    `check_answers` has refused data where no record has an answer."""
    if data is None or not unscorable(rewards) or "answer" not in data.column_names:
        return data
    import numpy as np

    answers = data.with_format("arrow")["answer"]
    missing = answers.null_count
    if not missing:
        return data
    if warn:
        which = " and ".join(r.spec for r in rewards)
        print(
            f"gym: ppo: warning: {missing} of {len(data)} record(s) of {name} left out: they have no "
            f"`answer`, so {which} cannot score their completions, and PPO trains on a reward for every "
            "completion (it would have been 0): add an `answer` to them, or add a reward that needs none "
            "(answer_format, regex:PATTERN, reward_model:SOURCE...)",
            file=sys.stderr,
            flush=True,
        )
    return data.select(np.flatnonzero(answers.is_valid().to_numpy(zero_copy_only=False)))


@dataclass(frozen=True)
class Window:
    """The tokens a prompt and its completion must fit in: the smaller of cutoff_len and the context."""

    cutoff_len: int | None
    context: int | None  # None with rope_scaling: the model's RoPE is stretched to cutoff_len

    @property
    def tokens(self) -> int | None:
        known = [n for n in (self.cutoff_len, self.context) if n]
        return min(known) if known else None

    def words(self) -> str:
        if self.context is None or (self.cutoff_len is not None and self.cutoff_len <= self.context):
            return f"data.cutoff_len={self.cutoff_len}"
        if self.cutoff_len is None:
            return "the model's context"
        return f"the model's context (data.cutoff_len={self.cutoff_len} is beyond it)"

    def fix(self) -> str:
        if self.cutoff_len is not None and (self.context is None or self.cutoff_len < self.context):
            return f"raise data.cutoff_len{f' (up to the context, {self.context})' if self.context else ''}"
        return "stretch the context with --train.rope_scaling linear and a larger data.cutoff_len"


def prompt_window(config: TrainConfig, cutoff_len: int | None, model_config: Any) -> Window:
    """The window of a stage's sequences: cutoff_len and the context of the model (its transformers
    config), unless rope_scaling stretches that to cutoff_len."""
    from gym.models import context_window

    return Window(cutoff_len, None if config.rope_scaling else context_window(model_config))


def fitting_prompts(
    data: Any, window: Window, rl: RLSettings, method: str, name: str, warn: bool = True
) -> Any:
    """`data` without the prompts that leave no room for a whole completion (`rl.max_completion_length`
    tokens) within `window`, with one warning line (if `warn`) counting them and naming the first few
    records; a DataError when none is left. TRL's samplers take a prompt whole: a longer one ran past
    the model's context, with nothing but transformers' warnings."""
    if data is None or window.tokens is None or "prompt_ids" not in data.column_names:
        return data
    import numpy as np
    import pyarrow.compute as pc

    room = window.tokens - rl.max_completion_length
    if room < 1:  # no prompt fits, however short: "every prompt is over 0 tokens" said it backwards
        raise DataError(
            f"{method}: rl.max_completion_length={rl.max_completion_length} sampled tokens (LLaMA-Factory's "
            f"max_new_tokens) leave no room for a prompt within {window.tokens}, {window.words()}: lower "
            f"rl.max_completion_length below {window.tokens}, or {window.fix()}"
        )
    lengths = pc.list_value_length(data.with_format("arrow")["prompt_ids"]).to_numpy(zero_copy_only=False)
    over = np.flatnonzero(lengths > room)
    if len(over) == 0:
        return data
    records = ", ".join(str(i + 1) for i in over[:5]) + (", ..." if len(over) > 5 else "")
    why = (
        f"over {room} tokens, which leaves no room for rl.max_completion_length="
        f"{rl.max_completion_length} sampled tokens within {window.tokens}, {window.words()}"
    )
    fix = f"shorten them, lower rl.max_completion_length, or {window.fix()}"
    if len(over) == len(data):
        raise DataError(
            f"{method}: every prompt of {name} is {why} (the longest has {int(lengths.max())} tokens): {fix}"
        )
    if warn:
        print(
            f"gym: {method}: warning: {len(over)} of {len(data)} prompt(s) of {name} left out (record"
            f"{'s' if len(over) > 1 else ''} {records}): {why}; {fix}",
            file=sys.stderr,
            flush=True,
        )
    return data.select(np.flatnonzero(lengths <= room))


def prompt_data(
    config: TrainConfig,
    rewards: list[Reward],
    train_data: Any,
    eval_data: Any | None,
    window: Window,
    warn: bool = True,
) -> tuple[Any, Any | None]:
    """The training and held-out prompts a stage samples from (`config` concrete): answers there for the
    rewards that need them (PPO: none trained on without a reward that applies), prompts that fit
    `window` with their completions, and still one batch."""
    rl, method = config.rl, config.method
    train_name, eval_name = (
        data_name(train_data, "the training data"),
        data_name(eval_data, "the held-out data"),
    )
    check_answers(rewards, train_data, train_name, method, warn)
    check_answers(rewards, eval_data, eval_name, method, warn)
    if method == "ppo":
        train_data = scorable_prompts(train_data, rewards, train_name, warn)
    train_data = fitting_prompts(train_data, window, rl, method, train_name, warn)
    eval_data = fitting_prompts(eval_data, window, rl, method, eval_name, warn)
    check_data(config, len(train_data))
    return train_data, eval_data


def check_prompt_data(
    config: TrainConfig, model: Any, train_data: Path, eval_data: Path | None, cutoff_len: int | None
) -> None:
    """`prompt_data`'s errors from the tokenized folders and the model's config.json, before any model
    loads (`config` concrete: gym.train.plan's)."""
    if config.method not in ONLINE_METHODS:
        return
    from gym.data.ingest import load_saved
    from gym.models import load_config

    rewards, _ = load_rewards(config.rl.rewards, config.rl.reward_weights)
    held_out = load_saved(eval_data) if eval_data else None
    window = prompt_window(config, cutoff_len, load_config(model))
    prompt_data(config, rewards, load_saved(train_data), held_out, window, warn=False)


def signal_warnings(method: str, history: list[dict[str, Any]]) -> list[str]:
    """What the training log of an online RL stage says about a run that had nothing (or something
    false) to learn from: no reward applied to any completion; (PPO) some completions no reward applied
    to, trained on as reward 0; (GRPO/GSPO) every group's completions rewarded alike, so every advantage
    was 0, which group_size=1 (logged as `group_size`) always gives. TRL trains on regardless; its only
    traces are a warning and a curve."""
    rewards = [h["reward"] for h in history if "reward" in h]
    if rewards and all(r is None or math.isnan(r) for r in rewards):  # (an infinite reward is refused)
        scored_zero = " (PPO trained on them as reward 0)" if method == "ppo" else ""
        return [
            f"{method}: no reward applied to any completion (every reward function returned None or NaN for "
            f"each, at every logged step), so nothing was learned from the rewards{scored_zero}: "
            "check that they apply to this data (the matching rewards need an `answer` per record; a "
            "function of yours returns None where it does not apply)"
        ]
    unscored = [h["frac_unscored"] for h in history if number(h.get("frac_unscored"))]
    if unscored and max(unscored) > 0:  # PPO: a reward for every completion, or 0
        return [
            f"{method}: some completions got no reward (every reward function returned None or NaN; up "
            f"to {max(unscored):.0%} of a logged step's, `frac_unscored`) and were trained on as reward 0, "
            "since TRL's PPO needs a reward for each: add a reward that applies to every completion, or use "
            "grpo or gspo, which leave unscored completions out"
        ]
    same = [h["frac_reward_zero_std"] for h in history if "frac_reward_zero_std" in h]
    if same and min(same) >= 1.0 and {h.get("group_size") for h in history if "group_size" in h} == {1}:
        return [
            f"{method}: group_size=1: each prompt's one completion is its whole group, so every advantage (a "
            "reward minus its group's mean) was 0 and nothing was learned from the rewards (only the KL term "
            "acts): use --group-size 2 or more, so that a prompt's completions can be compared"
        ]
    if same and min(same) >= 1.0:
        return [
            f"{method}: at every logged step each prompt's completions got the same reward "
            "(frac_reward_zero_std 1.0), so every advantage was 0 and nothing was learned: the rewards must "
            "tell completions apart (room to answer: rl.max_completion_length; variety: rl.temperature; a "
            "model that sometimes succeeds: a warm start)"
        ]
    return []


class SampleLog:
    """Appends each logging step's metrics, and a few sampled completions, to JSON Lines files.

    A run that resumes (GRPO, GSPO) or starts again (PPO) after an interrupted one logs its steps again:
    its first write to a file drops that file's rows from the step it writes on, rows an attempt that was
    thrown away logged (the same logging schedule reaches the same steps), so the MLflow curves and the
    samples table show this run's only."""

    def __init__(self, output_dir: Path, keep: int):
        self.path = Path(output_dir) / SAMPLES_FILE
        self.metrics_path = Path(output_dir) / METRICS_FILE
        self.keep = keep
        self._begun: set[Path] = set()

    def _append(self, path: Path, step: int, rows: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path not in self._begun:
            self._begun.add(path)
            kept = [row for row in _read_jsonl(path) if int(row.get("step", 0)) < step]
            if path.is_file():
                atomic_write_text(path, "".join(_line(row) for row in kept))
        with path.open("a", encoding="utf-8") as f:
            f.writelines(_line(row) for row in rows)

    def write(self, step: int, rows: list[dict[str, Any]]) -> None:
        if self.keep and rows:
            self._append(self.path, step, [{"step": step, **row} for row in rows[: self.keep]])

    def write_metrics(self, step: int, logs: dict[str, Any]) -> None:
        row = {"step": step, **{k: v for k, v in logs.items() if number(v)}}
        self._append(self.metrics_path, step, [row])


def _line(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, default=float) + "\n"


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
