"""Every adaptation type learns and moves only the weights it should (gym-tiny, demo data, CPU).

Each training test starts from `warm_tiny` (gym-tiny after a short SFT), trains a few steps (loss
on every token: held-out loss falls by 5% or more) and
compares the saved (merged) model with the start model tensor by tensor: the intended tensors
changed, every other one is bit-identical. LoRA types adapt only q_proj and v_proj here, so the
other linear layers must come out untouched too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym import train
from gym.errors import ConfigError
from gym.models import ModelRef, load_model
from gym.train import TrainConfig, adapters, quant, reference, s2attn
from gym.train.config import LoraSettings
from tests.helpers import tiny, tokenized

TARGETS = ["q_proj", "v_proj"]
LORA = LoraSettings(r=8, alpha=16, target_modules=TARGETS)


def weights(model_dir: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def changed(before: dict, after: dict) -> set[str]:
    assert set(before) == set(after), "the saved model has the start model's tensors, nothing else"
    return {k for k in before if not torch.equal(before[k], after[k])}


def is_norm(name: str) -> bool:
    return "norm" in name


def adapted(name: str) -> bool:
    return any(f".{t}." in name for t in TARGETS)


# finetuning_type -> (extra TrainConfig fields, which tensors must change (all others must not))
CASES = {
    "freeze": ({"freeze": {"layers": 1}}, lambda n: n.startswith("model.layers.1.")),
    "lora": ({}, adapted),
    "rslora": ({}, adapted),
    "dora": ({}, adapted),
    "pissa": ({}, adapted),
    "loraplus": ({}, adapted),
    "longlora": ({}, lambda n: adapted(n) or is_norm(n) or n == "model.embed_tokens.weight"),
    "qlora": ({"quant": {"bits": 4}}, adapted),
}


def run_type(model: ModelRef, finetuning_type: str, **fields) -> train.TrainResult:
    lr = 3e-3 if finetuning_type == "freeze" else 1e-2
    config = TrainConfig(
        method="sft",
        finetuning_type=finetuning_type,
        learning_rate=lr,
        max_steps=16,
        per_device_train_batch_size=16,
        logging_steps=4,
        **{"lora": LORA, **fields},
    )
    # Loss on every token: the warm model never learnt to predict the prompts, so each type has
    # something to learn within a few steps (its answers plateau until much later).
    data = tokenized("demo_sft", model, max_samples=256, train_on_prompt=True)
    return train.run(
        config, model, data, tokenized("demo_sft_eval", model, max_samples=48, train_on_prompt=True)
    )


@pytest.mark.parametrize("finetuning_type", sorted(CASES))
def test_each_type_learns_and_moves_only_its_weights(warm_tiny, finetuning_type):
    fields, should_change = CASES[finetuning_type]
    result = run_type(warm_tiny, finetuning_type, **fields)
    # Held-out loss, measured before and after on the same records: the update generalised.
    assert result.eval_after["eval_loss"] < 0.95 * result.eval_before["eval_loss"], result.eval_after
    before, after = weights(warm_tiny.path), weights(result.model_dir)
    expected = {k for k in before if should_change(k)}
    assert changed(before, after) == expected
    assert 0 < result.trainable_params < result.total_params
    if finetuning_type in EXTRA_CHECKS:
        EXTRA_CHECKS[finetuning_type](warm_tiny, result)


def loraplus_b_learns_faster(start: ModelRef, result: train.TrainResult) -> None:
    state = torch.load(Path(result.stage_dir) / "checkpoints/checkpoint-16/optimizer.pt", weights_only=False)
    groups = [(len(g["params"]), g["initial_lr"]) for g in state["param_groups"] if g["params"]]
    # 2 layers x 2 targets: the 4 A matrices at the learning rate, the 4 B matrices at 16 x it.
    assert sorted(groups) == [(4, 1e-2), (4, 16e-2)]


def pissa_adapter_fits_the_original_base(start: ModelRef, result: train.TrainResult) -> None:
    """PiSSA trains an adapter over a residual base; the saved adapter must apply to the original one."""
    from peft import PeftModel

    merged = PeftModel.from_pretrained(load_model(start), result.adapter_dir).merge_and_unload()
    saved = weights(result.model_dir)
    for name, tensor in merged.state_dict().items():
        if name in saved:
            torch.testing.assert_close(tensor, saved[name], atol=1e-5, rtol=1e-4)


def qlora_as_asked(start: ModelRef, result: train.TrainResult) -> None:
    assert result.choices["quant_bits"] == "4-bit (given)"


EXTRA_CHECKS = {
    "loraplus": loraplus_b_learns_faster,
    "pissa": pissa_adapter_fits_the_original_base,
    "qlora": qlora_as_asked,
}


def test_variants_are_the_lora_settings_that_name_them():
    for finetuning_type, setting in [("rslora", "use_rslora"), ("dora", "use_dora")]:
        via_type = adapters.lora_settings(TrainConfig(finetuning_type=finetuning_type))
        via_flag = adapters.lora_settings(TrainConfig(finetuning_type="lora", lora={setting: True}))
        assert via_type == via_flag and getattr(via_type, setting)
    assert adapters.lora_settings(TrainConfig(finetuning_type="pissa")).init == "pissa"
    assert adapters.lora_settings(TrainConfig(finetuning_type="loraplus")).loraplus_lr_ratio == 16.0
    given = TrainConfig(finetuning_type="loraplus", lora={"loraplus_lr_ratio": 4.0})
    assert adapters.lora_settings(given).loraplus_lr_ratio == 4.0
    # A setting that contradicts the variant is refused (the variant won, silently)
    with pytest.raises(ConfigError, match=r"pissa is LoRA with lora\.init pissa, but lora\.init is gaussian"):
        adapters.lora_settings(TrainConfig(finetuning_type="pissa", lora={"init": "gaussian"}))
    from flows.runner import build_parser, parse_config
    from gym.pipeline import TrainFlowConfig

    for kind, name in [("dora", "use_dora"), ("rslora", "use_rslora"), ("pissa", "pissa_init")]:
        args = build_parser(TrainFlowConfig).parse_args(["--finetuning_type", kind, f"--{name}", "false"])
        with pytest.raises(ConfigError, match=f"{name}: false, but finetuning_type {kind} is LoRA with"):
            parse_config(TrainFlowConfig, args)
    # gym's own spelling, before anything runs (a false that is also the default can't be told apart later)
    for kind, flag in [
        ("dora", "use_dora=false"),
        ("rslora", "use_rslora=false"),
        ("pissa", "init=gaussian"),
    ]:
        argv = ["--finetuning_type", kind, f"--train.lora.{flag}"]
        with pytest.raises(
            ConfigError, match=rf"^train\.lora\.{flag.split('=')[0]} is .*, but finetuning_type {kind}"
        ):
            parse_config(TrainFlowConfig, build_parser(TrainFlowConfig).parse_args(argv))
    argv = ["--finetuning_type", "dora", "--train.lora.use_dora=true"]  # as the variant says: fine
    assert parse_config(TrainFlowConfig, build_parser(TrainFlowConfig).parse_args(argv))


def test_rslora_scales_by_the_square_root_of_the_rank():
    base = load_model(tiny())
    lora = {"r": 16, "alpha": 16, "target_modules": TARGETS}
    model = adapters.adapt(
        base, TrainConfig(finetuning_type="rslora", lora=lora), tiny(), Path("/nonexistent")
    )
    assert model.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"] == pytest.approx(16 / 4)


@pytest.mark.parametrize(("bits", "layer"), [(4, "Linear4bit"), (8, "Linear8bitLt")])
def test_qlora_base_layers_are_bitsandbytes_modules(bits, layer):
    config = TrainConfig(finetuning_type="qlora", quant={"bits": bits}, lora=LORA)
    ref = tiny()
    model = adapters.adapt(load_model(ref, **quant.load_kwargs(config)), config, ref, Path("/nonexistent"))
    attn = model.base_model.model.model.layers[0].self_attn
    assert type(attn.q_proj.base_layer).__name__ == layer  # adapted: LoRA over a quantized layer
    assert type(attn.k_proj).__name__ == layer  # not adapted: quantized and frozen
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


def test_qlora_in_bf16_keeps_frozen_weights_as_stored_and_learns(warm_tiny):
    """The GPU's layout on this CPU: a bf16 base under the 4-bit layers, float32 LoRA weights, activations
    checkpointed. Frozen norms and embeddings stay bf16 (no float32 upcast of the residual stream)."""
    config = TrainConfig(finetuning_type="qlora", quant={"bits": 4, "compute_dtype": "bfloat16"}, lora=LORA)
    config, _ = train.plan(config, warm_tiny, 8, 0)
    model = adapters.adapt(load_model(warm_tiny, **quant.load_kwargs(config)), config, warm_tiny, Path("/x"))
    dtypes = {p.dtype for n, p in model.named_parameters() if "lora_" not in n and p.dtype.is_floating_point}
    assert dtypes == {torch.bfloat16}, dtypes
    assert config.gradient_checkpointing
    result = run_type(warm_tiny, "qlora", quant={"bits": 4, "compute_dtype": "bfloat16"})
    assert result.eval_after["eval_loss"] < 0.95 * result.eval_before["eval_loss"], result.eval_after
    before, after = weights(warm_tiny.path), weights(result.model_dir)
    assert changed(before, after) == {k for k in before if adapted(k)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("bits", [4, 8])
def test_on_a_gpu_qlora_trains_over_a_cuda_quantized_base_with_paged_adamw(warm_tiny, bits):
    """QLoRA as users run it: bitsandbytes' CUDA kernels, bf16 compute, paged 8-bit AdamW (CUDA only)."""
    import bitsandbytes as bnb

    config = TrainConfig(finetuning_type="qlora", quant={"bits": bits}, lora=LORA)
    model = load_model(warm_tiny, **quant.load_kwargs(config))
    k_proj = model.model.layers[0].self_attn.k_proj
    assert k_proj.weight.device.type == "cuda"
    quantized = (bnb.nn.Params4bit, bnb.nn.Int8Params)[bits == 8]
    assert isinstance(k_proj.weight, quantized)
    if bits == 4:
        assert k_proj.weight.quant_state.dtype == torch.bfloat16  # the compute dtype on a bf16 GPU
    del model
    result = run_type(warm_tiny, "qlora", quant={"bits": bits})
    assert result.eval_after["eval_loss"] < 0.95 * result.eval_before["eval_loss"], result.eval_after
    before, after = weights(warm_tiny.path), weights(result.model_dir)
    assert changed(before, after) == {k for k in before if adapted(k)}
    checkpoint = Path(result.stage_dir) / "checkpoints/checkpoint-16"
    assert torch.load(checkpoint / "training_args.bin", weights_only=False).optim == "paged_adamw_8bit"


def test_qlora_bit_width_follows_memory():
    params = 7_000_000_000  # 7B: an 8-bit LoRA base needs about 10 GiB by the registry's estimate
    bits, why = quant.choose_bits(params, 80.0, "free on the GPU")
    assert bits == 8 and "fits" in why
    bits, why = quant.choose_bits(params, 8.0, "free on the GPU")
    assert bits == 4 and "exceeds" in why and "4-bit estimate" in why
    config, choices = quant.resolve(TrainConfig(finetuning_type="qlora"), tiny())
    assert config.quant.bits in (4, 8) and choices["quant_bits"].startswith(f"{config.quant.bits}-bit")
    assert config.optim == ("paged_adamw_8bit" if torch.cuda.is_available() else "adamw_bnb_8bit")


def test_qlora_checkpoints_activations_unless_told_not_to_and_other_types_do_not():
    ref = tiny()
    qlora, choices = train.plan(TrainConfig(finetuning_type="qlora"), ref, 8, 0)
    assert qlora.gradient_checkpointing is True and choices["gradient_checkpointing"].startswith("on")
    given = TrainConfig(finetuning_type="qlora", gradient_checkpointing=False)
    fast, choices = train.plan(given, ref, 8, 0)
    assert fast.gradient_checkpointing is False and "gradient_checkpointing" not in choices
    for finetuning_type in ("full", "lora"):
        config, choices = train.plan(TrainConfig(finetuning_type=finetuning_type), ref, 8, 0)
        assert config.gradient_checkpointing is False and "gradient_checkpointing" not in choices
    # The stage's TRL arguments follow: TRL 1.12's own default would be on.
    assert train.common.trl_args(qlora, Path("out"))["gradient_checkpointing"] is True
    assert train.common.trl_args(TrainConfig(), Path("out"))["gradient_checkpointing"] is False


def test_reference_mode_is_the_cheaper_one():
    lora = TrainConfig(method="dpo", finetuning_type="lora", max_steps=10, per_device_train_batch_size=8)
    short, why = reference.choose(lora, n_train=800, n_eval=100)  # 80 + 200 live < 900 precomputed
    assert short.reference == "live" and "live" in why["reference"]
    long, _ = reference.choose(lora.model_copy(update={"max_steps": 200}), n_train=800, n_eval=100)
    assert long.reference == "precomputed"
    full, why = reference.choose(lora.model_copy(update={"finetuning_type": "full"}), 800, 100)
    assert full.reference == "precomputed" and "second copy" in why["reference"]
    assert reference.choose(lora.model_copy(update={"method": "orpo"}), 800, 100)[1] == {}


def dense_groups(q, k, v, allowed, group):
    """The attention S2-Attn must equal: dense SDPA masked to groups, the second half of the heads
    on groups shifted by half a group (rows left with nothing to attend see themselves)."""
    n, pos, out = q.shape[2], torch.arange(q.shape[2]), []
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    half = q.shape[1] // 2
    for heads, shift in ((slice(0, half), 0), (slice(half, None), group // 2)):
        gid = (pos + shift) // group
        mask = (allowed & (gid[:, None] == gid[None, :])) | torch.eye(n, dtype=torch.bool)
        out.append(
            torch.nn.functional.scaled_dot_product_attention(q[:, heads], k[:, heads], v[:, heads], mask)
        )
    return torch.cat(out, 1).transpose(1, 2)


def test_s2attn_equals_dense_attention_within_shifted_groups():
    class Attention(torch.nn.Module):
        num_key_value_groups = 2

    module = Attention()
    setattr(module, s2attn._RATIO, 0.25)
    b, h, n, d = 2, 4, 13, 8
    q, k, v = torch.randn(b, h, n, d), torch.randn(b, h // 2, n, d), torch.randn(b, h // 2, n, d)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None].expand(b, 1, n, n)
    real = torch.ones(b, n, dtype=torch.bool)
    real[1, 10:] = False  # the second sequence is right-padded
    padded = causal & real[:, None, None, :]
    module.train()
    for mask, allowed in ((None, causal), (padded, padded)):
        out, _ = s2attn.s2_attention_forward(module, q, k, v, mask, scaling=d**-0.5)
        torch.testing.assert_close(out, dense_groups(q, k, v, allowed, group=4))  # 4 = ceil(13 x 0.25)
    module.eval()  # inference: full attention, exactly SDPA
    out, _ = s2attn.s2_attention_forward(module, q, k, v, padded, scaling=d**-0.5)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), attn_mask=padded
    )
    torch.testing.assert_close(out, dense.transpose(1, 2))


def test_longlora_switches_attention_and_trains_embeddings_and_norms():
    ref = tiny()
    config = TrainConfig(finetuning_type="longlora", lora=LORA)
    model = adapters.adapt(load_model(ref), config, ref, Path("/nonexistent"))
    assert model.config._attn_implementation == s2attn.NAME
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any("embed_tokens" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable if "norm" in n} >= {
        "input_layernorm",
        "post_attention_layernorm",
    }
    s2attn.disable(model.get_base_model())
    assert model.config._attn_implementation == "sdpa"


def test_freeze_names_what_exists_when_a_module_is_unknown():
    ref = tiny()
    with pytest.raises(ConfigError, match="self_attn, mlp"):
        adapters.freeze(load_model(ref), TrainConfig(finetuning_type="freeze", freeze={"modules": ["attn"]}))
    with pytest.raises(ConfigError, match="has 2 decoder layers"):
        adapters.check(TrainConfig(finetuning_type="freeze", freeze={"layers": 3}), ref)


def test_lora_names_the_linear_layers_when_a_target_is_unknown():
    ref = tiny()
    model = load_model(ref)
    linear = "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"
    config = TrainConfig(finetuning_type="lora", lora={"target_modules": ["q_proj", "qv_proj"]})
    with pytest.raises(ConfigError, match=f"no module named 'qv_proj'; its linear layers: {linear}$"):
        adapters.lora_config(model, config, ref)
    # A model with none of the registry's default targets (an architecture that names them otherwise).
    other = ref.model_copy(update={"lora_target_modules": ["c_attn", "c_proj"]})
    with pytest.raises(ConfigError, match=r"none of the modules LoRA adapts by default \(c_attn, c_proj\)"):
        adapters.lora_config(model, TrainConfig(finetuning_type="lora"), other)
    # Full module names (PEFT matches suffixes) and the registry's defaults pass as before.
    full = TrainConfig(finetuning_type="lora", lora={"target_modules": ["layers.0.self_attn.q_proj"]})
    assert adapters.lora_config(model, full, ref).target_modules == {"layers.0.self_attn.q_proj"}
    assert adapters.lora_config(model, TrainConfig(finetuning_type="lora"), ref).target_modules == set(
        ref.lora_target_modules
    )
    # A comma-separated value to gym's own list flag: how to give the names ("no module named 'q,v'")
    commas = TrainConfig(finetuning_type="lora", lora={"target_modules": ["q_proj,v_proj"]})
    with pytest.raises(ConfigError, match=r"'q_proj,v_proj' is one name: .*target_modules q_proj v_proj;"):
        adapters.lora_config(model, commas, ref)


def test_bad_adaptation_settings_fail_before_the_stage_starts(gym_home):
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=8)
    with pytest.raises(ConfigError, match="decoder layers"):
        train.run(TrainConfig(finetuning_type="freeze", freeze={"layers": -5}), model, data)
    with pytest.raises(ConfigError, match="PiSSA"):
        train.run(TrainConfig(finetuning_type="qlora", lora={"init": "pissa"}), model, data)
    assert not list((gym_home / "models").glob("sft-*")), "no stage directory, so no model was loaded"


def test_longlora_names_what_a_model_without_the_attention_interface_lacks():
    from tests.fixtures.legacy_attention import LegacyConfig, LegacyModel

    with pytest.raises(ConfigError, match=r"AttentionInterface.*shift_attention false"):
        s2attn.enable(LegacyModel(LegacyConfig()), 0.25)


def test_lora_on_the_output_layer_trains_sft(gym_home):
    # TRL's chunked SFT loss reads lm_head's weight directly and refused an adapter there (a traceback)
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    lora = {"target_modules": ["lm_head", "q_proj"]}
    config = TrainConfig(finetuning_type="lora", lora=lora, max_steps=8, learning_rate=3e-3)
    result = train.run(config, model, data)
    assert result.losses[-1][1] < result.losses[0][1]
    saved = load_file(str(Path(result.adapter_dir) / "adapter_model.safetensors"))
    head = [k for k in saved if "lm_head" in k and "lora_B" in k]
    assert head and all(saved[k].abs().sum() > 0 for k in head), "the output layer's adapter learned"
