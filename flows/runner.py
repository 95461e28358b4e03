"""Command-line runner shared by every flow script and `gym train`.

Parses flags generated from the flow's config (plus the flag names the Gym papers use),
runs the flow with results persisted in the workspace, then prints a summary and, with
`--json`, one final line of JSON. Not a flow itself; `python flows/<name>.py` calls it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from gym.cli_options import add_config_options, merge, overrides_from
from gym.errors import GymError
from gym.train import METHODS

FINETUNING_TYPES = ("full", "lora")


def stage_fields(config_cls: type[BaseModel]) -> list[str]:
    """Names of the config's training-stage fields (sft/dpo, or train)."""
    from gym.train.config import TrainConfig

    return [n for n, f in config_cls.model_fields.items() if f.annotation is TrainConfig]


def build_parser(config_cls: type[BaseModel], prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=config_cls.__doc__)
    parser.add_argument("--json", action="store_true", help="End the output with one line of JSON.")
    paper = parser.add_argument_group("Gym paper flag names")
    paper.add_argument("--model_name_or_path", dest="alias_model", help="Same as --model.")
    paper.add_argument(
        "--finetuning_type",
        dest="alias_finetuning_type",
        help=f"{'/'.join(FINETUNING_TYPES)} for every stage, or a method name ({', '.join(METHODS)}).",
    )
    paper.add_argument(
        "--num_train_epochs",
        dest="alias_epochs",
        type=float,
        help="Epochs for every stage (max_steps is then ignored unless given).",
    )
    paper.add_argument("--output_dir", dest="alias_output_dir", help="Same as --output.output_dir.")
    paper.add_argument(
        "--max-steps",
        "--max_steps",
        dest="alias_max_steps",
        type=int,
        help="Optimiser steps for every stage.",
    )
    if "dataset" not in config_cls.model_fields:
        paper.add_argument("--dataset", dest="alias_dataset", help="Same as --sft_dataset.")
    add_config_options(parser, config_cls)
    return parser


def parse_config(config_cls: type[BaseModel], args: argparse.Namespace) -> BaseModel:
    """Defaults, then the paper aliases, then explicit field flags (the most specific wins)."""
    base = config_cls().model_dump()
    stages = stage_fields(config_cls)
    alias: dict[str, Any] = {}
    if args.alias_model:
        alias["model"] = args.alias_model
    if getattr(args, "alias_dataset", None):
        alias["sft_dataset"] = args.alias_dataset
    if args.alias_output_dir:
        alias["output"] = {"output_dir": args.alias_output_dir}
    for stage in stages:
        s: dict[str, Any] = {}
        if args.alias_max_steps is not None:
            s["max_steps"] = args.alias_max_steps
        if args.alias_epochs is not None:
            s["num_train_epochs"] = args.alias_epochs
            s.setdefault("max_steps", -1)
        if ft := args.alias_finetuning_type:
            if ft in FINETUNING_TYPES:
                s["finetuning_type"] = ft
            elif ft in METHODS and stage == "train":
                s["method"] = ft
            else:
                raise GymError(
                    f"--finetuning_type {ft!r} is not available: use one of {', '.join(FINETUNING_TYPES)} "
                    f"or a method ({', '.join(METHODS)})"
                )
        if s:
            alias[stage] = s
    return config_cls.model_validate(merge(merge(base, alias), overrides_from(args, config_cls)))


def main(
    flow_fn: Any, config_cls: type[BaseModel], argv: Sequence[str] | None = None, prog: str | None = None
) -> int:
    parser = build_parser(config_cls, prog=prog)
    args = parser.parse_args(argv)
    try:
        config = parse_config(config_cls, args)
        summary = run_flow(flow_fn, config)
    except (GymError, ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_summary(summary)
    if args.json:
        print(json.dumps(summary, sort_keys=True, default=str))
    return 0


def run_flow(flow_fn: Any, config: BaseModel) -> dict[str, Any]:
    """Run the flow with workspace-bound results; add the flow run id and how many tasks were cached."""
    from tasks._common import workspace_settings

    with workspace_settings():
        state = flow_fn(config=config, return_state=True)
        summary = dict(state.result())
        flow_run_id = str(state.state_details.flow_run_id)
        summary["flow_run_id"] = flow_run_id
        summary["cached_tasks"] = cached_task_count(flow_run_id)
    return summary


def cached_task_count(flow_run_id: str) -> int:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sum(1 for r in runs if r.state is not None and r.state.name == "Cached")


def print_summary(summary: dict[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    print("\n== gym run summary ==")
    for key in sorted(summary):
        print(f"  {key:28s} {fmt(summary[key])}")
