"""`gym data preview`: a dataset as gym reads it, optionally as a model will be trained on it.

Without a model: the first records after normalisation (canonical messages / prompt+chosen+rejected).
With `--model`: each record's templated text, with the tokens that carry loss shown in ⟦…⟧; raw text
(pt) as its first blocks of cutoff_len tokens, cut from all of its texts joined (every token trained).
"""

from __future__ import annotations

import json
from typing import Any

from gym.data.mix import ingest_named
from gym.data.tokenize import IGNORE_INDEX, TokenizeSettings, data_notes, tokenize


def _marked(tokenizer: Any, input_ids: list[int], labels: list[int]) -> str:
    """Decode ids, wrapping each run of trained-on tokens in ⟦ ⟧."""
    out: list[str] = []
    run: list[int] = []
    training = False
    for tok, lab in zip(input_ids, labels, strict=True):
        is_trained = lab != IGNORE_INDEX
        if is_trained != training and run:
            text = tokenizer.decode(run)
            out.append(f"⟦{text}⟧" if training else text)
            run = []
        training = is_trained
        run.append(tok)
    if run:
        text = tokenizer.decode(run)
        out.append(f"⟦{text}⟧" if training else text)
    return "".join(out)


# What the loss is computed on, per kind of tokenized data.
LEGEND = {
    "sft": "⟦…⟧ marks tokens the loss is computed on",
    "text": "⟦…⟧ marks tokens the loss is computed on",
    "preference": "the loss compares [chosen] with [rejected], each after [prompt]",
    "kto": "the loss scores [completion] after [prompt], as desirable ([label] True) or not",
    "prompt": "online RL completes each [prompt] and rewards the completions",
}


def preview(
    dataset: str,
    n: int = 3,
    model: str | None = None,
    template: str | None = None,
    as_json: bool = False,
    cutoff_len: int | None = None,
) -> str:
    from gym.data.ingest import load_saved

    ingested = ingest_named(dataset)
    records = load_saved(ingested.path).select(range(min(n, ingested.num_records)))
    header = f"{dataset}: {ingested.num_records} {ingested.kind} records (artifact {ingested.path})"
    if model is None:
        rows = [dict(r) for r in records]
        if as_json:
            return json.dumps(rows, indent=2, ensure_ascii=False)
        return "\n\n".join([header, *(json.dumps(r, ensure_ascii=False, indent=1) for r in rows)])

    from gym.models import load_tokenizer, resolve

    ref = resolve(model, template)
    tok = load_tokenizer(ref)
    # Blocks of raw text span many texts: they are cut from the whole dataset, as training cuts them.
    cut = {} if cutoff_len is None else {"cutoff_len": cutoff_len}
    settings = TokenizeSettings(**cut) if ingested.kind == "text" else TokenizeSettings(max_samples=n, **cut)
    tokenized = tokenize(ingested.path, ref.path, ref.template, settings, revision=ref.revision)
    blocks = load_saved(tokenized.path)
    rows = [dict(r) for r in blocks.select(range(min(n, len(blocks))))]
    if as_json:
        return json.dumps(rows, ensure_ascii=False)
    parts = [header, f"template {ref.template}; {LEGEND[tokenized.kind]}"]
    shown = f" (of the first {n})" if tokenized.kind != "text" and ingested.num_records > n else ""
    parts += [f"note{shown}: {note}" for note in data_notes(tokenized.model_dump(), settings.cutoff_len)]
    # Record numbers as in the dataset: those left out (nothing trainable within cutoff_len) are skipped.
    dropped = set(tokenized.dropped_records)
    numbers = [i for i in range(1, ingested.num_records + 1) if i not in dropped]
    for i, row in zip(numbers, rows, strict=False):
        if tokenized.kind in ("sft", "text"):
            marked = _marked(tok, row["input_ids"], row["labels"])
            unit = "block" if tokenized.kind == "text" else "record"
            parts.append(f"--- {unit} {i} ({len(row['input_ids'])} tokens)\n{marked}")
        else:
            fields = {k: v for k, v in row.items() if not k.endswith("_ids")}
            parts.append(f"--- record {i}\n" + "\n".join(f"[{k}]\n{v}" for k, v in fields.items()))
    return "\n\n".join(parts)
