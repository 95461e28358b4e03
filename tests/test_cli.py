"""The `gym` command line (registry and data commands; `gym train` is exercised in test_flows.py)."""

from __future__ import annotations

import json

from gym.cli import main


def test_registry_list_json_has_one_object_per_entry(capsys):
    assert main(["registry", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) >= 21
    assert all({"name", "family", "template"} <= set(r) for r in rows)
    assert "gym-tiny" in {r["name"] for r in rows}
    assert len({r["family"] for r in rows}) >= 7


def test_registry_show_includes_memory_estimates(capsys):
    assert main(["registry", "show", "qwen2.5-7b-instruct"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["hub_id"] == "Qwen/Qwen2.5-7B-Instruct"
    mem = shown["memory_gib"]
    inference = mem["inference"]
    assert inference["int4"] < inference["int8"] < inference["fp16"] < mem["full"]["fp16"]


def test_registry_show_unknown_name_suggests(capsys):
    assert main(["registry", "show", "qwen2.5-7b-instrct"]) == 2
    assert "qwen2.5-7b-instruct" in capsys.readouterr().err


def test_data_preview_marks_trained_tokens(capsys):
    assert main(["data", "preview", "demo_sft", "-n", "2", "--model", "gym-tiny"]) == 0
    out = capsys.readouterr().out
    assert "6000 sft records" in out
    # Only the assistant's answer and its end-of-turn token carry loss.
    records = out.split("--- record 1", 1)[1]
    assert records.count("⟦") == 2 and records.count("<|im_end|>⟧") == 2
    assert "⟦<|im_start|>user" not in records


def test_data_preview_reports_bad_file_with_record_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c"}\n')
    assert main(["data", "preview", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "record 2" in err and "output" in err
