"""Subcommands of `gym` that run Prefect flows (the console itself is flows/cli.py).

    gym train [--method sft|dpo|sft_then_dpo|tf_grpo|...] [any flow parameter as --flag] [--json]
    gym train --finetuning_type grpo --training_free_grpo --group_size 5 --num_train_epochs 3 --output_dir D

`gym train` picks the flow for the method (flows/train.py for one method, a pipeline flow such
as flows/sft_then_dpo.py for several stages) and runs it through flows/runner.py.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

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
    "sft": ("demo_sft", None),
    **dict.fromkeys(("dpo", "ipo", "cdpo", "hinge", "orpo", "simpo"), _PAIRS),
    "kto": ("demo_kto", "demo_kto_eval"),
}
DEMO_DATA |= {m: ("demo_prompts", "demo_prompts_eval") for m in ("ppo", "grpo", "gspo")}
# SFT before the method on its demo data (gym.train.warm_start), where the method can't learn the demo's
# signal from gym-tiny's random weights. KTO's desirable and undesirable answers are unpaired: they can
# only be told apart by a model that already relates answers to questions; from random weights its
# held-out logp_gap drifted either way (16 learning rate x epoch settings). The online RL methods
# add theirs in flows/online_rl.py (demo_format_sft).
DEMO_WARM_START = {"kto": "demo_sft"}


def method_of(argv: Sequence[str]) -> tuple[str, str | None, list[str]]:
    """(method, finetuning_type, the other arguments) from `gym train`'s command line."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method", default="sft")
    pre.add_argument("--finetuning_type")
    pre.add_argument(
        "--training_free_grpo", "--grpo_training_free", dest="training_free", action="store_true"
    )
    known, rest = pre.parse_known_args(argv)
    method = known.method
    if known.finetuning_type and known.finetuning_type not in FINETUNING_TYPES:
        method = known.finetuning_type  # the papers spell the method this way
    if known.training_free and method in ("sft", "grpo"):  # `--finetuning_type grpo --training_free_grpo`
        method = "tf_grpo"
    if method == "tf_grpo":
        rest = [_renamed(a, TF_GRPO_FLAGS) for a in rest]
    return method, known.finetuning_type, rest


def cmd_train(argv: Sequence[str]) -> int:
    method, finetuning_type, rest = method_of(argv)
    from gym.train import METHODS

    names = ", ".join(dict.fromkeys([*METHODS, *PIPELINES]))  # tf_grpo is in both
    if finetuning_type and finetuning_type not in (*FINETUNING_TYPES, *METHODS, *PIPELINES):
        print(
            f"error: unknown --finetuning_type {finetuning_type!r}; adaptation types: "
            f"{', '.join(FINETUNING_TYPES)} (or a method: {names})",
            file=sys.stderr,
        )
        return 2
    if method not in METHODS and method not in PIPELINES:
        print(f"error: method {method!r} is not available; available: {names}", file=sys.stderr)
        return 2
    if finetuning_type in FINETUNING_TYPES:
        rest = [*rest, "--finetuning_type", finetuning_type]
    from flows.runner import main

    prog = f"gym train --method {method}"
    if method in PIPELINES:
        module, fn, cls = PIPELINES[method]
        pipeline_cls = getattr(importlib.import_module("gym.pipeline"), cls)
        return main(f"{module}:{fn}", pipeline_cls, rest, prog=prog)
    from gym.pipeline import TrainFlowConfig

    if method in ("ppo", "grpo", "gspo"):  # --reward, --reward-weight, --group-size; the demo's warm start
        from flows.online_rl import rl_args

        rest = rl_args(rest, demo=not _given(rest, "--dataset"))
    # The flow by name: it is imported once the run's inputs are checked and Prefect's API is starting.
    return main("flows.train:train", TrainFlowConfig, [*demo_args(method, rest), *rest], prog=prog)


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
    return extra


def _renamed(arg: str, names: dict[str, str]) -> str:
    flag, eq, value = arg.partition("=")
    return f"{names[flag]}{eq}{value}" if flag in names else arg


def _given(argv: Sequence[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)
