"""RoPE scaling: train on sequences longer than the model's context (LLaMA-Factory's `rope_scaling`).

    gym train --method sft --train.rope_scaling linear --data.cutoff_len 8192   # a 4k-context model, 8k

With `rope_scaling` set and the data's cutoff_len beyond the model's context (config.json's
max_position_embeddings), the stage loads the model with its rotary position embedding stretched by
factor = ceil(cutoff_len / context), one of transformers' RoPE types:
- linear: position interpolation (positions divided by the factor);
- dynamic: NTK-aware scaling, which changes the base only for sequences beyond the original context;
- yarn: YaRN; llama3: Llama 3.1's (low/high frequency factors 1 and 4, as LLaMA-Factory).
The context becomes context x factor (dynamic keeps the original one, where its scaling starts); yarn,
dynamic and llama3 record the original context as original_max_position_embeddings. The trained
model's config.json carries these settings, so evaluation, export, serving and a next stage use them;
an adapter stage records them beside its adapter (ADAPTER_FILE), so a merge of the bare adapter made
later (gym export, gym chat --adapter_name_or_path) loads the base stretched the same way.
When cutoff_len fits the context, RoPE is left as it is (LLaMA-Factory does the same). A model whose
RoPE is scaled already (Llama 3.1, or a model gym trained with rope_scaling) is not scaled again. The
choice is printed and recorded with the stage's other choices.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym.errors import ConfigError

if TYPE_CHECKING:
    from gym.models import ModelRef
    from gym.train.config import TrainConfig

# llama3's frequency bands, as LLaMA-Factory sets them (transformers requires them for that type)
_LLAMA3 = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}


def check(config: TrainConfig) -> None:
    """A ConfigError for what rope_scaling can't go with (before any model loads)."""
    if config.rope_scaling and config.speed.unsloth:
        raise ConfigError(
            "rope_scaling: Unsloth loads the model and scales its RoPE itself (to its max_seq_length); "
            "turn off one of rope_scaling and speed.unsloth"
        )


def hint(rope_type: str | None, model: ModelRef, longest: int | None) -> str | None:
    """A note when the data holds sequences (`longest` tokens) beyond the model's context and RoPE is
    left as it is; else None."""
    if rope_type is not None or not longest:
        return None
    from gym.models import load_config

    context = getattr(load_config(model), "max_position_embeddings", None)
    if not isinstance(context, int) or longest <= context:
        return None
    return (
        f"the data's longest sequence has {longest} tokens, beyond {model.name}'s context of {context}: the "
        "model never saw positions past it; the stage's rope_scaling (linear, dynamic, yarn or llama3) "
        "stretches its RoPE to cutoff_len"
    )


def plan(rope_type: str | None, model: ModelRef, cutoff_len: int) -> tuple[dict[str, Any], str | None]:
    """(from_pretrained keyword arguments, the choice in words) for `rope_type` at `cutoff_len`."""
    if rope_type is None:
        return {}, None
    from gym.models import load_config

    config = load_config(model)
    context = getattr(config, "max_position_embeddings", None)
    params = getattr(config, "rope_parameters", None)
    if not isinstance(context, int) or not isinstance(params, dict) or "rope_theta" not in params:
        raise ConfigError(
            f"rope_scaling: {model.name} ({type(config).__name__}) has no single rotary position embedding "
            "with a max_position_embeddings context to stretch (no RoPE, or one per layer type); leave "
            "rope_scaling unset"
        )
    if cutoff_len <= context:
        return (
            {},
            f"none: cutoff_len {cutoff_len} fits the model's context of {context} tokens, RoPE as it is",
        )
    current = params.get("rope_type", "default")
    if current != "default":
        raise ConfigError(
            f"rope_scaling: {model.name}'s RoPE is scaled already ({current}, factor {params.get('factor')}) "
            f"to a context of {context} tokens, and cutoff_len {cutoff_len} is beyond it: lower "
            f"data.cutoff_len to {context}"
        )
    factor = float(math.ceil(cutoff_len / context))
    scaled = {**params, "rope_type": rope_type, "factor": factor}
    if rope_type != "linear":
        scaled["original_max_position_embeddings"] = context
    if rope_type == "llama3":
        scaled |= _LLAMA3
    stretched = int(context * factor)
    longest = context if rope_type == "dynamic" else stretched
    words = f"{rope_type} x{factor:g} for cutoff_len {cutoff_len}: context {context} -> {stretched} tokens"
    return {"rope_scaling": scaled, "max_position_embeddings": longest}, words


# In a stage's adapter folder: how the stage loaded the base under the adapter (a PEFT adapter alone
# can't say), so merging it later (gym export, gym chat --adapter_name_or_path) loads the same base.
ADAPTER_FILE = "gym_base_loading.json"


def save_for_adapter(folder: Path, stretch: dict[str, Any], model_max_length: int) -> None:
    """Record the stage's RoPE stretch (`plan`'s keyword arguments) beside an adapter saved in `folder`."""
    if stretch:
        record = {"from_pretrained": stretch, "model_max_length": model_max_length}
        (folder / ADAPTER_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def for_adapter(folder: Path) -> tuple[dict[str, Any], int | None]:
    """(from_pretrained keyword arguments, the tokenizer's model_max_length) for the base under the
    adapter in `folder`: the stretch its stage trained with, or nothing."""
    path = folder / ADAPTER_FILE
    if not path.is_file():
        return {}, None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return dict(record["from_pretrained"]), int(record["model_max_length"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path}: not the RoPE record gym writes beside an adapter ({e}); delete it only if the adapter "
            "was trained without rope_scaling"
        ) from e
