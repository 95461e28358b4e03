"""GSPO (Group Sequence Policy Optimization, Zheng et al. 2025) through TRL's GRPOTrainer.

GSPO is GRPO with one importance ratio per sequence, the geometric mean of its token ratios
(`importance_sampling_level="sequence"`), clipped at the sequence level with the paper's narrow
range (epsilon 3e-4 below, 4e-4 above), and the loss averaged over sequences (`loss_type="grpo"`:
each sequence's loss is constant over its tokens, so the token mean per sequence is the sequence's
term). As the Gym paper describes it, gym adds a KL penalty to the reference model by default
(`rl.kl_coef` 0.04) and, for Mixture-of-Experts models, the router load-balancing loss
(`rl.moe_aux_loss_coef`); sequence-level ratios are what keep MoE training stable without routing
replay. Ratios differ from 1, and clipping acts, from the second pass over a batch
(`rl.num_iterations` > 1). Everything else (rewards, groups, filtering, evaluation) is GRPO's:
gym/train/grpo/online.py.
"""

from __future__ import annotations

from typing import Any

from gym.train.grpo import online


def build_trainer(**kwargs: Any) -> Any:
    return online.build_trainer(**kwargs, importance_sampling_level="sequence", loss_type="grpo")
