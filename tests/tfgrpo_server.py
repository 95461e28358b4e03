"""Test fixture: a small OpenAI-compatible server (FastAPI + uvicorn, real HTTP on loopback) over a
local model, until `gym serve` lands on main. `/v1/chat/completions` only: n, seed, temperature,
max_tokens, usage. Not product code.

    with TinyServer(model_ref) as url:
        OpenAIClient(url, "gym-tiny").complete(...)
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from gym.tfgrpo.clients import LocalClient


class TinyServer:
    def __init__(self, model: Any) -> None:
        self.client = LocalClient(model)
        self.requests = 0

    def app(self) -> Any:
        from fastapi import FastAPI

        app = FastAPI()

        @app.post("/v1/chat/completions")
        def chat(body: dict[str, Any]) -> dict[str, Any]:
            self.requests += 1
            n = int(body.get("n") or 1)
            done = self.client.complete(
                body["messages"],
                temperature=float(body.get("temperature", 1.0)),
                max_tokens=int(body.get("max_tokens") or 32),
                seed=int(body.get("seed") or 0),
                n=n,
            )
            return {
                "id": f"chatcmpl-{self.requests}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "choices": [
                    {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "length"}
                    for i, t in enumerate(done.texts)
                ],
                "usage": {
                    "prompt_tokens": done.usage.prompt_tokens,
                    "completion_tokens": done.usage.completion_tokens,
                    "total_tokens": done.usage.total,
                },
            }

        return app

    def __enter__(self) -> str:
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app(), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
