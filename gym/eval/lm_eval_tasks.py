"""lm-eval's own MMLU / C-Eval / CMMLU tasks, pointed at the local files gym reads.

lm-eval's task YAMLs read the hub (`cais/mmlu`, `ceval/ceval-exam`, `haonan-li/cmmlu`). This
module turns each subject's YAML into a full task config whose dataset is the same local data:
the C-Eval and CMMLU CSVs themselves (every cell read as text, as the hub serves them), and for
MMLU, whose original CSVs have no header, the hub's schema (`question`, `subject`, `choices`,
`answer`) written as JSON lines from the same files. Everything else (prompt, few-shot sampler,
metrics) is lm-eval's YAML unchanged. Used by the agreement test and benchmarks/eval_speed.py,
and by `gym eval --engine lm-eval` to run lm-eval itself on local files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gym.eval.benchmarks import LETTERS, BenchmarkSpec
from gym.eval.mc_data import BenchmarkData, SubjectData
from gym.eval.mc_prompt import description
from gym.eval.results import EvalResult
from gym.models import ModelRef

if TYPE_CHECKING:
    from gym.eval.multiple_choice import MCSettings

YAML_DIRS = {"mmlu": "mmlu/default", "ceval": "ceval", "cmmlu": "cmmlu"}
TEMPLATES = {  # the include each benchmark's subject tasks share
    "mmlu": "_default_template_yaml",
    "ceval": "_default_ceval_yaml",
    "cmmlu": "_default_template_yaml",
}


def lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def subject_yaml(spec: BenchmarkSpec, subject: str) -> dict[str, Any]:
    """lm-eval's YAML for one subject with its `include` merged in (these YAMLs use no !function); for a
    subject lm-eval has no task for (one a user's mapping.json adds), its benchmark's template alone."""
    import yaml

    folder = lm_eval_tasks_dir() / YAML_DIRS[spec.name]
    task = folder / f"{spec.lm_eval_task(subject)}.yaml"
    config: dict[str, Any] = (
        yaml.safe_load(task.read_text())
        if task.is_file()
        else {"task": spec.lm_eval_task(subject), "dataset_name": subject, "include": TEMPLATES[spec.name]}
    )
    base: dict[str, Any] = yaml.safe_load((folder / config.pop("include")).read_text())
    return {**base, **config}


def local_task_configs(data: BenchmarkData, work_dir: Path) -> list[dict[str, Any]]:
    """One lm-eval task config per subject of `data`, reading the same questions gym reads.

    The `limit` gym applied is not baked in: pass the same `limit` to lm-eval.
    """
    configs = []
    for subject in data.subjects:
        config = subject_yaml(data.spec, subject.info.key)
        config.pop("tag", None)  # tags name the hub tasks' groups; gym aggregates itself
        # the subject's name as the data's mapping.json gives it: lm-eval's own for the subjects it knows
        # (the shipped mappings' names are its), a user's for one it doesn't, or one the user renamed
        config["description"] = description(data.spec, subject)
        config["dataset_path"], config["dataset_kwargs"] = _dataset(data.spec, subject, work_dir)
        config["dataset_name"] = None
        configs.append(config)
    return configs


def _dataset(spec: BenchmarkSpec, subject: SubjectData, work_dir: Path) -> tuple[str, dict[str, Any]]:
    zipped = any("!" in f for f in subject.files)
    if spec.name == "mmlu" or zipped or any(f.endswith(".parquet") for f in subject.files):
        return "json", {"data_files": _write_hub_schema(spec, subject, work_dir)}
    from datasets import Features, Value

    files = dict(zip(spec.splits, subject.files, strict=True))
    header = [c or "Unnamed: 0" for c in (spec.header or ())]
    with open(files[spec.scored_split], encoding="utf-8-sig") as fh:
        first = fh.readline()
    if "explanation" in first.split(","):
        header.append("explanation")
    features = Features({c: Value("string") for c in header})
    return "csv", {"data_files": files, "features": features, "keep_default_na": False}


def _write_hub_schema(spec: BenchmarkSpec, subject: SubjectData, work_dir: Path) -> dict[str, str]:
    """The subject's rows as JSON lines in the hub dataset's columns; split name -> file."""
    folder = work_dir / spec.name / subject.info.key
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, questions in ((spec.fewshot_split, subject.pool), (spec.scored_split, subject.questions)):
        path = folder / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for number, q in enumerate(questions):
                if spec.name == "mmlu":
                    row: dict[str, Any] = {
                        "question": q.question,
                        "subject": subject.info.key,
                        "choices": list(q.choices),
                        "answer": q.answer,
                    }
                else:
                    row = {
                        "id": str(number),
                        spec.question_col: q.question,
                        spec.answer_col: LETTERS[q.answer],
                    }
                    row.update(zip(spec.choice_cols, q.choices, strict=True))
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        out[split] = str(path)
    return out


def run_on_local_files(model: ModelRef, settings: MCSettings) -> EvalResult:
    """lm-eval itself on the benchmark files gym reads (`gym eval --engine lm-eval`): the same
    `MCSettings`, the same result format, subjects and categories keyed as gym keys them."""
    import tempfile

    from gym.eval.lm_eval_bridge import LmEvalSettings, run_lm_eval
    from gym.eval.mc_data import load_benchmark
    from gym.eval.results import weighted

    data = load_benchmark(
        settings.benchmark,
        settings.data_dir,
        subjects=settings.subjects,
        limit=settings.limit,
        shots=settings.shots,
        mapping=settings.mapping,
    )
    with tempfile.TemporaryDirectory(prefix="gym-lm-eval-") as work:
        configs = local_task_configs(data, Path(work))
        bridge = LmEvalSettings(
            tasks=[c["task"] for c in configs],
            shots=settings.shots,
            limit=settings.limit,
            batch_size=settings.batch_size,
            chat=settings.style == "chat",
            max_length=settings.max_length,
            device=settings.device,
            progress=settings.progress,
        )
        result = run_lm_eval(model, bridge, task_configs=configs, benchmark=data.spec.name)
    prefix = data.spec.lm_eval_prefix
    rekey = {data.spec.lm_eval_task(s.info.key): s.info.key for s in data.subjects}
    sizes = {rekey[t]: n for t, n in result.sizes.items()}
    correct = {rekey[t]: round(acc * result.sizes[t]) for t, acc in result.subjects.items()}
    categories = {s.info.key: s.info.category for s in data.subjects}
    return result.model_copy(
        update={
            "subjects": {rekey[t]: v for t, v in result.subjects.items()},
            "sizes": sizes,
            "predictions": {t.removeprefix(prefix): p for t, p in result.predictions.items()},
            "answers": {t.removeprefix(prefix): a for t, a in result.answers.items()},
            "categories": weighted(correct, sizes, categories),
            "subject_categories": categories,
            "overall": sum(correct.values()) / sum(sizes.values()),
        }
    )
