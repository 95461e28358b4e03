"""PPO (Schulman et al. 2017; RLHF as in Ziegler et al. 2019) through TRL's `trl.experimental.ppo`.

TRL 1.12 is the last TRL release with PPO; everything TRL-specific lives in this file, so replacing
it touches nothing else. What gym builds around TRL's PPOTrainer:
- the policy (the stage's model) and a value model: the policy's backbone with a fresh one-output
  `score` head (the "value head"), trained together; the reference is a frozen copy of the policy
  (the adapter switched off for LoRA);
- rewards from gym.rewards (functions, reward models, weighted sums) through `TextReward`, a module
  with the interface TRL's PPO calls a reward model by: it decodes each sampled response, finds
  its prompt's record (answer, metadata) and returns the weighted reward at the last token;
- GAE advantages (`rl.gamma`, `rl.lam`), the clipped objective (`rl.epsilon`), a KL penalty to the
  reference in the reward, fixed (`rl.kl_coef`) or adaptive (`rl.adaptive_kl_target`, Ziegler et
  al.'s proportional controller, `adaptive_kl_coef`);
- the same prompts (gym.train.rl_common.prompt_data) as GRPO, but for the records no reward can score
  (no `answer`, every reward needing one): TRL's PPO trains on a reward for every completion, where
  GRPO leaves an unscored one out, so PPO leaves those records out; a completion that still gets no
  reward is trained on as 0 and counted (`frac_unscored`, a closing warning);
- `evaluate()` (held-out mean_reward) and the sample log as GRPO's;
- the trained value model is kept as `<stage>/value_model` (usable as `reward_model:<dir>`).

TRL's PPO saves no resumable checkpoints: an interrupted PPO stage starts again. One update =
one batch of rollouts (`per_device_train_batch_size` x `gradient_accumulation_steps` prompts) and
`rl.ppo_epochs` passes over it; `max_steps` counts updates.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
from pathlib import Path
from typing import Any, cast

from gym.errors import ConfigError, DataError
from gym.rewards import Reward, load_rewards, weighted_sum
from gym.train.common import trl_args
from gym.train.config import TrainConfig, filled
from gym.train.rl_common import RewardEval, SampleLog, prompt_data, prompt_window
from gym.train.rl_config import RLSettings


def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: int, n_steps: int) -> float:
    """Ziegler et al.'s adaptive KL controller: move the coefficient by at most 20% x n_steps/horizon
    towards making the observed KL equal `target`."""
    error = max(-0.2, min(0.2, kl / target - 1))
    return coef * (1 + error * n_steps / horizon)


# TRL's PPOTrainer builds the value model from the plain policy: gym hands it the LoRA config to apply
# (TRL's peft_config) instead of an adapted model (see gym.train.run).
APPLIES_ADAPTER = True
QUANTIZED_LINEAR = ("Linear4bit", "Linear8bitLt")  # bitsandbytes' layers of a qlora policy


def check(config: TrainConfig) -> None:
    """PPO's settings, before any model loads (gym.train.plan calls it with the defaults filled in)."""
    batch = int(config.per_device_train_batch_size or 8) * config.gradient_accumulation_steps
    if config.rl.whiten_rewards and batch < 8:
        raise ConfigError(
            f"rl.whiten_rewards needs at least 8 rollouts per batch to whiten over, and this one has {batch} "
            "(per_device_train_batch_size x gradient_accumulation_steps): raise one of them, or leave "
            "whiten_rewards off"
        )


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
) -> Any:
    from trl.experimental.ppo import PPOConfig

    if "prompt_ids" not in train_data.column_names:
        raise DataError(
            "ppo needs a tokenized prompt dataset (column prompt_ids)",
            hint="use a prompt-format dataset (prompt, optional answer and metadata), e.g. demo_prompts",
        )
    rl = config.rl.resolved("ppo")
    rewards, weights = load_rewards(rl.rewards, rl.reward_weights)
    window = prompt_window(config, max_length, model.config)
    train_data, eval_data = prompt_data(config, rewards, train_data, eval_data, window)
    tokenizer.padding_side = "left"  # TRL's PPO generates from left-padded queries
    batch = int(config.per_device_train_batch_size or 8) * config.gradient_accumulation_steps
    args = PPOConfig(
        **{**trl_args(config, output_dir), "save_strategy": "no"},
        total_episodes=config.max_steps * batch if config.max_steps > 0 else None,
        response_length=rl.max_completion_length,
        stop_token="eos",
        temperature=rl.temperature,
        kl_coef=float(rl.kl_coef or 0.0),
        cliprange=float(rl.epsilon or 0.2),
        vf_coef=filled(rl.vf_coef, "rl.vf_coef"),
        gamma=filled(rl.gamma, "rl.gamma"),
        lam=filled(rl.lam, "rl.lam"),
        whiten_rewards=filled(rl.whiten_rewards, "rl.whiten_rewards"),
        num_ppo_epochs=filled(rl.ppo_epochs, "rl.ppo_epochs"),
        num_sample_generations=0,
        local_rollout_forward_batch_size=batch,
    )
    records = [train_data] + ([eval_data] if eval_data is not None else [])
    queries = train_data.select_columns(["prompt_ids"]).rename_column("prompt_ids", "input_ids")
    return trainer_class()(
        args=args,
        processing_class=tokenizer,
        model=model,
        ref_model=None,
        reward_model=text_reward(tokenizer, records, rewards, weights),
        value_model=value_model(model, tokenizer, config.seed),
        train_dataset=queries,
        eval_dataset=queries,
        peft_config=peft_config,
        gym_rl=rl,
        reward_eval=RewardEval(eval_data, rewards, weights, rl, config.seed),
        sample_log=SampleLog(output_dir, rl.log_samples),
    )


def value_model(policy: Any, tokenizer: Any, seed: int) -> Any:
    """A sequence-classification twin of the policy: its backbone's weights, a new `score` head."""
    import torch
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(policy.config)
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        value = AutoModelForSequenceClassification.from_config(config)
    prefix = policy.base_model_prefix
    getattr(value, prefix).load_state_dict(_backbone_state(getattr(policy, prefix)))
    value.config.pad_token_id = tokenizer.pad_token_id
    return value.to(dtype=policy.dtype)


def _backbone_state(backbone: Any) -> dict[str, Any]:
    """The backbone's weights as a full-precision model holds them: a QLoRA policy's 4-/8-bit layers
    dequantized (the value model trains every weight, as for the other adaptation types), their
    bitsandbytes bookkeeping (scales, formats, quantization state) left out."""
    state = backbone.state_dict()
    quantized = [name for name, m in backbone.named_modules() if type(m).__name__ in QUANTIZED_LINEAR]
    if not quantized:
        return state
    from peft.utils.integrations import dequantize_module_weight

    full = {}
    for key, tensor in state.items():
        owner = next((q for q in quantized if key.startswith(q + ".")), None)
        if owner is None or key == f"{owner}.bias":
            full[key] = tensor
        elif key == f"{owner}.weight":
            full[key] = dequantize_module_weight(backbone.get_submodule(owner)).detach()
    return full


def save_value_model(value: Any, tokenizer: Any, stage_dir: Path) -> Path:
    """Save the trained value model (a score head on the policy's backbone) as `<stage>/value_model`:
    a sequence-classification model that `reward_model:<dir>` can load."""
    from gym import workspace

    target = stage_dir / "value_model"
    if not target.exists():
        with workspace.atomic_dir(target) as tmp:
            value.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)  # with the chat template the policy was trained with
    return target


def text_reward(tokenizer: Any, datasets: list[Any], rewards: list[Reward], weights: list[float]) -> Any:
    """gym's rewards as the module TRL's PPO calls a reward model by (see TextReward)."""
    return _text_reward_class()(tokenizer, datasets, rewards, weights)


@functools.cache
def _text_reward_class() -> type:
    import torch
    from torch import nn

    class _Backbone(nn.Module):
        def __init__(self, owner: Any):
            super().__init__()
            self.owner = [owner]  # a list: not registered as a submodule (no cycle)

        def forward(self, input_ids: Any, attention_mask: Any, **_: Any) -> Any:
            scores = self.owner[0].score_rows(input_ids, attention_mask)
            shape = (*input_ids.shape, 1)
            return type("Output", (), {"hidden_states": (scores.view(-1, 1, 1).expand(shape),)})()

    class TextReward(nn.Module):
        """Reward 'model' for TRL's PPO: `getattr(m, m.base_model_prefix)(...)` then `m.score(...)`."""

        base_model_prefix = "backbone"

        def __init__(self, tokenizer: Any, datasets: list[Any], rewards: list[Reward], weights: list[float]):
            super().__init__()
            self.tokenizer, self.rewards, self.weights = tokenizer, rewards, weights
            self.records: dict[tuple[int, ...], dict[str, Any]] = {}
            for ds in datasets:
                for row in ds:
                    self.records[tuple(row["prompt_ids"])] = row
            self.lengths = sorted({len(k) for k in self.records}, reverse=True)
            self.backbone = _Backbone(self)
            self.score = nn.Identity()
            self.stats: dict[str, list[float]] = {}
            self.rows: list[dict[str, Any]] = []
            self.tokens = 0  # prompt and response tokens sampled (padding excluded), as TRL's GRPO counts

        def _split(self, ids: list[int]) -> tuple[dict[str, Any], list[int]]:
            for n in self.lengths:
                if n <= len(ids) and (record := self.records.get(tuple(ids[:n]))) is not None:
                    return record, ids[n:]
            raise DataError("PPO sampled a response for a prompt that is in no dataset it was given")

        def score_rows(self, input_ids: Any, attention_mask: Any) -> Any:
            self.tokens += int(attention_mask.sum())
            split = [
                self._split(row[mask].tolist())
                for row, mask in zip(input_ids, attention_mask.bool(), strict=True)
            ]
            records, ids = [r for r, _ in split], [i for _, i in split]
            texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
            prompts = [r["prompt"] for r in records]
            completions = [[{"role": "assistant", "content": t}] for t in texts]
            columns = {"answer": [r["answer"] for r in records], "metadata": [r["metadata"] for r in records]}
            scores = [r(prompts, completions, completion_ids=ids, **columns) for r in self.rewards]
            total = weighted_sum(scores, self.weights)
            for reward, values in zip(self.rewards, scores, strict=True):
                self.stats.setdefault(f"rewards/{reward.name}/mean", []).extend(
                    v for v in values if v is not None and not math.isnan(v)
                )
            # The reward statistics are over the completions a reward applied to (NaN: none did), as
            # GRPO's: averaging in NaNs made the logged reward NaN and lost its curve.
            self.stats.setdefault("reward", []).extend(t for t in total if not math.isnan(t))
            self.stats.setdefault("unscored", []).extend(float(math.isnan(t)) for t in total)
            self.stats.setdefault("completions/mean_length", []).extend(len(i) for i in ids)
            # As GRPO's rows: the prompt as text without the template's special tokens, each reward's score.
            shown = self.tokenizer.batch_decode([r["prompt_ids"] for r in records], skip_special_tokens=True)
            self.rows = [
                {
                    "prompt": p,
                    "completion": t,
                    **{r.name: v[i] for r, v in zip(self.rewards, scores, strict=True)},
                    "reward": s,
                }
                for i, (p, t, s) in enumerate(zip(shown, texts, total, strict=True))
            ]
            # TRL's PPO needs a reward per completion: one no reward applied to (records without an answer
            # are left out beforehand: rl_common.scorable_prompts) is trained on as 0, and counted in
            # `frac_unscored`, which the closing warning reports (rl_common.signal_warnings).
            return torch.tensor(total, dtype=torch.float32, device=input_ids.device).nan_to_num(0.0)

        def pop_stats(self) -> dict[str, float]:
            stats, self.stats = self.stats, {}
            out = {k: statistics.fmean(v) for k, v in stats.items() if v and k != "unscored"}
            if stats.get("unscored"):  # completions were scored since the last log
                out["frac_unscored"] = statistics.fmean(stats["unscored"])
                out.setdefault("reward", math.nan)  # none applied: said so, not left out
            if stats.get("reward"):
                out["reward_min"], out["reward_max"] = min(stats["reward"]), max(stats["reward"])
            return out

    return TextReward


@functools.cache
def trainer_class() -> type:
    """TRL's PPOTrainer with gym's reward statistics, sample log, adaptive KL and reward eval."""
    from trl.experimental.ppo import PPOTrainer

    class GymPPOTrainer(PPOTrainer):  # type: ignore[misc]
        def __init__(
            self, *args: Any, gym_rl: RLSettings, reward_eval: RewardEval, sample_log: SampleLog, **kw: Any
        ):
            super().__init__(*args, **kw)
            self.gym_rl, self.reward_eval, self.sample_log = gym_rl, reward_eval, sample_log

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            reward, args, rl = cast(Any, self.reward_model), cast(Any, self.args), self.gym_rl
            logs.update(reward.pop_stats())
            logs["kl"] = logs.get("objective/kl", 0.0)
            logs["clip_ratio"] = logs.get("policy/clipfrac_avg", 0.0)
            logs["kl_coef"] = args.kl_coef
            if rl.adaptive_kl_target is not None and "objective/kl" in logs:
                target = rl.adaptive_kl_target
                horizon = filled(rl.adaptive_kl_horizon, "rl.adaptive_kl_horizon")
                args.kl_coef = adaptive_kl_coef(
                    args.kl_coef, logs["objective/kl"], target, horizon, args.batch_size
                )
            step = self.state.global_step
            if step % args.logging_steps == 0 or step >= self.state.max_steps:  # the last step too, as TRL's
                self.sample_log.write(step, reward.rows)  # logging does: a short run had no samples
            self.sample_log.write_metrics(self.state.global_step, logs)
            # this process's sampled tokens so far, for the progress line's tok/s (train() sums every
            # process's at the end)
            self.state.num_input_tokens_seen = int(cast(Any, self.reward_model).tokens)
            super().log(logs, start_time)

        def train(
            self, resume_from_checkpoint: Any = None, *_: Any, **__: Any
        ) -> Any:  # TRL's PPO: no resume
            import torch

            super().train()
            # TRL's PPO counts no tokens: those the rollouts sampled, over every process
            sampled = torch.tensor([cast(Any, self.reward_model).tokens], device=self.accelerator.device)
            self.state.num_input_tokens_seen = int(self.accelerator.gather(sampled).sum())
            wrapper = self.accelerator.unwrap_model(self.model)
            save_value_model(
                wrapper.value_model, self.processing_class, Path(str(self.args.output_dir)).parent
            )
            # From here on the trainer's model is the policy alone: what gym saves and merges.
            self.model = wrapper.policy

        def evaluate(
            self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
        ) -> dict:
            return self.reward_eval(self.policy_model, self.processing_class)

    return GymPPOTrainer
