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


def test_a_bad_schedule_pool_or_dead_api_is_one_error_line_in_both_scripts(gym_home, monkeypatch, capsys):
    """They were tracebacks (an invalid cron or time zone, an empty pool, a PREFECT_API_URL nothing answers
    at); nothing is registered."""
    import socket

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments import deploy, serve

    monkeypatch.chdir(REPO)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}/api"
    cases = [
        (["--cron", "not a cron"], '--cron: Invalid cron string: "not a cron"'),
        (["--timezone", "Mars/Olympus"], '--timezone: Invalid timezone: "Mars/Olympus"'),
        (["--timezone", ""], "--timezone: give a time zone name (default UTC)"),  # was stored
        ([], f"PREFECT_API_URL={dead}: nothing answers at 127.0.0.1:"),
    ]
    with temporary_settings({PREFECT_API_URL: dead}):
        for script in (deploy, serve):
            for argv, says in cases:
                assert script.main(argv) == 2
                err = capsys.readouterr().err
                assert err.startswith("error: ") and says in err and "Traceback" not in err
        assert deploy.main(["--pool", " "]) == 2
        assert "--pool: give the work pool a name" in capsys.readouterr().err
