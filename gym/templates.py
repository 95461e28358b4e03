"""Chat templates: registry/templates/<name>.jinja rendered through the tokenizer's own
`apply_chat_template`, with `{% generation %}` tags marking assistant spans so the loss can be
limited to assistant tokens.

Each template reproduces its model family's official chat_template text (the header comment of the
.jinja file names the models and any deliberate difference) and wraps every assistant turn's content
plus its end-of-turn token(s) in `{% generation %}...{% endgeneration %}`.

LLaMA-Factory's template names are accepted where they render exactly what a gym template renders
(`ALIASES`); `canonical_template` turns one into gym's name.

    python -m gym.templates [TEMPLATE|MODEL ...]   # print a sample conversation as each template renders it
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

from gym.errors import ConfigError
from gym.paths import registry_dir


def templates_dir() -> Path:
    """Directory holding the `<name>.jinja` chat templates."""
    return registry_dir() / "templates"


# LLaMA-Factory's template names (`--template qwen`, `template: qwen` in its YAML files) -> gym's
# template. Listed only where LLaMA-Factory 0.9.x (src/llamafactory/data/template.py) renders every
# conversation gym trains on or serves (an optional system message, then user/assistant turns)
# exactly as gym's template does, generation prompt included (tests/test_templates.py compares them).
# Names gym shares with LLaMA-Factory (chatml, llama3, mistral, gemma, phi4, qwen3, alpaca, deepseek)
# are gym's own templates: see the template files for what each renders.
ALIASES: dict[str, str] = {
    "qwen": "qwen2.5",  # ChatML with default system "You are Qwen, created by Alibaba Cloud. ..."
    "qwen3_nothink": "chatml",  # ChatML without default system or <think> blocks (Qwen3-*-2507)
}

# LLaMA-Factory names that are *not* aliases: gym's closest template and how it renders differently.
# Only for the unknown-template message.
_NOT_ALIASES: dict[str, tuple[str, str]] = {
    "phi": ("phi3", "gym's ends a conversation with eos_token, as Phi-3's own template does"),
    "phi4_mini": ("phi4-mini", "gym's ends a conversation with eos_token, as Phi-4-mini's own template does"),
    "deepseek3": (
        "deepseek",
        "gym's (DeepSeek-R1's) opens the generation prompt with '<think>\\n' and drops the reasoning of "
        "earlier assistant turns",
    ),
    "deepseekr1": ("deepseek", "LLaMA-Factory's puts an empty think block in every assistant turn"),
    "gemma2": ("gemma", "LLaMA-Factory's ends a conversation with eos_token"),
    "gemma3": ("gemma", "gym's trims whitespace around each message, as Gemma 3's own template does"),
}


def list_templates() -> list[str]:
    """Names of every available template (file stems), sorted; aliases (`ALIASES`) not included."""
    return sorted(p.stem for p in templates_dir().glob("*.jinja"))


def template_hint() -> str:
    """What to do about a model gym finds no chat template for."""
    return f"pass --template (a flow run's `template` parameter; one of {', '.join(list_templates())})"


def canonical_template(name: str) -> str:
    """gym's name for template `name`: the target of an alias (`ALIASES`), else `name` itself.

    A template file called `name` wins over an alias of that name."""
    if name in ALIASES and not (templates_dir() / f"{name}.jinja").is_file():
        return ALIASES[name]
    return name


@cache
def load_template(name: str) -> str:
    """Jinja source of template `name` (a registry/templates/ file stem, or an alias of one)."""
    f = templates_dir() / f"{canonical_template(name)}.jinja"
    if not f.is_file():
        raise ConfigError(unknown_template_message(name, list_templates()))
    return f.read_text(encoding="utf-8")


# Control tokens a template writes: `<|eot_id|>`, `<|im_end|>`, `<｜User｜>`, `<start_of_turn>`.
_MARKER = re.compile(r"<\|[^<>|'\"\s]+\|>|<｜[^<>｜'\"\s]+｜>|<(?:start|end)_of_turn>")
_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)


def split_markers(tokenizer: Any, template: str) -> list[str]:
    """The control tokens `template` writes that `tokenizer` does not have as one token (a template made
    for another model family: llama3's `<|eot_id|>` on a ChatML tokenizer). Trained, they are ordinary
    text: the end-of-turn token the model should learn to stop on is never one token."""
    markers = set(_MARKER.findall(_COMMENT.sub("", load_template(template))))
    return sorted(m for m in markers if len(tokenizer.encode(m, add_special_tokens=False)) != 1)


def with_system(conversations: list[list[dict[str, str]]], system: str | None) -> list[list[dict[str, str]]]:
    """The conversations, each that has no system message opening with `system` (None: as they are)."""
    if system is None:
        return conversations
    opening = {"role": "system", "content": system}
    return [c if c and c[0]["role"] == "system" else [opening, *c] for c in conversations]


def with_default_system(template_text: str, system: str | None) -> str:
    """`template_text` that opens every conversation without a system message with `system` (None: as
    it is), as training with `default_system` did (`with_system`).

    The message is written into the Jinja source, as LLaMA-Factory's export writes its default_system
    into the tokenizer's template, so any renderer of the saved template (vLLM, transformers, MLflow's
    pyfunc) adds it too."""
    if system is None:
        return template_text
    literal = json.dumps(system, ensure_ascii=False)  # a Jinja string literal: its escapes are Python's
    prelude = (
        "{%- if not messages or messages[0]['role'] != 'system' -%}"
        f"{{%- set messages = [{{'role': 'system', 'content': {literal}}}] + messages -%}}"
        "{%- endif -%}\n"
    )
    return prelude + template_text


def unknown_template_message(name: str, available: list[str]) -> str:
    """Why `name` is not a template: gym's names, the LLaMA-Factory names accepted, and for a
    LLaMA-Factory name gym does not accept, its closest gym template and how that one differs."""
    aliases = ", ".join(f"{alias} (= {target})" for alias, target in ALIASES.items() if target in available)
    message = f"unknown chat template {name!r}"
    if name in _NOT_ALIASES:
        closest, why = _NOT_ALIASES[name]
        message += (
            f"; LLaMA-Factory's {name!r} is not exactly gym's {closest!r} ({why}): "
            f"use {closest!r} if that is what you want"
        )
    message += f"; available: {', '.join(available)}"
    return message + (f"; LLaMA-Factory's names: {aliases}" if aliases else "")


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    assistant_mask: list[int]  # 1 on tokens generated by the assistant (incl. its end-of-turn token)


def render(
    tokenizer: Any,
    messages: list[dict],
    template: str,
    *,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> str:
    """Render `messages` to text with template `template` and the tokenizer's special tokens.

    `template_kwargs` reach the template as variables (e.g. `date_string` for llama3.1,
    `enable_thinking=False` for qwen3).
    """
    return tokenizer.apply_chat_template(
        messages,
        chat_template=load_template(template) if template else None,  # "": the tokenizer's own
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )


def encode(
    tokenizer: Any,
    messages: list[dict],
    template: str,
    *,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> Encoded:
    """Tokenize `messages` with `template`, returning ids and the assistant-token mask."""
    out = tokenizer.apply_chat_template(
        messages,
        chat_template=load_template(template),
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )
    return Encoded(list(out["input_ids"]), list(out["assistant_masks"]))


def render_with_spans(
    messages: list[dict],
    template: str,
    *,
    bos_token: str | None = None,
    eos_token: str | None = None,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> tuple[str, list[tuple[int, int]]]:
    """Render without a tokenizer, supplying the special-token strings yourself.

    Returns the text and the [start, end) character ranges of each `{% generation %}` block. Useful
    to preview a template with a model's real bos/eos strings, or to check what the loss will see.
    Rendering goes through transformers' own chat-template renderer, so the text is exactly what
    `apply_chat_template` produces for a tokenizer with these special tokens.
    """
    variables: dict[str, Any] = dict(template_kwargs)
    for key, value in (("bos_token", bos_token), ("eos_token", eos_token)):
        if value is not None:  # like a tokenizer without that token: the variable stays undefined
            variables[key] = value
    from transformers.utils.chat_template_utils import render_jinja_template  # lazy: ~0.5 s

    # render_jinja_template returns (texts, generation index lists), one per conversation.
    texts, spans = cast(
        "tuple[list[str], list[list[tuple[int, int]]]]",
        render_jinja_template(
            conversations=[messages],
            chat_template=load_template(template),
            return_assistant_tokens_mask=True,
            add_generation_prompt=add_generation_prompt,
            **variables,
        ),
    )
    return texts[0], [(start, end) for start, end in spans[0]]


def render_text(
    messages: list[dict],
    template: str,
    *,
    bos_token: str | None = None,
    eos_token: str | None = None,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> str:
    """`render_with_spans` without the spans: the text a model with these special tokens would see."""
    text, _ = render_with_spans(
        messages,
        template,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )
    return text


def assistant_spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) index ranges of each contiguous run of 1s: one per assistant turn."""
    spans, start = [], None
    for i, bit in enumerate(mask):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


_SAMPLE = [
    {"role": "system", "content": "You are a concise geography tutor."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
]


def _demo(names: list[str]) -> None:
    """Print the sample conversation per template (or registry model), with real special tokens."""
    from gym.registry import load_models

    models = load_models()
    for name in map(canonical_template, names or list_templates()):
        spec = models.get(name) or next((m for m in models.values() if m.template == name), None)
        template = spec.template if spec else name
        bos, eos = (spec.special_tokens.bos, spec.special_tokens.eos) if spec else ("<s>", "</s>")
        who = f" (special tokens of {spec.name})" if spec else ""
        text = render_text(_SAMPLE, template, bos_token=bos, eos_token=eos, add_generation_prompt=True)
        print(f"--- {template}{who}\n{text}")


if __name__ == "__main__":
    _demo(sys.argv[1:])
