"""Register gym's deployments on the Prefect server, from Python (deployments/prefect.yaml is the YAML twin).

    gym up                          # Prefect + MLflow servers for this workspace, work pool gym-process
    python deployments/deploy.py    # registers the deployments below on gym-process
    gym up --worker                 # a worker to run them (or: prefect worker start --pool gym-process)

- `sft-then-dpo/retrain-weekly`: SFT then DPO every Monday 03:00 (UTC; --cron, --timezone), registering
  the result as a new version of gym-tiny-sft-dpo with alias `challenger`.
- `train/train`: one method on demand; the Prefect UI shows its form (model, dataset, method and every
  hyperparameter with its description).
- `evaluate/evaluate`: the evaluation flow (flows/evaluate.py) on demand: benchmarks and held-out metrics of
  a model; a registered version (`models:/NAME@ALIAS`) gets its scores recorded, for promotion.

Each runs from this repository (pull step: its absolute path) against this workspace: GYM_HOME and Prefect's
result storage are set in the job's environment, so a deployment run and a local run share artifacts,
MLflow store and Prefect's task cache. Uses the Prefect server of `gym up` unless PREFECT_API_URL is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python deployments/deploy.py` from a clone without an install
    sys.path.insert(0, str(REPO))

POOL = "gym-process"
WEEKLY_CRON, WEEKLY_TZ = "0 3 * * 1", "UTC"
# The console of a deployment run is its log: no progress bars of the libraries in it.
QUIET = {"HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def job_env() -> dict[str, str]:
    """The environment of every deployment run: this workspace, and Prefect's results kept in it."""
    from gym import workspace

    return {
        "GYM_HOME": str(workspace.home()),
        "PREFECT_LOCAL_STORAGE_PATH": str(workspace.path("prefect", "results")),
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
        **QUIET,
    }


def argument_problem(cron: str, timezone: str, pool: str | None = None) -> str | None:
    """What is wrong with the schedule (or work pool) given on the command line, in a line; else None."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    if pool is not None and not pool.strip():
        return "--pool: give the work pool a name (default gym-process)"
    if not timezone.strip():
        return "--timezone: give a time zone name (default UTC), e.g. Europe/Paris"
    try:
        CronSchedule(cron=cron, timezone=timezone)
    except ValidationError as exc:
        return "; ".join(f"--{e['loc'][-1]}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
    return None


def prefect_api() -> tuple[str | None, str | None]:
    """The Prefect API to register on (PREFECT_API_URL, else `gym up`'s server), or why there is none."""
    from prefect.settings import PREFECT_API_URL

    from gym import services

    if configured := PREFECT_API_URL.value():
        problem = services.unreachable(configured)
        return (None, f"PREFECT_API_URL={configured}: {problem}") if problem else (configured, None)
    url = services.running("prefect")
    return (
        (f"{url}/api", None)
        if url
        else (None, "no Prefect server: run `gym up` first (or set PREFECT_API_URL)")
    )


def missing_pool(pool: str) -> str | None:
    """Why an image's work pool can't take the deployments (it is not on the server), else None: image pools
    are created with their job template first (deployments/work-pools/), not made here."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            return (
                f"--pool {pool}: no such work pool on this server; create it with its job template first "
                "(deployments/work-pools/README.md), or leave --image out to run from this clone"
            )
    return None


def weekly_parameters() -> dict[str, Any]:
    from gym.pipeline import SftThenDpoConfig

    config = SftThenDpoConfig.model_validate(
        {"output": {"register_as": "gym-tiny-sft-dpo", "alias": "challenger"}}
    )
    return {"config": config.model_dump(mode="json")}


def deployments(
    cron: str = WEEKLY_CRON, timezone: str = WEEKLY_TZ, paused: bool = False, image: str | None = None
) -> list[Any]:
    """The deployments: from this clone (pull step: its path; env: this workspace), or with `image`, from
    the image's copy of the repository (entrypoints relative to its working directory; the pool's job
    template gives the environment, see deployments/work-pools/)."""
    from prefect import Flow
    from prefect.flows import load_flow_from_entrypoint
    from prefect.schedules import Cron

    env = {} if image else {"env": job_env()}

    def load(entrypoint: str) -> Any:
        if image:
            return load_flow_from_entrypoint(entrypoint)  # run from REPO: entrypoints stay repo-relative
        return Flow.from_source(source=str(REPO), entrypoint=entrypoint)

    return [
        load("flows/sft_then_dpo.py:sft_then_dpo").to_deployment(
            name="retrain-weekly",
            description=f"Retrain gym-tiny with SFT then DPO on a schedule ({cron}, {timezone}).",
            schedules=[Cron(cron, timezone=timezone, active=not paused)],
            parameters=weekly_parameters(),
            job_variables=env,
            tags=["gym", "retraining"],
        ),
        load("flows/train.py:train").to_deployment(
            name="train",
            description="One training method on demand: pick the model, dataset, method and hyperparameters.",
            job_variables=env,
            tags=["gym"],
        ),
        load("flows/evaluate.py:evaluate").to_deployment(
            name="evaluate",
            description="Evaluate a model on demand: benchmarks and held-out metrics; a models:/NAME@ALIAS "
            "version gets its scores recorded, for promotion.",
            job_variables=env,
            tags=["gym", "evaluation"],
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python deployments/deploy.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--pool", default=POOL, help="Work pool (created as a process pool if missing).")
    parser.add_argument("--cron", default=WEEKLY_CRON, help="Retraining schedule (cron).")
    parser.add_argument("--timezone", default=WEEKLY_TZ, help="Time zone of the cron schedule (IANA name).")
    parser.add_argument("--paused", action="store_true", help="Register the schedule inactive.")
    parser.add_argument(
        "--image",
        help="Run from this image (Docker, Kubernetes pools: deployments/work-pools/), not this clone.",
    )
    args = parser.parse_args(argv)
    os.chdir(REPO)
    from prefect import deploy
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.services import prepare_server

    api, problem = prefect_api()
    problem = argument_problem(args.cron, args.timezone, args.pool) or problem
    if api is None or problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with temporary_settings({PREFECT_API_URL: api}):
        if not args.image:
            prepare_server(api, args.pool)  # a process pool; image pools are created with their job template
        elif problem := missing_pool(args.pool):
            print(f"error: {problem}", file=sys.stderr)
            return 2
        ids = deploy(
            *deployments(args.cron, args.timezone, args.paused, args.image),
            work_pool_name=args.pool,
            image=args.image,
            build=False,
            push=False,
            print_next_steps_message=False,
        )
    print(json.dumps({"api": api, "deployments": [str(i) for i in ids]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
