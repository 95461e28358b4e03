"""Gradient checkpointing chosen from the memory a step needs (gym.train.memory)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym import train
from gym.train import TrainConfig, memory, quant
from tests.helpers import tiny, tokenized

# benchmarks/gpu_train.py's model and run, measured on an H200 (bf16, Liger, batches of 16 sequences of
# 900-1,024 tokens, padded to their longest; plan counts 16 x 1,024):
# gym's peak with activations kept 29.8 GiB, TRL's checkpointed peak 9.0 GiB.
H, INTER, LAYERS, VOCAB, KV = 1024, 4096, 28, 32768, 512
BENCH = memory.Shape(
    parameters=VOCAB * H * 2 + LAYERS * (2 * H * H + 2 * H * KV + 3 * H * INTER + 2 * H) + H,
    hidden=H,
    intermediate=INTER,
    layers=LAYERS,
    vocab=VOCAB,
)


def test_the_estimate_matches_what_an_h200_measured():
    config = TrainConfig(per_device_train_batch_size=16)
    kwargs = {"bf16": True, "liger": True}
    kept = memory.estimate_gib(config, BENCH, 16 * 1024, checkpointed=False, **kwargs)
    checked = memory.estimate_gib(config, BENCH, 16 * 1024, checkpointed=True, **kwargs)
    assert 29.8 <= kept <= 1.1 * 29.8, kept  # never below what was measured, at most 10% above
    assert 9.0 <= checked <= 1.1 * 9.0, checked
    # Without Liger the float32 logits and their gradient come on top; LoRA keeps only a copy of the base.
    full_logits = memory.estimate_gib(config, BENCH, 16 * 1024, checkpointed=False, bf16=True, liger=False)
    assert full_logits - kept == pytest.approx(16 * 1024 * VOCAB * 8 / 2**30)
    lora = TrainConfig(finetuning_type="lora", per_device_train_batch_size=16)
    lora_gib = memory.estimate_gib(lora, BENCH, 16 * 1024, checkpointed=True, **kwargs)
    assert lora_gib < checked - 4
    # QLoRA's frozen base at its bit width: 1.5 bytes less per parameter than bf16 at 4 bits.
    qlora = TrainConfig(finetuning_type="qlora", quant={"bits": 4}, per_device_train_batch_size=16)
    qlora_gib = memory.estimate_gib(qlora, BENCH, 16 * 1024, checkpointed=True, **kwargs)
    assert lora_gib - qlora_gib == pytest.approx(0.99 * BENCH.parameters * 1.5 / 2**30)


def test_tokens_per_step_count_both_answers_of_a_pair_and_whole_rows_when_packing():
    sft = TrainConfig(method="sft", per_device_train_batch_size=8)
    assert memory.tokens_per_step(sft, longest=300, cutoff_len=1024) == 8 * 300
    packed = sft.model_copy(update={"speed": sft.speed.model_copy(update={"packing": True})})
    assert memory.tokens_per_step(packed, longest=300, cutoff_len=1024) == 8 * 1024
    for method in ("dpo", "orpo", "kto"):
        pairs = TrainConfig(method=method, per_device_train_batch_size=8)
        assert memory.tokens_per_step(pairs, longest=300, cutoff_len=1024) == 2 * 8 * 300


def short_of_memory(monkeypatch: pytest.MonkeyPatch, gib: float) -> None:
    """This machine, as if `gib` were free on a GPU (the low-memory GPU a user has can't run here)."""
    monkeypatch.setattr(quant, "available_memory", lambda: (gib, "free on the GPU"))


def tiny_step_gib(config: TrainConfig, longest: int, checkpointed: bool) -> float:
    found = memory.shape(tiny())
    assert found is not None and found.hidden > 0 and found.layers > 0
    tokens = memory.tokens_per_step(config, longest, 1024)
    return memory.estimate_gib(config, found, tokens, bf16=False, liger=False, checkpointed=checkpointed)


def test_checkpointing_turns_on_only_when_a_step_would_not_fit(monkeypatch):
    config = TrainConfig(method="sft", per_device_train_batch_size=32)
    needed = tiny_step_gib(config, 40, checkpointed=False)
    short_of_memory(monkeypatch, 2 * needed)
    roomy, choices = train.plan(config, tiny(), 8, 0, cutoff_len=1024, longest=40)
    assert roomy.gradient_checkpointing is False and "gradient_checkpointing" not in choices
    short_of_memory(monkeypatch, needed)  # fits, but not within the 10% headroom
    tight, choices = train.plan(config, tiny(), 8, 0, cutoff_len=1024, longest=40)
    assert tight.gradient_checkpointing is True
    why = choices["gradient_checkpointing"]
    assert why.startswith("on:") and "free on the GPU" in why and "fits" in why, why
    # Longer data needs more: the same memory that fits 40-token rows doesn't fit 400-token ones.
    short_of_memory(monkeypatch, 2 * needed)
    long, _ = train.plan(config, tiny(), 8, 0, cutoff_len=1024, longest=400)
    assert long.gradient_checkpointing is True
    # The data's longest beyond cutoff_len is cut by TRL: cutoff_len counts.
    assert memory.resolve(config, tiny(), 10**6, 40)[0].gradient_checkpointing is False
    # Set by the user, the field is left alone either way; off where it won't fit, with a warning.
    short_of_memory(monkeypatch, 1e-6)
    for given in (True, False):
        told = config.model_copy(update={"gradient_checkpointing": given})
        kept, choices = train.plan(told, tiny(), 8, 0, cutoff_len=1024, longest=40)
        assert kept.gradient_checkpointing is given
        if given:
            assert "gradient_checkpointing" not in choices
        else:
            assert choices["gradient_checkpointing"].startswith("off as set, but a step of")
            assert "may run out of memory" in choices["gradient_checkpointing"]
    told_off = config.model_copy(update={"gradient_checkpointing": False})
    short_of_memory(monkeypatch, 2 * needed)
    assert "gradient_checkpointing" not in train.plan(told_off, tiny(), 8, 0, cutoff_len=1024, longest=40)[1]
    # Even checkpointed it won't fit: the choice says so.
    short_of_memory(monkeypatch, 1e-6)
    _, choices = train.plan(config, tiny(), 8, 0, cutoff_len=1024, longest=40)
    assert "may still NOT fit" in choices["gradient_checkpointing"]


def test_an_unreadable_model_keeps_the_default(monkeypatch):
    short_of_memory(monkeypatch, 1e-6)
    missing = tiny().model_copy(update={"path": "/nonexistent/model", "base_model": "not-in-the-registry"})
    assert memory.shape(missing) is None
    assert memory.resolve(TrainConfig(), missing, 40, 1024)[0].gradient_checkpointing is False


def test_a_run_resumed_short_of_memory_checkpoints_and_ends_with_the_same_weights(warm_tiny, monkeypatch):
    data = tokenized("demo_sft", warm_tiny, max_samples=64)
    config = TrainConfig(
        method="sft",
        learning_rate=3e-3,
        max_steps=6,
        per_device_train_batch_size=16,
        save_steps=3,
        logging_steps=2,
    )
    kept = train.run(config, warm_tiny, data)  # uninterrupted, activations kept
    assert "gradient_checkpointing" not in kept.choices
    assert kept.losses[-1][1] < kept.losses[0][1]
    stage = Path(kept.stage_dir)
    uninterrupted = load_file(Path(kept.model_dir) / "model.safetensors")
    # As if the process had died after step 3: only checkpoint-3 is left.
    for done in ("result.json", "model", "checkpoints/checkpoint-6"):
        shutil.rmtree(stage / done) if (stage / done).is_dir() else (stage / done).unlink()
    short_of_memory(monkeypatch, 1e-6)  # the GPU is busier now: this time gym checkpoints
    # ... and saves every step (the same stage: which checkpoints a run keeps changes no weight)
    resumed = train.run(config.model_copy(update={"save_steps": 1, "save_total_limit": 5}), warm_tiny, data)
    assert resumed.choices["gradient_checkpointing"].startswith("on:")
    assert resumed.stage_dir == kept.stage_dir and resumed.resumed_from is not None
    assert Path(resumed.resumed_from).name == "checkpoint-3"
    # Its tokens/s is the resumed part's (it was null): the tokens since checkpoint-3, over its time
    assert resumed.tokens_seen == kept.tokens_seen and 0 < resumed.tokens_at_resume < resumed.tokens_seen
    ran = resumed.tokens_seen - resumed.tokens_at_resume
    assert resumed.tokens_per_second == round(ran / resumed.train_seconds, 1)

    def trained_with(checkpoint: str) -> bool:
        args = stage / "checkpoints" / checkpoint / "training_args.bin"
        return bool(torch.load(args, weights_only=False).gradient_checkpointing)

    assert not trained_with("checkpoint-3") and trained_with("checkpoint-6")
    # the resumed run saved as its own save_steps said (it kept the checkpoint's: every 3)
    assert {f"checkpoint-{n}" for n in (4, 5)} <= {p.name for p in (stage / "checkpoints").iterdir()}
    # Recomputing activations changes memory, not the result: the same weights, bit for bit.
    after = load_file(Path(resumed.model_dir) / "model.safetensors")
    before = load_file(Path(warm_tiny.path) / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in after)
    for name in after:
        assert torch.equal(uninterrupted[name], after[name]), name


def test_qlora_bit_width_counts_the_activations_of_a_step_on_the_data(monkeypatch):
    # A 7B Llama with 20 GiB free: the registry's estimate (weights and LoRA state, ~9.5 GiB at 8 bits) fits
    # either way; batches of 8 x 4,096 tokens add ~11 GiB of checkpointed activations, which only 4 bits
    # leave room for (before, both got 8 bits and the long run ran out of memory).
    llama7b = memory.Shape(parameters=6_738_415_616, hidden=4096, intermediate=11008, layers=32, vocab=32000)
    for batch, longest, bits_wanted in ((4, 2048, 8), (8, 4096, 4)):
        config = TrainConfig(finetuning_type="qlora", per_device_train_batch_size=batch)
        tokens = memory.tokens_per_step(config, longest, 4096)
        step = {}
        for bits in (8, 4):
            at = config.model_copy(update={"quant": config.quant.model_copy(update={"bits": bits})})
            step[bits] = memory.estimate_gib(at, llama7b, tokens, bf16=True, liger=True, checkpointed=True)
        assert quant.choose_bits(llama7b.parameters, 20.0, "free on the GPU")[0] == 8  # weights alone
        bits, why = quant.choose_bits(llama7b.parameters, 20.0, "free on the GPU", step, tokens)
        assert bits == bits_wanted and f"a step of {tokens} tokens" in why, why
        if bits == 4:
            assert "exceeds" in why and "4-bit estimate" in why and "fits" in why, why
    # Through plan, on gym-tiny: short data gets 8 bits, the data's longest row of 1,024 tokens gets 4.
    short_of_memory(monkeypatch, 0.5)
    qlora = TrainConfig(finetuning_type="qlora", per_device_train_batch_size=32)
    short, choices = train.plan(qlora, tiny(), 8, 0, cutoff_len=1024, longest=40)
    assert short.quant.bits == 8 and "a step of 1280 tokens" in choices["quant_bits"], choices
    long, choices = train.plan(qlora, tiny(), 8, 0, cutoff_len=1024, longest=4000)
    assert long.quant.bits == 4 and "a step of 32768 tokens" in choices["quant_bits"], choices
    assert long.gradient_checkpointing is True
