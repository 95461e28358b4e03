"""Model resolution and loading: a registry name, a local directory or a hub id becomes a
`ModelRef` (where the weights are, which chat template, a content digest), and every model is
loaded through the same `from_pretrained` path, the embedded gym-tiny included.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gym.errors import REFRESH_HINT, ConfigError, GymError
from gym.hashing import hash_obj, stamp
from gym.templates import canonical_template, load_template, template_hint

DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MODEL_META = "gym_model.json"  # in a folder gym wrote: template, base model (new token ids, default system)


class ModelRef(BaseModel):
    """A reference to model weights that tasks pass around instead of live models."""

    name: str = Field(description="Registry name, or the path / hub id the user gave.")
    path: str = Field(description="Local directory or hub id handed to from_pretrained.")
    revision: str | None = Field(None, description="Hub revision (None for local directories).")
    template: str = Field(description="Chat template name (registry/templates/<name>.jinja).")
    digest: str = Field(description="Content digest: changes whenever the weights may differ.")
    base_model: str = Field(description="The registry name or hub id this model descends from.")
    lora_target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    trust_remote_code: bool = Field(
        False, description="Run the model repo's own Python code (only if asked)."
    )
    train_defaults: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Per method, hyperparameters measured for this model (registry)."
    )
    new_token_ids: list[int] = Field(
        default_factory=list,
        description="Embedding rows of tokens added to the vocabulary (gym.vocab): an adapter trains them.",
    )
    default_system: str | None = Field(
        None,
        description="System message the model was trained to expect where a conversation has none (the "
        "training data's default_system): serving and evaluation add it the same way.",
    )


def _local_digest(directory: Path) -> str:
    """Cheap identity of a user's model dir: config + file names, sizes and mtimes.

    Not a content hash (that would read gigabytes); rewriting any file changes it.
    """
    config = (directory / "config.json").read_text() if (directory / "config.json").is_file() else ""
    return hash_obj({"config": config, "files": stamp(directory)["files"]})


def resolve(
    name_or_path: str | os.PathLike[str], template: str | None = None, trust_remote_code: bool = False
) -> ModelRef:
    """Resolve a registry name, local model dir (a str or Path) or hub id into a `ModelRef`.

    Registry entries bring their template and LoRA targets; the embedded gym-tiny is built
    into the workspace on first use. Anything else needs `template`. `trust_remote_code`
    lets transformers run the model repository's own Python code: off unless asked for.
    """
    ref = _resolve(_name(name_or_path), template)
    assert ref is not None  # only a dry run returns None
    if not trust_remote_code:
        require_no_own_code(ref)
    return ref.model_copy(update={"trust_remote_code": trust_remote_code}) if trust_remote_code else ref


def _stage_model(folder: Path) -> bool:
    """Whether `folder` is a gym training stage's (its `model/` a model gym wrote)."""
    return (folder / "model" / "config.json").is_file() and (folder / "model" / MODEL_META).is_file()


def _name(name_or_path: object) -> str:
    """The model name or path given to resolve/check as a str; a ConfigError for anything else."""
    if isinstance(name_or_path, os.PathLike):
        return os.fspath(name_or_path)  # type: ignore[return-value]
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ConfigError(
            f"model {name_or_path!r}: give a registry name, a local model folder (str or Path), a hub id "
            "(owner/name) or an MLflow version (models:/name@alias)"
        )
    return name_or_path


def check(
    name_or_path: str | os.PathLike[str], template: str | None = None, trust_remote_code: bool = False
) -> None:
    """Every check `resolve` makes (name, template, offline availability, code it may not run), without
    building gym-tiny or downloading anything: a cheap way to reject a bad model before any work starts."""
    ref = _resolve(_name(name_or_path), template, dry_run=True)
    if ref is not None and not trust_remote_code:
        require_no_own_code(ref)


def require_no_own_code(ref: ModelRef) -> None:
    """Refuse, before anything loads it, a model (a folder, or a hub model in the local cache) that
    transformers can only load by running the Python code it ships (config.json's `auto_map` for a
    `model_type` transformers has no class of its own for): without trust_remote_code transformers
    failed in a later task, with three tracebacks, and its tokenizer asked on the terminal whether to run
    that code. A type transformers knows loads with its own classes, whatever auto_map says."""
    config = _config_file(ref)
    try:
        facts = json.loads(config.read_text(encoding="utf-8")) if config is not None else {}
    except (OSError, ValueError):
        return  # loading it says what is wrong with the file
    auto_map = facts.get("auto_map") if isinstance(facts, dict) else None
    if not auto_map:
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = facts.get("model_type")
    if model_type in CONFIG_MAPPING_NAMES:
        return
    files = sorted(
        {str(v).split(".")[0] + ".py" for v in (auto_map.values() if isinstance(auto_map, dict) else [])}
    )
    raise ConfigError(
        f"model {ref.name} runs its own Python code to load (config.json's auto_map names "
        f"{', '.join(files) or 'its code'}; transformers has no model type {model_type!r} of its own): gym "
        "runs a model's code only when asked to; read that code, then pass --trust_remote_code "
        "(trust_remote_code=True in Python)"
    )


def _config_file(ref: ModelRef) -> Path | None:
    """The model's config.json on this machine: in its folder, or in the Hugging Face cache; None when
    there is none here (a hub model not downloaded yet)."""
    folder = Path(ref.path)
    if folder.is_dir():
        return folder / "config.json" if (folder / "config.json").is_file() else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(ref.path, "config.json", revision=ref.revision or "main")
    return Path(cached) if isinstance(cached, str) else None


def _resolve(name_or_path: str, template: str | None, dry_run: bool = False) -> ModelRef | None:
    from gym import registry, tracking

    template = canonical_template(template) if template else template  # LLaMA-Factory's names too
    if name_or_path.startswith("models:/"):
        return _resolve_mlflow(name_or_path, template, dry_run)

    models = registry.load_models()
    spec = registry_entry(name_or_path)
    if spec is not None:
        tmpl = template or spec.template
        load_template(tmpl)  # fail early on an unknown template
        targets = list(spec.lora_target_modules)
        if spec.builder is not None:
            if dry_run:
                return None
            from gym.tiny import ensure_tiny

            try:
                built = ensure_tiny(spec.builder, tmpl)
            except ConfigError as exc:  # the entry's builder: name the file and the entry
                from gym.registry import models_file

                raise ConfigError(f"{models_file()}: entry {spec.name!r}: {exc}") from None
            return ModelRef(
                name=spec.name,
                path=str(built),
                template=tmpl,
                digest=built.name,  # gym-tiny-<digest of builder, tokenizer, template>
                base_model=spec.name,
                lora_target_modules=targets,
                train_defaults=dict(spec.train_defaults),
            )
        revision = spec.revision or "main"
        hub_id = str(spec.hub_id)  # the registry guarantees hub_id xor builder
        check_reachable(hub_id, revision)
        return ModelRef(
            name=spec.name,
            path=hub_id,
            revision=revision,
            template=tmpl,
            digest=hash_obj({"hub": spec.hub_id, "revision": revision}),
            base_model=spec.name,
            lora_target_modules=targets,
            train_defaults=dict(spec.train_defaults),
        )
    local = Path(name_or_path).expanduser()
    if local.is_dir() and not (local / "config.json").is_file() and _stage_model(local):
        local = local / "model"  # a training stage's folder (gym export takes it too): its model
    if local.is_dir():
        if not (local / "config.json").is_file():
            if (local / "adapter_config.json").is_file():
                merged = local.parent / "model"
                hint = f"use {merged}, the stage's merged model, or " if _stage_model(local.parent) else ""
                raise ConfigError(
                    f"{local} holds a PEFT adapter, not a model (no config.json): {hint}merge it into its "
                    f"base with `gym export --model {local} --out DIR` and use DIR, or (gym serve, chat, "
                    f"eval) pass --model_name_or_path BASE --adapter_name_or_path {local}"
                )
            if (library := endpoint_library(local)) is not None:
                raise library
            raise ConfigError(f"{local} is not a model directory (no config.json)")
        require_safetensors(local)
        meta = _gym_meta(local)  # what gym recorded when it wrote this folder (nothing for others)
        local_template = template or meta.get("template")
        if local_template is None:
            raise ConfigError(
                f"model {local} is not in gym's registry and names no gym chat template: {template_hint()}"
            )
        load_template(local_template)
        return ModelRef(
            name=str(local),
            path=str(local.resolve()),
            template=local_template,
            digest=_local_digest(local),
            # the folder wherever it is asked for from (`models/mine` read as a hub id elsewhere: gym.card)
            base_model=meta.get("base_model") or str(local.resolve()),
            new_token_ids=[int(i) for i in meta.get("new_token_ids", [])],
            default_system=meta.get("default_system"),
        )
    if path_like(name_or_path):  # `./my-model`, `/x/y`, `~/m`: a folder the user meant, not a hub id
        looked = str(Path(name_or_path).expanduser().resolve())
        full = f" ({looked})" if looked != name_or_path else ""  # a relative path: where it looked
        raise ConfigError(
            f"model {name_or_path!r}: no such directory{full}; give a model folder (with config.json), a "
            "registry name or a hub id"
        )
    if template is None:
        if registered := tracking.registered_uri_hint(name_or_path):
            raise ConfigError(
                f"model {name_or_path!r} is registered in MLflow, not in gym's registry: "
                f"give it as {registered}"
            )
        close = registry.close_names(name_or_path, list(models))
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown model {name_or_path!r}: not a registry name or a local directory. "
            f"For any other hub id pass --template too.{hint}"
        )
    load_template(template)
    check_reachable(name_or_path, "main")
    return ModelRef(
        name=name_or_path,
        path=name_or_path,
        revision="main",
        template=template,
        digest=hash_obj({"hub": name_or_path, "revision": "main"}),
        base_model=name_or_path,
    )


def path_like(name: str) -> bool:
    """A name only a local path has: it starts with `.`, `/` or `~`, or is no hub id (`owner/name`)."""
    from gym.data.readers import looks_like_hub_id

    if "://" in name:  # a URL is neither (and its login must not be echoed as a resolved path)
        return False
    return name.startswith((".", "/", "~")) or not looks_like_hub_id(name)


def endpoint_library(local: Path) -> ConfigError | None:
    """The error for a folder holding a Training-Free GRPO library learned through an endpoint (no
    weights: what it is, and how to use it), None for any other folder."""
    meta = _gym_meta(local)
    if meta.get("method") != "tf_grpo" or not meta.get("endpoint"):
        return None
    from gym.secrets import strip_url

    return ConfigError(
        f"{local} is a Training-Free GRPO library learned for the model {meta.get('model')!r} behind "
        f"{strip_url(str(meta['endpoint']))}: it has no weights to load here. Use it with that model: "
        f"`gym tfgrpo show {local}` prints the experiences to give it as a system message"
    )


def registry_entry(name_or_hub_id: str) -> Any:
    """The registry's entry (gym.registry's ModelSpec) for a registry name or the hub id of one, else None."""
    from gym import registry

    models = registry.load_models()
    by_hub_id = {m.hub_id.lower(): m for m in models.values() if m.hub_id}
    return models.get(name_or_hub_id) or by_hub_id.get(name_or_hub_id.lower())


def adapter_base(base: str) -> tuple[str, dict[str, str]]:
    """Where to load an adapter's base from (`base`: its adapter_config's base_model_name_or_path, or
    what the user named) and what gym knows of it: its registry name and template when it has them
    (a registry model, a built gym-tiny, a folder gym wrote). A missing folder or an uncached hub model
    offline is a ConfigError here, not transformers' traceback at load time."""
    from gym import registry
    from gym.tiny import KIND, tiny_digest

    local = Path(base).expanduser()
    if local.is_dir():
        for spec in registry.load_models().values():  # a gym-tiny gym built, by its folder's name
            built = spec.builder is not None and f"{KIND}-{tiny_digest(spec.builder, spec.template)}"
            if local.name == built:
                return str(local), {"base_model": spec.name, "template": spec.template}
        meta = _gym_meta(local)
        return str(local), {k: str(meta[k]) for k in ("base_model", "template") if meta.get(k)}
    if base.startswith((".", "/", "~")) or local.is_file():
        raise ConfigError(
            f"base model {base}: no such directory (pass --base a model folder, registry name or hub id)"
        )
    spec = registry_entry(base)
    if spec is None:  # any other hub id
        check_reachable(base, "main")
        return base, {}
    ref = resolve(spec.name)
    return ref.path, {"base_model": ref.base_model, "template": ref.template}


def mlflow_digest(name: str, version: str, run_id: str) -> str:
    """The digest of a registered version's ModelRef (tells which version an alias pointed to)."""
    from gym import tracking

    return hash_obj({"mlflow": f"models:/{name}/{version}", "run": run_id, "uri": tracking.tracking_uri()})


def _resolve_mlflow(model_uri: str, template: str | None, dry_run: bool = False) -> ModelRef | None:
    """A registered MLflow model version (`models:/name@alias`, `models:/name/3`), downloaded once
    into the workspace. Its template and base model come from the version's lineage tags."""
    from gym import tracking, workspace

    name, version, run_id, tags = tracking.resolve_model_uri(model_uri)
    tmpl = template or tags.get("template")
    if tmpl is None:
        raise ConfigError(f"{model_uri} has no `template` tag: {template_hint()}")
    load_template(tmpl)
    if dry_run:
        return None
    pinned = f"models:/{name}/{version}"  # an alias can move; the version can't
    digest = mlflow_digest(name, version, run_id)
    local = tracking.download_model_version(pinned, workspace.path("models", f"mlflow-{digest}"))
    return ModelRef(
        name=model_uri,
        path=str(local),
        template=tmpl,
        digest=digest,
        base_model=tags.get("base_model", pinned),
        default_system=_gym_meta(local).get("default_system"),
    )


def check_reachable(hub_id: str, revision: str) -> None:
    """Offline (HF_HUB_OFFLINE=1), a hub model must already be in the local cache: say so early."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    if not constants.HF_HUB_OFFLINE:
        return
    try:
        cached = try_to_load_from_cache(hub_id, "config.json", revision=revision)
    except HFValidationError:  # no repo id at all (a URL, `a/b/c`): its text may hold a login, never shown
        from gym import secrets

        raise ConfigError(
            f"model {secrets.strip_url(hub_id)!r} is no hub id (owner/name), registry name or local directory"
        ) from None
    if not isinstance(cached, str):
        raise ConfigError(
            f"model {hub_id!r} (revision {revision}) is not in the local Hugging Face cache and "
            f"HF_HUB_OFFLINE=1: download it while online (`hf download {hub_id}`), unset HF_HUB_OFFLINE, "
            "or pass a local directory"
        )
    require_safetensors(Path(cached).parent, f"model {hub_id!r}: its cached snapshot")  # all it will have


def _gym_meta(directory: Path) -> dict[str, Any]:
    meta = directory / MODEL_META
    return json.loads(meta.read_text()) if meta.is_file() else {}


def derived(ref: ModelRef, directory: Path, digest: str) -> ModelRef:
    """A ModelRef for weights trained from `ref` into `directory`; `digest` names the training stage.
    The system message it expects is the one the stage recorded there (a training stage records its
    data's, else `ref`'s; TF-GRPO its local policy's)."""
    return ref.model_copy(
        update={
            "name": str(directory),
            "path": str(directory),
            "revision": None,
            "digest": digest,
            "default_system": _gym_meta(directory).get("default_system"),
        }
    )


# Weight files that are pickles: loading one can run code, so gym reads safetensors only.
_PICKLED_WEIGHTS = re.compile(r"(pytorch_model|adapter_model|model|consolidated)[\w.-]*\.(bin|pt|pth|ckpt)")


PICKLES_ADVICE = (
    "gym loads safetensors only (unpickling a file can run code); convert it once, where you trust the file, "
    "by loading it with transformers (PEFT for an adapter) and calling save_pretrained(NEW_DIR)"
)


def require_safetensors(folder: Path, what: str = "model") -> None:
    """Refuse a model or adapter folder whose weights are pickles only (`pytorch_model.bin`,
    `adapter_model.bin`), in one line saying how to convert them, before anything tries to load them."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    pickled = [n for n in names if _PICKLED_WEIGHTS.fullmatch(n)]
    if pickled and not any(n.endswith(".safetensors") for n in names):
        raise ConfigError(
            f"{what} {folder} holds its weights only as pickle files ({', '.join(pickled[:3])}): "
            f"{PICKLES_ADVICE}"
        )


def _require_local(ref: ModelRef) -> None:
    """A model that lives in a folder (a local or trained model) must still be there."""
    if Path(ref.path).is_absolute() and not Path(ref.path).is_dir():
        raise ConfigError(f"model folder {ref.path} does not exist ({REFRESH_HINT})")


@contextlib.contextmanager
def _loading(ref: ModelRef, errors: tuple[type[Exception], ...] = (OSError,)) -> Iterator[None]:
    """A model folder transformers can't load from (files missing or damaged: a copy cut short, a
    config.json edited by hand) fails in one line naming the folder, not in transformers' traceback.
    transformers reports a missing or unreadable file as OSError; a tokenizer with no usable files as
    ValueError (`errors`: what to catch; loading the weights raises ValueError for other reasons); a
    weights file cut short as safetensors' SafetensorError."""
    from safetensors import SafetensorError

    caught: tuple[type[Exception], ...] = (*errors, SafetensorError)
    try:
        yield
    except GymError:
        raise
    except caught as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not Path(ref.path).is_dir():  # a hub id: a network or hub error (OSError), else a library's
            if not isinstance(exc, OSError):
                raise
            if "use_safetensors" in str(exc):  # transformers found no safetensors weights, only pickles
                raise ConfigError(
                    f"model {ref.path!r} has no safetensors weights on the hub or in the local cache, only "
                    f"pickle files: {PICKLES_ADVICE}"
                ) from None
            raise ConfigError(
                f"model {ref.path!r} can't be loaded from the Hugging Face hub ({first}): check the id and "
                "the connection, or download it while online and set HF_HUB_OFFLINE=1"
            ) from None
        raise ConfigError(
            f"model folder {ref.path} can't be loaded ({first}): {remake_advice(ref.path)}"
        ) from None


def remake_advice(folder: str | Path) -> str:
    """What to do about a model folder whose files can't be read, by who made it. gym makes its own again
    once deleted: gym-tiny's build, a training stage's model or adapter (trained again, from its last
    checkpoint), a registered version's download (`models:/...`, downloaded again); anything else is the
    user's to copy again."""
    from gym import workspace
    from gym.tiny import KIND

    path = Path(folder).expanduser().resolve()
    models = workspace.home(create=False) / "models"  # resolved, as gym's own paths are
    if not path.is_relative_to(models) or path == models:
        return "copy the folder again from where it came from, or give another model"
    top = models / path.relative_to(models).parts[0]
    again = "and run the same command again"
    if top.name.startswith(f"{KIND}-"):
        return f"delete {top} {again}: gym builds it again"
    if top.name.startswith("mlflow-"):
        return f"delete {top} {again}: gym downloads the registered version again"
    if path.parent == top and path.name in ("model", "adapter"):
        return f"delete {path} {again}: gym trains the stage again (from its last checkpoint, if one is left)"
    return f"delete {path} {again}: gym makes it again"


# What a tokenizer loads from (one of them is enough; older folders hold only a slow tokenizer's
# vocabulary); a folder with none of them has no tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def load_tokenizer(ref: ModelRef) -> Any:
    """The tokenizer, with gym's chat template for this model set on it."""
    from transformers import AutoTokenizer

    _require_local(ref)

    folder = Path(ref.path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"model folder {ref.path} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): "
            f"{remake_advice(ref.path)}, or save the tokenizer there too (tokenizer.save_pretrained)"
        )
    with _loading(ref, (OSError, ValueError)):
        tok = AutoTokenizer.from_pretrained(
            ref.path, revision=ref.revision, trust_remote_code=ref.trust_remote_code
        )
    if ref.template:  # "": a model that names no gym template keeps its tokenizer's own (gym serve, eval)
        tok.chat_template = load_template(ref.template)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_config(ref: ModelRef) -> Any:
    """The model's transformers config (config.json at its path and revision; remote code only if allowed)."""
    from transformers import AutoConfig

    _require_local(ref)
    with _loading(ref):
        return AutoConfig.from_pretrained(
            ref.path, revision=ref.revision, trust_remote_code=ref.trust_remote_code
        )


def context_window(config: Any) -> int | None:
    """How many positions a model attends over (prompt and generated tokens together): its text
    config's max_position_embeddings (n_positions / n_ctx in GPT-2-style configs); None if it names none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(text, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def is_reward_model(path: str | Path) -> bool:
    """Whether the model folder at `path` is a sequence-classification model (a reward or value model:
    a score head on the backbone, no language-model head), by its config.json's `architectures`."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text()).get("architectures") or []
    return bool(architectures) and all(a.endswith("ForSequenceClassification") for a in architectures)


def load_model(
    ref: ModelRef,
    dtype: Any = "auto",
    attn_implementation: str | None = None,
    unsloth: bool = False,
    num_labels: int | None = None,
    **kwargs: Any,
) -> Any:
    """AutoModelForCausalLM.from_pretrained with safetensors only and remote code off unless asked.

    `attn_implementation` picks the attention kernel (sdpa, eager, flash_attention_2...; None lets
    transformers choose); `unsloth` loads through Unsloth's FastLanguageModel instead (CUDA only:
    gym.train.speed checks that first). `num_labels` loads a sequence-classification model with that
    many outputs instead (a reward model: 1; a causal LM gets a new, seeded score head on its
    backbone). `kwargs` go to from_pretrained too (e.g. a quantization_config for QLoRA). A reward
    model folder is refused as a causal LM: it has no language-model head to generate with.
    """
    _require_local(ref)
    if num_labels is None and is_reward_model(ref.path):
        raise ConfigError(
            f"{ref.name} is a reward model (a sequence-classification model with a score head): it scores "
            f"text and does not generate; use it as a reward (--reward reward_model:{ref.path}), or give a "
            "causal language model"
        )
    options = {
        "revision": ref.revision,
        "dtype": dtype,
        "attn_implementation": attn_implementation,
        "trust_remote_code": ref.trust_remote_code,
        "use_safetensors": True,
        **kwargs,
    }
    if num_labels is not None:
        if unsloth:
            raise ConfigError("unsloth loads causal language models only: turn it off for a reward model")
        from transformers import AutoModelForSequenceClassification

        with _loading(ref):
            return AutoModelForSequenceClassification.from_pretrained(
                ref.path, num_labels=num_labels, **options
            )
    if unsloth:
        from unsloth import FastLanguageModel

        model, _ = FastLanguageModel.from_pretrained(
            model_name=ref.path,
            dtype=None,
            load_in_4bit=False,
            trust_remote_code=ref.trust_remote_code,
        )
        return model
    from transformers import AutoModelForCausalLM

    with _loading(ref):
        return AutoModelForCausalLM.from_pretrained(ref.path, **options)
