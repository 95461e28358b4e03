"""What eval_speed.py and serve_lm_eval.py share (not a script): their MMLU options, the questions
split into chunks of subjects, and lm-eval's run of its own `mmlu_<subject>` task YAMLs pointed at
those questions (gym/eval/lm_eval_tasks.py)."""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "eval" / "mmlu"


def add_options(parser: argparse.ArgumentParser, limit: int | None, chunks: int) -> None:
    parser.add_argument("--data", default=os.environ.get("GYM_MMLU", str(DEFAULT_DATA)))
    parser.add_argument("--model", default="gym-tiny")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--shots", type=int, default=5)
    parser.add_argument(
        "--limit", type=int, default=limit, help=f"Questions per subject (default: {limit or 'all'})."
    )
    parser.add_argument("--subjects", nargs="+", default=None)
    parser.add_argument(
        "--chunks", type=int, default=chunks, help="Alternate the tools over this many chunks."
    )


@dataclass
class Setup:
    args: argparse.Namespace
    keys: list[str]  # the subjects
    chunks: list[list[str]]
    configs: dict[str, dict[str, Any]]  # lm-eval task name -> its task config

    def summary(self, **results: Any) -> str:
        """The closing JSON line: the results, then the settings they were measured with."""
        a = self.args
        settings = {
            "subjects": len(self.keys),
            "limit": a.limit,
            "shots": a.shots,
            "batch_size": a.batch_size,
        }
        return json.dumps({**results, **settings, "model": a.model})

    def lm_eval(self, lm: Any, subjects: list[str], limit: int | None) -> dict[str, Any]:
        """lm-eval's own evaluation of `subjects` with model `lm`, samples logged."""
        import lm_eval
        from lm_eval.tasks import TaskManager

        return lm_eval.simple_evaluate(
            model=lm,
            tasks=[self.configs[f"mmlu_{s}"] for s in subjects],
            num_fewshot=self.args.shots,
            limit=limit,
            task_manager=TaskManager(include_defaults=False),
            log_samples=True,
            bootstrap_iters=0,
        )


def prepare(args: argparse.Namespace) -> Setup:
    """The questions, or exit saying where to point --data. lm-eval reads the questions from files in
    a temporary folder for as long as the script runs (every `Setup.lm_eval` call): removed when the
    process exits."""
    if not Path(args.data).exists():
        sys.exit(f"MMLU not found at {args.data}: pass --data (a folder or zip in the original layout)")
    sys.path.insert(0, str(REPO))
    from gym.eval.lm_eval_tasks import local_task_configs
    from gym.eval.mc_data import load_benchmark

    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # not its per-request truncation warnings
    data = load_benchmark("mmlu", args.data, subjects=args.subjects, shots=args.shots)
    keys = [s.info.key for s in data.subjects]
    chunks = [keys[i :: args.chunks] for i in range(min(args.chunks, len(keys)))]
    work = Path(tempfile.mkdtemp(prefix="mmlu-lm-eval-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return Setup(args, keys, chunks, {c["task"]: c for c in local_task_configs(data, work)})
