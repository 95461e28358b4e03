"""Serving: an OpenAI-compatible HTTP API (FastAPI + uvicorn) over a batching engine that other code
can also use in-process.

    gym serve --model gym-tiny --port 8000 [--api-key-env GYM_API_KEY]      # the command
    from gym.serve import Engine; Engine.load("gym-tiny").chat(messages, max_tokens=32)

engine.py (batching scheduler), requests.py (events, per-row stops and streaming),
sampling.py (per-row sampling), params.py (SamplingParams),
loading.py (model + chat template), protocol.py (OpenAI bodies), app.py (routes, auth, caps),
server.py (uvicorn runner), cli.py (`gym serve`), backends.py (vLLM / SGLang when installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym.serve.params import SamplingParams

if TYPE_CHECKING:
    from gym.serve.engine import Engine

__all__ = ["Engine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    # The engine imports torch and transformers: only when it is used.
    if name == "Engine":
        from gym.serve.engine import Engine

        return Engine
    raise AttributeError(name)
