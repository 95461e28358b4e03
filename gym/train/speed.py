"""Throughput settings of a training stage: attention kernel, padding-free batches, packing, Liger
kernels, Unsloth and torch.compile, resolved once per stage and applied through the model loading
path (`load_options`) and the TRL arguments every method shares (`trainer_args`).

    gym train --method sft --train.speed.liger on --train.speed.attn_implementation flash_attention_2

"auto" means: on where it is safe and measured faster. On a CPU that is SDPA attention with padding-free
batches through gym's per-sequence SDPA (gym.train.varlen, no dense block mask): 1.05-1.08x the useful
tokens/s of padded batches on the demo's uniform 20-32-token sequences, 1.22x on all the demo SFT data
mixed, 2.28x on MMLU questions' spread of lengths (benchmarks/methods.py); on a CUDA GPU with flash-attn
installed they run through its varlen kernel; on a GPU without it batches stay padded (gym's
per-sequence SDPA is not yet measured there), and so do LongLoRA's (its shifted sparse attention groups
each row's tokens) and NEFTune's (its noise scales with the row's length). Liger kernels are on by
default where they can run (CUDA, liger-kernel installed) for the methods whose TRL trainer uses them
with gym's settings. GPU-only backends asked for where they can't run fail before any model is loaded,
saying what is needed."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gym.errors import ConfigError

if TYPE_CHECKING:
    from gym.train.config import TrainConfig

Switch = Literal["auto", "on", "off"]
Attention = Literal["auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3"]
FLASH = ("flash_attention_2", "flash_attention_3")
# Methods whose TRL trainer takes padded sequences flattened into one row (TRL 1.12: SFTTrainer only;
# DPOTrainer's padding_free is disabled upstream and falls back to padding).
PADDING_FREE_METHODS = ("sft", "pt")
# Methods where "auto" turns Liger on. DPO-style trainers are left out: gym precomputes the reference
# log-probs, which TRL's Liger DPO loss does not support.
LIGER_METHODS = ("sft", "pt")
# Methods whose trainers count the real tokens they train on (for tokens/s). The Trainer counts batches'
# `input_ids`; KTO's count is its prompt+completion rows (not the mismatched KL rows it also runs); ORPO
# and SimPO batch each answer after its prompt instead, counted by gym.train.pairs.count_pair_tokens.
TOKEN_COUNTED_METHODS = ("sft", "pt", "dpo", "ipo", "cdpo", "hinge", "kto", "orpo", "simpo", "rm")
GPU_EXTRAS = "pip install 'gym[flash-attn]' on a machine with a CUDA GPU"


class SpeedSettings(BaseModel):
    """How fast a stage trains; none of these change what is learned beyond floating-point noise, except
    packing, whose rows hold more sequences than a batch of the same size."""

    model_config = ConfigDict(extra="forbid")

    attn_implementation: Attention = Field(
        "auto",
        description="Attention kernel: auto = flash_attention_2 on a CUDA GPU with flash-attn installed and "
        "bf16 (unless unsloth, which brings its own), else sdpa.",
    )
    padding_free: Switch = Field(
        "auto",
        description="Flatten each batch into one row without padding, positions restarting per sequence "
        "(sft, pt). auto = on with flash-attention's varlen kernel on a GPU, and with gym's per-sequence "
        "SDPA on a CPU; padded with SDPA on a GPU, under longlora's shifted sparse attention, with "
        "NEFTune (its noise scales with the row's length), and at per_device_train_batch_size 1 (a "
        "batch of one sequence has no padding to remove).",
    )
    packing: bool = Field(
        False,
        description="Pack sequences into rows of cutoff_len tokens (sft, best-fit decreasing, padding-free); "
        "the batch size then counts rows, so each step sees more sequences.",
    )
    liger: Switch = Field(
        "auto",
        description="Liger Triton kernels (fused RMSNorm, RoPE, SwiGLU, linear cross-entropy). auto = on "
        "with a CUDA GPU and liger-kernel installed, for sft.",
    )
    unsloth: bool = Field(False, description="Load the model through Unsloth (CUDA GPU and unsloth needed).")
    torch_compile: bool = Field(
        False, description="Compile the model with torch.compile (CUDA; the compile pays off on long runs)."
    )


@dataclass(frozen=True)
class Resolved:
    """The concrete choices for one stage on this machine."""

    attn_implementation: str
    padding_free: bool
    packing: bool
    liger: bool
    unsloth: bool
    torch_compile: bool


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve(config: TrainConfig) -> Resolved:
    """Turn "auto" into choices and reject what this machine or method can't do, before any model loads."""
    from gym.train.precision import bf16_on  # it builds on TrainConfig, which builds on this module

    s, method = config.speed, config.method
    packing = s.packing and method != "pt"  # pt's blocks of cutoff_len are packed already (gym.train.pt)
    cuda = _cuda()
    attn = s.attn_implementation
    if attn == "auto":  # Unsloth brings its own kernels: flash-attn is not asked for beside it
        flash = cuda and bf16_on(config) and _installed("flash_attn") and not s.unsloth
        attn = "flash_attention_2" if flash else "sdpa"
    elif attn in FLASH:
        _require_flash(attn, cuda, bf16_on(config))
    if s.unsloth:
        _require_gpu_package("Unsloth", "unsloth", "gym[unsloth]", cuda)
        if attn in FLASH:
            raise ConfigError("unsloth brings its own attention kernels: leave attn_implementation on auto")
    liger_here = cuda and _installed("liger_kernel") and method in LIGER_METHODS
    liger = s.liger == "on" or (s.liger == "auto" and liger_here)
    if s.liger == "on":
        _require_gpu_package("Liger kernels", "liger_kernel", "gym[liger]", cuda)
        if method not in LIGER_METHODS:
            raise ConfigError(
                f"liger=on is not available for method {method!r}: gym uses Liger for "
                f"{', '.join(LIGER_METHODS)} "
                "(TRL's Liger DPO loss can't use the precomputed reference log-probs gym scores once)"
            )
    if s.unsloth and liger:
        liger = False  # Unsloth patches the same layers with its own kernels
    if packing and s.padding_free == "off":  # packing won, silently
        raise ConfigError(
            "packing joins sequences into full rows, which is padding-free by nature, but padding_free is "
            "off: drop --train.speed.padding_free off to pack, or --train.speed.packing to pad"
        )
    # LongLoRA's shifted sparse attention (gym.train.s2attn) replaces the model's attention and groups
    # each row: a flattened row would be grouped across its sequences, through a dense mask of the row.
    s2 = config.finetuning_type == "longlora" and config.longlora.shift_attention
    if s2 and (s.padding_free == "on" or packing):
        what, fix = ("packing", "packing false") if packing else ("padding_free=on", "padding_free auto")
        raise ConfigError(
            f"{what} can't run with longlora's shifted sparse attention, which groups the tokens of each "
            "padded row (a flattened row would be grouped across its sequences, through a dense mask the "
            f"size of the row): set --train.speed.{fix}, or --train.longlora.shift_attention false"
        )
    # NEFTune's noise is alpha / sqrt(length x width), the length being the row's (transformers' hook):
    # a flattened row is a whole batch long, so auto keeps the padded rows the scale was set for.
    neftune = config.neftune_noise_alpha is not None
    # A batch of one sequence holds no padding: flattening it saves nothing (TRL warns that it
    # "annihilates the benefits"). Unset (None) is a default still to come: not known to be one.
    single = config.per_device_train_batch_size == 1
    # auto: on where a per-sequence kernel was measured faster than padding: flash-attn's varlen kernel
    # on a GPU; gym's per-sequence SDPA (gym.train.varlen) on a CPU (benchmarks/methods.py: 1.05-1.08x on the
    # demo's 20-32-token sequences, 2.28x on MMLU-length ones). On a GPU without flash-attn it stays
    # padded until measured there.
    per_sequence_kernel = attn in FLASH or (attn == "sdpa" and not cuda)
    padding_free = s.padding_free == "on" or (
        s.padding_free == "auto"
        and per_sequence_kernel
        and method in PADDING_FREE_METHODS
        and not (s2 or neftune or single)
    )
    if (padding_free or packing) and method not in PADDING_FREE_METHODS:
        what = "packing" if packing else "padding_free=on"
        raise ConfigError(
            f"{what} is not available for method {method!r}: padding-free batches are implemented for "
            f"{', '.join(PADDING_FREE_METHODS)} only (TRL 1.12); set it off for this stage"
        )
    if s.torch_compile and not cuda:
        raise ConfigError(
            "torch_compile needs a CUDA GPU: on CPU, compiling gym-tiny's training step took ~160 s here "
            "(measured), longer than the runs it would speed up; turn it off on this machine"
        )
    if packing and attn == "eager":
        raise ConfigError(
            "packing needs an attention kernel that keeps packed sequences apart: sdpa or flash"
        )
    return Resolved(
        attn_implementation=attn,
        padding_free=padding_free or packing,
        packing=packing,
        liger=liger,
        unsloth=s.unsloth,
        torch_compile=s.torch_compile,
    )


def choices(config: TrainConfig) -> dict[str, str]:
    """What `auto` turned on for this stage, in words (printed before training, MLflow tags): nothing
    when every speed setting was given or left off."""
    s, r = config.speed, resolve(config)
    said: dict[str, str] = {}
    if s.attn_implementation == "auto" and r.attn_implementation in FLASH:
        said["attn_implementation"] = f"{r.attn_implementation}: flash-attn is installed and trains in bf16"
    if s.padding_free == "auto" and r.padding_free and not r.packing:
        kernel = "flash-attn's varlen kernel" if r.attn_implementation in FLASH else "gym's per-sequence SDPA"
        said["padding_free"] = (
            f"on: batches flattened into one row through {kernel} (--train.speed.padding_free off pads them)"
        )
    if s.liger == "auto" and r.liger:
        said["liger"] = (
            "on: a CUDA GPU with liger-kernel installed (--train.speed.liger off keeps the model's layers)"
        )
    if config.neftune_noise_alpha is not None and r.padding_free:  # asked for (auto stays padded)
        what = "packing" if r.packing else "padding_free"
        said[what] = (
            "on, as asked; NEFTune scales its noise by 1/sqrt(row length) and a flattened row is a whole "
            "batch long, so neftune_noise_alpha adds several times less noise than on padded rows"
        )
    return said


def _require_flash(attn: str, cuda: bool, bf16: bool) -> None:
    package = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}[attn]
    if not cuda:
        raise ConfigError(
            f"attn_implementation={attn} needs a CUDA GPU (none found); use sdpa on this machine, "
            f"or {GPU_EXTRAS}"
        )
    if not _installed(package):
        raise ConfigError(f"attn_implementation={attn} needs {package}: pip install 'gym[flash-attn]'")
    if not bf16:
        raise ConfigError(f"attn_implementation={attn} runs in half precision only: set bf16=True")


def _require_gpu_package(what: str, module: str, extra: str, cuda: bool) -> None:
    if not cuda:
        raise ConfigError(
            f"{what}: needs a CUDA GPU and none was found; turn the option off on this machine, "
            f"or run where a GPU is after pip install '{extra}'"
        )
    if not _installed(module):
        raise ConfigError(f"{what}: not installed here; pip install '{extra}' (or turn the option off)")


def load_options(resolved: Resolved) -> dict[str, Any]:
    """Keyword arguments for `gym.models.load_model`. Padding-free or packed batches through SDPA run
    gym's per-sequence SDPA (gym.train.varlen) instead of transformers' dense block mask."""
    attn = resolved.attn_implementation
    if resolved.padding_free and attn == "sdpa":
        from gym.train import varlen

        attn = varlen.register()
    return {"attn_implementation": attn, "unsloth": resolved.unsloth}


def trainer_args(resolved: Resolved, method: str) -> dict[str, Any]:
    """TrainingArguments fields shared by every TRL config (and a count of real tokens, for tokens/s,
    where the method's batches hold `input_ids`: online RL batches don't, and the Trainer would warn
    at every step)."""
    return {
        "use_liger_kernel": resolved.liger,
        "torch_compile": resolved.torch_compile,
        "include_num_input_tokens_seen": "non_padding" if method in TOKEN_COUNTED_METHODS else "no",
    }


def liger_from_the_start(trainer: Any) -> None:
    """Liger's kernels in the trainer's model now, when its arguments ask for them.

    transformers 5.17 patches them in only when `train()` begins, and gym scores the held-out data
    before that (`eval_before`): that evaluation would run the unpatched forward, building the full
    logits that Liger's fused loss avoids (a memory peak training never has), and TRL would warn at
    every batch that Liger returned no token accuracy. Patching again at `train()` binds the same
    methods: harmless.
    """
    if not getattr(trainer.args, "use_liger_kernel", False):
        return
    from transformers.integrations.liger import apply_liger_kernel

    apply_liger_kernel(trainer.model, trainer.args.liger_kernel_config)


def sft_args(resolved: Resolved, max_length: int | None) -> dict[str, Any]:
    """SFTConfig fields for batching: padded, padding-free, or packed into rows of `max_length`.

    gym's tokenizer already cut every sequence to cutoff_len, so TRL need not truncate again;
    packing needs the row length.
    """
    if resolved.packing:
        if max_length is None:
            raise ConfigError("packing needs the data's cutoff_len as row length")
        return {"packing": True, "packing_strategy": "bfd", "max_length": max_length, "padding_free": True}
    return {"packing": False, "max_length": None, "padding_free": resolved.padding_free}


@contextlib.contextmanager
def gc_frozen() -> Iterator[None]:
    """Keep the garbage collector off what was alive before training (frameworks, the model).

    The Trainer ends with a full collection (accelerate's free_memory) whose cost grows with every
    object in the process; in a flow's process (Prefect, MLflow, transformers: ~850k objects) it
    took ~0.5 s. Frozen objects are skipped, then handed back to the collector afterwards. Left
    alone when the caller froze objects itself.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
