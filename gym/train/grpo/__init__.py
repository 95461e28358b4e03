"""GRPO in gym: online GRPO/GSPO (weights trained through TRL) and Training-Free GRPO (an
experience library learned in context), under the module names the Gym papers document:

    gym.train.grpo.trainer              GRPOTrainer(..., experience_manager=..., training_free=True)
                                        (training_free=False: online GRPO, gym.train.grpo.online_trainer)
    gym.train.grpo.experience_manager   ExperienceManager(library_path=..., max_size=...)
    gym.train.grpo.semantic_extractor   the three LLM stages (summarize, extract, consolidate)
    gym.train.grpo.api_model_adapter    black-box API models as policy / optimizer
"""

from __future__ import annotations

from typing import Any

__all__ = ["ExperienceManager", "GRPOTrainer"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import gym.train.grpo.<module>` never pulls in the trainer's imports.
    if name == "GRPOTrainer":
        from gym.train.grpo.trainer import GRPOTrainer

        return GRPOTrainer
    if name == "ExperienceManager":
        from gym.train.grpo.experience_manager import ExperienceManager

        return ExperienceManager
    raise AttributeError(name)
