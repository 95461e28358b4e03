"""`gym chat`: talk to a model through the serving engine, in the terminal or in a Gradio page.

    gym chat --model gym-tiny                          # terminal; /reset forgets, /exit (or Ctrl-D) quits
    gym chat --model models:/gym-tiny-sft@champion --ui [--port 7860]      # a web chat on 127.0.0.1
    gym chat [--ui] inference.yaml          # LLaMA-Factory's inference YAML (gym/cli_llamafactory_tools.py)

The model is anything `gym serve` takes (registry name, model directory, MLflow URI) and is
prompted the same way: its chat template, plus its experience library when it ships one.
A conversation that outgrows the model's window leaves out its oldest exchanges (`fit`) rather
than failing as the API does (an API client owns its conversation; here gym does).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from gym.cli_options import ArgumentParser, port, whole_number
from gym.errors import MissingExtraError
from gym.serve.protocol import unicode_text
from gym.serve.requests import RequestError

DEFAULTS = {"temperature": 0.7, "max_tokens": 256, "top_p": 1.0}
# Sampling options with the API's meaning and neutral default (gym serve's per-request fields), fixed for
# the whole chat: (flag, SamplingParams field, type, help).
OPTIONS = (
    ("--top-k", "top_k", int, "Sample from the k most likely tokens only (default 0: all)."),
    ("--min-p", "min_p", float, "Drop tokens less likely than this fraction of the most likely (default 0)."),
    (
        "--repetition-penalty",
        "repetition_penalty",
        float,
        "Penalize tokens the conversation already holds, as transformers does (default 1: off).",
    ),
)


def conversation(history: Sequence[dict[str, Any]], message: str) -> list[dict[str, str]]:
    """`history` (as the terminal or Gradio keeps it) and the new user `message`, as template messages.

    Gradio hands its history over with each message's content as a list of parts
    (`{"type": "text", "text": ...}`, files); the text parts are the message.
    """
    kept = []
    for m in history:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if content is not None:
            kept.append({"role": m["role"], "content": str(content)})
    return [*kept, {"role": "user", "content": message}]


def answered(history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`history` without the user messages no reply followed: Gradio's page keeps a message that was
    refused (too long) or whose reply was stopped before its first word. The terminal never keeps one."""
    return [
        m
        for i, m in enumerate(history)
        if m.get("role") != "user" or (i + 1 < len(history) and history[i + 1].get("role") == "assistant")
    ]


def fit(
    engine: Any, messages: list[dict[str, str]], max_tokens: int
) -> tuple[list[dict[str, str]], int, list[str]]:
    """The conversation and reply length that fit the model's context window, and notes on what changed.

    A long conversation keeps going, as in other chat tools: its oldest exchanges are left out (the
    system message stays) until the prompt leaves room for a `max_tokens` reply; when even the newest
    message alone leaves less room than that, the reply is shortened to the room there is. A message
    too long for the window on its own is a RequestError: there is nothing left to leave out.
    """
    window = engine.context_length
    if window is None:
        return messages, max_tokens, []
    head = messages[:1] if messages[0]["role"] == "system" else []
    turns = messages[len(head) :]
    left_out = 0
    while True:
        prompt = len(engine.encode_chat([*head, *turns]))
        room = window - prompt
        user_turns = [i for i, m in enumerate(turns) if m["role"] == "user"]
        if room >= max_tokens or len(user_turns) < 2:
            break
        left_out += user_turns[1]
        turns = turns[user_turns[1] :]  # the oldest exchange: up to the user's next message
    if room < 1:
        alone = len(engine.encode_chat([*head, {"role": "user", "content": ""}])) if head else 0
        if alone >= window:  # no message could be answered: the system message is what to shorten
            raise RequestError(
                f"the system message needs {alone} tokens with the chat template, and the model's window "
                f"is {window}: shorten it",
                "messages",
            )
        raise RequestError(
            f"this message needs {prompt} tokens with the chat template, and the model's window is "
            f"{window}: shorten it",
            "messages",
        )
    notes = []
    if left_out:
        notes.append(
            f"left out the oldest {left_out} messages: they no longer fit the model's {window}-token window"
        )
    if room < max_tokens:
        notes.append(f"reply shortened to {room} tokens, the room left in the model's {window}-token window")
    return [*head, *turns], min(max_tokens, room), notes


def reply(engine: Any, messages: list[dict[str, str]], **params: Any) -> Iterator[str]:
    """The assistant's reply to `messages` (already fitted), growing: each item is the text so far."""
    text = ""
    for piece in engine.stream_chat(messages, **params):
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
    print(
        f"chatting with {engine.name}: /reset forgets the conversation, /exit quits, Ctrl-C stops a reply",
        file=out,
    )
    while True:
        try:
            message = read("you> ").strip()
            unicode_text(message)
        except (EOFError, StopIteration):
            return 0
        except ValueError as exc:  # bytes that are not UTF-8: this message is unreadable, the chat goes on
            reason = (
                str(exc)
                if not isinstance(exc, UnicodeDecodeError)
                else f"holds bytes that are not UTF-8 ({exc.reason})"
            )
            print(f"error: this message {reason}; type it again", file=out, flush=True)
            continue
        if message in ("/exit", "/quit"):
            return 0
        if message == "/reset" or not message:
            history = opening(system) if message else history
            continue
        if message.startswith("/") and " " not in message:  # `/help`, a typo of a command: not for the model
            print(f"{message}: not a command (/reset forgets the conversation, /exit quits)", file=out)
            continue
        try:
            messages, max_tokens, notes = fit(engine, conversation(history, message), params["max_tokens"])
        except RequestError as exc:  # this message can't be answered; the conversation goes on
            print(f"error: {exc}", file=out, flush=True)
            continue
        for note in notes:
            print(f"({note})", file=out)
        print("assistant> ", end="", file=out, flush=True)
        text = ""
        try:
            for piece in reply(engine, messages, **{**params, "max_tokens": max_tokens}):
                print(piece[len(text) :], end="", file=out, flush=True)  # as it is generated
                text = piece
        except KeyboardInterrupt:  # Ctrl-C stops the reply (the engine cancels it), not the chat
            print(" [stopped]", end="", file=out)
        print(file=out, flush=True)
        if text:  # a stopped reply stays as far as it went, as it was shown
            history = [*messages, {"role": "assistant", "content": text}]  # what no longer fits stays out


def build_ui(
    engine: Any,
    title: str | None = None,
    system: str | None = None,
    temperature: float = DEFAULTS["temperature"],
    max_tokens: int = int(DEFAULTS["max_tokens"]),
    top_p: float = DEFAULTS["top_p"],
    **options: Any,
) -> Any:
    """A Gradio chat page over `engine` (temperature and length adjustable under the input, starting
    at the values given; every conversation opens with `system`, if given). `options` are more
    SamplingParams fields (`OPTIONS`), the same for every reply."""
    try:
        import gradio as gr
    except ImportError as exc:
        raise MissingExtraError('gym chat --ui needs Gradio: pip install -e ".[ui]"') from exc

    def respond(
        message: str, history: list[dict[str, Any]], temperature: float, max_tokens: int
    ) -> Iterator[str]:
        try:
            messages, fitted, notes = fit(
                engine, conversation([*opening(system), *answered(history)], message), max_tokens
            )
        except RequestError as exc:  # a pop-up, and the conversation goes on without this message
            # Not gr.Error: raised inside ChatInterface's generator it leaves the textbox disabled for good
            # (Gradio 6.31) and prints a traceback, for a mistake of the user's.
            gr.Warning(str(exc))
            return
        for note in notes:
            gr.Info(note)
        yield from reply(engine, messages, temperature=temperature, max_tokens=fitted, top_p=top_p, **options)

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

    parser = ArgumentParser(prog="gym chat", description=__doc__.splitlines()[0], epilog=epilog("chat"))
    parser.add_argument("--model", required=True, help="Registry name, model directory or models:/ URI.")
    parser.add_argument("--template", default=None, help="Chat template (default: the model's).")
    parser.add_argument("--ui", action="store_true", help="Open a Gradio web chat instead of the terminal.")
    parser.add_argument("--host", default="127.0.0.1", help="--ui: interface to listen on.")
    # Gradio needs a fixed port: 0 (any free one, as `gym serve` takes it) means nothing to it.
    parser.add_argument("--port", type=port(any_free=False), default=7860, help="--ui: port.")
    parser.add_argument(
        "--temperature", type=float, default=DEFAULTS["temperature"], help="Sampling temperature."
    )
    parser.add_argument(
        "--max-tokens",
        type=whole_number(1, None, "a whole number of tokens, at least 1"),
        default=DEFAULTS["max_tokens"],
        help="Longest reply, in tokens.",
    )
    parser.add_argument("--top-p", type=float, default=DEFAULTS["top_p"], help="Nucleus sampling mass.")
    for flag, field, kind, text in OPTIONS:
        parser.add_argument(flag, dest=field, type=kind, default=None, help=text)
    parser.add_argument("--system", default=None, help="System message every conversation opens with.")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="Run Python code from the model repository."
    )
    return parser


def _check_sampling(params: dict[str, Any]) -> None:
    """Sampling flags out of range stop here, naming the flag (before the model loads), by the same
    rules the server applies to a request."""
    from pydantic import ValidationError

    from gym.cli_options import flag_error
    from gym.serve.params import SamplingParams

    try:
        SamplingParams(**params)
    except ValidationError as exc:
        raise flag_error(exc) from None


def cmd_chat(argv: Sequence[str]) -> int:
    from gym.cli_llamafactory_tools import translate

    parser = build_parser()
    args = parser.parse_args(translate("chat", argv, parser))
    if args.system is not None:
        try:
            unicode_text(args.system)
        except ValueError as exc:
            parser.error(f"--system {exc}")
    if args.ui:
        import importlib.util

        if importlib.util.find_spec("gradio") is None:  # before the model loads
            raise MissingExtraError('gym chat --ui needs Gradio: pip install -e ".[ui]"')
        from gym.serve.server import bind

        bind(args.host, args.port, hint="choose another --port").close()  # a busy port: before the model
    from gym.serve.engine import Engine

    params = {"temperature": args.temperature, "max_tokens": args.max_tokens, "top_p": args.top_p}
    params |= {field: getattr(args, field) for _, field, _, _ in OPTIONS if getattr(args, field) is not None}
    _check_sampling(params)
    with Engine.load(args.model, template=args.template, trust_remote_code=args.trust_remote_code) as engine:
        if args.ui:
            page = build_ui(engine, system=args.system, **params)
            print(f"gym chat: {engine.name} on a Gradio page (Ctrl-C stops it)", file=sys.stderr, flush=True)
            page.launch(server_name=args.host, server_port=args.port)
            return 0
        return terminal(engine, system=args.system, **params)
