"""Training: one file per method, one dispatch table, one `run` that every method goes through.

    result = gym.train.run(config, model_ref, train_data_dir, eval_data_dir)

`run` checks the data suits the method, makes the config concrete (defaults; QLoRA bit width and
optimizer; DPO-style reference mode; what speed settings' `auto` turned on: printed and recorded in
`TrainResult.choices`), names the stage directory by the digest of its inputs, resumes from the last
checkpoint when a previous attempt was interrupted, adapts the model (gym.train.adapters: full, freeze,
the LoRA family), saves the final model (merged, for adapters) through an atomic rename, and returns a
`TrainResult` of references and numbers, with the method's main signal (its module's optional `signal`,
else the training loss).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from gym import errors, workspace
from gym.data.formats import require_kind
from gym.data.ingest import Stage, dataset_folder, load_meta, load_saved, origin
from gym.data.tokenize import data_notes
from gym.errors import ConfigError
from gym.hashing import hash_obj
from gym.models import MODEL_META, ModelRef, load_model, load_tokenizer
from gym.rewards.base import code_identity
from gym.rewards.base import identity as reward_identity
from gym.templates import with_default_system
from gym.train import (
    adapters,
    distributed,
    dpo,
    gspo,
    kto,
    memory,
    orpo,
    pairs,
    ppo,
    precision,
    pt,
    quant,
    reference,
    rl_common,
    rm,
    rope,
    sft,
    simpo,
    speed,
    tf_grpo,
)
from gym.train.common import (
    TrainResult,
    check_eval_schedule,
    check_hardware,
    count_params,
    evals_from,
    losses_from,
    tied_keys_not_missing,
)
from gym.train.config import FINETUNING_TYPES, LORA_TYPES, TrainConfig, hyperparameters, with_defaults
from gym.train.grpo import online as grpo_online
from gym.train.rl_config import ONLINE_METHODS

METHODS: dict[str, Callable[..., Any]] = {
    "sft": sft.build_trainer,
    "pt": pt.build_trainer,
    "dpo": dpo.build_trainer,
    "ipo": dpo.build_trainer,
    "cdpo": dpo.build_trainer,
    "hinge": dpo.build_trainer,
    "kto": kto.build_trainer,
    "orpo": orpo.build_trainer,
    "simpo": simpo.build_trainer,
    "rm": rm.build_trainer,
    "ppo": ppo.build_trainer,
    "grpo": grpo_online.build_trainer,
    "gspo": gspo.build_trainer,
    "tf_grpo": tf_grpo.build_trainer,  # trains no weights: `run` hands it to gym.train.tf_grpo.run
}
# Methods whose main signal is an eval metric rather than the loss: method -> metric name.
METRICS = {m: rl_common.METRIC for m in ("ppo", "grpo", "gspo")}

__all__ = ["METHODS", "TrainConfig", "TrainResult", "run", "stage_digest"]


def stage_digest(config: TrainConfig, model: ModelRef, train_data: Path, eval_data: Path | None) -> str:
    """Digest of everything that determines a stage's output.

    Gradient checkpointing is left out: it changes memory, not the weights (recomputed activations are
    the same; tested bit for bit), and gym may choose it from the memory free at the time
    (gym.train.memory), so a run interrupted with it off resumes with it on, and the other way round.
    So are the adapter sections the stage's finetuning_type doesn't read, and the checkpoints it keeps
    (save_steps, save_total_limit).
    """
    online = config.method in ONLINE_METHODS
    # An online method's settings as it trains with them: `--train.rl.kl_coef 0.04` on GSPO (its default)
    # or `--group-size 8` on GRPO is the stage left at its defaults, and reuses it.
    rl = config.rl.resolved(config.method) if online else config.rl
    # Adapter sections the finetuning_type doesn't read (LoRA's under full, freeze's under lora...) as
    # their defaults: they change nothing trained (a note says so), so they reuse the stage.
    unread = {
        section: type(getattr(config, section))()
        for section, kinds in adapters.SECTION_TYPES.items()
        if config.finetuning_type not in kinds
    }
    # Which checkpoints a run keeps changes no weight: a run killed with save_steps 100 resumes from its
    # checkpoint when run again with save_steps 20.
    keeps = {"save_steps": 0, "save_total_limit": 0}
    inputs: dict[str, Any] = {
        "config": config.model_copy(update={"gradient_checkpointing": False, "rl": rl, **unread, **keeps}),
        "model": model.digest,
        "template": model.template,
        "train": Path(train_data).name,
        "eval": Path(eval_data).name if eval_data else None,
    }
    rewards = reward_identity(config.rl.rewards) if online else []
    if any(not isinstance(r, str) for r in rewards):  # a user's reward code or a reward model's files
        inputs["rewards"] = rewards
    if online and rl.environment:  # a multi-turn environment's code, as a reward function's
        inputs["environment"] = code_identity(rl.environment)
    return hash_obj(inputs)


def last_checkpoint(directory: Path, skipped: list[tuple[Path, str]] | None = None) -> str | None:
    """The newest complete checkpoint under `directory` whose files can be read.

    The Trainer writes trainer_state.json last, so a checkpoint without it was cut short
    (the process died while saving) and is skipped. So is one whose weights, optimizer state or
    trainer_state.json can't be read (cut short by a full disk, a kill while the file system wrote
    it, a hand edit): resuming from it failed with the loader's traceback, though an older one was
    whole. Those go into `skipped` (newest first, with what is wrong), for the caller to say; their
    files are left as they are (the run saves a new checkpoint of that step over it when it gets there).
    """
    if not directory.is_dir():
        return None
    steps = []
    for child in directory.iterdir():
        match = re.fullmatch(r"checkpoint-(\d+)", child.name)
        if match and (child / "trainer_state.json").is_file():
            steps.append((int(match.group(1)), child))
    for _, child in sorted(steps, reverse=True):
        problem = _checkpoint_problem(child)
        if problem is None:
            return str(child)
        if skipped is not None:
            skipped.append((child, problem))
    return None


def _checkpoint_problem(checkpoint: Path) -> str | None:
    """What can't be read in a checkpoint, else None. Cheap: safetensors headers against file sizes
    (gym.workspace.weights_problem, in the checkpoint and its adapter sub-folders), torch's files
    (optimizer, scheduler, RNG state: zip archives) by their closing directory, trainer_state.json parsed."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"trainer_state.json can't be read ({exc})"
    for folder in [checkpoint, *(p for p in checkpoint.iterdir() if p.is_dir())]:
        if problem := workspace.weights_problem(folder):
            return problem if folder == checkpoint else f"{folder.name}/{problem}"
    for file in sorted(checkpoint.glob("*.pt")) + sorted(checkpoint.glob("*.pth")):
        if not zipfile.is_zipfile(file):  # torch.save writes a zip; one cut short lacks its end
            return f"{file.name} is cut short or damaged"
    return None


def _finished(checkpoint: str) -> bool:
    """Whether `checkpoint` was saved at the last step of its training."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
    return bool(state.get("max_steps")) and int(state.get("global_step", 0)) >= int(state["max_steps"])


def run(
    config: TrainConfig | dict[str, Any],
    model: ModelRef,
    train_data: str | Path | Any,
    eval_data: str | Path | Any | None = None,
) -> TrainResult:
    """Train one stage, or return it finished (or resume it) from its content-addressed directory.

    `config` may be a dict of TrainConfig fields; `train_data` and `eval_data` are tokenized dataset
    folders (gym.data.tokenize.tokenize's, or its TokenizeResult itself), ingested ones for tf_grpo."""
    if isinstance(config, dict):
        config = TrainConfig.model_validate(config)
    elif not isinstance(config, TrainConfig):
        raise ConfigError(f"config is {config!r:.60}: pass a gym.train.TrainConfig, or a dict of its fields")
    if not isinstance(model, ModelRef):  # a name or path, from Python: an AttributeError deep inside
        raise ConfigError(
            f"model {model!r}: pass the ModelRef that gym.models.resolve({str(model)!r}) returns, not a name"
        )
    stage: Stage = "ingested" if config.method == "tf_grpo" else "tokenized"
    train_data = dataset_folder(train_data, "train_data", stage)
    eval_data = dataset_folder(eval_data, "eval_data", stage) if eval_data is not None else None
    if config.method == "tf_grpo":  # an experience library, no weights; reads ingested (untokenized) data
        return tf_grpo.run(config, model, train_data, eval_data)
    if config.method not in METHODS:
        raise ConfigError(f"unknown method {config.method!r}; available: {', '.join(METHODS)}")
    if config.finetuning_type not in FINETUNING_TYPES:
        raise ConfigError(
            f"unknown finetuning_type {config.finetuning_type!r}; available: {', '.join(FINETUNING_TYPES)}"
        )
    meta = load_meta(train_data, "tokenized")
    require_kind(meta["result"]["kind"], config.method, str(train_data))
    n_eval = load_meta(eval_data, "tokenized")["result"]["num_records"] if eval_data else 0
    cutoff = meta["settings"]["cutoff_len"]
    longest = meta["result"].get("stats", {}).get("max_len")
    unused = adapters.unused_settings(config)  # the user's settings: plan fills in the rest
    config, choices = plan(config, model, meta["result"]["num_records"], n_eval, cutoff, longest)
    rl_common.check_prompt_data(config, model, train_data, eval_data, cutoff)  # before any model loads
    kind = meta["result"]["kind"]
    answerless = pairs.answer_room(
        config.method, kind, Path(train_data), Path(eval_data) if eval_data else None, cutoff
    )
    digest = stage_digest(config, model, train_data, eval_data)
    stage_dir = workspace.path("models", f"{config.method}-{digest}")
    stage_dir.mkdir(parents=True, exist_ok=True)
    result_file = stage_dir / "result.json"
    with FileLock(str(stage_dir) + ".lock"):
        if result_file.is_file():
            done = _finished_stage(config.method, result_file, stage_dir)
            if done is not None:
                return done
        for what, choice in choices.items():
            print(f"gym: {config.method}: {what}: {choice}", file=sys.stderr, flush=True)
        longest_trained = min(longest or 0, cutoff)  # what training sees: cut to cutoff_len
        notes = [
            unused,
            *data_notes(meta["result"], cutoff),
            *answerless,
            rope.hint(config.rope_scaling, model, longest_trained),
        ]
        for note in filter(None, notes):
            print(f"gym: {config.method}: note: {note}", file=sys.stderr, flush=True)
        held_out = Path(eval_data) if eval_data else None
        if distributed.needed(config):
            result = distributed.launch(config, model, Path(train_data), held_out, digest, stage_dir, cutoff)
        else:
            trained = _train(config, model, Path(train_data), held_out, digest, stage_dir, cutoff)
            assert trained is not None  # one process: the main one
            result = trained
        facts = {"choices": choices, "hyperparameters": hyperparameters(config)}
        result = result.model_copy(update={**facts, "datasets": trained_on(train_data, eval_data)})
        workspace.atomic_write_text(result_file, result.model_dump_json(indent=2))
        return result


def trained_on(train_data: Path, eval_data: Path | None) -> dict[str, dict[str, str | None]]:
    """The tokenized data's own datasets, by role: the name the user gave each one and its ingested
    records' digest (a model card's Datasets)."""
    out: dict[str, dict[str, str | None]] = {}
    for role, data in (("dataset", train_data), ("eval_dataset", eval_data)):
        digest = load_meta(data).get("dataset") if data else None
        if digest:
            out[role] = {"name": origin(workspace.path("datasets", digest)), "digest": str(digest)}
    return out


def _finished_stage(method: str, result_file: Path, stage_dir: Path) -> TrainResult | None:
    """The stage's recorded result, when what it trained is still there and readable; else None, after
    saying why and clearing the way to train it again (from the last checkpoint left, if any): its
    result.json is removed, and so is a model or adapter folder whose weights can't be read (gym wrote
    it; it is written again), so that neither is served, registered or exported as finished."""
    try:
        done = rebased(TrainResult.model_validate_json(result_file.read_text(encoding="utf-8")), stage_dir)
    except (OSError, ValueError) as exc:  # written atomically: damaged by hand or by the disk
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(
            f"gym: {method}: {result_file} can't be read ({first}): training the stage again",
            file=sys.stderr,
        )
        result_file.unlink()
        return None
    problems = [(Path(d), p) for d in (done.model_dir, done.adapter_dir) if d and (p := _saved(Path(d)))]
    if not problems:
        return done
    folder, problem = next(((f, p) for f, p in problems if p != GONE), problems[0])
    if problem == GONE:  # deleted by hand: train again (from the last checkpoint left, if any)
        print(f"gym: {method}: {folder} is gone: training the stage again", file=sys.stderr)
        result_file.unlink()
        return None
    saved = [Path(d) for d in (done.model_dir, done.adapter_dir) if d and Path(d).exists()]
    print(
        f"gym: {method}: {folder} can't be read ({problem}): removing what the stage saved "
        f"({', '.join(f.name + '/' for f in saved)}) and training the stage again",
        file=sys.stderr,
    )
    result_file.unlink()  # first: a stage without it is unfinished, whatever happens next
    for other in saved:  # both: the model is the adapter merged, so the two are written again together
        workspace.discard(other)
    return None


GONE = "gone"


def _saved(folder: Path) -> str | None:
    """What is wrong with a stage's saved model or adapter folder, else None: GONE when it is no longer
    there (its config written beside the weights is missing), else why its weights can't be read (a file
    cut short: gym.workspace.weights_problem; a cheap check of headers against sizes)."""
    if not ((folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()):
        return GONE
    return workspace.weights_problem(folder)


def rebased(result: TrainResult, stage_dir: Path) -> TrainResult:
    """`result` with its paths in `stage_dir`: a workspace copied or moved elsewhere keeps each stage's
    result.json, whose paths still name the stage folder where it was written."""
    old = result.stage_dir
    if old == str(stage_dir):
        return result

    def moved(path: str | None) -> str | None:
        if path is None or not (path == old or path.startswith(old + "/")):
            return path
        return str(stage_dir) + path[len(old) :]

    fields = ("stage_dir", "model_dir", "adapter_dir", "resumed_from")
    return result.model_copy(update={f: moved(getattr(result, f)) for f in fields})


def plan(
    config: TrainConfig,
    model: ModelRef,
    n_train: int,
    n_eval: int,
    cutoff_len: int | None = None,
    longest: int | None = None,
) -> tuple[TrainConfig, dict[str, str]]:
    """The config made concrete before any model loads: defaults, then the choices gym makes itself
    (QLoRA bit width and optimizer, gradient checkpointing from the memory a step of the data's `longest`
    sequences needs, the reference mode of DPO-style methods, RoPE scaling for the data's `cutoff_len`),
    with each choice in words.
    """
    config = with_defaults(config, model.train_defaults)
    config = config.model_copy(update={"lora": adapters.lora_settings(config)})
    config, precision_choices = check_hardware(config)
    check_eval_schedule(config, n_eval)
    rl_common.check(config)
    rope.check(config)
    adapters.check(config, model)
    method_check(config)
    config, quant_choices = quant.resolve(config, model, longest, cutoff_len)
    config, memory_choices = memory.resolve(config, model, longest, cutoff_len)  # qlora's is already on
    config, reference_choices = reference.choose(config, n_train, n_eval)
    config = distributed.resolve(config)
    rl_common.check_data(config, n_train)
    rope_choice = {}
    if config.rope_scaling and cutoff_len is not None:
        rope_choice["rope_scaling"] = str(rope.plan(config.rope_scaling, model, cutoff_len)[1])
    choices = {
        **precision_choices,
        **precision.choice(config, model),
        **quant_choices,
        **memory_choices,
        **reference_choices,
        **speed.choices(config),
    }
    return config, {**choices, **rope_choice, **adapters.new_rows(config, model)}


def build_trainer(
    config: TrainConfig,
    model_ref: ModelRef,
    train_ds: Any,
    eval_ds: Any | None,
    output_dir: Path,
    stage_dir: Path,
    max_length: int,
) -> tuple[Any, Any, Callable[..., Any], dict[str, Any]]:
    """The stage's model, adapted, in its method's trainer, as `run` trains it (benchmarks measure this
    too): (trainer, tokenizer, the model loader the final merge reuses, RoPE stretch arguments).
    `config` is concrete (`plan`'s output); the datasets are tokenized `datasets.Dataset`s.
    """
    from transformers import set_seed

    tokenizer = load_tokenizer(model_ref)
    set_seed(config.seed)  # new adapter weights (and a new reward head) start the same in every attempt
    # A method module may define `load_model(model_ref, **kwargs)`: its own model class (rm: a reward model).
    # RoPE stretched to the data's cutoff_len (gym.train.rope), in the final merge's base too; the saved
    # tokenizer then takes sequences that long (LLaMA-Factory's model_max_length)
    stretch = rope.plan(config.rope_scaling, model_ref, max_length)[0]
    loader = functools.partial(_hook(config.method, "load_model") or load_model, **stretch)
    if stretch:
        tokenizer.model_max_length = max(tokenizer.model_max_length, max_length)
    load = {"dtype": precision.load_dtype(config), **quant.load_kwargs(config)}  # QLoRA's dtype wins
    model = loader(model_ref, **load, **speed.load_options(speed.resolve(config)))
    # A method module may set APPLIES_ADAPTER: its trainer gets the LoRA config and wraps the model itself.
    wrap = not getattr(sys.modules[METHODS[config.method].__module__], "APPLIES_ADAPTER", False)
    model = adapters.adapt(model, config, model_ref, stage_dir, wrap=wrap)
    if wrap or config.finetuning_type not in LORA_TYPES:  # else the trainer adds (and upcasts) the adapter
        precision.upcast_trainable(model, config)
    trainer = METHODS[config.method](
        model=model,
        tokenizer=tokenizer,
        config=config,
        train_data=train_ds,
        eval_data=eval_ds,
        output_dir=output_dir,
        peft_config=adapters.trainer_peft_config(model, config, model_ref, wrapped=wrap),
        max_length=max_length,
    )
    adapters.attach_optimizer(trainer, config)
    speed.liger_from_the_start(trainer)  # the evaluation before training runs Liger's loss too
    return trainer, tokenizer, loader, stretch


def _train(
    config: TrainConfig,
    model_ref: ModelRef,
    train_data: Path,
    eval_data: Path | None,
    digest: str,
    stage_dir: Path,
    max_length: int,
) -> TrainResult | None:
    """Train the stage in this process; None in the other processes of a distributed stage, where the
    main process saves and reports."""
    # tokenized data cut short or edited: one line naming its folder (delete it: gym tokenizes it again)
    train_ds = load_saved(train_data)
    eval_ds = load_saved(eval_data) if eval_data else None
    checkpoints = stage_dir / "checkpoints"
    trainer, tokenizer, loader, stretch = build_trainer(
        config, model_ref, train_ds, eval_ds, checkpoints, stage_dir, max_length
    )
    _report_progress(trainer, config.method)
    # the system message the data's conversations opened with, else the one the base already expects
    system = load_meta(train_data).get("settings", {}).get("default_system")
    saved = model_ref.model_copy(
        update={"default_system": model_ref.default_system if system is None else system}
    )
    _checkpoints_know_their_model(trainer, saved)
    skipped: list[tuple[Path, str]] = []
    resume = last_checkpoint(checkpoints, skipped)
    if skipped and trainer.is_world_process_zero():
        then = f"resuming from {Path(resume).name}" if resume else "starting the stage over"
        for checkpoint, problem in skipped:
            print(
                f"gym: {config.method}: {checkpoint} can't be used ({problem}): {then} (its files are left "
                "as they are; the run saves that step's checkpoint again when it gets there)",
                file=sys.stderr,
            )
    if resume:
        adapters.restore_adapter(trainer.model, resume)
    before_file = stage_dir / "eval_before.json"
    eval_before: dict[str, float] = {}
    main = trainer.is_world_process_zero()
    at_start = None
    if eval_ds is not None:
        if before_file.is_file():
            eval_before = json.loads(before_file.read_text())
        elif trainer.args.world_size > 1:
            at_start = _evaluate_at_start(trainer, before_file if main else None)
        else:
            eval_before = _numbers(trainer.evaluate())
            workspace.atomic_write_json(before_file, eval_before)
    start = time.perf_counter()
    if resume and _finished(resume):
        # The process ended after the last step's checkpoint, before the final save. transformers would
        # resume it by training one step more: take the checkpoint's weights and state as they are, and
        # the special tokens train() aligns before its first step (the saved generation_config would
        # differ from an uninterrupted run's, so registration would add a version of the same weights).
        from transformers import TrainerState
        from transformers.trainer_utils import align_special_tokens

        if hasattr(trainer.model, "config") and trainer.processing_class is not None:
            align_special_tokens(trainer.model, trainer.processing_class)
        with tied_keys_not_missing(trainer.model):
            trainer._load_from_checkpoint(resume)
        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
    else:
        with speed.gc_frozen(), tied_keys_not_missing(trainer.model), _disk_full_as_error(checkpoints):
            trainer.train(resume_from_checkpoint=resume)
    seconds = time.perf_counter() - start
    if at_start is not None:
        eval_before = at_start.metrics
    # during training (the evaluation at step 0 is eval_before; eval_after logs one more)
    evals = evals_from([e for e in trainer.state.log_history if e.get("step") != 0])
    eval_after = _numbers(trainer.evaluate()) if eval_ds is not None else {}
    if not main:
        return None
    trainable, total = count_params(trainer.model)
    with _disk_full_as_error(stage_dir):
        final = _save_final(trainer, tokenizer, saved, stage_dir, loader, stretch, max_length)
    model_dir, adapter_dir = final
    # Trained weights are written 0600 (safetensors); a model folder is meant to be read by others
    # (served, exported, other users' jobs), as gym-tiny and exports are.
    for folder in (model_dir, adapter_dir, checkpoints):
        if folder is not None and folder.is_dir():
            workspace.shareable(folder)
    signal = _signal(config.method, eval_before, eval_after, trainer.state.log_history)
    for note in rl_common.signal_warnings(config.method, trainer.state.log_history):
        logging.getLogger("gym.train").warning(note)  # on the console as `gym: warning: ...`
    result = TrainResult(
        method=config.method,
        digest=digest,
        stage_dir=str(stage_dir),
        model_dir=str(model_dir),
        adapter_dir=str(adapter_dir) if adapter_dir else None,
        global_step=trainer.state.global_step,
        losses=losses_from(trainer.state.log_history),
        evals=evals,
        eval_before=eval_before,
        eval_after=eval_after,
        trainable_params=trainable,
        total_params=total,
        resumed_from=resume,
        train_seconds=round(seconds, 3),
        tokens_seen=int(trainer.state.num_input_tokens_seen),
        tokens_at_resume=_tokens_at(resume),
        **signal,
    )
    return result


@contextlib.contextmanager
def _disk_full_as_error(where: Path) -> Iterator[None]:
    """A full disk while the trainer saves a checkpoint (OSError 28, or safetensors' own error saying so)
    as one line naming the folder: a checkpoint cut short is skipped when the run resumes."""
    try:
        yield
    except errors.GymError:
        raise
    except Exception as exc:
        if errors.disk_full(exc) is None:
            raise
        raise errors.disk_full_error(exc, where) from exc


def method_check(config: TrainConfig) -> None:
    """The method module's own checks of its settings (`check`, where it has one), before any model loads:
    gym.train.plan runs them, and gym.preflight before the flow's first task."""
    hook = _hook(config.method, "check") if config.method in METHODS else None
    if hook:
        hook(config)


def _hook(method: str, name: str) -> Callable[..., Any] | None:
    """An optional function `name` of the module defining the method's build_trainer."""
    return getattr(sys.modules[METHODS[method].__module__], name, None)


def _signal(
    method: str, eval_before: dict[str, float], eval_after: dict[str, float], history: list[dict[str, Any]]
) -> dict[str, Any]:
    """metric_name/first/last from the method module's optional `signal`, else the method's held-out
    metric in METRICS, else TrainResult's default (the training loss)."""
    hook = _hook(method, "signal")
    found = hook(eval_before, eval_after, history) if hook else None
    if found is not None:
        return {"metric_name": found.name, "metric_first": found.first, "metric_last": found.last}
    metric = METRICS.get(method)
    if metric is None:
        return {}
    if metric not in eval_after:  # no held-out prompts: the first and last logged training rewards
        logged = [float(h["reward"]) for h in history if rl_common.number(h.get("reward"))]
        return {
            "metric_name": f"train_{metric}",
            "metric_first": logged[0] if logged else None,
            "metric_last": logged[-1] if logged else None,
        }
    return {
        "metric_name": metric,
        "metric_first": eval_before.get(metric),
        "metric_last": eval_after.get(metric),
    }


def _evaluate_at_start(trainer: Any, before_file: Path | None) -> Any:
    """Several processes: the held-out evaluation before training runs as training starts (transformers'
    `eval_on_start`), recorded in `before_file` (the main process's; None on the others) as it ends.

    Not `trainer.evaluate()` before `train()`, as one process does: that prepares the model for
    evaluation only, accelerate then counts it as prepared, and `train()` skips the DDP wrapper. Each
    process trained alone on its share of every batch, gradients never averaged, and the main process
    saved what it alone had learnt.
    """
    from transformers import TrainerCallback

    class AtStart(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.metrics: dict[str, float] = {}

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0 and not self.metrics:
                self.metrics = _numbers(kwargs.get("metrics") or {})
                if before_file is not None:
                    workspace.atomic_write_json(before_file, self.metrics)

    callback = AtStart()
    trainer.add_callback(callback)
    trainer.args.eval_on_start = True
    return callback


def _tokens_at(checkpoint: str | None) -> int:
    """The tokens the Trainer had counted at `checkpoint` (0 without one): a resumed run's start."""
    state = Path(checkpoint) / "trainer_state.json" if checkpoint else None
    if state is None or not state.is_file():
        return 0
    return int(json.loads(state.read_text(encoding="utf-8")).get("num_input_tokens_seen") or 0)


def model_facts(model_ref: ModelRef) -> dict[str, Any]:
    """What gym records beside weights it wrote (MODEL_META): the chat template, the base model, the
    token ids it added, the system message the model was trained with."""
    system = model_ref.default_system
    return (
        {"template": model_ref.template, "base_model": model_ref.base_model}
        | ({"new_token_ids": model_ref.new_token_ids} if model_ref.new_token_ids else {})
        | ({"default_system": system} if system is not None else {})
    )


def _checkpoints_know_their_model(trainer: Any, model_ref: ModelRef) -> None:
    """Each checkpoint gets gym's facts of the model it trains (MODEL_META), as the final model/ has
    them: a checkpoint served, evaluated or exported (an interrupted run's, or an earlier step's) was
    prompted without the system message it was trained with, and with its tokenizer's template."""
    from transformers import TrainerCallback

    facts = model_facts(model_ref)

    class Facts(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if state.is_world_process_zero and folder.is_dir():
                workspace.atomic_write_json(folder / MODEL_META, facts)

    trainer.add_callback(Facts())


def _report_progress(trainer: Any, stage: str) -> None:
    """A progress bar (and the per-step log on the `gym.train` logger) instead of printed log dicts."""
    from transformers import PrinterCallback

    from gym.train.progress import ProgressCallback, StepsFromArgs

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(ProgressCallback(stage))
    trainer.add_callback(StepsFromArgs())


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def _save_final(
    trainer: Any,
    tokenizer: Any,
    model_ref: ModelRef,
    stage_dir: Path,
    loader: Callable[..., Any] = load_model,
    stretch: dict[str, Any] | None = None,
    max_length: int = 0,
) -> tuple[Path, Path | None]:
    """Save the trained model as a plain from_pretrained directory (adapters merged in), atomically.
    `loader` loads the base again for QLoRA's full-precision merge (the model class the stage trained);
    `stretch`, the base's RoPE scaling, is recorded beside the adapter for merges made later. A system
    message the model was trained with (`model_ref.default_system`) is recorded in gym's metadata and
    written into the saved tokenizer's chat template, so other tools that render with it add it too."""
    from peft import PeftModel

    model = trainer.model
    adapter_dir = None
    if isinstance(model, PeftModel):
        adapter_dir = stage_dir / "adapter"
        adapters.save_adapter(model, stage_dir, adapter_dir, stretch, max_length)
        if quant.is_quantized(model):
            model = quant.merge_full_precision(model_ref, adapter_dir, loader)
        else:
            model = model.merge_and_unload()
    model_dir = stage_dir / "model"
    if not model_dir.exists():
        system = model_ref.default_system
        tokenizer.chat_template = with_default_system(tokenizer.chat_template, system)
        with workspace.atomic_dir(model_dir) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            workspace.atomic_write_json(tmp / MODEL_META, model_facts(model_ref))
    return model_dir, adapter_dir
