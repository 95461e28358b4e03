"""Process-wide settings of a gym command's own process (`gym ...`, `python flows/<name>.py`).

Not a command; flows/cli.py and flows/runner.py call `tune_collector` first thing. Imports nothing
heavy, so `gym registry list` stays free of Prefect and torch.
"""

from __future__ import annotations

import gc

# Full (oldest-generation) collections wait for 100x more young-generation ones than CPython's default 10.
FULL_COLLECTION_THRESHOLD = 1000


def tune_collector() -> None:
    """Hold back the garbage collector's full collections; young objects are collected as usual.

    A run imports Prefect, MLflow, torch, transformers and TRL over its first seconds, ~1M long-lived
    objects. With CPython's default thresholds that growth sets off ~10 full collections, each walking
    the whole heap and finding next to nothing (modules are not garbage): 1.3-2 s of CPU here, about a
    fifth of the imports' cost. Short-lived cycles still die in the young generations, and full
    collections still come, just less often. (Training itself runs with the older objects frozen out of
    the collector: gym.train.speed.gc_frozen.)
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)
