"""The prepared benchmarks run end to end in their --smoke modes (tiny models, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def smoke(script: str, *args: str) -> dict:
    """Run a benchmark's --smoke mode (OMP_NUM_THREADS=1) and return its last line, parsed."""
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--smoke", *args],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_gpu_train_smoke_compares_gym_and_trl_on_the_same_loss_curve():
    result = smoke("gpu_train.py")
    assert result["device"] == "cpu" and result["steps"] == 8
    assert result["gym_tok_s"] > 0 and result["trl_tok_s"] > 0
    assert result["speedup"] == pytest.approx(result["gym_tok_s"] / result["trl_tok_s"], rel=1e-2)
    # gym's defaults skip TRL's gradient checkpointing: the same math, so the same losses.
    assert result["trl_settings"]["gradient_checkpointing"] is True
    assert result["gym_settings"]["liger"] is False, "no Liger without CUDA"
    assert result["gym_settings"]["memory_estimate_gib"] > 0  # beside peak_gb (None on a CPU)
    for side in ("gym_settings", "trl_settings"):  # the optimizer each Trainer built, not the config's None
        assert result[side]["optim"] and result[side]["optimizer"]
    assert 0 < result["matmul_params"] < result["params"]  # the input embedding does no matmul
    assert result["loss_gap"] < 1e-3
    assert result["gym_loss_first_last"] == pytest.approx(result["trl_loss_first_last"], abs=1e-3)


@pytest.mark.slow
def test_gpu_train_smoke_runs_qlora_with_the_same_adapter_on_both_sides():
    pytest.importorskip("bitsandbytes", reason="bitsandbytes (gym[quant]) is absent")
    result = smoke("gpu_train.py", "--finetuning-type", "qlora")
    assert result["finetuning_type"] == "qlora" and result["gym_settings"]["quant_bits"] == "4-bit (given)"
    gym_lora, trl_lora = result["trainable"]
    assert gym_lora == trl_lora and 0 < gym_lora < result["params"] / 4  # the same LoRA, a fraction
    assert result["gym_settings"]["optim"] == "adamw_bnb_8bit"  # paged 8-bit AdamW needs CUDA
    assert result["loss_gap"] < 1e-3


@pytest.mark.slow
def test_preference_windows_benchmark_runs_both_paths_to_the_same_loss():
    (row,) = smoke("preference_windows.py")["rows"]  # it exits non-zero if the two losses differ
    assert (row["pairs"], row["prompt"], row["answer_max"]) == (2, 12, 6)
    assert row["gym_ms"] > 0 and row["trl_ms"] > 0 and 0 < row["answer_share"] < 1
