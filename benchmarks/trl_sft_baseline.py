"""Baseline for benchmarks/overhead.py: the same SFT run as a plain TRL script.

No gym, no Prefect, no MLflow:

    python benchmarks/trl_sft_baseline.py --model DIR --data FILE.jsonl --steps 300 --out DIR

Reads alpaca-format JSON Lines, lets TRL apply the model's chat template and mask the prompt
(assistant_only_loss), trains with SFTTrainer and saves the model: what a user would write by hand.
Its last line is JSON for the benchmarks: {"train_seconds": trainer.train()'s wall seconds (timed as
gym times its own `train_seconds`), "tokens": the real tokens TRL counted (its `num_tokens`)}.
"""

from __future__ import annotations

import argparse
import json
import time

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer


def to_messages(rec: dict) -> dict:
    prompt = rec["instruction"] + ("\n" + rec["input"] if rec.get("input") else "")
    return {
        "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": rec["output"]}]
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    ds = load_dataset("json", data_files=a.data, split="train")
    ds = ds.map(to_messages, remove_columns=ds.column_names)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    args = SFTConfig(
        output_dir=a.out,
        max_steps=a.steps,
        learning_rate=a.lr,
        per_device_train_batch_size=a.batch_size,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        assistant_only_loss=True,
        disable_tqdm=True,
        use_cpu=True,
        seed=42,
        bf16=False,  # TRL 1.12 turns bf16 and gradient checkpointing on by default;
        gradient_checkpointing=False,  # gym trains gym-tiny in fp32 without them, so must the baseline
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(a.out)
    tokens = [e["num_tokens"] for e in trainer.state.log_history if "num_tokens" in e]
    print(json.dumps({"train_seconds": round(seconds, 3), "tokens": int(tokens[-1]) if tokens else None}))


if __name__ == "__main__":
    main()
