"""`gym chat`: the terminal loop keeps the conversation, and the Gradio page answers in headless Chromium."""

from __future__ import annotations

import io

import pytest

from gym.chat import build_ui, terminal
from gym.serve.engine import Engine
from gym.serve.server import bind
from tests.serve_fixtures import CHROMIUM, CHROMIUM_FLAGS, noisy_tiny


@pytest.fixture()
def engine(gym_home, tmp_path):
    with Engine.load(str(noisy_tiny(tmp_path / "noisy")), name="tiny") as e:
        yield e


def test_terminal_chat_answers_with_the_whole_conversation(engine):
    lines = iter(["name a river", "and a mountain", "/exit"])
    out = io.StringIO()
    assert terminal(engine, read=lambda _prompt: next(lines), out=out, temperature=0, max_tokens=12) == 0
    replies = [line.removeprefix("assistant> ") for line in out.getvalue().splitlines()[1:]]
    first = engine.chat([{"role": "user", "content": "name a river"}], temperature=0, max_tokens=12)
    assert replies[0] == first.choices[0].text
    conversation = [
        {"role": "user", "content": "name a river"},
        {"role": "assistant", "content": replies[0]},
        {"role": "user", "content": "and a mountain"},
    ]
    second = engine.chat(conversation, temperature=0, max_tokens=12)
    assert (
        replies[1] == second.choices[0].text != engine.chat(conversation[-1:], temperature=0, max_tokens=12)
    )


class CtrlCOnce(io.StringIO):
    """The terminal: Ctrl-C arrives while the first reply is being written (after its first piece)."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces = 0

    def write(self, text: str) -> int:
        if "assistant> " in self.getvalue() and text:
            self.pieces += 1
            if self.pieces == 1:
                super().write(text)
                raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_stops_a_reply_and_the_chat_goes_on_and_slash_typos_are_not_sent(engine):
    """Ctrl-C during a reply ended gym chat (status 130); `/help` was sent to the model as a message."""
    lines = iter(["/help", "name a river", "and a mountain", "/exit"])
    out = CtrlCOnce()
    assert terminal(engine, read=lambda _prompt: next(lines), out=out, temperature=0, max_tokens=12) == 0
    shown = out.getvalue().splitlines()
    assert shown[1] == "/help: not a command (/reset forgets the conversation, /exit quits)"
    assert shown[2].startswith("assistant> ") and shown[2].endswith(" [stopped]")
    assert shown[3].startswith("assistant> ") and not shown[3].endswith("[stopped]")  # the chat went on


@pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian's chromium (apt-get install -y chromium)")
def test_the_web_chat_page_loads_takes_a_message_and_shows_a_reply(engine, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    probe = bind("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    demo = build_ui(engine)
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{port}/", wait_until="domcontentloaded")
            expect(page.get_by_text("gym chat: tiny")).to_be_visible(timeout=60_000)
            box = page.locator("textarea").first
            box.fill("hello there")
            box.press("Enter")
            expect(page.locator('[data-testid="user"]')).to_have_text("hello there", timeout=30_000)
            bot = page.locator('[data-testid="bot"]').first
            expect(bot).to_have_attribute("aria-label", _nonempty_reply(), timeout=60_000)
            assert bot.inner_text().strip()
            browser.close()
    finally:
        demo.close()


def _nonempty_reply():
    import re

    return re.compile(r"^bot's message: \S")


def test_the_web_chat_on_a_busy_port_fails_before_loading_the_model(gym_home, capsys):
    """Gradio's own error came as an OSError traceback, after the model had loaded; port 0 (which
    `gym serve` takes as any free port) means nothing to Gradio."""
    from flows.cli import main

    pytest.importorskip("gradio")
    busy = bind("127.0.0.1", 0)
    try:
        port = str(busy.getsockname()[1])
        assert main(["chat", "--ui", "--model", "no-such-model", "--port", port]) == 2
    finally:
        busy.close()
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use (choose another --port)" in (
        capsys.readouterr().err
    ), "the port is checked before the model is resolved"
    for bad in ("0", "70000", "x"):
        with pytest.raises(SystemExit):
            main(["chat", "--ui", "--model", "gym-tiny", "--port", bad])
        assert "a port from 1 to 65535" in capsys.readouterr().err


def test_sampling_flags_out_of_range_are_refused_before_the_model_loads(capsys):
    """Each was a pydantic traceback from the first message on."""
    from flows.cli import main

    for bad in ("0", "-3", "many"):
        with pytest.raises(SystemExit):
            main(["chat", "--model", "no-such-model", "--max-tokens", bad])
        assert "argument --max-tokens: a whole number of tokens, at least 1" in capsys.readouterr().err
    for flag, bad, says in (
        ("--temperature", "5", "less than or equal to 2 (got 5.0)"),
        ("--temperature", "-1", "greater than or equal to 0 (got -1.0)"),
        ("--top-p", "0", "greater than 0 (got 0.0)"),
        ("--temperature", "nan", "a finite number (got nan)"),
        ("--top-k", "-1", "greater than or equal to 0 (got -1)"),
        ("--min-p", "1.5", "less than or equal to 1 (got 1.5)"),
        ("--repetition-penalty", "0", "greater than 0 (got 0.0)"),
    ):
        assert main(["chat", "--model", "no-such-model", flag, bad]) == 2
        err = capsys.readouterr().err
        assert f"error: {flag}: Input should be {says}" in err and "no-such-model" not in err
    # A --system with bytes that are not UTF-8 (argv decodes them to lone surrogates)
    with pytest.raises(SystemExit):
        main(["chat", "--model", "no-such-model", "--system", b"be \xff".decode("utf-8", "surrogateescape")])
    assert "--system holds '\\udcff' at character 3, an unpaired surrogate" in capsys.readouterr().err


def test_top_k_min_p_and_repetition_penalty_flags_reach_every_reply(gym_home, tmp_path, monkeypatch):
    """`gym chat --top-k 1` (or --min-p 1) samples only the likeliest token: the reply at temperature 2 is
    the greedy one; --repetition-penalty gives the penalized greedy reply (the engine's, which
    tests/test_serve.py holds to transformers'). The flags were missing, and an inference YAML's top_k or
    repetition_penalty was refused."""
    import gym.chat
    from flows.cli import main

    model = str(noisy_tiny(tmp_path / "noisy"))
    message = "Once upon a time"
    real, seen = gym.chat.terminal, []

    def terminal(engine, **params):
        out, lines = io.StringIO(), iter([message, "/exit"])
        code = real(engine, read=lambda _prompt: next(lines), out=out, **params)
        seen.append(out.getvalue().splitlines()[1].removeprefix("assistant> "))
        return code

    monkeypatch.setattr(gym.chat, "terminal", terminal)

    def chat(*flags: str) -> str:
        assert main(["chat", "--model", model, "--max-tokens", "24", *flags]) == 0
        return seen[-1]

    greedy = chat("--temperature", "0")
    assert chat("--temperature", "2", "--top-k", "1") == greedy
    assert chat("--temperature", "2", "--min-p", "1") == greedy
    assert chat("--temperature", "2") != greedy  # so the two above were cut, not lucky
    penalized = chat("--temperature", "0", "--repetition-penalty", "1.8")
    with Engine.load(model) as engine:
        ask = [{"role": "user", "content": message}]
        expected = engine.chat(ask, temperature=0, max_tokens=24, repetition_penalty=1.8).choices[0].text
    assert penalized == expected != greedy


class Spy:
    """The real engine, recording what each reply was asked with."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def stream_chat(self, messages, **params):
        self.calls.append((list(messages), params["max_tokens"]))
        return self.engine.stream_chat(messages, **params)


def test_a_long_terminal_chat_leaves_out_its_oldest_exchanges_and_goes_on(engine):
    """gym-tiny's window is 512 tokens: a second 256-token reply used to end the chat with an error."""
    spy, window = Spy(engine), engine.context_length
    said = ["tell me a story", "go on", "and then?", "how does it end?"]
    lines = iter([*said, "/exit"])
    out = io.StringIO()
    assert terminal(spy, read=lambda _prompt: next(lines), out=out, temperature=0, max_tokens=200) == 0
    text = out.getvalue()
    assert "error" not in text and text.count("assistant> ") == len(said) == len(spy.calls)
    assert "(left out the oldest 2 messages: they no longer fit the model's 512-token window)" in text
    whole: list[dict] = []  # the conversation as it went, each reply as the engine gives it again
    for (messages, max_tokens), message in zip(spy.calls, said, strict=True):
        whole.append({"role": "user", "content": message})
        assert max_tokens == 200 and len(engine.encode_chat(messages)) + max_tokens <= window
        assert messages == whole[len(whole) - len(messages) :], "the newest messages, the oldest left out"
        assert messages[0]["role"] == "user"
        whole.append(
            {
                "role": "assistant",
                "content": engine.chat(messages, temperature=0, max_tokens=200).choices[0].text,
            }
        )
    assert min(len(m) for m, _ in spy.calls[1:]) < len(whole) - 1, "something was left out"


def test_a_message_too_long_for_the_window_is_an_error_and_the_chat_goes_on(engine):
    spy = Spy(engine)
    lines = iter(["word " * 600, "hello", "/exit"])
    out = io.StringIO()
    assert terminal(spy, read=lambda _prompt: next(lines), out=out, system="be brief", max_tokens=8) == 0
    text = out.getvalue()
    assert "error: this message needs" in text and "the model's window is 512: shorten it" in text
    assert [m for m, _ in spy.calls] == [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    ]


def test_undecodable_input_and_a_system_message_too_long_are_errors_and_the_chat_goes_on(engine):
    """Bytes that are not UTF-8 reach input() as lone surrogates (or a UnicodeDecodeError): the chat
    crashed on them. A system message too long for the window was blamed on every user message."""

    def read(lines):
        def next_line(_prompt: str) -> str:
            line = next(lines)
            if isinstance(line, BaseException):
                raise line
            return line

        return next_line

    spy = Spy(engine)
    bad_bytes = b"hi \xff there".decode("utf-8", "surrogateescape")
    undecodable = UnicodeDecodeError("utf-8", b"\xfe", 0, 1, "invalid start byte")
    lines = iter([bad_bytes, undecodable, "hello", "/exit"])
    out = io.StringIO()
    assert terminal(spy, read=read(lines), out=out, max_tokens=8) == 0
    text = out.getvalue()
    assert "error: this message holds '\\udcff' at character 3, an unpaired surrogate" in text
    assert "error: this message holds bytes that are not UTF-8 (invalid start byte)" in text
    assert [m for m, _ in spy.calls] == [[{"role": "user", "content": "hello"}]]
    out = io.StringIO()
    lines = iter(["hello", "/exit"])
    assert terminal(spy, read=read(lines), out=out, system="word " * 600, max_tokens=8) == 0
    assert "error: the system message needs" in out.getvalue() and "this message" not in out.getvalue()


def test_a_reply_longer_than_the_room_left_is_shortened_to_fit(engine):
    spy = Spy(engine)
    lines = iter(["word " * 300, "/exit"])
    out = io.StringIO()
    assert terminal(spy, read=lambda _prompt: next(lines), out=out, max_tokens=400) == 0
    [(messages, max_tokens)] = spy.calls
    assert max_tokens == engine.context_length - len(engine.encode_chat(messages)) < 400
    assert f"(reply shortened to {max_tokens} tokens" in out.getvalue()


def test_the_web_chat_sends_gradio_history_as_the_conversation_text(engine):
    """Gradio 6 hands history over with content as a list of parts; its repr reached the template."""
    from gradio.components.chatbot import ChatbotDataMessages

    spy = Spy(engine)
    demo = build_ui(spy, temperature=0.0, max_tokens=12)
    first = (
        engine.chat([{"role": "user", "content": "name a river"}], temperature=0, max_tokens=12)
        .choices[0]
        .text
    )
    payload = ChatbotDataMessages.model_validate(
        [
            {"role": "user", "content": [{"type": "text", "text": "name a river"}]},
            {"role": "assistant", "content": [{"type": "text", "text": first}]},
        ]
    )
    history = demo.chatbot.preprocess(payload)  # what the page's event hands the chat function
    *_, last = demo.fn("and a mountain", history, 0.0, 12)
    conversation = [
        {"role": "user", "content": "name a river"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "and a mountain"},
    ]
    assert spy.calls == [(conversation, 12)]
    assert last == engine.chat(conversation, temperature=0, max_tokens=12).choices[0].text
