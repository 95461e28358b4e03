"""Model registry: the shipped registry/models.json is valid (every entry), broken entries are
reported with the entry and the field, and memory estimates follow the documented formula.

Run: .venv/bin/pytest tests/test_registry.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gym.errors import ConfigError, RegistryError
from gym.models import resolve
from gym.paths import registry_dir
from gym.registry import (
    GIB,
    ModelSpec,
    get_model,
    list_models,
    load_models,
    memory_estimates,
    memory_estimates_for,
    models_file,
)
from gym.templates import list_templates

LLAMA_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def shipped() -> dict:
    return json.loads(models_file().read_text(encoding="utf-8"))


def write(tmp_path: Path, doc: dict) -> Path:
    f = tmp_path / "models.json"
    f.write_text(json.dumps(doc), encoding="utf-8")
    return f


def broken(tmp_path: Path, shipped: dict, index: int, edit) -> Path:
    """A copy of the shipped registry with entry `index` changed by `edit(entry)`."""
    doc = copy.deepcopy(shipped)
    edit(doc["models"][index])
    return write(tmp_path, doc)


# --- the shipped registry -------------------------------------------------------------------


def test_every_shipped_entry_loads(shipped):
    models = load_models()
    assert list(models) == [e["name"] for e in shipped["models"]]
    assert all(isinstance(m, ModelSpec) for m in models.values())
    assert list_models() == list(models)


def test_registry_is_broad_enough():
    models = load_models()
    assert len(models) >= 20
    assert len({m.family for m in models.values()}) >= 6


def test_every_entry_names_an_existing_template():
    templates = set(list_templates())
    for spec in load_models().values():
        assert spec.template in templates, spec.name


def test_entries_are_consistent():
    for spec in load_models().values():
        assert spec.name == spec.name.lower()
        assert spec.special_tokens.eos
        assert (spec.hub_id is None) == (spec.builder is not None), spec.name
        assert spec.parameters > 0 and spec.context_length > 0
        if spec.architecture.startswith("Phi3"):
            assert set(spec.lora_target_modules) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
        else:
            assert set(spec.lora_target_modules) == set(LLAMA_LINEAR), spec.name


def test_gym_tiny_entry():
    spec = get_model("gym-tiny")
    assert spec.hub_id is None
    assert spec.family == "gym"
    assert spec.architecture == "LlamaForCausalLM"
    assert spec.template == "chatml"
    assert spec.special_tokens.model_dump() == {"bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>"}
    assert spec.modalities == ("text",)
    assert spec.context_length == 512
    assert spec.lora_target_modules == LLAMA_LINEAR
    assert spec.builder is not None and spec.builder["kind"] == "gym-tiny"
    assert spec.builder["config"]["model_type"] == "llama" and isinstance(spec.builder["seed"], int)
    assert isinstance(spec.parameters, int)


def test_known_entries():
    qwen = get_model("qwen2.5-7b-instruct")
    assert qwen.hub_id == "Qwen/Qwen2.5-7B-Instruct" and qwen.revision == "main"
    assert qwen.special_tokens.bos is None and qwen.special_tokens.eos == "<|im_end|>"
    llama = get_model("llama-3.1-8b-instruct")
    assert llama.template == "llama3.1" and llama.special_tokens.eos == "<|eot_id|>"
    assert get_model("tinyllama-1.1b").template == "alpaca"
    assert "vision" in get_model("gemma-3-4b-it").modalities


def test_unknown_model_suggests_close_names():
    with pytest.raises(RegistryError, match=r"unknown model 'qwen2.5-7b-instrct'.*'qwen2.5-7b-instruct'"):
        get_model("qwen2.5-7b-instrct")


def test_a_name_in_another_case_gets_the_entry_suggested():
    """`QWEN3-8B` was suggested nothing (gym registry listed every name; gym train, none)."""
    with pytest.raises(RegistryError, match=r"unknown model 'QWEN3-8B'.*; did you mean 'qwen3-8b',"):
        get_model("QWEN3-8B")
    with pytest.raises(ConfigError, match=r"unknown model 'QWEN3-0.6B'.* Did you mean: qwen3-0.6b"):
        resolve("QWEN3-0.6B")


def test_schema_file_is_draft_2020_12():
    schema = json.loads((registry_dir() / "models.schema.json").read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$defs"]["model"]["additionalProperties"] is False


# --- broken entries: the message names the entry and the field -------------------------------


def test_missing_field(tmp_path, shipped):
    f = broken(tmp_path, shipped, 3, lambda e: e.pop("family"))
    name = shipped["models"][3]["name"]
    with pytest.raises(RegistryError) as err:
        load_models(f)
    msg = str(err.value)
    assert f"entry {name!r} (models[3])" in msg and "$.models[3].family" in msg
    assert "missing required field 'family'" in msg


def test_wrong_type(tmp_path, shipped):
    f = broken(tmp_path, shipped, 2, lambda e: e.update(parameters="7B"))
    with pytest.raises(RegistryError, match=r"models\[2\]\).*\$\.models\[2\]\.parameters: expected integer"):
        load_models(f)


def test_wrong_nested_type(tmp_path, shipped):
    f = broken(tmp_path, shipped, 1, lambda e: e["special_tokens"].update(pad=0))
    with pytest.raises(RegistryError, match=r"\$\.models\[1\]\.special_tokens\.pad: expected string or null"):
        load_models(f)


def test_unknown_template(tmp_path, shipped):
    f = broken(tmp_path, shipped, 4, lambda e: e.update(template="qwen25"))
    name = shipped["models"][4]["name"]
    with pytest.raises(RegistryError) as err:
        load_models(f)
    msg = str(err.value)
    assert f"entry {name!r} (models[4])" in msg and "$.models[4].template" in msg
    assert "unknown chat template 'qwen25'" in msg and "did you mean 'qwen2.5'" in msg


def test_duplicate_name(tmp_path, shipped):
    first = shipped["models"][1]["name"]
    f = broken(tmp_path, shipped, 5, lambda e: e.update(name=first))
    with pytest.raises(
        RegistryError, match=rf"entry '{first}' \(models\[5\]\).*\$\.models\[5\]\.name: duplicate"
    ):
        load_models(f)


def test_typo_in_field_name(tmp_path, shipped):
    f = broken(tmp_path, shipped, 2, lambda e: e.update(context_lenght=e.pop("context_length")))
    with pytest.raises(RegistryError) as err:
        load_models(f)
    msg = str(err.value)
    assert "$.models[2].context_lenght: unknown field 'context_lenght'; did you mean 'context_length'?" in msg
    assert "$.models[2].context_length: missing required field" in msg


def test_a_train_defaults_key_naming_no_method_is_refused(tmp_path, shipped):
    # It was never read: the method trained with gym's defaults instead of the measured ones, silently
    f = broken(tmp_path, shipped, 0, lambda e: e["train_defaults"].update({"sftt": {"learning_rate": 0.1}}))
    with pytest.raises(
        RegistryError, match=r"\$\.models\[0\]\.train_defaults: 'sftt' names no method; did you mean 'sft'\?"
    ):
        load_models(f)


def test_a_train_defaults_family_typo_is_named_not_a_valid_key(tmp_path, shipped):
    # `sft:lroa` blamed the entry's valid `cdpo` key, with an empty list of what is allowed
    typo = {"sft:lroa": {"learning_rate": 0.1}}
    f = broken(tmp_path, shipped, 0, lambda e: e["train_defaults"].update(typo))
    with pytest.raises(RegistryError) as err:
        load_models(f)
    msg = str(err.value)
    assert "train_defaults.sft:lroa: unknown field 'sft:lroa'; allowed: names matching" in msg
    assert "(the family after ':' is full or lora)" in msg and "'cdpo'" not in msg


def test_a_train_defaults_setting_training_lacks_is_refused_naming_it():
    from gym.errors import ConfigError
    from gym.train.config import TrainConfig, with_defaults

    with pytest.raises(ConfigError, match=r"train_defaults for sft\) sets learning_rte, which gym"):
        with_defaults(TrainConfig(), {"sft": {"learning_rte": 0.1}})  # it was an AttributeError


def test_null_eos(tmp_path, shipped):
    f = broken(tmp_path, shipped, 1, lambda e: e["special_tokens"].update(eos=None))
    with pytest.raises(RegistryError, match=r"\$\.models\[1\]\.special_tokens\.eos: eos is null"):
        load_models(f)


def test_builder_xor_hub_id(tmp_path, shipped):
    both = broken(tmp_path, shipped, 1, lambda e: e.update(builder=shipped["models"][0]["builder"]))
    with pytest.raises(RegistryError, match=r"\$\.models\[1\]\.hub_id: both hub_id and builder are set"):
        load_models(both)
    neither = broken(tmp_path, shipped, 0, lambda e: e.pop("builder"))
    with pytest.raises(
        RegistryError, match=r"entry 'gym-tiny' \(models\[0\]\).*hub_id is null and there is no builder"
    ):
        load_models(neither)


def test_unnamed_entry_is_reported_by_index(tmp_path, shipped):
    f = broken(tmp_path, shipped, 6, lambda e: e.pop("name"))
    with pytest.raises(RegistryError, match=r"entry models\[6\], field \$\.models\[6\]\.name: missing"):
        load_models(f)


def test_bad_json_names_line(tmp_path):
    f = tmp_path / "models.json"
    f.write_text('{"models": [\n  {"name": "x",}\n]}', encoding="utf-8")
    with pytest.raises(RegistryError, match="not valid JSON at line 2"):
        load_models(f)


def test_missing_file(tmp_path):
    with pytest.raises(RegistryError, match="not found"):
        load_models(tmp_path / "nope.json")


# --- memory estimates ----------------------------------------------------------------------


def test_memory_formula_for_a_known_count():
    p = 7_000_000_000
    m = memory_estimates_for(p)
    assert m["inference"]["fp16"] == pytest.approx(p * 2 * 1.2 / GIB)
    assert m["inference"]["bf16"] == m["inference"]["fp16"]
    assert m["inference"]["int8"] == pytest.approx(p * 1 * 1.2 / GIB)
    assert m["inference"]["int4"] == pytest.approx(p * 0.5 * 1.2 / GIB)
    assert m["lora"]["bf16"] == pytest.approx((p * 2 + 0.01 * p * 16) * 1.3 / GIB)
    assert m["lora"]["int4"] == pytest.approx((p * 0.5 + 0.01 * p * 16) * 1.3 / GIB)  # QLoRA
    assert m["full"] == pytest.approx({"fp16": p * 16 * 1.3 / GIB, "bf16": p * 16 * 1.3 / GIB})
    assert m["inference"]["bf16"] == pytest.approx(15.65, abs=0.01)  # 7B in bf16: ~15.6 GiB to serve
    assert m["full"]["bf16"] == pytest.approx(135.60, abs=0.01)


def test_memory_is_monotonic():
    small, large = memory_estimates_for(1_000_000_000), memory_estimates_for(8_000_000_000)
    for kind, by_dtype in small.items():
        for dtype, gib in by_dtype.items():
            assert 0 < gib < large[kind][dtype]
    for m in (small, large):
        assert m["inference"]["int4"] < m["inference"]["int8"] < m["inference"]["bf16"]
        assert m["lora"]["int4"] < m["lora"]["int8"] < m["lora"]["bf16"] < m["full"]["bf16"]
        assert m["inference"]["bf16"] < m["lora"]["bf16"]


def test_every_entry_gets_estimates():
    for spec in load_models().values():
        m = memory_estimates(spec)
        assert set(m) == {"inference", "lora", "full"}
        assert set(m["inference"]) == set(m["lora"]) == {"fp16", "bf16", "int8", "int4"}
        assert set(m["full"]) == {"fp16", "bf16"}
        assert all(v > 0 for by_dtype in m.values() for v in by_dtype.values())


def test_a_bom_is_read_and_a_non_utf8_file_is_named_with_the_byte(tmp_path, shipped):
    f = tmp_path / "models.json"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps(shipped).encode())
    assert list(load_models(f)) == [e["name"] for e in shipped["models"]]
    f.write_bytes(b'{"models": [\n  {"name": "caf\xe9"}\n]}')
    with pytest.raises(RegistryError, match=r"models.json: not UTF-8 text: line 2, byte 16 is 0xe9"):
        load_models(f)
