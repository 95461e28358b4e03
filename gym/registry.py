"""The model registry: registry/models.json, checked against registry/models.schema.json.

`load_models()` validates the whole file (JSON Schema, then the rules a schema cannot express:
unique names, an existing chat template, a non-null eos, exactly one of hub_id / builder) and
returns `ModelSpec`s by name. Every problem is reported with the entry (name and index), the
field as a JSON path, and what to do.

Memory estimates (`memory_estimates`), in GiB (2**30 bytes), from the parameter count P alone:

    inference[d] = P * bytes[d] * 1.2
    lora[d]      = (P * bytes[d] + 0.01 * P * 16) * 1.3          (lora["int4"] is QLoRA)
    full[d]      = P * 16 * 1.3                                   (d in fp16, bf16 only)

bytes: fp16 = bf16 = 2, int8 = 1, int4 = 0.5. Inference adds 20% for activations, a moderate KV
cache (a few thousand tokens, batch 1) and the CUDA context. LoRA trains ~1% of P as extra fp32
parameters, each costing 16 bytes (4 weight + 4 grad + 8 for AdamW's two moments). Full training
in mixed precision costs 16 bytes per parameter (2 fp16/bf16 weight + 2 grad + 4 fp32 master +
8 AdamW moments). Both training figures add 30% for activations with gradient checkpointing at a
micro-batch of a few thousand tokens. These are planning numbers, not guarantees: long contexts,
large batches and optimizer/offload choices move them.

    python -m gym.registry            # table of every model with its memory estimates
"""

from __future__ import annotations

import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError as SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gym.data.formats import METHOD_KIND
from gym.errors import RegistryError
from gym.paths import registry_dir
from gym.templates import ALIASES, canonical_template, unknown_template_message

GIB = 1024**3
BYTES_PER_PARAM = {"fp16": 2.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
INFERENCE_OVERHEAD = 1.2  # activations, KV cache at moderate context, CUDA context
LORA_TRAINABLE_FRACTION = 0.01  # share of P a typical LoRA (r=8..16, all linear layers) trains
TRAINABLE_BYTES = 16  # fp32 weight/master 4 + grad 4 + AdamW moments 8
FULL_BYTES = 16  # fp16 weight 2 + grad 2 + fp32 master 4 + AdamW moments 8
TRAIN_OVERHEAD = 1.3  # activations with gradient checkpointing, CUDA context
_MAX_REPORTED = 10


class SpecialTokens(BaseModel):
    """The model's real special-token strings (None where its tokenizer has none)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    bos: str | None
    """Beginning-of-sequence token, or None (Qwen adds none)."""
    eos: str
    """End-of-sequence token as the tokenizer defines it."""
    pad: str | None
    """Padding token, or None (then training pads with eos)."""


class ModelSpec(BaseModel):
    """One registry entry: where a model comes from and how gym formats and trains it."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    name: str
    """Unique lowercase registry id, e.g. qwen2.5-7b-instruct."""
    hub_id: str | None
    """Hugging Face Hub repo id, or None for a locally built model (see builder)."""
    revision: str = "main"
    """Hub revision (branch, tag or commit) to pin."""
    family: str
    """Model family (qwen2.5, llama3, gemma, ...)."""
    architecture: str
    """transformers class the checkpoint loads as, e.g. Qwen2ForCausalLM."""
    template: str
    """Chat template: a registry/templates/<template>.jinja stem (an alias, e.g. LLaMA-Factory's
    `qwen`, is read as gym's name for it)."""
    special_tokens: SpecialTokens
    """The model's bos/eos/pad strings."""
    modalities: tuple[Literal["text", "vision", "audio"], ...]
    """Input modalities the model accepts."""
    parameters: int
    """Total parameter count, tied weights counted once."""
    context_length: int
    """Native context window in tokens."""
    lora_target_modules: tuple[str, ...]
    """Module names LoRA adapts by default."""
    builder: dict[str, Any] | None = None
    """Recipe for a locally built model ({kind, seed, config}); None for Hub models."""
    train_defaults: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Per method, hyperparameters measured to work for this model (fill fields the user leaves unset)."""
    notes: str | None = None
    """Caveats, sources and deviations."""

    @field_validator("template")
    @classmethod
    def _gym_template_name(cls, name: str) -> str:
        return canonical_template(name)


def models_file() -> Path:
    """The default registry file: registry/models.json."""
    return registry_dir() / "models.json"


def load_models(path: Path | str | None = None) -> dict[str, ModelSpec]:
    """Every entry of `path` (default registry/models.json), validated, by name in file order.

    Raises:
        RegistryError: naming the file, each bad entry (name and index), the field and the fix.
    """
    f = Path(path) if path is not None else models_file()
    if not f.is_file():
        raise RegistryError(f"model registry {f} not found; set GYM_REGISTRY to the registry/ directory")
    return dict(_load(f.resolve(), f.stat().st_mtime_ns))


def close_names(name: str, names: list[str], cutoff: float = 0.6) -> list[str]:
    """Up to three of `names` close to `name`, whatever the case of either (`QWEN3-8B` is close to
    `qwen3-8b`: compared as given, nothing was)."""
    by_lower = {n.lower(): n for n in reversed(names)}
    return [by_lower[c] for c in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=cutoff)]


def get_model(name: str, *, path: Path | str | None = None) -> ModelSpec:
    """The entry called `name`; an unknown name fails with the closest known names."""
    models = load_models(path)
    if name in models:
        return models[name]
    close = close_names(name, list(models), cutoff=0.5)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else f"known: {', '.join(models)}."
    raise RegistryError(
        f"unknown model {name!r} in {path or models_file()}; {hint} "
        "List them with `gym registry list`, or add an entry to registry/models.json."
    )


def list_models(path: Path | str | None = None) -> list[str]:
    """Names of every registry entry, in file order."""
    return list(load_models(path))


def count(parameters: int) -> str:
    """`0.49B`, `8.03B`; below 10M in millions (gym-tiny is `0.4M`, not `0.00B`)."""
    return f"{parameters / 1e6:.1f}M" if parameters < 10_000_000 else f"{parameters / 1e9:.2f}B"


def memory_estimates_for(parameters: int) -> dict[str, dict[str, float]]:
    """GiB needed to serve / LoRA-train / fully train a model of `parameters` (module docstring)."""
    p = float(parameters)
    trainable = LORA_TRAINABLE_FRACTION * p * TRAINABLE_BYTES
    return {
        "inference": {d: p * b * INFERENCE_OVERHEAD / GIB for d, b in BYTES_PER_PARAM.items()},
        "lora": {d: (p * b + trainable) * TRAIN_OVERHEAD / GIB for d, b in BYTES_PER_PARAM.items()},
        "full": {d: p * FULL_BYTES * TRAIN_OVERHEAD / GIB for d in ("fp16", "bf16")},
    }


def memory_estimates(spec: ModelSpec) -> dict[str, dict[str, float]]:
    """GiB estimates for `spec`: {"inference": {dtype: GiB}, "lora": {...}, "full": {...}}.

    inference = P*bytes*1.2; lora = (P*bytes + 0.01*P*16)*1.3, QLoRA being lora["int4"];
    full = P*16*1.3 for fp16/bf16 only. See the module docstring for what each factor covers.
    """
    return memory_estimates_for(spec.parameters)


# --- loading and validation ---------------------------------------------------------------


@cache
def _load(f: Path, mtime_ns: int) -> dict[str, ModelSpec]:  # mtime_ns: re-read after edits
    try:
        doc = json.loads(f.read_text(encoding="utf-8-sig"))  # a byte order mark, as editors on Windows write
    except UnicodeDecodeError:
        from gym.data.readers import utf8_problem  # lazy: only a broken file pays for pyarrow's import

        message, hint = utf8_problem(f.read_bytes())
        raise RegistryError(f"{f}: {message} ({hint})") from None
    except json.JSONDecodeError as e:
        raise RegistryError(f"{f}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    schema_file = f.parent / "models.schema.json"
    if not schema_file.is_file():
        schema_file = registry_dir() / "models.schema.json"
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    entries = doc.get("models") if isinstance(doc, dict) else None
    errors = sorted(Draft202012Validator(schema).iter_errors(doc), key=lambda e: _sort_key(e.absolute_path))
    problems = [_describe(e, entries) for e in errors]
    if isinstance(entries, list):
        problems += _cross_check(entries, _templates_dir(f))
    if problems:
        shown = problems[:_MAX_REPORTED]
        more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        raise RegistryError(f"{f}: {len(problems)} problem(s):\n  " + "\n  ".join(shown) + more)
    specs: dict[str, ModelSpec] = {}
    for i, entry in enumerate(entries or []):
        try:
            specs[entry["name"]] = ModelSpec.model_validate(entry)
        except ValidationError as e:  # the schema should have caught it; keep the message useful
            err = e.errors()[0]
            field = _json_path(["models", i, *err["loc"]])
            raise RegistryError(f"{f}: {_entry(entries, i)}, field {field}: {err['msg']}") from None
    return specs


def _templates_dir(f: Path) -> Path:
    local = f.parent / "templates"
    return local if local.is_dir() else registry_dir() / "templates"


def _cross_check(entries: list[Any], templates: Path) -> list[str]:
    """Rules the schema cannot express; entries the schema already rejected are checked as far as they go."""
    problems: list[str] = []
    first_index: dict[str, int] = {}
    available = sorted(p.stem for p in templates.glob("*.jinja"))
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            continue
        where = f"{_entry(entries, i)}, field $.models[{i}]"
        name, template, tokens = e.get("name"), e.get("template"), e.get("special_tokens")
        if isinstance(name, str) and name in first_index:
            problems.append(
                f"{where}.name: duplicate name {name!r} (first at models[{first_index[name]}]); rename one"
            )
        elif isinstance(name, str):
            first_index[name] = i
        if isinstance(template, str) and template not in available and ALIASES.get(template) not in available:
            close = difflib.get_close_matches(template, available, n=1)
            guess = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                f"{where}.template: {unknown_template_message(template, available)}; {guess}"
                f"fix the name or add {templates / (template + '.jinja')}"
            )
        if isinstance(tokens, dict) and "eos" in tokens and tokens["eos"] is None:
            problems.append(f"{where}.special_tokens.eos: eos is null; set the string that ends a sequence")
        defaults = e.get("train_defaults")
        for key in defaults if isinstance(defaults, dict) else ():  # `sft` or `sft:lora`, by the schema
            method = str(key).split(":", 1)[0]
            if method not in METHOD_KIND:  # a typo was never read: the method trained with gym's defaults
                close = difflib.get_close_matches(method, list(METHOD_KIND), n=1)
                guess = f"did you mean {close[0]!r}? " if close else ""
                methods = ", ".join(METHOD_KIND)
                problems.append(f"{where}.train_defaults: {key!r} names no method; {guess}methods: {methods}")
        if "hub_id" in e and (e["hub_id"] is None) == (e.get("builder") is None):
            why = (
                "both hub_id and builder are set; keep hub_id for a Hub model, builder for a local build"
                if e["hub_id"] is not None
                else "hub_id is null and there is no builder; give the Hub repo id, or a builder to build it"
            )
            problems.append(f"{where}.hub_id: {why}")
    return problems


def _describe(err: SchemaError, entries: Any) -> str:
    """One line for a schema violation: entry, field (JSON path), what is wrong, what to do."""
    path = list(err.absolute_path)
    where = "top level"
    if len(path) >= 2 and path[0] == "models" and isinstance(path[1], int):
        where = _entry(entries, path[1])
    msg = err.message
    if err.validator == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        path = path + missing[:1]
        msg = f"missing required field {missing[0]!r}; add it (see models.schema.json)"
    elif err.validator == "additionalProperties":
        known = list(err.schema.get("properties", {}))
        patterns = list(err.schema.get("patternProperties", {}))
        # the keys that are extra: named by no property and matching no pattern (a valid `cdpo` was blamed)
        unnamed = set(err.instance) - set(known)
        extra = sorted(k for k in unnamed if not any(re.search(p, k) for p in patterns))
        close = difflib.get_close_matches(extra[0], known, n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        allowed = ", ".join(known) if known else "names matching " + " or ".join(patterns)
        if extra[0].partition(":")[2]:  # train_defaults' `method:family`
            allowed += " (the family after ':' is full or lora)"
        path, msg = path + extra[:1], f"unknown field {extra[0]!r}; {guess}allowed: {allowed}"
    elif err.validator == "pattern":
        what = err.schema.get("description") or f"must match {err.validator_value}"
        msg = f"{_short(err.instance)} is not valid: {what}"
    elif err.validator == "type":
        want = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        got = _JSON_TYPES.get(type(err.instance), type(err.instance).__name__)
        msg = f"expected {' or '.join(want)}, got {got} {_short(err.instance)}"
    return f"{where}, field {_json_path(path)}: {msg}"


_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
    type(None): "null",
}


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sort_key(path: Any) -> list[str]:
    return [f"{p:08d}" if isinstance(p, int) else str(p) for p in path]


def _entry(entries: Any, i: int) -> str:
    e = entries[i] if isinstance(entries, list) and i < len(entries) else None
    name = e.get("name") if isinstance(e, dict) else None
    return f"entry {name!r} (models[{i}])" if isinstance(name, str) else f"entry models[{i}]"


def _json_path(parts: list[Any]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


if __name__ == "__main__":
    print(
        f"{'name':32s} {'family':9s} {'template':12s} {'params':>8s} {'ctx':>7s}  "
        f"{'infer bf16':>10s} {'lora bf16':>9s} {'qlora':>7s} {'full bf16':>9s}  (GiB)"
    )
    for spec in load_models().values():
        m = memory_estimates(spec)
        print(
            f"{spec.name:32s} {spec.family:9s} {spec.template:12s} {count(spec.parameters):>8s} "
            f"{spec.context_length:7d}  {m['inference']['bf16']:10.1f} {m['lora']['bf16']:9.1f} "
            f"{m['lora']['int4']:7.1f} {m['full']['bf16']:9.1f}"
        )
