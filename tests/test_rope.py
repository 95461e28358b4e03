"""RoPE scaling (LLaMA-Factory's rope_scaling): a stage trains gym-tiny (a 512-token context) on records
longer than its context with its rotary embedding stretched, and the model it saves carries the scaling."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gym import train
from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.data.tokenize import TokenizeSettings, tokenize
from gym.errors import ConfigError
from gym.export import ExportSettings, export_model
from gym.models import derived, load_model
from gym.train import TrainConfig, rope
from tests.helpers import tiny

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def long_records(tmp_path: Path, model, capfd=None) -> Path:
    """16 records of about 700 tokens (beyond gym-tiny's 512), a pattern the model can learn."""
    path = tmp_path / "long.jsonl"
    rows = [{"instruction": f"count from {WORDS[i % 10]}", "output": " ".join(WORDS * 60)} for i in range(16)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = ingest(resolve_dataset(str(path)))
    out = tokenize(data.path, model.path, model.template, TokenizeSettings(cutoff_len=1024))
    assert out.stats["max_len"] > 600 and out.num_truncated == 0, out.stats
    if capfd is not None:  # transformers' handler writes to stderr
        err = capfd.readouterr().err
        assert "indexing errors" not in err, "gym cuts to cutoff_len: no warning about the model's length"
    return Path(out.path)


def inv_freq(model) -> torch.Tensor:
    return model.model.rotary_emb.inv_freq.detach().clone()


def test_each_type_stretches_the_context_to_cover_cutoff_len():
    model = tiny()
    assert rope.plan(None, model, 4096) == ({}, None)
    kwargs, words = rope.plan("linear", model, 2000)
    assert kwargs == {
        "rope_scaling": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        "max_position_embeddings": 2048,
    }
    assert words == "linear x4 for cutoff_len 2000: context 512 -> 2048 tokens"
    yarn, _ = rope.plan("yarn", model, 1024)
    assert (
        yarn["rope_scaling"]["original_max_position_embeddings"] == 512
        and yarn["max_position_embeddings"] == 1024
    )
    llama3, _ = rope.plan("llama3", model, 1024)
    assert (
        llama3["rope_scaling"].items()
        >= {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "factor": 2.0}.items()
    )
    dynamic, _ = rope.plan("dynamic", model, 1024)
    assert dynamic["max_position_embeddings"] == 512, "dynamic NTK scales beyond the original context"
    assert rope.plan("linear", model, 512)[0] == {}, "cutoff_len fits: RoPE as it is"
    assert "fits the model's context of 512" in str(rope.plan("linear", model, 512)[1])


def test_the_scaled_model_keeps_its_own_rope_theta(tmp_path):
    base = tiny()
    folder = tmp_path / "theta"
    shutil.copytree(base.path, folder)
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = 50000.0
    config.get("rope_parameters", {}).update(rope_theta=50000.0)
    (folder / "config.json").write_text(json.dumps(config))
    model = derived(base, folder, "theta")
    plain = load_model(model)
    kwargs, _ = rope.plan("linear", model, 1024)
    scaled = load_model(model, **kwargs)
    assert scaled.config.rope_parameters["rope_theta"] == 50000.0
    assert torch.allclose(inv_freq(scaled), inv_freq(plain) / 2), "linear x2: every frequency halved"


def test_a_stage_trains_beyond_the_context_and_saves_the_scaling(tmp_path, capfd):
    model = tiny()
    data = long_records(tmp_path, model, capfd)
    config = TrainConfig(
        method="sft",
        learning_rate=3e-3,
        max_steps=12,
        per_device_train_batch_size=2,
        logging_steps=2,
        rope_scaling="linear",
    )
    result = train.run(config, model, data)
    assert result.choices["rope_scaling"].startswith("linear x2 for cutoff_len 1024")
    losses = [loss for _, loss in result.losses]
    assert losses[-1] < 0.8 * losses[0], losses
    saved = json.loads((Path(result.model_dir) / "config.json").read_text())
    assert saved["max_position_embeddings"] == 1024
    tokenizer = json.loads((Path(result.model_dir) / "tokenizer_config.json").read_text())
    assert tokenizer["model_max_length"] == 1024, "the saved tokenizer takes the stretched context"
    assert {k: saved["rope_parameters"][k] for k in ("rope_type", "factor")} == {
        "rope_type": "linear",
        "factor": 2.0,
    }
    trained = derived(model, Path(result.model_dir), result.digest)
    assert torch.allclose(inv_freq(load_model(trained)), inv_freq(load_model(model)) / 2)
    assert rope.plan("linear", trained, 1024)[0] == {}, "a next stage at the same cutoff_len: scaled already"
    with pytest.raises(
        ConfigError, match=r"scaled already \(linear, factor 2.0\) to a context of 1024 tokens"
    ):
        rope.plan("yarn", trained, 4096)


def test_a_lora_stage_merges_into_a_model_that_carries_the_scaling(tmp_path):
    model = tiny()
    config = TrainConfig(
        method="sft",
        finetuning_type="lora",
        learning_rate=1e-2,
        max_steps=4,
        per_device_train_batch_size=2,
        rope_scaling="yarn",
    )
    result = train.run(config, model, long_records(tmp_path, model))
    saved = json.loads((Path(result.model_dir) / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "yarn" and saved["max_position_embeddings"] == 1024

    # The bare adapter merged into its base later (gym export, gym chat --adapter_name_or_path) loads the
    # base stretched as the stage did: the same model as the stage's own merge, at 1,024 positions.
    adapter = Path(str(result.adapter_dir))
    merged = export_model(adapter, tmp_path / "merged", ExportSettings(), base=model.path)
    config_out = json.loads((merged / "config.json").read_text())
    assert {k: config_out[k] for k in ("rope_parameters", "max_position_embeddings")} == {
        k: saved[k] for k in ("rope_parameters", "max_position_embeddings")
    }
    assert json.loads((merged / "tokenizer_config.json").read_text())["model_max_length"] == 1024
    ids = torch.arange(3, 903).unsqueeze(0) % 200 + 3  # 900 positions: beyond the base's 512
    with torch.no_grad():
        stage = load_model(derived(model, Path(result.model_dir), "stage"))(ids).logits
        exported = load_model(derived(model, merged, "merged"))(ids).logits
    assert torch.allclose(stage, exported, atol=1e-5)
    # Exported alone, the adapter keeps the record and its card says how to load the base
    alone = export_model(adapter, tmp_path / "alone", ExportSettings(adapter_only=True), base=model.path)
    assert (alone / rope.ADAPTER_FILE).is_file() and "rope_scaling=" in (alone / "README.md").read_text()
    (adapter / rope.ADAPTER_FILE).write_text("{}")
    with pytest.raises(ConfigError, match="not the RoPE record gym writes beside an adapter"):
        export_model(adapter, tmp_path / "broken", ExportSettings(), base=model.path)
    assert not (tmp_path / "broken").exists(), "nothing half-written"


def test_rope_scaling_is_refused_beside_unsloth():
    rope.check(TrainConfig(rope_scaling="linear"))
    with pytest.raises(ConfigError, match=r"turn off one of rope_scaling and speed\.unsloth"):
        rope.check(TrainConfig(rope_scaling="linear", speed={"unsloth": True}))


def test_data_beyond_the_context_without_rope_scaling_gets_a_hint():
    model = tiny()
    note = rope.hint(None, model, 795)
    assert note is not None and "795 tokens, beyond gym-tiny's context of 512" in note
    assert "the stage's rope_scaling (linear, dynamic, yarn or llama3)" in note
    assert rope.hint(None, model, 512) is None and rope.hint("linear", model, 795) is None
