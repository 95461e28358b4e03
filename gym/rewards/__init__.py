"""Reward functions shared by every method that scores completions: online RL (PPO, GRPO, GSPO),
Training-Free GRPO's verifiers, and generation evals.

A reward function takes the completion text and the record's ground truth (and keyword
metadata) and returns a float; `gym.rewards.match` holds the ground-truth verifiers.
"""
