"""deployments/prefect.yaml points at real flows with valid schedules; deploy.py registers the same set."""

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
    assert {"sft-then-dpo", "train", "evaluate"} <= names


def test_prefect_yaml_and_deploy_py_register_the_same_deployments(monkeypatch):
    monkeypatch.chdir(REPO)
    from deployments.deploy import deployments

    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    from_yaml = {(d["name"], d["entrypoint"], tuple(d.get("tags", []))) for d in spec["deployments"]}
    from_python = {(d.name, d.entrypoint, tuple(d.tags)) for d in deployments()}
    assert from_yaml == from_python
    assert ("evaluate", "flows/evaluate.py:evaluate", ("gym", "evaluation")) in from_python
