"""Preflight: reject a flow's bad inputs in about a second, before any model is built or loaded.

    from gym.preflight import check
    check(TrainFlowConfig(dataset="my_pairs.jsonl"))     # raises ConfigError / DataError

Checks what can be checked without doing the work: every training method is implemented, the
model name resolves (registry name, local folder, registered MLflow version, or hub id present
in the cache when offline) with a known chat template, and every dataset named by the config
resolves and holds the record kind its consumer trains on (the format is read from the first
record), a SQLite MLflow store can be created where the config puts it, and the output_dir is one
gym may write (new, empty, or an export gym wrote). Errors name the config field, so `--<field>` is
what to fix. A record that is broken further into a file is reported by ingest, which flows run
before loading any model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

from pydantic import BaseModel

from gym import secrets
from gym.errors import ConfigError, DataError

# Uses of a dataset other than training, and the record kind each reads.
USE_KIND = {"exact_match": "sft"}
SFT_PROMPTS = ("sft", "prompt")  # online RL reads an sft dataset's records as prompts with their answers


class FlowInputs(Protocol):
    """What a flow config exposes for preflight (gym.pipeline.FlowConfig does)."""

    model: str
    template: str | None

    def dataset_uses(self) -> Mapping[str, tuple[str, str]]: ...


def stages(config: BaseModel) -> dict[str, Any]:
    """The config's training stages: field name -> TrainConfig."""
    from gym.train.config import TrainConfig

    return {name: value for name, value in config if isinstance(value, TrainConfig)}


def check_methods(config: BaseModel) -> None:
    from gym.train import METHODS

    for field, stage in stages(config).items():
        if stage.method not in METHODS:
            raise ConfigError(
                f"{field}.method: {stage.method!r} is not implemented yet; available: {', '.join(METHODS)}"
            )
        check_speed(field, stage)
        check_precision(field, stage)
        check_online(field, stage, getattr(config, "model", None))
        check_method(field, stage, getattr(config, "model", None))
        check_distributed(field, stage)
        check_schedule(field, stage)
        check_optim(field, stage)


def check_speed(field: str, stage: Any) -> None:
    """Speed options this machine or method can't honour (only when any was asked for: the defaults
    are always valid, and checking them would import torch in a run served from cache)."""
    from gym.train import speed

    if stage.speed != speed.SpeedSettings():
        try:
            speed.resolve(stage)
        except ConfigError as exc:
            raise ConfigError(f"{field}.speed: {exc}") from exc


def check_precision(field: str, stage: Any) -> None:
    """pure_bf16 where bf16 can't run (only when it was asked for: torch is imported only then)."""
    if stage.pure_bf16:
        from gym.train import precision

        try:
            precision.resolve(stage)
        except ConfigError as exc:
            raise ConfigError(f"{field}.{exc}") from exc


def check_distributed(field: str, stage: Any) -> None:
    """A number of processes the method or machine can't train on (only when one was asked for)."""
    if stage.distributed.num_processes != "auto":
        from gym.train import distributed

        try:
            distributed.resolve(stage)
        except ConfigError as exc:
            raise ConfigError(f"{field}.{exc}") from None


# What transformers passes every scheduler itself: not the user's to set in lr_scheduler_kwargs.
SCHEDULER_OWN = ("optimizer", "num_warmup_steps", "num_training_steps", "last_epoch")
# Schedulers whose arguments are all optional, one of which must be given all the same.
ONE_OF = {
    "cosine_with_min_lr": ("min_lr", "min_lr_rate"),
    "cosine_warmup_with_min_lr": ("min_lr", "min_lr_rate"),
}


def check_schedule(field: str, stage: Any) -> None:
    """A scheduler transformers doesn't have, or arguments its scheduler doesn't take (only when other
    than the default cosine without arguments: checking imports transformers)."""
    if stage.lr_scheduler_type == "cosine" and not stage.lr_scheduler_kwargs:
        return
    import inspect

    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION
    from transformers.trainer_utils import SchedulerType

    from gym.train.common import EVAL_SCHEDULERS

    names = [t.value for t in TYPE_TO_SCHEDULER_FUNCTION]
    if stage.lr_scheduler_type not in names:
        raise ConfigError(
            f"{field}.lr_scheduler_type: {stage.lr_scheduler_type!r} is not a transformers scheduler; "
            f"choose from {', '.join(names)}"
        )
    name, given = stage.lr_scheduler_type, set(stage.lr_scheduler_kwargs)
    if name in EVAL_SCHEDULERS and (stage.eval_strategy or ("steps" if stage.eval_steps else "no")) == "no":
        raise ConfigError(f"{field}.lr_scheduler_type: {EVAL_SCHEDULERS[name]}")  # data: gym.train.plan
    function = cast("Callable[..., Any]", TYPE_TO_SCHEDULER_FUNCTION[SchedulerType(name)])
    params = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    takes = [n for n in params if n not in SCHEDULER_OWN]
    if unknown := sorted(given - set(takes)):
        raise ConfigError(
            f"{field}.lr_scheduler_kwargs: {name} takes {', '.join(takes) or 'no arguments'}, "
            f"not {', '.join(unknown)}"
        )
    missing = [n for n in takes if params[n].default is inspect.Parameter.empty and n not in given]
    one_of = ONE_OF.get(name, ())
    if one_of and len(given & set(one_of)) != 1:
        missing.append(f"exactly one of {' or '.join(one_of)}")
    if missing:
        raise ConfigError(
            f"{field}.lr_scheduler_kwargs: {name} needs {', '.join(missing)} (lr_scheduler_kwargs is a "
            "mapping: --train.lr_scheduler_kwargs '{\"name\": value}')"
        )


def check_optim(field: str, stage: Any) -> None:
    """An optimizer name transformers doesn't have (it failed inside the train task, after the data
    work, with a traceback). Only when one was named: checking imports transformers."""
    if stage.optim is None:
        return
    import difflib

    from transformers.training_args import OptimizerNames

    names = [o.value for o in OptimizerNames]
    if stage.optim not in names:
        close = difflib.get_close_matches(stage.optim, names, n=3)
        raise ConfigError(
            f"{field}.optim: {stage.optim!r} is not a transformers optimizer"
            + (f" (did you mean {' or '.join(close)}?)" if close else "")
            + f"; choose from {', '.join(names)}"
        )


def _concrete(stage: Any, model: str | None) -> Any:
    """The stage with the defaults training fills in (the registry model's, then the method's)."""
    from gym.registry import load_models
    from gym.train.config import with_defaults

    spec = load_models().get(model or "")
    return with_defaults(stage, dict(spec.train_defaults) if spec else {})


def check_method(field: str, stage: Any, model: str | None = None) -> None:
    """The method's own checks of its settings (KTO's batch of two or more, DPO's loss...), with the
    defaults training fills in: they failed only once the train task ran, after ingest and tokenization."""
    from gym.train import method_check

    try:
        method_check(_concrete(stage, model))
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None


def check_online(field: str, stage: Any, model: str | None = None) -> None:
    """Online RL stages: rewards that load, a batch of whole groups, an environment, vLLM if asked.
    The batch is the one training will use: unset, it is the registry model's or the method's default
    (a group size that did not divide the default failed only when the stage began, after warm-start
    SFT had trained)."""
    from gym.train import rl_common
    from gym.train.rl_config import ONLINE_METHODS

    if stage.method not in ONLINE_METHODS:
        return
    try:
        rl_common.check(_concrete(stage, model))
    except ConfigError as exc:
        raise ConfigError(f"{field}.rl: {exc}") from None


def check_val_size(config: Any) -> None:
    """`val_size` where the run has another source of held-out data, or none that it could use."""
    val_size = getattr(config, "val_size", 0)
    named = getattr(config, "method_eval_dataset", None)
    if val_size and named:
        raise ConfigError(
            f"val_size: {val_size:g} holds out part of the training data, and method_eval_dataset {named!r} "
            "names held-out data too; give one of them"
        )
    stage = getattr(config, "train", None)
    if val_size and stage is not None and stage.method == "tf_grpo":
        raise ConfigError(
            "val_size: Training-Free GRPO reads held-out questions from eval_dataset; give that"
        )


def check_mix(config: Any) -> None:
    """`data.interleave_probs`: read by an interleaving mix_strategy, one share per dataset of each mix a
    training stage tokenizes (held-out exact-match data is not drawn from)."""
    data = getattr(config, "data", None)
    probs = getattr(data, "interleave_probs", None)
    if data is None or probs is None:
        return
    if data.mix_strategy == "concat":
        raise ConfigError(
            "data.interleave_probs: the shares are read when data.mix_strategy interleaves "
            "(interleave_under or interleave_over); it is concat, which takes every record of each dataset"
        )
    from gym.data.mix import names

    for field, (name, use) in config.dataset_uses().items():
        parts = names(name)
        if use not in USE_KIND and len(parts) > 1 and len(parts) != len(probs):  # data a stage tokenizes
            raise ConfigError(
                f"data.interleave_probs: {len(probs)} share(s), but {field} mixes {len(parts)} datasets "
                f"({name}); give one share per dataset, in the same order"
            )


def check_model(name: str, template: str | None, trust_remote_code: bool = False) -> None:
    from gym.models import check
    from gym.templates import load_template

    if template is not None:
        try:
            load_template(template)
        except ConfigError as exc:
            raise ConfigError(f"template: {exc}") from None
    try:
        check(name, template, trust_remote_code)
    except ConfigError as exc:
        raise ConfigError(f"model: {exc}") from None


def check_endpoints(config: Any) -> None:
    """The LLM endpoints a TF-GRPO run calls answer at their host and port: with nothing there, every
    call failed, after its retries, and the run ended saying so only after all of them."""
    from gym.services import unreachable

    roles = {"endpoint": getattr(config, "endpoint", None)}
    roles |= {f"{r}.endpoint": getattr(getattr(config, r, None), "endpoint", None) for r in TF_GRPO_ROLES}
    for field, url in roles.items():
        if url and (problem := unreachable(str(url))):
            raise ConfigError(
                f"{field}: {secrets.scrub(url)}: {problem}; start the server, or point --{field} at one that "
                "runs"
            )
    check_reply_room(config)


def check_reply_room(config: Any) -> None:
    """A role's max_tokens below the context its endpoint reports (gym serve's and vLLM's `max_model_len`
    in /v1/models): at or above it, no prompt fits and the server refuses every call of the run (gym-tiny's
    512-token window and the policy's default 512 ended a run after all its calls)."""
    if not hasattr(config, "role"):  # TF-GRPO configs only
        return
    from gym.tfgrpo.clients import served_context

    used = [r for r in TF_GRPO_ROLES if r != "judge" or getattr(config, "reward", None) == "judge"]
    for name in used:
        try:
            role = config.role(name, getattr(config, "model", None))
        except ConfigError:  # a role with no model: said where the run starts
            continue
        context = served_context(role.endpoint, role.model) if role.endpoint else None
        if context is not None and role.max_tokens >= context:
            raise ConfigError(
                f"{name}.max_tokens: {role.max_tokens} tokens to generate leave no room for a prompt in the "
                f"{context}-token context {role.model!r} has at {secrets.scrub(role.endpoint or '')} (its "
                f"/v1/models max_model_len): give --{name}.max_tokens below it (e.g. {max(1, context // 4)})"
            )


def check_adapters(config: Any) -> None:
    """LoRA target modules and freeze layers the user named, against the model's architecture (its config
    alone, no weights): a name it lacks failed in the train task, after the data work and the held-out
    evaluation had loaded the model."""
    from gym.train.adapters import HEADED_METHODS, NOTHING_TO_FREEZE
    from gym.train.config import LORA_TYPES

    for field, stage in stages(config).items():
        new_rows = getattr(config, "new_special_tokens", None)  # their embedding rows train under freeze
        nothing = not (stage.freeze.layers or stage.freeze.extra_modules or new_rows)
        if stage.finetuning_type == "freeze" and nothing and stage.method not in HEADED_METHODS:
            raise ConfigError(f"{field}.{NOTHING_TO_FREEZE}")  # found in the train task, after the data work
        targets = stage.finetuning_type in LORA_TYPES and stage.lora.target_modules
        chosen = {"layers", "modules", "extra_modules"} & stage.freeze.model_fields_set
        layers = stage.finetuning_type == "freeze" and bool(chosen)
        if not targets and not layers:
            continue
        from gym.models import resolve
        from gym.train import adapters

        try:
            adapters.check_modules(stage, resolve(config.model, config.template))
        except ConfigError as exc:
            raise ConfigError(f"{field}.{exc}") from None


def check_dataset(field: str, name: str, use: str) -> None:
    """Each dataset `name` names (one, or a comma-separated list) resolves, and holds the record kind
    `use` (a method, or `exact_match`) reads when its format is known without reading the whole
    dataset (registry entries, local files)."""
    from gym.data.formats import KIND_COLUMNS, KIND_FORMATS, METHOD_KIND, methods_for
    from gym.data.mix import check_kinds, names
    from gym.data.registry import resolve_dataset

    need = {**METHOD_KIND, **USE_KIND}.get(use)
    try:
        parts = names(name)
        specs = [resolve_dataset(part) for part in parts]
    except DataError as exc:
        raise DataError(f"{field}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None
    for part, spec in zip(parts, specs, strict=True):
        if need is not None and spec.kind not in (None, need) and (spec.kind, need) != SFT_PROMPTS:
            is_method = use in METHOD_KIND
            takes = ", ".join(methods_for(spec.kind))
            other = f", or a method that trains on {spec.kind} data ({takes})" if is_method and takes else ""
            if use == "exact_match":  # LLaMA-Factory's eval_dataset is a stage's held-out data
                other = (
                    " (a stage's own held-out data, LLaMA-Factory's eval_dataset, goes in "
                    "method_eval_dataset; dpo_eval_dataset in sft_then_dpo)"
                )
            reader = f"method {use!r}" if is_method else use.replace("_", " ")
            raise ConfigError(
                f"{field}: {reader} needs {need} records (format {KIND_FORMATS[need]}: records with "
                f"{KIND_COLUMNS[need]}), but dataset "
                f"{part!r} holds {spec.kind} records; pick a {need} dataset{other}"
            )
    try:
        check_kinds({part: spec.kind for part, spec in zip(parts, specs, strict=True) if spec.kind})
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None


TF_GRPO_ROLES = ("policy", "optimizer", "judge")  # gym.tfgrpo.config's roles, each with its endpoint


def check(config: FlowInputs) -> None:
    """Raise the first problem found in a flow config (a GymError naming the field), else return."""
    if isinstance(config, BaseModel):
        check_methods(config)
    if not getattr(config, "model_is_remote", False):  # a model known only to an API endpoint (TF-GRPO)
        check_model(config.model, config.template, bool(getattr(config, "trust_remote_code", False)))
        check_adapters(config)
    check_endpoints(config)
    for field, (name, use) in config.dataset_uses().items():
        check_dataset(field, name, use)
    check_val_size(config)
    check_mix(config)
    from gym.promotion import check_flow_metric

    check_flow_metric(config)
    output = getattr(config, "output", None)
    if output is not None:
        from gym.tracking import check_store

        check_store(output.tracking_uri)
        check_output_dir(getattr(output, "output_dir", None))  # evaluation exports nothing
        from gym.registration import check_names

        check_names(getattr(output, "register_as", None), getattr(output, "alias", None))


def check_output_dir(output_dir: str | None) -> None:
    """The folder a flow exports its final model to is one gym may write (it is checked again, and
    written, only after training)."""
    if output_dir:
        from pathlib import Path

        from gym.export import check_output_dir as check_dir

        try:
            check_dir(Path(output_dir))
        except ConfigError as exc:
            raise ConfigError(f"output.output_dir: {exc}") from None
