"""Prompt and completion texts of preference/kto records, as the chat template renders them, and
token statistics of tokenized datasets.

A completion's text is derived generically, for any template: render(prompt + [assistant]) minus
render(prompt, add_generation_prompt=True), with whitespace after the last special token removed
(ChatML renders "answer<|im_end|>\\n"; the completion is "answer<|im_end|>"). Templates whose
generation prompt is not a prefix of the rendered conversation cannot be split this way and raise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from gym import templates
from gym.errors import DataError

if TYPE_CHECKING:
    import datasets


def special_tokens(tokenizer: Any) -> list[str]:
    """Every special token's text (eos, pad, additional and added special tokens)."""
    added = [t.content for t in tokenizer.added_tokens_decoder.values() if t.special]
    return sorted({*tokenizer.all_special_tokens, *added} - {""}, key=len, reverse=True)


def completion_text(
    tokenizer: Any,
    template: str,
    prompt: list[dict[str, str]],
    prompt_text: str,
    content: str,
    specials: list[str],
) -> str | None:
    """The text the template renders for the assistant turn `content` after `prompt`; None if the
    rendered conversation does not start with `prompt_text`."""
    full = templates.render(tokenizer, [*prompt, {"role": "assistant", "content": content}], template)
    if not full.startswith(prompt_text):
        return None
    text = full[len(prompt_text) :]
    end = max((text.rfind(t) + len(t) for t in specials if t in text), default=-1)
    if end > 0 and not text[end:].strip():
        text = text[:end]
    return text


def completion_texts(
    tokenizer: Any,
    template: str,
    batch: dict[str, list],
    names: tuple[str, ...],
    indices: list[int],
    file: str | None = None,
) -> tuple[list[str], dict[str, list[str]]]:
    """Rendered prompts and completions (columns `names`) of a batch of preference/kto records."""
    specials = special_tokens(tokenizer)
    prompts: list[str] = []
    texts: dict[str, list[str]] = {name: [] for name in names}
    for row, index in enumerate(indices):
        prompt = batch["prompt"][row]
        prompt_text = templates.render(tokenizer, prompt, template, add_generation_prompt=True)
        prompts.append(prompt_text)
        for name in names:
            text = completion_text(tokenizer, template, prompt, prompt_text, batch[name][row], specials)
            if text is None:
                full = templates.render(
                    tokenizer, [*prompt, {"role": "assistant", "content": batch[name][row]}], template
                )
                pairs = enumerate(zip(prompt_text, full, strict=False))
                at = next((i for i, (a, b) in pairs if a != b), min(len(prompt_text), len(full)))
                raise DataError(
                    f"chat template {template!r} renders prompt + {name} answer so that it does not start "
                    f"with the prompt rendered with add_generation_prompt=True: at character {at} the "
                    f"prompt has {prompt_text[at : at + 30]!r}, the conversation {full[at : at + 30]!r}",
                    file=file,
                    record=index + 1,
                    field=name,
                    hint="use a template whose generation prompt is a prefix of the rendered assistant turn",
                )
            texts[name].append(text)
    return prompts, texts


def _lengths(ds: datasets.Dataset, column: str) -> Any:
    return pc.list_value_length(ds.data.column(column))


def stats_for(ds: datasets.Dataset, kind: str, cutoff_len: int) -> dict[str, int | float]:
    """Token counts of a tokenized dataset: total, longest, mean, trainable, over cutoff_len."""
    n = max(len(ds), 1)
    if kind in ("sft", "text"):
        lengths = _lengths(ds, "input_ids")
        labels = pc.list_flatten(ds.data.column("labels"))
        return {
            "num_tokens": int(pc.sum(lengths).as_py() or 0),
            "max_len": int(pc.max(lengths).as_py() or 0),
            "mean_len": float(pc.sum(lengths).as_py() or 0) / n,
            "num_label_tokens": int(pc.sum(pc.not_equal(labels, -100)).as_py() or 0),
        }
    prompt = _lengths(ds, "prompt_ids")
    if kind == "prompt":
        return {
            "max_prompt_len": int(pc.max(prompt).as_py() or 0),
            "mean_len": float(pc.sum(prompt).as_py() or 0) / n,
            "num_over_cutoff": int(pc.sum(pc.greater(prompt, cutoff_len)).as_py() or 0),
        }
    answers = ("chosen_ids", "rejected_ids") if kind == "preference" else ("completion_ids",)
    longest = _lengths(ds, answers[0])
    for column in answers[1:]:
        longest = pc.max_element_wise(longest, _lengths(ds, column))
    total = pc.add(prompt, longest)
    stats: dict[str, int | float] = {
        "max_prompt_len": int(pc.max(prompt).as_py() or 0),
        "max_len": int(pc.max(total).as_py() or 0),
        "mean_len": float(pc.sum(total).as_py() or 0) / n,
        "num_over_cutoff": int(pc.sum(pc.greater(total, cutoff_len)).as_py() or 0),
    }
    if kind == "preference":  # a pair whose answers are one text: no preference to learn
        same = pc.equal(ds.data.column("chosen"), ds.data.column("rejected"))
        stats["num_same_answers"] = int(pc.sum(same).as_py() or 0)
    return stats
