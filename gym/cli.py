"""The `gym` command line.

    gym train [--method sft|dpo|sft_then_dpo] [any flow parameter as --flag] [--json]
    gym registry list [--json] | gym registry show NAME
    gym data preview DATASET [-n 3] [--model gym-tiny]

`gym train` runs the Prefect flow for the method (flows/train.py, or flows/sft_then_dpo.py);
it is the one place in gym/ that reaches up to flows/, and it does so lazily, so library
users never import Prefect.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from gym.errors import GymError

# Pipelines of several stages: method name -> (flow module, flow function, config class in gym.pipeline)
PIPELINES = {"sft_then_dpo": ("flows.sft_then_dpo", "sft_then_dpo", "SftThenDpoConfig")}
# Demo data per method when --dataset is not given: (training dataset, held-out data in the same format)
DEMO_DATA = {"sft": ("demo_sft", None), "dpo": ("demo_dpo", "demo_dpo_eval")}
FINETUNING_TYPES = ("full", "lora")


def _offline_defaults() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cmd_train(argv: Sequence[str]) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--method", default="sft")
    pre.add_argument("--finetuning_type")
    known, rest = pre.parse_known_args(argv)
    method = known.method
    if known.finetuning_type and known.finetuning_type not in FINETUNING_TYPES:
        method = known.finetuning_type  # the papers spell the method this way
    from gym.train import METHODS

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


def cmd_registry(args: argparse.Namespace) -> int:
    from gym import registry

    models = registry.load_models()
    if args.action == "list":
        if args.json:
            print(
                json.dumps([m.model_dump(mode="json") for m in models.values()], indent=2, ensure_ascii=False)
            )
            return 0
        print(f"{'name':36s} {'family':10s} {'template':10s} {'params':>9s}  hub id")
        for m in models.values():
            hub = m.hub_id or "(built in)"
            print(f"{m.name:36s} {m.family:10s} {m.template:10s} {m.parameters / 1e9:8.2f}B  {hub}")
        return 0
    if not args.name:
        print("error: usage: gym registry show NAME", file=sys.stderr)
        return 2
    spec = registry.get_model(args.name)
    out: dict[str, Any] = {**spec.model_dump(mode="json"), "memory_gib": registry.memory_estimates(spec)}
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from gym.data.preview import preview

    print(preview(args.dataset, n=args.n, model=args.model, template=args.template, as_json=args.json))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gym", description="Fine-tune LLMs as a Prefect pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="Run a training flow (`gym train --method M --help` lists its flags).")
    reg = sub.add_parser("registry", help="List or show models in the registry.")
    reg.add_argument("action", choices=["list", "show"])
    reg.add_argument("name", nargs="?")
    reg.add_argument("--json", action="store_true", help="Print JSON.")
    data = sub.add_parser("data", help="Look at a dataset the way gym reads it.")
    data.add_argument("action", choices=["preview"])
    data.add_argument("dataset", help="Dataset registry name, file, folder or hub id.")
    data.add_argument("-n", type=int, default=3, help="Records to show.")
    data.add_argument(
        "--model", default=None, help="Also show templated text and trained-on tokens for this model."
    )
    data.add_argument("--template", default=None, help="Chat template (default: the model's).")
    data.add_argument("--json", action="store_true", help="Print JSON.")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _offline_defaults()
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list and args_list[0] == "train":
            return cmd_train(args_list[1:])
        args = build_parser().parse_args(args_list)
        if args.command == "registry":
            return cmd_registry(args)
        return cmd_data(args)
    except GymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def exit_process(code: int) -> NoReturn:
    """End a command-line process with `code`, skipping the garbage collection over what is in memory.

    The run is over: collecting Prefect's server modules, torch and the rest at interpreter exit
    only frees memory the OS takes back anyway, and took 1-2.5 s. Exit handlers (Prefect's,
    MLflow's) still run. For processes about to end only, never inside a library call.
    """
    gc.freeze()
    raise SystemExit(code)


def console() -> NoReturn:
    """The `gym` console script."""
    exit_process(main())


if __name__ == "__main__":
    console()
