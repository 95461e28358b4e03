"""The model card: a Hugging Face README.md (YAML metadata + Markdown) written from a `Lineage`.

The same text goes into an exported directory (README.md) and onto the registered MLflow model
version (its description), so the hub, the registry and a folder on disk tell the same story:
base model, method, datasets with digests, hyperparameters, eval scores, and how to run it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gym.lineage import Lineage


def _yaml_list(key: str, items: list[str]) -> list[str]:
    return [f"{key}:", *(f"- {json.dumps(i)}" for i in items)] if items else []


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    if not rows:
        return ["(none recorded)"]
    return [_row(header), "|" + "---|" * len(header), *(_row(row) for row in rows)]


def _row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(cells) + " |"


def _system_row(system: str | None) -> list[tuple[str, str]]:
    """The default system message as a table cell (one line, pipes escaped), when the model has one."""
    if system is None:
        return []
    cell = json.dumps(system, ensure_ascii=False).replace("|", "\\|")
    return [("default system message", f"`{cell}` (added to conversations that open without one)")]


def _flat(prefix: str, value: Any) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [row for k, v in value.items() for row in _flat(f"{prefix}.{k}" if prefix else k, v)]
    return [(f"`{prefix}`", f"`{value}`")]


def _flow_run(lineage: Lineage) -> str:
    """The flow run's id, linked to its page when the flow ran against a Prefect server with a UI."""
    if not lineage.flow_run_id:
        return "(none)"
    url = lineage.extra.get("prefect_flow_run_url")
    return f"[`{lineage.flow_run_id}`]({url})" if url else f"`{lineage.flow_run_id}`"


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?")  # `gpt2`, `Qwen/Qwen2.5-0.5B-Instruct`


def hub_base(base: str | None) -> str | None:
    """The base as the Hub's metadata names it (`base_model`, which the Hub refuses on a push unless it is
    a model id there): a registry model's hub id, a hub id as given; None for a model only gym builds
    (gym-tiny) and for a folder."""
    from gym.models import registry_entry

    if not base:
        return None
    spec = registry_entry(base)
    if spec is not None:
        return str(spec.hub_id) if spec.hub_id else None
    if not HUB_ID.fullmatch(base) or Path(base).expanduser().exists():
        return None
    return base


def render(name: str, lineage: Lineage, stop_tokens: list[str] | None = None) -> str:
    """README.md text for model `name`."""
    from gym.train.config import SCORING_METHODS

    scorer = bool(lineage.method) and str(lineage.method).split("+")[-1] in SCORING_METHODS
    hub = hub_base(lineage.base_model)
    front = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {'text-classification' if scorer else 'text-generation'}",
        *([f"base_model: {json.dumps(hub)}"] if hub else []),
        *_yaml_list("tags", ["gym", *(lineage.method.split("+") if lineage.method else [])]),
        *_yaml_list("datasets", [str(d["name"]) for d in lineage.datasets.values() if d.get("name")]),
        "---",
    ]
    datasets = [
        (role, f"{d.get('name') or '(unnamed)'} — digest `{d.get('digest')}`")
        for role, d in lineage.datasets.items()
    ]
    hyper = [row for stage, cfg in lineage.hyperparameters.items() for row in _flat(stage, cfg)]
    # How each score was measured (benchmark shots and questions, held-out records), beside the number: a
    # 0-shot score on 1 question per subject reads like a full benchmark's otherwise.
    setups = lineage.score_setups
    scores = [(k, f"{v:.4f}", setups.get(k.split(".", 1)[0], "")) for k, v in sorted(lineage.scores.items())]
    entry = "(not from gym's registry)"
    if lineage.registry_entry:
        entry = f"`{lineage.registry_entry}` (digest `{lineage.registry_digest}`)"
    facts = [
        (
            "base model",
            f"`{lineage.base_model}`" + (f" (hub: `{hub}`)" if hub and hub != lineage.base_model else ""),
        ),
        ("method", lineage.method or "(not recorded)"),
        ("chat template", f"`{lineage.template}`" if lineage.template else "(the tokenizer's own)"),
        *_system_row(lineage.default_system),
        ("gym registry entry", entry),
        ("config digest", f"`{lineage.config_digest}`" if lineage.config_digest else "(not recorded)"),
        ("stages", ", ".join(f"{s} `{d}`" for s, d in lineage.stages.items()) or "(none)"),
        ("Prefect flow run", _flow_run(lineage)),
        ("gym version", lineage.gym_version),
    ]
    body = [
        f"# {name}",
        "",
        f"Fine-tuned from `{lineage.base_model}` with gym ({lineage.method or 'method not recorded'}).",
        "",
        "## Lineage",
        "",
        *_table(("", ""), facts),
        "",
        "## Datasets",
        "",
        *_table(("role", "dataset"), datasets),
        "",
        "## Evaluation",
        "",
        *_table(("metric", "value", "measured"), scores),
        "",
        "## Hyperparameters",
        "",
        *_table(("setting", "value"), hyper),
        "",
        "## Use",
        "",
        *(_reward_model_use() if scorer else _chat_model_use()),
    ]
    if stop_tokens:
        body += ["", f"Generation ends at: {', '.join(f'`{t}`' for t in stop_tokens)}."]
    return "\n".join([*front, "", *body]) + "\n"


def _chat_model_use() -> list[str]:
    return [
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        'tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO")',
        'model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO")',
        'messages = [{"role": "user", "content": "Hello"}]',
        "inputs = tokenizer.apply_chat_template(",
        "    messages, add_generation_prompt=True, return_tensors='pt', return_dict=True",
        ")",
        "output = model.generate(**inputs, max_new_tokens=64)",
        'print(tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
        "or serve it over an OpenAI-compatible API: `gym serve --model PATH_OR_REPO`.",
    ]


def _reward_model_use() -> list[str]:
    """A reward model (method rm) scores a conversation; it does not generate."""
    return [
        "A reward model: it scores a prompt and its answer (one number, higher is better).",
        "",
        "```python",
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
        'tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO")',
        'model = AutoModelForSequenceClassification.from_pretrained("PATH_OR_REPO")',
        'messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"}]',
        "text = tokenizer.apply_chat_template(messages, tokenize=False)",
        "batch = tokenizer(text, return_tensors='pt', add_special_tokens=False)",
        "print(model(**batch).logits[0, 0].item())",
        "```",
        "",
        "or reward a policy with it in gym: `gym train --method grpo --reward reward_model:PATH_OR_REPO`.",
    ]
