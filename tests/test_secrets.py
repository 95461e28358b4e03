"""Credentials stay out of what gym stores and shows: setting names that hold secrets, keys inside endpoint
URLs, a key typed where a variable name goes, pickled weights refused before anything loads them."""

from __future__ import annotations

import contextlib
import json

import pytest

from gym import secrets, tracking
from gym.errors import ConfigError

KEY = "sk-SECRET4242"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("hf_token", True),
        ("hub_token", True),
        ("token", True),
        ("client.api_key", True),
        ("OPENAI_API_KEY", True),
        ("auth.password", True),
        ("policy.max_tokens", False),
        ("budget_tokens", False),
        ("num_tokens", False),
        ("template.pad_token", False),
        ("eos_token", False),
    ],
)
def test_secret_names_are_whole_words(name, secret):
    assert secrets.secret_name(name) is secret


def test_redact_strips_url_credentials_and_keeps_token_counts():
    flat = tracking.redact(
        {
            "endpoint": f"http://alice:{KEY}@127.0.0.1:8000/v1",
            "judge": {"endpoint": f"https://api.example.com/v1?api_key={KEY}&region=eu", "max_tokens": 8},
            "budget_tokens": 1000,
        }
    )
    assert KEY not in json.dumps(flat)
    assert flat["endpoint"] == "http://***@127.0.0.1:8000/v1"  # the user too: it may be the key
    assert flat["judge.endpoint"] == "https://api.example.com/v1?api_key=***&region=eu"
    assert flat["judge.max_tokens"] == "8" and flat["budget_tokens"] == "1000"  # were ***


def _gym(capsys, *argv: str) -> tuple[int, str]:
    from flows.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_key_in_the_endpoint_url_is_refused_without_showing_it(capsys, gym_home):
    code, said = _gym(
        capsys, "train", "--method", "tf_grpo", "--model", "gym-tiny", "--endpoint", f"http://u:{KEY}@h:1/v1"
    )
    assert code == 2 and "the URL may hold a credential" in said and "api_key_env" in said
    assert KEY not in said


def test_a_key_typed_as_a_flag_is_never_echoed_nor_taken_for_the_variable_name(capsys, gym_home):
    # `--api_key` was an abbreviation of --api_key_env: the key became a Prefect parameter.
    code, said = _gym(capsys, "train", "--method", "tf_grpo", "--model", "gym-tiny", "--api_key", KEY)
    assert code == 2 and "unrecognized arguments: --api_key ***" in said and KEY not in said
    code, said = _gym(capsys, "train", "--method", "tf_grpo", "--model", "gym-tiny", "--api_key_env", KEY)
    assert code == 2 and "never the key itself" in said and KEY not in said
    code, said = _gym(capsys, "serve", "--model", "gym-tiny", "--api-key", KEY)
    assert code == 2 and KEY not in said


@pytest.mark.parametrize(
    "url",
    [
        f"http://{KEY}@127.0.0.1:9/v1",  # a key alone before @
        f"http://u%3A{KEY}@127.0.0.1:9/v1",
        f"http://127.0.0.1:9/v1?access_key={KEY}",
        f"http://127.0.0.1:9/v1?subscription-key={KEY}",
        f"http://127.0.0.1:9/v1#api_key={KEY}",
        f"http://127.0.0.1:9/v1;api_key={KEY}",
        f"http://[::1/v1?api_key={KEY}",  # too malformed to split: never shown
    ],
)
def test_every_form_of_a_key_in_an_endpoint_is_refused_unshown(capsys, gym_home, url):
    code, said = _gym(capsys, "train", "--method", "tf_grpo", "--model", "gym-tiny", "--policy.endpoint", url)
    assert code == 2 and KEY not in said
    assert secrets.url_credentials(url) and KEY not in secrets.scrub(f"error: {url} failed")


def test_plain_endpoints_and_variable_names_pass():
    for url in (
        "http://127.0.0.1:8000/v1",
        "https://api.openai.com/v1",
        "http://h/v1?api-version=2024-06-01",
    ):
        assert not secrets.url_credentials(url) and secrets.scrub(url) == url
    for name in ("OPENAI_API_KEY", "MY_KEY", "DEEPSEEK_API_KEY"):
        assert secrets.env_name(name) == name
    for key in ("hf_abcDEF123", "sk_live_x", "abcdefghij0123456789abcd"):  # keys that look like names
        with pytest.raises(ValueError, match="never the key itself"):
            secrets.env_name(key)


def test_openai_client_refuses_a_url_carrying_a_key():
    from gym.tfgrpo.clients import OpenAIClient

    with pytest.raises(ConfigError, match="may hold a credential") as caught:
        OpenAIClient(f"http://127.0.0.1:1/v1?key={KEY}", "m")
    assert KEY not in str(caught.value)
    with pytest.raises(ConfigError, match="api_key_env: the name of the environment variable") as caught:
        OpenAIClient("https://api.openai.com/v1", "m", api_key_env=KEY)  # the Python API
    assert KEY not in str(caught.value)


def test_sglang_is_refused_a_key_it_would_show_in_ps(monkeypatch):
    from gym.serve import backends
    from gym.serve.settings import ServeSettings

    monkeypatch.setattr(backends.os, "execvpe", lambda *a: pytest.fail("exec'd with the key in argv"))
    with pytest.raises(ConfigError, match="every user of this machine can read"):
        backends.exec_backend(ServeSettings(model="gym-tiny", backend="sglang", api_key_env="K"), KEY)


def _pickled_folder(path, name):
    path.mkdir()
    (path / name).write_bytes(b"\x80\x04K\x01.")  # a pickle: never opened
    return path


def test_pickled_model_weights_are_refused_in_one_line(tmp_path, capsys, gym_home):
    from gym import models

    folder = _pickled_folder(tmp_path / "binmodel", "pytorch_model.bin")
    (folder / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ConfigError, match=r"only as pickle files \(pytorch_model\.bin\): gym loads safe"):
        models.resolve(str(folder), template="chatml")
    code, said = _gym(capsys, "export", "--model", str(folder), "--out", str(tmp_path / "out"))
    assert code == 2 and "only as pickle files" in said and "Traceback" not in said
    assert not (tmp_path / "out").exists()


def test_pickled_adapter_is_refused(tmp_path):
    from gym.export import locate

    folder = _pickled_folder(tmp_path / "adp", "adapter_model.bin")
    config = {"base_model_name_or_path": "gym-tiny", "peft_type": "LORA"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"adapter .*adp holds its weights only as pickle files"):
        locate(str(folder), None, None)


def test_chat_refuses_an_adapter_beside_gyms_own_model_flag(capsys, gym_home):
    code, said = _gym(capsys, "chat", "--model", "gym-tiny", "--adapter_name_or_path", "/nowhere")
    assert code == 2 and "pass the base as --model_name_or_path" in said


@pytest.mark.parametrize(
    ("url", "stripped", "link"),
    [
        ("sqlite:////abs/path.db", "sqlite:////abs/path.db", "sqlite:////abs/path.db"),  # lost two slashes
        ("sqlite:///rel.db", "sqlite:///rel.db", "sqlite:///rel.db"),
        ("file:///x", "file:///x", "file:///x"),
        ("http://h/v1?flag;x=1", "http://h/v1?flag;x=1", "http://h/v1?flag;x=1"),  # was ?flag=&x=1
        (
            "http://user:pw@host:5000/path?api_key=1",
            "http://***@host:5000/path?api_key=***",
            "http://host:5000/path?api_key=***",
        ),
        ("http://h/p;token=t?a=1&sig=s#key=k", "http://h/p;token=***?a=1&sig=***#key=***", None),
        (" http://u:p@h/x", "http://***@h/x", "http://h/x"),  # what urlsplit ignores hides no login
    ],
)
def test_a_url_loses_only_its_credentials(url, stripped, link):
    """urlunsplit dropped the empty netloc of `sqlite:////abs/path.db`: messages named `sqlite://abs/...`."""
    assert secrets.strip_url(url) == stripped
    assert secrets.link_url(url) == (stripped if link is None else link)


def test_a_missing_model_version_names_the_store_as_it_is(gym_home):
    """`gym serve --model models:/gym-tiny-sft@champion` before any promote said `not found in
    sqlite://tmp/...`: a path that is not the store."""
    store = tracking.tracking_uri()
    assert store.startswith("sqlite:////")
    with pytest.raises(ConfigError) as caught:
        tracking.resolve_model_uri("models:/gym-tiny-sft@champion")
    assert f"not found in {store} " in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:////tmp/x.db?password=s3cr3t",
        "http://h/x?a=1&Api_Key=2",
        "http://h/x#token=abc",
        "http://u:p@h/x",
        "sqlite:////tmp/x.db",
        "http://127.0.0.1:5000",
        "postgresql://h/db?sslmode=require",
        "http://h/keys/path?x=1#frag",
        "databricks",
        # what urlsplit (so gym, and a client) ignores before reading a URL hid its login from the schema
        " http://u:p@h/x",
        "\thttps://u:p@h/x",
        "\x01http://u:p@h",
        "ht\ttp://u:p@h/x",
        "http://h/x?pass\nword=1",
        "https://h/d.jsonl?%74oken=2",  # percent-encoded: the schema can't decode it, gym does
    ],
)
def test_the_deployment_schema_refuses_the_urls_gym_refuses(url):
    """The schema Prefect's server checks a deployment run's tracking_uri against let `?password=` (and
    other key-like parameters) through, to be stored with the run's parameters before gym refused it."""
    import re

    allowed = re.match(secrets.NO_LOGIN_SCHEMA["pattern"], url) is not None
    assert allowed is not secrets.url_credentials(url)


def test_a_login_in_a_dataset_or_model_value_is_not_quoted_back(capsys, gym_home):
    """Both errors quoted the value whole: a deployment run's Failed state and the worker's log showed
    the key."""
    from flows.cli import main

    key = "hf_SECRETTOKEN123"
    for flag in ("--dataset", "--model"):
        assert main(["train", flag, f"https://bob:{key}@example.com/x.jsonl", "--max-steps", "1"]) == 2
        err = capsys.readouterr().err
        assert "https://***@example.com/x.jsonl" in err and key not in err, err
    error = ConfigError(f"dataset http://h/d.jsonl?token={key}: missing")
    assert key not in str(error) and "token=***" in str(error)


@pytest.mark.parametrize(
    ("flow_path", "config"),
    [
        ("flows.train:train", {"dataset": "https://bob:hunter2@example.com/data.jsonl"}),
        ("flows.train:train", {"model": "https://bob:hunter2@example.com/model"}),
        ("flows.train:train", {"method_eval_dataset": "http://h/d.jsonl?token=hunter2"}),
        ("flows.train:train", {"warm_start": {"dataset": "https://bob:hunter2@h/warm.jsonl"}}),
        ("flows.sft_then_dpo:sft_then_dpo", {"dpo_dataset": "https://bob:hunter2@h/pairs.jsonl"}),
        ("flows.sft_then_dpo:sft_then_dpo", {"dpo_eval_dataset": "https://bob:hunter2@h/pairs.jsonl"}),
        ("flows.evaluate:evaluate", {"model": "https://bob:hunter2@h/model"}),
        ("flows.evaluate:evaluate", {"eval_dataset": "https://bob:hunter2@h/eval.jsonl"}),
        ("flows.tf_grpo:tf_grpo", {"model": "https://bob:hunter2@h/model"}),
        ("flows.tf_grpo:tf_grpo", {"dataset": "https://bob:hunter2@h/q.jsonl"}),
        ("flows.train:train", {"dataset": " https://bob:hunter2@example.com/data.jsonl"}),
        ("flows.evaluate:evaluate", {"model": "\thttps://bob:hunter2@h/model"}),
        ("flows.train:train", {"output": {"tracking_uri": " http://bob:hunter2@127.0.0.1:5999"}}),
        ("flows.train:train", {"benchmarks": ["mmlu=https://bob:hunter2@example.com/mmlu"]}),
        ("flows.evaluate:evaluate", {"benchmarks": ["mmlu", "ceval=https://bob:hunter2@h/ceval.zip"]}),
    ],
)
def test_the_deployment_schema_refuses_a_login_in_a_model_or_dataset(flow_path, config):
    """A login in `dataset` or `model` was accepted by Prefect's server and stored with the run's
    parameters (shown in the UI) before gym said the file doesn't exist; the schema now refuses it, as it
    refuses one in tracking_uri. Names, paths, hub ids and models:/ URIs still pass."""
    import importlib

    from prefect.utilities.schema_tools.validation import validate

    module, name = flow_path.split(":")
    schema = getattr(importlib.import_module(module), name).parameters.model_dump()
    assert validate({"config": config}, schema), f"{config} passed"
    field = next(iter(config))
    fine: object = "org/some-dataset" if "dataset" in field else "models:/gym-tiny-sft@champion"
    if field == "warm_start":
        fine = {"dataset": "./warm.jsonl"}
    if field == "output":
        fine = {"tracking_uri": "http://127.0.0.1:5999"}
    if field == "benchmarks":
        fine = ["mmlu", "ceval=/data/ceval.zip", "cmmlu=haonan-li/cmmlu", "lm-eval:hellaswag"]
    assert not validate({"config": {field: fine}}, schema), f"{fine} refused"


@pytest.mark.parametrize(
    ("flow_path", "field", "bad", "fine"),
    [
        ("flows.train:train", "template", "https://bob:hunter2@h/t.jinja", "chatml"),
        ("flows.evaluate:evaluate", "template", "https://bob:hunter2@h/t.jinja", "./my_template.jinja"),
        ("flows.tf_grpo:tf_grpo", "template", "https://bob:hunter2@h/t.jinja", "qwen3"),
        (
            "flows.train:train",
            "output",
            {"output_dir": "s3://AKIA:hunter2@bucket/x"},
            {"output_dir": "./out"},
        ),
        (
            "flows.train:train",
            "train",
            {"rl": {"rewards": ["exact_match", "reward_model:https://u:hf_hunter2@huggingface.co/m"]}},
            {"rl": {"rewards": ["exact_match", "reward_model:org/rm", "my_pkg.rewards:fn"]}},
        ),
    ],
)
def test_the_deployment_schema_refuses_a_login_in_a_template_output_dir_or_reward(
    flow_path, field, bad, fine
):
    """A login in these was stored with a deployment run's parameters: Prefect's server accepted it."""
    import importlib

    from prefect.utilities.schema_tools.validation import validate

    module, name = flow_path.split(":")
    schema = getattr(importlib.import_module(module), name).parameters.model_dump()
    assert validate({"config": {field: bad}}, schema), f"{bad} passed"
    assert not validate({"config": {field: fine}}, schema), f"{fine} refused"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--method", "grpo", "--train.rl.rewards", "reward_model:https://u:hf_hunter2@huggingface.co/m"],
            "reward model https://***@huggingface.co/m: a URL is not a model source",
        ),
        (
            ["--output_dir", "s3://AKIA:hunter2@bucket/x"],
            "s3://***@bucket/x is a URL: gym writes the model to a local",
        ),
    ],
)
def test_a_login_in_a_reward_model_url_or_an_output_url_is_refused_unshown(
    capsys, gym_home, tmp_path, argv, expected
):
    """The reward URL ended in a traceback that printed the token; the output URL was written to a local
    folder named s3:/AKIA:...@bucket/x, and the run exited 0."""
    from flows.cli import main

    with contextlib.chdir(tmp_path):
        assert main(["train", "--dataset", "demo_prompts" if "grpo" in argv else "demo_sft", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and "hunter2" not in err and "Traceback" not in err
    assert not (tmp_path / "s3:").exists()


def test_an_id_that_is_no_repo_id_is_a_clear_error_without_its_login():
    """huggingface_hub's HFValidationError quoted the whole text, token included, in a traceback."""
    from huggingface_hub import constants

    from gym.models import check_reachable

    if not constants.HF_HUB_OFFLINE:
        pytest.skip("offline only: online, the hub answers for the id")
    with pytest.raises(ConfigError, match=r"model 'https://\*\*\*@h/m' is no hub id") as e:
        check_reachable("https://u:hf_hunter2@h/m", "main")
    assert "hunter2" not in str(e.value)
