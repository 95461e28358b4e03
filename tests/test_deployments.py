"""deployments/prefect.yaml points at real flows with valid schedules."""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect.flows import load_flow_from_entrypoint

REPO = Path(__file__).resolve().parents[1]


def test_every_deployment_entrypoint_loads_a_flow(monkeypatch):
    monkeypatch.chdir(REPO)
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    assert spec["deployments"], "at least one deployment"
    names = set()
    for dep in spec["deployments"]:
        flow = load_flow_from_entrypoint(dep["entrypoint"])
        names.add(flow.name)
        for schedule in dep.get("schedules", []):
            from prefect.client.schemas.schedules import CronSchedule

            CronSchedule(cron=schedule["cron"], timezone=schedule.get("timezone", "UTC"))
    assert {"sft-then-dpo", "train"} <= names
