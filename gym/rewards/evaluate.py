"""Mean reward of a policy's sampled completions on held-out prompts: online RL's main metric.

    from gym.rewards.evaluate import reward_eval
    metrics, samples = reward_eval(model, tokenizer, prompts_ds, rewards, weights, samples=4)
    metrics["mean_reward"]

`prompts_ds` is a tokenized prompt dataset (`prompt_ids` rendered with the model's chat template,
`answer`, `metadata`). Each prompt gets `samples` completions at the rollout temperature, scored by
the same rewards training uses; the generator is seeded (and torch's global RNG left as it was), so
a model evaluated before and after training sees the same random numbers: the difference is the
model's, not the sampler's.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gym.rewards.base import Reward, weighted_sum


def reward_eval(
    model: Any,
    tokenizer: Any,
    prompts: Any,
    rewards: list[Reward],
    weights: list[float],
    *,
    samples: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    batch_size: int = 32,
    keep: int = 8,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(metrics, a few sample rows) of `model` on `prompts`: mean/min/max/std reward, each reward's
    mean, the mean completion length in tokens."""
    import torch

    was_training = model.training
    model.eval()
    eos = tokenizer.eos_token_id
    scores: dict[str, list[float | None]] = {r.name: [] for r in rewards}
    lengths: list[int] = []
    rows: list[dict[str, Any]] = []
    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            chunk = prompts.select(range(start, min(start + batch_size, len(prompts))))
            enc = tokenizer.pad({"input_ids": chunk["prompt_ids"]}, padding_side="left", return_tensors="pt")
            out = model.generate(
                **enc.to(model.device),
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=samples,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=eos,
            )
            ids = [_until_eos(row.tolist(), eos) for row in out[:, enc["input_ids"].shape[1] :]]
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            columns = {
                "answer": [a for a in chunk["answer"] for _ in range(samples)],
                "metadata": [m for m in chunk["metadata"] for _ in range(samples)],
                "completion_ids": ids,
            }
            convo = [p for p in chunk["prompt"] for _ in range(samples)]
            completions = [[{"role": "assistant", "content": t}] for t in texts]
            for r in rewards:
                scores[r.name] += r(convo, completions, **columns)
            for i in range(0, len(texts), samples):
                if len(rows) < keep:
                    prompt_text = chunk["prompt_text"][i // samples]
                    row = {"prompt": prompt_text, "completion": texts[i], "answer": columns["answer"][i]}
                    rows.append({**row, "index": len(lengths) + i})
            lengths += [len(i) for i in ids]
    if was_training:
        model.train()
    total = [s for s in weighted_sum([scores[r.name] for r in rewards], weights) if not math.isnan(s)]
    metrics = {
        "mean_reward": statistics.fmean(total) if total else math.nan,
        "min_reward": min(total, default=math.nan),
        "max_reward": max(total, default=math.nan),
        "reward_std": statistics.pstdev(total) if total else math.nan,
        "completion_length": statistics.fmean(lengths) if lengths else 0.0,
    }
    for r in rewards:
        given = [s for s in scores[r.name] if s is not None]
        metrics[f"rewards/{r.name}"] = statistics.fmean(given) if given else math.nan
    per_completion = weighted_sum([scores[r.name] for r in rewards], weights)
    for row in rows:
        row["reward"] = per_completion[row.pop("index")]
    return metrics, rows


def _until_eos(ids: list[int], eos: int | None) -> list[int]:
    """The completion's tokens up to and including the first end-of-turn token (padding dropped)."""
    if eos is not None and eos in ids:
        return ids[: ids.index(eos) + 1]
    return ids
