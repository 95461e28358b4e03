"""Online GRPO through TRL's GRPOTrainer (GSPO reuses it with sequence-level ratios: gym/train/gspo.py).

For each prompt the policy samples G completions (`rl.group_size`, 1..16) with the model's chat
template (TRL renders gym's prompt messages with the registry template the tokenizer carries, and
trains on the sampled tokens up to and including the end-of-turn token, as SFT does). Rewards come
from gym.rewards, weighted (`rl.reward_weights`); an advantage is the reward minus its group's mean,
divided by the group's std (`rl.advantage_normalization`: group, batch or none). With G=1 every
advantage is 0 (a reward minus its own mean): nothing but the KL term moves the policy, which is
the degenerate case the Gym paper's group statistics imply; gym allows it to show exactly that.

The prompts it samples from are gym.train.rl_common.prompt_data's: refused without any `answer` for
rewards that compare with one, and without the prompts that leave no room for a whole completion
within cutoff_len and the model's context (a warning names them).

gym adds to TRL's trainer (a subclass, no patching):
- `rl.filter_homogeneous_groups`: groups whose rewards are all equal leave the loss (their rows are
  masked out, so they neither dilute the token average nor pull through the KL term);
- min/max reward per logging window, the fraction of filtered groups, and a few sample
  completions per logging step (`samples.jsonl`);
- `evaluate()`: gym's held-out reward eval (mean_reward), the same for every online method;
- multi-turn rollouts through an environment callback (`rl.environment`, gym/train/grpo/multiturn.py).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, cast

from gym.errors import DataError
from gym.rewards import load_rewards, weighted_sum
from gym.train.common import trl_args
from gym.train.config import TrainConfig, filled
from gym.train.rl_common import RewardEval, SampleLog, load_environment, prompt_data, prompt_window
from gym.train.rl_config import RLSettings

COLUMNS = ("prompt", "answer", "metadata")
SCALE = {"group": "group", "batch": "batch", "none": "none"}


def homogeneous_groups(rewards: list[float], group_size: int) -> list[bool]:
    """Per completion, whether its group's rewards are all equal (NaN rewards, unscorable, ignored)."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = [r for r in rewards[start : start + group_size] if not math.isnan(r)]
        out += [len(set(group)) <= 1] * len(rewards[start : start + group_size])
    return out


def grpo_args(
    config: TrainConfig, output_dir: Path, rl: RLSettings, weights: list[float], **method: Any
) -> Any:
    """TRL's GRPOConfig for gym's config; `method` overrides per method (GSPO's sequence level)."""
    from trl import GRPOConfig

    group = filled(rl.group_size, "rl.group_size")  # `rl` is resolved: its defaults are filled in
    args = GRPOConfig(
        **trl_args(config, output_dir),
        # TRL refuses G=1 when validating its config, though its trainer handles it (advantages 0):
        # validate with 2, then set 1 (below) so the degenerate case can be shown.
        num_generations=max(group, 2),
        max_completion_length=rl.max_completion_length,
        temperature=rl.temperature,
        top_k=0,
        beta=float(rl.kl_coef or 0.0),
        epsilon=float(rl.epsilon or 0.2),
        epsilon_high=rl.epsilon_high,
        num_iterations=filled(rl.num_iterations, "rl.num_iterations"),
        scale_rewards=SCALE[filled(rl.advantage_normalization, "rl.advantage_normalization")],
        reward_weights=weights,
        router_aux_loss_coef=filled(rl.moe_aux_loss_coef, "rl.moe_aux_loss_coef"),
        use_vllm=filled(rl.use_vllm, "rl.use_vllm"),
        vllm_mode="colocate",
        **method,
    )
    args.num_generations = group
    return args


def build_trainer(
    *,
    model: Any,
    tokenizer: Any,
    config: TrainConfig,
    train_data: Any,
    eval_data: Any | None,
    output_dir: Path,
    peft_config: Any | None,
    max_length: int | None = None,
    **method: Any,
) -> Any:
    rl = config.rl.resolved(config.method)
    missing = [c for c in COLUMNS if c not in train_data.column_names]
    if missing:
        raise DataError(
            f"{config.method} needs a tokenized prompt dataset with columns {COLUMNS}, missing {missing}",
            hint="use a prompt-format dataset (prompt, optional answer and metadata), e.g. demo_prompts",
        )
    rewards, weights = load_rewards(rl.rewards, rl.reward_weights)
    window = prompt_window(config, max_length, model.config)
    train_data, eval_data = prompt_data(config, rewards, train_data, eval_data, window)
    rollout = None
    if rl.environment:
        from gym.train.grpo.multiturn import multi_turn_rollout

        turns = filled(rl.max_turns, "rl.max_turns")
        rollout = multi_turn_rollout(load_environment(rl.environment), turns, train_data)
    tokenizer.padding_side = "left"  # TRL generates from left-padded prompts
    return trainer_class()(
        model=model,
        reward_funcs=rewards,
        args=grpo_args(config, output_dir, rl, weights, **method),
        train_dataset=train_data.select_columns(list(COLUMNS)),
        processing_class=tokenizer,
        peft_config=peft_config,
        rollout_func=rollout,
        gym_rl=rl,
        reward_eval=RewardEval(eval_data, rewards, weights, rl, config.seed),
        sample_log=SampleLog(output_dir, rl.log_samples),
    )


@functools.cache
def trainer_class() -> type:
    """GRPOTrainer with gym's group filter, reward statistics, sample log and reward eval."""
    import torch
    from trl import GRPOTrainer

    class GymGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        def __init__(
            self, *args: Any, gym_rl: RLSettings, reward_eval: RewardEval, sample_log: SampleLog, **kw: Any
        ):
            super().__init__(*args, **kw)
            self.gym_rl, self.reward_eval, self.sample_log = gym_rl, reward_eval, sample_log
            self._window: list[float] = []

        def _batch_rewards(self, n: int) -> list[float]:
            """The weighted reward of each of the last `n` completions (all processes), as TRL logged them."""
            logs = cast(Any, self._logs)
            per_func = [list(logs["rewards"][name])[-n:] for name in self.reward_func_names]
            weights = self.reward_weights.tolist()
            return weighted_sum([[None if math.isnan(v) else v for v in f] for f in per_func], weights)

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            if not self._training():
                return out
            rewards = self._batch_rewards(len(inputs) * self.accelerator.num_processes)
            self._window += [r for r in rewards if not math.isnan(r)]
            homogeneous = homogeneous_groups(rewards, int(self.num_generations or 1))
            self._metrics["train"]["frac_groups_homogeneous"].append(
                sum(homogeneous) / max(len(homogeneous), 1)
            )
            if self.gym_rl.filter_homogeneous_groups:
                start = self.accelerator.process_index * len(inputs)
                keep = torch.tensor(
                    [not h for h in homogeneous[start : start + len(inputs)]], device=self.accelerator.device
                )
                out["completion_mask"] = out["completion_mask"] * keep.unsqueeze(1).int()
                loss_mask = out["completion_mask"] * out.get("tool_mask", 1)
                out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
            return out

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            training = self._training()
            if training:  # G, for the closing warning (rl_common.signal_warnings): G=1 has no signal
                logs["group_size"] = int(self.num_generations or 1)
            if training and self._window:
                logs["reward_min"], logs["reward_max"] = min(self._window), max(self._window)
                self._window = []
                self._write_samples()
            super().log(logs, start_time)  # TRL adds its metrics to `logs`
            if training:
                self.sample_log.write_metrics(self.state.global_step, logs)

        def _training(self) -> bool:
            return bool(self.model is not None and self.model.training)

        def _write_samples(self) -> None:
            n, logs = self.gym_rl.log_samples, cast(Any, self._logs)
            if not n or not logs["prompt"]:
                return
            # One completion from each of the last groups: different prompts, not one prompt n times.
            size = len(logs["prompt"])
            picks = list(range(0, size, int(self.num_generations or 1)))[-n:]
            totals = self._batch_rewards(size)
            rows = []
            for i in picks:
                row = {"prompt": logs["prompt"][i], "completion": logs["completion"][i]}
                row |= {name: logs["rewards"][name][i] for name in self.reward_func_names}
                rows.append({**row, "reward": totals[i], "advantage": logs["advantages"][i]})
            self.sample_log.write(self.state.global_step, rows)

        def evaluate(
            self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
        ) -> dict:
            return self.reward_eval(self.accelerator.unwrap_model(self.model), self.processing_class)

    return GymGRPOTrainer
