"""Any lm-eval task on any model gym can resolve, with results in gym's `EvalResult` format.

    from gym.eval.lm_eval_bridge import LmEvalSettings, run_lm_eval
    run_lm_eval(resolve("models:/gym-tiny-sft@champion"), LmEvalSettings(tasks=["arc_easy"]))

    gym eval --model gym-tiny --lm-eval-task arc_easy --limit 50 --json
    gym eval --model gym-tiny --lm-eval-task my_task --include-path ./my_tasks   # your own YAMLs

lm-eval does the work (its task registry, prompts, metrics, few-shot sampling); gym hands it the
model loaded its own way (safetensors only, remote code only if asked, gym's chat template on the
tokenizer) and maps lm-eval's results onto subjects (leaf tasks), categories (groups) and overall.
Task configs (dicts) work too: gym/eval/lm_eval_tasks.py builds lm-eval's MMLU / C-Eval / CMMLU
tasks over local files, which is how `gym eval --engine lm-eval --benchmark mmlu` runs.
A TF-GRPO model's shipped experience block goes in as lm-eval's system instruction (first in the
prompt; the system message's start with a chat template) and is named in the result. A library
shipped with `retrieval_top_k` (a selection per question) cannot: it is refused before loading.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gym.errors import ConfigError, MissingExtraError
from gym.eval.mc_score import resolve_device
from gym.eval.results import EvalResult
from gym.models import ModelRef, load_model, load_tokenizer
from gym.tfgrpo.injection import experience_block, shipped_library

SKIP_KEYS = ("alias", "samples", "name", "sample_len", "sample_count")


class LmEvalSettings(BaseModel):
    """An lm-eval run: which tasks, how many shots and questions, where extra task YAMLs live."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(description="lm-eval task, group or tag names (`lm_eval ls tasks`).")
    shots: int | None = Field(None, ge=0, description="Few-shot examples (default: each task's own).")
    limit: int | None = Field(None, ge=1, description="Only the first N documents of each task.")
    batch_size: int = Field(16, ge=1, description="Requests per forward pass.")
    include_path: str | None = Field(None, description="A folder of your own lm-eval task YAMLs.")
    chat: bool = Field(False, description="Render prompts through the model's chat template.")
    max_length: int | None = Field(None, ge=1, description="Context window (default: the model's).")
    device: str = Field("auto", description="cpu, cuda, cuda:1 ... (auto: cuda when there is one).")
    progress: bool = Field(True, description="lm-eval's progress bars (tokenizing, scoring requests).")


def task_manager(settings: LmEvalSettings, with_defaults: bool = True) -> Any:
    """lm-eval's task index, checked to know every task asked for. Your own YAMLs alone are
    indexed in a second; lm-eval's ~15,000 built-in names take half a minute, so they are only
    indexed when a task isn't among yours."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        raise MissingExtraError("the lm-eval bridge needs lm-eval: pip install 'gym[eval]'") from exc

    if settings.include_path:
        if not Path(settings.include_path).is_dir():
            raise ConfigError(f"--include-path {settings.include_path} is not a folder")
        own = _index(str(Path(settings.include_path).resolve()), False)
        if not with_defaults or all(t in own.all_tasks for t in settings.tasks):
            return own
    if not with_defaults:
        return TaskManager(include_defaults=False)
    manager = _index(settings.include_path and str(Path(settings.include_path).resolve()), True)
    unknown = [t for t in settings.tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"lm-eval has no task named {', '.join(unknown)} (`lm_eval ls tasks` lists them; "
            "your own YAMLs go in --include-path)"
        )
    return manager


@contextlib.contextmanager
def _user_errors(settings: LmEvalSettings) -> Iterator[None]:
    """What lm-eval raises for a request it can't serve, as a ConfigError saying what to do (they were
    tracebacks): a task whose data is on the hub while offline, more shots than a task has examples."""
    try:
        yield
    except ConnectionError as exc:
        raise ConfigError(
            f"lm-eval task {', '.join(settings.tasks)}: its data could not be fetched ({exc}); with "
            "HF_HUB_OFFLINE=1 or no network only data already in the hub cache is read: run once online, "
            "or point your own task YAML (--include-path) at local files"
        ) from None
    except ValueError as exc:
        if "larger than population" not in str(exc):
            raise
        raise ConfigError(
            f"--shots {settings.shots}: more few-shot examples than the task {', '.join(settings.tasks)} "
            "has to draw from; ask for fewer"
        ) from None


@functools.lru_cache(maxsize=4)
def _index(include_path: str | None, include_defaults: bool) -> Any:
    """Built once per process: a flow checks the names, then runs the tasks with the same index."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def run_lm_eval(
    model: ModelRef,
    settings: LmEvalSettings,
    task_configs: list[dict[str, Any]] | None = None,
    benchmark: str | None = None,
    manager: Any | None = None,
) -> EvalResult:
    """Run lm-eval's `settings.tasks` (or the given full task configs) on `model`.
    `manager`: the index from `task_manager(settings)`, if the caller already checked the names."""
    start = time.perf_counter()
    shipped = shipped_library(model.path)
    if shipped is not None and shipped.retrieves:
        raise ConfigError(
            f"{model.name} ships a TF-GRPO library of {len(shipped.texts)} experiences with retrieval_top_k="
            f"{shipped.retrieval_top_k}: each question gets its own {shipped.retrieval_top_k}, which cannot "
            "go through lm-eval's single system instruction. Evaluate it with gym's own evaluator "
            "(`gym eval --benchmark ... --engine gym`, or a generation eval), which retrieves per question"
        )
    if manager is None:
        manager = task_manager(settings, with_defaults=task_configs is None)
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(
        pretrained=load_model(model).to(resolve_device(settings.device)).eval(),
        tokenizer=load_tokenizer(model),
        batch_size=settings.batch_size,
        max_length=settings.max_length,
    )
    if not settings.progress:  # lm-eval's evaluator asks for the bars: each request type takes this flag
        for name in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
            setattr(lm, name, functools.partial(getattr(lm, name), disable_tqdm=True))
    with _user_errors(settings):
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=task_configs if task_configs is not None else list(settings.tasks),
            num_fewshot=settings.shots,
            limit=settings.limit,
            task_manager=manager,
            log_samples=True,
            bootstrap_iters=0,
            apply_chat_template=settings.chat,
            fewshot_as_multiturn=settings.chat,
            system_instruction=experience_block(shipped.texts) if shipped and shipped.texts else None,
        )
    if out is None:  # pragma: no cover - only on non-zero ranks of a distributed run
        raise ConfigError("lm-eval returned no results")
    seconds = time.perf_counter() - start
    result = to_result(out, model.name, benchmark or ",".join(settings.tasks), settings.shots, seconds)
    result.style = "chat" if settings.chat else "lm-eval"
    if shipped is None:
        return result
    return result.model_copy(
        update={"experiences": shipped.record(), "notes": [shipped.note(), *result.notes]}
    )


def to_result(
    out: dict[str, Any], model: str, benchmark: str, shots: int | None, seconds: float
) -> EvalResult:
    """lm-eval's results dict -> EvalResult: leaf tasks are subjects, groups are categories."""
    results: dict[str, dict[str, Any]] = out["results"]
    groups: dict[str, list[str]] = out.get("group_subtasks", {})
    group_names = {g for g, members in groups.items() if members}
    leaves = [t for t in results if t not in group_names]
    metric = _main_metric(results[leaves[0]]) if leaves else "acc,none"
    sizes = {t: int(out.get("n-samples", {}).get(t, {}).get("effective", 0)) for t in leaves}
    subjects = {t: float(results[t][metric]) for t in leaves if metric in results[t]}
    categories = {g: float(results[g][metric]) for g in group_names if metric in results.get(g, {})}
    parent = {t: g for g, members in groups.items() for t in members}
    predictions = {t: _predictions(samples) for t, samples in out.get("samples", {}).items()}
    answers = {t: _answers(samples) for t, samples in out.get("samples", {}).items()}
    total = sum(sizes[t] for t in subjects)
    top = [g for g in group_names if g not in parent]
    if len(top) == 1 and top[0] in categories:
        overall = categories[top[0]]
    else:
        overall = sum(subjects[t] * sizes[t] for t in subjects) / total if total else 0.0
    return EvalResult(
        benchmark=benchmark,
        model=model,
        metric=metric.split(",")[0],
        overall=overall,
        categories=categories,
        subjects=subjects,
        sizes=sizes,
        subject_categories={t: parent[t] for t in leaves if t in parent},
        n_questions=sum(sizes.values()),
        seconds=seconds,
        shots=shots,
        questions_digest=_asked(out.get("samples", {})),
        engine="lm-eval",
        predictions={t: p for t, p in predictions.items() if p is not None},
        answers={t: a for t, a in answers.items() if a is not None and predictions.get(t) is not None},
    )


def _main_metric(task_results: dict[str, Any]) -> str:
    for key, value in task_results.items():
        if key not in SKIP_KEYS and "_stderr" not in key and isinstance(value, (int, float)):
            return key
    raise ConfigError(f"lm-eval reported no metric: {sorted(task_results)}")


def _asked(samples: dict[str, list[dict[str, Any]]]) -> str | None:
    """Digest of what lm-eval asked (each task's documents, first prompts and targets, as the hashes it
    logs with each sample), as EvalResult.questions_digest; None without logged samples."""
    from gym.hashing import hash_obj

    if not samples:
        return None
    keys = ("doc_hash", "prompt_hash", "target_hash")
    return hash_obj(
        {
            task: [[s.get(k) for k in keys] for s in sorted(rows, key=lambda s: s["doc_id"])]
            for task, rows in samples.items()
        },
        length=12,
    )


def _answers(samples: list[dict[str, Any]]) -> list[int] | None:
    """For multiple-choice tasks, the correct choice of each document (lm-eval's `target`), in the order
    of `_predictions`; None when a target is not a choice index."""
    targets = [sample.get("target") for sample in sorted(samples, key=lambda s: s["doc_id"])]
    if not all(isinstance(t, int) or (isinstance(t, str) and t.isdigit()) for t in targets):
        return None
    return [int(t) for t in targets]  # type: ignore[arg-type]


def _predictions(samples: list[dict[str, Any]]) -> list[int] | None:
    """For multiple-choice tasks, the chosen choice of each document (argmax log-likelihood)."""
    chosen = []
    for sample in sorted(samples, key=lambda s: s["doc_id"]):
        responses = sample.get("filtered_resps")
        if not responses or not isinstance(responses[0], (list, tuple)):
            return None
        lls = [float(r[0]) for r in responses]
        chosen.append(lls.index(max(lls)))
    return chosen
