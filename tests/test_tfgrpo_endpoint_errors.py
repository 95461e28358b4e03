"""An endpoint that answers, but is no OpenAI-compatible API: `python -m http.server` answers every POST
with 501, other web servers a POST to a route they lack with 404 or 405. Each call was retried with
backoff (501 is a 5xx), then the run went on through its held-out evaluations, every call failing the
same way: a one-step run took minutes to say "check that the endpoint is up and reachable". Now the
first answer stops it, in one line naming the endpoint (without credentials) and what to point it at,
and no call is sent after it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gym.tfgrpo.clients import EndpointDown, EndpointError, LLMError, OpenAIClient, refusal
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question
from gym.tfgrpo.engine import train
from gym.tfgrpo.runtime import Runtime
from gym.tfgrpo.sim import SimEnv, SimOptimizer, SimPolicy, default_settings
from tests.tfgrpo_fakes import FakeEndpoint

MSG = [{"role": "user", "content": "2+2?"}]
NOT_AN_API = "is not an OpenAI-compatible API: POST "


class FileServer:
    """The standard library's static file server (what `python -m http.server` runs) on loopback, counting
    the POSTs it got; `post_status` answers them instead of the stdlib's 501 (a server without the route)."""

    def __init__(self, root: Path, post_status: int | None = None) -> None:
        self.root, self.post_status, self.posts = root, post_status, 0
        self._lock = threading.Lock()

    def __enter__(self) -> str:
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(server.root), **kwargs)

            def log_message(self, *args: Any) -> None:
                pass

            def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
                if getattr(self, "command", None) == "POST":  # counted before the client reads the answer
                    with server._lock:
                        server.posts += 1
                super().send_error(code, message, explain)

        class Refusing(Handler):
            def do_POST(self) -> None:
                self.send_error(server.post_status or 501)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler if self.post_status is None else Refusing)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[tuple[FileServer, str]]:
    (tmp_path / "index.html").write_text("<h1>files</h1>")
    server = FileServer(tmp_path)
    with server as url:
        yield server, url


def ask(client: OpenAIClient) -> None:
    client.complete(MSG, temperature=0.5, max_tokens=8, seed=0)


@pytest.mark.parametrize("status", [None, 404, 405])
def test_a_web_server_without_the_api_is_asked_once_and_named_in_one_line(tmp_path, status):
    server = FileServer(tmp_path, post_status=status)
    with server as url:
        client = OpenAIClient(url, "gym-tiny", max_retries=4)
        with pytest.raises(EndpointError) as first:
            ask(client)
        with pytest.raises(EndpointError) as again:  # sends nothing: no answer could differ
            ask(client)
    message = str(first.value)
    assert message == str(again.value) and "\n" not in message
    assert message.startswith(f"{url} {NOT_AN_API}{url}/chat/completions answered HTTP {status or 501} ")
    assert "--endpoint" in message and "/v1" in message
    assert server.posts == 1


def test_no_retry_and_no_second_request_on_a_permanent_answer(file_server):
    server, url = file_server
    client = OpenAIClient(url, "gym-tiny", max_retries=4)
    for _ in range(3):
        with pytest.raises(EndpointError, match="HTTP 501 Unsupported method"):
            ask(client)
    assert server.posts == 1  # it was 5 per call: the openai package retries every 5xx


def test_a_model_the_endpoint_does_not_serve_is_named():
    """An OpenAI-compatible server's 404 for an unknown model is as permanent, and says what to change."""
    error = {"error": {"message": "The model `gpt-x` does not exist", "code": "model_not_found"}}
    endpoint = FakeEndpoint(lambda body: (404, {}, error))
    with endpoint as url:
        client = OpenAIClient(url, "gpt-x", max_retries=4)
        for _ in range(2):
            with pytest.raises(EndpointError, match=r"does not serve the model 'gpt-x' \(HTTP 404 The model"):
                ask(client)
    assert len(endpoint.requests) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_stops_at_the_first_call(monkeypatch, status):
    """A key the server refuses fails every call the same way: said once, naming the variable, never
    the key."""
    monkeypatch.setenv("MY_LLM_KEY", "sk-not-accepted-42")
    error = {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}
    endpoint = FakeEndpoint(lambda body: (status, {}, error))
    with endpoint as url:
        client = OpenAIClient(url, "m", api_key_env="MY_LLM_KEY", max_retries=4)
        for _ in range(3):
            with pytest.raises(EndpointError) as e:
                ask(client)
    message = str(e.value)
    assert f"refused the API key in $MY_LLM_KEY for the model 'm' (HTTP {status} Incorrect" in message
    assert "sk-not-accepted-42" not in message and "--api_key_env" in message
    assert len(endpoint.requests) == 1


def outcomes(client: OpenAIClient, calls: int) -> list[str]:
    seen = []
    for _ in range(calls):
        try:
            ask(client)
            seen.append("ok")
        except EndpointDown:
            seen.append("down")
        except LLMError:
            seen.append("failed")
    return seen


def test_a_call_no_server_answered_stops_the_calls_after_it():
    """No answer after the client's retries (a gateway's 503 here; no connection alike): the server is
    gone, so later calls send nothing and say so."""
    script = iter([200, 500, 503])

    def answer(body: dict[str, Any]) -> Any:
        status = next(script)
        return (status, {}, {"error": {"message": "no backend"}}) if status != 200 else "4"

    endpoint = FakeEndpoint(answer)
    with endpoint as url:
        client = OpenAIClient(url, "m", max_retries=0)
        assert outcomes(client, 5) == ["ok", "failed", "down", "down", "down"]  # a 500 is one request's
    assert len(endpoint.requests) == 3
    with pytest.raises(EndpointDown) as e:
        ask(client)
    message = str(e.value)
    assert message.startswith(f"{url} stopped answering: a call got no answer after its retries (")
    assert "503" in message and "run the same command again" in message and "\n" not in message


def test_timeouts_stop_the_calls_after_as_many_in_a_row_as_can_be_in_flight():
    """A server can be slow for one request: a timeout fails that call only, but as many in a row as can be
    in flight at once, none answered between, is a server that no longer answers."""
    slow = iter([True, True, False, True, True, True])

    def answer(body: dict[str, Any]) -> str:
        if next(slow):
            time.sleep(2.0)
        return "4"

    endpoint = FakeEndpoint(answer)
    with endpoint as url:
        client = OpenAIClient(url, "m", max_retries=0, concurrency=3, timeout_s=0.6)
        assert outcomes(client, 7) == ["failed", "failed", "ok", "failed", "failed", "down", "down"]
    assert len(endpoint.requests) == 6
    with pytest.raises(
        EndpointDown, match="the last 3 calls in a row timed out, each after its retries"
    ) as e:
        ask(client)
    assert "if it is only slow, raise the role's timeout of 0.6 s: --policy.timeout_s" in str(e.value)


def test_a_run_whose_endpoint_dies_stops_at_once_and_resumes_when_it_is_back(tmp_path):
    """The endpoint answers 40 calls, then nothing listens at its URL. Every remaining call of the run was
    retried with backoff and failed (69 s for a 20-question run, ~20 min for the papers' default), then
    the run ended saying none of its step calls was answered. Now it stops within the calls in flight;
    run again with the server back at the URL, it asks nothing it had an answer to and ends with the
    library of a run that never lost its server."""
    env = SimEnv(seed=3, families=4, train_per_family=3, eval_per_family=2)
    policy, optimizer = SimPolicy(env), SimOptimizer()
    settings = default_settings(seed=3).model_copy(update={"epochs": 2, "batch_size": 4, "group_size": 3})
    train_q, eval_q = env.questions()

    def answer(body: dict[str, Any]) -> list[str]:
        client = policy if body["model"] == "policy" else optimizer
        reply = client.complete(body["messages"], temperature=0, max_tokens=1, seed=body["seed"], n=body["n"])
        return reply.texts

    def run(url: str, name: str) -> Any:
        clients = {
            role: OpenAIClient(url, role, max_retries=1, concurrency=4) for role in ("policy", "optimizer")
        }
        home = tmp_path / name
        rt = Runtime(settings, model=None, run_dir=home, clients=clients, cache_dir=home / "calls")
        return train(rt, train_q, eval_q)

    with FakeEndpoint(answer) as url:
        reference = run(url, "reference")

    once = threading.Lock()

    def dies(body: dict[str, Any]) -> list[str]:
        if len(first.requests) >= 40 and once.acquire(blocking=False):
            threading.Thread(target=first.__exit__, args=(None, None, None)).start()
        return answer(body)

    first = FakeEndpoint(dies)
    url = first.__enter__()
    with pytest.raises(EndpointDown, match="stopped answering"):
        run(url, "run")
    assert len(first.requests) <= 40 + 4  # nothing sent after the death but the calls then in flight
    back = FakeEndpoint(answer, port=int(url.split(":")[-1].split("/")[0]))
    with back as again:
        assert again == url
        resumed = run(url, "run")
    answered = {json.dumps(r, sort_keys=True) for r in first.completed[:40]}
    assert len(answered) >= 30 and not answered & {json.dumps(r, sort_keys=True) for r in back.requests}
    assert resumed.library_hash == reference.library_hash and resumed.mean_at_k == reference.mean_at_k


def test_the_endpoint_is_named_without_credentials():
    url = "https://user:sk-secret-123@llm.example.com/v1?api_key=abc123"
    message = refusal(url, "m", 501, "Not Implemented", "")
    assert "sk-secret-123" not in message and "abc123" not in message
    assert message.startswith("https://***@llm.example.com/v1") and NOT_AN_API in message


def test_a_run_stops_at_its_first_call_with_the_error(file_server, tmp_path):
    """The engine (gym.train / GRPOTrainer) with held-out questions: nothing after the first refusal."""
    server, url = file_server
    questions = [
        Question(id=str(i), prompt=[{"role": "user", "content": f"q{i}"}], answer="7") for i in range(6)
    ]
    settings = TfGrpoSettings(endpoint=url, group_size=3, epochs=2, batch_size=3, reward="numeric")
    rt = Runtime(settings, model="gym-tiny", run_dir=tmp_path / "run", cache_dir=tmp_path / "calls")
    with pytest.raises(EndpointError, match=NOT_AN_API):
        train(rt, questions, eval_questions=questions)
    # the calls in flight when the first answer came (at most the endpoint's concurrency, 8) and no other:
    # it was 5 attempts for each of the run's ~70 calls
    assert 1 <= server.posts <= 8
    assert not (rt.run_dir / "steps").exists() and not (rt.run_dir / "result.json").exists()


@pytest.mark.slow
def test_gym_train_fails_in_one_line_and_returns(prefect_server, file_server, tmp_path, capsys):
    """The flow, with held-out evaluations running beside the steps: exit 2 and the one-line error."""
    from flows.cli import main

    server, url = file_server
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(f'{{"question": "{i}+{i}?", "answer": "{2 * i}"}}\n' for i in range(8)))
    argv = f"train --method tf_grpo --endpoint {url} --model gym-tiny --dataset {data} --eval_dataset {data}"
    assert main([*argv.split(), "--json"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: {url} {NOT_AN_API}") and "HTTP 501" in last
    assert 1 <= server.posts <= 8
