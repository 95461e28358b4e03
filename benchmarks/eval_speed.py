"""gym's MMLU evaluator vs lm-eval on the same files, model, shots and batch size: wall time and
agreement, subject by subject and question by question.

    OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \\
        .venv/bin/python benchmarks/eval_speed.py [--data ../shared/data/eval/mmlu] [--batch-size 16]

lm-eval runs its own `mmlu_<subject>` task YAMLs pointed at the same questions
(gym/eval/lm_eval_tasks.py). The subjects are split into chunks and both tools run each chunk in
turn (alternating who goes first), all in this one process, so that a busy machine slows both
alike; each side's time covers everything it does for a chunk (reading data, loading the model,
building and tokenizing prompts, scoring). A warm-up pass first builds lm-eval's dataset caches
and imports everything. Goal: identical accuracy in every subject, gym >= 2x faster.
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import time

from mmlu_setup import add_options, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(parser, limit=None, chunks=8)
    args = parser.parse_args()
    setup = prepare(args)
    keys, chunks = setup.keys, setup.chunks

    from lm_eval.models.huggingface import HFLM

    from gym.eval.multiple_choice import MCSettings, evaluate_benchmark
    from gym.models import resolve

    model = resolve(args.model)

    def run_lm_eval(subjects: list[str], limit: int | None) -> dict:
        return setup.lm_eval(
            HFLM(pretrained=model.path, batch_size=args.batch_size, device="cpu"), subjects, limit
        )

    def run_gym(subjects: list[str]):
        settings = MCSettings(
            data_dir=args.data,
            subjects=subjects,
            shots=args.shots,
            limit=args.limit,
            batch_size=args.batch_size,
            progress=False,
        )
        return evaluate_benchmark(model, settings)

    run_lm_eval(keys, 1)  # warm-up: imports, dataset caches
    run_gym(keys[:1])
    times = {"gym": 0.0, "lm-eval": 0.0}
    gym_acc, lm_acc, differing, compared = {}, {}, [], 0
    for i, chunk in enumerate(chunks):
        order = ["gym", "lm-eval"] if i % 2 == 0 else ["lm-eval", "gym"]
        for tool in order:
            start = time.perf_counter()
            if tool == "gym":
                result = run_gym(chunk)
            else:
                reference = run_lm_eval(chunk, args.limit)
            times[tool] += time.perf_counter() - start
        for subject in chunk:
            gym_acc[subject] = result.subjects[subject]
            lm_acc[subject] = reference["results"][f"mmlu_{subject}"]["acc,none"]
            samples = sorted(reference["samples"][f"mmlu_{subject}"], key=lambda s: s["doc_id"])
            for doc, sample in enumerate(samples):
                lls = [float(r[0]) for r in sample["filtered_resps"]]
                compared += 1
                if lls.index(max(lls)) != result.predictions[subject][doc]:
                    ranked = sorted(lls, reverse=True)
                    differing.append({"subject": subject, "doc": doc, "gap": ranked[0] - ranked[1]})
        print(
            f"chunk {i + 1}/{len(chunks)}: gym {times['gym']:.1f}s lm-eval {times['lm-eval']:.1f}s so far",
            flush=True,
        )

    same = [s for s in keys if gym_acc[s] == lm_acc[s]]
    print(f"\n{'subject':40s} {'gym':>7s} {'lm-eval':>7s}")
    for s in keys:
        mark = "" if s in same else "   <- differs"
        print(f"{s:40s} {gym_acc[s]:7.4f} {lm_acc[s]:7.4f}{mark}")
    ratio = times["lm-eval"] / times["gym"]
    print(f"\ngym {times['gym']:.1f}s  lm-eval {times['lm-eval']:.1f}s  speed-up {ratio:.2f}x")
    print(
        f"subjects with identical accuracy: {len(same)}/{len(keys)}; questions answered differently: "
        f"{len(differing)}/{compared}"
    )
    print(
        setup.summary(
            gym_s=round(times["gym"], 2),
            lm_eval_s=round(times["lm-eval"], 2),
            speedup=round(ratio, 3),
            subjects_identical=len(same),
            questions=compared,
            questions_differing=differing,
        )
    )


if __name__ == "__main__":
    main()
