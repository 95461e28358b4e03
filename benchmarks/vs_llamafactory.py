"""Side by side on CPU: LLaMA-Factory 0.9.5, plain TRL and `gym train`, whole processes as users launch them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_llamafactory.py [--repeats 1] [--setup-only]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_llamafactory.py --stage dpo

The same SFT run for each: a 2.5M-parameter Llama built from a config (saved once, untimed),
2,000 alpaca records (gym's demo_sft), 100 steps at batch 8, fp32, cosine schedule, lr 3e-3.
`--stage dpo`: the same model after DPO instead, on gym's 800 demo_dpo pairs (alpaca-style
instruction/input/chosen/rejected, LLaMA-Factory's `ranking` format), full fine-tuning, sigmoid loss,
beta 0.1, 100 steps at batch 8, lr 1e-4, each tool with its default reference (LLaMA-Factory: a frozen
copy run every step; gym: log-probs precomputed once, part of its process time); plain TRL's DPO is
compared in benchmarks/methods.py, so this stage has no TRL column. `--stage orpo` and `--stage simpo`:
the same pairs, reference-free, with gym's defaults (ORPO lambda 0.1; SimPO beta 2.0, gamma 1.0).
`--stage kto`: gym's 600 demo_kto records (an answer each, labelled desirable or not), beta 0.1,
weights 1.0, each tool's default reference.
- LLaMA-Factory: `llamafactory-cli train config.yaml` from its own virtual environment,
  benchmarks/.venv-lf (git-ignored), which this script creates on first use: llamafactory==0.9.5
  with the CPU torch this project pins; its CUDA torchvision is uninstalled and torchaudio's
  compiled libraries are moved aside, as it won't import on a CPU machine otherwise.
- plain TRL: benchmarks/trl_sft_baseline.py (the script a user would write).
- gym: `gym train` (python -m flows.cli train) with Prefect's temporary API ("ephemeral") and
  against a running `prefect server` ("server"), each in a workspace whose first run (which
  creates the MLflow and Prefect databases, reported as first_use) was on other data.
Each run's training tokens/s comes from the tool's own log (real tokens over train_runtime);
whole-process seconds are timed from launch to exit, and CPU seconds (the process and the children
it waited for, e.g. Prefect's temporary API) are reported beside them: on a shared machine they
move less than wall time. Goals: gym train tok/s >= 1.0x LF's; whole `gym train`
<= 1.3x LF (<= 1.0x against a running server). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LF_VENV = REPO / "benchmarks" / ".venv-lf"
LF_VERSION = "0.9.5"
STEPS, BATCH, CUTOFF = 100, 8, 256
PAIRED = ("dpo", "orpo", "simpo")  # LLaMA-Factory's stage dpo with its pref_loss
LR = {"sft": 3e-3, "kto": 1e-4} | {m: 1e-4 for m in PAIRED}
RECORDS = {"sft": 2000, "kto": 600} | {m: 800 for m in PAIRED}
DEMO = {"sft": "demo_sft", "kto": "demo_kto"} | {m: "demo_dpo" for m in PAIRED}
# gym's defaults for each method, in LLaMA-Factory's names (ORPO's lambda is its pref_beta).
PREF = {
    "dpo": {"pref_loss": "sigmoid", "pref_beta": 0.1, "pref_ftx": 0.0},
    "orpo": {"pref_loss": "orpo", "pref_beta": 0.1},
    "simpo": {"pref_loss": "simpo", "pref_beta": 2.0, "simpo_gamma": 1.0, "pref_ftx": 0.0},
    "kto": {"pref_beta": 0.1, "pref_ftx": 0.0, "kto_chosen_weight": 1.0, "kto_rejected_weight": 1.0},
}
# 2.6M parameters: gym-tiny's tokenizer (4,096 tokens, tied embeddings) and 8 Llama layers of width 128.
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 4096,
}


def setup_llamafactory() -> Path:
    """Create benchmarks/.venv-lf with LLaMA-Factory on CPU torch; return its llamafactory-cli."""
    cli = LF_VENV / "bin" / "llamafactory-cli"
    if cli.is_file():
        return cli
    torch_pin = _pin("torch")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(LF_VENV)], check=True)
    pip = [str(LF_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"llamafactory=={LF_VERSION}", f"torch=={torch_pin}"], check=True)
    # PyPI's torchvision is a CUDA build and breaks `import transformers` paths LF takes on CPU.
    subprocess.run(
        [str(LF_VENV / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", "torchvision"], check=True
    )
    # torchaudio's compiled extensions need CUDA libraries: move them aside so its import fails cleanly.
    for lib in glob.glob(str(LF_VENV / "lib" / "python*" / "site-packages" / "torchaudio" / "lib" / "*.so")):
        os.rename(lib, lib + ".disabled")
    return cli


def _pin(package: str) -> str:
    for line in (REPO / "constraints" / "cpu.txt").read_text().splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==", 1)[1].split(";")[0].strip()
    raise SystemExit(f"{package} is not pinned in constraints/cpu.txt")


def prepare(root: Path, env: dict[str, str], stage: str) -> tuple[Path, Path]:
    """Untimed: the model directory (with gym's chatml template) and the stage's alpaca records."""
    code = f"""
import json, torch
from pathlib import Path
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from gym.data.demo import demo_records
from gym.templates import load_template
torch.manual_seed(0)
config = LlamaConfig(**{MODEL_SHAPE!r}, max_position_embeddings=512, tie_word_embeddings=True,
                     pad_token_id=0, eos_token_id=2, bos_token_id=None)
model = LlamaForCausalLM(config)
out = Path({str(root / "model")!r})
model.save_pretrained(out, safe_serialization=True)
tok = AutoTokenizer.from_pretrained({str(REPO / "gym" / "assets" / "gym_tiny")!r})
tok.chat_template = load_template("chatml")
tok.save_pretrained(out)
(out / "gym_model.json").write_text(json.dumps({{"template": "chatml", "base_model": "bench-2.5m"}}))
rows = demo_records({DEMO[stage]!r})
for name, part in (("alpaca.jsonl", rows[:{RECORDS[stage]}]), ("first-use.jsonl", rows[-64:])):
    with open(Path({str(root)!r}) / name, "w") as f:
        f.writelines(json.dumps(r) + "\\n" for r in part)
print(sum(p.numel() for p in model.parameters()))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr[-3000:])
    print(f"model: {int(out.stdout.split()[-1]) / 1e6:.2f}M parameters", flush=True)
    return root / "model", root / "alpaca.jsonl"


def lf_config(root: Path, model: Path, data: Path, stage: str) -> Path:
    """LLaMA-Factory's YAML for the same run (its dataset registry lives beside the data)."""
    data_dir = root / "lf-data"
    data_dir.mkdir(exist_ok=True)
    shutil.copy(data, data_dir / "alpaca.jsonl")
    info: dict[str, Any] = {"file_name": "alpaca.jsonl"}
    if stage in PAIRED:
        columns = {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}
        info.update(ranking=True, columns=columns)
    if stage == "kto":  # one answer per record and whether it is desirable (LLaMA-Factory's kto_tag)
        info["columns"] = {
            "prompt": "instruction",
            "query": "input",
            "response": "output",
            "kto_tag": "label",
        }
    (data_dir / "dataset_info.json").write_text(json.dumps({"bench": info}))
    config = {
        "model_name_or_path": str(model),
        "stage": "dpo" if stage in PAIRED else stage,
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "bench",
        "dataset_dir": str(data_dir),
        "template": "chatml",  # the same turns as gym's chatml template
        "cutoff_len": CUTOFF,
        "overwrite_cache": True,
        "preprocessing_num_workers": 1,
        "output_dir": str(root / "lf-out"),
        "overwrite_output_dir": True,
        "logging_steps": 5,
        "save_strategy": "no",
        "per_device_train_batch_size": BATCH,
        "gradient_accumulation_steps": 1,
        "learning_rate": LR[stage],
        "max_steps": STEPS,
        "lr_scheduler_type": "cosine",
        "warmup_ratio": 0.05,
        "bf16": False,
        "report_to": "none",
        "include_num_input_tokens_seen": "non_padding",  # real tokens, as gym and TRL count them
        "disable_tqdm": True,
        "use_cpu": True,
    }
    config.update(PREF.get(stage, {}))
    path = root / "lf.yaml"
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in config.items()) + "\n")
    return path


def timed(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the process and the children it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def trainer_tok_s(log: Path) -> float | None:
    """Training tokens/s from a Trainer log: tokens seen over train_runtime."""
    text = log.read_text()
    runtime = re.findall(r"'train_runtime': '?([\d.]+)", text)
    tokens = re.findall(r"'(?:num_input_tokens_seen|num_tokens)': '?([\d.e+]+)", text)
    if not runtime or not tokens:
        return None
    return float(tokens[-1]) / float(runtime[-1])


def tokens_seen(log: Path) -> int | None:
    """The training tokens a Trainer log counted (the last `num_input_tokens_seen`): the same data and
    steps should give the same count in every tool, which shows the tokens/s compare like with like."""
    found = re.findall(r"'(?:num_input_tokens_seen|num_tokens)': '?([\d.e+]+)", log.read_text())
    return int(float(found[-1])) if found else None


def gym_summary(log: Path, stage: str) -> tuple[float | None, int | None]:
    """gym prints its summary as JSON last: real tokens/s of the trained stage; the tokens it counted
    are in the stage's result.json, beside the model."""
    last = json.loads([line for line in log.read_text().splitlines() if line.startswith("{")][-1])
    result = Path(last["model_dir"]).parent / "result.json"
    tokens = json.loads(result.read_text()).get("tokens_seen") if result.is_file() else None
    return last.get(f"{stage}_tokens_per_second"), tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--setup-only", action="store_true", help="Create benchmarks/.venv-lf and stop.")
    p.add_argument(
        "--stage", choices=("sft", *PAIRED, "kto"), default="sft", help="The method all tools run."
    )
    a = p.parse_args()
    lf_cli = setup_llamafactory()
    if a.setup_only:
        return
    sys.path.insert(0, str(REPO / "benchmarks"))
    from overhead import prefect_server

    root = Path(tempfile.mkdtemp(prefix="gym-vs-lf-"))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "HF_HUB_OFFLINE": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "DISABLE_VERSION_CHECK": "1",
        "GYM_HOME": str(root / "prep"),
    }
    env.pop("PYTHONPATH", None)
    model, data = prepare(root, {**env, "PYTHONPATH": str(REPO)}, a.stage)
    lf_yaml = lf_config(root, model, data, a.stage)
    trl_cmd = (
        None
        if a.stage != "sft"
        else [
            sys.executable,
            "benchmarks/trl_sft_baseline.py",
            f"--model={model}",
            f"--data={data}",
            f"--steps={STEPS}",
            f"--lr={LR['sft']}",
            f"--batch-size={BATCH}",
            f"--out={root / 'trl-out'}",
        ]
    )
    gym_cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "train",
        f"--method={a.stage}",
        f"--model={model}",
        f"--dataset={data}",
        "--eval_dataset=None",
        f"--max-steps={STEPS}",
        f"--train.learning_rate={LR[a.stage]}",
        f"--train.per_device_train_batch_size={BATCH}",
        f"--train.save_steps={10 * STEPS}",
        f"--data.cutoff_len={CUTOFF}",
        "--json",
    ]
    rows: list[dict[str, Any]] = []
    with prefect_server(root / "server-home", env) as api_url:
        for r in range(a.repeats):
            row: dict[str, Any] = {}
            log = root / f"lf-{r}.log"
            row["lf_s"], row["lf_cpu_s"] = timed(
                [str(lf_cli), "train", str(lf_yaml)], {**env, "PATH": _path(lf_cli)}, log
            )
            row["lf_tok_s"], row["lf_tokens"] = trainer_tok_s(log), tokens_seen(log)
            if trl_cmd is not None:
                log = root / f"trl-{r}.log"
                row["trl_s"], row["trl_cpu_s"] = timed(trl_cmd, env, log)
                row["trl_tok_s"] = trainer_tok_s(log)
            for mode, extra in (("ephemeral", {}), ("server", {"PREFECT_API_URL": api_url})):
                home = {**env, **extra, "GYM_HOME": str(root / f"gym-{mode}-{r}")}
                home["PREFECT_HOME"] = str(root / f"prefect-{mode}-{r}")
                # A workspace's first run creates its MLflow and Prefect databases (once per machine):
                # timed apart, on other data, so the measured run is a new config in a workspace in use.
                first = [*gym_cmd, f"--dataset={root / 'first-use.jsonl'}", "--max-steps=1"]
                first_log = root / f"gym-first-{mode}-{r}.log"
                row[f"gym_{mode}_first_use_s"], _ = timed(first, home, first_log)
                log = root / f"gym-{mode}-{r}.log"
                row[f"gym_{mode}_s"], row[f"gym_{mode}_cpu_s"] = timed(gym_cmd, home, log)
                row[f"gym_{mode}_tok_s"], row[f"gym_{mode}_tokens"] = gym_summary(log, a.stage)
            rows.append(row)
            print("run", r, json.dumps(row), flush=True)
    best = {k: _best(k, [x[k] for x in rows]) for k in rows[0]}
    summary: dict[str, Any] = {
        "stage": a.stage,
        "steps": STEPS,
        "batch": BATCH,
        "records": RECORDS[a.stage],
        "repeats": a.repeats,
    }
    summary.update({k: round(v, 2) if isinstance(v, float) else v for k, v in best.items()})
    with contextlib.suppress(TypeError, ZeroDivisionError):
        summary["gym_vs_lf_train_tok_s"] = round(best["gym_ephemeral_tok_s"] / best["lf_tok_s"], 3)
    summary["gym_ephemeral_vs_lf_process"] = round(best["gym_ephemeral_s"] / best["lf_s"], 3)
    summary["gym_server_vs_lf_process"] = round(best["gym_server_s"] / best["lf_s"], 3)
    if trl_cmd is not None:
        summary["trl_vs_lf_process"] = round(best["trl_s"] / best["lf_s"], 3)
    # CPU seconds move less than wall seconds when other work shares the machine.
    for mode in ("ephemeral", "server"):
        summary[f"gym_{mode}_vs_lf_process_cpu"] = round(best[f"gym_{mode}_cpu_s"] / best["lf_cpu_s"], 3)
    print(f"{'':24s}{'process s':>12s}{'process cpu s':>15s}{'train tok/s':>14s}")
    for name in (
        ("lf", "trl", "gym_ephemeral", "gym_server") if trl_cmd else ("lf", "gym_ephemeral", "gym_server")
    ):
        tok = best.get(f"{name}_tok_s")
        print(
            f"{name:24s}{best[f'{name}_s']:12.1f}{best[f'{name}_cpu_s']:15.1f}"
            f"{tok if tok is None else round(tok):>14}"
        )
    print(
        f"gym/LF train tok/s {summary.get('gym_vs_lf_train_tok_s')} (goal >= 1.0); whole gym train / LF: "
        f"{summary['gym_ephemeral_vs_lf_process']} (goal <= 1.3), with a running server "
        f"{summary['gym_server_vs_lf_process']} (goal <= 1.0)"
    )
    print(json.dumps(summary))
    shutil.rmtree(root, ignore_errors=True)


def _best(key: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return max(present) if key.endswith("tok_s") else min(present)  # the least disturbed run


def _path(cli: Path) -> str:
    return f"{cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"


if __name__ == "__main__":
    main()
