"""lm-eval scoring a model served by `gym serve` over HTTP vs lm-eval scoring the same weights
in-process (its `hf` model): wall time and agreement on MMLU, question by question.

    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \\
        .venv/bin/python benchmarks/serve_lm_eval.py [--data ../shared/data/eval/mmlu] [--limit 10]

Both sides run lm-eval's own `mmlu_<subject>` task YAMLs on the same questions (gym/eval/
lm_eval_tasks.py), the same shots, batch size and context window (the model's, less one token: the
served request generates one). "served" is lm-eval's `local-completions` model posting batches of
prompts to `gym serve`'s /v1/completions (`logprobs`, `echo`, `max_tokens: 1`, greedy) on a real
loopback HTTP server in this process; "in-process" is lm-eval's `hf` model. The two alternate
over chunks of subjects so a busy machine slows both alike; model loading and the server's start
are outside the timings. Prints served/in-process time (what evaluating over HTTP costs) and how
many questions the two answered differently; ends with one JSON line.
"""

from __future__ import annotations

import argparse
import time

from mmlu_setup import add_options, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(parser, limit=10, chunks=4)
    args = parser.parse_args()
    setup = prepare(args)
    keys, chunks = setup.keys, setup.chunks

    from lm_eval.models.huggingface import HFLM
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from gym.models import resolve
    from gym.serve.app import build_app
    from gym.serve.engine import Engine
    from gym.serve.server import serve_in_thread

    model = resolve(args.model)
    with Engine.load(args.model, name=args.model) as engine, serve_in_thread(build_app(engine)) as url:
        window = engine.context_length or 2048
        in_process = HFLM(
            pretrained=model.path, batch_size=args.batch_size, device="cpu", max_length=window - 1
        )
        served = LocalCompletionsAPI(
            base_url=f"{url}/v1/completions",
            model=args.model,
            tokenizer=model.path,
            tokenizer_backend="huggingface",
            batch_size=args.batch_size,
            max_length=window,  # lm-eval keeps one token for the generated one: the same inputs as hf
            max_retries=1,
        )
        tools = {"served": served, "in-process": in_process}
        for lm in tools.values():  # warm-up: imports, dataset caches, first requests
            setup.lm_eval(lm, keys[:1], 1)
        times = dict.fromkeys(tools, 0.0)
        answers: dict[str, dict[tuple[str, int], int]] = {name: {} for name in tools}
        for i, chunk in enumerate(chunks):
            for name in list(tools)[:: 1 if i % 2 == 0 else -1]:
                start = time.perf_counter()
                out = setup.lm_eval(tools[name], chunk, args.limit)
                times[name] += time.perf_counter() - start
                for task, samples in out["samples"].items():
                    for s in samples:
                        lls = [float(r[0]) for r in s["filtered_resps"]]
                        answers[name][(task, s["doc_id"])] = lls.index(max(lls))
            print(f"chunk {i + 1}/{len(chunks)}: " + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()))
    questions = sorted(answers["in-process"])
    differing = [q for q in questions if answers["served"].get(q) != answers["in-process"][q]]
    ratio = times["served"] / times["in-process"]
    print(
        f"\nserved {times['served']:.1f}s  in-process {times['in-process']:.1f}s  served/in-process "
        f"{ratio:.2f}x; questions answered differently: {len(differing)}/{len(questions)}"
    )
    print(
        setup.summary(
            served_s=round(times["served"], 2),
            in_process_s=round(times["in-process"], 2),
            served_vs_in_process=round(ratio, 3),
            questions=len(questions),
            questions_differing=len(differing),
        )
    )


if __name__ == "__main__":
    main()
