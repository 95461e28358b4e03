"""Command-line runner shared by every flow script and `gym train`.

Parses flags generated from the flow's config (plus the flag names the Gym papers use), checks
the inputs (gym.preflight) before Prefect even starts, runs the flow with results persisted in the
workspace, then prints a summary and, with `--json`, one final line of JSON. Not a flow itself;
`python flows/<name>.py` calls it.

A user's mistake (bad flag value, unknown model, template or dataset, a dataset the method can't
train on, a broken record) ends the process with `error: <message>` as the last line of stderr
and exit status 2, without a traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel, ValidationError

from flows import temporary_api
from gym import cli_llamafactory, preflight, progress, secrets
from gym.cli_options import (
    SEP,
    ArgumentParser,
    add_config_options,
    comma_separated,
    dotlist,
    error_words,
    merge,
    overrides_from,
    read_config_file,
    split_config_file,
)
from gym.errors import ConfigError, GymError, disk_full, disk_full_error, interrupted
from gym.train import METHODS
from gym.train.config import FINETUNING_TYPES


def stage_fields(config_cls: type[BaseModel]) -> list[str]:
    """Names of the config's training-stage fields (sft/dpo, or train)."""
    from gym.train.config import TrainConfig

    return [n for n, f in config_cls.model_fields.items() if f.annotation is TrainConfig]


def build_parser(config_cls: type[BaseModel], prog: str | None = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=prog, description=config_cls.__doc__)
    parser.add_argument("--json", action="store_true", help="End the output with one line of JSON.")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="Print every training log line and the libraries' progress bars on the console.",
    )
    parser.add_argument(
        "--refresh-cache",
        action="store_true",
        help="Run every task instead of reading Prefect's task cache (gym still reuses artifacts it finds).",
    )
    paper = parser.add_argument_group("Gym paper flag names")
    stages, fields = stage_fields(config_cls), config_cls.model_fields

    def shown(applies: bool, text: str) -> str:  # a flag the flow can't use is refused, and not listed
        return text if applies else argparse.SUPPRESS

    paper.add_argument("--model_name_or_path", dest="alias_model", metavar="MODEL", help="Same as --model.")
    paper.add_argument(
        "--finetuning_type",
        dest="alias_finetuning_type",
        metavar="TYPE",
        help=shown(
            bool(stages),
            f"{'/'.join(FINETUNING_TYPES)} for every stage, or a method name ({', '.join(METHODS)}).",
        ),
    )
    paper.add_argument(
        "--num_train_epochs",
        dest="alias_epochs",
        metavar="EPOCHS",
        type=float,
        help=shown(
            bool(stages) or "epochs" in fields,
            "Epochs for every stage (max_steps is then ignored unless given).",
        ),
    )
    paper.add_argument(
        "--output_dir",
        dest="alias_output_dir",
        metavar="DIR",
        help=shown(_exports(config_cls), "Same as --output.output_dir."),
    )
    paper.add_argument(
        "--max-steps",
        "--max_steps",
        dest="alias_max_steps",
        metavar="STEPS",
        type=int,
        help=shown(
            bool(stages),
            "Optimiser steps for every training stage (a demo's warm start keeps its own: "
            "--warm_start.train.max_steps).",
        ),
    )
    if "dataset" not in fields:
        comma_separated(
            paper.add_argument(
                "--dataset",
                dest="alias_dataset",
                metavar="DATASET",
                help=shown("sft_dataset" in fields, "Same as --sft_dataset."),
            )
        )
    if stages:
        cli_llamafactory.add_options(parser, stages)
    add_config_options(parser, config_cls)
    return parser


def parse_config(
    config_cls: type[BaseModel],
    args: argparse.Namespace,
    under: argparse.Namespace | None = None,
    under_path: Path | None = None,
) -> BaseModel:
    """Defaults, then a config file's settings (`under`, read from `under_path`), then the command line's
    flags. Within each: the paper aliases, then LLaMA-Factory's names, then gym's own flags (the most
    specific wins). A mistake in the file's settings names the file (a GymError, or a ValidationError
    raised as ConfigError)."""
    config = config_cls().model_dump()
    given = _settings(config_cls, args, under, under_path)
    for settings in given:
        config = merge(config, settings)
    try:
        parsed = config_cls.model_validate(config)
    except ValidationError as exc:
        from_file = file_only(config_cls, args, under)
        if under_path is None or not any(_dotted_loc(e["loc"]) in from_file for e in exc.errors()):
            raise

        # each mistake blamed where it was made: the file's, or the command line's
        def where(loc: tuple[Any, ...]) -> str:
            return f"{under_path}: " if _dotted_loc(loc) in from_file else ""

        raise ConfigError(describe(exc, where)) from None
    _check_variants(parsed, given, stage_fields(config_cls))
    return parsed


def _check_variants(config: BaseModel, given: list[dict[str, Any]], stages: list[str]) -> None:
    """A LoRA setting the user gave (either spelling, in a file or on the command line) that contradicts
    the stage's variant (`--finetuning_type dora --train.lora.use_dora false`): the variant silently won.
    Said here, before anything runs (gym.train.adapters.lora_settings can't tell a default false apart)."""
    from gym.train.adapters import IMPLIED

    for stage in stages:
        train = getattr(config, stage, None)
        kind = getattr(train, "finetuning_type", None)
        lora: dict[str, Any] = {}
        for settings in given:
            lora.update(settings.get(stage, {}).get("lora", {}))
        for name, value in IMPLIED.get(str(kind), {}).items():
            if name in lora and lora[name] != value:
                shown = [json.dumps(v) if isinstance(v, bool) else v for v in (lora[name], value)]
                given_value, implied = shown
                raise ConfigError(
                    f"{stage}.lora.{name} is {given_value}, but finetuning_type {kind} is LoRA with "
                    f"lora.{name} {implied}: drop {stage}.lora.{name}, or use finetuning_type lora"
                )


def _settings(
    config_cls: type[BaseModel],
    args: argparse.Namespace,
    under: argparse.Namespace | None,
    under_path: Path | None = None,
) -> list[dict[str, Any]]:
    """The settings of each source, the config file's (`under`) first, as nested dicts for the config."""
    sources = [ns for ns in (under, args) if ns is not None]
    stages = stage_fields(config_cls)
    # Settings LLaMA-Factory's names derive from others, as the user gave them in either source
    given_types = [_finetuning_type(config_cls, ns, stages) for ns in reversed(sources)]
    derived = {
        "finetuning_type": next((t for t in given_types if t), None),
        "alpha_given": any(_alpha_given(config_cls, ns, stages) for ns in sources),
    }
    out = []
    for ns in sources:
        try:
            out.append(_overrides(config_cls, ns, stages, derived))
        except GymError as exc:
            raise _in_file(exc, under_path) if ns is under else exc from None
    # each as the run will use it: the command line's over the file's, whichever gave the other
    given = [(ns, cli_llamafactory.given(ns).get("overwrite_output_dir")) for ns in sources]
    overwrite = [(ns, value) for ns, value in given if value is not None]
    output_dirs = [d for tree in out if (d := (tree.get("output") or {}).get("output_dir"))]
    if overwrite:
        try:
            cli_llamafactory.check_overwrite(overwrite[-1][1], output_dirs[-1] if output_dirs else None)
        except GymError as exc:
            raise _in_file(exc, under_path) if overwrite[-1][0] is under else exc from None
    return out


def file_only(
    config_cls: type[BaseModel], args: argparse.Namespace, under: argparse.Namespace | None
) -> set[str]:
    """The settings (dotted paths: `train.learning_rate`) a config file gives and the command line lacks."""
    if under is None:
        return set()
    in_file, on_line = _settings(config_cls, args, under)
    return set(_dotted(in_file)) - set(_dotted(on_line))


def blame_file(exc: GymError, path: Path | None, from_file: set[str]) -> GymError:
    """`exc` (raised checking a parsed config) naming config file `path` first when its message starts
    with a setting only the file gave (`template: unknown chat template ...`)."""
    head = str(exc).split(":", 1)[0].strip()
    setting = head.split(SEP, 1)[0]
    if head in from_file or setting in from_file or any(f.startswith(f"{head}{SEP}") for f in from_file):
        return _in_file(exc, path)
    return exc


def _in_file(exc: GymError, path: Path | None) -> GymError:
    """`exc` with its message after `path: `, when there is a path its message doesn't name already."""
    if path is None or str(exc).startswith(str(path)) or type(exc) not in (GymError, ConfigError):
        return exc  # DataError and the like carry more than a message (file, record, field)
    return type(exc)(f"{path}: {exc}")


def _dotted(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted paths of a nested settings dict's leaves (`train.lora.r`)."""
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out += _dotted(value, f"{path}{SEP}") if isinstance(value, dict) and value else [path]
    return out


def _dotted_loc(loc: tuple[Any, ...]) -> str:
    """A pydantic error's location as a settings path, without list indexes (`train.lora.target_modules`)."""
    return SEP.join(str(p) for p in loc if not isinstance(p, int))


def _overrides(
    config_cls: type[BaseModel], args: argparse.Namespace, stages: list[str], derived: dict[str, Any]
) -> dict[str, Any]:
    """The settings one source (command line or config file) gives, as a nested dict."""
    _refuse_unused(config_cls, args, stages)
    alias: dict[str, Any] = {}
    if args.alias_model:
        alias["model"] = args.alias_model
    if getattr(args, "alias_dataset", None):
        alias["sft_dataset"] = args.alias_dataset
    if args.alias_output_dir:
        alias["output"] = {"output_dir": args.alias_output_dir}
    if args.alias_epochs is not None and "epochs" in config_cls.model_fields:  # Training-Free GRPO's epochs
        alias["epochs"] = max(1, round(args.alias_epochs))
    if args.alias_max_steps is not None and "steps" in config_cls.model_fields:  # and its steps
        if args.alias_max_steps == 0 or args.alias_max_steps < -1:  # as TrainConfig's max_steps
            raise GymError(
                f"--max-steps {args.alias_max_steps}: give 1 or more steps, or -1 to run the epochs"
            )
        alias["steps"] = args.alias_max_steps if args.alias_max_steps > 0 else None
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
    if stages:
        alias = merge(alias, cli_llamafactory.overrides(args, stages, **derived))
    result = merge(alias, overrides_from(args, config_cls))
    ft = args.alias_finetuning_type
    picked = result.get("train", {}).get("method") if isinstance(result.get("train"), dict) else None
    if ft in METHODS and "train" in stages and picked not in (None, ft):  # one of them was dropped, silently
        raise GymError(
            f"--finetuning_type {ft} (a method, in the papers' form) and method {picked} (--method, "
            "--train.method, --stage or --pref_loss) disagree: give one of them"
        )
    return result


def _exports(config_cls: type[BaseModel]) -> bool:
    """Whether the flow can copy its final model to a folder (`output.output_dir`)."""
    output = config_cls.model_fields.get("output")
    annotation = output.annotation if output is not None else None
    return isinstance(annotation, type) and "output_dir" in getattr(annotation, "model_fields", {})


def _refuse_unused(config_cls: type[BaseModel], args: argparse.Namespace, stages: list[str]) -> None:
    """The paper's flags a flow has nothing for (they were ignored, or failed naming inner fields)."""
    trains_nothing = "this flow trains no weights: leave it out"
    unused = {
        "--finetuning_type": not stages and args.alias_finetuning_type is not None,
        "--max-steps": not stages
        and "steps" not in config_cls.model_fields
        and args.alias_max_steps is not None,
        "--num_train_epochs": not stages and "epochs" not in config_cls.model_fields and args.alias_epochs,
        "--output_dir": not _exports(config_cls) and args.alias_output_dir,
        "--dataset": "sft_dataset" not in config_cls.model_fields and getattr(args, "alias_dataset", None),
    }
    reasons = {
        "--output_dir": "this flow writes no model to copy: leave it out",
        "--dataset": "this flow trains on no dataset (name held-out data with --eval_dataset)",
    }
    for flag, given in unused.items():
        if given:
            raise GymError(f"{flag}: {reasons.get(flag, trains_nothing)}")


def _alpha_given(config_cls: type[BaseModel], args: argparse.Namespace, stages: list[str]) -> bool:
    fields = overrides_from(args, config_cls)
    by_name = "lora_alpha" in cli_llamafactory.given(args)
    return by_name or any("alpha" in fields.get(s, {}).get("lora", {}) for s in stages)


def _finetuning_type(config_cls: type[BaseModel], args: argparse.Namespace, stages: list[str]) -> str | None:
    """The adaptation type one source names, by the paper's flag or a stage's own field."""
    if args.alias_finetuning_type in FINETUNING_TYPES:
        return str(args.alias_finetuning_type)
    fields = overrides_from(args, config_cls)
    return next(
        (fields[s]["finetuning_type"] for s in stages if "finetuning_type" in fields.get(s, {})), None
    )


def main(
    flow_fn: Any,
    config_cls: type[BaseModel],
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    config_file: tuple[Path, dict[str, Any]] | None = None,
) -> int:
    """Run the flow on the command line's flags, after a config file's settings if one comes first
    (`python flows/train.py run.yaml --max-steps 10`), or those of `config_file` (path, settings)."""
    parser = build_parser(config_cls, prog=prog)
    path, rest = split_config_file(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(dotlist(rest, parser._option_string_actions))
    try:
        if config_file is None and path is not None:
            config_file = (path, read_config_file(path))
        under = parser.parse_file(*config_file) if config_file else None
    except GymError as exc:
        return user_error(str(exc))
    sources = [ns for ns in (under, args) if ns is not None]
    progress.console_defaults(verbose=any(ns.verbose for ns in sources))
    where = config_file[0] if config_file else None
    try:
        config = parse_config(config_cls, args, under, where)
        for ns in sources:
            for note in cli_llamafactory.notes(ns):
                print(f"note: {note}", file=sys.stderr)
        with cli_llamafactory.data_dir(sources):
            try:
                preflight.check(config)  # before Prefect starts: a mistake is reported in about a second
            except GymError as exc:
                raise blame_file(exc, where, file_only(config_cls, args, under)) from None
            summary = run_flow(flow_fn, config, refresh_cache=any(ns.refresh_cache for ns in sources))
    except ValidationError as exc:
        return user_error(describe(exc))
    except GymError as exc:
        return user_error(str(exc))
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 128 + signal.SIGINT
    except Exception as exc:
        if disk_full(exc) is not None and not interrupted(exc):  # the environment's, not a bug: one line
            return user_error(str(disk_full_error(exc)))
        if not interrupted(exc):  # a library's error raised while handling Ctrl-C is the interrupt
            raise
        print(INTERRUPTED, file=sys.stderr)
        return 128 + signal.SIGINT
    print_summary(summary)
    if any(ns.json for ns in sources):
        print(json.dumps(strict_json(summary), sort_keys=True, default=str, allow_nan=False))
    return 0


def strict_json(value: Any) -> Any:
    """`value` with every NaN or infinite number as None: JSON has no NaN (Python writes it, and strict
    parsers such as JavaScript's JSON.parse or jq refuse the line); a metric that is NaN was not measured."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


INTERRUPTED = (
    "interrupted: run the same command again to go on (finished tasks are cached, and training resumes "
    "from its last checkpoint)"
)


def user_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def describe(exc: ValidationError, where: Callable[[tuple[Any, ...]], str] | None = None) -> str:
    """Pydantic's errors as parameter paths with what was wrong: `sft.learning_rate: Input should be ...`;
    each after `where(its location)`, if given (the config file a setting came from)."""
    parts = []
    for err in exc.errors():
        flag = ".".join(str(p) for p in err["loc"])
        given = err.get("input")
        hidden = isinstance(given, (dict, type(None))) or secrets.secret_name(flag)
        hidden = hidden or secrets.holds_secret(given)  # never echo a key
        got = "" if hidden else f" (got {given!r})"
        msg = error_words(err)
        before = where(err["loc"]) if where else ""
        parts.append(f"{before}{flag}: {msg}{got}" if flag else f"{msg}{got}")  # a whole-config validator
    return "; ".join(parts)


def run_script(flow_fn: Any, config_cls: type[BaseModel]) -> NoReturn:
    """`python flows/<name>.py`: run `main` on the command line's flags, then end the process."""
    from gym.cli import run_console
    from gym.process import tune_process

    tune_process()
    run_console(lambda: main(flow_fn, config_cls))


def _open_tracking(config: BaseModel) -> None:
    """Every run opens an MLflow run first: connect to the store (and make the experiment) now.

    Best effort: a store that can't be reached fails again, with its error, in the flow's first task.
    """
    from gym import tracking

    output = getattr(config, "output", None)
    with contextlib.suppress(Exception):
        name = getattr(output, "experiment", None) or tracking.EXPERIMENT
        tracking.experiment_id(name, uri=getattr(output, "tracking_uri", None))


def run_flow(flow_fn: Any, config: BaseModel, refresh_cache: bool = False) -> dict[str, Any]:
    """Run the flow with workspace-bound results; add the flow run id and how many tasks were cached.

    `flow_fn` may be named ("flows.train:train") so that, with no Prefect server to use, Prefect's
    temporary API starts booting (flows/temporary_api.py) before the flow's module is imported.
    """
    from tasks._common import workspace_settings

    with workspace_settings(refresh_cache=refresh_cache), workspace_servers():
        api = temporary_api.TemporaryApi().start() if temporary_api.wanted() else None
        try:
            flow_fn = _load(flow_fn)
            if api is not None:
                _open_tracking(config)  # while the API boots in its own process
                api.ready()
            with api.in_use() if api is not None else contextlib.nullcontext():
                state = flow_fn(config=config, return_state=True)
                flow_run_id = str(state.state_details.flow_run_id)
                summary = dict(state.result())
                summary["flow_run_id"] = flow_run_id
                summary["cached_tasks"] = cached_task_count(flow_run_id)
        finally:
            if api is not None:
                api.stop()
    return summary


def _load(flow_fn: Any) -> Any:
    """A flow, or one named "module:function"."""
    if isinstance(flow_fn, str):
        module, name = flow_fn.split(":")
        return getattr(importlib.import_module(module), name)
    return flow_fn


@contextlib.contextmanager
def workspace_servers() -> Iterator[None]:
    """Run against the Prefect server `gym up` started for this workspace, if one is answering and no
    other API is configured: the run shows in its UI, and no temporary API has to start. A configured
    API (PREFECT_API_URL) that doesn't answer is an error here, not Prefect's tracebacks mid-run."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from gym import services

    configured = PREFECT_API_URL.value()
    if configured and (problem := services.unreachable(configured)):
        raise GymError(
            f"PREFECT_API_URL={configured}: {problem} (stopped by `gym down`?): `unset PREFECT_API_URL` to "
            "run with a temporary API (or on `gym up`'s server when it runs), or start that server again"
        )
    url = None if configured else services.running("prefect")
    if url is None:
        yield
        return
    with temporary_settings({PREFECT_API_URL: f"{url}/api"}):
        yield


def cached_task_count(flow_run_id: str, settle_s: float = 0.2, timeout_s: float = 15.0) -> int:
    """How many of the flow run's tasks the API records as Cached.

    Task-run states reach the API as events that the server records asynchronously, so a read
    right after the flow can miss the last few, or (a busy machine, a temporary API still working
    through its events) all of them. Send every pending event first, then read until the flow's
    task runs show, all final, and two reads `settle_s` apart agree (at most `timeout_s`). Every gym
    flow runs tasks, so a read that finds none is one the server has not caught up with.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=timeout_s)
    flow_filter = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    deadline = time.monotonic() + timeout_s
    previous: list[tuple[str, str]] | None = None
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=flow_filter)
            seen = sorted((str(r.id), r.state.name if r.state else "") for r in runs)
            final = all(r.state is not None and r.state.is_final() for r in runs)
            if (seen and final and seen == previous) or time.monotonic() > deadline:
                return sum(1 for _, name in seen if name == "Cached")
            previous = seen if final else None
            time.sleep(settle_s)


def print_summary(summary: dict[str, Any]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    print("\n== gym run summary ==")
    for key in sorted(summary):
        if summary[key] is not None:  # keys of stages or scores this run doesn't have (--json keeps them)
            print(f"  {key:28s} {fmt(summary[key])}")
