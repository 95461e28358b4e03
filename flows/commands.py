"""Subcommands of `gym` that run Prefect flows (the console itself is flows/cli.py).

    gym train [--method sft|dpo|sft_then_dpo|tf_grpo|...] [any flow parameter as --flag] [--json]
    gym train --finetuning_type grpo --training_free_grpo --group_size 5 --num_train_epochs 3 --output_dir D
    gym train run.yaml [flags]      # a YAML file's settings (LLaMA-Factory's names too), then the flags

`gym train` picks the flow for the method (flows/train.py for one method, a pipeline flow such
as flows/sft_then_dpo.py for several stages) and runs it through flows/runner.py.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel

from gym.cli_options import Switch, dotlist, read_config_file, split_config_file
from gym.errors import ConfigError, GymError
from gym.train.config import FINETUNING_TYPES

# Pipelines of several stages: method name -> (flow module, flow function, config class in gym.pipeline)
PIPELINES = {
    "sft_then_dpo": ("flows.sft_then_dpo", "sft_then_dpo", "SftThenDpoConfig"),
    "tf_grpo": ("flows.tf_grpo", "tf_grpo", "TfGrpoFlowConfig"),
}
# The Gym papers' spellings of Training-Free GRPO's flags -> gym's.
TF_GRPO_FLAGS = {"--grpo_group_size": "--group_size", "--grpo_experience_lib_path": "--experience_lib_path"}
# Demo data per method when --dataset is not given: (training dataset, held-out data in the same format)
_PAIRS = ("demo_dpo", "demo_dpo_eval")
DEMO_DATA = {
    "sft": ("demo_sft", "demo_sft_eval"),  # its held-out eval_loss is the summary's signal
    "pt": ("demo_text", "demo_text_eval"),
    **dict.fromkeys(("dpo", "ipo", "cdpo", "hinge", "orpo", "simpo", "rm"), _PAIRS),
    "kto": ("demo_kto", "demo_kto_eval"),
}
DEMO_DATA |= {m: ("demo_prompts", "demo_prompts_eval") for m in ("ppo", "grpo", "gspo")}
# SFT before the method on its demo data (gym.train.warm_start), where the method can't learn the demo's
# signal from gym-tiny's random weights. KTO's desirable and undesirable answers are unpaired: they can
# only be told apart by a model that already relates answers to questions; from random weights its
# held-out logp_gap drifted either way (16 learning rate x epoch settings). The online RL methods
# add theirs in flows/online_rl.py (demo_format_sft).
DEMO_WARM_START = {"kto": "demo_sft"}
# Block length of pt's demo run (blocks of the default cutoff_len, 1,024, are twice gym-tiny's 512-token
# context, and trained 2-3x slower per token here), unless cutoff_len is set.
DEMO_CUTOFF = {"pt": 256}


# LLaMA-Factory's `stage` -> gym's method; its `pref_loss` picks the method of the dpo stage.
STAGES = {"pt": "pt", "sft": "sft", "rm": "rm", "dpo": "dpo", "kto": "kto", "ppo": "ppo"}
PREF_LOSSES = {"sigmoid": "dpo", "ipo": "ipo", "hinge": "hinge", "orpo": "orpo", "simpo": "simpo"}
DPO_STAGE = (*PREF_LOSSES.values(), "cdpo")  # the methods of LLaMA-Factory's dpo stage
# Settings of a config file that choose the method: `gym train` reads them, the flow does not.
METHOD_KEYS = ("method", "stage", "pref_loss", "finetuning_type", "training_free_grpo", "grpo_training_free")


def method_of(argv: Sequence[str]) -> tuple[str, str | None, list[str]]:
    """(method, finetuning_type, the other arguments) from `gym train`'s command line."""
    known, rest = _method_parser().parse_known_args(argv)
    method = _picked(known)
    if method == "tf_grpo":
        rest = [_renamed(a, TF_GRPO_FLAGS) for a in rest]
    return method, known.finetuning_type, rest


def methods_of(
    in_file: Sequence[str], argv: Sequence[str], path: Path | None
) -> tuple[str, str | None, list[str]]:
    """(method, adaptation type, the other arguments) from a config file's method-choosing settings (as
    flags, `in_file`) and the command line `argv`, whose choice wins.

    Each is refused on its own where it contradicts itself. When the command line picks the method
    (--method, --stage, --pref_loss or a method as --finetuning_type, `name=value` too), the file's
    choice of it gives way, except what only refines a command line's `--stage dpo` within that stage
    (`pref_loss: simpo`, `method: cdpo`); a file's pref_loss or training_free_grpo that doesn't apply to the
    method the command line picks is ignored, with a note (as LLaMA-Factory ignores pref_loss outside dpo).
    """
    parser = _method_parser()
    file_keys, _ = parser.parse_known_args(in_file)
    cli_keys, rest = parser.parse_known_args(argv)
    try:
        _picked(file_keys)  # a file that contradicts itself is refused, as a command line is
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None  # the file's, not a flag's
    method = _picked(cli_keys)
    types = [ns.finetuning_type for ns in (cli_keys, file_keys) if ns.finetuning_type in FINETUNING_TYPES]
    adaptation = types[0] if types else None
    picks = ("method", "stage", "pref_loss")
    if not any(getattr(cli_keys, k) is not None for k in picks) and _method_form(cli_keys) is None:
        merged = argparse.Namespace(**vars(file_keys))  # the file picks the method
        merged.finetuning_type = _method_form(file_keys)
        given = cli_keys.training_free is not None  # `--training_free_grpo false` overrides the file's true
        merged.training_free = cli_keys.training_free if given else file_keys.training_free
        method = _picked(merged)
    else:
        merged = argparse.Namespace(**vars(cli_keys))
        merged.finetuning_type = _method_form(cli_keys)
        # Only a `--stage dpo` leaves the method open (its pref_loss, or a method of the stage, picks it).
        open_stage = cli_keys.method is None and cli_keys.pref_loss is None and merged.finetuning_type is None
        refines = cli_keys.stage == "dpo" and open_stage
        from_file = {
            "method": file_keys.method,
            "finetuning_type": _method_form(file_keys),
            "pref_loss": file_keys.pref_loss,
            "training_free": file_keys.training_free or None,
        }
        for key, value in from_file.items():
            if value is None or getattr(merged, key) is not None:  # not in the file, or the command line's
                continue
            trial = argparse.Namespace(**{**vars(merged), key: value})
            try:
                got = _picked(trial)
            except ConfigError:
                got = None
            applies = got == method or (key == "training_free" and (method, got) == ("grpo", "tf_grpo"))
            if got is not None and (refines or applies):
                merged, method = trial, got
            elif key in ("pref_loss", "training_free"):  # not the method's: ignored, as LLaMA-Factory does
                shown = f"pref_loss {value}" if key == "pref_loss" else "training_free_grpo"
                where = f" (in {path})" if path else ""
                print(
                    f"note: {shown}{where} does not apply to method {method}, which the command line "
                    "picks: ignored",
                    file=sys.stderr,
                )
    if method == "tf_grpo":
        rest = [_renamed(a, TF_GRPO_FLAGS) for a in rest]
    return method, adaptation, rest


def _method_parser() -> argparse.ArgumentParser:
    """The flags that choose the method, spelled in full (`--meth` is not `--method`)."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--method")
    pre.add_argument("--stage")
    pre.add_argument("--pref_loss")
    pre.add_argument("--finetuning_type")
    # `--x`, `--x true|false`, `--no-x`, as every boolean flag (None: not given, so a file's choice holds)
    pre.add_argument("--training_free_grpo", "--grpo_training_free", dest="training_free", action=Switch)
    return pre


def _method_form(known: argparse.Namespace) -> str | None:
    """The method --finetuning_type names in the papers' form (`--finetuning_type dpo`), if it names one."""
    value = known.finetuning_type
    return value if value and value not in FINETUNING_TYPES else None


def _picked(known: argparse.Namespace) -> str:
    """The method the method-choosing flags `known` pick (a ConfigError where they disagree)."""
    method = _llamafactory_method(known.method, known.stage, known.pref_loss)
    if known.finetuning_type and known.finetuning_type not in FINETUNING_TYPES:
        _check_type_or_method(known.finetuning_type)  # a misspelled type is no method that disagrees
        named = known.method is not None or known.stage is not None or known.pref_loss is not None
        if named and method != known.finetuning_type:  # one of them would be dropped, silently
            raise ConfigError(
                f"--finetuning_type {known.finetuning_type} (a method, in the papers' form) and method "
                f"{method} (--method, --stage or --pref_loss) disagree: give one of them"
            )
        method = known.finetuning_type  # the papers spell the method this way
    if known.training_free and method in ("sft", "grpo"):  # `--finetuning_type grpo --training_free_grpo`
        method = "tf_grpo"
    elif known.training_free and method != "tf_grpo":  # it was dropped, and the method trained as asked
        raise ConfigError(
            f"--training_free_grpo makes GRPO training-free (method tf_grpo); method {method!r} has no "
            "training-free form: drop it, or use method grpo with it"
        )
    return method


def _method_names() -> str:
    from gym.train import METHODS

    return ", ".join(dict.fromkeys([*METHODS, *PIPELINES]))  # tf_grpo is in both


def _check_type_or_method(finetuning_type: str) -> None:
    """A ConfigError listing the adaptation types and methods, unless --finetuning_type names one."""
    from gym.train import METHODS

    if finetuning_type not in (*FINETUNING_TYPES, *METHODS, *PIPELINES):
        raise ConfigError(
            f"unknown --finetuning_type {finetuning_type!r}; adaptation types: "
            f"{', '.join(FINETUNING_TYPES)} (or a method: {_method_names()})"
        )


def _llamafactory_method(method: str | None, stage: str | None, pref_loss: str | None) -> str:
    """The method from --method, or from LLaMA-Factory's --stage and --pref_loss."""
    if stage is not None:
        if stage not in STAGES:
            raise ConfigError(
                f"--stage {stage!r} has no gym method; stages: {', '.join(STAGES)}, or pick a --method"
            )
        family = DPO_STAGE if stage == "dpo" else (STAGES[stage],)
        if method is not None and method not in family:
            raise ConfigError(f"--stage {stage} and --method {method} disagree: give one of them")
        method = method or STAGES[stage]
    if pref_loss is not None:
        if pref_loss not in PREF_LOSSES:
            raise ConfigError(
                f"--pref_loss {pref_loss!r} is not available: {', '.join(PREF_LOSSES)} "
                "(for LLaMA-Factory's kto_pair, train unpaired data with --method kto)"
            )
        picked = PREF_LOSSES[pref_loss]
        if method in (None, "dpo"):
            method = picked
        elif method != picked and not (method == "cdpo" and pref_loss == "sigmoid"):  # cDPO: smoothed sigmoid
            raise ConfigError(f"--pref_loss {pref_loss} picks method {picked}, not {method}")
    return method or "sft"


def _method_flags(settings: dict[str, Any]) -> list[str]:
    """A config file's method-choosing settings (taken out of `settings`) as `gym train` flags."""
    flags = []
    for key in METHOD_KEYS:
        value = settings.pop(key, None)
        if value is True:
            flags.append(f"--{key}")
        elif value not in (None, False):
            flags.append(f"--{key}={value}")
    return flags


class TrainPlan(NamedTuple):
    """What `gym train ARGV` runs: flows.runner.main's arguments."""

    flow: str  # "module:function", imported once the inputs are checked and Prefect's API is starting
    config_cls: type[BaseModel]
    argv: list[str]
    prog: str
    config_file: tuple[Path, dict[str, Any]] | None


def cmd_train(argv: Sequence[str]) -> int:
    try:
        plan = train_plan(argv)
    except GymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from flows.runner import main

    return main(plan.flow, plan.config_cls, plan.argv, prog=plan.prog, config_file=plan.config_file)


def train_plan(argv: Sequence[str]) -> TrainPlan:
    """The flow, config class and flags for `gym train ARGV` (a GymError for a method or type gym lacks)."""
    path, argv = split_config_file(argv)
    settings = read_config_file(path) if path else {}
    llamafactory = "stage" in settings  # a LLaMA-Factory training YAML (its keys are read below)
    argv = dotlist(argv, [f"--{key}" for key in METHOD_KEYS])  # `stage=dpo`, as after LLaMA-Factory's YAML
    method, finetuning_type, rest = methods_of(_method_flags(settings), argv, path)
    if method == "tf_grpo":  # the papers' names in the file too
        settings = {_renamed(f"--{key}", TF_GRPO_FLAGS)[2:]: value for key, value in settings.items()}
    elif method not in PIPELINES and llamafactory:
        settings = llamafactory_eval_dataset(settings)
    config_file = (path, settings) if path else None
    named = [*rest, *(f"--{key}" for key in settings)]  # set on the command line or in the file
    from gym.train import METHODS

    if method not in METHODS and method not in PIPELINES:
        raise ConfigError(f"method {method!r} is not available; available: {_method_names()}")
    if finetuning_type in FINETUNING_TYPES:
        rest = [*rest, "--finetuning_type", finetuning_type]
    prog = f"gym train --method {method}"
    if method in PIPELINES:
        module, fn, cls = PIPELINES[method]
        pipeline_cls = getattr(importlib.import_module("gym.pipeline"), cls)
        return TrainPlan(f"{module}:{fn}", pipeline_cls, rest, prog, config_file)
    from gym.pipeline import TrainFlowConfig

    if method in ("ppo", "grpo", "gspo"):  # --reward, --reward-weight, --group-size; the demo's warm start
        from flows.online_rl import rl_args

        rest = rl_args(rest, demo=not _given(named, "--dataset"))
    return TrainPlan(
        "flows.train:train", TrainFlowConfig, [*demo_args(method, named), *rest], prog, config_file
    )


def llamafactory_eval_dataset(settings: dict[str, Any]) -> dict[str, Any]:
    """A LLaMA-Factory training YAML's `eval_dataset` is its held-out data for the eval loss during
    training: gym's --method_eval_dataset (gym's own --eval_dataset scores generated answers by exact
    match before and after)."""
    if "eval_dataset" not in settings or "method_eval_dataset" in settings:
        return settings
    print(
        "note: eval_dataset is read as LLaMA-Factory reads it, held-out data for the loss (and the "
        "method's metric) during training: gym's method_eval_dataset; gym's eval_dataset, exact match of "
        "generated answers before and after, can be named as well",
        file=sys.stderr,
    )
    return {("method_eval_dataset" if k == "eval_dataset" else k): v for k, v in settings.items()}


def demo_args(method: str, rest: Sequence[str]) -> list[str]:
    """The train flow's flags for `method`, with its demo data (and warm start) when no --dataset is given.

    They go before the user's own flags, so a flag the user gives wins. Naming the demo data
    (`--dataset demo_kto --method_eval_dataset demo_kto_eval`) runs the method without the warm start.
    """
    extra = ["--train.method", method]
    dataset, method_eval = DEMO_DATA.get(method, (None, None))
    if dataset and not _given(rest, "--dataset"):
        extra += ["--dataset", dataset]
        if method_eval and not _given(rest, "--method_eval_dataset", "--method-eval-dataset", "--val_size"):
            extra += ["--method_eval_dataset", method_eval]
        if method in DEMO_WARM_START:
            extra += ["--warm_start.dataset", DEMO_WARM_START[method]]
        cutoff = ("--data.cutoff_len", "--data.cutoff-len", "--cutoff_len", "--cutoff-len", "--data")
        if method in DEMO_CUTOFF and not _given(rest, *cutoff):
            extra += ["--data.cutoff_len", str(DEMO_CUTOFF[method])]
    return extra


def _renamed(arg: str, names: dict[str, str]) -> str:
    flag, eq, value = arg.partition("=")
    return f"{names[flag]}{eq}{value}" if flag in names else arg


def _given(argv: Sequence[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)
