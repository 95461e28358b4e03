"""`gym data preview`: a dataset as gym reads it, optionally as a model will be trained on it.

Without a model: the first records after normalisation (canonical messages / prompt+chosen+rejected);
with `--method`, as that method reads them (sft records as prompts for online RL and TF-GRPO, which
also reads question/answer files), refused if it can't train on them.
With `--model`: each record's templated text, with the tokens that carry loss shown in ⟦…⟧; raw text
(pt) as its first blocks of cutoff_len tokens, cut from all of its texts joined (every token trained).
"""

from __future__ import annotations

import json
from typing import Any

from gym.data.mix import ingest_named
from gym.data.tokenize import IGNORE_INDEX, TokenizeSettings, data_notes, tokenize
from gym.errors import ConfigError


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


# Online RL and TF-GRPO read an sft dataset's records as prompts (with their last answers as the answers)
ONLINE = ("ppo", "grpo", "gspo", "tf_grpo")


def _ingested(dataset: str, method: str | None) -> Any:
    """`dataset` ingested as `method` reads it (tf_grpo: question/answer files too); ConfigError if the
    method can't train on its records."""
    if method is None:
        return ingest_named(dataset)
    from gym.data.formats import METHOD_KIND, require_kind
    from gym.train import METHODS

    if method == "sft_then_dpo":  # gym train's two-stage method: one dataset per stage
        raise ConfigError(
            "--method sft_then_dpo trains two datasets, one per stage: preview each as its stage reads it "
            "(--method sft, then --method dpo)"
        )
    if method not in METHODS:
        raise ConfigError(f"--method {method!r}: unknown method; available: {', '.join(METHODS)}")
    if method == "tf_grpo":
        from gym.data.ingest import ingest
        from gym.tfgrpo.data import dataset_spec

        ingested = ingest(dataset_spec(dataset))
        if ingested.kind not in ("sft", "prompt"):
            raise ConfigError(
                f"method 'tf_grpo' needs questions (an sft or prompt dataset), but {dataset!r} is "
                f"{ingested.kind} data"
            )
        return ingested
    ingested = ingest_named(dataset)
    if not (method in ONLINE and ingested.kind == "sft") and METHOD_KIND.get(method) != ingested.kind:
        require_kind(ingested.kind, method, dataset)
    return ingested


def _as_prompt(record: dict[str, Any]) -> dict[str, Any]:
    """A canonical sft record as online RL reads it: the turns before its last answer, and that answer."""
    messages = record["messages"]
    return {"prompt": messages[:-1], "answer": messages[-1]["content"]}


def _left_out(tokenized: Any, cutoff_len: int) -> list[str]:
    """Pairs and KTO records whose prompt alone fills cutoff_len: training leaves them out (their answers
    are not cut, as the note on longer records says), as gym.train.pairs says before training."""
    if tokenized.kind not in ("preference", "kto"):
        return []
    from gym.errors import DataError
    from gym.train.pairs import answer_room

    method = "dpo" if tokenized.kind == "preference" else "kto"
    try:
        return [
            n.replace("training ", "", 1)
            for n in answer_room(method, tokenized.kind, tokenized.path, None, cutoff_len)
        ]
    except DataError as exc:  # every one: training would refuse the data, saying so
        return [str(exc).removeprefix(f"{method}: ").replace("training ", "", 1)]


def preview(
    dataset: str,
    n: int = 3,
    model: str | None = None,
    template: str | None = None,
    as_json: bool = False,
    cutoff_len: int | None = None,
    method: str | None = None,
) -> str:
    """The first `n` records of `dataset` as gym reads them (as `method` reads them, if given: an error
    says when it can't train on them), with `model` also templated and tokenized."""
    from gym.data.ingest import load_saved

    ingested = _ingested(dataset, method)
    records = load_saved(ingested.path).select(range(min(n, ingested.num_records)))
    prompts = method in ONLINE and ingested.kind == "sft"  # read as prompts, with their last answers
    kind = f"{ingested.kind} records read as prompts" if prompts else f"{ingested.kind} records"
    header = f"{dataset}: {ingested.num_records} {kind} (artifact {ingested.path})"
    if model is None:
        rows = [_as_prompt(dict(r)) if prompts else dict(r) for r in records]
        if as_json:
            return json.dumps(rows, indent=2, ensure_ascii=False)
        return "\n\n".join([header, *(json.dumps(r, ensure_ascii=False, indent=1) for r in rows)])

    from gym.models import load_tokenizer, resolve

    ref = resolve(model, template)
    tok = load_tokenizer(ref)
    # Blocks of raw text span many texts: they are cut from the whole dataset, as training cuts them.
    cut = {} if cutoff_len is None else {"cutoff_len": cutoff_len}
    settings = TokenizeSettings(**cut) if ingested.kind == "text" else TokenizeSettings(max_samples=n, **cut)
    revision = ref.revision
    tokenized = tokenize(
        ingested.path, ref.path, ref.template, settings, revision=revision, as_prompts=prompts
    )
    blocks = load_saved(tokenized.path)
    rows = [dict(r) for r in blocks.select(range(min(n, len(blocks))))]
    if as_json:
        return json.dumps(rows, ensure_ascii=False)
    parts = [header, f"template {ref.template}; {LEGEND[tokenized.kind]}"]
    shown = f" (of the first {n})" if tokenized.kind != "text" and ingested.num_records > n else ""
    parts += [f"note{shown}: {note}" for note in data_notes(tokenized.model_dump(), settings.cutoff_len)]
    parts += [f"note{shown}: {note}" for note in _left_out(tokenized, settings.cutoff_len)]
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
