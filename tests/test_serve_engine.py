"""The serving engine in-process: chat templates, experience injection, limits, nucleus sampling."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gym.errors import ConfigError, MissingExtraError
from gym.models import resolve
from gym.serve.engine import Engine, RequestError
from gym.serve.loading import resolve_served
from gym.serve.params import SamplingParams
from gym.serve.sampling import draw, nucleus, row_generator
from gym.templates import load_template
from gym.tfgrpo.injection import EXPERIENCE_FILE, experience_block


def tiny_copy(dest: Path) -> Path:
    shutil.copytree(resolve("gym-tiny").path, dest)
    return dest


def test_the_template_comes_from_the_flag_the_model_or_else_its_tokenizer(tmp_path):
    registry = resolve_served("gym-tiny")
    assert registry.template_name == "chatml" and registry.chat_template == load_template("chatml")
    # llama3's <|eot_id|>... on this ChatML tokenizer is refused (test_serve_qa_fixes2): another template
    assert resolve_served("gym-tiny", template="alpaca").chat_template == load_template("alpaca")

    plain = tiny_copy(tmp_path / "plain")  # no gym metadata: the tokenizer's own template, as vLLM does
    served = resolve_served(str(plain))
    assert served.template_name is None and served.chat_template == load_template("chatml")

    (plain / "gym_model.json").write_text(json.dumps({"template": "alpaca", "base_model": "gym-tiny"}))
    assert resolve_served(str(plain)).template_name == "alpaca"


def test_a_model_without_any_chat_template_is_refused_with_a_hint(tmp_path):
    bare = tiny_copy(tmp_path / "bare")
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="--template"):
        resolve_served(str(bare))
    assert resolve_served(str(bare), template="chatml").template_name == "chatml"


def test_a_shipped_experience_library_reaches_every_chat_prompt(tmp_path):
    model = tiny_copy(tmp_path / "tfgrpo")
    items = [{"id": "e1", "text": "Check units."}, {"id": "e2", "text": "Answer in one word."}]
    (model / EXPERIENCE_FILE).write_text(json.dumps({"items": items}))
    with Engine.load(str(model)) as engine, Engine.load("gym-tiny") as plain:
        messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2+2?"}]
        prompt = engine.render_chat(messages)
        block = experience_block(["Check units.", "Answer in one word."])
        assert f"Be exact.\n\n{block}" in prompt and block not in plain.render_chat(messages)
        with_block = engine.chat(messages, max_tokens=2, temperature=0)
        without = plain.chat(messages, max_tokens=2, temperature=0)
        assert with_block.prompt_tokens > without.prompt_tokens
        completions_get_the_library_only_when_asked(engine, block)


def completions_get_the_library_only_when_asked(engine: Engine, block: str) -> None:
    """/v1/completions over HTTP: the raw prompt as sent by default, the block before it with `prefix`."""
    import openai

    from gym.serve.app import build_app
    from gym.serve.cli import parse_settings
    from gym.serve.server import serve_in_thread

    raw = "Question: 2+2?\nAnswer:"
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    expected = {
        "none": engine.encode_text(raw),
        "prefix": engine.encode_text(f"{block}\n\n") + engine.encode_text(raw),
    }
    for mode, ids in expected.items():
        with serve_in_thread(build_app(engine, completion_experiences=mode)) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            got = client.completions.create(
                model=engine.name, prompt=raw, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
            )
        assert got.usage.prompt_tokens == len(ids), mode
        assert got.choices[0].text == engine.generate(ids, greedy).choices[0].text, mode
    assert (
        parse_settings(["--model", "m", "--completion_experiences", "prefix"]).completion_experiences
        == "prefix"
    )
    assert parse_settings(["--model", "m"]).completion_experiences == "none"


def test_requests_the_model_cannot_hold_are_refused_before_generating():
    with Engine.load("gym-tiny", max_batch_size=4) as engine:
        assert engine.context_length == 512
        assert engine.model.config._attn_implementation == "gym_sdpa_gqa"  # gym-tiny: 8 heads, 4 kv
        with pytest.raises(RequestError, match="maximum context length is 512"):
            engine.generate([5] * 500, SamplingParams(max_tokens=20))
        with pytest.raises(RequestError, match="batch size 4"):
            engine.generate([5], SamplingParams(n=5))
        with pytest.raises(RequestError, match="empty"):
            engine.generate([], SamplingParams())
        assert engine.stats["batches"] == 0
        ok = engine.generate([5, 6, 7], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        assert ok.completion_tokens == 3 and ok.choices[0].finish_reason == "length"


def test_nucleus_keeps_the_smallest_set_holding_top_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]])
    kept = nucleus(probs, torch.tensor([0.75, 0.5]))
    assert torch.equal(kept, torch.tensor([[0.5, 0.3, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5]]))
    assert torch.equal(nucleus(probs, torch.tensor([1.0, 1.0])), probs)


def test_draw_samples_each_row_from_its_distribution_whatever_shares_the_batch():
    """Frequencies match each row's probabilities (zero-probability tokens never come up), and a row
    draws the same tokens alone as beside other rows, given its generator's seed."""
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.1, 0.0, 0.9], [0.25, 0.25, 0.25, 0.25]])
    draws = 20_000
    gens = [row_generator(seed, 0) for seed in (1, 2, 3)]
    picked = torch.cat([draw(probs, gens) for _ in range(draws)], dim=1)  # [rows, draws]
    counts = torch.stack([torch.bincount(row, minlength=4) for row in picked]).float() / draws
    assert counts[0, 3] == 0 and counts[1, 0] == 0 and counts[1, 2] == 0
    assert torch.allclose(counts, probs, atol=0.015), counts  # > 4 standard deviations
    gen = row_generator(2, 0)
    alone = [draw(probs[1:2], [gen]).item() for _ in range(200)]
    gens = [row_generator(seed, 0) for seed in (7, 2, 9)]
    together = [draw(probs[[2, 1, 0]], gens)[1].item() for _ in range(200)]
    assert alone == together and len(set(alone)) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (generators on the GPU)")
def test_on_a_gpu_rows_draw_with_their_own_cuda_generators():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.1, 0.0, 0.9]], device="cuda")
    gens = [row_generator(seed, 0, "cuda") for seed in (1, 2)]
    picked = torch.cat([draw(probs, gens) for _ in range(5000)], dim=1)
    assert picked.device.type == "cuda"
    counts = torch.stack([torch.bincount(row, minlength=4) for row in picked]).float() / 5000
    assert counts[0, 3] == 0 and counts[1, 0] == 0 and torch.allclose(counts, probs, atol=0.03), counts


def test_grouped_heads_under_a_mask_match_transformers_sdpa_bitwise():
    """The engine's attention (gym/attention.py) skips transformers' per-head copies of keys and
    values under a padding mask; its outputs, and a padded batch's greedy generation, stay bitwise
    those of transformers' SDPA."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from gym import attention

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=300)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    layer = model.model.layers[0].self_attn
    q, k, v = torch.randn(3, 8, 5, 8), torch.randn(3, 2, 12, 8), torch.randn(3, 2, 12, 8)
    mask = torch.ones(3, 1, 5, 12, dtype=torch.bool)
    mask[0, :, :, :4] = False
    ours = attention.gqa_sdpa_forward(layer, q, k, v, mask, scaling=0.3)[0]
    assert torch.equal(ours, sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)[0])
    ids = torch.randint(3, 300, (3, 20))
    padding = torch.ones_like(ids)
    padding[0, :6] = 0
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=padding).logits
        greedy = model.generate(input_ids=ids, attention_mask=padding, max_new_tokens=8, do_sample=False)
        model.set_attn_implementation(attention.register())
        assert model.config._attn_implementation == attention.NAME
        assert torch.equal(model(input_ids=ids, attention_mask=padding).logits, before)
        again = model.generate(input_ids=ids, attention_mask=padding, max_new_tokens=8, do_sample=False)
    assert torch.equal(again, greedy)


def test_other_backends_fail_early_with_what_to_install():
    from gym.serve.backends import require

    for backend in ("vllm", "sglang"):
        with pytest.raises(MissingExtraError, match=f"--backend {backend} needs"):
            require(backend)
