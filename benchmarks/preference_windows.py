"""DPO's loss step at realistic shapes: gym's completion windows vs TRL's DPOTrainer path.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/preference_windows.py [--repeats 5] [--device cuda]

`benchmarks/methods.py` measures whole training runs on the demo pairs (prompts ~21 tokens, answers
~3), where the windows cut the LM head's positions ~6x. This measures one loss + backward of a DPO
batch, TRL's `_compute_loss` against gym's trainer (gym.train.completion_logits), on one trainer, for
prompt / answer lengths closer to real preference data, on a config-built Llama (no downloads) with a
32k vocabulary: what the windows save is the prompt's and the padding's share of the LM head,
log-softmax and metrics, and running each pair as one row (gym.train.shared_prompt) the second pass
over each prompt. Answer lengths vary per row (half to all of the given length), as real batches
do. Both paths are checked to give the same loss. Prints a table and one JSON line.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported: timings are noisy otherwise
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (pairs per batch, prompt tokens, longest answer tokens)
SHAPES = [(16, 21, 3), (8, 128, 128), (8, 256, 64), (4, 512, 256)]


def build(device: str, out: Path) -> tuple[Any, Any]:
    """gym's DPO trainer class (completion windows) around a config-built 32k-vocabulary Llama."""
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import DPOConfig, DPOTrainer

    from gym.models import load_tokenizer, resolve
    from gym.train import completion_logits

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    # The trainer needs a dataset to start; the timed batches are made by `batch`.
    pairs = Dataset.from_dict({"prompt_ids": [[5]] * 4, "chosen_ids": [[7]] * 4, "rejected_ids": [[9]] * 4})

    class Gym(completion_logits.trainer(DPOTrainer)):  # type: ignore[misc]
        def _prepare_dataset(self, dataset: Any, *args: Any) -> Any:
            return dataset

    args = DPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        precompute_ref_log_probs=False,
        report_to="none",
        use_cpu=device == "cpu",
        disable_tqdm=True,
    )
    trainer = Gym(
        model=model,
        ref_model=copy.deepcopy(model).eval(),  # a live reference: the starting weights
        args=args,
        train_dataset=pairs,
        processing_class=load_tokenizer(resolve("gym-tiny")),
    )
    trainer.model.train()
    return trainer, DPOTrainer._compute_loss


def batch(pairs: int, prompt: int, answer: int, device: str) -> dict[str, Any]:
    """Right-padded chosen rows, then rejected rows with the same prompts, as TRL's collator makes
    them; answers of varied length."""
    import torch

    g = torch.Generator().manual_seed(pairs * 1000 + prompt + answer)
    rows = 2 * pairs
    lengths = torch.randint(max(1, answer // 2), answer + 1, (rows,), generator=g)
    length = prompt + int(lengths.max())
    ids = torch.randint(3, 32000, (rows, length), generator=g)
    ids[pairs:, :prompt] = ids[:pairs, :prompt]  # a pair's two rows share their prompt
    attention = torch.zeros(rows, length, dtype=torch.long)
    completion = torch.zeros(rows, length, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        attention[row, : prompt + n] = 1
        completion[row, prompt : prompt + n] = 1
    tensors = {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}
    return {k: v.to(device) for k, v in tensors.items()}


def step(trainer: Any, compute: Any, inputs: dict[str, Any]) -> tuple[float, float]:
    import torch

    trainer.model.zero_grad(set_to_none=True)
    if inputs["input_ids"].is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    loss = compute(trainer, trainer.model, inputs, False)
    loss.backward()
    if inputs["input_ids"].is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, float(loss.detach())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="Timed steps per side and shape; the best is kept.")
    p.add_argument("--device", default="cpu")
    p.add_argument("--smoke", action="store_true", help="One small shape, one repeat (the test's run).")
    a = p.parse_args()
    shapes = [(2, 12, 6)] if a.smoke else SHAPES
    repeats = 1 if a.smoke else a.repeats
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GYM_HOME"] = str(Path(tmp) / "gym")
        trainer, trl_compute = build(a.device, Path(tmp) / "out")
        gym_compute = type(trainer)._compute_loss
        rows = []
        for pairs, prompt, answer in shapes:
            inputs = batch(pairs, prompt, answer, a.device)
            sides: dict[str, list[tuple[float, float]]] = {"gym": [], "trl": []}
            for r in range(repeats + 1):  # the first round warms up
                for side, compute in (("gym", gym_compute), ("trl", trl_compute)):
                    sample = step(trainer, compute, inputs)
                    if r:
                        sides[side].append(sample)
            g, t = min(sides["gym"]), min(sides["trl"])
            # fp32 sums over hundreds of answer tokens move by ~1e-4 with how the attention is batched
            # (TRL's two rows per pair vs gym's one), and policy and reference each carry that: 1e-3.
            if abs(g[1] - t[1]) > 1e-3 * max(1.0, abs(t[1])):
                sys.exit(f"the two paths disagree at {pairs}x({prompt}+{answer}): loss {g[1]} vs {t[1]}")
            real = int(inputs["attention_mask"].sum())
            rows.append(
                {
                    "pairs": pairs,
                    "prompt": prompt,
                    "answer_max": answer,
                    "answer_share": round(int(inputs["completion_mask"].sum()) / real, 3),
                    "gym_ms": round(g[0] * 1000, 1),
                    "trl_ms": round(t[0] * 1000, 1),
                    "speedup": round(t[0] / g[0], 3),
                }
            )
            print(rows[-1], flush=True)
    print(json.dumps({"device": a.device, "omp_num_threads": os.environ["OMP_NUM_THREADS"], "rows": rows}))


if __name__ == "__main__":
    main()
