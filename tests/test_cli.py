"""The `gym` command line (registry and data commands; `gym train` is exercised in test_flows.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gym.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_registry_list_json_has_one_object_per_entry(capsys):
    assert main(["registry", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) >= 21
    assert all({"name", "family", "template"} <= set(r) for r in rows)
    assert "gym-tiny" in {r["name"] for r in rows}
    assert len({r["family"] for r in rows}) >= 7


def test_registry_list_table_gives_small_models_in_millions(capsys):
    from gym.registry import get_model

    assert main(["registry", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert f" {get_model('gym-tiny').parameters / 1e6:.1f}M " in rows["gym-tiny"]  # was 0.00B
    assert " 0.49B " in rows["qwen2.5-0.5b-instruct"] and "0.00B" not in "".join(rows.values())


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


def test_actions_default_to_what_a_bare_command_means(capsys):
    """`gym registry` lists, `gym registry NAME` shows, `gym data DATASET` previews: each prints
    what its spelled-out form does."""
    for short, spelled in (
        (["registry"], ["registry", "list"]),
        (["registry", "--json"], ["registry", "list", "--json"]),
        (["registry", "gym-tiny"], ["registry", "show", "gym-tiny"]),
        # --json first: it was read as the first word ("unrecognized arguments")
        (["registry", "--json", "gym-tiny"], ["registry", "show", "gym-tiny", "--json"]),
        (["registry", "--json", "show", "gym-tiny"], ["registry", "show", "gym-tiny", "--json"]),
        (["registry", "--json", "list"], ["registry", "list", "--json"]),
        (["data", "demo_sft", "-n", "1"], ["data", "preview", "demo_sft", "-n", "1"]),
        (["data", "-n", "1", "demo_sft"], ["data", "preview", "demo_sft", "-n", "1"]),
    ):
        assert main(short) == 0, short
        got = capsys.readouterr().out
        assert main(spelled) == 0
        assert got == capsys.readouterr().out and got.strip(), short
    assert main(["registry", "qwen2.5-7b-instrct"]) == 2  # an unknown name still gets suggestions
    assert "qwen2.5-7b-instruct" in capsys.readouterr().err


def test_data_preview_marks_trained_tokens(capsys):
    assert main(["data", "preview", "demo_sft", "-n", "2", "--model", "gym-tiny"]) == 0
    out = capsys.readouterr().out
    assert "6000 sft records" in out
    # Only the assistant's answer and its end-of-turn token carry loss.
    records = out.split("--- record 1", 1)[1]
    assert records.count("⟦") == 2 and records.count("<|im_end|>⟧") == 2
    assert "⟦<|im_start|>user" not in records


def test_data_preview_of_pairs_and_kto_says_what_the_loss_scores(capsys):
    """Pairs and KTO records have no ⟦…⟧ marks: the legend used to promise them anyway."""
    for dataset, legend in (
        ("demo_dpo", "the loss compares [chosen] with [rejected]"),
        ("demo_kto", "the loss scores [completion] after [prompt], as desirable ([label] True) or not"),
    ):
        assert main(["data", "preview", dataset, "-n", "1", "--model", "gym-tiny"]) == 0
        out = capsys.readouterr().out
        assert legend in out and "⟦" not in out


def test_data_preview_reads_a_dataset_as_a_method_does(tmp_path, capsys, gym_home):
    """`gym data` could not show TF-GRPO's question/answer files (an unknown format), nor sft data as the
    prompts online RL reads; --method shows both, and refuses data the method can't train on."""
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "2+2?", "answer": "4"}\n')
    assert main(["data", str(qa)]) == 2
    assert main(["data", str(qa), "--method", "tf_grpo", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["prompt"] == [{"role": "user", "content": "2+2?"}] and row["answer"] == "4"
    assert main(["data", "demo_sft", "-n", "1", "--method", "grpo", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert set(row) == {"prompt", "answer"} and row["prompt"][-1]["role"] == "user" and row["answer"]
    assert main(["data", "demo_sft", "-n", "1", "--method", "ppo", "--model", "gym-tiny"]) == 0
    out = capsys.readouterr().out
    assert "sft records read as prompts" in out and "online RL completes each [prompt]" in out
    assert "[answer]\n" + row["answer"] in out and "⟦" not in out
    assert main(["data", "demo_sft", "--method", "dpo"]) == 2
    assert "method 'dpo' needs a preference dataset" in capsys.readouterr().err
    assert main(["data", "demo_sft", "--method", "dpoo"]) == 2
    assert "unknown method; available: sft" in capsys.readouterr().err
    assert main(["data", "demo_sft", "--method", "sft_then_dpo"]) == 2
    assert "(--method sft, then --method dpo)" in capsys.readouterr().err


def test_data_preview_says_which_pairs_training_leaves_out(tmp_path, capsys):
    # It said only that training cuts longer pairs' answers; one whose prompt fills cutoff_len is left out
    rows = [
        {"prompt": "word " * 300, "chosen": "a", "rejected": "b"},
        {"prompt": "hi", "chosen": "y", "rejected": "n"},
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["data", str(data), "--model", "gym-tiny", "--cutoff_len", "64"]) == 0
    out = capsys.readouterr().out
    says = "note: 1 of 2 pair(s) have a prompt of cutoff_len=64 tokens or more: no answer token fits, so"
    assert says in out and "they are left out" in out


def test_registry_list_columns_are_as_wide_as_their_longest_value(capsys):
    assert main(["registry"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    start = header.index("template")  # deepseek-llm outgrew a fixed width and shifted its row
    assert all(row[start - 1] == " " and row[start] != " " for row in rows)
    assert any(row[start:].startswith("deepseek-llm ") for row in rows)


def test_data_preview_numbers_records_as_the_file_does_and_says_what_cutoff_len_cuts(tmp_path, capsys):
    """A record left out (no answer token within cutoff_len) vanished from the preview and shifted the
    numbers of the rest; the hint for raw text too short for a block (lower cutoff_len) had no flag."""
    data = tmp_path / "long.jsonl"
    rows = [{"instruction": "word " * 40, "output": "ok"}, {"instruction": "a", "output": "word " * 40}]
    rows += [{"instruction": "b", "output": "c"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["data", str(data), "--model", "gym-tiny", "--cutoff_len", "24"]) == 0
    out = capsys.readouterr().out
    assert "note: 1 of 3 record(s) left out (record 1): within cutoff_len=24 tokens" in out
    assert "note: 1 of 2 record(s) cut to cutoff_len=24 tokens (record 2)" in out
    assert "--- record 1" not in out and "--- record 2 (24 tokens)" in out and "--- record 3 (" in out
    text = tmp_path / "short.jsonl"
    text.write_text('{"text": "hello world"}\n')
    assert main(["data", str(text), "--model", "gym-tiny"]) == 2
    assert "fewer than one block of cutoff_len=1024 (lower cutoff_len" in capsys.readouterr().err
    assert main(["data", str(text), "--model", "gym-tiny", "--cutoff-len", "4"]) == 0
    assert "--- block 1 (4 tokens)" in capsys.readouterr().out


def test_data_preview_reports_bad_file_with_record_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c"}\n')
    assert main(["data", "preview", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "record 2" in err and "output" in err


def _gym(*args: str, home, **env: str) -> subprocess.Popen:
    quiet = (
        "HF_DATASETS_DISABLE_PROGRESS_BARS",
        "HF_HUB_DISABLE_PROGRESS_BARS",
        "TQDM_DISABLE",
        "GYM_VERBOSE",
    )
    base = {k: v for k, v in os.environ.items() if k not in quiet}
    cmd = [sys.executable, "-m", "flows.cli", *args]
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**base, "GYM_HOME": str(home), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_output_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path):
    """`gym registry list | head -1`: the reader is gone before gym writes; no traceback, SIGPIPE's status."""
    proc = _gym("registry", "list", home=tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()  # before the process has imported anything, let alone printed
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == 141


def test_ctrl_c_ends_a_command_with_one_line_and_sigints_status(tmp_path):
    """Ctrl-C at `gym chat`'s prompt (as in `gym eval` or `gym export`) printed a KeyboardInterrupt
    traceback; it ends the command with one line and status 130, as a shell command does."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "chat", "--model", "gym-tiny"],
        cwd=REPO,
        env={**os.environ, "GYM_HOME": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    assert proc.stdout is not None
    shown = b""
    while b"you> " not in shown and proc.poll() is None:  # the prompt: the model is loaded, input awaited
        shown += os.read(proc.stdout.fileno(), 4096)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and err.strip().endswith(b"interrupted"), err.decode()[-2000:]
    assert proc.returncode == 130


def test_library_progress_bars_stay_off_the_console_unless_verbose(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n')
    args = ("data", "preview", str(data), "--model", "gym-tiny")
    quiet = _gym(*args, home=tmp_path / "q").communicate(timeout=300)
    verbose = _gym(*args, home=tmp_path / "v", GYM_VERBOSE="1").communicate(timeout=300)
    assert b"1 sft records" in quiet[0] and b"1 sft records" in verbose[0]
    # datasets' "Saving the dataset" and transformers' "Writing model shards" bars (building gym-tiny)
    assert b"Saving the dataset" in verbose[1] and b"Writing model shards" in verbose[1]
    assert b"Saving the dataset" not in quiet[1] and b"Writing model shards" not in quiet[1], quiet[
        1
    ].decode()


def test_version_names_gym_and_the_libraries_a_bug_report_needs(capsys):
    from importlib import metadata

    from flows.cli import main as gym
    from flows.cli import usage

    for flag in ("--version", "-V", "version"):
        assert gym([flag]) == 0
        first, libraries = capsys.readouterr().out.splitlines()
        assert first == f"gym {metadata.version('gym')}"
        assert f"torch {metadata.version('torch')}" in libraries
        assert f"transformers {metadata.version('transformers')}" in libraries and "python 3." in libraries
    assert "gym --version" in usage()


def test_a_mistyped_command_gets_the_command_it_may_mean(capsys):
    from flows.cli import main as gym

    assert gym(["trian"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown command 'trian' (did you mean train?); choose from train, " in err
    assert gym(["frobnicate"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_every_command_help_opens_with_whole_sentences(capsys):
    """`gym COMMAND --help` describes the command in full sentences (two cut theirs at a line's end)."""
    import importlib

    from flows.cli import COMMANDS

    for name, (target, _) in COMMANDS.items():
        if name in ("train", "up", "status", "down"):  # they run flows or servers; their help is tested there
            continue
        module, function = target.split(":")
        try:
            getattr(importlib.import_module(module), function)(["--help"])
        except SystemExit as exc:
            assert exc.code == 0, name
        out = capsys.readouterr().out
        description = out.split("\n\n")[1]
        assert description.rstrip().endswith((".", ")", ":")), (name, description)


def test_options_that_would_do_nothing_are_refused_not_ignored(capsys):
    """`gym data FILE --cutoff_len 5` (no --model), `-n 0` and `gym registry list NAME` ran as if the option
    were not there; `gym data show X` read `show` as the dataset."""
    for argv, message in (
        (
            ["data", "demo_sft", "--cutoff_len", "5"],
            "--cutoff_len shapes the templated text, which only --model",
        ),
        (
            ["data", "demo_sft", "--template", "chatml", "--cutoff_len", "5"],
            "--template and --cutoff_len shape",
        ),
        (["registry", "list", "gym-tiny"], "gym registry list takes no name; `gym registry show gym-tiny`"),
    ):
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    for n in ("0", "-1"):
        try:
            main(["data", "demo_sft", "-n", n])
        except SystemExit as exc:  # argparse's usage error
            assert exc.code == 2
        assert "a whole number of records, at least 1" in capsys.readouterr().err
    assert main(["data", "show", "demo_sft", "-n", "1"]) == 0
    shown = capsys.readouterr().out
    assert main(["data", "preview", "demo_sft", "-n", "1"]) == 0
    assert shown == capsys.readouterr().out and "6000 sft records" in shown


def test_gyms_own_warnings_are_one_line_on_the_command_line(monkeypatch, capsys):
    """A degraded TF-GRPO run printed `/work/main/tasks/tfgrpo.py:184: RuntimeWarning: TF-GRPO: ...` and a
    line of gym's source; other warnings are shown as before."""
    import warnings

    from gym.cli import _gym_warnings_as_lines
    from gym.errors import GymWarning

    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kw: shown.append(str(message)))
    _gym_warnings_as_lines()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("TF-GRPO: all 1 steps degraded", GymWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert capsys.readouterr().err == "gym: warning: TF-GRPO: all 1 steps degraded\n"
    assert shown == ["something else"]  # as Python (here: the showwarning before) shows it
