"""New special tokens (LLaMA-Factory's new_special_tokens, gym.vocab): gym-tiny gains <think> and
</think> as single tokens with embedding rows of their own, and a stage trains those rows
(beside a LoRA adapter, or in freeze) while the base's rows stay bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym import train, vocab
from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.data.tokenize import TokenizeSettings, tokenize
from gym.errors import ConfigError
from gym.export import ExportSettings, export_model
from gym.models import load_model, load_tokenizer, resolve
from gym.pipeline import TfGrpoFlowConfig, TrainFlowConfig
from gym.train import TrainConfig, adapters
from tests.helpers import tiny

TOKENS = ["<think>", "</think>"]


def embeddings(folder: str | Path) -> torch.Tensor:
    weights = load_file(str(Path(folder) / "model.safetensors"))
    return next(v for k, v in weights.items() if k.endswith("embed_tokens.weight"))


def test_the_tokens_become_single_special_tokens_with_rows_of_their_own():
    base = tiny()
    ref = vocab.extend(base, TOKENS)
    assert ref.digest != base.digest and ref.template == base.template and ref.base_model == base.base_model
    tokenizer = load_tokenizer(ref)
    assert ref.new_token_ids == [len(load_tokenizer(base)), len(load_tokenizer(base)) + 1]
    assert tokenizer("a<think>b</think>", add_special_tokens=False)["input_ids"][1] == ref.new_token_ids[0]
    text = "<think>1 plus 2</think> 3"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ref.new_token_ids[1] in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text, "kept in replies and completions"
    old, new = embeddings(base.path), embeddings(ref.path)
    assert new.shape[0] == old.shape[0] + 2
    assert torch.equal(new[: old.shape[0]], old), "the base's rows are untouched"
    rows = new[old.shape[0] :]
    assert torch.isfinite(rows).all() and not torch.equal(rows[0], rows[1])
    model = load_model(ref)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    # Written once per model and token list; the same draw when written again
    stamp = (Path(ref.path) / "model.safetensors").stat().st_mtime_ns
    assert vocab.extend(base, TOKENS) == ref
    assert (Path(ref.path) / "model.safetensors").stat().st_mtime_ns == stamp
    again = Path(ref.path).with_name("again")
    Path(ref.path).rename(again)
    assert torch.equal(embeddings(vocab.extend(base, TOKENS).path), embeddings(again))
    assert vocab.extend(base, []) == base


def test_the_token_list_is_checked_and_lf_strings_are_split():
    assert vocab.parse("<think>, </think>,<think>") == TOKENS
    assert TrainFlowConfig(new_special_tokens="<think>,</think>").new_special_tokens == TOKENS
    with pytest.raises(ConfigError, match="an empty token in '<think>,'"):
        vocab.parse("<think>,")
    with pytest.raises(ConfigError, match="tf_grpo trains no weights"):
        TfGrpoFlowConfig.from_train_flow(TrainFlowConfig(new_special_tokens=TOKENS))


def test_the_command_line_and_a_llamafactory_yaml_reach_the_flow(tmp_path):
    from gym.cli_options import read_config_file
    from tests.test_cli_llamafactory import parse as parse_flow

    assert parse_flow(["--new_special_tokens", "<think>", "</think>"])["new_special_tokens"] == TOKENS
    path = tmp_path / "lf.yaml"
    path.write_text('new_special_tokens: "<think>,</think>"\nresize_vocab: true\n')
    assert parse_flow([], file=read_config_file(path))["new_special_tokens"] == TOKENS


def thinking_data(tmp_path: Path, ref) -> Path:
    """Answers that think between the new tokens first: the model must learn to emit them."""
    path = tmp_path / "think.jsonl"
    rows = [
        {"instruction": f"add {a} and {b}", "output": f"<think>{a} plus {b}</think> {a + b}"}
        for a in range(4)
        for b in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = tokenize(ingest(resolve_dataset(str(path))).path, ref.path, ref.template, TokenizeSettings())
    return Path(data.path)


def think_first(ref, folder: str) -> float:
    """The probability that the answer to a prompt starts with <think>, under the model in `folder`."""
    tokenizer = load_tokenizer(ref)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "add 1 and 2"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    model = load_model(ref.model_copy(update={"path": folder}))
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    return float(logits.softmax(-1)[ref.new_token_ids[0]])


def test_a_lora_stage_trains_the_new_rows_and_records_them(tmp_path):
    ref = vocab.extend(tiny(), TOKENS)
    config = TrainConfig(
        method="sft",
        finetuning_type="lora",
        learning_rate=3e-2,
        max_steps=20,
        per_device_train_batch_size=4,
        logging_steps=2,
    )
    result = train.run(config, ref, thinking_data(tmp_path, ref))
    assert result.choices["new_special_tokens"].startswith("2 new token rows (ids 4096, 4097) train as PEFT")
    losses = [loss for _, loss in result.losses]
    assert losses[-1] < 0.9 * losses[0], losses
    base_p, trained_p = (think_first(ref, folder) for folder in (ref.path, result.model_dir))
    assert trained_p > 10 * base_p, ("the model learnt to open its answer with <think>", base_p, trained_p)
    before, after = embeddings(ref.path), embeddings(result.model_dir)
    new = ref.new_token_ids
    assert not torch.equal(after[new], before[new]), "the new rows trained"
    old = [i for i in range(before.shape[0]) if i not in new]
    assert torch.equal(after[old], before[old]), "every other row is the base's, bit for bit"
    # The bare adapter (its token rows inside) merged later into its base gives the same model
    merged = export_model(Path(str(result.adapter_dir)), tmp_path / "merged", ExportSettings())
    assert torch.equal(embeddings(merged), after)
    trained = resolve(result.model_dir)
    assert trained.new_token_ids == new, "a next stage (or --model on the result) trains them too"
    assert "<think>" in load_tokenizer(trained).convert_ids_to_tokens(new)


def test_freeze_trains_the_embeddings_when_tokens_were_added():
    ref = vocab.extend(tiny(), TOKENS)
    config = TrainConfig(method="sft", finetuning_type="freeze", freeze={"layers": 1})
    model = adapters.adapt(load_model(ref), config, ref, Path("unused"))
    assert model.get_input_embeddings().weight.requires_grad
    frozen = [p.requires_grad for n, p in model.named_parameters() if ".layers.0." in n]
    assert frozen and not any(frozen), "the layers freeze keeps frozen stay frozen"
    plain = adapters.adapt(load_model(tiny()), config, tiny(), Path("unused"))
    assert not plain.get_input_embeddings().weight.requires_grad, "without new tokens: as before"
