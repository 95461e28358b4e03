"""benchmarks/methods.py runs for every offline method (a few steps): each one gym trains is compared
with the TRL trainer it uses, called directly as a user would, on the same tokens; unknown method names
are refused. benchmarks/online_methods.py's rows show each repeat's ratio beside the best-of one."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gym.data.formats import METHOD_KIND

REPO = Path(__file__).resolve().parents[1]


def script(name: str):
    """A benchmarks/ script as a module (its main not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = dict(os.environ)
    try:
        spec.loader.exec_module(module)
    finally:  # the scripts set OMP_NUM_THREADS, HF_HUB_OFFLINE... for their own process: not for the tests'
        os.environ.clear()
        os.environ.update(saved)
    return module


def demo_kinds() -> set[str]:
    """The data kinds benchmarks/methods.py has demo data for (its DEMO table)."""
    return set(script("methods").DEMO)


def run_methods(args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    """benchmarks/methods.py run as a user runs it."""
    return subprocess.run(
        [sys.executable, "benchmarks/methods.py", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_unknown_method_names_are_one_error_line_and_exit_2():
    proc = run_methods(["--methods", "sfft,dpo,dpo_x", "--steps", "2"], timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --methods: unknown method(s) sfft, dpo_x;"), lines
    assert "sft" in lines[0] and "Traceback" not in proc.stderr


def test_online_rows_give_each_repeats_ratio_and_each_sides_range(capsys):
    measured = script("online_methods").measured
    samples = {
        "gym": [{"rollout_tok_s": 100.0, "opt_tok_s": 50.0}, {"rollout_tok_s": 130.0, "opt_tok_s": 51.0}],
        "trl": [{"rollout_tok_s": 120.0, "opt_tok_s": 50.0}, {"rollout_tok_s": 100.0, "opt_tok_s": 50.0}],
    }
    row = measured("grpo", samples)
    assert row["rollout_tok_s_ratio"] == round(130 / 120, 3)  # best of each side
    assert row["rollout_tok_s_ratios"] == [round(100 / 120, 3), 1.3]  # the sides measured back to back
    assert row["gym_rollout_tok_s_range"] == [100.0, 130.0] and row["trl_rollout_tok_s_range"] == [
        100.0,
        120.0,
    ]
    assert row["opt_tok_s_ratios"] == [1.0, 1.02]
    notes = capsys.readouterr().out.splitlines()
    assert len(notes) == 1 and notes[0].startswith(
        "note: grpo rollout: the repeats' gym/TRL ratios span 0.833-1.3"
    )


@pytest.mark.slow
def test_methods_benchmark_compares_every_method_with_demo_data():
    from gym.train import METHODS

    kinds = demo_kinds()
    offline = [m for m in METHODS if METHOD_KIND.get(m) in kinds]
    assert {"sft", "pt", "dpo", "kto", "orpo", "simpo", "rm"} <= set(offline)
    args = ["--methods", ",".join(offline), "--steps", "2", "--repeats", "1", "--skip-batching"]
    proc = run_methods(args, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: --steps 2 is below" in proc.stderr  # 2 steps: fixed costs inflate the ratios
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(result["gym_vs_trl"]) == sorted(offline)
    assert all(ratio > 0 for ratio in result["gym_vs_trl"].values()), result["gym_vs_trl"]
    for row in result["rows"]:  # both sides train on the same tokens
        if row["method"] == "pt":  # TRL's own packing: its rows include two short tail blocks gym drops
            assert abs(row["gym_tokens"] - row["trl_tokens"]) <= 2 * 512, row
        else:
            assert row["gym_tokens"] == row["trl_tokens"], row
