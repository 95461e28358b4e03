"""Small MMLU / C-Eval / CMMLU fixtures in the exact original layouts, written by the tests themselves.

C-Eval and CMMLU are CC BY-NC-SA, so no question of theirs is ever committed: these are made-up
questions (deterministic, from a seed) in the real subjects' layouts, with the cells that trip CSV
readers (quoted commas and newlines, numbers such as 1.50, the words NA and None, padding spaces)
and a spread of lengths so that some 5-shot prompts exceed gym-tiny's 512-token window.
"""

from __future__ import annotations

import csv
import json
import random
import zipfile
from pathlib import Path

from gym.eval.benchmarks import LETTERS, get_spec, load_mapping
from gym.eval.lm_eval_tasks import local_task_configs

WORDS = [
    "the",
    "model",
    "of",
    "a",
    "cell",
    "energy",
    "water",
    "market",
    "law",
    "river",
    "theory",
    "number",
    "graph",
    "function",
    "value",
    "state",
    "history",
    "language",
    "court",
    "price",
    "light",
    "atom",
    "gene",
    "tree",
    "story",
    "city",
    "rule",
    "vote",
    "river",
    "motion",
    "force",
    "which",
    "what",
    "why",
    "how",
    "when",
    "many",
    "most",
    "least",
    "best",
    "first",
    "second",
]
HAN = "中国历史法律经济数学物理化学生物地理文学艺术医学工程计算机网络会计税务教育心理管理政治哲学"
TRICKY = ("1.50", "NA", "None", "  padded  ", 'a "quoted", comma', "two\nlines", "0", "")

# Real subject keys, so lm-eval has a task YAML for each (two per benchmark).
SUBJECTS = {
    "mmlu": ("abstract_algebra", "high_school_biology"),
    "ceval": ("accountant", "college_physics"),
    "cmmlu": ("agronomy", "arts"),
}


def _text(rng: random.Random, chinese: bool, lo: int, hi: int) -> str:
    n = rng.randint(lo, hi)
    if chinese:
        return "".join(rng.choice(HAN) for _ in range(n)) + "？"
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "?"


def _choice(rng: random.Random, chinese: bool) -> str:
    if rng.random() < 0.25:
        return rng.choice(TRICKY)
    return _text(rng, chinese, 1, 6).rstrip("?？")


def _rows(benchmark: str, rng: random.Random, n: int, long_every: int) -> list[tuple[str, list[str], str]]:
    chinese = benchmark != "mmlu"
    rows = []
    for i in range(n):
        long_one = long_every and i % long_every == long_every - 1
        question = _text(rng, chinese, 60, 160) if long_one else _text(rng, chinese, 4, 18)
        if i == 1:
            question = "  " + question + "\n"  # lm-eval strips the question
        rows.append((question, [_choice(rng, chinese) for _ in range(4)], rng.choice(LETTERS)))
    return rows


def write_benchmark(
    benchmark: str,
    root: Path,
    *,
    n_questions: int = 6,
    n_dev: int = 5,
    seed: int = 0,
    long_every: int = 3,
    as_zip: bool = False,
) -> Path:
    """Write `benchmark` fixture files (and mapping.json) under `root`; return the data path.

    MMLU: data/{dev,val,test}/<s>_<split>.csv, no header. C-Eval: {dev,val,test}/<s>_<split>.csv
    with header id,question,A,B,C,D,answer,explanation. CMMLU: {dev,test}/<s>.csv with header
    ,Question,A,B,C,D,Answer. With `as_zip`, the same tree inside root/<benchmark>.zip.
    """
    spec = get_spec(benchmark)
    rng = random.Random(f"{benchmark}-{seed}")
    root.mkdir(parents=True, exist_ok=True)
    names = load_mapping(spec)
    mapping = {s: {"name": names[s].name, "category": names[s].category} for s in SUBJECTS[benchmark]}
    (root / "mapping.json").write_text(json.dumps(mapping, ensure_ascii=False, indent=1), encoding="utf-8")
    files: dict[str, str] = {}
    splits = {"dev": n_dev, spec.scored_split: n_questions}
    if benchmark == "ceval":
        splits["test"] = 2  # C-Eval's test split has no answers; gym must not need it
    for subject in SUBJECTS[benchmark]:
        for split, n in splits.items():
            rows = _rows(benchmark, rng, n, long_every if split != "dev" else 0)
            rel = spec.file_name(subject, split)
            files[f"data/{rel}" if benchmark == "mmlu" else rel] = _csv(benchmark, rows, split)
    if as_zip:
        path = root / f"{benchmark}.zip"
        with zipfile.ZipFile(path, "w") as zf:
            for rel, text in files.items():
                zf.writestr(rel, text)
        return path
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8", newline="")
    return root


def _csv(benchmark: str, rows: list[tuple[str, list[str], str]], split: str) -> str:
    import io

    out = io.StringIO(newline="")
    writer = csv.writer(out)
    if benchmark == "ceval":
        writer.writerow(["id", "question", "A", "B", "C", "D", "answer", "explanation"])
    elif benchmark == "cmmlu":
        writer.writerow(["", "Question", "A", "B", "C", "D", "Answer"])
    for i, (question, choices, answer) in enumerate(rows):
        if benchmark == "mmlu":
            writer.writerow([question, *choices, answer])
        elif benchmark == "ceval":
            writer.writerow([i, question, *choices, "" if split == "test" else answer, "解析"])
        else:
            writer.writerow([i, question, *choices, answer])
    return out.getvalue()


def varied_tiny(target: Path) -> Path:
    """gym-tiny with the answer letters' output rows made blind to what every prompt shares.

    The random gym-tiny picks the same letter whatever the question: its final hidden state is
    nearly the same at every "Answer:", and the letters' rows differ in how they meet that
    common part. Redrawing the letters' rows (embeddings are tied to the output layer) orthogonal
    to the average final state leaves the prompt-dependent part to decide, so tests comparing
    predictions compare something that varies. Saved as a normal model directory.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym.models import resolve

    source = resolve("gym-tiny").path
    model = AutoModelForCausalLM.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    letters = [tokenizer.encode(f" {c}")[0] for c in LETTERS] + [tokenizer.encode(c)[0] for c in LETTERS]
    rng = random.Random(0)
    prompts = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 300))) + "\nAnswer:" for _ in range(32)
    ]
    prompts += ["".join(rng.choice(HAN) for _ in range(rng.randint(5, 150))) + "\n答案：" for _ in range(32)]
    with torch.no_grad():
        states = torch.stack(
            [
                model.model(torch.tensor([tokenizer.encode(p)[-500:]])).last_hidden_state[0, -1]
                for p in prompts
            ]
        )
        # The common part: each language's average final state (English prompts, Chinese prompts).
        common, _ = torch.linalg.qr(torch.stack([states[:32].mean(0), states[32:].mean(0)]).T)
        emb = model.get_input_embeddings().weight
        fresh = torch.randn(len(letters), emb.shape[1], generator=torch.Generator().manual_seed(0))
        fresh -= (fresh @ common) @ common.T
        emb[letters] = fresh / fresh.norm(dim=1, keepdim=True) * emb.norm(dim=1).mean()
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def lm_eval_samples(lm, data, shots, work, chat=False) -> dict[str, list[list[float]]]:
    """lm-eval's per-question log-likelihoods of the four choices, per subject, in file order."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    configs = local_task_configs(data, work)
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=configs,
        num_fewshot=shots,
        task_manager=TaskManager(include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
        apply_chat_template=chat,
        fewshot_as_multiturn=chat,
    )
    prefix = data.spec.lm_eval_prefix
    per_subject = {}
    for task, samples in out["samples"].items():
        ordered = sorted(samples, key=lambda s: s["doc_id"])
        per_subject[task.removeprefix(prefix)] = [[float(r[0]) for r in s["filtered_resps"]] for s in ordered]
    return per_subject
