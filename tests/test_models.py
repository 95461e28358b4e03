"""Model resolution and loading: registry names, hub ids offline, local dirs, remote code off by default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gym.data.tokenize import load_tokenizer as data_tokenizer
from gym.errors import ConfigError
from gym.models import check, load_model, load_tokenizer, resolve
from tests.helpers import hub_snapshot


def test_registry_name_and_its_hub_id_resolve_to_the_same_entry_offline():
    for name in ("qwen2.5-0.5b-instruct", "Qwen/Qwen2.5-0.5B-Instruct"):
        with pytest.raises(ConfigError, match="not in the local Hugging Face cache"):
            resolve(name)


def test_unknown_name_suggests_and_asks_for_a_template():
    with pytest.raises(ConfigError, match="gym-tiny") as err:
        resolve("gym-tinny")
    assert "--template" in str(err.value)


def test_a_model_registered_in_mlflow_given_by_its_bare_name_is_pointed_to_its_models_uri(gym_home, tmp_path):
    from mlflow import MlflowClient

    from gym import tracking

    resolve_unknown = pytest.raises(ConfigError, match="not a registry name or a local directory")
    with resolve_unknown:
        resolve("my-sft")
    assert not (gym_home / "mlflow").exists(), "the hint reads a store that exists, never creates one"
    uri = tracking.tracking_uri()
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("my-sft")
    client.create_model_version("my-sft", source=str(tmp_path))
    client.create_model_version("my-sft", source=str(tmp_path))
    with pytest.raises(ConfigError, match=r"'my-sft' is registered in MLflow.*give it as models:/my-sft/2$"):
        resolve("my-sft")
    client.set_registered_model_alias("my-sft", "champion", "1")
    with pytest.raises(ConfigError, match=r"give it as models:/my-sft@champion$"):
        resolve("my-sft")
    with resolve_unknown:  # other names are unknown as before
        resolve("my-dpo")
    # The URI form without a version or alias: not "not found" (it is there), but how to name a version
    with pytest.raises(
        ConfigError, match=r"'models:/my-sft' names a registered model, not one of its versions: give"
    ):
        resolve("models:/my-sft")
    with pytest.raises(ConfigError, match=r"'models:/my-dpo' not found"):
        resolve("models:/my-dpo")


def test_gym_tiny_loads_like_a_downloaded_model():
    ref = resolve("gym-tiny")
    assert Path(ref.path).is_dir() and ref.template == "chatml" and ref.revision is None
    tok, model = load_tokenizer(ref), load_model(ref)
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
    assert ref.train_defaults["sft"]["learning_rate"] > 0


CUSTOM_CONFIG = """
import os, pathlib
from transformers import LlamaConfig

if os.environ.get("GYM_TEST_RAN"):
    pathlib.Path(os.environ["GYM_TEST_RAN"]).write_text("the model's own code ran")


class GymCustomConfig(LlamaConfig):
    model_type = "gym_custom"
"""
CUSTOM_MODEL = """
from transformers import LlamaForCausalLM

from .configuration_custom import GymCustomConfig


class GymCustomModel(LlamaForCausalLM):
    config_class = GymCustomConfig
"""


def test_remote_code_runs_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("GYM_TEST_RAN", str(tmp_path / "RAN"))
    local = tmp_path / "custom"
    shutil.copytree(resolve("gym-tiny").path, local)
    (local / "configuration_custom.py").write_text(CUSTOM_CONFIG)
    (local / "modeling_custom.py").write_text(CUSTOM_MODEL)
    config = json.loads((local / "config.json").read_text())
    config["model_type"] = "gym_custom"
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.GymCustomConfig",
        "AutoModelForCausalLM": "modeling_custom.GymCustomModel",
    }
    (local / "config.json").write_text(json.dumps(config))

    # refused before anything loads, in one line (it failed in a later task, in transformers' traceback)
    said = (
        f"model {local} runs its own Python code to load (config.json's auto_map names "
        "configuration_custom.py, modeling_custom.py; transformers has no model type 'gym_custom' of its "
        "own): gym runs a model's code only when asked to; read that code, then pass --trust_remote_code "
        "(trust_remote_code=True in Python)"
    )
    for refused in (lambda: resolve(str(local), template="chatml"), lambda: check(str(local), "chatml")):
        with pytest.raises(ConfigError) as caught:
            refused()
        assert str(caught.value) == said
    # the tokenize task's tokenizer asked on the terminal whether to run the config's code, then ran it
    assert data_tokenizer(str(local)).eos_token == "<|im_end|>"
    assert not (tmp_path / "RAN").exists()
    # a tokenizer of its own: refused in a line
    tokenizer_config = json.loads((local / "tokenizer_config.json").read_text())
    custom = {**tokenizer_config, "tokenizer_class": "GymCustomTokenizer"}
    custom["auto_map"] = {"AutoTokenizer": ["tokenization_custom.GymCustomTokenizer", None]}
    (local / "tokenizer_config.json").write_text(json.dumps(custom))
    with pytest.raises(ConfigError, match=r"runs its own Python code to load: .* --trust_remote_code"):
        data_tokenizer(str(local))
    (local / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    check(str(local), "chatml", trust_remote_code=True)
    model = load_model(resolve(str(local), template="chatml", trust_remote_code=True))
    assert type(model).__name__ == "GymCustomModel"
    assert (tmp_path / "RAN").exists()  # the test's own check: the code runs when asked to
    assert data_tokenizer(str(local), trust_remote_code=True).eos_token == "<|im_end|>"


def test_an_auto_map_beside_a_model_type_transformers_knows_needs_no_trust(tmp_path):
    """Many hub models keep an auto_map from before transformers had their class: it loads its own."""
    local = tmp_path / "known"
    shutil.copytree(resolve("gym-tiny").path, local)
    config = json.loads((local / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_old.OldModel"}
    (local / "config.json").write_text(json.dumps(config))
    assert type(load_model(resolve(str(local), template="chatml"))).__name__ == "LlamaForCausalLM"


def test_a_trained_model_folder_deleted_from_the_workspace_says_how_to_rebuild(tmp_path):
    from gym.models import derived

    gone = derived(resolve("gym-tiny"), tmp_path / "models" / "sft-0123", "0123")
    for load in (load_model, load_tokenizer):
        with pytest.raises(ConfigError, match="--refresh-cache"):
            load(gone)


def test_context_window_reads_each_config_family_and_is_none_when_unnamed():
    from transformers import GPT2Config, LlamaConfig, LlavaConfig, PretrainedConfig

    from gym.models import context_window

    assert context_window(LlamaConfig(max_position_embeddings=300)) == 300
    assert context_window(GPT2Config(n_positions=96)) == 96  # GPT-2 names it n_positions
    vision_chat = LlavaConfig(text_config=LlamaConfig(max_position_embeddings=700).to_dict())
    assert context_window(vision_chat) == 700  # its language model's window
    assert context_window(PretrainedConfig()) is None


def test_a_training_stage_folder_resolves_to_its_model_and_its_adapter_points_there(gym_home, tmp_path):
    """`gym serve --model <stage>` was refused (no config.json) though `gym export --model <stage>` takes
    it; and the adapter's hint said to pass `--adapter_name_or_path` beside --model, which gym refuses."""
    built = Path(resolve("gym-tiny").path)
    stage = tmp_path / "sft-1234"
    shutil.copytree(built, stage / "model")
    (stage / "model" / "gym_model.json").write_text(
        json.dumps({"template": "chatml", "base_model": "gym-tiny"})
    )
    (stage / "adapter").mkdir()
    (stage / "adapter" / "adapter_config.json").write_text("{}")
    ref = resolve(str(stage))
    assert Path(ref.path) == (stage / "model").resolve() and ref.template == "chatml"
    with pytest.raises(ConfigError) as caught:
        resolve(str(stage / "adapter"))
    message = str(caught.value)
    assert f"use {stage / 'model'}, the stage's merged model" in message
    assert "--model_name_or_path BASE --adapter_name_or_path" in message
    with pytest.raises(ConfigError, match="is not a model directory"):
        resolve(str(tmp_path))  # a folder that is no stage


def test_a_library_learned_for_an_api_model_says_how_to_use_it(tmp_path):
    """A TF-GRPO run whose policy is a remote model ships experiences.json alone: serving it said only
    "not a model directory (no config.json)"."""
    (tmp_path / "experiences.json").write_text("{}")
    meta = {"method": "tf_grpo", "endpoint": "http://127.0.0.1:8000/v1", "model": "deepseek-chat"}
    (tmp_path / "gym_model.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError) as caught:
        resolve(str(tmp_path))
    message = str(caught.value)
    assert "Training-Free GRPO library learned for the model 'deepseek-chat'" in message
    assert f"gym tfgrpo show {tmp_path}" in message
    # gym export and gym deploy say the same (they said it holds "neither a model nor a PEFT adapter")
    from gym.export import locate

    with pytest.raises(ConfigError, match="Training-Free GRPO library learned for the model 'deepseek-chat'"):
        locate(str(tmp_path), None, None)


@pytest.mark.parametrize("path", ["./no/such/model", "/no/such/model", "~/no-such-model"])
def test_a_missing_model_folder_is_one_line_even_with_a_template(path):
    # With --template, a path was taken for a hub id: huggingface_hub's HFValidationError traceback
    for template in (None, "chatml"):
        with pytest.raises(ConfigError, match=r"no.such.model'?: no such directory.*; give a model folder"):
            resolve(path, template)


def test_a_hub_model_the_hub_cannot_serve_is_one_line_naming_it():
    # Online with no network, transformers' OSError (after its retries) was a traceback from gym data
    from gym.models import ModelRef, _loading

    hub_id = "Qwen/Qwen2.5-0.5B-Instruct"
    ref = ModelRef(
        name=hub_id, path=hub_id, template="chatml", digest="d", revision="main", base_model=hub_id
    )
    says = r"'Qwen/Qwen2.5-0.5B-Instruct' can't be loaded from the Hugging Face hub \(We couldn't connect"
    with pytest.raises(ConfigError, match=says), _loading(ref):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nmore")
    with pytest.raises(ValueError, match="a library's own"), _loading(ref, (OSError, ValueError)):
        raise ValueError("a library's own")  # not the hub's: as it was


def test_a_folder_model_is_its_own_base_by_absolute_path(gym_home, tmp_path, monkeypatch):
    """`--model models/mine` recorded base_model as typed: rendered from another directory, the card took
    `models/mine` for a hub id and wrote it as `base_model` metadata (which the Hub refuses on a push)."""
    import shutil

    from gym.card import hub_base

    folder = tmp_path / "models" / "mine"
    shutil.copytree(resolve("gym-tiny").path, folder)
    (folder / "gym_model.json").unlink(missing_ok=True)  # a folder gym did not write
    monkeypatch.chdir(tmp_path)
    ref = resolve("models/mine", "chatml")
    assert ref.base_model == str(folder.resolve())
    monkeypatch.chdir(tmp_path / "models")
    assert hub_base(ref.base_model) is None


def test_a_cached_hub_model_with_pickled_weights_only_is_refused_before_any_work(tmp_path, monkeypatch):
    """It failed when loaded, told to check the id and the connection."""
    from huggingface_hub import constants

    snapshot = hub_snapshot(tmp_path / "hub", "someone/pickled")
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(Path(resolve("gym-tiny").path) / name, snapshot / name)
    (snapshot / "pytorch_model.bin").write_bytes(b"not read")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    for refused in (lambda: resolve("someone/pickled", "chatml"), lambda: check("someone/pickled", "chatml")):
        with pytest.raises(ConfigError) as caught:
            refused()
        assert str(caught.value).startswith(
            f"model 'someone/pickled': its cached snapshot {snapshot} holds its weights only as pickle files "
            "(pytorch_model.bin): gym loads safetensors only"
        )
    (snapshot / "model.safetensors").write_bytes(b"")  # beside it: loads that one
    assert resolve("someone/pickled", "chatml").path == "someone/pickled"
