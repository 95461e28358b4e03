"""QA findings on serving, each over real components: the Gradio chat pages (gym chat --ui and the
Space gym deploy writes) in headless Chromium, and the API as a real `gym serve` process or over real
HTTP with the official `openai` client."""

from __future__ import annotations

import os
import re
import runpy
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gym.chat import build_ui
from gym.serve.app import build_app
from gym.serve.engine import Engine
from gym.serve.server import bind, serve_in_thread
from gym.space import write_space
from tests.conftest import REPO
from tests.serve_fixtures import CHROMIUM, CHROMIUM_FLAGS, module_noisy_tiny

pytestmark = pytest.mark.xdist_group("serve-qa")  # one engine and server for the module

KEY = "qa-secret-key-31337"
NAME = "tiny"
TOO_LONG = "word " * 600  # gym-tiny's window is 512 tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_noisy_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Engine]:
    with Engine.load(str(model_dir), name=NAME) as e:
        yield e


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with serve_in_thread(build_app(engine, api_key=KEY)) as base:
        yield base


@pytest.fixture()
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


class Spy:
    """The real engine, recording the conversation each reply was asked for."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.calls: list[list[dict[str, str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def stream_chat(self, messages: list[dict[str, str]], **params: Any) -> Any:
        self.calls.append(list(messages))
        return self.engine.stream_chat(messages, **params)


def free_port() -> int:
    probe = bind("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    return port


def chat_in_browser(port: int, title: str) -> None:
    """Send a message too long for the window, see the warning, then send `hello` and see a reply."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/", wait_until="domcontentloaded")
            expect(page.get_by_text(title)).to_be_visible(timeout=60_000)
            box = page.locator("textarea").first
            box.fill(TOO_LONG)
            box.press("Enter")
            expect(page.get_by_text(re.compile(r"512.*shorten it")).first).to_be_visible(timeout=30_000)
            expect(box).to_be_enabled(timeout=30_000)  # it stayed disabled for good after gr.Error
            box.fill("hello")
            box.press("Enter")
            expect(page.locator('[data-testid="user"]').last).to_have_text("hello", timeout=30_000)
            bot = page.locator('[data-testid="bot"]').first
            expect(bot).to_have_attribute("aria-label", re.compile(r"^bot's message: \S"), timeout=60_000)
            expect(box).to_be_enabled(timeout=30_000)
        finally:
            browser.close()


@pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_web_chat_warns_of_a_message_too_long_and_answers_the_next(engine, monkeypatch, capfd):
    """gr.Error raised in ChatInterface's generator left the textbox disabled (Gradio 6.31) until a
    reload, losing the conversation, and printed a traceback for the user's mistake."""
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    spy, port = Spy(engine), free_port()
    demo = build_ui(spy, temperature=0.0, max_tokens=12)
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        chat_in_browser(port, "gym chat: tiny")
    finally:
        demo.close()
    assert spy.calls == [[{"role": "user", "content": "hello"}]], "the refused message is left out"
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_a_refused_message_gradio_keeps_is_left_out_of_the_next_prompt(engine, capsys):
    """The page keeps a refused message (no reply follows it) in its history; the next message's
    conversation leaves it out rather than fitting it out of the window with a 'left out' note."""
    spy = Spy(engine)
    demo = build_ui(spy, temperature=0.0, max_tokens=12)
    with pytest.warns(UserWarning, match="the model's window is 512: shorten it"):  # gr.Warning off a page
        assert list(demo.fn(TOO_LONG, [], 0.0, 12)) == []
    history = [{"role": "user", "content": [{"type": "text", "text": TOO_LONG}]}]
    *_, last = demo.fn("hello", history, 0.0, 12)
    assert last and spy.calls == [[{"role": "user", "content": "hello"}]]
    assert "left out" not in capsys.readouterr().out


@pytest.fixture()
def space_app(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The Space's app.py as gym deploy writes it, run against the noisy model's folder."""
    write_space(tmp_path / "space", NAME, str(model_dir), None, None)
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    monkeypatch.delenv("MODEL_ID", raising=False)
    return runpy.run_path(str(tmp_path / "space" / "app.py"), run_name="space_app")


@pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_deployed_space_warns_of_a_message_too_long_and_answers_the_next(space_app, capfd):
    port, demo = free_port(), space_app["demo"]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        chat_in_browser(port, f"Chat with {NAME}")
    finally:
        demo.close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_the_spaces_next_prompt_leaves_out_the_refused_message(space_app):
    with pytest.warns(UserWarning, match="too long for the model's 512-token window: shorten it"):
        assert list(space_app["respond"](TOO_LONG, [], 0, 12)) == []
    expected = [{"role": "user", "content": "hello"}]
    for history in (
        [{"role": "user", "content": [{"type": "text", "text": TOO_LONG}]}],  # Gradio 6
        [[TOO_LONG, None]],  # Gradio 5's pairs
    ):
        assert space_app["conversation"](history, "hello") == expected
    *_, reply = space_app["respond"]("hello", [[TOO_LONG, None]], 0, 12)
    assert reply == list(space_app["respond"]("hello", [], 0, 12))[-1]


def test_hide_query_values_blanks_every_value():
    from gym.serve.server import hide_query_values

    assert hide_query_values("/v1/models?api_key=sk-1&x=2") == "/v1/models?api_key=***&x=***"
    assert hide_query_values("/v1/models?sk-1") == "/v1/models?***"
    assert hide_query_values("/v1/models") == "/v1/models"
    assert hide_query_values("not a path?a=1") == "not a path?a=1"


def test_a_key_sent_in_the_query_string_never_reaches_the_servers_log(gym_home):
    """uvicorn's access log printed the path with its query string: `?api_key=KEY` put the key in the log."""
    env = {**os.environ, "GYM_QA_KEY": KEY, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "flows.cli", "serve", "--model", "gym-tiny", "--port", "0"]
    cmd += ["--api-key-env", "GYM_QA_KEY", "--served-model-name", NAME]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the socket listens
        assert " at http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        base = line.split(" at ", 1)[1].split()[0]
        assert httpx.get(f"{base}/models", params={"api_key": KEY}).status_code == 401
        bearer = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{base}/models", params={"api_key": KEY, "x": "1"}, headers=bearer).is_success
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    log = out + err
    assert KEY not in log
    assert '"GET /v1/models?api_key=*** HTTP/1.1" 401' in log, log  # the request is still logged
    assert '"GET /v1/models?api_key=***&x=*** HTTP/1.1" 200' in log, log


SAY_X = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "modalities", ["text", "audio"]),
        ("/v1/chat/completions", "audio", {"voice": "alloy", "format": "wav"}),
        ("/v1/chat/completions", "reasoning_effort", "low"),
        ("/v1/chat/completions", "prediction", {"type": "content", "content": "x"}),
        ("/v1/chat/completions", "web_search_options", {}),
        ("/v1/chat/completions", "documents", [{"title": "a", "text": "b"}]),
        ("/v1/chat/completions", "guided_decoding_backend", "xgrammar"),
        ("/v1/chat/completions", "guided_json", {"type": "object"}),
        ("/v1/completions", "max_completion_tokens", 3),  # chat's field, which completions lack
        ("/v1/completions", "max_token", 3),  # a typo did nothing, silently
    ],
)
def test_a_field_the_server_does_not_implement_gets_a_400_naming_it(client, path, field, value):
    body: dict[str, Any] = {"messages": SAY_X} if path.endswith("chat/completions") else {"prompt": "x"}
    create = client.chat.completions.create if "messages" in body else client.completions.create
    with pytest.raises(openai.BadRequestError) as caught:
        create(model=NAME, max_tokens=2, **body, extra_body={field: value})
    error = caught.value
    assert error.status_code == 400 and error.param == field and error.type == "invalid_request_error"
    assert error.body["message"] == f"{field} is not supported by this server; leave it unset"


def test_fields_that_change_nothing_generated_are_accepted(client):
    """What the openai client sends for accounting and storage (README: `user`...), text-only
    modalities, and null for any field (it asks for nothing)."""
    reply = client.chat.completions.create(
        model=NAME,
        messages=SAY_X,
        max_tokens=2,
        user="u-1",
        store=False,
        metadata={"run": "qa"},
        service_tier="auto",
        parallel_tool_calls=False,
        extra_body={"modalities": ["text"], "reasoning_effort": None, "safety_identifier": "s"},
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    text = client.completions.create(model=NAME, prompt="x", max_tokens=2, user="u-1")
    assert text.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("max_tokens", True, "a valid integer"),
        ("max_tokens", "5", "a valid integer"),
        ("max_tokens", 5.0, "a valid integer"),
        ("n", True, "a valid integer"),
        ("seed", "7", "a valid integer"),
        ("stream", "yes", "a valid boolean"),
        ("stream", 1, "a valid boolean"),
        ("temperature", "0.5", "a valid number"),
        ("temperature", True, "a valid number"),
        ("logprobs", 1, "a valid boolean"),
    ],
)
def test_a_value_of_the_wrong_type_gets_a_400_naming_the_field(url, field, value, says):
    """Each was coerced and served: `true` as 1, `"5"` as 5, `"yes"` turned streaming on."""
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": NAME, "messages": SAY_X, "max_tokens": 2, field: value}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and error["message"] == f"{field}: Input should be {says}"
    assert error["type"] == "invalid_request_error"


def test_wrong_types_inside_objects_and_on_completions_get_a_400_too(url):
    headers = {"Authorization": f"Bearer {KEY}"}
    chat = {"model": NAME, "messages": SAY_X, "max_tokens": 2}
    for path, body, param in (
        ("/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": "yes"}},
         "stream_options.include_usage"),
        ("/v1/completions", {"model": NAME, "prompt": "x", "logprobs": True}, "logprobs"),
        ("/v1/completions", {"model": NAME, "prompt": "x", "echo": "true"}, "echo"),
        ("/v1/completions", {"model": NAME, "prompt": [True, 5]}, "prompt"),
        ("/v1/completions", {"model": NAME, "prompt": [5.0, 6.0]}, "prompt"),
    ):  # fmt: skip
        r = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, r.text
        if param == "prompt":
            assert r.json()["error"]["message"] == (
                "prompt: send text, a list of texts, a list of token ids (integers) or a list of such lists"
            )


def test_an_integer_is_a_number_and_token_ids_are_a_prompt(url):
    """Strict types keep what OpenAI takes: an integer where a number goes, token ids as a prompt."""
    headers = {"Authorization": f"Bearer {KEY}"}
    for path, body in (
        ("/v1/chat/completions", {"messages": SAY_X, "temperature": 1, "top_p": 1, "presence_penalty": 0}),
        ("/v1/completions", {"prompt": [5, 6, 7], "logit_bias": {"5": 1}, "echo": False, "logprobs": 1}),
    ):
        sent = {"model": NAME, "max_tokens": 2, "seed": 3, **body}
        r = httpx.post(f"{url}{path}", json=sent, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
