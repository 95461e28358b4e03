"""The simplest way to run gym on a schedule: serve the flows from this process (no work pool, no worker).

    gym up                              # Prefect + MLflow servers for this workspace (or set PREFECT_API_URL)
    python deployments/serve.py         # serves serve-retrain-weekly (cron), serve-train, serve-evaluate

until Ctrl-C (named apart from deploy.py's `retrain-weekly`, `train`, `evaluate`, so the two can coexist).
Flow runs start as subprocesses of this one, in this workspace (GYM_HOME, Prefect's results in it).
Stopping the process (Ctrl-C) pauses the schedules through the API: stop it before `gym down`.
`python deployments/deploy.py` with a worker is the way to keep schedules without a serving process.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    from deployments.deploy import (
        WEEKLY_CRON,
        WEEKLY_TZ,
        argument_problem,
        job_env,
        prefect_api,
        weekly_parameters,
    )

    parser = argparse.ArgumentParser(prog="python deployments/serve.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cron", default=WEEKLY_CRON, help="Retraining schedule (cron).")
    parser.add_argument("--timezone", default=WEEKLY_TZ, help="Time zone of the cron schedule (IANA name).")
    args = parser.parse_args(argv)

    from prefect import serve
    from prefect.schedules import Cron
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.evaluate import evaluate
    from flows.sft_then_dpo import sft_then_dpo
    from flows.train import train

    api, problem = prefect_api()
    problem = argument_problem(args.cron, args.timezone) or problem
    if api is None or problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    os.environ.update(job_env())  # flow runs are subprocesses: they inherit this environment
    os.environ["PREFECT_API_URL"] = api
    with temporary_settings({PREFECT_API_URL: api}):
        serve(
            sft_then_dpo.to_deployment(
                name="serve-retrain-weekly",
                schedules=[Cron(args.cron, timezone=args.timezone)],
                parameters=weekly_parameters(),
                tags=["gym", "retraining"],
            ),
            train.to_deployment(name="serve-train", tags=["gym"]),
            evaluate.to_deployment(name="serve-evaluate", tags=["gym", "evaluation"]),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
