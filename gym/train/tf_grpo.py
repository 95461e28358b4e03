"""Training-Free GRPO as a training method: learns an experience library, trains no weights.

    gym.train.run(TrainConfig(method="tf_grpo"), model_ref, ingested_dataset_dir)   # library API
    gym train --method tf_grpo --endpoint URL --dataset D --group-size 5 --epochs 3 --json

`prepare` turns settings, a model and datasets into a `TfGrpoRun` (a reference the Prefect tasks
pass around: settings, run directory, config hash, the questions on disk); `runtime(run)` is the
process's live Runtime for it. `ship` writes the final model directory: the model's files (linked,
not copied, where the filesystem allows) plus `experiences.json`, so registering, serving and
evaluating it inject the library exactly as training did (gym.tfgrpo.injection). A run whose
policy is a remote API model ships `experiences.json` alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gym import workspace
from gym.errors import ConfigError
from gym.models import ModelRef
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question, StepPlan, check_answers, load_questions, plan_steps, questions_from
from gym.tfgrpo.engine import RunResult, train
from gym.tfgrpo.injection import EXPERIENCE_FILE, shipped_json, written_by
from gym.tfgrpo.library import Library
from gym.tfgrpo.runtime import Runtime, with_start
from gym.train.common import TrainResult
from gym.train.config import TrainConfig


class TfGrpoRun(BaseModel):
    """A prepared run, by reference: what every task of the flow needs to find its Runtime."""

    settings: TfGrpoSettings
    model: str | None
    template: str | None = None
    trust_remote_code: bool = False
    dataset_digest: str
    run_dir: str
    config_hash: str
    start: Library | None = None
    """The library the run starts from (`experience_lib_path`'s: Runtime.with_start), else empty."""
    refresh: bool = False
    """Ask every call again and redo every step (--refresh-cache: Runtime.refresh)."""
    steps: list[StepPlan]

    @property
    def questions_file(self) -> Path:
        return Path(self.run_dir) / "questions.json"

    @property
    def eval_file(self) -> Path:
        return Path(self.run_dir) / "eval_questions.json"

    def questions(self) -> list[Question]:
        return _read_questions(self.questions_file)

    def eval_questions(self) -> list[Question] | None:
        return _read_questions(self.eval_file) if self.eval_file.is_file() else None


def _read_questions(path: Path) -> list[Question]:
    return [Question.model_validate(q) for q in json.loads(path.read_text(encoding="utf-8"))]


_RUNTIMES: dict[str, Runtime] = {}
_RUNTIMES_LOCK = threading.Lock()


def runtime(run: TfGrpoRun) -> Runtime:
    """The process's Runtime of `run` (clients, cache, ledger), made once."""
    with _RUNTIMES_LOCK:
        if run.run_dir not in _RUNTIMES:
            _RUNTIMES[run.run_dir] = Runtime(
                run.settings,
                model=run.model,
                dataset=run.dataset_digest,
                run_dir=Path(run.run_dir),
                template=run.template,
                trust_remote_code=run.trust_remote_code,
                start=run.start,
                refresh=run.refresh,
            )
        return _RUNTIMES[run.run_dir]


def prepare(
    settings: TfGrpoSettings,
    model: str | None,
    questions: list[Question],
    dataset_digest: str,
    eval_questions: list[Question] | None = None,
    template: str | None = None,
    trust_remote_code: bool = False,
    max_steps: int | None = None,
    refresh: bool = False,
) -> TfGrpoRun:
    """Check the settings, decide the run directory (named by the config hash), write the questions.

    `max_steps` (when set) is the number of steps, instead of the settings' epochs (plan_steps). Like a
    budget, it decides where the run stops, not what a step learns: it is not part of the config hash,
    so a longer run of the same settings resumes from the steps a capped one made. `refresh` asks
    every call again (no call cache) and redoes the steps a previous run finished."""
    check_answers(settings.reward, questions, eval_questions)
    if settings.group_size == 1:
        logging.getLogger("gym.train").warning(
            "TF-GRPO with group_size 1 learns nothing: an experience comes from comparing the answers of "
            "one group, and a group of one has nothing to compare (the paper's ablation); give 2 or more"
        )

    def make(start: Library | None) -> Runtime:
        return Runtime(
            settings,
            model=model,
            dataset=dataset_digest,
            template=template,
            trust_remote_code=trust_remote_code,
            start=start,
            refresh=refresh,
        )

    rt = with_start(make, *initial_library(settings))
    run = TfGrpoRun(
        settings=settings,
        model=model,
        template=template,
        trust_remote_code=trust_remote_code,
        dataset_digest=dataset_digest,
        run_dir=str(rt.run_dir),
        config_hash=rt.config_hash,
        start=rt.start,
        refresh=refresh,
        steps=plan_steps(len(questions), settings.batch_size, settings.epochs, settings.seed, max_steps),
    )
    workspace.atomic_write_json(run.questions_file, [q.model_dump(mode="json") for q in questions])
    if eval_questions:
        workspace.atomic_write_json(run.eval_file, [q.model_dump(mode="json") for q in eval_questions])
    with _RUNTIMES_LOCK:  # a new run (or a resume) starts a new ledger
        _RUNTIMES[run.run_dir] = rt
    return run


def prepare_from_datasets(
    settings: TfGrpoSettings,
    model: str | None,
    dataset: str,
    eval_dataset: str | None = None,
    template: str | None = None,
    trust_remote_code: bool = False,
    max_steps: int | None = None,
    refresh: bool = False,
) -> TfGrpoRun:
    questions, digest = load_questions(dataset, settings.max_train_questions)
    held_out = (
        load_questions(eval_dataset, settings.max_eval_questions, "max_eval_questions")[0]
        if eval_dataset
        else None
    )
    return prepare(
        settings, model, questions, digest, held_out, template, trust_remote_code, max_steps, refresh
    )


def local_model(run: TfGrpoRun) -> ModelRef | None:
    """The model whose weights ship with the library: the run's model if gym can resolve it
    (registry name, local checkpoint); None for a model known only to a remote endpoint."""
    from gym.models import resolve

    if run.model is None:
        return None
    try:
        return resolve(run.model, run.template, run.trust_remote_code)
    except ConfigError:
        if run.settings.endpoint is None and run.settings.policy.endpoint is None:
            raise
        return None


def ship(run: TfGrpoRun, result: RunResult, model: ModelRef | None) -> Path:
    """The final model directory: the model's files plus experiences.json (atomically, once per library),
    which records the run's retrieval_top_k so that evaluation and serving inject what training did."""
    name = f"tf_grpo-{run.config_hash[:8]}-{result.library_hash[:8]}"
    target = workspace.path("models", name, "model")
    if target.is_dir():
        return target
    with workspace.atomic_dir(target) as tmp:
        meta: dict[str, Any] = {"method": "tf_grpo", "tf_grpo_run": run.config_hash}
        if model is not None:
            _link_tree(_model_files(model), tmp)
            meta.update(template=model.template, base_model=model.base_model)
            if model.default_system is not None:  # the rollouts opened with it; serving does too
                meta["default_system"] = model.default_system
        else:  # a model behind an API: the library is all there is to ship
            meta.update(endpoint=run.settings.endpoint, model=run.model)
        workspace.atomic_write_json(tmp / "gym_model.json", meta)
        library_json = Path(result.library_file).read_text(encoding="utf-8")
        (tmp / EXPERIENCE_FILE).write_text(
            shipped_json(library_json, run.settings.retrieval_top_k), encoding="utf-8"
        )
    return target


def export(model_dir: Path, output_dir: Path) -> Path:
    """A shipped TF-GRPO model into `output_dir`: the hub-style export (gym.export) when it has weights;
    a model behind an API has none, so its library and metadata are copied as they are."""
    from gym.export import EXPORTED, MARKER, export_model, replace_dir

    if (Path(model_dir) / "config.json").is_file():
        return export_model(Path(model_dir), Path(output_dir))
    with replace_dir(Path(output_dir)) as tmp:
        for path in sorted(Path(model_dir).iterdir()):
            if path.is_file():
                shutil.copy2(path, tmp / path.name)
        meta = json.loads((tmp / MARKER).read_text(encoding="utf-8"))
        workspace.atomic_write_json(tmp / MARKER, {**meta, EXPORTED: "gym export"})
    return Path(output_dir).expanduser().resolve()


def link_model_files(model: ModelRef, target: Path) -> None:
    """The model's files (a local folder, or its hub snapshot) linked, or copied, into `target`."""
    _link_tree(_model_files(model), target)


def _model_files(model: ModelRef) -> Path:
    local = Path(model.path)
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model.path, revision=model.revision))


def _link_tree(source: Path, target: Path) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_dir() or path.name == EXPERIENCE_FILE or path.name.startswith("."):
            continue
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path.resolve(), dest)  # weights can be gigabytes: share them where possible
        except OSError:
            shutil.copy2(path, dest)


def train_result(run: TfGrpoRun, result: RunResult, model_dir: Path) -> TrainResult:
    """The method's TrainResult (no weights trained: no losses, no trainable parameters)."""
    return TrainResult(
        method="tf_grpo",
        digest=run.config_hash,
        stage_dir=run.run_dir,
        model_dir=str(model_dir),
        global_step=result.steps,
        losses=[],
        trainable_params=0,
        total_params=0,
        train_seconds=result.seconds,
        metric_name="mean_at_k" if result.mean_at_k else "train_reward",
        metric_first=result.mean_at_k[0] if result.mean_at_k else result.train_reward_first,
        metric_last=result.mean_at_k[-1] if result.mean_at_k else result.train_reward_last,
    )


def summary(
    run: TfGrpoRun,
    result: RunResult,
    model_dir: str,
    registered: dict[str, Any],
    mlflow_run_id: str,
    flow_run_id: str | None,
) -> dict[str, Any]:
    """The flow's summary: the keys every training flow reports, plus the library's and the LLM bill's."""
    from gym.summary import summarize

    stage = train_result(run, result, Path(model_dir))
    out = summarize({"tf_grpo": stage}, None, None, registered, mlflow_run_id, model_dir, flow_run_id)
    eval_k = run.settings.eval_samples if result.mean_at_k else None
    return {**out, **summary_extras(result), "eval_k": eval_k}


def summary_extras(result: RunResult) -> dict[str, Any]:
    """What a TF-GRPO run adds to the flow's summary line."""
    return {
        "library_size": result.library_size,
        "library_version": result.library_version,
        "library_hash": result.library_hash,
        "llm_calls": result.llm_calls,
        "paid_calls": result.paid_calls,
        "tokens": result.tokens,
        "cost_usd": result.cost_usd,
        "degraded_steps": result.degraded_steps,
        "steps": result.steps,
        "mean_at_k": result.mean_at_k,
        "pass_at_k": result.pass_at_k,
        "run_dir": result.run_dir,
    }


def settings_from(config: TrainConfig, settings: TfGrpoSettings | None = None) -> TfGrpoSettings:
    """TF-GRPO settings for a generic training config: its epochs and seed over the paper defaults
    (its max_steps is the run's, not the settings': `max_steps_of`)."""
    base = settings or TfGrpoSettings()
    update: dict[str, Any] = {"seed": config.seed}
    if config.num_train_epochs is not None:
        update["epochs"] = max(1, round(config.num_train_epochs))
    return base.model_copy(update=update)


def max_steps_of(config: TrainConfig) -> int | None:
    """A training config's max_steps as TF-GRPO's number of steps (one batch of questions each, one
    consolidation of the library), instead of the epochs; None for -1 (run num_train_epochs)."""
    return config.max_steps if config.max_steps > 0 else None


def run(
    config: TrainConfig,
    model: ModelRef,
    train_data: Path,
    eval_data: Path | None = None,
    settings: TfGrpoSettings | None = None,
) -> TrainResult:
    """gym.train.run's path for method="tf_grpo": ingested sft datasets in, shipped model out.
    `config.max_steps` caps the run at that many steps (max_steps_of), as it does the other methods."""
    s = settings_from(config, settings)
    from gym.data.ingest import load_meta

    questions = questions_from(train_data, s.max_train_questions)
    held_out = (
        questions_from(eval_data, s.max_eval_questions, setting="max_eval_questions") if eval_data else None
    )
    digest = load_meta(train_data)["digest"]
    where = model.path if Path(model.path).is_dir() else model.name  # a built or trained model: its folder
    steps = max_steps_of(config)
    prepared = prepare(s, where, questions, digest, held_out, model.template, model.trust_remote_code, steps)
    result = train(runtime(prepared), questions, held_out, initial=prepared.start, max_steps=steps)
    return train_result(prepared, result, ship(prepared, result, model))


def build_trainer(**_: Any) -> Any:
    """The METHODS entry: Training-Free GRPO has no TRL trainer (no weights to train)."""
    raise ConfigError("tf_grpo trains no weights: gym.train.run hands it to gym.train.tf_grpo.run")


def initial_library(
    settings: TfGrpoSettings,
) -> tuple[Library | None, dict[str, str | None] | None, Path | None]:
    """The library given to start from: `<experience_lib_path>/experiences.json` when it already exists,
    the run it records as its writer, and the folder of the versions written beside it (prepare's
    `with_start` decides whether the run starts from it, or resumes the run that wrote it)."""
    if settings.experience_lib_path:
        folder = Path(settings.experience_lib_path)
        existing = folder / EXPERIENCE_FILE
        if existing.is_file():
            return Library.load(existing), written_by(existing), folder / "versions"
    return None, None, None
