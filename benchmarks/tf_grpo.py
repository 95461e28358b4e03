"""Benchmark: one Training-Free GRPO step against an endpoint with injected latency, wall time vs the
critical path (the longest chain of dependent calls x the latency). Goal: within 1.3x, which only
holds if rollouts and the stage calls really run concurrently (serially the step would take
~calls x latency).

    OMP_NUM_THREADS=1 python benchmarks/tf_grpo.py [--latency 0.2] [--repeats 3] [--no-flow] [--home DIR]

The endpoint is a real HTTP server on loopback answering as the simulated environment's policy and
optimizer (gym.tfgrpo.sim) after sleeping `latency` seconds per call. Measured twice: the library
loop (gym.tfgrpo.engine, threads) and the Prefect flow (flows/tf_grpo.py, tasks; the step measured
from its first rollout task's start to its apply task's end, so Prefect's start-up is left out).
Prints one JSON line. The critical path is read from the step's manifest: per group, rollout (its
chunks run in parallel) -> summaries (in parallel, informative groups only) -> the extract calls
(1, or 2 with the repair retry); the slowest group, then the consolidation calls.

Everything it writes (the data, each library loop's run, the flow's workspace: MLflow runs, Prefect's
database, under PREFECT_HOME) goes to a temporary folder of its own, removed at the end: GYM_HOME,
PREFECT_HOME, MLFLOW_TRACKING_URI and PREFECT_API_URL set in the environment are ignored, so no
benchmark run lands in a user's workspace, store or server. `--home DIR` puts the flow's workspace
(Prefect's home in DIR/prefect-home) in DIR instead, left in place.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def critical_calls(manifest) -> int:
    """Longest chain of dependent calls in a step."""
    chains = []
    for g in manifest.groups:
        chain = 1  # the group's rollout chunks run side by side
        if g.informative:
            chain += 1  # its summaries run side by side
            chain += len(g.extraction.calls) if g.extraction else 0
        chains.append(chain)
    consolidation = len(manifest.consolidation.calls) if manifest.consolidation else 0
    return max(chains) + consolidation


def sim_answer(env):
    from gym.tfgrpo.sim import SimOptimizer, SimPolicy

    policy, optimizer = SimPolicy(env), SimOptimizer()

    def answer(body):
        client = policy if body["model"] == "policy" else optimizer
        return client.complete(
            body["messages"], temperature=0, max_tokens=1, seed=body["seed"], n=body["n"]
        ).texts

    return answer


def settings_for(url: str, seed: int):
    from gym.tfgrpo.config import TfGrpoSettings

    return TfGrpoSettings(
        endpoint=url,
        optimizer={"model": "optimizer"},
        policy={"concurrency": 64},
        group_size=5,
        batch_size=8,
        epochs=1,
        reward="numeric",
        seed=seed,
    )


def engine_step(url: str, env, seed: int, scratch: Path) -> tuple[float, int, int]:
    from gym.tfgrpo.engine import train
    from gym.tfgrpo.runtime import Runtime
    from gym.tfgrpo.step import load_manifest

    questions, _ = env.questions()
    root = Path(tempfile.mkdtemp(prefix="engine-", dir=scratch))
    rt = Runtime(settings_for(url, seed), model="policy", run_dir=root / "run", cache_dir=root / "calls")
    start = time.perf_counter()
    train(rt, questions)
    wall = time.perf_counter() - start
    manifest = load_manifest(rt.run_dir, 0)
    assert manifest is not None, "the step wrote no manifest"
    shutil.rmtree(root, ignore_errors=True)
    return wall, critical_calls(manifest), manifest.calls


def flow_step(url: str, data: Path, seed: int) -> tuple[float, int, int]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.runner import run_flow
    from flows.tf_grpo import tf_grpo
    from gym.pipeline import TfGrpoFlowConfig
    from gym.tfgrpo.step import load_manifest

    config = TfGrpoFlowConfig(
        **settings_for(url, seed).model_dump(), model="policy", dataset=str(data), eval_dataset=None
    )
    summary = run_flow(tf_grpo, config)
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[summary["flow_run_id"]]))
        )
    starts = [r.start_time for r in runs if r.name.startswith("rollout s0") and r.start_time]
    ends = [r.end_time for r in runs if r.name == "apply s0" and r.end_time]
    wall = (max(ends) - min(starts)).total_seconds()
    manifest = load_manifest(Path(summary["run_dir"]), 0)
    assert manifest is not None, "the step wrote no manifest"
    return wall, critical_calls(manifest), manifest.calls


ENV = {"seed": 0, "families": 8, "train_per_family": 1, "eval_per_family": 0}  # 8 questions = one step


def serve(latency: float) -> None:
    """The endpoint, in its own process (so its work never competes with the measured one's GIL)."""
    from gym.tfgrpo.sim import SimEnv
    from tests.tfgrpo_fakes import FakeEndpoint

    with FakeEndpoint(sim_answer(SimEnv(**ENV)), latency_s=latency) as url:
        print(url, flush=True)
        sys.stdin.read()  # until the benchmark closes our stdin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="Seconds the endpoint waits per call.")
    parser.add_argument("--repeats", type=int, default=3, help="Fresh runs per mode (other seeds).")
    parser.add_argument("--no-flow", action="store_true", help="Measure the library loop only.")
    parser.add_argument(
        "--home",
        type=Path,
        help="Workspace (GYM_HOME) for the flow's runs, kept afterwards; default: a temporary one, removed.",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.latency)
    scratch = Path(tempfile.mkdtemp(prefix="tfgrpo-bench-"))  # everything this run writes, removed at the end
    try:
        measure_all(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure_all(args: argparse.Namespace, scratch: Path) -> None:
    # its own workspace, tracking store and Prefect API and database, never the user's (set before gym and
    # Prefect are imported: Prefect reads its settings then)
    home = args.home.resolve() if args.home else scratch / "home"
    os.environ["GYM_HOME"] = str(home)
    os.environ["PREFECT_HOME"] = str(home / "prefect-home")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("PREFECT_API_URL", None)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from gym.tfgrpo.sim import SimEnv

    env = SimEnv(**ENV)
    data = scratch / "puzzles.jsonl"
    questions, _ = env.questions()
    data.write_text("".join(json.dumps({"question": q.text, "answer": q.answer}) + "\n" for q in questions))
    out: dict[str, object] = {"latency_s": args.latency}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--latency", str(args.latency)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().strip()  # type: ignore[union-attr]
        modes = {"engine": lambda seed: engine_step(url, env, seed, scratch)}
        if not args.no_flow:
            modes["flow"] = lambda seed: flow_step(url, data, seed)
        for mode, measure in modes.items():
            ratios, walls, paths, calls = [], [], [], []
            measure(1000)  # warm-up: imports, connection pools, Prefect's API (not counted)
            for seed in range(args.repeats):
                wall, chain, n_calls = measure(seed)
                critical = chain * args.latency
                ratios.append(wall / critical)
                walls.append(round(wall, 3))
                paths.append(round(critical, 3))
                calls.append(n_calls)
            out[mode] = {
                "wall_s": walls,
                "critical_path_s": paths,
                "calls": calls,
                "serial_s": [round(c * args.latency, 1) for c in calls],
                "ratio_median": round(statistics.median(ratios), 3),
                "ratio_best": round(min(ratios), 3),
            }
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=30)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
