"""QA findings on reward models and user reward functions: a hub reward model resolves with its
tokenizer's own chat template (offline: from the Hugging Face cache, else gym's offline message); a
registry or hub model with no trained score head is refused, not scored by a random head; a folder
of pickles only gets gym's safetensors message; a file path for a function names the module to give;
a reward model never prompts for, nor runs, its repository's own code.

No network: hub models are laid out in a Hugging Face cache under tmp_path, as a download leaves them
(`models--<owner>--<name>/refs/main` -> `snapshots/<commit>/...`), from gym-tiny's weights.

Run: .venv/bin/pytest -q tests/test_rewards_qa_fixes.py
"""

from __future__ import annotations

import builtins
import json
import shutil
import sys
from pathlib import Path

import pytest

from gym.errors import ConfigError
from gym.rewards import load_reward
from gym.rewards.model import RewardModel
from tests.helpers import HUB_COMMIT, hub_snapshot

PROMPT = [{"role": "user", "content": "q"}]


def score(spec: str, completions: list[str]) -> list:
    """The reward of each completion to the same prompt, called the way TRL calls it."""
    convo = [[{"role": "assistant", "content": c}] for c in completions]
    return load_reward(spec)([PROMPT] * len(completions), convo, answer=[None] * len(completions))


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face hub cache that huggingface_hub and transformers read (HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def score_model(directory: Path) -> Path:
    """A reward model as a hub repo holds one: gym-tiny's backbone and a seeded `score` head, its
    tokenizer with its own chat template (chatml), and no gym_model.json."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from gym.models import load_tokenizer
    from tests.helpers import tiny

    base = tiny()
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(base.path, num_labels=1).save_pretrained(directory)
    load_tokenizer(base).save_pretrained(directory)
    return directory


def tiny_lm(directory: Path) -> Path:
    """gym-tiny's files (a causal LM: no score head) copied into `directory`."""
    from tests.helpers import tiny

    shutil.copytree(tiny().path, directory, dirs_exist_ok=True)
    return directory


# 1. reward_model:<hub id> resolves, with its tokenizer's own chat template


def test_a_hub_reward_model_scores_with_its_tokenizers_own_template(tmp_path: Path, hub_cache: Path):
    """It was "unknown model ...: For any other hub id pass --template too", which a reward spec can't."""
    score_model(hub_snapshot(hub_cache, "someone/tiny-rm"))
    reward = RewardModel("someone/tiny-rm")
    assert (reward.path, reward.template, reward.revision) == ("someone/tiny-rm", None, "main")
    completions = ["Answer: 4", "4", "no idea"]
    got = score("reward_model:someone/tiny-rm", completions)
    # the same weights and template as a folder: the same scores (the folder's tokenizer template is chatml)
    want = score(f"reward_model:{score_model(tmp_path / 'rm')}", completions)
    assert got == pytest.approx(want, abs=1e-5) and len(set(got)) == 3
    text = reward.texts([PROMPT], ["4"])[0]
    assert text.startswith("<|im_start|>user\nq<|im_end|>") and "<|im_start|>assistant\n4" in text


def test_a_hub_reward_model_not_in_the_cache_offline_gets_gyms_offline_message(hub_cache: Path):
    with pytest.raises(ConfigError, match=r"'someone/absent-rm' .*not in the local Hugging Face cache and"):
        load_reward("reward_model:someone/absent-rm")
    with pytest.raises(ConfigError, match="unknown model"):  # no hub id (`owner/name`): as before
        load_reward("reward_model:no-such-reward-model")


def test_a_hub_reward_model_whose_tokenizer_has_no_chat_template_is_refused(hub_cache: Path):
    snapshot = score_model(hub_snapshot(hub_cache, "someone/plain-rm"))
    (snapshot / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match="someone/plain-rm: its tokenizer has no chat template"):
        load_reward("reward_model:someone/plain-rm")


def test_a_classifier_head_of_another_name_is_a_trained_head(tmp_path: Path):
    """BERT's and DeBERTa's reward models (OpenAssistant's) name their head `classifier`, not `score`."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from gym.models import load_tokenizer
    from tests.helpers import tiny

    tok = load_tokenizer(tiny())
    config = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        num_labels=1, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "bert-rm")
    tok.save_pretrained(tmp_path / "bert-rm")
    got = score(f"reward_model:{tmp_path / 'bert-rm'}", ["4", "no idea"])
    assert len(got) == 2 and got[0] != got[1]


# 2. a registry or hub model with no score head is refused, not scored by a random head


def test_a_cached_registry_language_model_is_refused_as_a_reward_model(hub_cache: Path):
    """It loaded with transformers' "score.weight MISSING, newly initialized": random rewards."""
    from gym.models import registry_entry

    tiny_lm(hub_snapshot(hub_cache, registry_entry("qwen2.5-0.5b-instruct").hub_id))
    with pytest.raises(ConfigError, match=r"reward model qwen2.5-0.5b-instruct: no `score\.weight`"):
        load_reward("reward_model:qwen2.5-0.5b-instruct")
    tiny_lm(hub_snapshot(hub_cache, "someone/tiny-lm"))
    with pytest.raises(ConfigError, match=r"reward model someone/tiny-lm: no `score\.weight`"):
        load_reward("reward_model:someone/tiny-lm")


def test_a_head_transformers_initialises_at_loading_is_refused(tmp_path: Path):
    """A config that says sequence classification over weights with no head: caught when it loads."""
    folder = tiny_lm(tmp_path / "lm")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"no trained score head in its weights \(transformers would init"):
        score(f"reward_model:{folder}", ["4"])


# 3. pickled weights only: gym's safetensors message, not "no score.weight"


def test_pickled_weights_only_get_the_safetensors_message(tmp_path: Path, hub_cache: Path):
    """It was "no score.weight in its safetensors weights" for a folder holding no safetensors at all."""
    for folder in (tmp_path / "rm", hub_snapshot(hub_cache, "someone/pickled-rm")):
        score_model(folder)
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")  # never unpickled
    pickles = r"holds its weights only as pickle files \(pytorch_model\.bin\): gym loads safetensors only"
    with pytest.raises(ConfigError, match=rf"reward model {tmp_path / 'rm'} {pickles}"):
        load_reward(f"reward_model:{tmp_path / 'rm'}")
    with pytest.raises(ConfigError, match=rf"snapshots/{HUB_COMMIT} {pickles}"):
        load_reward("reward_model:someone/pickled-rm")


# 4. a file path for a function: the module name to give


@pytest.fixture
def in_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder the command runs from, holding myrew.py and rewards/extra.py."""
    project = tmp_path / "project"
    (project / "rewards").mkdir(parents=True)
    (project / "myrew.py").write_text("def good(completion):\n    return 1.0\n")
    (project / "rewards" / "extra.py").write_text("def good(completion):\n    return 2.0\n")
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(project))])
    yield project
    for name in ("myrew", "rewards", "rewards.extra"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("spec", "advice"),
    [
        ("./myrew.py:good", "importable from the current directory, like myrew:good"),
        ("myrew.py:good", "importable from the current directory, like myrew:good"),
        ("rewards/extra.py:good", "importable from the current directory, like rewards.extra:good"),
        ("./myrew.py", "like myrew:function"),
    ],
)
def test_a_file_path_for_a_reward_names_the_module_to_give(in_project: Path, spec: str, advice: str):
    """It was "importing module './myrew.py' raised TypeError ... the 'package' argument is required"."""
    with pytest.raises(ConfigError, match=r"is a file path, not a module: give a module name"):
        load_reward(spec)
    with pytest.raises(ConfigError, match=advice):
        load_reward(spec)


def test_a_file_path_outside_the_current_directory_names_its_folder(in_project: Path, tmp_path: Path):
    from gym.user_code import load_callable

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(ConfigError, match=rf"with its folder {elsewhere} on PYTHONPATH, like myrew:good"):
        load_callable(f"{elsewhere}/myrew.py:good", "metric")
    # the module names the advice gives work
    assert score("myrew:good", ["x"]) == [1.0] and score("rewards.extra:good", ["x"]) == [2.0]


# 5. a reward model never prompts for, nor runs, its repository's own code


def test_a_reward_model_with_custom_code_neither_prompts_nor_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """trust_remote_code was left unset for the tokenizer: transformers asked on stdin whether to run the
    folder's code (its config's auto_map), and ran it on a yes."""
    import transformers.dynamic_module_utils as dynamic

    folder = score_model(tmp_path / "custom-rm")
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="gym_custom_rm",
        auto_map={"AutoConfig": "custom_rm.Config", "AutoModelForSequenceClassification": "custom_rm.M"},
    )
    (folder / "config.json").write_text(json.dumps(config))
    ran = tmp_path / "custom code ran"
    (folder / "custom_rm.py").write_text(
        f"open({str(ran)!r}, 'w').close()\n"
        "from transformers import LlamaConfig, LlamaForSequenceClassification\n\n"
        "class Config(LlamaConfig):\n    model_type = 'gym_custom_rm'\n\n"
        "class M(LlamaForSequenceClassification):\n    config_class = Config\n"
    )
    asked: list[str] = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "y")
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    with pytest.raises(Exception) as err:  # which one: checked below, after the prompt
        score(f"reward_model:{folder}", ["4"])
    assert not asked and not ran.exists()
    assert isinstance(err.value, ConfigError), err.value
    assert "custom-rm: it needs its repository's own Python code" in str(err.value)
