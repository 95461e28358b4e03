"""Tokenize: labels mask the prompt by default, train_on_prompt / mask_history / cutoff_len work,
preference and kto texts are the template's own rendering, and artifacts are content addressed.

Run: .venv/bin/pytest tests/test_data_tokenize.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest
from transformers import AutoTokenizer

from gym import templates, workspace
from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.data.split import split
from gym.data.tokenize import IGNORE_INDEX, TokenizeSettings, sft_labels, tokenize
from gym.errors import ConfigError, DataError
from gym.paths import registry_dir

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "fixtures" / "data"
TINY = ROOT / "gym" / "assets" / "gym_tiny"
CHATML = (registry_dir() / "templates" / "chatml.jinja").read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A private workspace and a registry copy with three extra templates for the tests."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    registry = tmp_path / "registry"
    shutil.copytree(registry_dir(), registry)
    default_system = (
        "{%- if messages[0]['role'] != 'system' -%}"
        "{{- '<|im_start|>system\\nYou are gym.<|im_end|>\\n' -}}{%- endif -%}"
    )
    generation_prompt = "'<|im_start|>assistant\\n' -}}\n{%- endif"
    extra = {
        "test_chatml_sys": default_system + CHATML,
        "test_chatml_nogen": CHATML.replace("{%- generation -%}", "").replace("{%- endgeneration -%}", ""),
        "test_chatml_think": CHATML.replace(
            generation_prompt, generation_prompt.replace("\\n'", "\\n<think>'")
        ),
    }
    for name, text in extra.items():
        (registry / "templates" / f"{name}.jinja").write_text(text, encoding="utf-8")
    monkeypatch.setenv("GYM_REGISTRY", str(registry))


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(TINY))


def rows(result) -> list[dict]:
    return datasets.load_from_disk(str(result.path)).to_list()


def trained(tok, row: dict) -> str:
    return tok.decode([t for t in row["labels"] if t != IGNORE_INDEX])


def tokenized_area() -> set[str]:
    return {p.name for p in workspace.path("tokenized").iterdir()}


def chat_dataset() -> Path:
    return ingest(resolve_dataset(DATA / "sharegpt.json")).path


def test_prompt_is_masked_by_default(tok):
    result = tokenize(chat_dataset(), TINY, "chatml")
    row = rows(result)[0]
    assert result.kind == "sft" and set(row) == {"input_ids", "labels"}
    assert trained(tok, row) == "7<|im_end|>11<|im_end|>"
    enc = templates.encode(tok, [{"role": "user", "content": "x"}], "chatml")
    assert len(row["labels"]) == len(row["input_ids"]) and enc.input_ids  # no padding, same length
    assert result.stats["num_label_tokens"] == sum(
        t != IGNORE_INDEX for r in rows(result) for t in r["labels"]
    )


def test_ids_are_stored_as_int32_and_read_back_exactly(tok):
    """Token ids take half of int64's disk; every kind's id columns are int32 and read back as the
    tokenizer's own ids (-100 included)."""
    sources = {
        "sft": chat_dataset(),
        "preference": ingest(resolve_dataset(DATA / "preference_lf.json")).path,
        "kto": ingest(resolve_dataset(DATA / "kto.jsonl")).path,
        "prompt": ingest(resolve_dataset("demo_prompts")).path,
    }
    for kind, source in sources.items():
        result = tokenize(source, TINY, "chatml")
        table = datasets.load_from_disk(str(result.path))
        id_columns = [c for c in table.column_names if c.endswith("_ids") or c == "labels"]
        assert id_columns and result.kind == kind, (kind, table.column_names)
        for column in id_columns:
            assert table.features[column].feature.dtype == "int32", (kind, column)
    row = rows(tokenize(chat_dataset(), TINY, "chatml"))[0]
    messages = datasets.load_from_disk(str(chat_dataset()))[0]["messages"]
    enc = templates.encode(tok, messages, "chatml")
    assert row["input_ids"] == enc.input_ids and IGNORE_INDEX in row["labels"]


def test_train_on_prompt(tok):
    row = rows(tokenize(chat_dataset(), TINY, "chatml", TokenizeSettings(train_on_prompt=True)))[0]
    assert row["labels"] == row["input_ids"]


def test_mask_history_trains_only_the_last_turn(tok):
    row = rows(tokenize(chat_dataset(), TINY, "chatml", TokenizeSettings(mask_history=True)))[0]
    assert trained(tok, row) == "11<|im_end|>"
    both = TokenizeSettings(mask_history=True, train_on_prompt=True)
    text = trained(tok, rows(tokenize(chat_dataset(), TINY, "chatml", both))[0])
    assert "再来一个。" in text and text.endswith("11<|im_end|>\n") and "Name a prime" not in text


def test_mask_history_keeps_the_latest_turns_when_the_last_one_would_be_cut_away(tok):
    """The start was kept: the last turn (the only one trained on) was cut off and the record dropped
    ("no record has a trainable token"). The oldest exchanges go first, as in LLaMA-Factory."""
    messages = datasets.load_from_disk(str(chat_dataset()))[0]["messages"]
    system = [m for m in messages[:1] if m["role"] == "system"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    latest = [*system, *messages[last_user:]]
    whole, short = (templates.encode(tok, m, "chatml").input_ids for m in (messages, latest))
    cutoff = len(short)  # room for the latest exchange (and the system message), not for the whole
    assert cutoff < len(whole) - 2
    result = tokenize(chat_dataset(), TINY, "chatml", TokenizeSettings(mask_history=True, cutoff_len=cutoff))
    row = rows(result)[0]
    assert row["input_ids"] == short and trained(tok, row) == "11<|im_end|>"
    assert "Name a prime" not in tok.decode(row["input_ids"])


def test_default_system_opens_each_conversation_that_has_none(tok, tmp_path: Path):
    said = "Answer with digits only."
    data = tmp_path / "chat.jsonl"
    records = [
        {"instruction": "Name a prime.", "output": "7"},
        {"instruction": "Hi", "output": "2", "system": "Own."},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    dataset = ingest(resolve_dataset(data)).path
    settings = TokenizeSettings(default_system=said)
    plain, given = (rows(tokenize(dataset, TINY, "chatml", s)) for s in (TokenizeSettings(), settings))
    text = tok.decode(given[0]["input_ids"])
    assert text.startswith(f"<|im_start|>system\n{said}<|im_end|>\n<|im_start|>user\nName a prime.")
    assert said not in tok.decode(plain[0]["input_ids"])
    assert trained(tok, given[0]) == trained(tok, plain[0]) == "7<|im_end|>"  # a prompt turn: masked
    assert given[1] == plain[1], "a record's own system message stays"
    # It takes the place of a template's own default system message
    own_default = tok.decode(rows(tokenize(dataset, TINY, "test_chatml_sys", settings))[0]["input_ids"])
    assert said in own_default and "You are gym." not in own_default
    # Preference prompts get it too
    pairs = ingest(resolve_dataset(DATA / "preference_lf.json")).path
    assert rows(tokenize(pairs, TINY, "chatml", settings))[0]["prompt"].startswith(
        f"<|im_start|>system\n{said}"
    )
    # Online RL prompts: the messages TRL renders and gym's rendering alike
    prompt = rows(tokenize(ingest(resolve_dataset("demo_prompts")).path, TINY, "chatml", settings))[0]
    assert prompt["prompt"][0] == {"role": "system", "content": said}
    assert prompt["prompt_text"].startswith(f"<|im_start|>system\n{said}")


def test_sft_labels_helper():
    ids, mask = [1, 2, 3, 4, 5, 6, 7], [0, 1, 0, 0, 1, 1, 0]
    x = IGNORE_INDEX
    assert sft_labels(ids, mask, train_on_prompt=False, mask_history=False) == [x, 2, x, x, 5, 6, x]
    assert sft_labels(ids, mask, train_on_prompt=False, mask_history=True) == [x, x, x, x, 5, 6, x]
    assert sft_labels(ids, mask, train_on_prompt=True, mask_history=True) == [x, x, 3, 4, 5, 6, 7]
    assert sft_labels(ids, mask, train_on_prompt=True, mask_history=False) == ids


def test_a_tokenize_killed_mid_write_leaves_nothing_after_the_next_one():
    """kill -9 after the map wrote its cache file: the next tokenize of the same data removes what the
    killed one left (its scratch files lived beside the artifact and piled up with every kill)."""
    import subprocess
    import sys

    dataset = chat_dataset()
    killed_run = (
        "import sys, time, datasets; from pathlib import Path\n"
        "from gym.data.tokenize import tokenize\n"
        "def stop(self, path, **kw):\n"
        "    print(path, flush=True); time.sleep(60)\n"
        "datasets.Dataset.save_to_disk = stop\n"
        "tokenize(Path(sys.argv[1]), Path(sys.argv[2]), 'chatml')\n"
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", killed_run, str(dataset), str(TINY)], stdout=subprocess.PIPE, cwd=ROOT
    )
    killed.stdout.readline()  # type: ignore[union-attr]
    killed.kill()
    killed.wait()
    area = workspace.path("tokenized")
    assert list(area.rglob("*.arrow")), "the killed run had written its map cache"
    result = tokenize(dataset, TINY, "chatml")
    assert tokenized_area() == {result.path.name}  # no temp dir, lock or scratch file left
    assert not list(result.path.rglob("scratch")) and rows(result)


def test_cutoff_truncates_and_drops_untrainable_records(tok):
    dataset = ingest(resolve_dataset(DATA / "alpaca.jsonl")).path
    source = datasets.load_from_disk(str(dataset)).to_list()
    encoded = [templates.encode(tok, r["messages"], "chatml") for r in source]
    cut = min(len(e.input_ids) for e in encoded) - 1  # every record is cut; some lose all labels
    kept = [e for e in encoded if any(e.assistant_mask[:cut])]
    result = tokenize(dataset, TINY, "chatml", TokenizeSettings(cutoff_len=cut))
    assert result.num_records == len(kept) and result.num_truncated == len(kept)
    assert result.num_dropped == len(encoded) - len(kept)
    assert all(len(r["input_ids"]) == cut for r in rows(result))
    assert [r["input_ids"] for r in rows(result)] == [e.input_ids[:cut] for e in kept]


def test_nothing_trainable_is_an_error_and_leaves_nothing():
    dataset = chat_dataset()
    before = tokenized_area()
    with pytest.raises(DataError, match="no record has a trainable token within cutoff_len=2") as err:
        tokenize(dataset, TINY, "chatml", TokenizeSettings(cutoff_len=2))
    assert tokenized_area() == before
    # Named as the user named it (not gym's workspace copy), here and for the parts a split writes.
    message = str(err.value)
    assert message.startswith(f"dataset {DATA / 'sharegpt.json'}: ") and str(dataset) not in message
    train, _ = split(ingest(resolve_dataset("demo_sft")), 0.5, seed=1)
    with pytest.raises(DataError, match=r"^dataset demo_sft \(training part, val_size=0.5\): no record"):
        tokenize(train.path, TINY, "chatml", TokenizeSettings(cutoff_len=2))


def test_preference_columns_are_the_templates_rendering(tok):
    result = tokenize(ingest(resolve_dataset(DATA / "preference_lf.json")).path, TINY, "chatml")
    row = rows(result)[0]
    assert result.kind == "preference"
    assert set(row) == {"prompt", "chosen", "rejected", "prompt_ids", "chosen_ids", "rejected_ids"}
    prompt = [{"role": "user", "content": "Name a prime."}]
    assert row["prompt"] == templates.render(tok, prompt, "chatml", add_generation_prompt=True)
    assert row["chosen"] == "7<|im_end|>" and row["rejected"] == "8<|im_end|>"
    assert row["chosen_ids"] == tok("7<|im_end|>", add_special_tokens=False)["input_ids"]
    assert row["chosen_ids"][-1] == tok.eos_token_id
    full = templates.render(tok, [*prompt, {"role": "assistant", "content": "7"}], "chatml")
    assert tok.decode(row["prompt_ids"] + row["chosen_ids"]) == full.rstrip("\n")
    multi = rows(result)[2]
    assert multi["prompt"].count("<|im_start|>assistant\n") == 2 and multi["rejected"] == "22<|im_end|>"


def test_kto_columns(tok):
    result = tokenize(ingest(resolve_dataset(DATA / "kto.csv")).path, TINY, "chatml")
    got = rows(result)
    assert result.kind == "kto"
    assert set(got[0]) == {"prompt", "completion", "label", "prompt_ids", "completion_ids"}
    assert [r["label"] for r in got] == [True, False, True]
    assert got[1]["completion"] == "6<|im_end|>" and "把数字加起来。\n2 3" in got[1]["prompt"]


def test_template_whose_generation_prompt_is_not_a_prefix(tok):
    dataset = ingest(resolve_dataset(DATA / "preference_lf.json")).path
    before = tokenized_area()
    with pytest.raises(DataError) as e:
        tokenize(dataset, TINY, "test_chatml_think")
    assert e.value.record == 1 and e.value.field == "chosen" and "add_generation_prompt" in str(e.value)
    assert tokenized_area() == before


def test_template_without_generation_tags_is_a_config_error():
    dataset = chat_dataset()
    before = tokenized_area()
    with pytest.raises(ConfigError, match="marks no assistant tokens"):
        tokenize(dataset, TINY, "test_chatml_nogen")
    assert tokenized_area() == before


def test_content_addressing(tmp_path: Path):
    dataset = chat_dataset()
    first = tokenize(dataset, TINY, "chatml")
    stamp = (first.path / "meta.json").stat().st_mtime_ns
    assert tokenize(dataset, TINY, "chatml") == first
    assert (first.path / "meta.json").stat().st_mtime_ns == stamp
    copy = tmp_path / "tok_copy"
    shutil.copytree(TINY, copy)
    assert tokenize(dataset, copy, "chatml").digest == first.digest  # same files, same digest
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 1024}))
    digests = {
        first.digest,
        tokenize(dataset, copy, "chatml").digest,
        tokenize(dataset, TINY, "test_chatml_sys").digest,
        tokenize(dataset, TINY, "chatml", TokenizeSettings(cutoff_len=512)).digest,
        tokenize(dataset, TINY, "chatml", TokenizeSettings(max_samples=1)).digest,
        tokenize(ingest(resolve_dataset(DATA / "openai.jsonl")).path, TINY, "chatml").digest,
    }
    assert len(digests) == 6
    assert not [p for p in workspace.path("tokenized").iterdir() if p.name.startswith(".")]


def test_max_samples():
    assert tokenize(chat_dataset(), TINY, "chatml", TokenizeSettings(max_samples=1)).num_records == 1


def test_bad_inputs_fail_clearly(tmp_path: Path):
    with pytest.raises(DataError, match="not an ingested dataset"):
        tokenize(tmp_path, TINY, "chatml")
    with pytest.raises(ConfigError, match="unknown chat template"):
        tokenize(chat_dataset(), TINY, "no_such_template")
    with pytest.raises(ConfigError, match="cannot load tokenizer"):
        tokenize(chat_dataset(), "gym-test-org/no-such-tokenizer", "chatml")


def test_a_template_whose_control_tokens_the_tokenizer_splits_is_refused() -> None:
    """`--template llama3` on gym-tiny (a ChatML tokenizer) trained `<|eot_id|>` as ordinary text pieces:
    the model never learnt to end a turn on one token, silently. Refused, naming the tokens and the fixes;
    with the tokens added (--new_special_tokens) it tokenizes, each marker one token."""
    from gym import vocab
    from gym.models import resolve

    model = resolve("gym-tiny")
    data = ingest(resolve_dataset("demo_sft")).path
    with pytest.raises(ConfigError) as caught:
        tokenize(data, model.path, "llama3", TokenizeSettings(max_samples=2))
    message = str(caught.value)
    assert "<|eot_id|>" in message and "<|start_header_id|>" in message and "--new_special_tokens" in message
    assert not list(workspace.path("tokenized").glob("*")), "nothing written"
    tokenize(data, model.path, "chatml", TokenizeSettings(max_samples=2))  # its own: fine
    markers = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    extended = vocab.extend(model, markers)
    done = tokenize(data, extended.path, "llama3", TokenizeSettings(max_samples=2))
    tok = AutoTokenizer.from_pretrained(extended.path)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    labels = datasets.load_from_disk(str(done.path))["labels"][0]
    assert [t for t in labels if t != IGNORE_INDEX][-1] == eot  # the turn ends on the one token, trained
