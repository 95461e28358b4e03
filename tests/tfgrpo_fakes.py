"""Test fixtures for TF-GRPO: an OpenAI-compatible HTTP server on loopback whose answers come from a
Python function of the request (a stand-in for a remote LLM API, which cannot run here).

Only for what a real model cannot give a unit test: scripted replies (valid operations, junk then a
repair), answers completing in random order, 429/5xx and slow replies for the client's retries and
timeouts, a policy that sometimes succeeds (the simulated environment's), injected latency for the
benchmark. Tests of a real model over HTTP use gym's own server (gym.serve), see test_tfgrpo_http.py.

    with FakeEndpoint(answer) as url:        # answer(request_json) -> str | (status, headers, body)
        OpenAIClient(url, "fake").complete(...)
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[dict[str, Any]], Any]


class _Server(ThreadingHTTPServer):
    # The stdlib's listen backlog is 5: a burst of concurrent connections would wait for TCP's
    # 1-second SYN retry. Real servers (uvicorn: 2048) take the burst.
    request_queue_size = 256


class FakeEndpoint:
    """A real HTTP server (`/v1/chat/completions`) on 127.0.0.1 and a free port."""

    def __init__(
        self,
        answer: Answer,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        port: int = 0,
        models: Callable[[], tuple[int, dict[str, Any]]] | None = None,
    ) -> None:
        """`models`: what GET /v1/models answers, as (status, body) (it may sleep first); None: 501."""
        self.answer, self.latency_s, self.jitter_s, self.port = answer, latency_s, jitter_s, port
        self.models = models
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.completed: list[dict[str, Any]] = []  # in the order the answers went out
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._rng = random.Random()  # deliberately unseeded: completion order varies run to run

    def __enter__(self) -> str:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if endpoint.models is None or not self.path.endswith("/models"):
                    self.send_error(501)
                    return
                status, payload = endpoint.models()
                data = json.dumps(payload).encode()
                with contextlib.suppress(OSError):  # the client may have given up waiting
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint._lock:
                    endpoint.requests.append(body)
                    endpoint.headers.append({k.lower(): v for k, v in self.headers.items()})
                    endpoint.in_flight += 1
                    endpoint.max_in_flight = max(endpoint.max_in_flight, endpoint.in_flight)
                    delay = endpoint.latency_s + endpoint._rng.random() * endpoint.jitter_s
                try:
                    time.sleep(delay)
                    status, headers, payload = endpoint.reply(body)
                finally:
                    with endpoint._lock:
                        endpoint.in_flight -= 1
                        endpoint.completed.append(body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = _Server(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
        out = self.answer(body)
        if isinstance(out, tuple):
            return out
        texts = out if isinstance(out, list) else [out] * int(body.get("n") or 1)
        prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
        return 200, {}, completion(texts, prompt_tokens)


def completion(texts: list[str], prompt_tokens: int = 1) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
            for i, t in enumerate(texts)
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sum(len(t.split()) for t in texts),
            "total_tokens": prompt_tokens + sum(len(t.split()) for t in texts),
        },
    }
