"""`gym chat`: talk to a model through the serving engine, in the terminal or in a Gradio page.

    gym chat --model gym-tiny                          # terminal; /reset forgets, /exit (or Ctrl-D) quits
    gym chat --model models:/gym-tiny-sft@champion --ui [--port 7860]      # a web chat on 127.0.0.1
    gym chat [--ui] inference.yaml          # LLaMA-Factory's inference YAML (gym/cli_llamafactory_tools.py)

The model is anything `gym serve` takes (registry name, model directory, MLflow URI) and is
prompted the same way: its chat template, plus its experience library when it ships one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from gym.errors import MissingExtraError

DEFAULTS = {"temperature": 0.7, "max_tokens": 256, "top_p": 1.0}


def reply(engine: Any, history: Sequence[dict[str, Any]], message: str, **params: Any) -> Iterator[str]:
    """The assistant's reply to `message` after `history`, growing: each item is the text so far."""
    messages = [
        {"role": m["role"], "content": str(m["content"])} for m in history if m.get("content") is not None
    ]
    text = ""
    for piece in engine.stream_chat([*messages, {"role": "user", "content": message}], **params):
        text += piece
        yield text


def opening(system: str | None) -> list[dict[str, str]]:
    """The conversation before the first message: the system message, if any."""
    return [{"role": "system", "content": system}] if system else []


def terminal(
    engine: Any,
    read: Callable[[str], str] = input,
    out: TextIO = sys.stdout,
    system: str | None = None,
    **params: Any,
) -> int:
    """A read-reply loop on the terminal (after `system`, if given); returns 0 at /exit or end of input."""
    history = opening(system)
    print(f"chatting with {engine.name}: /reset forgets the conversation, /exit quits", file=out)
    while True:
        try:
            message = read("you> ").strip()
        except (EOFError, StopIteration):
            return 0
        if message in ("/exit", "/quit"):
            return 0
        if message == "/reset" or not message:
            history = opening(system) if message else history
            continue
        print("assistant> ", end="", file=out, flush=True)
        text = ""
        for text in reply(engine, history, message, **params):  # noqa: B007 - the last value is the reply
            pass
        print(text, file=out, flush=True)
        history += [{"role": "user", "content": message}, {"role": "assistant", "content": text}]


def build_ui(
    engine: Any,
    title: str | None = None,
    system: str | None = None,
    temperature: float = DEFAULTS["temperature"],
    max_tokens: int = int(DEFAULTS["max_tokens"]),
    top_p: float = DEFAULTS["top_p"],
) -> Any:
    """A Gradio chat page over `engine` (temperature and length adjustable under the input, starting
    at the values given; every conversation opens with `system`, if given)."""
    try:
        import gradio as gr
    except ImportError as exc:
        raise MissingExtraError('gym chat --ui needs Gradio: pip install -e ".[ui]"') from exc

    def respond(
        message: str, history: list[dict[str, Any]], temperature: float, max_tokens: int
    ) -> Iterator[str]:
        params = {"temperature": temperature, "max_tokens": int(max_tokens), "top_p": top_p}
        yield from reply(engine, [*opening(system), *history], message, **params)

    return gr.ChatInterface(
        respond,
        title=title or f"gym chat: {engine.name}",
        additional_inputs=[
            gr.Slider(0.0, 2.0, value=temperature, step=0.05, label="temperature"),
            gr.Slider(1, max(1024, max_tokens), value=max_tokens, step=1, label="max tokens"),
        ],
        analytics_enabled=False,
    )


def build_parser() -> argparse.ArgumentParser:
    from gym.cli_llamafactory_tools import epilog

    parser = argparse.ArgumentParser(
        prog="gym chat", description=__doc__.splitlines()[0], epilog=epilog("chat")
    )
    parser.add_argument("--model", required=True, help="Registry name, model directory or models:/ URI.")
    parser.add_argument("--template", default=None, help="Chat template (default: the model's).")
    parser.add_argument("--ui", action="store_true", help="Open a Gradio web chat instead of the terminal.")
    parser.add_argument("--host", default="127.0.0.1", help="--ui: interface to listen on.")
    parser.add_argument("--port", type=_port, default=7860, help="--ui: port.")
    parser.add_argument(
        "--temperature", type=float, default=DEFAULTS["temperature"], help="Sampling temperature."
    )
    parser.add_argument(
        "--max-tokens", type=int, default=DEFAULTS["max_tokens"], help="Longest reply, in tokens."
    )
    parser.add_argument("--top-p", type=float, default=DEFAULTS["top_p"], help="Nucleus sampling mass.")
    parser.add_argument("--system", default=None, help="System message every conversation opens with.")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="Run Python code from the model repository."
    )
    return parser


def _port(value: str) -> int:
    """A fixed port for Gradio (it cannot take 0, any free port, as `gym serve` does)."""
    if not value.isdigit() or not 1 <= int(value) <= 65535:
        raise argparse.ArgumentTypeError(f"a port from 1 to 65535 (got {value!r})")
    return int(value)


def cmd_chat(argv: Sequence[str]) -> int:
    from gym.cli_llamafactory_tools import translate

    parser = build_parser()
    args = parser.parse_args(translate("chat", argv, parser))
    if args.ui:
        import importlib.util

        if importlib.util.find_spec("gradio") is None:  # before the model loads
            raise MissingExtraError('gym chat --ui needs Gradio: pip install -e ".[ui]"')
        from gym.serve.server import bind

        bind(args.host, args.port, hint="choose another --port").close()  # a busy port: before the model
    from gym.serve.engine import Engine

    params = {"temperature": args.temperature, "max_tokens": args.max_tokens, "top_p": args.top_p}
    with Engine.load(args.model, template=args.template, trust_remote_code=args.trust_remote_code) as engine:
        if args.ui:
            build_ui(engine, system=args.system, **params).launch(
                server_name=args.host, server_port=args.port
            )
            return 0
        return terminal(engine, system=args.system, **params)
