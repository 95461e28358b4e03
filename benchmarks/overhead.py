"""What gym's orchestration costs: the same SFT run through gym's flow vs a plain TRL script,
and a fully cached re-run vs the cold run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/overhead.py [--steps 300] [--repeats 1]

Every run is a fresh process timed end to end (imports included), all in this one invocation,
so the ratios compare like with like on whatever machine runs it. Goals: gym/TRL <= 1.15,
cached/cold <= 0.10. Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LR, BATCH = 3e-3, 32


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=1)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gym-bench-"))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "HF_HUB_OFFLINE": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    }

    # Untimed preparation: the model directory and the demo data as a plain file for the TRL script.
    prep = {**env, "GYM_HOME": str(root / "prep")}
    data_file = root / "sft.jsonl"
    code = (
        "import json;from gym.models import resolve;from gym.data.demo import demo_records;"
        f"rows = demo_records('demo_sft');open({str(data_file)!r}, 'w').write("
        "''.join(json.dumps(r) + '\\n' for r in rows));print(resolve('gym-tiny').path)"
    )
    model_dir = (
        subprocess.run(
            [sys.executable, "-c", code], env=prep, capture_output=True, text=True, check=True, cwd=REPO
        )
        .stdout.strip()
        .splitlines()[-1]
    )

    results = []
    for r in range(a.repeats):
        trl = timed(
            [
                sys.executable,
                "benchmarks/trl_sft_baseline.py",
                "--model",
                model_dir,
                "--data",
                str(data_file),
                "--steps",
                str(a.steps),
                "--lr",
                str(LR),
                "--batch-size",
                str(BATCH),
                "--out",
                str(root / f"trl-{r}"),
            ],
            env,
        )
        home = {**env, "GYM_HOME": str(root / f"gym-{r}"), "PREFECT_HOME": str(root / f"prefect-{r}")}
        gym_cmd = [
            sys.executable,
            "flows/train.py",
            "--dataset",
            "demo_sft",
            "--eval_dataset",
            "None",
            "--train.max_steps",
            str(a.steps),
            "--train.learning_rate",
            str(LR),
            "--train.per_device_train_batch_size",
            str(BATCH),
            "--train.save_steps",
            str(10 * a.steps),
        ]
        cold = timed(gym_cmd, home)
        cached = timed(gym_cmd, home)
        results.append({"trl_s": trl, "gym_cold_s": cold, "gym_cached_s": cached})
        print(f"run {r}: TRL {trl:.1f}s  gym cold {cold:.1f}s  gym cached {cached:.1f}s", flush=True)

    best = {k: min(x[k] for x in results) for k in results[0]}
    summary = {
        "steps": a.steps,
        **{k: round(v, 2) for k, v in best.items()},
        "overhead_ratio": round(best["gym_cold_s"] / best["trl_s"], 3),
        "cached_ratio": round(best["gym_cached_s"] / best["gym_cold_s"], 3),
    }
    print(f"gym flow / plain TRL: {summary['overhead_ratio']:.3f} (goal <= 1.15)")
    print(f"cached re-run / cold: {summary['cached_ratio']:.3f} (goal <= 0.10)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
