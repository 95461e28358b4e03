"""QA findings on `gym serve` and `gym chat`, second round: a --template of another model family is
refused before the weights load (and one that only differs from the trained template is warned of), a
second Ctrl-C while stopping leaves no traceback in the log, an API key with whitespace around it (or an
empty variable) is refused at start, and a tokenizer's own template is read with trust_remote_code said."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import openai
import pytest

from gym.errors import ConfigError, GymWarning
from gym.models import resolve
from gym.serve.cli import api_key
from gym.serve.loading import resolve_served, tokenizer_template
from tests.conftest import REPO

LLAMA3_SPLIT = "template 'llama3' writes <|end_header_id|>, <|eot_id|>, <|start_header_id|>, which the"


def trained_chatml(dest: Path) -> Path:
    """A folder as gym training writes it: gym-tiny's weights and ChatML tokenizer, its gym_model.json
    recording the chatml template it was trained with."""
    shutil.copytree(resolve("gym-tiny").path, dest)
    (dest / "gym_model.json").write_text(json.dumps({"template": "chatml", "base_model": "gym-tiny"}))
    return dest


def gym_process(*argv: str, **env: str) -> subprocess.Popen[str]:
    """`gym <argv>` as a process, as a user runs it (its warnings and errors as gym's CLI prints them)."""
    environ = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    cmd = [sys.executable, "-m", "flows.cli", *argv]
    return subprocess.Popen(
        cmd, cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finished(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[str, str]:
    """The process's stdout and stderr once it has exited (killed if it is still running at `timeout`)."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def no_weights(*_: Any, **__: Any) -> Any:
    raise AssertionError("the weights were loaded")


# ---- 1. a --template the tokenizer can't encode; one that differs from the trained template ------------


def test_gym_serve_refuses_a_template_whose_control_tokens_the_tokenizer_lacks(gym_home, tmp_path):
    """llama3's template on a gym-trained ChatML model served a 97-token prompt for "hi", its
    <|start_header_id|> and <|eot_id|> split into ordinary text pieces, and garbage replies."""
    model = trained_chatml(tmp_path / "trained")
    proc = gym_process("serve", "--model", str(model), "--template", "llama3", "--port", "0")
    out, err = finished(proc)
    assert proc.returncode == 2, err
    assert err.startswith(f"error: {LLAMA3_SPLIT} tokenizer of {model} does not have as single tokens"), err
    assert "trained with 'chatml'" in err and "Leave out --template" in err, err
    assert "Traceback" not in err and " at http://" not in out  # refused, never served


def test_gym_chat_refuses_it_too_before_the_weights_load(gym_home, tmp_path, monkeypatch, capsys):
    from flows.cli import main

    monkeypatch.setattr("gym.models.load_model", no_weights)
    model = trained_chatml(tmp_path / "trained")
    capsys.readouterr()  # gym-tiny's build
    assert main(["chat", "--model", str(model), "--template", "llama3"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {LLAMA3_SPLIT} tokenizer of {model}")
    # gym-tiny's own tokenizer is ChatML's too, whatever template it is built with: refused as
    # `gym train` and `gym export` refuse it
    with pytest.raises(ConfigError, match=r"template 'llama3' writes <\|end_header_id\|>"):
        resolve_served("gym-tiny", template="llama3")


def test_a_template_that_differs_from_the_trained_one_is_served_with_a_one_line_warning(gym_home, tmp_path):
    model = trained_chatml(tmp_path / "trained")
    proc = gym_process("serve", "--model", str(model), "--template", "alpaca", "--port", "0")
    try:
        line = proc.stdout.readline()  # printed once the socket listens
        assert " at http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        base = line.split(" at ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model=str(model), messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
        )
        assert reply.usage.prompt_tokens == len(alpaca_prompt(model)), reply.usage  # served with alpaca
        proc.send_signal(signal.SIGTERM)
        _, err = finished(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    warned = [w for w in err.splitlines() if w.startswith("gym: warning: ")]
    assert warned == [
        f"gym: warning: --template alpaca differs from the template {model} was trained with (chatml, in its "
        "gym_model.json): its replies may suffer; leave out --template to use that one"
    ], err


def alpaca_prompt(model: Path) -> list[int]:
    """The ids of alpaca's prompt for "hi" (its default system message, then the instruction)."""
    from transformers import AutoTokenizer

    system = "Below is an instruction that describes a task. Write a response that appropriately completes "
    text = system + "the request.\n\n### Instruction:\nhi\n\n### Response:\n"
    return list(AutoTokenizer.from_pretrained(str(model)).encode(text, add_special_tokens=False))


@pytest.mark.parametrize("template", ["chatml", "qwen3_nothink"])  # qwen3_nothink: LLaMA-Factory's chatml
def test_the_template_the_model_was_trained_with_gets_no_warning(gym_home, tmp_path, template):
    model = trained_chatml(tmp_path / "trained")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GymWarning)
        assert resolve_served(str(model), template=template).template_name == "chatml"
    with pytest.warns(GymWarning, match="differs from the template .* was trained with"):
        assert resolve_served(str(model), template="mistral").template_name == "mistral"


# ---- 2. a second Ctrl-C while stopping -----------------------------------------------------------------


def test_a_second_ctrl_c_while_stopping_leaves_no_traceback_in_the_log(gym_home):
    """The lifespan task, cancelled when a second SIGINT skips the lifespan's shutdown, was logged as
    `ERROR: Traceback ... starlette/routing.py ... lifespan ... asyncio.exceptions.CancelledError`."""
    proc = gym_process("serve", "--model", "gym-tiny", "--port", "0")
    got: dict[str, Any] = {}
    try:
        base = proc.stdout.readline().split(" at ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)

        def generate() -> None:  # 16 completions of 480 tokens: seconds, cut short by the second Ctrl-C
            try:
                client.completions.create(
                    model="gym-tiny", prompt="hi", max_tokens=480, n=16, extra_body={"ignore_eos": True}
                )
            except openai.APIError as exc:
                got["error"] = exc

        thread = threading.Thread(target=generate)
        thread.start()
        time.sleep(0.5)  # the request is generating
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        thread.join(120)
        _, err = finished(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert isinstance(got.get("error"), openai.APIStatusError) and got["error"].status_code == 503, got
    assert "Traceback" not in err and "CancelledError" not in err and "ERROR" not in err, err
    assert "gym serve: stopped" in err


# ---- 3. an API key with whitespace around it, an empty variable --------------------------------------

KEY = "qa-key-7731"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (f"{KEY} ", "holds leading or trailing whitespace"),
        (f" {KEY}", "holds leading or trailing whitespace"),
        (f"{KEY}\n", "holds leading or trailing whitespace"),
        ("", "is empty"),
        ("  ", "holds only whitespace"),
        (None, "is not set"),
    ],
)
def test_a_key_no_client_could_send_or_an_empty_variable_is_refused_saying_which(monkeypatch, value, says):
    if value is None:
        monkeypatch.delenv("GYM_QA_SPK", raising=False)
    else:
        monkeypatch.setenv("GYM_QA_SPK", value)
    with pytest.raises(ConfigError) as refused:
        api_key("GYM_QA_SPK")
    message = str(refused.value)
    assert message.startswith("--api-key-env GYM_QA_SPK: that environment variable ") and says in message
    assert KEY not in message  # never the key itself


def test_gym_serve_refuses_a_key_with_trailing_whitespace_at_start(gym_home):
    """Every request got a 401: a client's Authorization header loses the key's trailing space."""
    proc = gym_process("serve", "--model", "gym-tiny", "--port", "0", "--api-key-env", "SPK", SPK=f"{KEY} ")
    out, err = finished(proc)
    assert proc.returncode == 2, err
    refused = "error: --api-key-env SPK: that environment variable holds leading or trailing whitespace"
    assert err.startswith(refused), err
    assert KEY not in out + err and " at http://" not in out


def test_a_key_as_it_is_is_taken(monkeypatch):
    monkeypatch.setenv("GYM_QA_SPK", f"{KEY} with inner spaces")
    assert api_key("GYM_QA_SPK") == f"{KEY} with inner spaces"
    assert api_key(None) is None


# ---- 4. the tokenizer's own template: trust_remote_code passed explicitly ------------------------------


def test_the_tokenizer_is_loaded_with_trust_remote_code_as_asked(gym_home, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained
    asked: list[Any] = []

    def spy(path: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("trust_remote_code", "not passed"))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", spy)
    plain = tmp_path / "plain"  # no gym metadata: served with its tokenizer's own chat template
    shutil.copytree(resolve("gym-tiny").path, plain)
    tokenizer_template(plain, str(plain))
    resolve_served(str(plain))
    resolve_served(str(plain), trust_remote_code=True)
    # the check of a --template's control tokens loads the tokenizer the same way
    trained = trained_chatml(tmp_path / "trained")
    resolve_served(str(trained), template="chatml")
    resolve_served(str(trained), template="chatml", trust_remote_code=True)
    assert asked == [False, False, True, False, True]


def test_a_folder_that_needs_its_own_code_is_refused_before_anything_loads(tmp_path):
    """A folder with no gym template is served with its tokenizer's: it too runs no code unless asked."""
    local = tmp_path / "custom"
    shutil.copytree(resolve("gym-tiny").path, local)
    (local / "gym_model.json").unlink(missing_ok=True)  # no gym template: its tokenizer's
    config = json.loads((local / "config.json").read_text())
    config |= {"model_type": "gym_custom", "auto_map": {"AutoConfig": "configuration_custom.GymCustomConfig"}}
    (local / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"runs its own Python code to load .* pass --trust_remote_code"):
        resolve_served(str(local))
