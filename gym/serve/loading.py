"""Which weights and which chat template a served model uses.

A model is a gym registry name, a local model directory, or an MLflow model URI
(`models:/name@alias`, `models:/name/3`). Its chat template is, in order: `--template`; the one
the registry entry, the directory's gym metadata or the registered version's tags name; else the
tokenizer's own chat template (as vLLM does for a directory gym knows nothing about). Only when
none of these exists does loading stop, with a message saying to pass `--template`. A `--template`
whose control tokens (`<|eot_id|>`...) the model's tokenizer does not have as single tokens is refused
before the weights load, as training refuses it: the prompt would reach the model as ordinary text
pieces. One that differs from the template the model was trained with (its gym_model.json) is served
with a warning. A model trained with a default system message (gym metadata), or served with
`--system`, gets it in every conversation that opens without one.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, GymWarning
from gym.hashing import hash_obj
from gym.models import ModelRef, load_tokenizer, require_no_own_code, require_safetensors, resolve
from gym.templates import (
    canonical_template,
    load_template,
    split_markers,
    template_hint,
    with_default_system,
)
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
        if template is not None:  # the model's own template (registry, gym metadata) is the one it knows
            check_template(ref, model)
        text, name = load_template(ref.template), ref.template
    else:
        if not trust_remote_code:  # refused in a line, before transformers loads anything
            require_no_own_code(ref)
        text, name = tokenizer_template(Path(ref.path), model, trust_remote_code=trust_remote_code), None
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


def check_template(ref: ModelRef, model: str) -> None:
    """Refuse `ref.template` (a `--template`) if the model's tokenizer lacks its control tokens; warn, in one
    line, if it differs from the template the model was trained with (recorded in its gym_model.json)."""
    trained = _gym_template(Path(ref.path)) if Path(ref.path).is_dir() else None
    with_trained = f" (it was trained with {trained!r})" if trained else ""
    # the tokenizer only (remote code only if asked, as gym.models loads it): before any weights load
    split = split_markers(load_tokenizer(ref), ref.template)
    if split:
        raise ConfigError(
            f"template {ref.template!r} writes {', '.join(split)}, which the tokenizer of {model} does not "
            "have as single tokens: every prompt would reach the model as ordinary text pieces and its "
            f"replies would be garbage{with_trained}. Leave out --template (the model's own), or give one "
            "whose tokens its tokenizer has"
        )
    if trained and canonical_template(trained) != ref.template:
        warnings.warn(
            f"--template {ref.template} differs from the template {model} was trained with ({trained}, in "
            "its gym_model.json): its replies may suffer; leave out --template to use that one",
            GymWarning,
            stacklevel=3,
        )


def _gym_template(directory: Path) -> str | None:
    meta = directory / "gym_model.json"
    return json.loads(meta.read_text()).get("template") if meta.is_file() else None


def tokenizer_template(directory: Path, model: str, trust_remote_code: bool = False) -> str:
    """The chat template of the tokenizer in `directory` (its repository's own code run only if
    `trust_remote_code`, as gym.models loads tokenizers)."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code)
    text = tokenizer.chat_template
    if isinstance(text, dict):  # several named templates: the default one serves chat
        text = text.get("default")
    if not text:
        raise ConfigError(
            f"model {model} names no chat template (not in gym's registry, no gym metadata, and its "
            f"tokenizer has none): {template_hint()}"
        )
    return str(text)
