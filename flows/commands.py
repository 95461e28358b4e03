"""Subcommands of `gym` that run Prefect flows (the console itself is flows/cli.py).

    gym train [--method sft|dpo|sft_then_dpo|...] [any flow parameter as --flag] [--json]

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
PIPELINES = {"sft_then_dpo": ("flows.sft_then_dpo", "sft_then_dpo", "SftThenDpoConfig")}
# Demo data per method when --dataset is not given: (training dataset, held-out data in the same format)
_PAIRS = ("demo_dpo", "demo_dpo_eval")
DEMO_DATA = {
    "sft": ("demo_sft", None),
    **dict.fromkeys(("dpo", "ipo", "cdpo", "hinge", "orpo", "simpo"), _PAIRS),
    "kto": ("demo_kto", "demo_kto_eval"),
}


def cmd_train(argv: Sequence[str]) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method", default="sft")
    pre.add_argument("--finetuning_type")
    known, rest = pre.parse_known_args(argv)
    method = known.method
    from gym.train import METHODS

    if known.finetuning_type and known.finetuning_type not in FINETUNING_TYPES:
        if known.finetuning_type not in METHODS:
            print(
                f"error: unknown --finetuning_type {known.finetuning_type!r}; adaptation types: "
                f"{', '.join(FINETUNING_TYPES)} (or a method: {', '.join(METHODS)})",
                file=sys.stderr,
            )
            return 2
        method = known.finetuning_type  # the papers spell the method this way
    if method not in METHODS and method not in PIPELINES:
        available = ", ".join([*METHODS, *PIPELINES])
        print(f"error: method {method!r} is not available; available: {available}", file=sys.stderr)
        return 2
    if known.finetuning_type in FINETUNING_TYPES:
        rest = [*rest, "--finetuning_type", known.finetuning_type]
    from flows.runner import main

    prog = f"gym train --method {method}"
    if method in PIPELINES:
        module, fn, cls = PIPELINES[method]
        pipeline_cls = getattr(importlib.import_module("gym.pipeline"), cls)
        return main(getattr(importlib.import_module(module), fn), pipeline_cls, rest, prog=prog)
    from gym.pipeline import TrainFlowConfig

    extra = ["--train.method", method]
    dataset, method_eval = DEMO_DATA.get(method, (None, None))
    if dataset and not _given(rest, "--dataset"):
        extra += ["--dataset", dataset]
        if method_eval and not _given(rest, "--method_eval_dataset", "--method-eval-dataset"):
            extra += ["--method_eval_dataset", method_eval]
    flow_module = importlib.import_module("flows.train")
    return main(flow_module.train, TrainFlowConfig, [*extra, *rest], prog=prog)


def _given(argv: Sequence[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)
