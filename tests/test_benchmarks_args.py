"""The benchmark scripts' own logic, without running a benchmark: argument checks, the refusal without a
GPU, the FLOPs formula, the ratios they report and LLaMA-Factory's install failing in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


def load(name: str) -> ModuleType:
    """A benchmarks/ script as a module (benchmarks/ is no package; each imports only the standard
    library at the top)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_train, overhead, vs_lf = load("gpu_train"), load("overhead"), load("vs_llamafactory")


# gpu_train.py


def test_gpu_train_resolves_its_defaults_for_smoke_and_full_runs():
    smoke = gpu_train.parse_args(["--smoke"])
    assert (smoke.steps, smoke.skip, smoke.batch) == (8, 2, 4)
    full = gpu_train.parse_args([])
    assert (full.steps, full.skip, full.batch) == (60, 10, 16)
    assert gpu_train.parse_args(["--smoke", "--steps", "3", "--skip", "2"]).steps == 3


@pytest.mark.parametrize(
    "argv",
    [
        ["--smoke", "--steps", "2", "--skip", "2"],  # no step left to time (was a ZeroDivisionError)
        ["--smoke", "--steps", "2", "--skip", "5"],
        ["--steps", "10"],  # the default --skip 10
        ["--smoke", "--skip", "0"],  # the clock starts at the end of step --skip: step 0 never ends
        ["--smoke", "--batch", "0"],
    ],
)
def test_gpu_train_refuses_settings_that_leave_nothing_to_time(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        gpu_train.parse_args(argv)
    assert exc.value.code == 2
    assert "error: --" in capsys.readouterr().err


def test_gpu_train_without_cuda_stops_at_once_unless_smoke(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the full benchmark would run")
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_train.py", "--steps", "3", "--skip", "1"],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("gpu_train.py:")]
    assert "no CUDA GPU" in line and "--smoke" in line
    assert proc.stdout == "" and not list(tmp_path.iterdir())  # no model built, nothing left behind


def test_gpu_train_counts_the_matmul_weights_not_the_input_embedding():
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = gpu_train.SHAPES["smoke"]
    model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))  # LM head included
    total = sum(p.numel() for p in model.parameters())
    assert gpu_train.matmul_params(shape) == linear
    embedding = shape["vocab_size"] * shape["hidden_size"]
    norms = (2 * shape["num_hidden_layers"] + 1) * shape["hidden_size"]
    assert total - gpu_train.matmul_params(shape) == embedding + norms
    attention = 12 * shape["num_hidden_layers"] * shape["hidden_size"] * 36.0
    assert gpu_train.flops_per_token(shape, 36.0) == 6 * linear + attention
    assert gpu_train.flops_per_token(shape, 36.0, frozen=True) == 4 * linear + attention


def test_gpu_train_reports_the_optimizer_the_trainer_built():
    from transformers.training_args import OptimizerNames

    class AdamW:  # the optimizer under accelerate's wrapper
        pass

    trainer = SimpleNamespace(
        args=SimpleNamespace(optim=OptimizerNames("adamw_torch_fused")),
        optimizer=SimpleNamespace(optimizer=AdamW()),
    )
    assert gpu_train.optimizer_used(trainer) == {"optim": "adamw_torch_fused", "optimizer": "AdamW"}
    json.dumps(gpu_train.optimizer_used(trainer))


# overhead.py


def test_overhead_reports_the_time_outside_training_on_both_sides():
    rows = [
        {"trl_s": 20.0, "trl_train_s": 12.0, "trl_outside_s": 8.0, "ephemeral_cold_s": 22.0,
         "ephemeral_train_s": 6.0, "ephemeral_outside_s": 16.0, "ephemeral_cached_s": 2.2,
         "server_cold_s": 18.0, "server_train_s": 6.0, "server_outside_s": 12.0, "server_cached_s": 1.8},
        {"trl_s": 24.0, "trl_train_s": 14.0, "trl_outside_s": 10.0, "ephemeral_cold_s": 26.0,
         "ephemeral_train_s": 7.0, "ephemeral_outside_s": 19.0, "ephemeral_cached_s": 3.0,
         "server_cold_s": 20.0, "server_train_s": 7.0, "server_outside_s": 13.0, "server_cached_s": 2.0},
    ]  # fmt: skip
    summary = overhead.summarize(rows, 200)
    assert summary["steps"] == 200 and summary["trl_s"] == 20.0  # best of the repeats
    assert summary["ephemeral_overhead_ratio"] == 1.1  # the whole process hides ...
    assert summary["ephemeral_outside_ratio"] == 2.0  # ... twice the time outside training
    assert summary["ephemeral_outside_extra_s"] == 8.0
    assert summary["server_outside_ratio"] == 1.5 and summary["server_outside_extra_s"] == 4.0
    assert summary["server_cached_ratio"] == 0.1


def test_overhead_reads_each_sides_training_seconds(tmp_path):
    stage = tmp_path / "stage"
    (stage / "model").mkdir(parents=True)
    (stage / "result.json").write_text(json.dumps({"train_seconds": 6.5, "tokens_seen": 10}))
    gym_out = "Training...\nsummary\n" + json.dumps({"model_dir": str(stage / "model")}) + "\n"
    assert overhead.gym_train_seconds(gym_out) == 6.5
    trl_out = "{'loss': 1.0}\n" + json.dumps({"train_seconds": 12.25, "tokens": 900}) + "\n"
    assert overhead.last_json(trl_out)["train_seconds"] == 12.25
    with pytest.raises(SystemExit, match="no JSON line"):
        overhead.last_json("no json here\n")


# vs_llamafactory.py


def test_vs_llamafactory_skip_lf_is_for_sft_and_not_with_setup_only(capsys):
    a = vs_lf.parse_args(["--skip-lf", "--keep"])
    assert a.skip_lf and a.keep and a.stage == "sft"
    for argv in (["--skip-lf", "--stage", "dpo"], ["--skip-lf", "--setup-only"], ["--repeats", "0"]):
        with pytest.raises(SystemExit) as exc:
            vs_lf.parse_args(argv)
        assert exc.value.code == 2
    assert "--skip-lf" in capsys.readouterr().err


def test_vs_llamafactory_installs_cpu_torch_from_pytorchs_cpu_index():
    install = vs_lf.lf_install_commands()[1]
    assert install[install.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert f"torch=={vs_lf._pin('torch')}+cpu" in install
    assert f"llamafactory=={vs_lf.LF_VERSION}" in install


def test_vs_llamafactory_install_failure_is_one_line_with_the_commands(tmp_path, monkeypatch):
    venv = tmp_path / ".venv-lf"
    monkeypatch.setattr(vs_lf, "LF_VENV", venv)

    def fake_run(cmd, check=False, **kwargs):
        venv.mkdir(exist_ok=True)  # the venv step made it; pip then fails (no network)
        if "install" in cmd:
            raise subprocess.CalledProcessError(1, cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(vs_lf.subprocess, "run", fake_run)
    with pytest.raises(SystemExit) as exc:
        vs_lf.setup_llamafactory()
    message = str(exc.value.code)
    assert "\n" not in message and "failed" in message and "exit 1" in message
    assert "pip install" in message and "download.pytorch.org/whl/cpu" in message and "--skip-lf" in message
    assert not venv.exists()  # a half-made environment would pass for an installed one next time


def test_vs_llamafactory_without_lf_compares_gym_with_trl():
    row = {
        "trl_s": 12.0, "trl_cpu_s": 11.0, "trl_tok_s": 1000.0, "trl_tokens": 50_000,
        "gym_ephemeral_s": 15.0, "gym_ephemeral_cpu_s": 16.5, "gym_ephemeral_tok_s": 1500.0,
        "gym_ephemeral_tokens": 50_000, "gym_server_s": 12.0, "gym_server_cpu_s": 11.0,
        "gym_server_tok_s": 1400.0, "gym_server_tokens": 50_000,
    }  # fmt: skip
    summary = vs_lf.summarize([row], "sft", 1)
    assert not any(k.startswith("lf_") or "_vs_lf" in k for k in summary)
    assert summary["gym_vs_trl_train_tok_s"] == 1.5
    assert summary["gym_ephemeral_vs_trl_process"] == 1.25 and summary["gym_server_vs_trl_process"] == 1.0
    assert summary["gym_ephemeral_vs_trl_process_cpu"] == 1.5
    assert summary["trl_tokens"] == summary["gym_ephemeral_tokens"] == 50_000
    with_lf = vs_lf.summarize([{**row, "lf_s": 10.0, "lf_cpu_s": 10.0, "lf_tok_s": 1000.0}], "sft", 1)
    assert with_lf["gym_vs_lf_train_tok_s"] == 1.5 and with_lf["trl_vs_lf_process"] == 1.2
    assert with_lf["gym_ephemeral_vs_lf_process"] == 1.5


@pytest.mark.parametrize(
    ("fails", "keep", "kept"), [(True, False, True), (False, True, True), (False, False, False)]
)
def test_vs_llamafactory_keeps_the_logs_when_a_run_fails_or_asked(
    fails, keep, kept, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(vs_lf.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["vs_llamafactory.py", "--skip-lf", *(["--keep"] if keep else [])])
    monkeypatch.setattr(vs_lf.signal, "signal", lambda *args: None)

    def fake_run(a, lf_cli, root, logs):
        assert lf_cli is None  # --skip-lf: nothing installed
        (root / "model").mkdir()
        (logs / "trl-0.log").write_text("training...")
        if fails:
            raise SystemExit("failed (1): trl")

    monkeypatch.setattr(vs_lf, "run", fake_run)
    if fails:
        with pytest.raises(SystemExit):
            vs_lf.main()
    else:
        vs_lf.main()
    left = sorted(p.name for p in tmp_path.rglob("*"))
    assert not any(name.startswith("gym-vs-lf-") and "logs" not in name for name in left)  # models go
    assert ("trl-0.log" in left) == kept
    assert ("logs kept in" in capsys.readouterr().err) == kept
