"""What gym's orchestration costs: the same SFT run through gym's flow vs a plain TRL script,
and a fully cached re-run vs the cold run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/overhead.py [--steps 1880] [--repeats 1]

Every run is a fresh process timed end to end (imports included), all in this one invocation,
so the ratios compare like with like on whatever machine runs it. gym is measured twice:
"ephemeral" (no server: Prefect starts a temporary API in each process, the zero-set-up path)
and "server" (a `prefect server` already running, as when the UI is up). "cold" is a training
config the workspace has not seen (its MLflow and Prefect databases already exist: a 1-step run
creates them first, reported as first_use).

The same run, not the same training: gym trains with its speed defaults (padding-free batches...),
the TRL script padded, so gym's training loop is the faster one and the whole-process ratio
(`*_overhead_ratio`, gym cold / TRL) understates what gym adds around it. Each side's own training
seconds are therefore read from what it reports (gym: `train_seconds` in the stage's result.json;
the TRL script: its last JSON line, trainer.train() timed the same way), and the time outside
training, wall minus training (imports, data, model loading, saving; for gym also Prefect, MLflow
and registration), is reported for both: `trl_outside_s`, `<mode>_outside_s`, their ratio
`<mode>_outside_ratio` and difference `<mode>_outside_extra_s`, the orchestration cost itself.
Goals: gym/TRL whole process <= 1.15, cached/cold <= 0.10. Prints one JSON line at the end;
its temporary folder (7 model copies) is deleted at the end, also when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LR, BATCH = 3e-3, 32


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of the process and its standard output."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def last_json(stdout: str) -> dict[str, Any]:
    """The last line of the output that is a JSON object (gym's --json summary, the TRL script's report)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"no JSON line in the output:\n{stdout[-2000:]}")


def gym_train_seconds(stdout: str) -> float:
    """The training seconds gym recorded for the run's stage (result.json beside its model_dir)."""
    result = Path(last_json(stdout)["model_dir"]).parent / "result.json"
    return float(json.loads(result.read_text())["train_seconds"])


def summarize(results: list[dict[str, float]], steps: int) -> dict[str, float]:
    """Best (smallest) of each timing over the repeats, and the ratios between them: the whole process
    (gym cold / TRL), the time outside training (gym cold / TRL: the orchestration cost) and cached / cold."""
    best = {k: min(x[k] for x in results) for k in results[0]}
    summary: dict[str, float] = {"steps": steps, **{k: round(v, 2) for k, v in best.items()}}
    for mode in ("ephemeral", "server"):
        summary[f"{mode}_overhead_ratio"] = round(best[f"{mode}_cold_s"] / best["trl_s"], 3)
        summary[f"{mode}_outside_ratio"] = round(best[f"{mode}_outside_s"] / best["trl_outside_s"], 3)
        summary[f"{mode}_outside_extra_s"] = round(best[f"{mode}_outside_s"] - best["trl_outside_s"], 2)
        summary[f"{mode}_cached_ratio"] = round(best[f"{mode}_cached_s"] / best[f"{mode}_cold_s"], 3)
    return summary


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
    if a.steps < 1 or a.repeats < 1:
        p.error("--steps and --repeats must be at least 1")
    # A SIGTERM (a job's time limit, `kill`) unwinds like Ctrl-C, so the temporary folder is deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="gym-bench-"))
    try:
        run(a.steps, a.repeats, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(steps: int, repeats: int, root: Path) -> None:
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
        str(steps),
        "--train.learning_rate",
        str(LR),
        "--train.per_device_train_batch_size",
        str(BATCH),
        "--train.save_steps",
        str(10 * steps),
        "--json",  # the summary names the model folder, whose result.json has the training seconds
    ]
    results = []
    with prefect_server(root / "server-home", env) as api_url:
        for r in range(repeats):
            trl, out = timed(
                [
                    sys.executable,
                    "benchmarks/trl_sft_baseline.py",
                    "--model",
                    model_dir,
                    "--data",
                    str(data_file),
                    "--steps",
                    str(steps),
                    "--lr",
                    str(LR),
                    "--batch-size",
                    str(BATCH),
                    "--out",
                    str(root / f"trl-{r}"),
                ],
                env,
            )
            trl_train = float(last_json(out)["train_seconds"])
            row = {"trl_s": trl, "trl_train_s": trl_train, "trl_outside_s": trl - trl_train}
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
                row[f"{mode}_first_use_s"] = timed(first_use, home)[0]
                row[f"{mode}_cold_s"], out = timed(gym_cmd, home)
                row[f"{mode}_train_s"] = gym_train_seconds(out)
                row[f"{mode}_outside_s"] = row[f"{mode}_cold_s"] - row[f"{mode}_train_s"]
                row[f"{mode}_cached_s"] = timed(gym_cmd, home)[0]
            results.append(row)
            print("run", r, "  ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)

    summary = summarize(results, steps)
    for mode in ("ephemeral", "server"):
        m = {k.removeprefix(f"{mode}_"): v for k, v in summary.items() if k.startswith(f"{mode}_")}
        print(
            f"[{mode}] gym flow / plain TRL: {m['overhead_ratio']:.3f} (goal <= 1.15); outside training: "
            f"gym {m['outside_s']:.1f} s / TRL {summary['trl_outside_s']:.1f} s = {m['outside_ratio']:.3f} "
            f"({m['outside_extra_s']:+.1f} s; training gym {m['train_s']:.1f} s, "
            f"TRL {summary['trl_train_s']:.1f} s); cached re-run / cold: {m['cached_ratio']:.3f} "
            "(goal <= 0.10)"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
