"""benchmarks/methods.py runs for every offline method (a few steps): each one gym trains is compared
with the TRL trainer it uses, called directly as a user would."""

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


def demo_kinds() -> set[str]:
    """The data kinds benchmarks/methods.py has demo data for (its DEMO table)."""
    spec = importlib.util.spec_from_file_location("bench_methods", REPO / "benchmarks" / "methods.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return set(module.DEMO)


@pytest.mark.slow
def test_methods_benchmark_compares_every_method_with_demo_data():
    from gym.train import METHODS

    kinds = demo_kinds()
    offline = [m for m in METHODS if METHOD_KIND.get(m) in kinds]
    assert {"sft", "dpo", "kto", "orpo", "simpo", "rm"} <= set(offline)
    args = ["--methods", ",".join(offline), "--steps", "2", "--repeats", "1", "--skip-batching"]
    proc = subprocess.run(
        [sys.executable, "benchmarks/methods.py", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(result["gym_vs_trl"]) == sorted(offline)
    assert all(ratio > 0 for ratio in result["gym_vs_trl"].values()), result["gym_vs_trl"]
