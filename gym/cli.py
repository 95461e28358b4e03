"""Library subcommands of the `gym` console script (flows/cli.py dispatches to them).

    gym registry [list] [--json] | gym registry [show] NAME
    gym data [preview] DATASET [-n 3] [--model gym-tiny]

These use the library alone and never import Prefect; commands that run flows (`gym train`)
live above the library, in flows/commands.py. `main(argv)` runs any of them in-process.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from gym.cli_options import ArgumentParser, whole_number
from gym.errors import GymError, disk_full, disk_full_error


def _with_action(argv: Sequence[str], actions: Sequence[str], default: str) -> list[str]:
    """`argv` with its action spelled out: `default` when the first word is none of `actions`."""
    if argv and (argv[0] in actions or argv[0] in ("-h", "--help")):
        return list(argv)
    return [default, *argv]


def cmd_registry(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="gym registry", description="List or show models in the registry.")
    parser.add_argument("action", choices=["list", "show"], help="list (the default) or show NAME")
    parser.add_argument("name", nargs="?")
    parser.add_argument("--json", action="store_true", help="Print JSON (show always prints JSON).")
    # `gym registry` lists, `gym registry NAME` shows one; flags may come first (`--json NAME`)
    words = [a for a in argv if not a.startswith("-")]
    argv = [*words, *(a for a in argv if a.startswith("-"))]
    args = parser.parse_args(_with_action(argv, ("list", "show"), "show" if words else "list"))
    from gym import registry

    models = registry.load_models()
    if args.action == "list" and args.name:
        print(
            f"error: gym registry list takes no name; `gym registry show {args.name}` shows one",
            file=sys.stderr,
        )
        return 2
    if args.action == "list":
        if args.json:
            print(
                json.dumps([m.model_dump(mode="json") for m in models.values()], indent=2, ensure_ascii=False)
            )
            return 0
        widths = {  # each column as wide as its longest value (a template name outgrew a fixed width)
            key: max(len(key), *(len(str(getattr(m, key))) for m in models.values()))
            for key in ("name", "family", "template")
        }
        name, family, template = (widths[k] for k in ("name", "family", "template"))
        print(f"{'name':{name}s} {'family':{family}s} {'template':{template}s} {'params':>9s}  hub id")
        for m in models.values():
            hub = m.hub_id or "(built in)"
            size = registry.count(m.parameters)
            print(f"{m.name:{name}s} {m.family:{family}s} {m.template:{template}s} {size:>9s}  {hub}")
        return 0
    if not args.name:
        print("error: usage: gym registry show NAME", file=sys.stderr)
        return 2
    spec = registry.get_model(args.name)
    out: dict[str, Any] = {**spec.model_dump(mode="json"), "memory_gib": registry.memory_estimates(spec)}
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


def cmd_data(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="gym data", description="Look at a dataset the way gym reads it.")
    parser.add_argument("action", choices=["preview", "show"], help="preview (the default; show is the same)")
    parser.add_argument("dataset", help="Dataset registry name, file, folder or hub id.")
    parser.add_argument(
        "-n",
        type=whole_number(1, None, "a whole number of records, at least 1"),
        default=3,
        help="Records to show.",
    )
    parser.add_argument(
        "--model", default=None, help="Also show templated text and trained-on tokens for this model."
    )
    parser.add_argument("--template", default=None, help="Chat template (default: the model's).")
    parser.add_argument(
        "--cutoff_len",
        "--cutoff-len",
        type=whole_number(1, None, "a whole number of tokens, at least 1"),
        default=None,
        help="With --model: cut sequences at this many tokens, as training would (default: 1024).",
    )
    parser.add_argument(
        "--dataset_dir",
        "--dataset-dir",
        default=None,
        help="Where dataset_info.json and relative dataset files are looked up, as for gym train "
        "(default: $GYM_DATA_DIR, else the current directory and its data/).",
    )
    parser.add_argument(
        "--method",
        default=None,
        metavar="METHOD",
        help="Read the dataset as this training method does (sft, dpo, grpo, tf_grpo...): an sft dataset "
        "as prompts for ppo, grpo and gspo; question/answer files for tf_grpo; and say whether the "
        "method can train on it.",
    )
    parser.add_argument("--json", action="store_true", help="Print JSON.")
    args = parser.parse_args(
        _with_action(argv, ("preview", "show"), "preview")
    )  # `gym data FILE` previews it
    if args.model is None and (
        given := [f for f in ("template", "cutoff_len") if getattr(args, f) is not None]
    ):
        flags = " and ".join(f"--{f}" for f in given)
        print(
            f"error: {flags} {'shape' if len(given) > 1 else 'shapes'} the templated text, which only "
            "--model shows: add --model NAME",
            file=sys.stderr,
        )
        return 2
    from gym.cli_llamafactory import using_data_dir
    from gym.data.preview import preview

    options = {"n": args.n, "model": args.model, "template": args.template, "cutoff_len": args.cutoff_len}
    options["method"] = args.method
    with using_data_dir(args.dataset_dir, "--dataset_dir"):
        print(preview(args.dataset, as_json=args.json, **options))
    return 0


LIBRARY_COMMANDS = {"registry": cmd_registry, "data": cmd_data}


def main(argv: Sequence[str]) -> int:
    """Run one library subcommand in-process (`main(["registry", "list"])`); user errors -> status 2."""
    if not argv or argv[0] not in LIBRARY_COMMANDS:
        print(f"error: expected one of {', '.join(LIBRARY_COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return LIBRARY_COMMANDS[argv[0]](argv[1:])
    except GymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run_console(command: Callable[[], int]) -> NoReturn:
    """Run a console script's `command` and end the process with its status (see `exit_process`).

    A reader that goes away early (`gym registry list | head -3`) ends the command quietly with
    SIGPIPE's status, as a shell command does, instead of a BrokenPipeError traceback. Ctrl-C ends it
    with one line and SIGINT's status (a run says how to go on: flows/runner.py).
    """
    _gym_warnings_as_lines()
    try:
        code = command()
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        code = 128 + signal.SIGINT
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit; point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 128 + signal.SIGPIPE
    except Exception as exc:
        if disk_full(exc) is None:
            raise  # a bug: its traceback
        print(f"error: {disk_full_error(exc)}", file=sys.stderr)  # the environment's: one line
        code = 2
    exit_process(code)


def _gym_warnings_as_lines() -> None:
    """gym's own warnings (GymWarning) as one `gym: warning: ...` line, as its logged ones are, not
    Python's `/path/to/gym/module.py:184: RuntimeWarning: ...` and a line of its source; others as ever."""
    import warnings

    from gym.errors import GymWarning

    shown = warnings.showwarning

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if isinstance(category, type) and issubclass(category, GymWarning):
            print(f"gym: warning: {message}", file=file or sys.stderr, flush=True)
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """A SIGTERM (a plain `kill`, `timeout`, a container stopping) ends the block as Ctrl-C does: the
    stack unwinds, so a folder being written is removed (gym.workspace.atomic_dir), then the process
    exits with SIGTERM's status. Python's default ended the process where it stood, leaving the
    half-written folder beside the output (with the weights in it) until a later write of the same one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        print("\nterminated", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_process(code: int) -> NoReturn:
    """End a command-line process with `code`, skipping the garbage collection over what is in memory.

    The run is over: collecting Prefect's server modules, torch and the rest at interpreter exit
    only frees memory the OS takes back anyway, and took 1-2.5 s. Exit handlers (Prefect's,
    MLflow's) still run. For processes about to end only, never inside a library call.
    """
    gc.freeze()
    raise SystemExit(code)
