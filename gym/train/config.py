"""Typed training configuration shared by every method (one stage = one method run).

Defaults follow the papers and TRL where those exist (DPO beta 0.1, sigmoid loss; LoRA
r=8, alpha=16); the learning-rate/step defaults suit the embedded gym-tiny model so the
zero-set-up flow finishes in minutes on a CPU. Field descriptions show in the Prefect UI
form and in `gym train --help`.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gym.errors import ConfigError
from gym.train.distributed import DistributedSettings
from gym.train.rl_config import ONLINE_METHODS, RLSettings
from gym.train.speed import SpeedSettings

# Every method gym knows by name; `gym.train.METHODS` holds the ones implemented (one file each).
Method = Literal[
    "sft",
    "pt",
    "dpo",
    "ipo",
    "cdpo",
    "hinge",
    "kto",
    "orpo",
    "simpo",
    "rm",
    "ppo",
    "grpo",
    "gspo",
    "tf_grpo",
]
# Methods whose model scores text instead of generating it (rm: a reward model, a sequence-classification
# model): flows skip generation evals for them, and chat/serve refuse their output.
SCORING_METHODS = ("rm",)
# How the weights are adapted; the LoRA family are PEFT adapters.
FinetuningType = Literal["full", "freeze", "lora", "rslora", "dora", "pissa", "loraplus", "longlora", "qlora"]


FINETUNING_TYPES: tuple[str, ...] = get_args(FinetuningType)
# Adaptation types that train a PEFT LoRA adapter (the rest update the model's own weights).
LORA_TYPES = ("lora", "rslora", "dora", "pissa", "loraplus", "longlora", "qlora")


class LoraSettings(BaseModel):
    """PEFT LoRA adapter settings (every finetuning_type of the LoRA family reads them).

    The variants are reachable both as their own finetuning_type and from `lora`:
    `--finetuning_type dora` trains the same adapter as `--finetuning_type lora --train.lora.use_dora`.
    """

    model_config = ConfigDict(extra="forbid")

    r: int = Field(8, ge=1, description="LoRA rank.")
    alpha: int = Field(
        16, ge=1, description="LoRA scaling numerator (scale = alpha / r, or alpha / sqrt(r) with rslora)."
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: list[str] | None = Field(
        None, description="Module names to adapt; default: the registry entry's lora_target_modules."
    )
    use_rslora: bool = Field(False, description="Rank-stabilised scaling alpha/sqrt(r) (rsLoRA).")
    use_dora: bool = Field(False, description="Weight-decomposed LoRA (DoRA).")
    init: Literal["default", "pissa", "gaussian"] = Field(
        "default",
        description="Adapter initialisation: PEFT default, PiSSA (principal singular vectors) or gaussian.",
    )
    loraplus_lr_ratio: float | None = Field(
        None,
        gt=0,
        description="LoRA+: learning rate of B = ratio x that of A (paper: 16); finetuning_type loraplus "
        "uses 16 when unset.",
    )


class FreezeSettings(BaseModel):
    """Partial fine-tuning (finetuning_type=freeze): train a few decoder layers, keep the rest frozen."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(
        2, description="Train the last N decoder layers (a negative N: the first |N|; 0: none, see modules)."
    )
    modules: list[str] | None = Field(
        None,
        description="Only these submodules of the trained layers (e.g. mlp, self_attn); default: all.",
    )
    extra_modules: list[str] = Field(
        default_factory=list,
        description="Modules outside the decoder layers to train as well (e.g. embed_tokens, norm, lm_head).",
    )


class LongLoraSettings(BaseModel):
    """LongLoRA (finetuning_type=longlora): LoRA, trainable embeddings and norms, shifted sparse attention."""

    model_config = ConfigDict(extra="forbid")

    shift_attention: bool = Field(
        True,
        description="Shifted sparse attention (S2-Attn) while training; needs a model whose attention goes "
        "through transformers' AttentionInterface.",
    )
    group_size_ratio: float = Field(
        0.25, gt=0, le=1, description="S2-Attn group size as a fraction of the sequence length (paper: 1/4)."
    )
    trainable_modules: list[str] | None = Field(
        None, description="Modules trained in full beside the adapter; default: embeddings and every norm."
    )


class QuantSettings(BaseModel):
    """QLoRA (finetuning_type=qlora): the frozen base is quantized by bitsandbytes; the adapter trains."""

    model_config = ConfigDict(extra="forbid")

    bits: Literal[4, 8] | None = Field(
        None,
        description="4 (NF4/FP4) or 8 (LLM.int8); default: 8 when the registry's memory estimate for 8-bit "
        "training fits the memory available, else 4 (the choice is printed and logged).",
    )
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type (QLoRA paper: NF4).")
    double_quant: bool = Field(True, description="Quantize the 4-bit quantization constants too (QLoRA).")
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype of the 4-bit matmuls; auto: bfloat16 on a GPU supporting it, else float32."
    )


class TrainConfig(BaseModel):
    """One training stage: which method, how to adapt the weights, and the optimiser schedule."""

    model_config = ConfigDict(extra="forbid")

    method: Method = Field("sft", description="Training method; see gym.train.METHODS.")
    finetuning_type: FinetuningType = Field(
        "full",
        description="full, freeze (some layers), or a LoRA adapter: lora, rslora, dora, pissa, loraplus, "
        "longlora, qlora.",
    )
    learning_rate: float | None = Field(
        None,
        gt=0,
        description="Peak learning rate; default: the model's registry train_defaults, else the method's.",
    )
    max_steps: int = Field(-1, description="Optimiser steps; -1 means use num_train_epochs.")
    num_train_epochs: float | None = Field(
        None, gt=0, description="Epochs over the data when max_steps is -1; default as for learning_rate."
    )
    per_device_train_batch_size: int | None = Field(
        None, ge=1, description="Sequences (or pairs) per device per step; default as for learning_rate."
    )
    per_device_eval_batch_size: int | None = Field(
        None,
        ge=1,
        description="Held-out sequences (or pairs) per device per batch; default: the training batch.",
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, description="Micro-batches accumulated per optimiser step."
    )
    lr_scheduler_type: str = Field(
        "cosine", description="transformers scheduler name (cosine, linear, constant...)."
    )
    lr_scheduler_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="More arguments of the scheduler (transformers' lr_scheduler_kwargs), e.g. "
        '{"min_lr_rate": 0.1} with cosine_with_min_lr.',
    )
    warmup_ratio: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Fraction of steps spent warming the learning rate up (none in a one-step run).",
    )
    warmup_steps: int | None = Field(
        None, ge=0, description="Steps spent warming the learning rate up; when set, instead of warmup_ratio."
    )
    neftune_noise_alpha: float | None = Field(
        None,
        gt=0,
        description="NEFTune (arXiv 2310.05914): uniform noise of this scale on the input embeddings while "
        "training (transformers' Trainer); the paper uses 5. Off when unset. The noise scales with a row's "
        "length: padding-free or packed rows (a whole batch long) get less; speed.padding_free auto stays "
        "padded with it.",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW's decay of the first moment.")
    adam_beta2: float = Field(0.999, ge=0, lt=1, description="AdamW's decay of the second moment.")
    adam_epsilon: float = Field(1e-8, gt=0, description="AdamW's epsilon.")
    optim: str | None = Field(
        None,
        description="transformers optimizer name; default: transformers' AdamW, and for qlora "
        "paged_adamw_8bit (adamw_bnb_8bit on a CPU: paging needs CUDA).",
    )
    seed: int = Field(42, description="Seed for data order and initialisation of new weights.")
    logging_steps: int = Field(5, ge=1, description="Log the loss every N steps (and at the last step).")
    eval_steps: int | None = Field(
        None,
        ge=1,
        description="Also evaluate the held-out data (val_size or method_eval_dataset) every N optimiser "
        "steps; default: only before and after training. Online RL methods evaluate before and after only.",
    )
    eval_strategy: Literal["no", "steps", "epoch"] | None = Field(
        None,
        description="Held-out evaluation during training (transformers' names): every eval_steps steps "
        "(logging_steps when eval_steps is unset), every epoch, or no; default: steps when eval_steps is "
        "set, else no. Before and after training it is evaluated either way.",
    )
    save_steps: int = Field(
        100, ge=1, description="Checkpoint every N steps (training resumes from the last one)."
    )
    save_total_limit: int = Field(2, ge=1, description="Checkpoints kept in the run directory.")
    bf16: bool | None = Field(
        None,
        description="bfloat16 mixed precision: trainable weights stay float32, frozen ones as stored, the "
        "forward under bf16 autocast (gym.train.precision). None: on where a GPU supports bfloat16 (TRL's "
        "default), off elsewhere; False: the model trains in float32.",
    )
    pure_bf16: bool = Field(
        False,
        description="With bf16: weights and optimizer states in bfloat16 too, no float32 master copy (half "
        "the memory of full fine-tuning; updates below bf16's precision are lost). LLaMA-Factory's "
        "pure_bf16.",
    )
    gradient_checkpointing: bool | None = Field(
        None,
        description="Recompute activations in the backward pass: less memory, a third more compute. None: on "
        "for qlora (chosen to save memory: the QLoRA paper, TRL and LLaMA-Factory checkpoint); otherwise on "
        "only when a step with activations kept would not fit the memory available (gym.train.memory's "
        "estimate), else off, for speed. gym prints the choice when it turns it on, and warns when set false "
        "where that estimate says a step won't fit.",
    )
    rope_scaling: Literal["linear", "dynamic", "yarn", "llama3"] | None = Field(
        None,
        description="Stretch the model's RoPE when the data's cutoff_len is beyond its context "
        "(max_position_embeddings), by ceil(cutoff_len / context): linear, dynamic (NTK), yarn or llama3, as "
        "LLaMA-Factory's rope_scaling; the saved model carries it (gym.train.rope). None: RoPE as it is.",
    )
    lora: LoraSettings = Field(
        default_factory=LoraSettings, description="LoRA settings (every LoRA-family finetuning_type)."
    )
    freeze: FreezeSettings = Field(
        default_factory=FreezeSettings, description="Which layers train (finetuning_type=freeze)."
    )
    longlora: LongLoraSettings = Field(
        default_factory=LongLoraSettings, description="LongLoRA settings (finetuning_type=longlora)."
    )
    quant: QuantSettings = Field(
        default_factory=QuantSettings, description="Quantization of the frozen base (finetuning_type=qlora)."
    )
    beta: float | None = Field(
        None,
        gt=0,
        description="Preference methods: DPO/IPO/KTO KL strength, ORPO's lambda, SimPO's reward scale; "
        "default: the method's paper value.",
    )
    loss_type: Literal["sigmoid", "ipo", "hinge"] | None = Field(
        None, description="DPO loss: sigmoid (DPO), ipo (IPO) or hinge (SLiC); default: set by the method."
    )
    label_smoothing: float | None = Field(
        None,
        ge=0,
        lt=0.5,
        description="DPO: assumed label-noise rate; > 0 gives conservative DPO (cDPO; method cdpo: 0.1).",
    )
    simpo_gamma: float | None = Field(
        None, ge=0, description="SimPO: target reward margin gamma (default: beta / 2, the paper's ratio)."
    )
    sft_loss_weight: float = Field(
        0.0,
        ge=0,
        description="dpo/ipo/cdpo/hinge/simpo: weight of an SFT loss (token cross-entropy of the chosen "
        "answers) added to the preference loss, as RPO and LLaMA-Factory's pref_ftx; 0: none. kto and orpo "
        "refuse it; other methods ignore it.",
    )
    desirable_weight: float = Field(1.0, gt=0, description="KTO: weight of desirable completions' loss.")
    undesirable_weight: float = Field(1.0, gt=0, description="KTO: weight of undesirable completions' loss.")
    reference: Literal["auto", "precomputed", "live"] = Field(
        "auto",
        description="Reference of dpo/ipo/cdpo/hinge/kto: log-probs precomputed once, or scored live each "
        "step (LoRA: the adapter switched to its frozen initial copy; full: a frozen copy); auto: cheaper.",
    )
    speed: SpeedSettings = Field(
        default_factory=SpeedSettings,
        description="Throughput: attention kernel, padding-free or packed batches, Liger, Unsloth, compile.",
    )
    rl: RLSettings = Field(
        default_factory=RLSettings,
        description="Online RL (ppo, grpo, gspo): rewards, rollouts, KL, clipping.",
    )
    distributed: DistributedSettings = Field(
        default_factory=DistributedSettings,
        description="Processes training the stage (DDP; auto: every GPU when there are several).",
    )

    @field_validator("max_steps")
    @classmethod
    def _steps_or_epochs(cls, steps: int) -> int:
        # HF's Trainer reads any value below 1 as "use the epochs"; 0 or -5 is more likely a slip than that
        if steps == 0 or steps < -1:
            raise ValueError("give 1 or more steps, or -1 to train num_train_epochs")
        return steps

    @model_validator(mode="after")
    def _pure_bf16_needs_bf16(self) -> TrainConfig:
        if self.pure_bf16 and self.bf16 is False:
            raise ValueError("pure_bf16 trains in bfloat16 without float32 master weights: set bf16=True too")
        return self

    @model_validator(mode="after")
    def _sft_loss_where_it_applies(self) -> TrainConfig:
        # The other preference methods can't take it; methods outside the family ignore it, as they do beta
        # (a stage-wide setting reaches the SFT stage of sft_then_dpo too)
        if self.sft_loss_weight and self.method in ("kto", "orpo"):
            why = {
                "orpo": "ORPO's loss has an SFT term of its own (beta weighs the odds-ratio term beside it)",
                "kto": "TRL's KTO loss has no SFT term to weigh",
            }[self.method]
            raise ValueError(
                f"sft_loss_weight adds an SFT loss to dpo, ipo, cdpo, hinge and simpo; {why}: leave it at 0"
            )
        return self


# Optimiser defaults per method and adaptation family (full: full and freeze; lora: the LoRA family) where
# the user and the model's registry entry are silent: TRL's defaults for full fine-tuning (SFT 2e-5; DPO,
# KTO, ORPO and CPO/SimPO 1e-6; batch 8), and the higher learning rates LLaMA-Factory's LoRA examples use
# (only the adapter moves).
_PREFERENCE = {
    "full": {"learning_rate": 1e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    "lora": {"learning_rate": 5e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
}
METHOD_DEFAULTS: dict[str, dict[str, dict[str, float]]] = {
    "sft": {
        "full": {"learning_rate": 2e-5, "num_train_epochs": 3, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-4, "num_train_epochs": 3, "per_device_train_batch_size": 8},
    },
    # Continued pretraining: SFT's rates (LLaMA-Factory's LoRA pretraining example: 1e-4, 3 epochs); the batch
    # counts blocks of cutoff_len tokens.
    "pt": {
        "full": {"learning_rate": 2e-5, "num_train_epochs": 3, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-4, "num_train_epochs": 3, "per_device_train_batch_size": 8},
    },
    **{m: _PREFERENCE for m in ("dpo", "ipo", "cdpo", "hinge", "kto", "orpo", "simpo")},
    # Reward models: about InstructGPT's RM setting (9e-6, one epoch) for full fine-tuning; TRL's RewardConfig
    # default (1e-4) for an adapter.
    "rm": {
        "full": {"learning_rate": 1e-5, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-4, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
    # Online RL: TRL's GRPO (1e-6) and PPO (3e-6) rates for full fine-tuning; the batch counts
    # completions (GRPO: group_size per prompt, so it must be a multiple of it).
    "grpo": {
        "full": {"learning_rate": 1e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-5, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
    "gspo": {
        "full": {"learning_rate": 1e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-5, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
    "ppo": {
        "full": {"learning_rate": 3e-6, "num_train_epochs": 1, "per_device_train_batch_size": 8},
        "lora": {"learning_rate": 1e-5, "num_train_epochs": 1, "per_device_train_batch_size": 8},
    },
}
# Method hyperparameters from each paper, for fields the user leaves unset.
METHOD_PARAMS: dict[str, dict[str, Any]] = {
    # DPO (Rafailov et al. 2023): beta 0.1, the sigmoid loss.
    "dpo": {"beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0},
    # IPO (Azar et al. 2023): the squared loss; beta is its tau (TRL's default 0.1).
    "ipo": {"beta": 0.1, "loss_type": "ipo", "label_smoothing": 0.0},
    # Conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences"): labels flipped with eps = 0.1.
    "cdpo": {"beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.1},
    # SLiC-HF (Zhao et al. 2023) hinge loss on the DPO log-ratio, beta 0.1 as TRL.
    "hinge": {"beta": 0.1, "loss_type": "hinge", "label_smoothing": 0.0},
    # KTO (Ethayarajh et al. 2024): beta 0.1, equal weights for balanced data.
    "kto": {"beta": 0.1},
    # ORPO (Hong et al. 2024): lambda 0.1 (TRL calls it beta).
    "orpo": {"beta": 0.1},
    # SimPO (Meng et al. 2024): beta 2.0-2.5 and gamma / beta = 0.5 in the paper's tuned settings.
    "simpo": {"beta": 2.0},
}
# The loss each DPO-variant method name means; a different --train.loss_type with it is a contradiction.
METHOD_LOSS = {"dpo": None, "ipo": "ipo", "cdpo": "sigmoid", "hinge": "hinge"}


# The fields only some methods read: hyperparameters() leaves them out of the others' record.
METHOD_FIELDS = {
    "sft_loss_weight": ("dpo", "ipo", "cdpo", "hinge", "simpo"),
    "reference": ("dpo", "ipo", "cdpo", "hinge", "kto"),
    "desirable_weight": ("kto",),
    "undesirable_weight": ("kto",),
    "rl": ONLINE_METHODS,
}


def hyperparameters(config: TrainConfig) -> dict[str, Any]:
    """What a stage trains with, as its card and lineage record it: `config` made concrete (by
    gym.train.plan) without the unset fields and without the sections its method and finetuning_type
    don't read (rl settings for SFT, LoRA settings for full fine-tuning...). An online method's rl
    settings are those it uses (`RLSettings.resolved`): the KL coefficient and clip range it trained
    with, and none of the other kind of method's (PPO's value-function settings for GRPO...)."""
    if config.method in ONLINE_METHODS:
        config = config.model_copy(update={"rl": config.rl.resolved(config.method)})
    return config.model_dump(mode="json", exclude_none=True, exclude=unread(config))


def unread(config: TrainConfig) -> set[str]:
    """The fields and sections of `config` its method and finetuning_type don't read."""
    kind = config.finetuning_type
    fields = {f for f, methods in METHOD_FIELDS.items() if config.method not in methods}
    fields |= {"lora"} if kind not in LORA_TYPES else set()
    fields |= {section for section in ("freeze", "longlora") if kind != section}
    return fields | ({"quant"} if kind != "qlora" else set())


def family(finetuning_type: str) -> str:
    """`full` for types that update the model's own weights, `lora` for the adapter types."""
    return "lora" if finetuning_type in LORA_TYPES else "full"


def with_defaults(config: TrainConfig, model_defaults: dict[str, dict[str, float]]) -> TrainConfig:
    """Fill the fields the user left unset: the model's measured values first (for the method and
    adaptation family, `"sft:lora"`, over those for the method), then the method's."""
    kind = family(config.finetuning_type)
    chosen = {
        **METHOD_PARAMS.get(config.method, {}),
        **METHOD_DEFAULTS.get(config.method, {}).get(kind, {}),
        **model_defaults.get(config.method, {}),
        **model_defaults.get(f"{config.method}:{kind}", {}),  # measured for this adaptation family
    }
    unknown = sorted(set(chosen) - set(TrainConfig.model_fields))
    if unknown:  # the registry's train_defaults for this model name a setting TrainConfig has not
        raise ConfigError(
            f"the model's registry entry (train_defaults for {config.method}) sets {', '.join(unknown)}, "
            "which gym's training has no setting for: fix the name in registry/models.json"
        )
    unset = {k: v for k, v in chosen.items() if getattr(config, k) is None}
    if "per_device_train_batch_size" in unset:
        unset["per_device_train_batch_size"] = int(unset["per_device_train_batch_size"])
    wanted = METHOD_LOSS.get(config.method)
    if wanted and config.loss_type not in (None, wanted):
        raise ConfigError(
            f"method {config.method!r} is the {wanted} loss, but loss_type is {config.loss_type!r}; "
            f"use method dpo with --train.loss_type {config.loss_type}, or drop --train.loss_type"
        )
    if config.method == "simpo" and config.simpo_gamma is None:
        unset["simpo_gamma"] = (config.beta or unset["beta"]) / 2  # SimPO: gamma / beta = 0.5
    return config.model_copy(update=unset)


T = TypeVar("T")


def filled(value: T | None, name: str) -> T:
    """A field `with_defaults` fills for the method (a None here means it was skipped)."""
    if value is None:
        raise ConfigError(f"{name} is unset: gym.train.run fills it (gym.train.config.with_defaults)")
    return value
