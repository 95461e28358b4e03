"""Gradient checkpointing when an unchecked training step would not fit: the estimate and the choice.

gym keeps activations by default (no recomputation: about a third less compute than checkpointing, TRL's
and LLaMA-Factory's default), unless the step would not fit. With `gradient_checkpointing` unset, a stage
checkpoints when this estimate of an unchecked step exceeds 90% of the memory available now (free GPU
memory, or available RAM on a CPU), and the choice and its numbers are printed and logged with the stage.
QLoRA checkpoints unless told not to, and picks its bit width with this estimate (gym.train.quant).
Set true, the field is left alone; set false where the estimate says the step won't fit, it stays off
and the choices carry a warning saying so.

Per device (DDP keeps a whole copy on each), in bytes:
- weights and optimizer: 16 per trainable parameter (float32 weight, gradient, two AdamW moments; 8 with
  pure_bf16) and frozen parameters as stored (2 under bf16, else 4; QLoRA's at their bit width).
  Trainable: every parameter for full, the trained layers' share for freeze,
  registry.LORA_TRAINABLE_FRACTION for the LoRA family;
- activations per token and decoder layer: (12 h + 4 i) values kept for the backward pass of a
  Llama-style layer (norm inputs and outputs, q/k/v/o inputs and outputs, rotated q and k, attention
  output; the MLP's gate, up, activation and product) at the compute width (2 bytes under bf16, else 4).
  Checkpointed, a layer keeps only its input (h values) and one layer is recomputed at a time;
- logits: tokens x vocab x 8 (float32 logits and their gradient), unless Liger's fused linear
  cross-entropy is on (it never holds them); an upper bound for SFT, whose loss (gym.train.lm_loss)
  projects only the trained-on positions;
- tokens per step: per_device_train_batch_size x the data's longest sequence (cutoff_len rows when
  packing), twice for paired methods (chosen and rejected; KTO's KL batch). For online RL this is the
  policy's update alone: generation, and PPO's value and reward models, come on top.

Checked against an H200 (benchmarks/gpu_train.py: 0.51B parameters, h 1024, i 4096, 28 layers, vocab 32k,
batch 16 of 900-1,024 tokens, bf16, Liger): 32.1 GiB estimated unchecked for 16 x 1,024 tokens (as `plan`
counts them) against gym's 29.8 GiB peak measured (+8%); checkpointed 9.3 GiB against TRL's (checkpointed)
9.0 GiB. It errs high: a step near the limit checkpoints rather than risk running out.
"""

from __future__ import annotations

from dataclasses import dataclass

from gym.errors import ConfigError
from gym.models import ModelRef, load_config
from gym.train.config import TrainConfig

GIB = 1024**3
HEADROOM = 0.9  # as gym.train.quant: a tenth of the available memory for what the estimate leaves out
LAYER_VALUES_H, LAYER_VALUES_I = 12, 4  # values per token a decoder layer keeps, in units of h and i


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model: parameters and the decoder's dimensions."""

    parameters: int
    hidden: int
    intermediate: int
    layers: int
    vocab: int


def shape(model: ModelRef) -> Shape | None:
    """The model's shape from its config.json and parameter count; None when either can't be read."""
    from gym.train.quant import parameter_count

    try:
        config = load_config(model)
        parameters = parameter_count(model)
    except (OSError, ValueError, ConfigError):
        return None
    text = config.get_text_config()
    hidden = getattr(text, "hidden_size", None)
    layers = getattr(text, "num_hidden_layers", None)
    if not hidden or not layers:
        return None
    intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
    return Shape(parameters, hidden, intermediate, layers, getattr(text, "vocab_size", 0) or 0)


def tokens_per_step(config: TrainConfig, longest: int, cutoff_len: int | None) -> int:
    from gym.data.formats import METHOD_KIND

    rows = cutoff_len if config.speed.packing and cutoff_len else longest
    paired = METHOD_KIND.get(config.method) in ("preference", "kto")
    return int(config.per_device_train_batch_size or 1) * rows * (2 if paired else 1)


def trainable_share(config: TrainConfig, layers: int) -> float:
    from gym.registry import LORA_TRAINABLE_FRACTION

    if config.finetuning_type == "full":
        return 1.0
    if config.finetuning_type == "freeze":
        return min(1.0, abs(config.freeze.layers) / layers)
    return LORA_TRAINABLE_FRACTION


def estimate_gib(
    config: TrainConfig, model: Shape, tokens: int, *, bf16: bool, liger: bool, checkpointed: bool
) -> float:
    """Peak GiB of one training step on one device (module docstring)."""
    trainable = model.parameters * trainable_share(config, model.layers)
    frozen = model.parameters - trainable
    stored = config.quant.bits / 8 if config.finetuning_type == "qlora" and config.quant.bits else None
    weights = trainable * (8 if config.pure_bf16 else 16) + frozen * (stored or (2 if bf16 else 4))
    width = 2 if bf16 else 4
    layer = (LAYER_VALUES_H * model.hidden + LAYER_VALUES_I * model.intermediate) * width * tokens
    if checkpointed:
        activations = model.hidden * width * tokens * model.layers + layer
    else:
        activations = layer * model.layers
    logits = 0 if liger else tokens * model.vocab * 8
    return (weights + activations + logits) / GIB


def step(
    config: TrainConfig, model: ModelRef, longest: int | None, cutoff_len: int | None
) -> tuple[Shape, int] | None:
    """(the model's shape, tokens per step) for the data's `longest` sequence and `cutoff_len`; None
    when neither length is known or the model's shape can't be read."""
    rows = min(longest, cutoff_len) if longest and cutoff_len else longest or cutoff_len  # TRL cuts at cutoff
    found = shape(model) if rows else None
    if found is None or rows is None:
        return None
    return found, tokens_per_step(config, rows, cutoff_len)


def step_gib(config: TrainConfig, model: Shape, tokens: int, *, checkpointed: bool) -> float:
    """`estimate_gib` at the precision and Liger setting the stage will train with."""
    from gym.train import speed
    from gym.train.precision import bf16_on

    liger = speed.resolve(config).liger
    return estimate_gib(config, model, tokens, bf16=bf16_on(config), liger=liger, checkpointed=checkpointed)


def resolve(
    config: TrainConfig, model: ModelRef, longest: int | None, cutoff_len: int | None
) -> tuple[TrainConfig, dict[str, str]]:
    """`gradient_checkpointing` made concrete: on when an unchecked step would not fit, else off. Set
    false by the user where it won't fit, it stays off with a warning among the choices."""
    if config.gradient_checkpointing:
        return config, {}
    given_off = config.gradient_checkpointing is False
    off = config.model_copy(update={"gradient_checkpointing": False})
    found = step(config, model, longest, cutoff_len)
    if found is None:
        return off, {}
    from gym.train.quant import available_memory

    model_shape, tokens = found
    unchecked = step_gib(config, model_shape, tokens, checkpointed=False)
    available, where = available_memory()
    if unchecked <= HEADROOM * available:
        return off, {}
    needs = f"a step of {tokens} tokens needs ~{unchecked:.1f} GiB with activations kept, more than "
    if given_off:
        return off, {
            "gradient_checkpointing": f"off as set, but {needs}{available:.1f} GiB {where}: it may run out "
            "of memory (--train.gradient_checkpointing true, or leave it unset)"
        }
    checked = step_gib(config, model_shape, tokens, checkpointed=True)
    fits = (
        "fits"
        if checked <= HEADROOM * available
        else "may still NOT fit (a smaller per_device_train_batch_size or cutoff_len needs less)"
    )
    why = (
        f"on: {needs}{available:.1f} GiB {where}; checkpointed ~{checked:.1f} GiB {fits} "
        "(--train.gradient_checkpointing false keeps them)"
    )
    return config.model_copy(update={"gradient_checkpointing": True}), {"gradient_checkpointing": why}
