"""gym's padding-free SDPA (gym.train.varlen): flattened sequences attend only within themselves,
gradients equal training each sequence alone, no dense block mask is built, and anything that is not
a flattened batch (padded batches, generation) behaves exactly as transformers' SDPA."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gym.errors import ConfigError
from gym.models import load_model, load_tokenizer
from gym.train import speed, varlen
from gym.train.speed import Resolved
from tests.helpers import ARCHITECTURES, tiny

LENGTHS = [5, 17, 9, 30, 1, 12]


def sequences(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4000, (n,), generator=generator) for n in LENGTHS]


def flattened(seqs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.cat(seqs)[None],
        "position_ids": torch.cat([torch.arange(len(s)) for s in seqs])[None],
    }


@pytest.fixture(scope="module")
def models():
    ref = tiny()
    sdpa = load_model(ref, attn_implementation="sdpa").train()
    flat = load_model(ref, **speed.load_options(Resolved("sdpa", True, False, False, False, False))).train()
    return sdpa, flat


def test_padding_free_sdpa_loads_gyms_varlen_attention_and_padded_stays_sdpa(models):
    _, flat = models
    assert flat.config._attn_implementation == varlen.NAME
    padded = speed.load_options(Resolved("sdpa", False, False, False, False, False))
    assert padded["attn_implementation"] == "sdpa"
    flash = speed.load_options(Resolved("flash_attention_2", True, False, False, False, False))
    assert flash["attn_implementation"] == "flash_attention_2", "flash's own varlen kernel is left alone"


def test_flattened_sequences_get_the_logits_and_gradients_they_get_alone(models, monkeypatch):
    sdpa, flat = models
    seqs = sequences()
    sdpa.zero_grad()
    alone = torch.cat([sdpa(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
    alone.sum().backward()
    expected = {n: p.grad.clone() for n, p in sdpa.named_parameters()}

    import transformers.masking_utils as masking

    def dense(*args, **kwargs):
        raise AssertionError("a dense mask was built for a flattened batch")

    monkeypatch.setattr(masking, "sdpa_mask", dense)
    flat.zero_grad()
    together = flat(**flattened(seqs)).logits[0]  # with the default cache too: still kept apart
    together.sum().backward()
    assert (together - alone).abs().max() < 1e-5
    for name, p in flat.named_parameters():
        assert torch.allclose(p.grad, expected[name], atol=2e-3, rtol=1e-4), name
    # The control: the same row as one long sequence mixes them.
    leaky = flat(input_ids=flattened(seqs)["input_ids"]).logits[0]
    assert (leaky - alone).abs().max() > 1e-2


def test_several_rows_of_flattened_sequences_stay_apart(models):
    sdpa, flat = models
    seqs = sequences(1)
    rows = [seqs[:3], seqs[3:]]  # 31 and 43 tokens: pad the first row with a sequence of its own
    rows[0] = [*rows[0], torch.randint(3, 4000, (12,))]
    batch = [flattened(r) for r in rows]
    together = flat(
        input_ids=torch.cat([b["input_ids"] for b in batch]),
        position_ids=torch.cat([b["position_ids"] for b in batch]),
        use_cache=False,
    ).logits
    for row, r in zip(together, rows, strict=True):
        alone = torch.cat([sdpa(input_ids=s[None], use_cache=False).logits[0] for s in r])
        assert (row - alone).abs().max() < 1e-5


def test_padded_batches_and_generation_match_sdpa(models):
    sdpa, flat = models
    sdpa.eval()
    flat.eval()
    try:
        tokenizer = load_tokenizer(tiny())
        tokenizer.padding_side = "left"
        enc = tokenizer(["the quick brown fox", "a", "jumps over"], return_tensors="pt", padding=True)
        assert (enc["attention_mask"] == 0).any()
        with torch.no_grad():
            a = sdpa(**enc).logits
            b = flat(**enc).logits
        real = enc["attention_mask"].bool()
        assert (a[real] - b[real]).abs().max() < 1e-5
        kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
        assert torch.equal(sdpa.generate(**enc, **kwargs), flat.generate(**enc, **kwargs))
    finally:
        sdpa.train()
        flat.train()


def _attention_alone(q, k, v, causal: bool, window: int | None = None) -> torch.Tensor:
    n = q.shape[2]
    i = torch.arange(n)
    mask = (i[None, :] <= i[:, None]) if causal else torch.ones(n, n, dtype=torch.bool)
    if window is not None:
        mask &= i[None, :] > i[:, None] - window
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)[0]


@pytest.mark.parametrize(("causal", "window"), [(True, None), (True, 4), (False, None)])
def test_the_attention_function_keeps_windows_and_bidirectional_layers_per_sequence(causal, window):
    heads, dim = 4, 8
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, heads, sum(LENGTHS), dim, generator=generator) for _ in range(3))
    position_ids = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    module = SimpleNamespace(is_causal=causal, num_key_value_groups=1, training=False)
    out, _ = varlen.varlen_attention_forward(
        module, q, k, v, None, position_ids=position_ids, sliding_window=window
    )
    start = 0
    for n in LENGTHS:
        piece = slice(start, start + n)
        expected = _attention_alone(q[:, :, piece], k[:, :, piece], v[:, :, piece], causal, window)
        assert (out[0, piece] - expected).abs().max() < 1e-5, (n, causal, window)
        start += n


def test_sequences_are_attended_in_groups_of_similar_length_not_padded_to_the_longest(monkeypatch):
    """One block padded to the batch's longest made a 3-token sequence beside a 90-token one cost as much
    as the 90: each SDPA call now holds sequences within GROUP_RATIO of its longest."""
    lengths = torch.randint(3, 91, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    heads, dim = 2, 8
    q, k, v = (torch.randn(1, heads, sum(lengths), dim) for _ in range(3))
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    blocks = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, *args, **kwargs):
        blocks.append(tuple(query.shape[i] for i in (0, 2)))  # sequences, longest
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    module = SimpleNamespace(is_causal=True, num_key_value_groups=1, training=False)
    out, _ = varlen.varlen_attention_forward(module, q, k, v, None, position_ids=position_ids)
    assert sum(count for count, _ in blocks) == len(lengths) and len(blocks) > 1
    work = sum(count * longest**2 for count, longest in blocks)  # attention's score entries, padded
    assert work <= varlen.GROUP_RATIO**2 * sum(n * n for n in lengths)
    assert work < len(lengths) * max(lengths) ** 2 / 2, "well under one block padded to the longest"
    start = 0
    for n in lengths:
        piece = slice(start, start + n)
        expected = _attention_alone(q[:, :, piece], k[:, :, piece], v[:, :, piece], causal=True)
        assert (out[0, piece] - expected).abs().max() < 1e-5, n
        start += n


def test_a_model_that_does_not_pass_position_ids_fails_with_what_to_do():
    q = torch.randn(1, 2, 6, 4)
    module = SimpleNamespace(is_causal=True, num_key_value_groups=1)
    with pytest.raises(ConfigError, match="set padding_free off"):
        varlen.varlen_attention_forward(module, q, q, q, None)


def test_a_sliding_window_model_keeps_its_window_flattened_or_not():
    from transformers import MistralConfig, MistralForCausalLM

    size = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 4}
    torch.manual_seed(0)
    sdpa = MistralForCausalLM(MistralConfig(**size, **heads, attn_implementation="sdpa")).train()
    flat = MistralForCausalLM(MistralConfig(**size, **heads, attn_implementation=varlen.register()))
    flat.load_state_dict(sdpa.state_dict())
    flat.train()
    seqs = [torch.randint(0, 100, (n,)) for n in (9, 12, 3)]
    alone = [sdpa(input_ids=s[None], use_cache=False).logits[0] for s in seqs]
    together = flat(**flattened(seqs)).logits[0]
    assert (together - torch.cat(alone)).abs().max() < 1e-5
    for s, expected in zip(seqs, alone, strict=True):  # one sequence, no position ids given
        assert (flat(input_ids=s[None], use_cache=False).logits[0] - expected).abs().max() < 1e-5
    windowless = MistralForCausalLM(MistralConfig(**size, **{**heads, "sliding_window": None}))
    windowless.load_state_dict(sdpa.state_dict())
    assert (windowless.train()(input_ids=seqs[1][None]).logits[0] - alone[1]).abs().max() > 1e-2, "control"


def test_trls_flash_only_warning_is_dropped_for_gyms_varlen_and_kept_otherwise(tmp_path, caplog):
    from tests.helpers import tokenized
    from tests.test_speed import SFT, built_trainer, with_speed

    model_ref = tiny()
    data = tokenized("demo_sft", model_ref, max_samples=8)
    warned = "Padding-free training is enabled, but the attention implementation"
    with caplog.at_level("WARNING"):
        built_trainer(with_speed(SFT, padding_free="on"), model_ref, data, tmp_path / "varlen")
    assert warned not in caplog.text
    with caplog.at_level("WARNING"):
        eager = with_speed(SFT, padding_free="on", attn_implementation="eager")
        built_trainer(eager, model_ref, data, tmp_path)
    assert warned in caplog.text, "the control: eager attention still gets TRL's warning"
    assert not logging_filters(), "the filter is removed afterwards"


def logging_filters() -> list:
    import logging

    return logging.getLogger("trl.trainer.sft_trainer").filters


@pytest.mark.parametrize("family", list(ARCHITECTURES))
def test_other_architectures_keep_flattened_sequences_apart(family):
    import transformers

    config_name, model_name, extra = ARCHITECTURES[family]
    config_cls, model_cls = getattr(transformers, config_name), getattr(transformers, model_name)
    size = {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    shape = {**size, "num_attention_heads": 4, "num_key_value_heads": 2, **extra}
    torch.manual_seed(0)
    sdpa = model_cls(config_cls(**shape, attn_implementation="sdpa")).train()
    flat = model_cls(config_cls(**shape, attn_implementation=varlen.register()))
    flat.load_state_dict(sdpa.state_dict())
    flat.train()
    seqs = [torch.randint(2, 100, (n,)) for n in (9, 12, 3)]
    alone = torch.cat([sdpa(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
    together = flat(**flattened(seqs), use_cache=False).logits[0]
    assert (together - alone).abs().max() < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (SDPA's CUDA kernels, bf16)")
def test_on_a_gpu_flattened_sequences_stay_apart_in_bf16():
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    shape |= {"num_attention_heads": 4, "num_key_value_heads": 2}
    torch.manual_seed(0)
    sdpa = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation="sdpa")).to("cuda", torch.bfloat16)
    flat = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation=varlen.register()))
    flat.load_state_dict(sdpa.state_dict())
    flat.to("cuda", torch.bfloat16)
    seqs = [torch.randint(2, 100, (n,), device="cuda") for n in (90, 120, 30)]
    with torch.no_grad():
        alone = torch.cat([sdpa(input_ids=s[None], use_cache=False).logits[0] for s in seqs]).float()
        batch = {k: v.cuda() for k, v in flattened(seqs).items()}
        together = flat(**batch, use_cache=False).logits[0].float()
    assert (together - alone).abs().max() < 5e-2
