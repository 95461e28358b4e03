"""Flow parameters as typed configs: the Prefect UI renders a form from them, `gym train`
turns each field into a flag, and tasks receive the parts they need.

Defaults run the embedded gym-tiny on the demo data in a few minutes on a CPU.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gym.data.tokenize import TokenizeSettings
from gym.train.config import TrainConfig
from gym.train.warm_start import WarmStart

# Learning rate, epochs and batch size come from the model's registry `train_defaults` (gym-tiny's
# were measured with scripts/check_demo_learnable.py) unless set here or on the command line.
DEFAULT_SFT = TrainConfig(method="sft", save_steps=500)
DEFAULT_DPO = TrainConfig(method="dpo")


class OutputSettings(BaseModel):
    """Where the result goes once trained."""

    model_config = ConfigDict(extra="forbid")

    register_as: str | None = Field(
        None, description="MLflow registered-model name; default: '<model>-<flow>' (e.g. gym-tiny-sft-dpo)."
    )
    alias: str = Field(
        "challenger", description="Alias set on the new model version (promotion is a later step)."
    )
    output_dir: str | None = Field(None, description="Also copy the final model directory here.")
    experiment: str = Field("gym", description="MLflow experiment name.")
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; default: $MLFLOW_TRACKING_URI or SQLite in the workspace."
    )


class FlowConfig(BaseModel):
    """What every training flow shares: the model, held-out evaluation, tokenization and output."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("gym-tiny", description="Registry name, local model directory or hub id.")
    template: str | None = Field(None, description="Chat template; default: the registry entry's.")
    trust_remote_code: bool = Field(
        False,
        description="Let transformers run Python code from the model repository (off by default).",
    )
    eval_dataset: str | None = Field(
        "demo_sft_eval", description="Held-out instruction data for exact match before/after (None to skip)."
    )
    eval_limit: int | None = Field(None, description="Evaluate on the first N held-out records only.")
    data: TokenizeSettings = Field(default_factory=TokenizeSettings, description="Templating, tokenization.")
    output: OutputSettings = Field(default_factory=OutputSettings, description="Registration and export.")


class SftThenDpoConfig(FlowConfig):
    """SFT on instruction data, then DPO on preference pairs, evaluated before and after."""

    sft_dataset: str = Field("demo_sft", description="Dataset registry name or path for SFT.")
    dpo_dataset: str = Field("demo_dpo", description="Preference dataset (registry name or path) for DPO.")
    dpo_eval_dataset: str | None = Field(
        "demo_dpo_eval", description="Held-out preference pairs for DPO reward accuracy (None to skip)."
    )
    sft: TrainConfig = Field(default_factory=lambda: DEFAULT_SFT.model_copy(), description="SFT stage.")
    dpo: TrainConfig = Field(default_factory=lambda: DEFAULT_DPO.model_copy(), description="DPO stage.")


class TrainFlowConfig(FlowConfig):
    """One training method on one dataset, evaluated before and after."""

    dataset: str = Field("demo_sft", description="Training dataset: registry name or path.")
    method_eval_dataset: str | None = Field(
        None, description="Held-out data in the training format (e.g. preference pairs for DPO)."
    )
    train: TrainConfig = Field(default_factory=lambda: DEFAULT_SFT.model_copy(), description="The stage.")
    warm_start: WarmStart | None = Field(
        None, description="SFT first, then the method from the result (online RL on gym-tiny needs it)."
    )
