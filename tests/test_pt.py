"""Continued pretraining (method pt): raw text records, their blocks of cutoff_len tokens, the pt stage,
LLaMA-Factory's pt entries and `--stage pt`, and the flow without exact match.

Run: OMP_NUM_THREADS=1 .venv/bin/pytest -q tests/test_pt.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from flows.commands import demo_args, method_of
from gym import train
from gym.data import llamafactory
from gym.data.formats import require_kind
from gym.data.ingest import ingest
from gym.data.registry import DatasetSpec, resolve_dataset
from gym.data.tokenize import TokenizeSettings, document_end, text_blocks, tokenize
from gym.errors import ConfigError, DataError
from gym.pipeline import TrainFlowConfig
from gym.train import TrainConfig
from gym.train.config import LoraSettings
from tests.helpers import tiny, tokenized

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "gym" / "assets" / "gym_tiny"
TEXTS = ["The cat sat on the mat.", "猫坐在垫子上。", "A dog ran in the park.", "Birds sing."]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def rows(path: Path) -> list[dict]:
    return datasets.load_from_disk(str(path)).to_list()


def joined(blocks: list[dict]) -> list[int]:
    return [token for block in blocks for token in block["input_ids"]]


# ---- records ------------------------------------------------------------------------------------


def test_text_records_are_detected_mapped_and_kept_as_written(tmp_path: Path):
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"text": t, "url": "x"} for t in TEXTS])
    spec = resolve_dataset(plain)
    assert spec.format == "text" and spec.kind == "text"
    result = ingest(spec)
    assert result.kind == "text" and rows(result.path) == [{"text": t} for t in TEXTS]
    # Another column read as the text through `columns`.
    other = write_jsonl(tmp_path / "content.jsonl", [{"content": t} for t in TEXTS[:2]])
    mapped = ingest(resolve_dataset(other, format="text", columns={"text": "content"}))
    assert rows(mapped.path) == [{"text": t} for t in TEXTS[:2]]
    require_kind("text", "pt")
    with pytest.raises(ConfigError, match=r"method 'pt' needs a text dataset .*non-empty text"):
        require_kind("sft", "pt")
    with pytest.raises(ConfigError, match=r"'sft' needs a sft dataset .* is text data"):
        require_kind("text", "sft")


@pytest.mark.parametrize(
    ("record", "field", "words"),
    [
        ({"text": "   "}, "text", "is empty"),
        ({"text": 42}, "text", "must be a string, got int 42"),
        ({"text": None}, "text", "missing; text records need a non-empty `text` string"),
        ({"body": "hi"}, "text", "missing; text records need a non-empty `text` string"),
    ],
)
def test_a_bad_text_record_names_file_record_and_field(tmp_path: Path, record, field, words):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, record])
    with pytest.raises(DataError) as err:
        ingest(DatasetSpec(name="bad", file=str(path), format="text"))
    assert (err.value.file, err.value.record, err.value.field) == (str(path), 2, field)
    assert words in str(err.value)


def test_a_mapped_text_column_is_named_in_its_own_spelling(tmp_path: Path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"content": ""}])
    with pytest.raises(DataError) as err:
        ingest(DatasetSpec(name="bad", file=str(path), format="text", columns={"text": "content"}))
    assert err.value.field == "content" and "read as 'text' through `columns`" in str(err.value)


# ---- LLaMA-Factory's dataset_info.json ----------------------------------------------------------


def test_llamafactory_pt_entries_read_as_text_and_alpaca_entries_stay_alpaca(tmp_path: Path):
    write_jsonl(tmp_path / "c4_demo.jsonl", [{"text": t} for t in TEXTS])
    write_jsonl(tmp_path / "qa.jsonl", [{"question": "Hi?", "output": "Hello."}])
    (tmp_path / "wiki_demo.txt").write_text(f"{TEXTS[0]}\n\n{TEXTS[1]}\n", encoding="utf-8")
    info = {
        "c4_demo": {"file_name": "c4_demo.jsonl", "columns": {"prompt": "text"}},
        "wiki_demo": {"file_name": "wiki_demo.txt", "columns": {"prompt": "text"}},
        "fineweb": {"hf_hub_url": "HuggingFaceFW/fineweb", "columns": {"prompt": "text"}},
        # An instruction entry naming only prompt, its answers in the default `output` column.
        "qa": {"file_name": "qa.jsonl", "columns": {"prompt": "question"}},
        "qa_full": {"file_name": "qa.jsonl", "columns": {"prompt": "question", "response": "output"}},
        "alpaca": {"file_name": "qa.jsonl"},
    }
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    c4 = llamafactory.find("c4_demo", tmp_path)
    assert c4 is not None and (c4["format"], c4["columns"]) == ("text", {"text": "text"})
    assert rows(ingest(resolve_dataset("c4_demo", data_root=tmp_path)).path) == [{"text": t} for t in TEXTS]
    # A .txt file: a record per line, blank lines skipped, as datasets' "text" loader reads it.
    wiki = ingest(resolve_dataset("wiki_demo", data_root=tmp_path))
    assert wiki.kind == "text" and rows(wiki.path) == [{"text": TEXTS[0]}, {"text": TEXTS[1]}]
    hub = llamafactory.find("fineweb", tmp_path)
    assert hub is not None and (hub["format"], hub["columns"]) == ("text", {"text": "text"})
    for name in ("qa", "qa_full", "alpaca"):
        entry = llamafactory.find(name, tmp_path)
        assert entry is not None and entry["format"] == "alpaca", name
    columns = llamafactory.find("qa", tmp_path)["columns"]  # type: ignore[index]
    assert columns == {"instruction": "question", "system": "", "history": ""}  # the last two unread


def test_the_pt_rule_reads_a_file_once_until_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A prompt-only entry's file is looked at for `output` once per version of the file, not on each of
    the several resolves of a run (a .json file is parsed whole to read its first record)."""
    data = tmp_path / "qa.json"
    data.write_text(json.dumps([{"question": "Hi?"}]), encoding="utf-8")
    (tmp_path / "dataset_info.json").write_text(
        json.dumps({"qa": {"file_name": "qa.json", "columns": {"prompt": "question"}}})
    )
    reads: list[str] = []
    real = llamafactory.read_source

    def counting(source, **kwargs):
        reads.append(str(source))
        return real(source, **kwargs)

    monkeypatch.setattr(llamafactory, "read_source", counting)
    for _ in range(3):
        assert llamafactory.find("qa", tmp_path)["format"] == "text"  # type: ignore[index]
    assert len(reads) == 1
    # Rewritten with answers: read again, and now it is instruction data.
    data.write_text(json.dumps([{"question": "Hi?", "output": "Hello, there."}]), encoding="utf-8")
    assert llamafactory.find("qa", tmp_path)["format"] == "alpaca"  # type: ignore[index]
    assert len(reads) == 2


# ---- tokenization -------------------------------------------------------------------------------


def test_texts_join_with_eos_into_full_blocks_of_labels_equal_to_ids(tmp_path: Path):
    tok = AutoTokenizer.from_pretrained(str(TINY))
    data = ingest(resolve_dataset(write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in TEXTS])))
    stream: list[int] = []
    for text in TEXTS:
        stream += [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    result = tokenize(data.path, TINY, "chatml", TokenizeSettings(cutoff_len=8))
    blocks = rows(result.path)
    assert result.kind == "text" and result.num_records == len(stream) // 8 == len(blocks)
    assert all(b["labels"] == b["input_ids"] and len(b["input_ids"]) == 8 for b in blocks)
    # The texts in order, each ended by eos; the tail shorter than a block is dropped and counted.
    assert joined(blocks) == stream[: len(blocks) * 8]
    assert result.stats["dropped_tokens"] == len(stream) % 8 and result.stats["num_texts"] == len(TEXTS)
    assert result.stats["num_label_tokens"] == len(blocks) * 8
    # No chat template: not a single ChatML marker.
    assert tok.convert_tokens_to_ids("<|im_start|>") not in stream
    # max_samples keeps the first texts before they are joined.
    few = tokenize(data.path, TINY, "chatml", TokenizeSettings(cutoff_len=4, max_samples=1))
    assert joined(rows(few.path)) == stream[: len(rows(few.path)) * 4]
    assert few.stats["num_texts"] == 1


def test_preview_shows_the_first_blocks_all_trained_on():
    from gym.data.preview import preview

    shown = preview("demo_text", n=1, model="gym-tiny")
    assert "--- block 1 (1024 tokens)\n⟦" in shown and "<|im_end|>" in shown and "--- block 2" not in shown


def test_too_little_text_for_one_block_says_so(tmp_path: Path):
    data = ingest(resolve_dataset(write_jsonl(tmp_path / "t.jsonl", [{"text": "Hi."}])))
    with pytest.raises(DataError, match=r"fewer than one block of cutoff_len=1024") as err:
        tokenize(data.path, TINY, "chatml", TokenizeSettings())
    assert "lower cutoff_len" in str(err.value)
    assert str(err.value).startswith(f"dataset {tmp_path / 't.jsonl'}: ")  # the user's file, not gym's copy


def test_every_block_starts_with_bos_when_the_tokenizer_adds_one():
    texts = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7, 2], [8, 9, 2]]})
    blocks, stats = text_blocks(texts, 4, bos=1)
    # bos, then cutoff_len - 1 text tokens: no text token is written over.
    assert blocks["input_ids"] == [[1, 5, 6, 7], [1, 2, 8, 9]] and blocks["labels"] == blocks["input_ids"]
    assert stats["dropped_tokens"] == 1
    plain, _ = text_blocks(texts, 4, bos=None)
    assert plain["input_ids"] == [[5, 6, 7, 2]]
    with pytest.raises(ConfigError, match="cutoff_len must be at least 2"):
        text_blocks(texts, 1, bos=1)


def test_llama3_texts_end_with_end_of_text_not_the_turn_end():
    class Llama3Like:
        eos_token_id = 9  # <|eot_id|>: ends a chat turn

        def get_vocab(self) -> dict[str, int]:
            return {"<|end_of_text|>": 7, "<|eot_id|>": 9}

        def convert_tokens_to_ids(self, token: str) -> int:
            return self.get_vocab()[token]

    assert document_end(Llama3Like(), "llama3") == 7 and document_end(Llama3Like(), "llama3.1") == 7
    assert document_end(Llama3Like(), "chatml") == 9


# ---- training -----------------------------------------------------------------------------------


def pt_data(cutoff: int = 64) -> tuple[Path, Path]:
    model = tiny()
    return (
        tokenized("demo_text", model, max_samples=400, cutoff_len=cutoff),
        tokenized("demo_text_eval", model, max_samples=60, cutoff_len=cutoff),
    )


def test_pt_lowers_the_held_out_loss_and_reports_perplexity(gym_home):
    model = tiny()
    train_data, eval_data = pt_data()
    config = TrainConfig(
        method="pt", learning_rate=1e-2, max_steps=10, per_device_train_batch_size=8, logging_steps=5
    )
    result = train.run(config, model, train_data, eval_data)
    assert result.metric_name == "eval_loss"
    assert result.metric_last < 0.8 * result.metric_first, (result.metric_first, result.metric_last)
    assert result.eval_after["eval_perplexity"] == pytest.approx(math.exp(result.metric_last))
    assert result.tokens_seen == 10 * 8 * 64  # every block is full: no padding
    # Without held-out data the signal is the training loss.
    alone = train.run(config.model_copy(update={"max_steps": 4}), model, train_data)
    assert alone.metric_name == "loss" and alone.metric_first == alone.loss_first is not None
    assert alone.metric_last == alone.loss_last


def test_lora_pt_moves_only_the_adapted_weights(gym_home):
    model = tiny()
    train_data, eval_data = pt_data()
    config = TrainConfig(
        method="pt",
        finetuning_type="lora",
        learning_rate=1e-2,
        max_steps=6,
        per_device_train_batch_size=8,
        lora=LoraSettings(target_modules=["q_proj", "v_proj"]),
    )
    result = train.run(config, model, train_data, eval_data)
    assert result.eval_after["eval_loss"] < result.eval_before["eval_loss"]
    before = load_file(str(Path(model.path) / "model.safetensors"))
    after = load_file(str(Path(result.model_dir) / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".q_proj." in k or ".v_proj." in k for k in changed), changed
    assert result.adapter_dir is not None and 0 < result.trainable_params < result.total_params


def test_pt_refuses_instruction_data_before_loading_a_model(gym_home):
    model = tiny()
    with pytest.raises(ConfigError, match="'pt' needs a text dataset"):
        train.run(TrainConfig(method="pt"), model, tokenized("demo_sft", model, max_samples=8))
    assert not list((gym_home / "models").glob("pt-*"))


# ---- gym train / the flow -----------------------------------------------------------------------


def test_stage_pt_and_its_demo_data():
    assert method_of(["--stage", "pt"])[0] == "pt"
    assert demo_args("pt", []) == [
        "--train.method",
        "pt",
        "--dataset",
        "demo_text",
        "--method_eval_dataset",
        "demo_text_eval",
        "--data.cutoff_len",
        "256",
    ]
    assert demo_args("pt", ["--dataset", "c4_demo"]) == ["--train.method", "pt"]
    assert "256" not in demo_args("pt", ["--cutoff_len=512"])


def test_the_flow_scores_no_exact_match_after_pt_unless_asked():
    config = TrainFlowConfig(dataset="demo_text", train=TrainConfig(method="pt"))
    assert config.exact_match_dataset() is None
    assert "eval_dataset" not in config.dataset_uses()
    assert "pt trains on raw text" in config.held_out_notes()[0]
    asked = config.model_copy(update={"eval_dataset": "demo_sft_eval"})
    assert asked.exact_match_dataset() == "demo_sft_eval" and not asked.held_out_notes()
    # Other methods keep `auto`: the demo's held-out instructions.
    assert TrainFlowConfig(dataset="demo_sft").exact_match_dataset() == "demo_sft_eval"


@pytest.mark.slow
def test_gym_train_method_pt_with_no_other_flags_lowers_the_held_out_loss(gym_home):
    """`gym train --method pt --json` as the README gives it: demo_text, gym-tiny's defaults."""
    from tests.test_flows import run_script

    gym = str(Path(sys.executable).parent / "gym")
    out = run_script([gym, "train", "--method", "pt", "--json"], gym_home)
    assert out["metric_name"] == "eval_loss"
    assert out["metric_last"] < out["metric_first"], (out["metric_first"], out["metric_last"])
    assert out["pt_eval_loss"] == out["metric_last"] and out["exact_match_after"] is None
    assert out["pt_tokens_per_second"] > 0
