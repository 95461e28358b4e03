"""Reward modelling (LLaMA-Factory's `stage: rm`) through TRL's RewardTrainer: a scalar score head
trained on preference pairs with the Bradley-Terry loss, -log sigmoid(r(chosen) - r(rejected))
(Ouyang et al. 2022; TRL's loss, not gym's).

The model is the start model as a sequence-classification model with one output (`load_model`, the
hook gym.train.run loads a method's model through): its backbone, and a new `score` head seeded by
the stage's seed (or the start model's own head, continuing from a reward model). Every adaptation
type trains the head: full and freeze (gym.train.adapters keeps a task head trainable), and the LoRA
family (PEFT's SEQ_CLS task saves the head beside the adapter). The saved model is a
`...ForSequenceClassification` directory, which `reward_model:<dir>` (gym.rewards) loads as a reward
for PPO, GRPO and GSPO.

gym feeds it its own tokenized preference pairs (the chat template and cutoff_len apply): each
answer after its prompt, plus what the template renders after an assistant turn's end-of-turn token
(ChatML: "\\n"), which gym's pairs leave out of each answer but a rendered conversation ends with.
So the reward model is trained on exactly the token ids gym.rewards scores at inference (the whole
conversation, rendered by the template), and its score is read at the same position (the last
token). Pairs longer than cutoff_len are left out, as TRL's RewardTrainer does: a pair cut short may
lose the part where its answers differ.

Metrics: TRL's `accuracy` (chosen scored above rejected) and `margin` are logged under the names
gym's preference methods use, `rewards/accuracies` and `rewards/margins`; the stage's signal is the
held-out `reward_accuracy`.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, DataError
from gym.models import ModelRef
from gym.train import adapters, quant, signals
from gym.train.common import trl_args
from gym.train.config import TrainConfig
from gym.train.pairs import require_ids

logger = logging.getLogger("gym.train")
# TRL's metric names -> gym's (those of the DPO-style methods, which the summary and stage artifact read).
RENAMED = {"accuracy": "rewards/accuracies", "margin": "rewards/margins"}


def load_model(ref: ModelRef, **kwargs: Any) -> Any:
    """The start model as a reward model: a sequence-classification model with one output.

    A causal LM's weights load into the backbone; its `lm_head` is left out and the `score` head is
    new (gym.train.run seeds it). transformers' load report of exactly those two keys is silenced
    the way TRL's RewardTrainer does it when it loads a model itself."""
    from trl.trainer.reward_trainer import suppress_seqcls_warning

    from gym import models

    with suppress_seqcls_warning():
        return models.load_model(ref, num_labels=1, **kwargs)


def check(config: TrainConfig) -> None:
    """Settings a reward model can't honour, before any model loads."""
    if config.speed.unsloth:
        raise ConfigError(
            "rm: unsloth loads causal language models only, and a reward model is a sequence-classification "
            "model; drop --train.speed.unsloth"
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
    from trl import RewardConfig

    require_ids(train_data, config.method)
    tail = turn_end_ids(tokenizer)
    args = RewardConfig(
        **trl_args(config, output_dir, held_out=eval_data is not None),
        max_length=None,  # sequences() left out the pairs over cutoff_len already
    )
    return trainer_class()(
        model=model,
        args=args,
        train_dataset=sequences(train_data, tail, max_length, "training"),
        eval_dataset=sequences(eval_data, tail, max_length, "held-out") if eval_data is not None else None,
        processing_class=tokenizer,
        peft_config=peft_config,
    )


def turn_end_ids(tokenizer: Any) -> list[int]:
    """The token ids the chat template renders after an assistant turn's last special token (ChatML:
    "\\n"): what a rendered conversation ends with beyond gym's answer ids (gym.data.completions
    strips it from each answer)."""
    from gym.data.completions import special_tokens

    conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "!"}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    end = max((text.rfind(t) + len(t) for t in special_tokens(tokenizer) if t in text), default=-1)
    tail = text[end:] if end > 0 and not text[end:].strip() else ""
    return list(tokenizer(tail, add_special_tokens=False)["input_ids"]) if tail else []


def sequences(data: Any, tail: list[int], max_length: int | None, what: str) -> Any:
    """Each pair as RewardTrainer's data: `chosen_ids` / `rejected_ids` = prompt + answer + `tail`,
    pairs with a sequence over `max_length` left out (with a warning; an error if none is left)."""

    def whole(batch: dict[str, list]) -> dict[str, list]:
        prompts = batch["prompt_ids"]
        return {
            name: [list(p) + list(a) + tail for p, a in zip(prompts, batch[name], strict=True)]
            for name in ("chosen_ids", "rejected_ids")
        }

    n = len(data)
    out = data.map(whole, batched=True, remove_columns=data.column_names, desc=f"{what} pairs")
    if max_length is not None:
        out = out.filter(
            lambda row: len(row["chosen_ids"]) <= max_length and len(row["rejected_ids"]) <= max_length,
            desc=f"drop {what} pairs over cutoff_len",
        )
    if len(out) < n:
        logger.warning(
            "rm: %d of %d %s pairs are longer than cutoff_len=%s and are left out",
            n - len(out),
            n,
            what,
            max_length,
        )
    if len(out) == 0:
        raise DataError(
            f"rm: every {what} pair is longer than cutoff_len={max_length} tokens",
            hint="raise --data.cutoff_len",
        )
    return out


@functools.cache
def trainer_class() -> type:
    """TRL's RewardTrainer, logging its accuracy and margin under gym's names (RENAMED)."""
    from trl import RewardTrainer

    class GymRewardTrainer(RewardTrainer):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            # TRL casts a quantized model's trainable weights to bfloat16 (QLoRA). LoRA layers cast their
            # input; the score head, a plain Linear, does not: without bf16 autocast (a CPU run) it must
            # stay in float32, the dtype of the hidden states it reads.
            model: Any = self.model
            if quant.is_quantized(model) and not self.args.bf16:
                head = adapters.task_head(
                    model.get_base_model() if hasattr(model, "get_base_model") else model
                )
                for param in head.parameters() if head is not None else []:
                    if param.requires_grad:
                        param.data = param.data.float()

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            for metrics in self._metrics.values():
                for old, new in RENAMED.items():
                    if old in metrics:
                        metrics[new] = metrics.pop(old)
            super().log(logs, start_time)

    return GymRewardTrainer


def signal(
    eval_before: dict[str, float], eval_after: dict[str, float], log_history: list[dict[str, Any]]
) -> signals.Signal:
    """Reward accuracy: the share of pairs whose chosen answer is scored above the rejected one."""
    return signals.metric("reward_accuracy", "rewards/accuracies", eval_before, eval_after, log_history)
