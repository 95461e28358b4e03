"""`gym serve`: an OpenAI-compatible API over a registry model, model directory or MLflow model URI.

    gym serve --model gym-tiny --host 127.0.0.1 --port 8000 [--api-key-env GYM_API_KEY]
    gym serve --model models:/gym-tiny-sft@champion --port 0          # any free port, printed
    gym serve --model ./out --template chatml --limits.max_concurrent 16
    gym serve inference.yaml --port 0       # LLaMA-Factory's inference YAML (gym/cli_llamafactory_tools.py)

Serves until SIGINT or SIGTERM, then finishes the requests in progress (for up to --shutdown-timeout
seconds, if given) and exits with status 0.
The key is read from the environment variable `--api-key-env` names, never from the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gym.cli_options import ArgumentParser, add_config_options, flag_error, overrides_from
from gym.errors import ConfigError
from gym.serve.settings import ServeSettings

if TYPE_CHECKING:
    from gym.tfgrpo.injection import ShippedLibrary


def build_parser(prog: str = "gym serve") -> argparse.ArgumentParser:
    from gym.cli_llamafactory_tools import epilog

    parser = ArgumentParser(prog=prog, description=ServeSettings.__doc__, epilog=epilog("serve"))
    add_config_options(parser, ServeSettings)
    return parser


def parse_settings(argv: Sequence[str], prog: str = "gym serve") -> ServeSettings:
    args = build_parser(prog).parse_args(argv)
    try:
        return ServeSettings.model_validate(overrides_from(args, ServeSettings))
    except ValidationError as exc:
        raise flag_error(exc, dashes=False) from exc


def api_key(env_var: str | None) -> str | None:
    """The key from `env_var` (None when no variable is named). A variable that is not set, is empty, or
    holds whitespace around the key is an error: HTTP drops the whitespace around a header's value, so no
    client could send such a key and every request would get a 401. The key itself is never shown."""
    if env_var is None:
        return None
    key = os.environ.get(env_var)
    if key is None:
        raise ConfigError(
            f"--api-key-env {env_var}: that environment variable is not set (export the key in it)"
        )
    if not key.strip():
        what = "holds only whitespace" if key else "is empty"
        raise ConfigError(f"--api-key-env {env_var}: that environment variable {what} (export the key in it)")
    if key != key.strip():
        raise ConfigError(
            f"--api-key-env {env_var}: that environment variable holds leading or trailing whitespace, which "
            "HTTP drops from the Authorization header a client sends: every request would be refused (401). "
            "Export the key without it"
        )
    return key


def experience_line(library: ShippedLibrary) -> str:
    """The startup line of a TF-GRPO model: the library its chat requests get, and how much of it."""
    k = library.retrieval_top_k
    which = (
        f"the {k} most similar to each request's question (retrieval_top_k {k})"
        if library.retrieves
        else "all of them"
    )
    return (
        f"TF-GRPO experience library: {len(library.texts)} experiences (version {library.version}, hash "
        f"{(library.hash or '?')[:12]}), injected into every chat request's system message: {which}"
    )


def cmd_serve(argv: Sequence[str]) -> int:
    from gym.cli_llamafactory_tools import translate

    settings = parse_settings(translate("serve", argv, build_parser()))
    key = api_key(settings.api_key_env)
    if settings.backend != "transformers":
        from gym.serve.backends import exec_backend

        return exec_backend(settings, key)
    from gym.serve.app import build_app
    from gym.serve.engine import Engine
    from gym.serve.server import bind, run

    sock = bind(settings.host, settings.port)  # a busy port fails before the model loads
    engine = Engine.load(
        settings.model,
        template=settings.template,
        name=settings.served_model_name,
        trust_remote_code=settings.trust_remote_code,
        max_batch_size=settings.max_batch_size,
        system=settings.system,
    )

    def ready(url: str) -> None:
        auth = f", bearer key from ${settings.api_key_env}" if key else ""
        print(f"gym serve: {engine.name} at {url}/v1 (OpenAI-compatible{auth}); Ctrl-C stops", flush=True)
        # where its tokenizer is, for clients that tokenize themselves (lm-eval's `tokenizer=`)
        print(f"  model files: {engine.source}", flush=True)
        if engine.library is not None:  # a TF-GRPO model: what every chat prompt gets
            print(f"  {experience_line(engine.library)}", flush=True)

    try:
        app = build_app(engine, settings.limits, key, settings.completion_experiences)
        run(app, sock, on_ready=ready, shutdown_timeout=settings.shutdown_timeout)
    finally:
        engine.close()
    print("gym serve: stopped", file=sys.stderr, flush=True)
    return 0
