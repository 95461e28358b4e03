"""LLaMA-Factory's dataset_info.json: its dataset names resolve, and read as LLaMA-Factory reads them.

Run: .venv/bin/pytest tests/test_data_llamafactory.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import pytest

from gym import cli_llamafactory
from gym.data.ingest import ingest
from gym.data.registry import resolve_dataset
from gym.errors import ConfigError, DataError, RegistryError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GYM_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)


def lf_data(folder: Path, info: dict[str, Any], files: dict[str, Any]) -> Path:
    """A LLaMA-Factory data folder: dataset_info.json and its files (lists become JSON, text stays)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset_info.json").write_text(json.dumps(info))
    for name, content in files.items():
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return folder


def records(name: str) -> list[dict[str, Any]]:
    return list(datasets.load_from_disk(str(ingest(resolve_dataset(name)).path)))


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# LLaMA-Factory's demo datasets' shapes (data/alpaca_en_demo.json, dpo_en_demo.json, kto_en_demo.json)
ALPACA = [
    {"instruction": "Add", "input": "2 and 3", "output": "5"},
    {"instruction": "Hi", "input": "", "output": "Hello"},
]
DPO = [
    {
        "conversations": [{"from": "human", "value": "Best colour?"}],
        "chosen": {"from": "gpt", "value": "Blue."},
        "rejected": {"from": "gpt", "value": "Dunno."},
    }
]
KTO = [
    {
        "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        "label": True,
    },
    {
        "messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "7"}],
        "label": False,
    },
]
OPENAI_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


def test_llamafactory_demo_entries_read_as_their_record_kinds(tmp_path: Path):
    """The entries of LLaMA-Factory's own dataset_info.json for its alpaca, DPO and KTO demos."""
    info = {
        "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
        "dpo_en_demo": {
            "file_name": "dpo_en_demo.json",
            "formatting": "sharegpt",
            "ranking": True,
            "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"},
        },
        "kto_en_demo": {
            "file_name": "kto_en_demo.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "kto_tag": "label"},
            "tags": OPENAI_TAGS,
        },
    }
    lf_data(
        tmp_path / "data",
        info,
        {"alpaca_en_demo.json": ALPACA, "dpo_en_demo.json": DPO, "kto_en_demo.json": KTO},
    )
    assert records("alpaca_en_demo") == [
        {"messages": [user("Add\n2 and 3"), assistant("5")]},
        {"messages": [user("Hi"), assistant("Hello")]},
    ]
    assert records("dpo_en_demo") == [
        {"prompt": [user("Best colour?")], "chosen": "Blue.", "rejected": "Dunno."}
    ]
    kto = records("kto_en_demo")
    assert [(r["prompt"], r["completion"], r["label"]) for r in kto] == [
        ([user("2+2?")], "4", True),
        ([user("2+3?")], "7", False),
    ]
    assert resolve_dataset("dpo_en_demo").kind == "preference"
    assert resolve_dataset("kto_en_demo").kind == "kto"


def test_columns_tags_and_num_samples_read_other_spellings(tmp_path: Path):
    chats = [
        {
            "dialog": [
                {"speaker": "me", "text": "hi"},
                {"speaker": "bot", "text": "hello"},
                {"speaker": "me", "text": "bye"},
                {"speaker": "bot", "text": "ciao"},
            ],
            "sys": "Be brief.",
        }
    ]
    qa = [{"q": f"question {i}", "a": f"answer {i}", "ctx": "", "sys": "S"} for i in range(5)]
    pairs = [{"q": "pick", "good": "yes", "bad": "no"}]
    info = {
        "chats": {
            "file_name": "chats.jsonl",
            "formatting": "sharegpt",
            "columns": {"messages": "dialog", "system": "sys"},
            "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot"},
        },
        "qa": {
            "file_name": "qa.json",
            "columns": {"prompt": "q", "query": "ctx", "response": "a", "system": "sys", "kto_tag": None},
            "num_samples": 2,
        },
        "pairs": {
            "file_name": "pairs.json",
            "ranking": True,
            "columns": {"prompt": "q", "chosen": "good", "rejected": "bad"},
        },
    }
    lf_data(
        tmp_path / "data",
        info,
        {"chats.jsonl": json.dumps(chats[0]) + "\n", "qa.json": qa, "pairs.json": pairs},
    )
    assert records("chats") == [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                user("hi"),
                assistant("hello"),
                user("bye"),
                assistant("ciao"),
            ]
        }
    ]
    sft = [r["messages"] for r in records("qa")]
    assert sft == [
        [{"role": "system", "content": "S"}, user(f"question {i}"), assistant(f"answer {i}")]
        for i in range(2)
    ]
    assert records("pairs") == [{"prompt": [user("pick")], "chosen": "yes", "rejected": "no"}]


def test_a_bad_record_is_reported_in_the_users_own_spelling(tmp_path: Path):
    bad = [{"dialog": [{"speaker": "me", "text": "hi"}, {"speaker": "robot", "text": "hello"}]}]
    info = {
        "chats": {
            "file_name": "chats.json",
            "formatting": "sharegpt",
            "columns": {"messages": "dialog"},
            "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot"},
        }
    }
    lf_data(tmp_path / "data", info, {"chats.json": bad})
    with pytest.raises(DataError) as err:
        records("chats")
    text = str(err.value)
    assert "chats.json" in text and "record 1" in text and "'dialog'" in text and "'robot'" in text


def test_lookup_order_data_dir_and_suggestions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """gym's registry, then local paths, then dataset_info.json (data dir, then its data/), then hub ids."""
    lf_data(
        tmp_path / "data",
        {"demo_sft": {"file_name": "a.json"}, "mine": {"file_name": "a.json"}},
        {"a.json": ALPACA},
    )
    assert resolve_dataset("demo_sft").generator == "demo_sft", "gym's registry comes first"
    assert resolve_dataset("mine").file == str(tmp_path / "data" / "a.json")
    with pytest.raises(ConfigError, match="did you mean mine"):
        resolve_dataset("mnie")
    assert resolve_dataset("owner/mine").hub_id == "owner/mine", "hub ids still resolve"
    elsewhere = lf_data(tmp_path / "elsewhere", {"mine": {"file_name": "b.json"}}, {"b.json": ALPACA[:1]})
    monkeypatch.setenv("GYM_DATA_DIR", str(elsewhere))
    assert resolve_dataset("mine").file == str(elsewhere / "b.json"), "the data dir's own dataset_info.json"


def test_hub_entries_keep_subset_and_split(tmp_path: Path):
    info = {"gsm": {"hf_hub_url": "openai/gsm8k", "subset": "main", "split": "test", "formatting": "alpaca"}}
    lf_data(tmp_path / "data", info, {})
    spec = resolve_dataset("gsm")
    assert (spec.hub_id, spec.subset, spec.split) == ("openai/gsm8k", "main", "test")
    with pytest.raises(DataError, match="subset 'main'"):
        ingest(spec)  # offline, and not in the local cache


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"file_name": "a.json", "colums": {}}, "field 'colums': unknown field; did you mean 'columns'?"),
        (
            {"file_name": "a.json", "columns": {"images": "images"}},
            "field 'columns.images': gym trains text-only",
        ),
        (
            {"file_name": "a.json", "columns": {"tools": "tools"}},
            "field 'columns.tools': gym does not train tool",
        ),
        (
            {"file_name": "a.json", "columns": {"messages": "c"}},
            "is a column of sharegpt formatting, not alpaca",
        ),
        ({"ms_hub_url": "x/y"}, "field 'ms_hub_url': gym reads the Hugging Face hub"),
        ({"script_url": "x"}, "field 'script_url': loading scripts are not supported"),
        ({"formatting": "alpaca"}, "no source: give file_name"),
        ({"file_name": "a.json", "formatting": "openai"}, "field 'formatting': expected alpaca or sharegpt"),
        ({"file_name": "a.json", "num_samples": 0}, "field 'num_samples': must be a whole number"),
        ({"file_name": "a.json", "ranking": "yes"}, "field 'ranking': must be true or false"),
        ({"file_name": "a.json", "tags": {"role": "r"}}, "field 'tags': expected an object with keys among"),
        ({"hf_hub_url": "x/y", "folder": "sub"}, "field 'folder': gym reads a hub dataset's subsets"),
        # it failed when the run ingested it, pointing at "`file` in the dataset registry"
        ({"file_name": "b.json"}, "field 'file_name': no such file or folder "),
    ],
)
def test_bad_entries_name_the_file_entry_and_field(tmp_path: Path, entry: dict[str, Any], words: str):
    lf_data(tmp_path / "data", {"mine": entry}, {"a.json": ALPACA})
    with pytest.raises(RegistryError) as err:
        resolve_dataset("mine")
    assert str(err.value).startswith(f"{tmp_path / 'data' / 'dataset_info.json'}: entry 'mine'")
    assert words in str(err.value)


def test_an_invalid_dataset_info_json_is_named(tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text('{"mine": {')
    with pytest.raises(RegistryError, match=r"dataset_info.json: not valid JSON at line 1"):
        resolve_dataset("mine")


def test_tags_work_in_gyms_own_registry_too(tmp_path: Path):
    (tmp_path / "chats.json").write_text(
        json.dumps([{"conversations": [{"who": "u", "say": "a"}, {"who": "m", "say": "b"}]}])
    )
    registry = tmp_path / "datasets.json"
    entry = {
        "file": "chats.json",
        "format": "sharegpt",
        "tags": {"role_tag": "who", "content_tag": "say", "user_tag": "u", "assistant_tag": "m"},
    }
    registry.write_text(json.dumps({"chats": entry}))
    spec = resolve_dataset("chats", registry=registry)
    assert list(datasets.load_from_disk(str(ingest(spec).path))) == [
        {"messages": [user("a"), assistant("b")]}
    ]
    registry.write_text(json.dumps({"chats": {**entry, "tags": {"speaker_tag": "who"}}}))
    with pytest.raises(RegistryError, match="entry 'chats', field 'tags'"):
        resolve_dataset("chats", registry=registry)


def test_dataset_dir_sets_the_data_dir_while_the_flow_runs(tmp_path: Path):
    (tmp_path / "lf").mkdir()
    args = argparse.Namespace(**{f"{cli_llamafactory.DEST}.dataset_dir": "lf"})
    with cli_llamafactory.data_dir([args]):
        assert os.environ["GYM_DATA_DIR"] == str(tmp_path / "lf"), "relative to the current directory"
    assert "GYM_DATA_DIR" not in os.environ, "and only while it runs"
    missing = argparse.Namespace(**{f"{cli_llamafactory.DEST}.dataset_dir": "nope"})
    with (
        pytest.raises(ConfigError, match="dataset_dir 'nope': no such folder"),
        cli_llamafactory.data_dir([missing]),
    ):
        pass


def test_gym_train_checks_a_dataset_info_entry_before_loading_anything(tmp_path: Path):
    """Preflight reads the entry: SFT rows given to DPO fail in seconds, naming the dataset."""
    lf_data(tmp_path / "lf", {"identity": {"file_name": "identity.json"}}, {"identity.json": ALPACA})
    gym = str(Path(sys.executable).parent / "gym")
    env = {**os.environ, "GYM_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [gym, "train", "--method", "dpo", "--dataset", "identity", "--dataset_dir", str(tmp_path / "lf")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "method 'dpo' needs preference records" in proc.stderr
    assert "dataset 'identity' holds sft records" in proc.stderr


def test_a_dataset_info_json_may_start_with_a_bom_but_must_be_utf8(tmp_path: Path):
    lf_data(tmp_path / "data", {}, {"a.json": ALPACA})
    info = tmp_path / "data" / "dataset_info.json"
    info.write_bytes(b"\xef\xbb\xbf" + json.dumps({"mine": {"file_name": "a.json"}}).encode())
    assert records("mine")[0]["messages"][-1] == assistant("5")
    info.write_bytes(b'{"mine": {"file_name": "a.json"},\n "caf\xe9": {"file_name": "a.json"}}')
    with pytest.raises(
        RegistryError, match=r"dataset_info.json: not UTF-8 text: line 2, byte 6 is 0xe9"
    ) as e:
        resolve_dataset("mine")
    assert str(e.value).startswith(str(info)) and "iconv" in str(e.value)


def test_system_and_history_are_read_only_when_columns_name_them(tmp_path: Path) -> None:
    """LLaMA-Factory reads `system` and alpaca's `history` only when an entry's `columns` names them; gym
    read them anyway, training on history turns and system messages LLaMA-Factory leaves out."""
    alpaca = [
        {"instruction": "Add", "input": "2 and 3", "output": "5", "system": "S", "history": [["a", "b"]]}
    ]
    sharegpt = [
        {
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}],
            "system": "S",
        }
    ]
    lf_data(
        tmp_path / "data",
        {
            "plain": {"file_name": "a.json"},
            "named": {"file_name": "a.json", "columns": {"system": "system", "history": "history"}},
            "chat": {"file_name": "s.json", "formatting": "sharegpt"},
            "chat_sys": {"file_name": "s.json", "formatting": "sharegpt", "columns": {"system": "system"}},
        },
        {"a.json": alpaca, "s.json": sharegpt},
    )
    assert records("plain")[0]["messages"] == [user("Add\n2 and 3"), assistant("5")]
    assert records("named")[0]["messages"] == [
        {"role": "system", "content": "S"},
        user("a"),
        assistant("b"),
        user("Add\n2 and 3"),
        assistant("5"),
    ]
    assert records("chat")[0]["messages"] == [user("Hi"), assistant("Hello")]
    assert records("chat_sys")[0]["messages"][0] == {"role": "system", "content": "S"}


def test_gym_data_takes_dataset_dir_as_gym_train_does(tmp_path: Path, monkeypatch, capsys) -> None:
    """`gym data NAME --dataset_dir DIR` was refused (unrecognized argument), though its own not-found
    message said to set --dataset_dir."""
    from gym.cli import cmd_data

    monkeypatch.setenv("GYM_DATA_DIR", str(tmp_path))  # restored after the test (cmd_data sets it)
    folder = lf_data(tmp_path / "elsewhere", {"mine": {"file_name": "a.json"}}, {"a.json": ALPACA})
    assert cmd_data(["mine", "--dataset_dir", str(folder), "-n", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["messages"][1] == assistant("5")
    with pytest.raises(ConfigError, match="--dataset_dir 'nowhere': no such folder"):
        cmd_data(["mine", "--dataset_dir", "nowhere"])


def test_a_column_the_file_lacks_is_not_read_from_the_files_default_column(tmp_path: Path) -> None:
    """A mistyped `"prompt": "quest"` trained on the file's `instruction` ("IGNORE ME"), a `system` mapped to
    a missing column read the file's `system`, `chosen`/`rejected` mapped to missing ones read the defaults:
    LLaMA-Factory reads the mapped columns only. A required one is said missing, by the name mapped."""
    qa = [{"question": "Q?", "answer": "A", "instruction": "IGNORE ME", "output": "WRONG", "system": "S"}]
    pairs = [{"prompt": "P", "chosen": "c", "rejected": "r"}]
    lf_data(
        tmp_path / "data",
        {
            "typo": {"file_name": "qa.json", "columns": {"prompt": "quest", "response": "answer"}},
            "right": {"file_name": "qa.json", "columns": {"prompt": "question", "response": "answer"}},
            "sys_missing": {
                "file_name": "qa.json",
                "columns": {"prompt": "question", "response": "answer", "system": "sys_prompt"},
            },
            "pairs_missing": {
                "file_name": "p.json",
                "ranking": True,
                "columns": {"prompt": "prompt", "chosen": "better", "rejected": "worse"},
            },
        },
        {"qa.json": qa, "p.json": pairs},
    )
    with pytest.raises(DataError, match=r"qa\.json, record 1, field 'quest': missing"):
        records("typo")
    assert records("right")[0]["messages"] == [user("Q?"), assistant("A")]
    assert records("sys_missing")[0]["messages"] == [user("Q?"), assistant("A")]  # not the file's `system`
    with pytest.raises(DataError, match=r"p\.json, record 1, field 'better': missing"):
        records("pairs_missing")


def test_llamafactory_ppo_and_grpo_sample_from_an_alpaca_files_prompts(tmp_path: Path):
    """LLaMA-Factory's stage ppo trains on alpaca files' prompts; gym refused sft data for online RL."""
    rows = [{"instruction": f"Say {i}", "input": "", "output": str(i)} for i in range(6)]
    lf_data(tmp_path / "lf", {"numbers": {"file_name": "numbers.json"}}, {"numbers.json": rows})
    gym = str(Path(sys.executable).parent / "gym")
    env = {**os.environ, "GYM_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    small = ["--max-steps", "1", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1"]
    small += ["--train.rl.max_completion_length", "4", "--dataset_dir", str(tmp_path / "lf"), "--json"]
    for method in (["--stage", "ppo"], ["--method", "grpo", "--group-size", "2", "--val_size", "2"]):
        args = [gym, "train", *method, "--dataset", "numbers", "--reward", "exact_match", *small]
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        # held out (grpo's val_size): the held-out mean reward; else the logged training rewards
        assert summary["metric_name"] == ("mean_reward" if "--val_size" in method else "train_mean_reward")
    assert summary["metric_first"] is not None, "grpo's held-out part of the file was scored as prompts"
