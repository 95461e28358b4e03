"""`gym serve` as a process: starts on a free port, answers the openai client (a chat without a system message
gets --system's), stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.conftest import REPO

KEY = "serve-cli-secret-4242"
SYSTEM = "Answer every question in one short word, please."
USER = [{"role": "user", "content": "hi"}]


def test_gym_serve_answers_then_exits_cleanly_on_sigterm(gym_home):
    env = {**os.environ, "GYM_TEST_KEY": KEY, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "flows.cli", "serve", "--model", "gym-tiny", "--port", "0"]
    cmd += ["--api-key-env", "GYM_TEST_KEY", "--served-model-name", "tiny", "--system", SYSTEM]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the socket listens
        assert "gym serve: tiny at http://127.0.0.1:" in line, (
            line,
            proc.stderr.read() if proc.poll() else "",
        )
        base = line.split(" at ", 1)[1].split()[0]
        files = Path(proc.stdout.readline().split("model files: ", 1)[1].strip())
        assert (files / "tokenizer.json").is_file() and (files / "config.json").is_file()
        client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        # --system opens each chat without a system message: that prompt is the one sent with it
        prompts = [
            client.chat.completions.create(model="tiny", messages=m, max_tokens=1).usage.prompt_tokens
            for m in (
                USER,
                [{"role": "system", "content": SYSTEM}, *USER],
                [{"role": "system", "content": "x"}, *USER],
            )
        ]
        assert prompts[0] == prompts[1] > prompts[2], prompts
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "gym serve: stopped" in err and "Traceback" not in err
    assert KEY not in out + err + line  # the key is never logged


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "gym-tiny", "--api-key-env", "GYM_UNSET_VAR_XYZ"], "GYM_UNSET_VAR_XYZ"),
        (["--model", "no-such-model"], "unknown model"),
        (["--model", "gym-tiny", "--backend", "vllm"], "vllm"),
    ],
)
def test_gym_serve_refuses_bad_settings_with_status_2(argv, message, capsys):
    from flows.cli import main

    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


@pytest.mark.parametrize("command", ["serve", "chat", "eval", "export", "deploy"])
def test_a_mistyped_flag_gets_the_flag_it_may_mean(command, capsys):
    from flows.cli import main

    with pytest.raises(SystemExit) as stop:
        main([command, "--model", "gym-tiny", "--max_tokns", "3"])
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: unrecognized arguments: --max_tokns"), error
    assert ("did you mean" in error) == (command in ("serve", "chat")), error  # they have max tokens


def test_gym_serve_reports_a_busy_port(capsys):
    from flows.cli import main
    from gym.serve.server import bind

    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        assert main(["serve", "--model", "gym-tiny", "--port", str(port)]) == 2
    finally:
        taken.close()
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize("shutdown_timeout", [None, 0.2])
def test_a_stopping_server_finishes_the_requests_in_flight_unless_told_how_long_to_wait(
    gym_home, shutdown_timeout
):
    # It cancelled any request still running 10 s after SIGTERM (a plain-text 500): a long generation
    # on CPU was cut off by a rolling restart.
    import threading
    import time

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "flows.cli", "serve", "--model", "gym-tiny", "--port", "0"]
    cmd += [] if shutdown_timeout is None else ["--shutdown-timeout", str(shutdown_timeout)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: dict = {}
    try:
        base = proc.stdout.readline().split(" at ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)

        def generate() -> None:  # 16 completions of 480 tokens: a few seconds here
            try:
                reply = client.completions.create(
                    model="gym-tiny", prompt="hi", max_tokens=480, n=16, extra_body={"ignore_eos": True}
                )
                got["tokens"] = reply.usage.completion_tokens
            except openai.APIError as exc:
                got["error"] = exc

        thread = threading.Thread(target=generate)
        thread.start()
        time.sleep(0.5)  # the request is generating
        proc.send_signal(signal.SIGTERM)
        thread.join(120)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    if shutdown_timeout is None:
        assert got.get("tokens") == 16 * 480, got
    else:  # cancelled: an OpenAI-shaped 503 to retry, not a plain-text 500 and a traceback
        assert isinstance(got.get("error"), openai.APIStatusError), got
        assert got["error"].status_code == 503 and "shutting down" in got["error"].message
        assert "timeout graceful shutdown exceeded" in err and "Traceback" not in err
