"""Reward functions shared by every method that scores completions: online RL (PPO, GRPO, GSPO),
Training-Free GRPO's verifiers, and generation evals.

- `gym.rewards.match`: ground-truth verifiers `exact_match`, `numeric_match`: (completion, answer) -> float.
- `gym.rewards.answer`: the final answer after a marker (`final_answer`), the answer form
  (`answer_format`), regex rewards.
- `gym.rewards.model`: reward models (a sequence-classification model with a score head).
- `gym.rewards.base`: every reward by name (`load_rewards`), called the way TRL calls reward functions.
- `gym.rewards.evaluate`: the mean reward of a model's sampled completions on held-out prompts.
"""

from gym.rewards.base import Reward, load_reward, load_rewards, weighted_sum

__all__ = ["Reward", "load_reward", "load_rewards", "weighted_sum"]
