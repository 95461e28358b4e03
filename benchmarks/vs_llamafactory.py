"""Side by side on CPU: LLaMA-Factory 0.9.5, plain TRL and `gym train`, whole processes as users launch them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_llamafactory.py [--repeats 1] [--setup-only]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_llamafactory.py --stage dpo
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vs_llamafactory.py --skip-lf [--keep]

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
  with the torch version this project pins as PyTorch's CPU build (`torch==X+cpu`, PyTorch's CPU
  index as an extra index: PyPI's own torch is the CUDA build); its CUDA torchvision is uninstalled
  and torchaudio's compiled libraries are moved aside, as it won't import on a CPU machine otherwise.
  If the install fails (no network...), the script says so in one line with the commands to run by
  hand; `--skip-lf` leaves LLaMA-Factory out (TRL and gym only, ratios against TRL).
- plain TRL: benchmarks/trl_sft_baseline.py (the script a user would write).
- gym: `gym train` (python -m flows.cli train) with Prefect's temporary API ("ephemeral") and
  against a running `prefect server` ("server"), each in a workspace whose first run (which
  creates the MLflow and Prefect databases, reported as first_use) was on other data.
Each run's training tokens/s comes from the tool's own log (real tokens over train_runtime);
whole-process seconds are timed from launch to exit, and CPU seconds (the process and the children
it waited for, e.g. Prefect's temporary API) are reported beside them: on a shared machine they
move less than wall time. Each tool's count of training tokens is reported beside its tokens/s
(`*_tokens`: the same data should count the same). Goals: gym train tok/s >= 1.0x LF's; whole `gym train`
<= 1.3x LF (<= 1.0x against a running server). Prints a table and one JSON line. The temporary folder
(models, outputs) is deleted at the end; each tool's log is kept, and its folder named, when a run fails
or with `--keep`.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import resource
import shlex
import shutil
import signal
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
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU wheels (PyPI's torch is CUDA's)
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


def lf_install_commands() -> list[list[str]]:
    """The commands that create benchmarks/.venv-lf: a virtual environment, LLaMA-Factory with PyTorch's
    CPU build of the torch this project pins, and PyPI's CUDA torchvision uninstalled (it breaks the
    `import transformers` paths LF takes on CPU)."""
    torch_pin = _pin("torch")
    torch_cpu = torch_pin if "+" in torch_pin else f"{torch_pin}+cpu"
    python = str(LF_VENV / "bin" / "python")
    pip = [python, "-m", "pip"]
    return [
        [sys.executable, "-m", "venv", "--clear", str(LF_VENV)],
        [
            *pip,
            "install",
            "-q",
            "--extra-index-url",
            TORCH_CPU_INDEX,
            f"llamafactory=={LF_VERSION}",
            f"torch=={torch_cpu}",
        ],
        [*pip, "uninstall", "-y", "-q", "torchvision"],
    ]


def setup_llamafactory() -> Path:
    """Create benchmarks/.venv-lf with LLaMA-Factory on CPU torch; return its llamafactory-cli.
    A failed step removes the half-made environment and ends the script with one line saying what
    failed and how to install it by hand (or to leave LLaMA-Factory out with --skip-lf)."""
    cli = LF_VENV / "bin" / "llamafactory-cli"
    commands = [] if cli.is_file() else lf_install_commands()
    for cmd in commands:
        try:
            subprocess.run(cmd, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            shutil.rmtree(LF_VENV, ignore_errors=True)
            why = f"exit {exc.returncode}" if isinstance(exc, subprocess.CalledProcessError) else str(exc)
            by_hand = " && ".join(shlex.join(c).replace(" --clear", "") for c in commands)
            raise SystemExit(
                f"vs_llamafactory.py: installing LLaMA-Factory {LF_VERSION} into {LF_VENV} failed "
                f"({shlex.join(cmd[:4])}...: {why}; pip's messages above); install it by hand: "
                f"{by_hand}; or run without it: --skip-lf"
            ) from None
    # torchaudio's compiled extensions need CUDA libraries: move them aside so its import fails cleanly
    # (every time: an environment installed by hand gets the same treatment).
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
    """Wall seconds and CPU seconds (user + system, the process and the children it waited for). A failed
    process ends the script with its log's tail (the whole log is kept, see main)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}\n(log: {log})")
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--setup-only", action="store_true", help="Create benchmarks/.venv-lf and stop.")
    p.add_argument(
        "--stage", choices=("sft", *PAIRED, "kto"), default="sft", help="The method all tools run."
    )
    p.add_argument(
        "--skip-lf",
        action="store_true",
        help="Leave LLaMA-Factory out (no install): plain TRL and gym only, ratios against TRL (sft only).",
    )
    p.add_argument(
        "--keep", action="store_true", help="Keep each tool's log (always kept when a run fails); says where."
    )
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    if a.skip_lf and a.setup_only:
        p.error("--setup-only installs LLaMA-Factory, which --skip-lf leaves out")
    if a.skip_lf and a.stage != "sft":
        p.error(
            f"--skip-lf with --stage {a.stage}: no TRL column for that stage, nothing to compare gym with"
        )
    return a


def main() -> None:
    a = parse_args()
    lf_cli = None if a.skip_lf else setup_llamafactory()
    if a.setup_only:
        return
    # A SIGTERM (a job's time limit, `kill`) unwinds like Ctrl-C: the temporary folder goes, the logs stay.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="gym-vs-lf-"))
    logs = Path(tempfile.mkdtemp(prefix="gym-vs-lf-logs-"))  # apart from root: models and outputs go
    failed = True
    try:
        run(a, lf_cli, root, logs)
        failed = False
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if failed or a.keep:
            print(f"logs kept in {logs}", file=sys.stderr)
        else:
            shutil.rmtree(logs, ignore_errors=True)


def run(a: argparse.Namespace, lf_cli: Path | None, root: Path, logs: Path) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from overhead import prefect_server

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
            if lf_cli is not None:
                log = logs / f"lf-{r}.log"
                row["lf_s"], row["lf_cpu_s"] = timed(
                    [str(lf_cli), "train", str(lf_yaml)], {**env, "PATH": _path(lf_cli)}, log
                )
                row["lf_tok_s"], row["lf_tokens"] = trainer_tok_s(log), tokens_seen(log)
            if trl_cmd is not None:
                log = logs / f"trl-{r}.log"
                row["trl_s"], row["trl_cpu_s"] = timed(trl_cmd, env, log)
                row["trl_tok_s"], row["trl_tokens"] = trainer_tok_s(log), tokens_seen(log)
            for mode, extra in (("ephemeral", {}), ("server", {"PREFECT_API_URL": api_url})):
                home = {**env, **extra, "GYM_HOME": str(root / f"gym-{mode}-{r}")}
                home["PREFECT_HOME"] = str(root / f"prefect-{mode}-{r}")
                # A workspace's first run creates its MLflow and Prefect databases (once per machine):
                # timed apart, on other data, so the measured run is a new config in a workspace in use.
                first = [*gym_cmd, f"--dataset={root / 'first-use.jsonl'}", "--max-steps=1"]
                first_log = logs / f"gym-first-{mode}-{r}.log"
                row[f"gym_{mode}_first_use_s"], _ = timed(first, home, first_log)
                log = logs / f"gym-{mode}-{r}.log"
                row[f"gym_{mode}_s"], row[f"gym_{mode}_cpu_s"] = timed(gym_cmd, home, log)
                row[f"gym_{mode}_tok_s"], row[f"gym_{mode}_tokens"] = gym_summary(log, a.stage)
            rows.append(row)
            print("run", r, json.dumps(row), flush=True)
    summary = summarize(rows, a.stage, a.repeats)
    names = [n for n in ("lf", "trl", "gym_ephemeral", "gym_server") if f"{n}_s" in summary]
    print(f"{'':24s}{'process s':>12s}{'process cpu s':>15s}{'train tok/s':>14s}{'tokens':>10s}")
    for name in names:
        tok, tokens = summary.get(f"{name}_tok_s"), summary.get(f"{name}_tokens")
        print(
            f"{name:24s}{summary[f'{name}_s']:12.1f}{summary[f'{name}_cpu_s']:15.1f}"
            f"{tok if tok is None else round(tok):>14}{tokens if tokens is not None else '-':>10}"
        )
    base = "lf" if "lf_s" in summary else "trl"
    goals = {"lf": (" (goal >= 1.0)", " (goal <= 1.3)", " (goal <= 1.0)"), "trl": ("", "", "")}[base]
    print(
        f"gym/{base.upper()} train tok/s {summary.get(f'gym_vs_{base}_train_tok_s')}{goals[0]}; whole gym "
        f"train / {base.upper()}: {summary[f'gym_ephemeral_vs_{base}_process']}{goals[1]}, with a running "
        f"server {summary[f'gym_server_vs_{base}_process']}{goals[2]}"
    )
    print(json.dumps(summary))


def summarize(rows: list[dict[str, Any]], stage: str, repeats: int) -> dict[str, Any]:
    """Each measurement's best over the repeats (least seconds, most tokens/s), and gym's ratios to each
    other tool present (LF, TRL): train tokens/s, whole-process wall and CPU seconds; TRL's to LF's."""
    best = {k: _best(k, [x[k] for x in rows]) for k in rows[0]}
    summary: dict[str, Any] = {
        "stage": stage,
        "steps": STEPS,
        "batch": BATCH,
        "records": RECORDS[stage],
        "repeats": repeats,
    }
    summary.update({k: round(v, 2) if isinstance(v, float) else v for k, v in best.items()})
    for base in ("lf", "trl"):
        if f"{base}_s" not in best:
            continue
        with contextlib.suppress(TypeError, ZeroDivisionError):
            summary[f"gym_vs_{base}_train_tok_s"] = round(
                best["gym_ephemeral_tok_s"] / best[f"{base}_tok_s"], 3
            )
        for mode in ("ephemeral", "server"):
            summary[f"gym_{mode}_vs_{base}_process"] = round(best[f"gym_{mode}_s"] / best[f"{base}_s"], 3)
            # CPU seconds move less than wall seconds when other work shares the machine.
            cpu = best[f"gym_{mode}_cpu_s"] / best[f"{base}_cpu_s"]
            summary[f"gym_{mode}_vs_{base}_process_cpu"] = round(cpu, 3)
    if "lf_s" in best and "trl_s" in best:
        summary["trl_vs_lf_process"] = round(best["trl_s"] / best["lf_s"], 3)
    return summary


def _best(key: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return max(present) if key.endswith("tok_s") else min(present)  # the least disturbed run


def _path(cli: Path) -> str:
    return f"{cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"


if __name__ == "__main__":
    main()
