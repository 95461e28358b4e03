"""Online RL throughput: rollout and optimisation tokens/s of PPO, GRPO and GSPO through gym vs the
same TRL trainer called directly.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/online_methods.py [--steps 8] [--repeats 3] \
        [--methods grpo,ppo]

On gym-tiny (random weights: completions run to max_completion_length, so both sides sample the
same number of tokens) and demo_prompts, for each method:
- gym: the trainer gym builds (`gym.train.METHODS[method]`: gym's tokenized prompt data, its TRL
  subclass with group statistics, sample log and reward eval);
- TRL: the TRL trainer class gym uses, called as a user would (TRL's conversational prompts, or
  chat-template ids for PPO), with the same arguments and the same reward computation.
Both are timed by forward hooks on the policy: a run of consecutive no-grad forwards is a rollout
(its decode steps' rows are the rollout tokens); the rest of the training time (rewards, reference
and value passes, loss, backward, optimiser) is optimisation, whose tokens are the real tokens of the
policy's gradient forwards. Both sides run in this one process after a warm-up, taking turns going
first; the best of `--repeats` is kept. Goal: gym/TRL >= 0.95 for both. The two sides' rollouts run
the same generation code, yet at 8 steps, best of 2, their ratio ranged 0.82-1.30 across runs on a
shared machine (hence 3 repeats by default, a run of ~5 min there): each row also gives every
repeat's ratio (`*_ratios`, the two sides measured back to back) and each side's min-max over the
repeats (`*_range`), and a note is printed when the repeats' ratios spread wider than the goal's
0.05 margin, the noise a best-of ratio should be read against.
`run(args) -> list[dict]` is what benchmarks/methods.py includes. Prints a table and one JSON line.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: timings are noisy otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import argparse
import copy
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ONLINE = ("grpo", "gspo", "ppo")
# Measured runs per side: 3 (a whole run ~5 min on a shared 2-core machine; 2 took 3m40s there).
STEPS, REPEATS = 8, 3
BATCH, GROUP, COMPLETION = 64, 8, 32


class PhaseTimer:
    """Splits a training run into rollout (bursts of no-grad policy forwards) and optimisation."""

    def __init__(self, module: Any):
        self.bursts: list[list[float]] = []
        self.rollout_tokens = self.opt_tokens = 0
        self._start, self._in_burst = 0.0, False
        self._handles = [
            module.register_forward_pre_hook(self._pre, with_kwargs=True),
            module.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        self._start = time.perf_counter()

    def _post(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        import torch

        end = time.perf_counter()
        ids = kwargs.get("input_ids", args[0] if args else None)
        if not torch.is_grad_enabled():
            if self._in_burst:
                self.bursts[-1][1] = end
            else:
                self.bursts.append([self._start, end])
            self._in_burst = True
            if ids is not None and ids.shape[1] == 1:  # a decode step: one new token per row
                self.rollout_tokens += ids.shape[0]
            return
        self._in_burst = False
        mask = kwargs.get("attention_mask")
        if mask is not None:
            self.opt_tokens += int(mask.sum())
        elif ids is not None:
            self.opt_tokens += int(ids.numel())

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    @property
    def rollout_seconds(self) -> float:
        return sum(end - start for start, end in self.bursts)


def timed_train(trainer: Any, policy: Any) -> dict[str, float]:
    timer = PhaseTimer(policy)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    timer.close()
    opt = max(total - timer.rollout_seconds, 1e-9)
    return {
        "rollout_tok_s": timer.rollout_tokens / max(timer.rollout_seconds, 1e-9),
        "opt_tok_s": timer.opt_tokens / opt,
        "seconds": total,
    }


def config_for(method: str, steps: int) -> Any:
    from gym.train import TrainConfig
    from gym.train.config import with_defaults
    from gym.train.rl_config import RLSettings

    rl = RLSettings(
        rewards=["final_answer", "answer_format"], group_size=GROUP, max_completion_length=COMPLETION
    )
    base = TrainConfig(
        method=method,
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        logging_steps=10**6,
        save_steps=10**6,
        rl=rl,
    )
    return with_defaults(base, {})


def gym_trainer(method: str, steps: int, model: Any, data: Path, out: Path) -> Any:
    from datasets import load_from_disk

    from gym.models import load_model, load_tokenizer
    from gym.train import METHODS

    return METHODS[method](
        model=load_model(model),
        tokenizer=load_tokenizer(model),
        config=config_for(method, steps),
        train_data=load_from_disk(str(data)),
        eval_data=None,
        output_dir=out,
        peft_config=None,
    )


def trl_trainer(method: str, gym_built: Any, model: Any, records: Any, out: Path) -> Any:
    """The TRL class under gym's trainer, with gym's arguments, called the way TRL documents."""
    from transformers import AutoModelForCausalLM

    from gym.models import load_tokenizer

    trl_class = next(c for c in type(gym_built).__mro__ if c.__module__.startswith("trl."))
    args = copy.copy(gym_built.args)  # the same arguments (re-validating them would refuse derived fields)
    args.output_dir = str(out)
    tok = load_tokenizer(model)
    tok.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(model.path)
    if method == "ppo":
        from gym.train.ppo import value_model

        ids = [
            tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)
            for p in records["prompt"]
        ]
        queries = records.from_dict({"input_ids": [list(i["input_ids"]) for i in ids]})
        return trl_class(
            args=args,
            processing_class=tok,
            model=policy,
            ref_model=None,
            reward_model=gym_built.reward_model,  # the same reward computation on both sides
            value_model=value_model(policy, tok, 0),
            train_dataset=queries,
            eval_dataset=queries,
        )
    return trl_class(
        model=policy,
        reward_funcs=gym_built.reward_funcs,
        args=args,
        train_dataset=records,
        processing_class=tok,
    )


def policy_of(trainer: Any) -> Any:
    return trainer.policy_model if hasattr(trainer, "policy_model") else trainer.model


def best(samples: list[dict[str, float]], key: str) -> float:
    return max(s[key] for s in samples)


MARGIN = 0.05  # the goal's margin: gym/TRL >= 0.95


def measured(method: str, samples: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """The row's numbers: per key, each side's best and min-max, the best-of ratio, each repeat's ratio."""
    row: dict[str, Any] = {}
    for key in ("rollout_tok_s", "opt_tok_s"):
        g, t = best(samples["gym"], key), best(samples["trl"], key)
        ratios = [round(a[key] / b[key], 3) for a, b in zip(samples["gym"], samples["trl"], strict=True)]
        row |= {
            f"gym_{key}": round(g, 1),
            f"trl_{key}": round(t, 1),
            f"{key}_ratio": round(g / t, 3),
            f"{key}_ratios": ratios,
            f"gym_{key}_range": [round(min(s[key] for s in samples["gym"]), 1), round(g, 1)],
            f"trl_{key}_range": [round(min(s[key] for s in samples["trl"]), 1), round(t, 1)],
        }
        if max(ratios) - min(ratios) > MARGIN:
            print(
                f"note: {method} {key.removesuffix('_tok_s')}: the repeats' gym/TRL ratios span "
                f"{min(ratios)}-{max(ratios)}: run-to-run noise wider than the goal's {MARGIN} margin, so "
                f"read the best-of ratio {row[f'{key}_ratio']} against that spread (more --steps or "
                "--repeats narrow it)",
                flush=True,
            )
    return row


def run(a: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per online method: rollout and optimisation tokens/s, gym vs TRL, and their ratios."""
    from datasets import load_from_disk

    from gym.data.ingest import ingest
    from gym.data.registry import resolve_dataset
    from gym.data.tokenize import tokenize
    from gym.models import resolve

    methods = [m for m in (getattr(a, "methods", None) or ONLINE) if m in ONLINE]
    if not methods:
        return []
    steps, repeats = (
        getattr(a, "online_steps", None) or min(getattr(a, "steps", STEPS), STEPS),
        getattr(a, "repeats", REPEATS),
    )
    root = Path(tempfile.mkdtemp(prefix="gym-bench-online-"))
    home = os.environ.get("GYM_HOME")
    os.environ["GYM_HOME"] = str(root / "gym")
    try:
        model = resolve("gym-tiny")
        raw = ingest(resolve_dataset("demo_prompts"))
        data = tokenize(raw.path, model.path, model.template).path
        records = load_from_disk(str(raw.path))
        rows = []
        for method in methods:
            samples: dict[str, list[dict[str, float]]] = {"gym": [], "trl": []}
            for r in range(repeats + 1):  # the first round warms up
                n = 2 if r == 0 else steps
                built = gym_trainer(method, n, model, data, root / f"gym-{method}-{r}")
                direct = trl_trainer(method, built, model, records, root / f"trl-{method}-{r}")
                if r % 2:  # alternate which side goes first
                    gym, trl = timed_train(built, policy_of(built)), timed_train(direct, policy_of(direct))
                else:
                    trl, gym = timed_train(direct, policy_of(direct)), timed_train(built, policy_of(built))
                if r:
                    samples["gym"].append(gym)
                    samples["trl"].append(trl)
            row = {"bench": "online", "method": method, "steps": steps, **measured(method, samples)}
            rows.append(row)
            print(row, flush=True)
        return rows
    finally:
        if home is None:
            os.environ.pop("GYM_HOME", None)
        else:
            os.environ["GYM_HOME"] = home
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=STEPS, help="Training steps (PPO: updates) per measured run.")
    p.add_argument("--repeats", type=int, default=REPEATS, help="Measured runs per side; the best is kept.")
    p.add_argument(
        "--methods", type=lambda s: s.split(","), help=f"Comma-separated subset of {','.join(ONLINE)}."
    )
    a = p.parse_args()
    a.online_steps = a.steps
    rows = run(a)
    keys = list(rows[0]) if rows else []
    print("  ".join(f"{k:>18s}" for k in keys))
    for row in rows:
        print("  ".join(f"{row[k]!s:>18s}" for k in keys))
    print(json.dumps({"omp_num_threads": os.environ["OMP_NUM_THREADS"], "rows": rows}))


if __name__ == "__main__":
    main()
