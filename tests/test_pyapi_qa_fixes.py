"""Python API QA fixes: a dataset folder of the wrong stage, arguments of the wrong type, hints right
outside a flow, the experience manager's arguments, val_size beyond the data, padding-free at batch size
1, and docstrings of the public classes and functions."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from gym import tracking, train
from gym.data.ingest import IngestResult, ingest, load_meta
from gym.data.registry import resolve_dataset
from gym.data.split import held_out_count
from gym.data.tokenize import TokenizeSettings, tokenize
from gym.errors import REFRESH_HINT, ConfigError, DataError
from gym.train import TrainConfig, speed
from gym.train.grpo import GRPOTrainer
from gym.train.grpo.experience_manager import ExperienceManager
from gym.train.grpo.semantic_extractor import SemanticExtractor
from gym.train.speed import SpeedSettings
from tests.helpers import tiny

STEP = TrainConfig(method="sft", max_steps=1)


def chat_file(folder: Path, n: int = 4) -> Path:
    path = folder / "chat.jsonl"
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"what is {i}+1?"},
                {"role": "assistant", "content": f"{i + 1}"},
            ]
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def stages(tmp_path: Path):
    """(model, ingested result, tokenized result) of a small chat file."""
    model = tiny()
    data = ingest(resolve_dataset(str(chat_file(tmp_path))))
    return model, data, tokenize(data.path, model.path, model.template, TokenizeSettings(cutoff_len=64))


# ---- 1. a dataset folder of the other stage -----------------------------------------------------------


def refused_naming(calls, *words: str) -> None:
    """Each call raises a DataError whose message holds every one of `words`."""
    for call in calls:
        with pytest.raises(DataError) as caught:
            call()
        assert all(word in str(caught.value) for word in words), str(caught.value)


def test_an_ingested_folder_where_a_tokenized_one_is_needed_says_so(stages):
    model, data, tokenized = stages
    calls = (
        lambda: train.run(STEP, model, data.path),
        lambda: train.run(STEP, model, tokenized.path, data.path),  # the held-out data too
    )
    refused_naming(
        calls, str(data.path), "an ingested dataset folder, not a tokenized one", "gym.data.tokenize.tokenize"
    )


def test_a_tokenized_folder_where_an_ingested_one_is_needed_says_so(stages):
    model, _, tokenized = stages
    calls = (
        lambda: tokenize(tokenized.path, model.path, model.template),
        lambda: train.run(TrainConfig(method="tf_grpo", max_steps=1), model, tokenized.path),
        lambda: load_meta(tokenized.path, "ingested"),
    )
    refused_naming(
        calls,
        str(tokenized.path),
        "a tokenized dataset folder, not an ingested one",
        "gym.data.ingest.ingest",
    )
    assert "result" in load_meta(tokenized.path), "without an expectation, either stage reads"


# ---- 2. resolve_dataset of no name ---------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, 123, ["demo_sft"]])
def test_resolve_dataset_refuses_what_is_no_name_or_path(given):
    with pytest.raises(ConfigError, match=r"dataset is .*: pass a registry name, a local file or folder"):
        resolve_dataset(given)


# ---- 3. arguments of another type ---------------------------------------------------------------------


def test_ingest_takes_a_name_or_path_as_resolve_dataset_does(tmp_path: Path):
    source = chat_file(tmp_path)
    by_name = ingest(str(source))
    assert by_name == ingest(source) == ingest(resolve_dataset(str(source)))
    assert by_name.num_records == 4
    with pytest.raises(ConfigError, match="dataset is None: pass a registry name"):
        ingest(None)


def test_tokenize_takes_the_results_and_a_dict_of_settings(stages):
    model, data, tokenized = stages
    assert tokenize(data, model, model.template, {"cutoff_len": 64}) == tokenized
    with pytest.raises(ConfigError, match="tokenizer_dir is None: pass a model folder or hub id"):
        tokenize(data, None, model.template)
    with pytest.raises(ConfigError, match="dataset_dir is None: pass the ingested dataset folder"):
        tokenize(None, model, model.template)
    with pytest.raises(ConfigError, match="settings is 64: pass a TokenizeSettings, or a dict"):
        tokenize(data, model, model.template, 64)
    assert tokenize(data, model, settings={"cutoff_len": 64}) == tokenized  # the ModelRef's own template
    with pytest.raises(ConfigError, match="template is None: name the chat template"):
        tokenize(data, model.path, settings={"cutoff_len": 64})  # a folder brings none


def test_train_run_takes_a_dict_config_and_refuses_no_data(stages):
    model, data, _ = stages
    # The dict is read as a TrainConfig: the run gets as far as the data, which is of the other stage.
    with pytest.raises(DataError, match="an ingested dataset folder, not a tokenized one"):
        train.run({"method": "sft", "max_steps": 1}, model, data.path)
    with pytest.raises(ConfigError, match=r"config is 'sft': pass a gym\.train\.TrainConfig"):
        train.run("sft", model, data.path)
    with pytest.raises(ConfigError, match="train_data is None: pass the tokenized dataset folder"):
        train.run(STEP, model, None)


# ---- 4. the hint for a folder that is not there -------------------------------------------------------


def test_a_missing_folder_hint_serves_python_and_flows(tmp_path: Path):
    model = tiny()
    gone = tmp_path / "gone"
    cases = (
        (lambda: train.run(STEP, model, gone), "gym.data.tokenize.tokenize"),
        (
            lambda: tokenize(gone, model.path, model.template),
            "gym.data.ingest.ingest",
        ),
    )
    for call, returned_by in cases:
        with pytest.raises(DataError) as caught:
            call()
        message = str(caught.value)
        assert "no such dataset folder" in message
        assert f"pass a folder {returned_by} returned" in message
        assert "if a flow's cached task made it" in message and "--refresh-cache" in message
    assert not REFRESH_HINT.startswith("deleted"), "no question only a flow's user can answer"


# ---- 5. the experience manager's arguments ------------------------------------------------------------


@pytest.mark.parametrize("caps", [{"max_size": 0}, {"max_size": -3}, {"max_words": 0}])
def test_experience_manager_refuses_caps_below_one(caps, tmp_path: Path):
    (argument,) = caps
    with pytest.raises(ConfigError, match=f"{argument} must be a whole number of at least 1"):
        ExperienceManager(**caps)
    saved = ExperienceManager(library_path=tmp_path / "lib")
    saved.add("Check the units first.")
    saved.save()
    with pytest.raises(ConfigError, match=f"{argument} must be a whole number of at least 1"):
        ExperienceManager(library_path=tmp_path / "lib", **caps)


def test_experience_manager_names_the_argument_of_the_wrong_type():
    em = ExperienceManager()
    first, second = em.add("Check the units first."), em.add("Reduce modulo the divisor first.")
    with pytest.raises(ConfigError, match=r"merge: item_ids must be a list of experience ids"):
        em.merge(first, "Check units, then reduce.")
    with pytest.raises(ConfigError, match="add: text must be a str"):
        em.add(123)
    with pytest.raises(ConfigError, match="delete: an experience id is a str"):
        em.delete(None)
    with pytest.raises(ConfigError, match="modify: text must be a str"):
        em.modify(first, None)
    merged = em.merge([first, second], "Check units, then reduce modulo the divisor.")
    assert em.experiences == [{"id": merged, "text": "Check units, then reduce modulo the divisor."}]


# ---- 6. val_size beyond the data ----------------------------------------------------------------------


def test_val_size_beyond_the_data_says_how_many_records_there_are():
    with pytest.raises(ConfigError) as caught:
        held_out_count(200, 60, "mine.jsonl")
    message = str(caught.value)
    assert "mine.jsonl has only 60 records" in message
    assert "leaves nothing to train on" in message and "at most 59" in message
    assert "-140" not in message


# ---- 7. padding-free at batch size 1 ------------------------------------------------------------------


def test_auto_padding_free_stays_off_at_batch_size_one():
    one = TrainConfig(method="sft", per_device_train_batch_size=1)
    assert not speed.resolve(one).padding_free, "a batch of one sequence has no padding to remove"
    assert "padding_free" not in speed.choices(one)
    on = one.model_copy(update={"speed": SpeedSettings(padding_free="on")})
    assert speed.resolve(on).padding_free, "asked for: stays on"
    packed = one.model_copy(update={"speed": SpeedSettings(packing=True)})
    assert speed.resolve(packed).padding_free, "packed rows hold several sequences"


# ---- 8. docstrings ------------------------------------------------------------------------------------


def test_public_classes_and_functions_say_what_they_do():
    assert inspect.getdoc(GRPOTrainer) and inspect.getdoc(SemanticExtractor)
    undocumented = [
        name
        for name, fn in vars(tracking).items()
        if inspect.isfunction(fn) and fn.__module__ == tracking.__name__ and not name.startswith("_")
        if not fn.__doc__
    ]
    assert undocumented == []
    assert IngestResult.__doc__
