"""The optional warm-start stage of the train flow: SFT before the method (`TrainFlowConfig.warm_start`).

Online RL learns only from rewards that differ between sampled completions, and gym-tiny starts from
random weights: `gym train --method grpo|gspo|ppo` on the demo data first fine-tunes it on
demo_format_sft (answers in the requested form half of the time; gym/data/demo.py), a cached,
content-addressed stage like any other, then runs the online method from the result. `gym train
--method kto` on its demo data does the same on demo_sft (flows/commands.py: KTO's unpaired answers
can only be told apart by a model that already relates answers to questions).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gym.secrets import NO_LOGIN_SCHEMA
from gym.train.config import TrainConfig

# About 40 s on a quiet 2-core CPU: gym-tiny then answers in the requested form half of the time.
DEFAULT_WARM_START = TrainConfig(
    method="sft", learning_rate=3e-3, max_steps=600, per_device_train_batch_size=32, save_steps=500
)


class WarmStart(BaseModel):
    """SFT on `dataset` before the flow's method, which then starts from the fine-tuned model."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(
        "demo_format_sft",
        description="SFT dataset (registry name or path) of the warm start.",
        json_schema_extra=NO_LOGIN_SCHEMA,
    )
    train: TrainConfig = Field(
        default_factory=lambda: DEFAULT_WARM_START.model_copy(), description="The warm-start SFT stage."
    )
