"""Prefect tasks: thin wrappers that call one gym function each and pass references, not objects.

Every task is cached on its inputs and its own source (`INPUTS + TASK_SOURCE`), with results
persisted in the workspace, so a re-run with nothing changed is served from cache. Run ids of
MLflow and Prefect are excluded from cache keys: they label a run, they don't change its output.
"""
