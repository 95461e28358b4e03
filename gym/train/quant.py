"""QLoRA's quantized base: bit width, bitsandbytes settings, optimizer, and the full-precision merge.

When `quant.bits` is unset, gym takes 8-bit (closer to the original weights) if the memory LoRA training
on an 8-bit base needs fits in 90% of the memory available now (free GPU memory, or available RAM on a
CPU), else 4-bit; the choice and its numbers are printed and logged with the stage. The memory needed
is the registry's estimate for the model (gym.registry.memory_estimates_for: weights and LoRA state),
or, when larger, gym.train.memory's estimate of a step on the data (the same weights plus the
activations of per_device_train_batch_size sequences of the data's longest length, checkpointed unless
told not to): long sequences or large batches tip a model that fits at 8 bits by weights alone to 4.
The optimizer is bitsandbytes' paged 8-bit AdamW on a GPU; paging needs CUDA's unified memory, so on a
CPU it is bitsandbytes' plain 8-bit AdamW. Activations are checkpointed unless `gradient_checkpointing`
is set false (elsewhere gym.train.memory decides).

At the end the adapter is merged into the base loaded again in full precision (merging into
quantized weights would bake the quantization error into every adapted layer).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, MissingExtraError
from gym.models import ModelRef
from gym.train.config import TrainConfig

GIB = 1024**3
HEADROOM = 0.9  # leave a tenth of the available memory for what the estimate does not cover


def require_bitsandbytes() -> None:
    try:
        # bitsandbytes.nn, not the package: gym's console defers the package's loading to its first use.
        importlib.import_module("bitsandbytes.nn")
    except ImportError:
        raise MissingExtraError(
            "finetuning_type qlora needs bitsandbytes: pip install 'gym[quant]'"
        ) from None


def parameter_count(model_ref: ModelRef) -> int:
    """Parameters of the model: its registry entry's count, else the tensors in its safetensors files."""
    from gym import registry

    spec = registry.load_models().get(model_ref.base_model)
    if spec is not None:
        return spec.parameters
    files = sorted(Path(model_ref.path).glob("*.safetensors")) if Path(model_ref.path).is_dir() else []
    if not files:
        raise ConfigError(
            f"can't estimate the size of {model_ref.name} (not in the registry, no local safetensors): "
            "set --train.quant.bits 4 or 8"
        )
    total = 0
    for f in files:
        with open(f, "rb") as fh:  # the safetensors header: 8-byte length, then JSON with every shape
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for d in info["shape"]:
                    n *= d
                total += n
    return total


def available_memory() -> tuple[float, str]:
    """(GiB available for training now, where): free memory of the current GPU, else available RAM."""
    import torch

    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return free / GIB, f"free on {torch.cuda.get_device_name()}"
    import psutil

    return psutil.virtual_memory().available / GIB, "RAM available (CPU)"


def choose_bits(
    parameters: int, available_gib: float, where: str, step: dict[int, float] | None = None, tokens: int = 0
) -> tuple[int, str]:
    """8 if an 8-bit base fits the available memory with headroom, else 4; and the reason, in words.
    `step`: gym.train.memory's estimate of a training step of `tokens` tokens at each bit width, which
    counts the data's activations; the registry's estimate is the floor."""
    from gym.registry import memory_estimates_for

    registry = memory_estimates_for(parameters)["lora"]
    need = {8: registry["int8"], 4: registry["int4"]}
    for bits, gib in (step or {}).items():
        need[bits] = max(need[bits], gib)
    basis = f" for a step of {tokens} tokens" if step and tokens else ""
    if need[8] <= HEADROOM * available_gib:
        return 8, f"8-bit: estimate {need[8]:.2f} GiB{basis} fits {available_gib:.1f} GiB {where}"
    fits = "fits" if need[4] <= HEADROOM * available_gib else "may NOT fit"
    return 4, (
        f"4-bit: 8-bit estimate {need[8]:.2f} GiB{basis} exceeds {available_gib:.1f} GiB {where}; "
        f"4-bit estimate {need[4]:.2f} GiB {fits}"
    )


def step_estimates(
    config: TrainConfig, model_ref: ModelRef, longest: int | None, cutoff_len: int | None
) -> tuple[int, dict[int, float] | None, int]:
    """The model's parameter count, gym.train.memory's estimate of one step on the data at 8 and 4
    bits, and the step's tokens (None, 0 when the data's lengths or the model's shape are unknown)."""
    from gym.train import memory

    found = memory.step(config, model_ref, longest, cutoff_len)  # the shape holds the parameter count
    if found is None:
        return parameter_count(model_ref), None, 0
    shape, tokens = found
    checkpointed = config.gradient_checkpointing is not False  # qlora's default (below)
    step = {}
    for bits in (8, 4):
        at = config.model_copy(update={"quant": config.quant.model_copy(update={"bits": bits})})
        step[bits] = memory.step_gib(at, shape, tokens, checkpointed=checkpointed)
    return shape.parameters, step, tokens


def resolve(
    config: TrainConfig, model_ref: ModelRef, longest: int | None = None, cutoff_len: int | None = None
) -> tuple[TrainConfig, dict[str, str]]:
    """Bit width and optimizer made concrete for a qlora stage (other stages pass through); the bit
    width from the memory a step of the data's `longest` sequences (cut at `cutoff_len`) needs."""
    if config.finetuning_type != "qlora":
        return config, {}
    require_bitsandbytes()
    import torch

    quant = config.quant
    choices = {}
    if quant.bits is None:
        gib, where = available_memory()
        parameters, step, tokens = step_estimates(config, model_ref, longest, cutoff_len)
        bits, why = choose_bits(parameters, gib, where, step, tokens)
        quant = quant.model_copy(update={"bits": bits})
        choices["quant_bits"] = why
    else:
        choices["quant_bits"] = f"{quant.bits}-bit (given)"
    update: dict[str, Any] = {"quant": quant}
    if config.gradient_checkpointing is None:
        # A 4-/8-bit base saves the weights' memory; unchecked activations would take it back many times
        # over (0.5B Llama, batch 16 x ~1k tokens, H200: 30.9 GB peak unchecked; TRL's checkpointed 2.5 GB).
        update["gradient_checkpointing"] = True
        choices["gradient_checkpointing"] = (
            "on (qlora is for saving memory; --train.gradient_checkpointing false trades it for speed)"
        )
    if config.optim is None:
        update["optim"] = "paged_adamw_8bit" if torch.cuda.is_available() else "adamw_bnb_8bit"
        if not torch.cuda.is_available():
            choices["optim"] = "adamw_bnb_8bit (paged 8-bit AdamW needs CUDA)"
    return config.model_copy(update=update), choices


def compute_dtype(config: TrainConfig) -> Any:
    import torch

    if config.quant.compute_dtype != "auto":
        return getattr(torch, config.quant.compute_dtype)
    gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if gpu_bf16 else torch.float32


def load_kwargs(config: TrainConfig) -> dict[str, Any]:
    """Extra from_pretrained arguments: a BitsAndBytesConfig for qlora, nothing otherwise."""
    if config.finetuning_type != "qlora":
        return {}
    from transformers import BitsAndBytesConfig

    quant = config.quant
    if quant.bits == 8:
        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)}
    dtype = compute_dtype(config)
    return {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quant.quant_type,
            bnb_4bit_use_double_quant=quant.double_quant,
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_quant_storage=dtype,
        ),
        "dtype": dtype,
    }


def keep_trainable_layout(model: Any) -> None:
    """Stop bitsandbytes 0.50.2 repacking 4-bit weights for CPU inference (a training model evaluates too).

    On a CPU with AVX512-BF16, Linear4bit's first forward in eval mode without gradients (a held-out
    evaluation, DPO's precomputed reference) converts its weight to an inference-only layout and
    never converts it back; backward passes through that layout carry no gradient, so the adapter
    silently stops learning. The module's own `support_avx512bf16_for_cpu` flag turns the repacking off.
    """
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def freeze_as_stored(model: Any) -> None:
    """Freeze the quantized model's weights, leaving each in the dtype it loaded in.

    Not PEFT's `prepare_model_for_kbit_training`: it also upcasts every non-quantized weight (embeddings,
    norms, output layer) to float32, and the residual stream with them. On the H200, gym's QLoRA of a
    0.5B model peaked at 3.88 GB with it against TRL's 2.45 GB without (TRL dropped it for that reason,
    finding the same losses: huggingface/trl#4457, #4577); LLaMA-Factory doesn't upcast by default
    either. Trainable weights still get float32 copies (gym.train.precision), as for every type.
    """
    for param in model.parameters():
        param.requires_grad_(False)


def is_quantized(model: Any) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def merge_full_precision(
    model_ref: ModelRef, adapter_dir: Path, load: Callable[..., Any] | None = None
) -> Any:
    """The base model in full precision with the trained adapter merged in; `load` loads the base (default
    gym.models.load_model: a causal LM; a reward model stage passes its own loader)."""
    from peft import PeftModel

    from gym.models import load_model

    base = (load or load_model)(model_ref)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
