"""`gym train` flags of the online RL methods (ppo, grpo, gspo), turned into the train flow's parameters.

    gym train --method grpo --dataset D --reward exact_match --reward my_pkg.rewards:fn --reward-weight 0.5 \\
              --group-size 8 --max-steps 50 --json

`--reward SPEC` may repeat (gym.rewards specs); `--reward-weight W` weighs the `--reward` before it
(the others weigh 1.0); `--group-size G` (also the papers' `--group_size` and `--grpo_group_size`)
is GRPO/GSPO's G. They become `--train.rl.rewards`, `--train.rl.reward_weights` and
`--train.rl.group_size`. Without `--dataset`, the demo: gym-tiny warm-started by SFT on
demo_format_sft, then the method on demo_prompts with the toy reward (final_answer, plus
answer_format at weight 0.5), mean_reward measured on demo_prompts_eval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gym.errors import ConfigError
from gym.train.rl_config import DEMO_REWARD_WEIGHTS, DEMO_REWARDS

# Flags (as flow parameters, and LLaMA-Factory's PPO reward_model) that name the stage's rewards.
OWN_REWARDS = {"train.rl.rewards", "reward_model"}

REWARD = ("--reward",)
WEIGHT = ("--reward-weight", "--reward_weight")
GROUP = ("--group-size", "--group_size", "--grpo_group_size", "--grpo-group-size")


def _split(arg: str, flags: tuple[str, ...]) -> tuple[bool, str | None]:
    """Whether `arg` is one of `flags`, and its `=value` if written that way."""
    for flag in flags:
        if arg == flag:
            return True, None
        if arg.startswith(flag + "="):
            return True, arg[len(flag) + 1 :]
    return False, None


def rl_args(argv: Sequence[str], demo: bool) -> list[str]:
    """`argv` with the online RL flags rewritten as flow parameters (and the demo's defaults if `demo`)."""
    rest: list[str] = []
    rewards: list[str] = []
    weights: list[float | None] = []
    args = iter(argv)
    for arg in args:
        matched = None
        for kind, flags in (("reward", REWARD), ("weight", WEIGHT), ("group", GROUP)):
            hit, value = _split(arg, flags)
            if hit:
                matched = (kind, value if value is not None else next(args, None), arg)
                break
        if matched is None:
            rest.append(arg)
            continue
        kind, value, flag = matched
        if value is None:
            raise ConfigError(f"{flag} needs a value")
        if kind == "reward":
            rewards.append(value)
            weights.append(None)
        elif kind == "weight":
            if not rewards or weights[-1] is not None:
                raise ConfigError(f"{flag} {value}: give it right after the --reward it weighs")
            try:
                weights[-1] = float(value)
            except ValueError:
                raise ConfigError(f"{flag} {value}: not a number") from None
            if not math.isfinite(weights[-1] or 0.0):
                raise ConfigError(f"{flag} {value}: not a finite number")
        else:
            rest += ["--train.rl.group_size", value]
    if demo:
        # The demo's rewards only where the user named none, by any spelling (they were appended after
        # the user's --train.rl.rewards / --reward_model, and won)
        spelled = {a.split("=", 1)[0].lstrip("-").replace("-", "_") for a in rest if a.startswith("--")}
        if not rewards and not spelled & OWN_REWARDS:
            rewards, weights = list(DEMO_REWARDS), list(DEMO_REWARD_WEIGHTS)
            if "train.rl.reward_weights" in spelled:  # the user's weights for the demo's rewards
                weights = [None] * len(rewards)
        rest = ["--warm_start.dataset", "demo_format_sft", "--eval_dataset", "none", *rest]
    if rewards:
        rest += ["--train.rl.rewards", *rewards]
        if any(w is not None for w in weights):
            rest += ["--train.rl.reward_weights", *(str(1.0 if w is None else w) for w in weights)]
    return rest
