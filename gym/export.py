"""Export a model to a hub-style directory: merged, sharded safetensors, config, generation config,
tokenizer with its chat template, a model card, and optionally GGUF notes and an Ollama Modelfile.

    gym export --model M --out DIR [--shard-size 2GB] [--dtype bfloat16] [--adapter-only] [--gguf] [--ollama]
    gym export merge.yaml       # LLaMA-Factory's export YAML (gym/cli_llamafactory_tools.py)

M is a model directory, a PEFT adapter directory (merged into its base), a training stage
directory (`models/<method>-<digest>/`), a registry name or an MLflow URI (`models:/name@alias`,
whose lineage tags fill the card). Adapters merge exactly for LoRA, rsLoRA and DoRA, and for
PiSSA/OLoRA/CorDA adapters saved in converted (plain LoRA) form; merging into a quantized base, or
an unconverted PiSSA-style adapter into its original base, would not reproduce the trained model,
so it is refused with a pointer to `--adapter-only`. The directory is staged and renamed into
place; an existing DIR is replaced only if `gym export` wrote it (not a training stage's model folder).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from gym import workspace
from gym.card import render
from gym.cli_options import ArgumentParser, flag_error
from gym.errors import ConfigError
from gym.lineage import Lineage, registry_entry
from gym.models import adapter_base, endpoint_library, require_safetensors
from gym.ollama import gguf_notes, modelfile
from gym.templates import canonical_template, load_template, split_markers, with_default_system
from gym.tfgrpo.injection import EXPERIENCE_FILE

MARKER = "gym_model.json"
# gym_model.json's keys in a folder `gym export` wrote: the name its card has, and the lineage the card
# shows (an export of the export, as of a LLaMA-Factory-style output_dir, keeps both)
EXPORTED_NAME, EXPORTED_LINEAGE = "name", "lineage"
# gym_model.json's key saying `gym export` wrote the folder: training's model folders hold the file too,
# and only an export may be replaced by another.
EXPORTED = "exported_by"
# Initialisations that rewrite the base weights: such an adapter is relative to the rewritten base.
BASE_REWRITING_INITS = ("pissa", "olora", "corda")


class ExportSettings(BaseModel):
    """What `gym export` writes besides the weights."""

    shard_size: str = Field("5GB", description="Largest safetensors shard (e.g. 500MB, 2GB).")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="The exported weights' dtype: auto keeps what the model stores (a full fine-tune of a "
        "bf16 checkpoint stores float32 master weights: bfloat16 halves them). Adapters merge first.",
    )
    adapter_only: bool = Field(False, description="Export the PEFT adapter alone, unmerged (with its card).")
    gguf: bool = Field(False, description="Add GGUF.md: how to convert with llama.cpp.")
    ollama: bool = Field(False, description="Add an Ollama Modelfile with the chat template and stop tokens.")
    trust_remote_code: bool = Field(False, description="Run Python code from the model repository.")

    @field_validator("shard_size")
    @classmethod
    def _a_size(cls, value: str) -> str:
        """What huggingface_hub's sharding reads (a number, then KB, MB, GB or TB), and more than 0."""
        found = SIZE.fullmatch(value)
        if not found or float(found[1]) <= 0:
            raise ValueError(
                f"a size above 0 with its unit: KB, MB, GB or TB, e.g. 500MB or 2GB (got {value!r})"
            )
        return value


SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:[KMGT]B)\s*", re.IGNORECASE)


@dataclass
class Source:
    """What an export reads: full weights and/or an adapter, and where its facts come from."""

    name: str
    weights: str | None  # from_pretrained directory (or hub id) of full weights
    adapter: Path | None
    base: str | None  # the adapter's base
    lineage: Lineage
    meta_dir: Path | None  # the directory holding gym_model.json / experiences.json


def locate(model: str, base: str | None = None, template: str | None = None) -> Source:
    """Find the weights, adapter and facts behind `model` (see the module docstring)."""
    if model.startswith("models:/"):
        from gym import tracking
        from gym.serve.loading import resolve_served

        served = resolve_served(model, template)
        name, _, _, tags = tracking.resolve_model_uri(model)
        lineage = Lineage.from_tags(tags)
        if lineage.default_system is None:  # registered before lineage recorded it: the model's files say
            lineage = lineage.model_copy(update={"default_system": served.ref.default_system})
        return Source(name, served.path, None, None, lineage, Path(served.path))
    local = Path(model).expanduser()
    if not local.is_dir():
        from gym.serve.loading import resolve_served

        served = resolve_served(model, template)  # a registry name
        lineage = Lineage(base_model=served.ref.base_model, template=served.template_name)
        return Source(model, served.path, None, None, lineage, None)
    if (local / "adapter_config.json").is_file():
        base = base or json.loads((local / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base:
            raise ConfigError(f"adapter {local} does not name its base model: pass --base")
        require_safetensors(local, "adapter")
        path, facts = adapter_base(base)
        lineage = _local_lineage(local, base, template, facts)
        return Source(model_name(str(local)), None, local, path, lineage, local)
    if (local / "model" / "config.json").is_file():  # a training stage directory
        adapter = local / "adapter" if (local / "adapter" / "adapter_config.json").is_file() else None
        inner = locate(str(local / "model"), base, template)
        return Source(
            local.name, inner.weights, adapter, inner.lineage.base_model, inner.lineage, local / "model"
        )
    if not (local / "config.json").is_file():
        if (library := endpoint_library(local)) is not None:
            raise library
        raise ConfigError(
            f"{local} holds neither a model (config.json) nor a PEFT adapter (adapter_config.json)"
        )
    require_safetensors(local)
    lineage = _local_lineage(local, None, template)
    return Source(model_name(str(local)), str(local), None, None, lineage, local)


# Folder names that say what a folder holds, not which model: a training stage's adapter/ and model/.
GENERIC_NAMES = ("adapter", "model")


def model_name(model: str) -> str:
    """The name a card and a Space give `model`: a registered model's name for an MLflow URI, a folder's
    name, or for a folder named only for what it holds (a stage's adapter/ or model/) the folder above
    it (the stage, `sft-<digest>`); anything else (a registry name, a hub id) as given."""
    if model.startswith("models:/"):
        return model.removeprefix("models:/").split("@")[0].split("/")[0]
    local = Path(model).expanduser()
    if not local.is_dir():
        return model
    local = local.resolve()
    if exported := _exported_meta(local).get(EXPORTED_NAME):
        return str(exported)
    if local.name in GENERIC_NAMES and local.parent.name:
        return local.parent.name
    return local.name or model


def _exported_meta(directory: Path) -> dict[str, Any]:
    """gym_model.json of a folder `gym export` wrote (its EXPORTED key), else {}."""
    try:
        meta = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) and meta.get(EXPORTED) else {}


def _local_lineage(
    directory: Path, base: str | None, template: str | None, base_facts: dict[str, str] | None = None
) -> Lineage:
    # A training stage's adapter/ has no gym_model.json of its own: its sibling model/ has the facts. Only
    # inside a stage directory (result.json beside them): elsewhere a folder named model/ may be unrelated.
    result = directory.parent / "result.json"  # inside a stage directory: what training reported
    sibling = directory.parent / "model" / MARKER
    own = directory / MARKER  # first, even for a folder named model/ outside a stage (then it is `sibling`)
    found = [m for m in (own, sibling) if m.is_file() and (m == own or result.is_file())]
    meta = {**(base_facts or {}), **(json.loads(found[0].read_text()) if found else {})}
    recorded = _exported_meta(directory).get(EXPORTED_LINEAGE)
    if isinstance(recorded, dict) and not result.is_file():  # an export: the lineage its card showed
        with contextlib.suppress(ValueError):
            kept = Lineage.model_validate(recorded)
            return kept.model_copy(update={"template": template}) if template else kept
    base_model = meta.get("base_model") or base or str(directory)
    entry, entry_digest = registry_entry(base_model)
    lineage = Lineage(
        base_model=base_model,
        template=template or meta.get("template"),
        default_system=meta.get("default_system"),
        method=meta.get("method"),
        registry_entry=entry,
        registry_digest=entry_digest,
    )
    if result.is_file():  # the scores and hyperparameters a flow registering this stage records
        from gym.lineage import eval_scores
        from gym.tracking import redact
        from gym.train.common import TrainResult

        try:
            facts = TrainResult.model_validate_json(result.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(
                f"{result} can't be read ({first}): run the stage's training again (gym trains it again)"
            ) from None
        scores, _ = eval_scores({facts.method: facts}, None, None)
        hyper = {facts.method: redact(facts.hyperparameters)} if facts.hyperparameters else {}
        lineage = lineage.model_copy(
            update={
                "method": facts.method,
                "stages": {facts.method: facts.digest},
                "scores": scores,
                "hyperparameters": hyper,
                "datasets": facts.datasets,
            }
        )
    return lineage


def check_mergeable(adapter: Path, base: str) -> None:
    """Refuse merges that would not reproduce the trained model, before loading anything."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    init = str(config.get("init_lora_weights", True)).lower()
    if init.startswith(BASE_REWRITING_INITS):
        raise ConfigError(
            f"adapter {adapter} was initialised with {init}, which rewrites the base weights: merged into "
            f"the original base {base} it would not give the trained model. Export the training stage's "
            "merged model instead, save the adapter converted (PEFT's "
            "path_initial_model_for_weight_conversion), or pass --adapter-only"
        )
    base_config = Path(base) / "config.json"
    if base_config.is_file() and "quantization_config" in json.loads(base_config.read_text()):
        raise ConfigError(
            f"base model {base} is quantized: merging adapter {adapter} into it cannot be exact (the merged "
            "weights would be re-quantized). Pass --adapter-only to export the adapter alone, or point "
            "--base at the unquantized weights"
        )


def export_model(
    model: str | Path,
    output_dir: Path,
    settings: ExportSettings | None = None,
    *,
    base: str | None = None,
    template: str | None = None,
    lineage: Lineage | None = None,
    name: str | None = None,
) -> Path:
    """Write the hub-style directory for `model` to `output_dir` (see the module docstring)."""
    settings = settings or ExportSettings()
    check_output_dir(Path(output_dir))  # a folder that can't be written is said before anything loads
    source = locate(str(model), base, template)
    if base is not None and source.adapter is None:  # only an adapter has a base to merge into
        note = f"note: --base {base} is not read: {model} is a full model, not an adapter"
        print(note, file=sys.stderr)
    if lineage is not None:
        source.lineage = lineage
    if template is not None:
        source.lineage = source.lineage.model_copy(update={"template": template})
    if source.lineage.template:  # gym's name for it (`qwen` is qwen2.5): the Modelfile, card and metadata
        source.lineage = source.lineage.model_copy(
            update={"template": canonical_template(source.lineage.template)}
        )
    if settings.adapter_only and source.adapter is None:
        raise ConfigError(f"{model} has no adapter to export alone (--adapter-only needs a PEFT adapter)")
    if settings.adapter_only and settings.dtype != "auto":
        raise ConfigError(
            f"--dtype {settings.dtype} converts merged weights, and --adapter-only writes the adapter as it "
            "was trained: drop one of them"
        )
    if source.adapter is not None and source.weights is None and not settings.adapter_only:
        check_mergeable(source.adapter, str(source.base))
    _apart(source, Path(output_dir))
    with replace_dir(Path(output_dir)) as tmp:
        _write(source, tmp, settings, name or source.name)
    return Path(output_dir).expanduser().resolve()


def _write(source: Source, out: Path, settings: ExportSettings, name: str) -> None:
    import torch
    from transformers import AutoTokenizer

    from gym.train import rope

    tokenizer_from = source.weights or (
        str(source.adapter)
        if source.adapter and (source.adapter / "tokenizer_config.json").is_file()
        else source.base
    )
    tokenizer: Any = AutoTokenizer.from_pretrained(
        str(tokenizer_from), trust_remote_code=settings.trust_remote_code
    )
    system = source.lineage.default_system
    if source.lineage.template:
        # a template of another family (llama3's <|eot_id|> on a ChatML tokenizer) would ship a chat template
        # the tokenizer can't encode and whose end of turn the model never stops on: refused, as for training
        if split := split_markers(tokenizer, source.lineage.template):
            raise ConfigError(
                f"template {source.lineage.template!r} writes {', '.join(split)}, which the tokenizer of "
                f"{source.name} does not have as single tokens: a model served from the export would never "
                "stop on its end of turn. Leave out --template (the one it trained with), or give one its "
                "tokenizer knows"
            )
        tokenizer.chat_template = with_default_system(load_template(source.lineage.template), system)
    # an adapter trained on a RoPE-stretched base: the tokenizer takes what the stage's did
    stretch, max_length = rope.for_adapter(source.adapter) if source.adapter else ({}, None)
    tokenizer.model_max_length = max(tokenizer.model_max_length, max_length or 0)
    base_name = None
    if settings.adapter_only:
        assert source.adapter is not None
        shutil.copy2(source.adapter / "adapter_model.safetensors", out / "adapter_model.safetensors")
        base_name = _copy_adapter_config(source.adapter, out, str(source.base))
        if stretch:
            shutil.copy2(source.adapter / rope.ADAPTER_FILE, out / rope.ADAPTER_FILE)
        model_type = "adapter"
    else:
        model = _load(source, settings.trust_remote_code)
        if settings.dtype != "auto":  # after the merge, which runs in the stored precision
            model = model.to(getattr(torch, settings.dtype))
        for config in (model.config, model.config.get_text_config()):
            if hasattr(config, "use_cache"):  # training turns the KV cache off; generation wants it
                config.use_cache = True
        if getattr(model, "generation_config", None) is not None:  # a reward model (rm) generates nothing
            # generate() should stop at the end of a turn: the tokenizer's eos joins the model's own.
            eos = sorted(set(_ids(model.generation_config.eos_token_id)) | set(_ids(tokenizer.eos_token_id)))
            model.generation_config.eos_token_id = eos[0] if len(eos) == 1 else (eos or None)
        model.save_pretrained(out, max_shard_size=settings.shard_size, safe_serialization=True)
        model_type = str(model.config.model_type)
    tokenizer.save_pretrained(out)
    meta: dict[str, Any] = {
        "template": source.lineage.template,
        "base_model": source.lineage.base_model,
        EXPORTED: "gym export",
    }
    if source.lineage.method:  # an export of the export still says how it was trained
        meta["method"] = source.lineage.method
    if system is not None:
        meta["default_system"] = system
    # and its card: the name and the whole lineage (datasets, stages, scores, hyperparameters)
    meta |= {EXPORTED_NAME: name, EXPORTED_LINEAGE: source.lineage.model_dump(mode="json")}
    workspace.atomic_write_json(out / MARKER, meta)
    if source.meta_dir is not None and (source.meta_dir / EXPERIENCE_FILE).is_file():
        shutil.copy2(source.meta_dir / EXPERIENCE_FILE, out / EXPERIENCE_FILE)
    card = render(name, source.lineage)
    if settings.adapter_only:
        card += _adapter_note(base_name, str(source.base))
        if stretch:
            card += (
                f"It was trained on the base loaded with RoPE scaled: pass `from_pretrained(..., "
                f"rope_scaling={stretch['rope_scaling']!r}, max_position_embeddings="
                f"{stretch['max_position_embeddings']})` when loading the base (`{rope.ADAPTER_FILE}`).\n"
            )
    (out / "README.md").write_text(card, encoding="utf-8")
    if settings.gguf:
        (out / "GGUF.md").write_text(gguf_notes(model_type, source.lineage.template, tokenizer.eos_token))
    if settings.ollama:
        (out / "Modelfile").write_text(
            modelfile(source.lineage.template, tokenizer.eos_token, system=system), encoding="utf-8"
        )


def portable_base(base: str) -> str | None:
    """How an adapter's base (`base`: the folder or hub id it loads from) is named wherever the adapter
    goes: its registry entry's hub id, a hub id as it is, or for a model gym builds (gym-tiny) the
    registry's name (gym builds it anywhere); None for a folder only this machine has."""
    from gym import registry
    from gym.models import registry_entry
    from gym.tiny import KIND, tiny_digest

    local = Path(base).expanduser()
    if not local.is_dir():
        spec = registry_entry(base)
        return str(spec.hub_id or spec.name) if spec is not None else base
    for spec in registry.load_models().values():  # a gym-tiny gym built, known by its folder's name
        if spec.builder is not None and local.name == f"{KIND}-{tiny_digest(spec.builder, spec.template)}":
            return str(spec.hub_id or spec.name)
    return None


def _copy_adapter_config(adapter: Path, out: Path, base: str) -> str | None:
    """Copy adapter_config.json, naming the base as `portable_base` does (a workspace path would not be
    found once the adapter is copied elsewhere); returns that name, None where the base is a local folder
    (the file is copied as it is)."""
    name = portable_base(base)
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    if name is None or config.get("base_model_name_or_path") == name:
        shutil.copy2(adapter / "adapter_config.json", out / "adapter_config.json")
        return name
    config["base_model_name_or_path"] = name
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    return name


def _adapter_note(name: str | None, base: str) -> str:
    """What the card of an adapter-only export says about loading its base."""
    from gym.models import registry_entry

    if name is None:
        return (
            f"\nThis directory holds a PEFT adapter only, trained on the base model in the local folder "
            f"`{base}`, which adapter_config.json's `base_model_name_or_path` names: copied to another "
            "machine, set it to where that base is there (or pass gym `--base`), then apply the adapter "
            "with PEFT.\n"
        )
    note = f"\nThis directory holds a PEFT adapter only: load `{name}` and apply it with PEFT.\n"
    spec = registry_entry(name)
    if spec is not None and spec.hub_id is None:  # built by gym, not on the hub
        note += (
            f"`{name}` is a model gym builds (gym's registry): gym finds it by that name, e.g. "
            "`gym export --model THIS_FOLDER --out DIR` merges the adapter into it.\n"
        )
    return note


def _apart(source: Source, output_dir: Path) -> None:
    """Refuse an output folder that is, holds or lies inside the model being exported: replacing it
    would delete the source (or the export would overwrite what it reads)."""
    out = output_dir.expanduser().resolve()
    for read in (source.weights, source.adapter, source.meta_dir):
        local = Path(read).expanduser().resolve() if read is not None else None
        if local is None or not local.exists():
            continue  # a hub id or registry name: nothing local to overwrite
        if out == local or out in local.parents or local in out.parents:
            raise ConfigError(
                f"--out {out} overlaps the model being exported ({local}): exporting there would overwrite "
                "what it reads; choose a new or empty directory elsewhere"
            )


def _load(source: Source, trust_remote_code: bool = False) -> Any:
    """The model to write: a causal LM, or a reward model (a sequence-classification model, method rm)
    as the class its weights were saved with (a causal LM class would drop its score head)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from gym.models import is_reward_model

    kwargs: dict[str, Any] = {
        "dtype": "auto",
        "use_safetensors": True,
        "trust_remote_code": trust_remote_code,
    }
    if source.weights is not None:
        if is_reward_model(source.weights):
            return AutoModelForSequenceClassification.from_pretrained(source.weights, **kwargs)
        return AutoModelForCausalLM.from_pretrained(source.weights, **kwargs)
    from peft import PeftModel

    from gym.train import rope

    adapter = Path(str(source.adapter))
    adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    kwargs |= rope.for_adapter(adapter)[0]  # the base as its stage loaded it (RoPE stretched, if it was)
    if adapter_config.get("task_type") == "SEQ_CLS":  # a reward model's adapter (its score head inside)
        base = AutoModelForSequenceClassification.from_pretrained(str(source.base), num_labels=1, **kwargs)
    else:
        base = AutoModelForCausalLM.from_pretrained(str(source.base), **kwargs)
    return PeftModel.from_pretrained(base, str(source.adapter)).merge_and_unload()


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


DEPLOY_PLAN = "deploy.json"  # what `gym deploy` writes beside its export (gym.deploy)


def exported(directory: Path) -> bool:
    """Whether `gym export` wrote `directory` (its gym_model.json says so)."""
    try:
        meta = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get(EXPORTED) == "gym export"


# A URL's scheme (`s3:/`, `https:/`: a Path keeps one slash of two) at the start of a path.
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")  # two letters at least: no drive letter


def check_output_dir(output_dir: Path, ours: Callable[[Path], bool] = exported) -> Path:
    """`output_dir`, resolved, if gym may write it: new, empty, or written by the same gym command
    (`ours`; by default `gym export`). A model folder training wrote, or any of the user's own, is
    never replaced."""
    if _URL_SCHEME.match(output_dir.as_posix()):  # `s3://b/x`, which a Path writes as s3:/b/x
        from gym import secrets

        url = secrets.strip_url(re.sub(r":/+", "://", output_dir.as_posix(), count=1))
        raise ConfigError(
            f"{url} is a URL: gym writes the model to a local folder; give a folder, then copy it to remote "
            "storage with that storage's own tool"
        )
    output_dir = output_dir.expanduser().resolve()
    for parent in output_dir.parents:  # the nearest existing folder above it must be a folder
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(
                    f"{parent} is a file, so {output_dir} can't be made; choose another directory"
                )
            break
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"{output_dir} is a file, not a directory; choose an empty or new directory")
    models = (workspace.home() / "models").resolve()
    if output_dir.is_relative_to(models) and len(output_dir.relative_to(models).parts) > 1:
        inside = models / output_dir.relative_to(models).parts[0]
        raise ConfigError(
            f"{output_dir} lies inside {inside}, a folder gym's workspace keeps (a training stage or a built "
            "model), which an export must not change; choose a directory outside it"
        )
    try:
        workspace.check_writable(output_dir.parent)  # where the folder is staged and renamed into place
    except OSError as exc:
        raise unwritable(output_dir, exc) from None
    if output_dir.exists() and any(output_dir.iterdir()) and not ours(output_dir):
        if by := _written_by(output_dir):  # by the other command: what each replaces is its own kind
            raise ConfigError(
                f"{output_dir} holds what `{by}` wrote, and a command replaces only a folder it wrote itself "
                "(gym export: an export; gym deploy: a bundle); choose an empty or new directory"
            )
        raise ConfigError(
            f"{output_dir} exists and was not written by gym (only a folder it exported before is replaced; "
            "a training stage's model folder is not); choose an empty or new directory"
        )
    return output_dir


def unwritable(output_dir: Path, exc: OSError) -> ConfigError:
    """The one-line error for an output folder gym can't write (a read-only file system, /proc, /sys, a
    folder of another user's)."""
    where = Path(exc.filename).parent if exc.filename else output_dir.parent
    return ConfigError(
        f"can't write {output_dir}: no folder can be made in {where} ({exc.strerror or exc}); choose a "
        "directory you can write to"
    )


def _written_by(directory: Path) -> str | None:
    """The gym command that wrote `directory`: an export, or a deploy bundle (its deploy.json, its export
    in model/); None for anything else."""
    if exported(directory):
        return "gym export"
    if (directory / DEPLOY_PLAN).is_file() and exported(directory / "model"):
        return "gym deploy"
    return None


@contextlib.contextmanager
def replace_dir(output_dir: Path, ours: Callable[[Path], bool] = exported) -> Iterator[Path]:
    """Yield a staging directory that replaces `output_dir` if the block succeeds.

    An existing, non-empty `output_dir` is replaced only if `ours` says gym wrote it; a failure leaves
    it as it was. What is written gets the modes a plain copy would have: it is meant to be shared.
    """
    output_dir = check_output_dir(output_dir, ours)
    staged = output_dir.with_name(f".{output_dir.name}.staged")
    shutil.rmtree(staged, ignore_errors=True)
    with contextlib.ExitStack() as stack:
        try:
            tmp = stack.enter_context(workspace.atomic_dir(staged))
        except OSError as exc:  # can't be made there (the check above raced, or can't tell)
            raise unwritable(output_dir, exc) from None
        yield tmp
        workspace.shareable(tmp)
    if output_dir.exists():
        old = output_dir.with_name(f".{output_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        output_dir.rename(old)
        staged.rename(output_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staged.rename(output_dir)


def build_parser() -> argparse.ArgumentParser:
    from gym.cli_llamafactory_tools import epilog

    parser = ArgumentParser(prog="gym export", description=__doc__.split("\n\n")[0], epilog=epilog("export"))
    parser.add_argument(
        "--model", required=True, help="Model/adapter/stage directory, registry name or models:/ URI."
    )
    parser.add_argument("--out", required=True, help="Directory to write (replaced only if gym wrote it).")
    parser.add_argument(
        "--base", default=None, help="Base model for an adapter (default: its adapter_config)."
    )
    parser.add_argument("--template", default=None, help="Chat template to ship (default: the model's).")
    parser.add_argument("--shard-size", default="5GB", help="Largest safetensors shard (e.g. 500MB).")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="Weights' dtype (default: as the model stores them; bfloat16 halves a float32 fine-tune).",
    )
    parser.add_argument("--adapter-only", action="store_true", help="Export the adapter alone, unmerged.")
    parser.add_argument("--gguf", action="store_true", help="Add GGUF.md (llama.cpp conversion notes).")
    parser.add_argument("--ollama", action="store_true", help="Add an Ollama Modelfile.")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="Run Python code from the model repository."
    )
    return parser


def cmd_export(argv: Sequence[str]) -> int:
    """`gym export --model M --out DIR [...]`, or `gym export merge.yaml` (LLaMA-Factory's)."""
    from gym.cli_llamafactory_tools import translate

    parser = build_parser()
    args = parser.parse_args(translate("export", argv, parser))
    try:
        settings = ExportSettings(
            shard_size=args.shard_size,
            dtype=args.dtype,
            adapter_only=args.adapter_only,
            gguf=args.gguf,
            ollama=args.ollama,
            trust_remote_code=args.trust_remote_code,
        )
    except ValidationError as exc:  # before the model is resolved
        raise flag_error(exc) from None
    out = export_model(args.model, Path(args.out), settings, base=args.base, template=args.template)
    print(f"exported {args.model} to {out}")
    return 0
