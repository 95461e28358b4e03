"""Which weights and which chat template a served model uses.

A model is a gym registry name, a local model directory, or an MLflow model URI
(`models:/name@alias`, `models:/name/3`). Its chat template is, in order: `--template`; the one
the registry entry, the directory's gym metadata or the registered version's tags name; else the
tokenizer's own chat template (as vLLM does for a directory gym knows nothing about). Only when
none of these exists does loading stop, with a message saying to pass `--template`. A model trained
with a default system message (gym metadata), or served with `--system`, gets it in every
conversation that opens without one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.errors import ConfigError
from gym.hashing import hash_obj
from gym.models import ModelRef, require_safetensors, resolve
from gym.templates import load_template, template_hint, with_default_system
from gym.tfgrpo.injection import ShippedLibrary, shipped_library


@dataclass(frozen=True)
class ServedModel:
    """A model ready to load for serving: weights, the chat template's text and shipped experiences."""

    ref: ModelRef
    chat_template: str
    template_name: str | None  # None: the tokenizer's own template
    library: ShippedLibrary | None  # a TF-GRPO model's experiences (and its retrieval_top_k)

    @property
    def path(self) -> str:
        return self.ref.path

    @property
    def experiences(self) -> list[str] | None:
        """The whole shipped library's texts (None: the model ships none)."""
        return self.library.texts if self.library is not None else None


def resolve_served(
    model: str, template: str | None = None, trust_remote_code: bool = False, system: str | None = None
) -> ServedModel:
    """Resolve `model` for serving (see the module docstring for where the template comes from); `system`
    replaces the default system message the model was trained with."""
    ref = own_template_ref(model, template)
    if ref is None:
        ref = resolve(model, template, trust_remote_code)
        text, name = load_template(ref.template), ref.template
    else:
        text, name = tokenizer_template(Path(ref.path), model), None
    if system is not None:
        ref = ref.model_copy(update={"default_system": system})
    text = with_default_system(text, ref.default_system)
    if trust_remote_code:
        ref = ref.model_copy(update={"trust_remote_code": True})
    library = shipped_library(ref.path) if Path(ref.path).is_dir() else None
    return ServedModel(ref=ref, chat_template=text, template_name=name, library=library)


def own_template_ref(model: str, template: str | None) -> ModelRef | None:
    """A ModelRef for a directory (or registered version) that names no gym template, else None."""
    if template is not None:
        return None
    if model.startswith("models:/"):
        from gym import tracking, workspace

        name, version, run_id, tags = tracking.resolve_model_uri(model)
        if tags.get("template"):
            return None
        pinned = f"models:/{name}/{version}"
        digest = hash_obj({"mlflow": pinned, "run": run_id, "uri": tracking.tracking_uri()})
        local = tracking.download_model_version(pinned, workspace.path("models", f"mlflow-{digest}"))
        return ModelRef(
            name=model, path=str(local), template="", digest=digest, base_model=tags.get("base_model", pinned)
        )
    local = Path(model).expanduser()
    if not (local / "config.json").is_file() or _gym_template(local):
        return None
    require_safetensors(local)
    return ModelRef(
        name=model,
        path=str(local.resolve()),
        template="",  # no gym template: the engine renders with the tokenizer's own
        digest=hash_obj({"served": str(local.resolve())}),
        base_model=str(local),
    )


def _gym_template(directory: Path) -> str | None:
    meta = directory / "gym_model.json"
    return json.loads(meta.read_text()).get("template") if meta.is_file() else None


def tokenizer_template(directory: Path, model: str) -> str:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(directory))
    text = tokenizer.chat_template
    if isinstance(text, dict):  # several named templates: the default one serves chat
        text = text.get("default")
    if not text:
        raise ConfigError(
            f"model {model} names no chat template (not in gym's registry, no gym metadata, and its "
            f"tokenizer has none): {template_hint()}"
        )
    return str(text)
