"""LLaMA-Factory's names for training settings, so its users' commands and YAML files carry over.

    gym train --stage sft --finetuning_type lora --lora_rank 16 --learning_rate 1e-4 --cutoff_len 2048
    gym train llama3_lora_sft.yaml --max-steps 100     # a LLaMA-Factory training YAML

Each name sets the gym setting it stands for in every training stage of the flow (`--learning_rate`
is `--train.learning_rate` for `gym train`, `--sft.learning_rate` and `--dpo.learning_rate` in
sft_then_dpo); gym's own flag for the same setting wins. As in LLaMA-Factory, `lora_alpha` defaults
to twice `lora_rank`, LoRA settings imply a LoRA adapter and `quantization_bit` a quantized one
(QLoRA). Settings gym handles by itself (loss plots, caching, resuming) are accepted with a note.
`--stage` and `--pref_loss`, which choose the method, are read by `gym train` (flows/commands.py); a
flow of one training stage (flows/train.py) takes `gym train`'s `--method` as `--train.method`.
Model, dataset, template, output and epoch names (`model_name_or_path`, `dataset`, `template`,
`output_dir`, `num_train_epochs`, `val_size`, `eval_dataset`, `new_special_tokens`) are gym's own flags
already.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gym.cli_options import SEP, Switch, comma_separated, json_mapping
from gym.errors import ConfigError

DEST = "llamafactory"  # argparse dests are f"{DEST}.{name}"


def _modules(text: str) -> list[str] | None:
    """`q_proj,v_proj` -> its names; `all` -> None (gym's default: every projection of the model)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    return None if names in ([], ["all"]) else names


ALL_MODULES = "all"  # lora_target's value for gym's default modules: given, so it still means a LoRA adapter


def _lora_target(text: str) -> list[str] | str:
    """`q_proj,v_proj` -> its names; `all` -> ALL_MODULES (a LoRA setting given, with gym's default modules:
    every projection of the model, as LLaMA-Factory's `all` is every linear module)."""
    return _modules(text) or ALL_MODULES


def _floats(text: str) -> list[float]:
    """`0.7,0.3` -> [0.7, 0.3] (LLaMA-Factory's comma-separated interleave_probs)."""
    try:
        return [float(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, e.g. 0.7,0.3 (got {text!r})"
        ) from None


def _eval_strategy(text: str) -> str:
    """transformers' eval_strategy: no, steps or epoch (`no`, which YAML reads as false, included)."""
    value = text.strip().lower()
    value = "no" if value in ("false", "none", "null") else value
    if value not in ("no", "steps", "epoch"):
        raise argparse.ArgumentTypeError(f"eval_strategy is no, steps or epoch (got {text!r})")
    return value


# LLaMA-Factory's flash_attn values -> gym's attn_implementation
ATTENTION = {
    "auto": "auto",
    "disabled": "eager",
    "sdpa": "sdpa",
    "fa2": "flash_attention_2",
    "fa3": "flash_attention_3",
}

# name -> (gym's setting in each training stage, parser of the value; bool: a true/false flag)
STAGE: dict[str, tuple[str, Callable[[str], Any] | type[bool]]] = {
    "learning_rate": ("learning_rate", float),
    "per_device_train_batch_size": ("per_device_train_batch_size", int),
    "per_device_eval_batch_size": ("per_device_eval_batch_size", int),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", int),
    "lr_scheduler_type": ("lr_scheduler_type", str),
    "lr_scheduler_kwargs": ("lr_scheduler_kwargs", json_mapping),
    "warmup_ratio": ("warmup_ratio", float),
    "warmup_steps": ("warmup_steps", int),
    "neftune_noise_alpha": ("neftune_noise_alpha", float),
    "weight_decay": ("weight_decay", float),
    "max_grad_norm": ("max_grad_norm", float),
    "adam_beta1": ("adam_beta1", float),
    "adam_beta2": ("adam_beta2", float),
    "adam_epsilon": ("adam_epsilon", float),
    "optim": ("optim", str),
    "seed": ("seed", int),
    "logging_steps": ("logging_steps", int),
    "eval_steps": ("eval_steps", int),
    "eval_strategy": ("eval_strategy", _eval_strategy),  # steps: every eval_steps, else logging_steps
    "save_steps": ("save_steps", int),
    "save_total_limit": ("save_total_limit", int),
    "bf16": ("bf16", bool),
    "gradient_checkpointing": ("gradient_checkpointing", bool),
    "rope_scaling": ("rope_scaling", str),
    "lora_rank": ("lora.r", int),
    "lora_alpha": ("lora.alpha", int),
    "lora_dropout": ("lora.dropout", float),
    "lora_target": ("lora.target_modules", _lora_target),
    "use_rslora": ("lora.use_rslora", bool),
    "use_dora": ("lora.use_dora", bool),
    "loraplus_lr_ratio": ("lora.loraplus_lr_ratio", float),
    "freeze_trainable_layers": ("freeze.layers", int),
    "freeze_trainable_modules": ("freeze.modules", _modules),
    "freeze_extra_modules": ("freeze.extra_modules", lambda text: _modules(text) or []),
    "quantization_bit": ("quant.bits", int),
    "quantization_type": ("quant.quant_type", str),
    "double_quantization": ("quant.double_quant", bool),
    "pure_bf16": ("pure_bf16", bool),
    "pref_beta": ("beta", float),
    "dpo_label_smoothing": ("label_smoothing", float),
    "simpo_gamma": ("simpo_gamma", float),
    "pref_ftx": ("sft_loss_weight", float),
    "kto_chosen_weight": ("desirable_weight", float),
    "kto_rejected_weight": ("undesirable_weight", float),
    "ppo_epochs": ("rl.ppo_epochs", int),
    "ppo_target": ("rl.adaptive_kl_target", float),
    "ppo_whiten_rewards": ("rl.whiten_rewards", bool),
    "reward_model": ("rl.rewards", lambda source: [f"reward_model:{source}"]),
    "temperature": ("rl.temperature", float),  # LLaMA-Factory's generating arguments: PPO's rollouts
    "max_new_tokens": ("rl.max_completion_length", int),
    "shift_attn": ("longlora.shift_attention", bool),
    "additional_target": ("longlora.trainable_modules", lambda text: _modules(text) or []),
    "use_unsloth": ("speed.unsloth", bool),
    "packing": ("speed.packing", bool),
    "neat_packing": ("speed.packing", bool),  # gym's packing never attends across sequences
}
# Names whose one value is a comma-separated list, which a YAML file may write as a list (LLaMA-Factory
# splits a text value and keeps a list)
COMMA_LISTS = {
    "lora_target",
    "freeze_trainable_modules",
    "freeze_extra_modules",
    "additional_target",
    "interleave_probs",
}
# Names whose value gym stores differently (a flag of LLaMA-Factory -> a setting of gym's).
TRANSLATED: dict[str, tuple[str, Callable[[Any], Any], str]] = {
    "pissa_init": ("lora.init", lambda on: "pissa" if on else "default", "PiSSA initialisation"),
    "enable_liger_kernel": ("speed.liger", lambda on: "on" if on else "off", "Liger kernels"),
    "disable_gradient_checkpointing": (
        "gradient_checkpointing",
        lambda on: not on,
        "no activation checkpointing",
    ),
    "flash_attn": ("speed.attn_implementation", ATTENTION.__getitem__, "/".join(ATTENTION)),
}
# name -> gym's setting at the top of the flow config
TOP: dict[str, tuple[str, Callable[[str], Any] | type[bool]]] = {
    "cutoff_len": ("data.cutoff_len", int),
    "max_samples": ("data.max_samples", int),
    "train_on_prompt": ("data.train_on_prompt", bool),
    "mask_history": ("data.mask_history", bool),
    "mix_strategy": ("data.mix_strategy", str),
    "interleave_probs": ("data.interleave_probs", _floats),
    "default_system": ("data.default_system", str),
}
# Settings of LLaMA-Factory's YAML files that gym needs no value for, and why (a note when given).
NOT_NEEDED = {
    "reward_model_type": "gym's reward_model is a folder of full weights with a score head (type full), as "
    "gym train --method rm saves it",
    "resize_vocab": "gym resizes the embeddings itself when new_special_tokens adds tokens",
    "do_eval": "gym evaluates a stage's held-out data whenever it has some (val_size, eval_dataset)",
    "predict_with_generate": "gym generates the answers it scores on held-out data (--eval_metrics)",
    "pissa_convert": "gym always saves a PiSSA adapter converted to a plain LoRA of the original base",
    "pissa_iter": "gym's PiSSA initialisation takes the exact SVD (PEFT's pissa), not fast SVD iterations",
    "run_name": "gym names each stage's MLflow run itself (a child of the flow run's)",
    "disable_tqdm": "gym prints one progress line per stage (library progress bars only with --verbose)",
    "top_p": "gym samples rollouts from the whole distribution at temperature, without a top-p cut",
    "top_k": "gym samples rollouts from the whole distribution at temperature, without a top-k cut",
    "upcast_layernorm": "gym's trainable weights (norms included) are float32, and transformers' norms "
    "compute their statistics in float32 under bf16 autocast",
    "upcast_lmhead_output": "gym's losses run in float32 (bf16 autocast computes cross-entropy in float32)",
    "tool_format": "gym does not train tool calls yet (data with tool turns is refused, naming the record), "
    "so it has no tool format to choose",
    "create_new_adapter": "a LoRA stage always trains a new adapter on the model it starts from",
    "do_train": "gym train always trains",
    "plot_loss": "gym always plots the loss (an artifact in Prefect and MLflow)",
    "overwrite_cache": "gym's caches are keyed by content: changed data or settings are never served stale",
    "overwrite_output_dir": "gym replaces an output_dir it wrote and never one it didn't",
    "resume_from_checkpoint": "gym resumes an interrupted stage from its last checkpoint by itself",
    "report_to": "gym tracks every run in MLflow (--output.tracking_uri)",
    "save_only_model": "gym keeps what resuming needs and saves the final model",
    "preprocessing_num_workers": "gym tokenizes in-process",
    "dataloader_num_workers": "gym's batches come from tokenized data in memory",
    "ddp_timeout": "gym's multi-process stages (torchrun, DDP) keep torch.distributed's own timeout",
    "ddp_find_unused_parameters": "gym sets it off: every trainable parameter takes part in the loss",
    "save_strategy": "gym checkpoints every save_steps, so that an interrupted stage resumes",
    "save_safetensors": "gym saves safetensors only",
    "logging_dir": "gym logs every metric to MLflow (--output.tracking_uri)",
    "include_num_input_tokens_seen": "gym counts the real (non-padding) tokens of every stage",
    "use_fast_tokenizer": "gym loads the fast (Rust) tokenizer",
    "dataloader_pin_memory": "gym's batches come from tokenized data in memory",
    "tokenized_path": "gym keeps tokenized data in its workspace (tokenized/), named by the data, template, "
    "tokenizer and settings: a run with the same ones reuses it",
    "streaming": "gym reads a dataset once into Arrow files on disk, which training memory-maps: the dataset "
    "need not fit in memory",
    "enable_thinking": "gym does not pass it to the chat template, which decides: qwen3 renders Qwen3's "
    "thinking turns, qwen3_nothink (gym's chatml) none",
    "print_param_status": "gym reports every stage's trainable and total parameters (its Prefect "
    "artifact's table, its MLflow run's trainable_params and total_params metrics, its result.json)",
    "ignore_pad_token_for_loss": "gym never trains on padding (its labels are ignored there)",
}
# The settings of optimizers and model conversions gym has not (REFUSED below, when switched on), which
# LLaMA-Factory reads only with their switch: the switch -> (what it is, its settings).
SWITCHED = {
    "use_galore": (
        "GaLore optimizer",
        ("target", "rank", "update_interval", "scale", "proj_type", "layerwise"),
    ),
    "use_apollo": (
        "APOLLO optimizer",
        ("target", "rank", "update_interval", "scale", "proj", "proj_type", "scale_type", "layerwise"),
    ),
    "use_badam": (
        "BAdam optimizer",
        ("mode", "start_block", "switch_mode", "switch_interval", "update_ratio", "mask_mode", "verbose"),
    ),
}
NOT_NEEDED |= {
    f"{switch.removeprefix('use_')}_{setting}": f"read only with {switch} (the {what}), which gym has not: "
    "ignored"
    for switch, (what, settings) in SWITCHED.items()
    for setting in settings
}
# Names whose `false` still gets the note (LLaMA-Factory's default for them is true)
NOTED_WHEN_FALSE = {"enable_thinking"}
LORA_NAMES = {n for n, (path, _) in STAGE.items() if path.startswith("lora.")} | {"pissa_init"}
# Settings gym can't honour yet: name -> what to do instead (an error when given, unless false or null).
REFUSED = {
    "hf_hub_token": "gym reads a hub token from $HF_TOKEN only, never from settings (Prefect and MLflow "
    "store those): remove the setting and `export HF_TOKEN=...`",
    "cache_dir": "set $HF_HOME (the hub's cache folder) instead",
    "model_revision": "gym loads the revision a model's registry entry pins (`revision` in "
    "registry/models.json; `main` for a hub id it has no entry for): add an entry for the model with that "
    "revision, or remove model_revision",
    "fp16": "gym trains in bf16 mixed precision on a GPU with bfloat16 (Ampere or newer: by default, or "
    "`bf16: true`), else in fp32; it has no fp16 loss scaling",
    "deepspeed": "gym does not run DeepSpeed ZeRO yet: it trains on several GPUs with DDP "
    "(--train.distributed.num_processes, default: every visible GPU). Drop the setting, or make the model "
    "fit each GPU with --finetuning_type lora or qlora",
}
# The values of a REFUSED setting that ask for what gym does anyway (as `fp16: false` or null do for any)
ASKS_NOTHING = {"model_revision": ("main",)}
REFUSED |= {  # transformers' TrainingArguments names for FSDP, as LLaMA-Factory's files may carry them
    name: REFUSED["deepspeed"].replace("DeepSpeed ZeRO", "FSDP (sharded weights)")
    for name in ("fsdp", "fsdp_config")
}
REFUSED |= {
    "do_predict": "gym train trains: score generated answers on held-out data with --eval_dataset FILE and "
    "--eval_metrics exact_match bleu rouge (before and after training), or chat with gym chat",
    "ref_model": "gym's reference for dpo/ipo/cdpo/hinge/kto is the stage's starting model (precomputed or "
    "live, --train.reference): train from the model you want as reference, or use simpo or orpo (no "
    "reference)",
    "ppo_score_norm": "gym's PPO has no running normalisation of scores: whiten the rewards instead "
    "(ppo_whiten_rewards), or scale them with --train.rl.reward_weights",
    "quantization_method": "gym quantizes with bitsandbytes only: leave quantization_method out (or set bnb)",
    "disable_shuffling": "gym's trainer shuffles the training data every epoch, seeded (--seed): leave "
    "disable_shuffling out",
    "compute_accuracy": "gym's held-out metric for SFT is the loss: score generated answers with "
    "--eval_dataset FILE --eval_metrics exact_match (before and after training)",
    **{
        name: f"gym has no {what}: train fewer weights with --finetuning_type lora, freeze or qlora instead"
        for name, what in {
            **{switch: what for switch, (what, _) in SWITCHED.items()},
            "use_adam_mini": "Adam-mini optimizer",
            "use_muon": "Muon optimizer",
            "use_llama_pro": "LLaMA Pro block expansion",
            "mixture_of_depths": "mixture-of-depths conversion",
        }.items()
    },
    "adapter_name_or_path": "gym train starts from full weights: merge the adapter into its base first "
    "(gym export --model ADAPTER --out DIR) and give DIR as model_name_or_path; a new adapter then trains on "
    "top (LLaMA-Factory's create_new_adapter)",
    "train_from_scratch": "gym fine-tunes pretrained weights: build the model's weights first (as gym-tiny "
    "is built) and give its folder as --model",
}
# LLaMA-Factory's settings for vision, video and audio models: gym trains text-only language models.
MULTIMODAL = (
    *("image_max_pixels", "image_min_pixels", "image_do_pan_and_scan", "crop_to_patches"),
    *("video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen"),
    *("use_audio_in_video", "audio_sampling_rate", "media_dir"),
    *("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model"),
)
REFUSED |= {
    name: "gym trains text-only language models (no image, video or audio inputs), so it has no use for "
    "this multimodal setting: remove it, and train vision-language models with LLaMA-Factory"
    for name in MULTIMODAL
}


def add_options(parser: argparse.ArgumentParser, stages: Sequence[str]) -> None:
    """Add LLaMA-Factory's names to the parser of a flow whose config has training `stages`."""
    group = parser.add_argument_group("LLaMA-Factory flag names (gym's own flag for a setting wins)")

    def same_as(path: str) -> str:
        return "= " + " and ".join(f"--{stage}.{path}" for stage in stages)

    for name, (path, parse) in {**STAGE, **TOP}.items():
        target = f"= --{path}" if name in TOP else same_as(path)
        flag, dest, metavar = f"--{name}", f"{DEST}.{name}", name.upper()
        if parse is bool:
            group.add_argument(flag, dest=dest, action=Switch, help=target)
        else:
            action = group.add_argument(flag, dest=dest, type=parse, metavar=metavar, help=target)
            if name in COMMA_LISTS:
                comma_separated(action)
    for name, (path, _, what) in TRANSLATED.items():
        kwargs: dict[str, Any] = {"action": Switch} if name != "flash_attn" else {"choices": list(ATTENTION)}
        group.add_argument(f"--{name}", dest=f"{DEST}.{name}", help=f"{what}: {same_as(path)}", **kwargs)
    for name, why in NOT_NEEDED.items():
        kwargs = {"nargs": "?", "const": True, "metavar": "VALUE"}
        group.add_argument(f"--{name}", dest=f"{DEST}.{name}", help=f"accepted: {why}", **kwargs)
    for name, why in REFUSED.items():  # a bare flag (a YAML `true`) is refused too
        kwargs = {"nargs": "?", "const": True, "metavar": "VALUE"}
        group.add_argument(f"--{name}", dest=f"{DEST}.{name}", help=f"refused: {why}", **kwargs)
    if list(stages) == ["train"]:  # a flow of one method (flows/train.py) takes gym train's --method too
        group.add_argument(
            "--method", dest=f"{DEST}.method", metavar="METHOD", help="= --train.method (as gym train's)"
        )
    group.add_argument(
        "--dataset_dir",
        dest=f"{DEST}.dataset_dir",
        metavar="DIR",
        help="where dataset_info.json and relative dataset files are (= $GYM_DATA_DIR; default: ./data's "
        "dataset_info.json, else the current directory)",
    )


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The LLaMA-Factory names set on a command line (or in a config file), with their values."""
    prefix = f"{DEST}{SEP}"
    return {
        k.removeprefix(prefix): v for k, v in vars(args).items() if k.startswith(prefix) and v is not None
    }


def check_overwrite(overwrite_output_dir: Any, output_dir: str | None) -> None:
    """LLaMA-Factory's `overwrite_output_dir: false` refuses an `output_dir` that holds files, as
    transformers refuses it; the two settings as the run will use them, from whichever source (config
    file or command line) gave each."""
    if str(overwrite_output_dir).lower() != "false" or not output_dir:
        return
    folder = Path(output_dir).expanduser()
    if folder.is_dir() and any(folder.iterdir()):
        raise ConfigError(
            f"overwrite_output_dir: false, and output_dir {output_dir} holds files: pick another "
            "output_dir, or set overwrite_output_dir true (gym replaces only a folder it wrote)"
        )


def overrides(
    args: argparse.Namespace, stages: Sequence[str], finetuning_type: str | None, alpha_given: bool
) -> dict[str, Any]:
    """The gym settings the LLaMA-Factory names on `args` stand for, as a nested dict for the flow config.

    `finetuning_type` is the one the user gave (command line or config file), if any: LoRA settings
    without one mean a LoRA adapter, and quantization_bit a quantized one (QLoRA), as in
    LLaMA-Factory. Unless the user gave the LoRA alpha (`alpha_given`), lora_rank sets it to twice the rank.
    """
    values = given(args)
    if str(values.get("quantization_method", "bnb")).lower() in ("bnb", "bitsandbytes"):
        values.pop("quantization_method", None)  # what gym does
    for name in REFUSED.keys() & values.keys():
        if str(values[name]).lower() not in ("false", "none", "null", *ASKS_NOTHING.get(name, ())):
            raise ConfigError(f"{name}: {REFUSED[name]}")
    if str(values.get("do_train", True)).lower() == "false":  # an evaluation-only config: it trained
        raise ConfigError(
            "do_train: false: gym train always trains; to score a model without training it, use gym eval "
            "(benchmarks) or python flows/evaluate.py (benchmarks and held-out data)"
        )
    for name, kind in {"use_dora": "dora", "use_rslora": "rslora", "pissa_init": "pissa"}.items():
        if finetuning_type == kind and str(values.get(name)).lower() == "false":  # was silently overridden
            raise ConfigError(
                f"{name}: false, but finetuning_type {kind} is LoRA with {name} on: drop {name}, or use "
                "finetuning_type lora"
            )
    if str(values.get("reward_model_type", "full")) != "full":
        raise ConfigError(
            f"reward_model_type {values['reward_model_type']}: gym scores with a reward model of full "
            "weights and a score head (reward_model_type full); merge a LoRA reward model first (gym export "
            "--model ADAPTER --out DIR), or score with a reward function (--train.rl.rewards)"
        )
    stage: dict[str, Any] = {}
    top: dict[str, Any] = {}
    for name, value in values.items():
        if name in STAGE:
            _put(stage, STAGE[name][0], None if name == "lora_target" and value == ALL_MODULES else value)
        elif name in TRANSLATED:
            path, translate, _ = TRANSLATED[name]
            _put(stage, path, translate(value))
        elif name in TOP:
            _put(top, TOP[name][0], value)
        elif name == "method":  # only a flow of one training stage has it
            stage["method"] = value
    if "lora_rank" in values and not alpha_given and values["lora_rank"] >= 1:  # a bad rank: its own error
        _put(stage, "lora.alpha", 2 * values["lora_rank"])  # LLaMA-Factory's default: lora_rank * 2
    if "quantization_bit" in values:
        if finetuning_type not in (None, "lora", "qlora"):
            why = " trains the weights themselves" if finetuning_type in ("full", "freeze") else " is not it"
            raise ConfigError(
                "quantization_bit quantizes the frozen base under a LoRA adapter (finetuning_type qlora); "
                f"finetuning_type {finetuning_type!r}{why}: use --finetuning_type lora (or qlora)"
            )
        stage["finetuning_type"] = "qlora"
    elif longlora := _longlora(values, finetuning_type):
        stage["finetuning_type"] = "longlora"
        stage["longlora"] = longlora
    elif finetuning_type is None and LORA_NAMES & values.keys():
        stage["finetuning_type"] = "lora"
    return {**top, **{name: copy.deepcopy(stage) for name in stages}} if stage else top


def _longlora(values: dict[str, Any], finetuning_type: str | None) -> dict[str, Any] | None:
    """LLaMA-Factory's LongLoRA pieces on a LoRA adapter as gym's `longlora` settings, or None if not given.

    `shift_attn` is shifted sparse attention while training; `additional_target` names the modules that
    train in full beside the adapter (PEFT's modules_to_save). gym's longlora is a LoRA adapter with both,
    each one off unless given here (its own defaults, S2-Attn on and embeddings and norms trained, apply
    to `--finetuning_type longlora` only).
    """
    shift = bool(values.get("shift_attn"))
    extra = values.get("additional_target") or []
    if not shift and not extra:
        return None
    if finetuning_type not in (None, "lora", "longlora"):
        asked = [n for n, on in (("shift_attn", shift), ("additional_target", extra)) if on]
        raise ConfigError(
            f"{' and '.join(asked)} {'go' if len(asked) > 1 else 'goes'} with a LoRA adapter (gym: "
            f"finetuning_type longlora); finetuning_type "
            f"{finetuning_type!r} is not one: use --finetuning_type lora"
        )
    return {"shift_attention": shift, "trainable_modules": extra}


def notes(args: argparse.Namespace) -> list[str]:
    """One line per LLaMA-Factory setting given that gym needs no value for, saying why (LoRA settings a
    full or freeze stage doesn't read get gym's own note, gym.train.adapters.unused_settings)."""
    unset = (None, "none", "null", "false")  # `resume_from_checkpoint: null` in a YAML asks for nothing
    return [
        f"{name}: {NOT_NEEDED[name]}"
        for name, value in given(args).items()
        if name in NOT_NEEDED and (str(value).lower() not in unset or name in NOTED_WHEN_FALSE)
    ]


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(SEP)
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[leaf] = value


@contextlib.contextmanager
def data_dir(namespaces: Sequence[argparse.Namespace]) -> Iterator[None]:
    """`dataset_dir` given (on the command line, else in the config file): the data dir
    ($GYM_DATA_DIR, where dataset_info.json and relative dataset files are looked up) while the flow
    runs, relative to the current directory as in LLaMA-Factory."""
    given_dirs = [d for ns in namespaces if (d := given(ns).get("dataset_dir")) is not None]
    with using_data_dir(given_dirs[-1] if given_dirs else None):
        yield


@contextlib.contextmanager
def using_data_dir(value: str | None, label: str = "dataset_dir") -> Iterator[None]:
    """The folder `value` (relative to the current directory; None: nothing changes) as the data dir
    ($GYM_DATA_DIR) inside the block; a ConfigError naming setting `label` if there is no such folder."""
    if value is None:
        yield
        return
    folder = Path(value).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"{label} {value!r}: no such folder ({folder})")
    before = os.environ.get("GYM_DATA_DIR")
    os.environ["GYM_DATA_DIR"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GYM_DATA_DIR", None)
        else:
            os.environ["GYM_DATA_DIR"] = before
