"""Training throughput per method: gym vs the same TRL trainer called directly, and packed vs padded SFT.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/methods.py [--steps 40] [--repeats 2] [--methods sft,dpo]

For every method in `gym.train.METHODS` that trains offline on a dataset, on gym-tiny and the
method's demo data (pt: demo_text, in blocks of 512 tokens, gym-tiny's context):
- gym: `gym.train.run` (the path every flow takes), its trainer's time and real tokens;
- TRL: the TRL trainer class gym uses for that method, called as a user would (model from
  `from_pretrained`, TRL tokenizing), with the same hyperparameters and gym's speed options reset
  to TRL's defaults. Both sides train on the same tokens (each row prints both counts): SFT and
  RM get TRL's conversational format; DPO-family, ORPO, SimPO and KTO get, in TRL's standard
  format, the prompt and answer texts gym rendered with the same chat template, since from
  conversations TRL would keep the newline ChatML writes after each answer's `<|im_end|>` (one
  token more per answer, two for ORPO and SimPO, which add eos after it: 4-8% more tokens); pt
  gets the raw texts, which TRL joins and cuts into rows of 512 tokens itself ("wrapped" packing).
Ratios are tokens/s over each timed `train()`, fixed per-run costs included, so few steps inflate
them (sft 3.6x at 5 steps, 2.6x at 10, 2.1x at 20, 1.9x at 40 in one run here): below 20 steps a
warning says so. A name in --methods that is not in `gym.train.METHODS` is an error (exit 2).
Then SFT batching on the demo data: padded, padding-free and packed, as useful (non-padding)
tokens per second (without flash-attn, the last two run through gym's per-sequence SDPA,
gym/train/varlen.py), on demo_sft (20-32 tokens) and on all of gym's demo SFT data mixed
(demo_sft, demo_format_sft and the multi-turn demo_chat: 20-99 tokens); and the same on 2,000 MMLU
questions as SFT conversations when the MMLU data is there (GYM_MMLU, else
../shared/data/eval/mmlu; read, never copied into the repo), whose lengths spread as real SFT
data's do. Both sides run in this one
process, alternating, after a warm-up; the best of `--repeats` is kept. If
benchmarks/online_methods.py exists, its `run(args) -> list[dict]` rows are added. Prints a table
and one JSON line. Goals: gym/TRL >= 1.0 per method; packed/padded >= 1.3.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: timings are noisy otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import dataclasses
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The demo dataset of each data kind (gym.data.formats.METHOD_KIND maps a method to its kind).
DEMO = {"sft": "demo_sft", "preference": "demo_dpo", "kto": "demo_kto", "text": "demo_text"}
# Every demo SFT dataset, mixed: the demo data's whole length spread (demo_sft alone is 20-32 tokens).
DEMO_SFT_ALL = "demo_sft,demo_format_sft,demo_chat"
# Batch sizes per kind: gym-tiny's registry defaults (SFT 32, DPO 16); pt 4 blocks (its default, 8, made
# pt alone take ~6 min at 40 steps, best of 3; 40 steps of 4 are one pass over demo_text's 160 blocks).
BATCH = {"sft": 32, "preference": 16, "kto": 16, "text": 4}
# pt's block length: gym-tiny's context (the registry's context_length), not the default cutoff_len of
# 1,024, which would train positions the model never saw.
PT_BLOCK = 512
# Why a method of gym.train.METHODS has no row of its own here.
NOT_HERE = {
    "prompt": "online RL: measured by benchmarks/online_methods.py (its rows follow)",
    None: "trains no weights (the library loop against an endpoint): measured by benchmarks/tf_grpo.py",
}
# Below this many steps, fixed per-run costs distort the ratios (see --steps).
MIN_STEPS = 20
# gym's own speed choices, reset to TRL's defaults for the baseline.
SPEED_FIELDS = {"use_liger_kernel": False, "torch_compile": False, "padding_free": False, "packing": False}


def tokenized(name: str, model: Any, cutoff_len: int | None = None) -> Path:
    """`name` (a dataset, or a comma-separated mix of them) tokenized for `model` (gym's default
    cutoff_len unless given)."""
    from gym.data.mix import ingest_named
    from gym.data.tokenize import TokenizeSettings, tokenize

    settings = TokenizeSettings(**({} if cutoff_len is None else {"cutoff_len": cutoff_len}))
    return Path(tokenize(ingest_named(name).path, model.path, model.template, settings).path)


def trl_records(name: str, kind: str, trainer: str, data: Path) -> Any:
    """The demo data as TRL takes it, for TRL to tokenize itself.

    SFT and RM: TRL's conversational format (TRL applies the chat template: the same tokens as gym's).
    The other preference trainers and KTO: the texts gym rendered with the same template (`data`'s
    `prompt` with the generation prompt, each answer ending with its end-of-turn token), in TRL's
    standard format. From conversations TRL would render each answer as a whole turn, keeping the
    newline ChatML writes after `<|im_end|>` (`984<|im_end|>\\n`, gym: `984<|im_end|>`): one token more
    per answer (DPO, KTO; ORPO and SimPO also append eos after it: two), ~4-8% more tokens per step.
    pt: the raw texts ({"text": ...}); TRL packs them itself (run_trl)."""
    from datasets import load_from_disk

    from gym.data.ingest import ingest
    from gym.data.registry import resolve_dataset

    if kind in ("preference", "kto") and trainer != "RewardTrainer":
        ds = load_from_disk(str(data))
        return ds.select_columns([c for c in ds.column_names if not c.endswith("_ids")])

    ds = load_from_disk(ingest(resolve_dataset(name)).path)

    def turn(text: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": text}]

    if kind == "preference":  # RM: gym's pairs end with the template's tail after the turn too (gym.train.rm)
        return ds.map(lambda r: {"chosen": turn(r["chosen"]), "rejected": turn(r["rejected"])})
    return ds  # sft: {"messages": [...]}; text: {"text": ...}


def trl_options(kind: str, data: Path) -> dict[str, Any]:
    """TRL arguments that make its side train on what gym's does: SFT masks the prompt as gym does;
    pt packs the texts joined by eos into rows of cutoff_len tokens, as gym's blocks are (TRL's
    "wrapped" packing, the one for raw text; it cuts each map batch of 1,000 texts on its own, so
    its rows may include two short tail blocks that gym drops)."""
    from gym.data.ingest import load_meta

    if kind == "sft":
        return {"assistant_only_loss": True}
    if kind == "text":
        cutoff = load_meta(data)["settings"]["cutoff_len"]
        return {"packing": True, "packing_strategy": "wrapped", "max_length": cutoff}
    return {}


def gym_trainer_spec(config: Any, model: Any, data: Path, out: Path) -> tuple[type, Any]:
    """The TRL trainer class and arguments gym uses for `config` (built as gym.train does, not run)."""
    from datasets import load_from_disk

    from gym.data.ingest import load_meta
    from gym.models import load_model, load_tokenizer
    from gym.train import METHODS, _hook, adapters, speed

    loader = _hook(config.method, "load_model") or load_model  # rm: a one-output classifier
    loaded = loader(model, **speed.load_options(speed.resolve(config)))
    trainer = METHODS[config.method](
        model=loaded,
        tokenizer=load_tokenizer(model),
        config=config,
        train_data=load_from_disk(str(data)),
        eval_data=None,
        output_dir=out,
        peft_config=adapters.trainer_peft_config(loaded, config, model, wrapped=False),
        max_length=load_meta(data)["settings"]["cutoff_len"],
    )
    trl_class = next(c for c in type(trainer).__mro__ if c.__module__.startswith("trl."))
    return trl_class, trainer.args


def run_gym(config: Any, model: Any, data: Path) -> tuple[float, int]:
    from gym import train

    result = train.run(config, model, data)
    shutil.rmtree(result.stage_dir)  # the next repeat trains again instead of reading the finished stage
    return result.train_seconds, result.tokens_seen


def run_trl(
    trl_class: type, args: Any, model: Any, records: Any, extra: dict[str, Any], out: Path
) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from gym.models import load_tokenizer

    fields = {f.name for f in dataclasses.fields(args)}
    reset = {k: v for k, v in SPEED_FIELDS.items() if k in fields}
    trl_args = dataclasses.replace(args, output_dir=str(out), **{**reset, **extra})
    if trl_class.__name__ == "RewardTrainer":  # a reward model: one score per sequence
        loaded = AutoModelForSequenceClassification.from_pretrained(model.path, num_labels=1)
    else:
        loaded = AutoModelForCausalLM.from_pretrained(model.path)
    trainer = counting(trl_class)(
        model=loaded,
        args=trl_args,
        train_dataset=records,
        processing_class=load_tokenizer(model),  # gym-tiny's tokenizer with its chat template
    )
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start, int(trainer.state.num_input_tokens_seen)


def counting(trl_class: type) -> type:
    """The TRL class as it is; for the trainers that tokenize pairs row by row (ORPO, CPO/SimPO), whose
    batches have no `input_ids` for the Trainer to count, counting tokens as gym's subclass does."""
    from gym.train.pairs import count_pair_tokens

    if not hasattr(trl_class, "tokenize_row"):
        return trl_class
    return type(trl_class.__name__, (trl_class,), {"_track_num_input_tokens": count_pair_tokens})


def best(samples: list[tuple[float, int]]) -> dict[str, float]:
    seconds, tokens = min(samples)
    return {"seconds": round(seconds, 3), "tokens": tokens, "tok_s": round(tokens / seconds, 1)}


def bench_methods(a: argparse.Namespace, model: Any, root: Path) -> list[dict[str, Any]]:
    from gym.data.formats import METHOD_KIND
    from gym.train import METHODS, TrainConfig
    from gym.train.config import with_defaults

    rows = []
    for method in a.methods or list(METHODS):
        kind = METHOD_KIND.get(method)
        if kind not in DEMO:
            print(f"skip {method}: {NOT_HERE.get(kind, 'no offline demo data for it here')}", flush=True)
            continue
        data = tokenized(DEMO[kind], model, PT_BLOCK if kind == "text" else None)
        base = TrainConfig(
            method=method, per_device_train_batch_size=BATCH[kind], save_steps=10**6, logging_steps=10**6
        )
        config = with_defaults(base.model_copy(update={"max_steps": a.steps}), model.train_defaults)
        trl_class, args = gym_trainer_spec(config, model, data, root / "spec")
        records = trl_records(DEMO[kind], kind, trl_class.__name__, data)
        extra = trl_options(kind, data)
        warm = config.model_copy(update={"max_steps": 2, "seed": 1})
        run_gym(warm, model, data)
        run_trl(trl_class, dataclasses.replace(args, max_steps=2), model, records, extra, root / "warm")
        gym_s, trl_s = [], []
        for _ in range(a.repeats):
            gym_s.append(run_gym(config, model, data))
            trl_s.append(run_trl(trl_class, args, model, records, extra, root / f"trl-{method}"))
        g, t = best(gym_s), best(trl_s)
        rows.append(
            {
                "bench": "method",
                "method": method,
                "trainer": trl_class.__name__,
                "steps": a.steps,
                "gym_tok_s": g["tok_s"],
                "trl_tok_s": t["tok_s"],
                "gym_s": g["seconds"],
                "trl_s": t["seconds"],
                "gym_tokens": g["tokens"],
                "trl_tokens": t["tokens"],
                "ratio": round(g["tok_s"] / t["tok_s"], 3) if t["tok_s"] else None,
            }
        )
        print(rows[-1], flush=True)
    return rows


def bench_batching(a: argparse.Namespace, model: Any, name: str, data: Path) -> list[dict[str, Any]]:
    """Useful tokens/s of SFT on `data`: padded vs padding-free vs packed rows, same steps."""
    from gym.train import TrainConfig
    from gym.train.speed import SpeedSettings

    modes = {
        "padded": SpeedSettings(padding_free="off"),
        "padding_free": SpeedSettings(padding_free="on"),
        "packed": SpeedSettings(packing=True),
    }
    # Packed rows are cutoff_len (1024) tokens long: 1 row per step holds about what `per_row` padded
    # sequences of the data hold (32 of the demo's), so each mode trains on about as many real tokens
    # per step.
    per_row = padded_batch(data)
    batch = {"padded": per_row, "padding_free": per_row, "packed": 1}
    samples: dict[str, list[tuple[float, int]]] = {m: [] for m in modes}
    for r in range(a.repeats + 1):  # the first round warms up
        for mode, settings in modes.items():
            config = TrainConfig(
                method="sft",
                learning_rate=3e-3,
                max_steps=2 if r == 0 else a.batching_steps,
                per_device_train_batch_size=batch[mode],
                save_steps=10**6,
                logging_steps=10**6,
                speed=settings,
            )
            sample = run_gym(config, model, data)
            if r:
                samples[mode].append(sample)
    padded = best(samples["padded"])
    ceiling = padded_ceiling(data, batch["padded"])
    print(
        f"{name}: padded batches of {batch['padded']} are {ceiling['useful_fraction']:.1%} real tokens: "
        f"removing all padding gains at most {ceiling['max_gain']}x in the per-token work (projections, "
        "MLP); attention, quadratic in the padded length, can gain more on long, spread-out data",
        flush=True,
    )
    rows = [{"bench": "batching", "data": name, "mode": "ceiling", "batch": batch["padded"], **ceiling}]
    for mode in modes:
        b = best(samples[mode])
        rows.append(
            {
                "bench": "batching",
                "data": name,
                "mode": mode,
                "batch": batch[mode],
                "useful_tok_s": b["tok_s"],
                "ratio_vs_padded": round(b["tok_s"] / padded["tok_s"], 3),
            }
        )
        print(rows[-1], flush=True)
    return rows


def padded_batch(data: Path) -> int:
    """Sequences of `data` whose real tokens fill about one packed row (32 for the demo data, kept as
    measured before; cutoff_len over the mean length otherwise)."""
    from datasets import load_from_disk

    from gym.data.ingest import load_meta

    lengths = [len(ids) for ids in load_from_disk(str(data))["input_ids"]]
    mean = sum(lengths) / len(lengths)
    return 32 if mean < 40 else max(1, round(load_meta(data)["settings"]["cutoff_len"] / mean))


def mmlu_sft(root: Path) -> Path | None:
    """2,000 MMLU test questions as SFT conversations (question and choices; the answer letter and text),
    a real length spread (gym-tiny tokens: median ~170, p90 ~510, up to the 1,024 cutoff) unlike the
    demo's 20-32; None when the MMLU data (GYM_MMLU, else ../shared/data/eval/mmlu) is absent."""
    import random

    from gym.eval.benchmarks import LETTERS
    from gym.eval.mc_data import load_benchmark

    source = Path(os.environ.get("GYM_MMLU", REPO.parent / "shared" / "data" / "eval" / "mmlu"))
    if not source.exists():
        print(f"skip batching on MMLU-length data: {source} not found (set GYM_MMLU)", flush=True)
        return None
    questions = [q for s in load_benchmark("mmlu", source, shots=0).subjects for q in s.questions]
    out = root / "mmlu_sft.jsonl"
    with out.open("w", encoding="utf-8") as f:
        for q in random.Random(0).sample(questions, min(2000, len(questions))):
            user = "\n".join([q.question, *(f"{k}. {c}" for k, c in zip(LETTERS, q.choices, strict=True))])
            answer = f"{LETTERS[q.answer]}. {q.choices[q.answer]}"
            turns = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": turns}) + "\n")
    return out


def padded_ceiling(data: Path, batch: int, draws: int = 2000) -> dict[str, float]:
    """Share of real tokens in random padded batches of the data (pad to the batch's longest), and the
    most that dropping every pad token could gain in the work that is linear in tokens: the ceiling for
    padding-free or packed batches of short sequences, where attention's quadratic share is small."""
    import random

    from datasets import load_from_disk

    lengths = [len(ids) for ids in load_from_disk(str(data))["input_ids"]]
    rng = random.Random(0)
    real = total = 0
    for _ in range(draws):
        sample = rng.sample(lengths, batch)
        real += sum(sample)
        total += batch * max(sample)
    return {"useful_fraction": round(real / total, 3), "max_gain": round(total / real, 3)}


def online_rows(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows from benchmarks/online_methods.py (online RL methods measure themselves), if present."""
    path = Path(__file__).with_name("online_methods.py")
    if not path.is_file():
        return []
    spec = importlib.util.spec_from_file_location("online_methods", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.run(a))


def table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for bench in dict.fromkeys(r.get("bench", "other") for r in rows):
        group = [r for r in rows if r.get("bench", "other") == bench]
        keys = list(dict.fromkeys(k for r in group for k in r if k != "bench"))
        lines.append(f"[{bench}]")
        lines.append("  ".join(f"{k:>14s}" for k in keys))
        lines.extend("  ".join(f"{r.get(k, '')!s:>14s}" for k in keys) for r in group)
    return "\n".join(lines)


def measure(a: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """Every row, measured in a workspace under `root`."""
    os.environ["GYM_HOME"] = str(root / "gym")

    from gym.models import resolve

    model = resolve("gym-tiny")
    rows = bench_methods(a, model, root)
    if not a.skip_batching:
        rows += bench_batching(a, model, "demo_sft", tokenized("demo_sft", model))
        # All of gym's demo SFT data at once: single-turn 20-32 and 36-51 tokens, multi-turn 40-99.
        rows += bench_batching(a, model, DEMO_SFT_ALL, tokenized(DEMO_SFT_ALL, model))
        mmlu = mmlu_sft(root) if a.mmlu_batching else None
        if mmlu is not None:
            rows += bench_batching(a, model, "mmlu_sft", tokenized(str(mmlu), model))
    return rows + online_rows(a)


def check_methods(names: list[str] | None) -> None:
    """Exit 2 with one error line when --methods names something not in gym.train.METHODS."""
    from gym.train import METHODS

    unknown = [m for m in names or [] if m not in METHODS]
    if unknown:
        print(
            f"error: --methods: unknown method(s) {', '.join(unknown)}; "
            f"expected names from {', '.join(METHODS)}",
            file=sys.stderr,
        )
        sys.exit(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--steps",
        type=int,
        default=40,
        help=f"Optimiser steps per measured run; below {MIN_STEPS} the ratios come out inflated (a warning "
        "says why).",
    )
    p.add_argument("--repeats", type=int, default=2, help="Measured runs per side; the best is kept.")
    p.add_argument(
        "--batching-steps",
        type=int,
        default=100,
        help="Steps per batching run (padded, padding-free, packed): a run of a few seconds; 40 spread "
        "the packed/padded ratio over 1.25-1.46 on the mixed demo data, 100 over 1.29-1.40.",
    )
    p.add_argument("--methods", type=lambda s: s.split(","), help="Comma-separated subset of METHODS.")
    p.add_argument("--skip-batching", action="store_true", help="Only the per-method comparison.")
    p.add_argument(
        "--no-mmlu-batching",
        dest="mmlu_batching",
        action="store_false",
        help="Skip the batching comparison on MMLU questions as SFT data (a real length spread).",
    )
    a = p.parse_args()
    check_methods(a.methods)
    if a.steps < MIN_STEPS:
        print(
            f"warning: --steps {a.steps} is below {MIN_STEPS}: fixed per-run costs inside each timed train() "
            "(the first steps' warm-up, the trainer's set-up and clean-up: ~0.2-0.5 s more on TRL's side) "
            "weigh more the fewer steps there are, so the gym/TRL ratios come out inflated (sft 3.6x at 5 "
            "steps, 2.6x at 10, 2.1x at 20, 1.9x at 40); use these rows to check that methods run, not speed",
            file=sys.stderr,
            flush=True,
        )
    root = Path(tempfile.mkdtemp(prefix="gym-bench-methods-"))
    try:
        rows = measure(a, root)
    finally:  # an error or Ctrl-C leaves no workspace behind either
        shutil.rmtree(root, ignore_errors=True)
    print(table(rows))
    methods = [r for r in rows if r.get("bench") == "method"]
    batching: dict[str, dict[str, Any]] = {}  # per dataset: the two ratios and the ceiling
    for r in rows:
        if r.get("bench") == "batching":
            key = {"ceiling": "padding_free_ceiling"}.get(r["mode"], f"{r['mode']}_vs_padded")
            if key != "padded_vs_padded":
                batching.setdefault(r["data"], {})[key] = r.get("max_gain", r.get("ratio_vs_padded"))
    demo = batching.get("demo_sft", {})
    summary = {
        "steps": a.steps,
        "batching_steps": a.batching_steps,
        "repeats": a.repeats,
        "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        "gym_vs_trl": {r["method"]: r["ratio"] for r in methods},
        "padding_free_vs_padded": demo.get("padding_free_vs_padded"),
        "packed_vs_padded": demo.get("packed_vs_padded"),
        "padding_free_ceiling": demo.get("padding_free_ceiling"),
        "batching": batching,
        "rows": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
