"""The `gym` console script: one table of subcommands, each a function `argv -> exit status`.

    gym train [--method M] [any flow parameter as --flag] [--json]     runs a Prefect flow
    gym registry [list|show NAME]      gym data [preview] DATASET        library commands
    gym up [--worker] | gym status | gym down          Prefect and MLflow servers for the workspace

It lives above the library (flows/ may import gym/, never the reverse), so `import gym` never
pulls in Prefect. Commands that run flows are defined here; commands that only use the
library live in gym/ and are only referenced by name. A subcommand's module is imported when
it runs, so `gym registry list` never imports Prefect or torch.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from gym import progress
from gym.errors import GymError
from gym.process import tune_process

# subcommand -> ("module:function", one-line help). The function takes the arguments after the
# subcommand and returns the exit status.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("flows.commands:cmd_train", "Run a training flow (`gym train --method M --help`)."),
    "registry": ("gym.cli:cmd_registry", "List or show models in the registry."),
    "data": ("gym.cli:cmd_data", "Look at a dataset the way gym reads it."),
    "eval": ("gym.eval.cli:cmd_eval", "Score a model on MMLU / C-Eval / CMMLU or any lm-eval task."),
    "up": ("flows.services:cmd_up", "Start the Prefect and MLflow servers (UIs) for this workspace."),
    "status": ("flows.services:cmd_status", "Say which servers `gym up` started are running."),
    "down": ("flows.services:cmd_down", "Stop what `gym up` started, leaving no process behind."),
    "serve": ("gym.serve.cli:cmd_serve", "Serve a model over an OpenAI-compatible HTTP API."),
    "export": ("gym.export:cmd_export", "Write a hub-style model directory (merged, sharded, with card)."),
    "chat": ("gym.chat:cmd_chat", "Chat with a model in the terminal, or a Gradio page with --ui."),
    "deploy": ("gym.deploy:cmd_deploy", "Push a model (and a chat Space) to the hub, or write the bundle."),
    "promote": ("gym.promotion:cmd_promote", "Move `champion` to the challenger if it wins on a score."),
    "tfgrpo": ("gym.tfgrpo.cli:cmd_tfgrpo", "Training-Free GRPO tools (`gym tfgrpo simulate --json`)."),
}

# Commands that set up their console themselves: `gym train` once it has read --verbose; `gym up`
# leaves the servers' and the worker's logging as their own.
OWN_CONSOLE = {"train", "up", "status", "down"}


def _command(name: str) -> Callable[[Sequence[str]], int]:
    module, function = COMMANDS[name][0].split(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:{width}s}  {help_}" for name, (_, help_) in COMMANDS.items())
    head = "usage: gym COMMAND [ARGS...]  |  gym --version\n\nFine-tune LLMs as a Prefect pipeline.\n"
    return f"{head}\ncommands:\n{rows}\n"


# What a bug report needs: the libraries gym trains, evaluates and tracks with (extras when installed).
STACK = ("torch", "transformers", "peft", "trl", "accelerate", "datasets", "prefect", "mlflow")
EXTRAS = ("bitsandbytes", "liger-kernel", "flash-attn", "unsloth", "deepspeed", "lm-eval", "vllm", "gradio")


def version() -> str:
    """`gym X.Y.Z`, then Python's and the installed libraries' versions (read, never imported)."""
    from importlib import metadata

    def installed(name: str) -> str | None:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            return None

    libraries = [installed(n) or f"{n} missing" for n in STACK] + [v for n in EXTRAS if (v := installed(n))]
    python = ".".join(map(str, sys.version_info[:3]))
    return f"{installed('gym') or 'gym (not installed)'}\npython {python}, {', '.join(libraries)}\n"


# Commands that write a folder and end with it (not a flow run, which Prefect's own SIGTERM handling ends):
# a SIGTERM unwinds them, so that what they were writing is removed (gym.cli.terminated_as_exit).
WRITERS = ("export", "deploy")


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tune_process()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0 if args else 2
    if args[0] in ("--version", "-V", "version"):  # `version` as llamafactory-cli has it
        print(version(), end="")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"error: unknown command {name!r}{hint}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if name not in OWN_CONSOLE:
        progress.console_defaults(verbose=progress.verbose())  # libraries' progress bars off
    try:
        if name in WRITERS:
            from gym.cli import terminated_as_exit

            with terminated_as_exit():
                return _command(name)(rest)
        return _command(name)(rest)
    except GymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def console() -> NoReturn:
    """The `gym` console script."""
    from gym.cli import run_console

    run_console(main)


if __name__ == "__main__":
    console()
