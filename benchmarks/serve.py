"""What serving costs and what batching buys: completion tokens/s and p50/p95 latency of `gym serve`
under a bounded concurrent load, against calling `generate` directly in one process.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/serve.py [--model gym-tiny] [--tokens 64] [--requests 32]

The server is a real `gym serve` process on a free loopback port, driven over HTTP by this process;
"direct" is transformers' greedy `generate` on the same prompts, one request at a time, in this
process (what a script without a server does). Every request produces exactly --tokens tokens
(`ignore_eos` on the server, min_new_tokens direct). Goals: server/direct tokens/s >= 0.8 at
concurrency 1, and > 1.0 at concurrency 8 (batching pays). Prints one JSON line at the end; timings
on a shared machine are noisy, so compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
NAME = "bench"


def prompts(n: int) -> list[str]:
    words = ["river", "mountain", "city", "forest", "ocean", "desert", "island", "valley"]
    return [f"Tell me about the {words[i % len(words)]} number {i}." for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(latencies: list[float], tokens: int, wall: float) -> dict[str, float]:
    return {
        "tokens_per_s": round(tokens / wall, 1),
        "p50_s": round(statistics.median(latencies), 4),
        "p95_s": round(percentile(latencies, 0.95), 4),
        "requests": len(latencies),
    }


def direct(model_dir: str, texts: list[str], tokens: int) -> dict[str, float]:
    """transformers' generate, one request after another, prompts rendered with the model's template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    chats = [[{"role": "user", "content": t}] for t in texts]
    encoded = [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        for c in chats
    ]
    gen = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    with torch.inference_mode():
        for batch in encoded[:2]:  # warm-up
            model.generate(**batch, **gen)
        latencies, produced, start = [], 0, time.perf_counter()
        for batch in encoded:
            t0 = time.perf_counter()
            out = model.generate(**batch, **gen)
            tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            latencies.append(time.perf_counter() - t0)
            produced += out.shape[1] - batch["input_ids"].shape[1]
    return summary(latencies, produced, time.perf_counter() - start)


async def load(base: str, texts: list[str], tokens: int, concurrency: int) -> dict[str, float]:
    """`concurrency` clients share the prompts; each sends its next request when the last one answers."""
    latencies: list[float] = []
    produced = 0

    async def client(http: httpx.AsyncClient, todo: list[str]) -> None:
        nonlocal produced
        while todo:
            text = todo.pop()
            message = {"role": "user", "content": text}
            body = {
                "model": NAME,
                "messages": [message],
                "max_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            t0 = time.perf_counter()
            r = await http.post(f"{base}/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            produced += r.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as http:
        await client(http, texts[:2])  # warm-up
        latencies.clear()
        produced = 0
        todo = list(reversed(texts))
        start = time.perf_counter()
        await asyncio.gather(*(client(http, todo) for _ in range(concurrency)))
    return summary(latencies, produced, time.perf_counter() - start)


def start_server(model: str, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable,
        "-m",
        "flows.cli",
        "serve",
        "--model",
        model,
        "--port",
        "0",
        "--served-model-name",
        NAME,
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if " at http" not in line:
        proc.kill()
        sys.exit(f"gym serve did not start: {line!r}")
    return proc, line.split(" at ", 1)[1].split()[0].removesuffix("/v1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gym-tiny", help="Registry name or model directory.")
    parser.add_argument("--tokens", type=int, default=64, help="Completion tokens per request.")
    parser.add_argument("--requests", type=int, default=32, help="Requests per measurement.")
    parser.add_argument("--concurrency", type=int, default=8, help="Concurrent clients for the batched run.")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    from gym.serve.loading import resolve_served

    model_dir = resolve_served(args.model).path
    texts = prompts(args.requests)
    result: dict[str, Any] = {"model": args.model, "tokens": args.tokens, "concurrency": args.concurrency}
    result["direct"] = direct(model_dir, texts, args.tokens)
    proc, base = start_server(args.model, env)
    try:
        result["server_c1"] = asyncio.run(load(base, texts, args.tokens, 1))
        result[f"server_c{args.concurrency}"] = asyncio.run(load(base, texts, args.tokens, args.concurrency))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    direct_tps = result["direct"]["tokens_per_s"]
    result["ratio_c1"] = round(result["server_c1"]["tokens_per_s"] / direct_tps, 3)
    batched = f"server_c{args.concurrency}"
    result[f"ratio_c{args.concurrency}"] = round(result[batched]["tokens_per_s"] / direct_tps, 3)
    result["goals_met"] = result["ratio_c1"] >= 0.8 and result[f"ratio_c{args.concurrency}"] > 1.0
    for key in ("direct", "server_c1", f"server_c{args.concurrency}"):
        print(f"{key:>10}: {result[key]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
