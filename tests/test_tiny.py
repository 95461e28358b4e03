"""gym-tiny: built deterministically from its builder entry, reused once built, and loaded offline
exactly like a downloaded hub model (model, tokenizer, chat template, generate).

Run: .venv/bin/pytest -q tests/test_tiny.py
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gym.errors import ConfigError
from gym.templates import render
from gym.tiny import count_parameters, ensure_tiny, registry_builder


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "home"


@pytest.fixture
def built(home: Path) -> Path:
    return ensure_tiny(registry_builder(), "chatml")


def test_builds_under_models_with_a_content_name(built: Path, home: Path) -> None:
    assert built.parent == home.resolve() / "models" and built.name.startswith("gym-tiny-")
    names = {p.name for p in built.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not any(n.endswith((".bin", ".py")) for n in names)  # safetensors only, no remote code


def test_same_builder_same_bytes_in_another_home(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "other"))
    rng_before = torch.get_rng_state()
    again = ensure_tiny(registry_builder(), "chatml")
    assert torch.equal(rng_before, torch.get_rng_state()), "building must not touch torch's global RNG"
    assert again != built and again.name == built.name
    assert (again / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()


def test_second_call_reuses(built: Path) -> None:
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny(registry_builder(), "chatml") == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp


def test_other_seed_other_model(built: Path) -> None:
    other = registry_builder()
    other["seed"] = 1
    path = ensure_tiny(other, "chatml")
    assert path != built
    assert (path / "model.safetensors").read_bytes() != (built / "model.safetensors").read_bytes()


def test_concurrent_callers_share_one_build(home: Path) -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_tiny())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    models = home.resolve() / "models"
    assert [p.name for p in models.iterdir() if p.is_dir()] == [results[0].name]  # no temp dirs left


def test_bad_builder_is_a_config_error(home: Path) -> None:
    with pytest.raises(ConfigError, match="kind"):
        ensure_tiny({**registry_builder(), "kind": "other"}, "chatml")
    small = registry_builder()
    small["config"]["vocab_size"] = 100
    with pytest.raises(ConfigError, match="vocab_size"):
        ensure_tiny(small, "chatml")


def test_loads_and_generates_like_a_hub_model(built: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(built)
    tok = AutoTokenizer.from_pretrained(built)
    assert count_parameters(built) == sum(p.numel() for p in model.parameters())
    assert model.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert tok.pad_token_id == 0
    enc = tok(["Hello", "你好，世界"], return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 2 and enc["input_ids"].shape[1] < out.shape[1] <= enc["input_ids"].shape[1] + 4


def test_tokenizer_round_trips_and_answer_letters(built: Path) -> None:
    tok = AutoTokenizer.from_pretrained(built)
    for text in ["The quick brown fox jumps over 13 lazy dogs.", "请计算 23+5 的结果。你好，世界！"]:
        assert tok.decode(tok(text)["input_ids"]) == text
    for letter in "ABCD":
        assert len(tok(f" {letter}", add_special_tokens=False)["input_ids"]) == 1
    assert tok("2024", add_special_tokens=False)["input_ids"] == [
        tok.convert_tokens_to_ids(c) for c in "2024"
    ]


def test_chat_template_is_set(built: Path) -> None:
    tok = AutoTokenizer.from_pretrained(built)
    messages = [
        {"role": "user", "content": "Reverse the digits.\n123"},
        {"role": "assistant", "content": "321"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    expected = "<|im_start|>user\nReverse the digits.\n123<|im_end|>\n<|im_start|>assistant\n321<|im_end|>\n"
    assert text == expected
    assert text == render(tok, messages, "chatml")
    prompt = tok.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_registry_parameter_count_matches_the_built_model(built: Path) -> None:
    from gym.registry import get_model

    assert get_model("gym-tiny").parameters == count_parameters(built)


def test_a_builder_config_transformers_refuses_is_one_error_naming_the_entry(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was huggingface_hub's StrictDataclassClassValidationError, which the resolve task retried three
    times (~1 minute) before a traceback: a mistake in the registry, not a transient failure."""
    import json
    import shutil

    from gym.models import resolve
    from gym.paths import registry_dir

    registry = tmp_path / "registry"
    shutil.copytree(registry_dir(), registry)
    doc = json.loads((registry / "models.json").read_text())
    doc["models"][0]["builder"]["config"]["num_attention_heads"] = 7
    (registry / "models.json").write_text(json.dumps(doc))
    monkeypatch.setenv("GYM_REGISTRY", str(registry))
    says = r"models\.json: entry 'gym-tiny': builder\.config can't build a model \(The hidden size \(64\)"
    with pytest.raises(ConfigError, match=says):
        resolve("gym-tiny")
    assert not list((home / "models").glob("gym-tiny-*")), "nothing half-built is left"
