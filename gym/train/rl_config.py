"""Typed settings of the online RL methods (PPO, GRPO, GSPO): `TrainConfig.rl`, plus the flow's
optional warm-start SFT stage. Every field shows in the Prefect UI form and as a `--train.rl.*` flag.

Defaults follow the papers and TRL where they exist: GRPO group size 8, advantages scaled by the
group's std, no KL (TRL's beta=0; DeepSeekMath used 0.04); GSPO sequence-level ratios with the GSPO
paper's clip range 3e-4/4e-4 and a KL term as the Gym paper describes it (beta 0.04); PPO's TRL
values (KL 0.05, clip 0.2, GAE gamma 1, lambda 0.95, value coefficient 0.1, 4 PPO epochs).
Fields left None take the method's default (`METHOD_RL_DEFAULTS`, `GROUP_DEFAULTS`, `PPO_DEFAULTS`):
`resolved(method)` fills them in. Fields only GRPO/GSPO read (`GROUP_ONLY`) or only PPO reads
(`PPO_ONLY`) default to None so that a value the user gives stays visible as given, whatever it is and
however it arrived (the command line dumps every default into the config it validates, so neither a
comparison with the default nor pydantic's `model_fields_set` can tell `--group-size 8` from nothing):
given to the other methods, they are refused (gym.train.rl_common), not ignored.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym.secrets import NO_LOGIN_ITEMS

ONLINE_METHODS = ("ppo", "grpo", "gspo")

# The demo's toy reward (gym/data/demo.py): the right final answer, half credit for the right form.
DEMO_REWARDS = ["final_answer", "answer_format"]
DEMO_REWARD_WEIGHTS = [1.0, 0.5]

# Settings only one kind of online method reads; given to the other, they are refused (gym.train.rl_common).
GROUP_ONLY = (
    "group_size",
    "advantage_normalization",
    "filter_homogeneous_groups",
    "epsilon_high",
    "num_iterations",
    "moe_aux_loss_coef",
    "environment",
    "max_turns",
    "use_vllm",
)  # GRPO/GSPO
PPO_ONLY = (
    "adaptive_kl_target",
    "adaptive_kl_horizon",
    "ppo_epochs",
    "vf_coef",
    "gamma",
    "lam",
    "whiten_rewards",
)

METHOD_RL_DEFAULTS: dict[str, dict[str, float]] = {
    "grpo": {"kl_coef": 0.0, "epsilon": 0.2, "epsilon_high": 0.2},
    "gspo": {"kl_coef": 0.04, "epsilon": 3e-4, "epsilon_high": 4e-4},
    "ppo": {"kl_coef": 0.05, "epsilon": 0.2},  # one clip range: PPO reads no epsilon_high
}
# The defaults of the settings one kind of method reads alone (None in RLSettings: see the docstring).
GROUP_DEFAULTS: dict[str, object] = {
    "group_size": 8,
    "advantage_normalization": "group",
    "filter_homogeneous_groups": False,
    "num_iterations": 1,
    "moe_aux_loss_coef": 0.001,
    "max_turns": 1,
    "use_vllm": False,
}
PPO_DEFAULTS: dict[str, object] = {
    "adaptive_kl_horizon": 10000,
    "ppo_epochs": 4,
    "vf_coef": 0.1,
    "gamma": 1.0,
    "lam": 0.95,
    "whiten_rewards": False,
}


class RLSettings(BaseModel):
    """Online RL: rewards, rollouts, advantages, KL and clipping (methods ppo, grpo, gspo)."""

    model_config = ConfigDict(extra="forbid")

    rewards: list[str] = Field(
        default_factory=lambda: ["exact_match"],
        description="Reward functions (gym.rewards specs): exact_match, numeric_match, final_answer, "
        "answer_format, regex:PATTERN, length_penalty:MAX, reward_model:SOURCE or pkg.module:function.",
        json_schema_extra=NO_LOGIN_ITEMS,  # reward_model:URL's login: never in a deployment's parameters
    )
    reward_weights: list[float] | None = Field(
        None,
        description="One weight per reward (the reward is their weighted sum); None weighs each 1.0.",
    )
    group_size: int | None = Field(
        None,
        ge=1,
        le=16,
        description="GRPO/GSPO: completions sampled per prompt (G), default 8. G=1 leaves no advantage "
        "signal (each reward minus its own group mean is 0): only the KL term acts.",
    )
    advantage_normalization: Literal["group", "batch", "none"] | None = Field(
        None,
        description="GRPO/GSPO: divide advantages by the group's reward std (group, the default), the "
        "batch's (batch), or not at all (none, Dr. GRPO).",
    )
    filter_homogeneous_groups: bool | None = Field(
        None,
        description="GRPO/GSPO: drop groups whose rewards are all equal from the loss (they carry no "
        "advantage signal but still count in the token average and the KL term); default off.",
    )
    kl_coef: float | None = Field(
        None,
        ge=0,
        description="Strength of the KL penalty to the reference (starting) model; 0 loads no reference. "
        "Default: grpo 0, gspo 0.04, ppo 0.05.",
    )
    adaptive_kl_target: float | None = Field(
        None,
        gt=0,
        description="PPO: adapt kl_coef towards this KL per completion (Ziegler et al. 2019); None: fixed.",
    )
    adaptive_kl_horizon: int | None = Field(
        None, ge=1, description="PPO: horizon (in completions) of the adaptive KL; default 10000."
    )
    epsilon: float | None = Field(
        None, gt=0, description="Clip range below 1 of the importance ratio; default grpo/ppo 0.2, gspo 3e-4."
    )
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="GRPO/GSPO: clip range above 1 (DAPO's clip-higher); default: as epsilon (gspo 4e-4).",
    )
    num_iterations: int | None = Field(
        None,
        ge=1,
        description="GRPO/GSPO: optimisation passes over each batch of rollouts (mu), default 1; with 1 the "
        "importance ratio is 1 and clipping never acts.",
    )
    max_completion_length: int = Field(64, ge=1, description="Longest sampled completion, in tokens.")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature of rollouts and of the reward eval."
    )
    moe_aux_loss_coef: float | None = Field(
        None,
        ge=0,
        description="GRPO/GSPO on Mixture-of-Experts models: weight of the router load-balancing loss "
        "(stability), default 0.001; no effect on dense models.",
    )
    environment: str | None = Field(
        None,
        description="GRPO/GSPO multi-turn rollouts: pkg.module:function(messages, record) returning the next "
        "user message, or None to end the episode.",
    )
    max_turns: int | None = Field(
        None,
        ge=1,
        le=16,
        description="GRPO/GSPO: assistant turns per episode with an environment; default 1.",
    )
    use_vllm: bool | None = Field(
        None, description="GRPO/GSPO: sample rollouts with vLLM (extra `vllm`, CUDA); default off."
    )
    eval_samples: int = Field(
        4, ge=1, le=64, description="Completions sampled per held-out prompt to measure mean_reward."
    )
    log_samples: int = Field(4, ge=0, description="Sample completions kept per logging step (MLflow table).")
    ppo_epochs: int | None = Field(
        None, ge=1, description="PPO: optimisation epochs over each batch of rollouts; default 4."
    )
    vf_coef: float | None = Field(
        None, ge=0, description="PPO: weight of the value-function loss; default 0.1."
    )
    gamma: float | None = Field(None, ge=0, le=1, description="PPO: discount factor of GAE; default 1.")
    lam: float | None = Field(
        None, ge=0, le=1, description="PPO: lambda of generalised advantage estimation (GAE); default 0.95."
    )
    whiten_rewards: bool | None = Field(
        None,
        description="PPO: whiten each batch's per-token rewards (zero mean, unit variance) before GAE, as "
        "TRL's whiten_rewards (LLaMA-Factory's ppo_whiten_rewards); needs 8 or more rollouts per batch. "
        "Default off.",
    )

    @model_validator(mode="after")
    def _weights_match(self) -> RLSettings:
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(
                f"{len(self.reward_weights)} reward_weights for {len(self.rewards)} rewards: give one weight "
                "per reward, or none"
            )
        if not all(math.isfinite(w) for w in self.reward_weights or []):  # NaN made every reward NaN
            raise ValueError(f"reward_weights must be finite numbers, got {self.reward_weights}")
        return self

    def given(self, names: tuple[str, ...]) -> list[str]:
        """Which of the fields `names` (of GROUP_ONLY, PPO_ONLY) the user set, whatever the value."""
        return [n for n in names if getattr(self, n) is not None]

    def resolved(self, method: str) -> RLSettings:
        """These settings as `method` trains with them: its defaults filled in where a field is None, and
        the fields it does not read set to None (rl_common.check refuses them where they were given), so
        that a stage's record and digest hold what the method uses and nothing else."""
        ppo = method == "ppo"
        defaults: dict[str, object] = {**METHOD_RL_DEFAULTS.get(method, METHOD_RL_DEFAULTS["grpo"])}
        defaults |= PPO_DEFAULTS if ppo else GROUP_DEFAULTS
        if self.epsilon is not None and not ppo:
            defaults["epsilon_high"] = self.epsilon  # clip-higher defaults to the same range
        update: dict[str, object] = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        update |= dict.fromkeys(GROUP_ONLY if ppo else PPO_ONLY)
        return self.model_copy(update=update)
