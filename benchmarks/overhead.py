"""What gym's orchestration costs: the same SFT run through gym's flow vs a plain TRL script,
and a fully cached re-run vs the cold run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/overhead.py [--steps 1880] [--repeats 1]

Every run is a fresh process timed end to end (imports included), all in this one invocation,
so the ratios compare like with like on whatever machine runs it. gym is measured twice:
"ephemeral" (no server: Prefect starts a temporary API in each process, the zero-set-up path)
and "server" (a `prefect server` already running, as when the UI is up). "cold" is a training
config the workspace has not seen (its MLflow and Prefect databases already exist: a 1-step run
creates them first, reported as first_use). Goals: gym/TRL <= 1.15, cached/cold <= 0.10.
Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
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


@contextlib.contextmanager
def prefect_server(home: Path, env: dict[str, str]) -> Iterator[str]:
    """A `prefect server` on a free port with its own PREFECT_HOME; yields its API URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server_env = {**env, "PREFECT_HOME": str(home)}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "prefect"),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=server_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    sys.exit("prefect server did not become healthy")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Default: the SFT stage of the default flow on gym-tiny (10 epochs of demo_sft at batch 32).
    p.add_argument("--steps", type=int, default=1880)
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
    results = []
    with prefect_server(root / "server-home", env) as api_url:
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
            row = {"trl_s": trl}
            for mode, extra in (("ephemeral", {}), ("server", {"PREFECT_API_URL": api_url})):
                home = {
                    **env,
                    **extra,
                    "GYM_HOME": str(root / f"gym-{mode}-{r}"),
                    "PREFECT_HOME": str(root / f"prefect-{mode}-{r}"),
                }
                # Outside the ratios: a 1-step run on other data creates the MLflow and Prefect
                # databases, so "cold" is a new training config in a workspace in use.
                first_use = [*gym_cmd, "--train.max_steps", "1", "--dataset", "demo_sft_eval"]
                row[f"{mode}_first_use_s"] = timed(first_use, home)
                row[f"{mode}_cold_s"] = timed(gym_cmd, home)
                row[f"{mode}_cached_s"] = timed(gym_cmd, home)
            results.append(row)
            print("run", r, "  ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)

    best = {k: min(x[k] for x in results) for k in results[0]}
    summary: dict[str, float] = {"steps": a.steps, **{k: round(v, 2) for k, v in best.items()}}
    for mode in ("ephemeral", "server"):
        summary[f"{mode}_overhead_ratio"] = round(best[f"{mode}_cold_s"] / best["trl_s"], 3)
        summary[f"{mode}_cached_ratio"] = round(best[f"{mode}_cached_s"] / best[f"{mode}_cold_s"], 3)
        print(
            f"[{mode}] gym flow / plain TRL: {summary[f'{mode}_overhead_ratio']:.3f} (goal <= 1.15); "
            f"cached re-run / cold: {summary[f'{mode}_cached_ratio']:.3f} (goal <= 0.10)"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
