"""Render an ingested dataset with a chat template and tokenize it into `$GYM_HOME/tokenized/<digest>/`.

Columns by record kind (no padding: collators pad each batch):

- sft: `input_ids`, `labels` (-100 on tokens the loss skips). By default only assistant tokens
  (their end-of-turn token included) carry labels; `train_on_prompt` trains every token;
  `mask_history` trains only the last assistant turn. Sequences are cut to `cutoff_len` (the
  start is kept; under `mask_history`, the oldest exchanges are left out first when the last turn
  would be cut away) and records left with no trainable token are dropped and counted.
- preference: `prompt` (the prompt rendered with the generation prompt), `chosen`, `rejected` (the
  exact text the template renders for that assistant turn, end-of-turn token included, trailing
  whitespace after it removed) and `prompt_ids`, `chosen_ids`, `rejected_ids`.
- kto: `prompt`, `completion`, `label`, `prompt_ids`, `completion_ids`.
- prompt (online RL): `prompt` (the messages, which TRL renders with the same chat template),
  `prompt_text` (rendered with the generation prompt), `prompt_ids`, `answer`, `metadata` (JSON).
- text (pretraining, method pt): `input_ids`, `labels` (= `input_ids`: every token is trained on), in
  blocks of exactly `cutoff_len` tokens, as LLaMA-Factory's pt stage makes them (packing, its pt
  default). No chat template: each text is tokenized as it is, followed by the tokenizer's eos (with
  the llama3 templates `<|end_of_text|>`, as LLaMA-Factory does: their eos ends a turn), the texts are
  joined in order into one stream, and the stream is cut into blocks. A tokenizer that adds a bos token
  (Llama 2, Gemma, Mistral...) starts every block with it, then cutoff_len - 1 text tokens
  (LLaMA-Factory writes bos over each block's first token, losing that token). The tail shorter than a
  block is dropped, as LLaMA-Factory and transformers' run_clm do; gym joins the whole dataset (its
  first `max_samples` texts), so that tail is the only cut, where LLaMA-Factory cuts every map batch
  of 1,000 texts on its own. `stats` counts the texts and the dropped tokens.
Preference, kto and prompt texts are not cut: TRL truncates them with its `max_length`; `stats` counts
the records longer than `cutoff_len`.

The digest hashes the dataset digest, the template text, the tokenizer files (or hub id +
revision), the settings and this code.

    .venv/bin/python -c "from gym.data.tokenize import *; print(tokenize('<dataset dir>', \\
        'gym/assets/gym_tiny', 'chatml', TokenizeSettings(cutoff_len=256)))"
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gym import templates, workspace
from gym.data.completions import completion_texts, stats_for
from gym.data.ingest import dataset_folder, load_meta, load_saved, origin, saved_problem
from gym.data.ingest import features as ingested_features
from gym.data.mix import interleave
from gym.data.readers import looks_like_hub_id
from gym.errors import ConfigError, DataError
from gym.hashing import hash_file, hash_obj

IGNORE_INDEX = -100
BatchFn = Callable[[dict[str, list], list[int]], dict[str, list]]
if TYPE_CHECKING:
    import datasets


@functools.cache
def features(kind: str) -> datasets.Features:
    """The columns of a tokenized dataset of record kind `kind`."""
    from datasets import Features, List, Value  # lazy: a fully cached run never needs datasets

    # int32 holds any vocabulary and -100, at half int64's disk and page cache; the collators build
    # int64 tensors from the rows as before.
    ids = List(Value("int32"))
    return {
        # truncated, record: what tokenize counts and names (cut, left out); not kept in the artifact
        "sft": Features(
            {"input_ids": ids, "labels": ids, "truncated": Value("bool"), "record": Value("int64")}
        ),
        "preference": Features(
            {n: Value("string") for n in ("prompt", "chosen", "rejected")}
            | {f"{n}_ids": ids for n in ("prompt", "chosen", "rejected")}
        ),
        "kto": Features(
            {"prompt": Value("string"), "completion": Value("string"), "label": Value("bool")}
            | {"prompt_ids": ids, "completion_ids": ids}
        ),
        "prompt": Features(
            {"prompt": List({"role": Value("string"), "content": Value("string")}), "prompt_ids": ids}
            | {n: Value("string") for n in ("prompt_text", "answer", "metadata")}
        ),
        "text": Features({"input_ids": ids, "labels": ids}),
        "text_ids": Features({"input_ids": ids}),  # each text's ids + eos, before the blocks are cut
    }[kind]


# Weights are not part of a tokenizer: skip them when hashing a model folder's tokenizer files.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx")
_CODE = tuple(
    [Path(__file__), Path(templates.__file__)]
    + [Path(__file__).with_name(n) for n in ("completions.py", "mix.py")]
)


class TokenizeSettings(BaseModel):
    """How records become token ids and labels."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    cutoff_len: int = Field(default=1024, ge=1)
    """Longest sft sequence in tokens; longer ones are cut (the start is kept). Text: the block length."""
    train_on_prompt: bool = False
    """Train on every token (system, user and template tokens too), not only assistant turns."""
    mask_history: bool = False
    """Train only on the last assistant turn of each conversation."""
    max_samples: int | None = Field(default=None, ge=1)
    """Tokenize only the first N records (of each dataset in a mix, as LLaMA-Factory); None tokenizes all."""
    mix_strategy: Literal["concat", "interleave_under", "interleave_over"] = "concat"
    """A mix of datasets (`--dataset a,b`): concat = every record of each; interleave_under = records
    drawn from the datasets in turn (or with interleave_probs) until the first runs out; interleave_over
    = until the last runs out, the others starting over (LLaMA-Factory's mix_strategy)."""
    interleave_probs: list[float] | None = None
    """interleave_*: each dataset's share of the draws, in the list's order (weights, normalised); None
    draws them in turn."""
    interleave_seed: int = 42
    """Seed of interleave_probs' random draws."""
    default_system: str | None = None
    """A system message for every conversation that has none (LLaMA-Factory's default_system); it replaces
    the template's own default (qwen2.5's) there. Records with a system message keep theirs; text (pt)
    data has no turns to put it in."""

    @field_validator("interleave_probs")
    @classmethod
    def _shares(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or min(value) < 0 or sum(value) <= 0):
            raise ValueError("one share of at least 0 per dataset, not all 0 (e.g. 0.7 0.3)")
        return value


class TokenizeResult(BaseModel):
    """A reference to a tokenized dataset: what tasks pass to training."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    path: Path
    """The `save_to_disk` folder (`datasets.load_from_disk(path)` reads it)."""
    digest: str
    """Content digest naming the folder."""
    kind: str
    """Record kind: sft, preference, kto, prompt or text."""
    num_records: int
    """Records written (text: blocks of cutoff_len tokens)."""
    num_truncated: int = 0
    """sft records cut to `cutoff_len` (and kept)."""
    num_dropped: int = 0
    """sft records dropped because no trainable token was left."""
    truncated_records: list[int] = Field(default_factory=list)
    """The first NAMED of the records cut (1-based record numbers of the dataset, as errors name them)."""
    dropped_records: list[int] = Field(default_factory=list)
    """The first NAMED of the records dropped (1-based record numbers)."""
    stats: dict[str, int | float] = Field(default_factory=dict)
    """Token counts: total, longest, mean, trainable, records over cutoff_len (text: texts, dropped tail)."""


NAMED = 100  # records named per kind of cut: enough to find them, or to number a preview's records


def _cut_records(out: datasets.Dataset, total: int) -> dict[str, list[int]]:
    """The first NAMED record numbers of sft records cut to cutoff_len, and of those left out."""
    import numpy as np

    kept = out.data.column("record").to_numpy()
    truncated = kept[out.data.column("truncated").to_numpy(zero_copy_only=False)]
    dropped = np.setdiff1d(np.arange(1, total + 1), kept, assume_unique=True)
    return {"truncated_records": truncated[:NAMED].tolist(), "dropped_records": dropped[:NAMED].tolist()}


def _which(records: list[int], count: int) -> str:
    shown = ", ".join(map(str, records[:5]))
    return f" (record{'s' if count > 1 else ''} {shown}{', ...' if count > 5 else ''})" if records else ""


def data_notes(result: dict[str, Any], cutoff_len: int) -> list[str]:
    """What a tokenized dataset (its meta's `result`) holds that its user should know before training, in
    words: sft records `cutoff_len` cut or left out, longer pairs or completions that training cuts,
    pairs whose two answers are the same text. Empty when there is nothing to say."""
    notes, kind, kept = [], result.get("kind"), result.get("num_records", 0)
    cut, fix = f"cutoff_len={cutoff_len} tokens", "raise cutoff_len to keep them whole"
    if dropped := result.get("num_dropped", 0):
        which = _which(result.get("dropped_records", []), dropped)
        notes.append(
            f"{dropped} of {dropped + kept} record(s) left out{which}: within {cut} no answer token is left "
            f"({fix})"
        )
    if truncated := result.get("num_truncated", 0):
        which = _which(result.get("truncated_records", []), truncated)
        notes.append(
            f"{truncated} of {kept} record(s) cut to {cut}{which}: what follows is not trained on ({fix})"
        )
    if kind in ("preference", "kto") and (over := result.get("stats", {}).get("num_over_cutoff", 0)):
        notes.append(
            f"{over} of {kept} record(s) longer than {cut} with their answers: training cuts their answers "
            f"there, and what is cut teaches nothing ({fix})"
        )
    if same := result.get("stats", {}).get("num_same_answers", 0):
        notes.append(
            f"{same} of {kept} pair(s) have the same text as chosen and rejected answer: they teach no "
            "preference; drop them from the data, or give each a worse rejected answer"
        )
    return notes


def tokenizer_identity(tokenizer_dir: str | Path, revision: str | None = None) -> dict[str, Any]:
    """Hash of a local tokenizer's files (weights skipped), or the hub id + revision."""
    path = Path(tokenizer_dir).expanduser()
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() not in _WEIGHT_SUFFIXES
        )
        return {"files": {p.relative_to(path).as_posix(): hash_file(p, 64) for p in files}}
    if looks_like_hub_id(str(tokenizer_dir)):
        return {"hub_id": str(tokenizer_dir), "revision": revision}
    raise ConfigError(f"tokenizer {str(tokenizer_dir)!r} is neither a local folder nor a hub id")


def _tokenizer_source(
    given: Any, revision: str | None, trust_remote_code: bool
) -> tuple[str, str | None, bool]:
    """(folder or hub id, revision, trust_remote_code) of `given`: a path or hub id as it is, or a ModelRef
    (anything with a str `path`), whose revision and trust_remote_code apply unless given."""
    if isinstance(given, str | os.PathLike):
        return str(given), revision, trust_remote_code
    path = getattr(given, "path", None)
    if isinstance(path, str | os.PathLike):
        own_revision = getattr(given, "revision", None)
        return (
            str(path),
            revision or own_revision,
            trust_remote_code or bool(getattr(given, "trust_remote_code", 0)),
        )
    raise ConfigError(
        f"tokenizer_dir is {given!r:.60}: pass a model folder or hub id (a str or Path), or the ModelRef "
        "gym.models.resolve returns"
    )


def load_tokenizer(
    tokenizer_dir: str | Path, revision: str | None = None, trust_remote_code: bool = False
) -> Any:
    """The tokenizer at `tokenizer_dir` (a folder or hub id); the Python code a model repository ships runs
    only with `trust_remote_code` (without it transformers asked on the terminal, then ran it)."""
    try:
        from transformers import AutoTokenizer  # imported here: it pulls in torch

        tokenizer = AutoTokenizer.from_pretrained(
            str(tokenizer_dir), revision=revision, trust_remote_code=trust_remote_code
        )
    except OSError as e:
        raise ConfigError(
            f"cannot load tokenizer {str(tokenizer_dir)!r}: {e}",
        ) from e
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise ConfigError(
            f"tokenizer {str(tokenizer_dir)!r} runs its own Python code to load: gym runs a model's code "
            "only when asked to; read that code, then pass --trust_remote_code (trust_remote_code=True in "
            "Python)"
        ) from None
    # gym cuts sequences to cutoff_len itself: transformers' warning that a text is longer than the model's
    # max length ("will result in indexing errors") would only mislead here (gym.train.rope hints instead)
    tokenizer.model_max_length = int(1e30)
    return tokenizer


def sft_labels(
    input_ids: list[int], assistant_mask: list[int], *, train_on_prompt: bool, mask_history: bool
) -> list[int]:
    """Labels for one conversation: ids where the loss applies, -100 elsewhere."""
    spans = templates.assistant_spans(assistant_mask)
    n = len(input_ids)
    if mask_history:
        if not spans:
            return [IGNORE_INDEX] * n
        # Last turn only: its assistant span, plus (train_on_prompt) everything since the turn before.
        start = (spans[-2][1] if len(spans) > 1 else 0) if train_on_prompt else spans[-1][0]
        end = n if train_on_prompt else spans[-1][1]
        return [t if start <= i < end else IGNORE_INDEX for i, t in enumerate(input_ids)]
    if train_on_prompt:
        return list(input_ids)
    return [t if m else IGNORE_INDEX for t, m in zip(input_ids, assistant_mask, strict=True)]


def _sft_batch(tokenizer: Any, template: str, settings: TokenizeSettings) -> BatchFn:
    def fn(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        out: dict[str, list] = {"input_ids": [], "labels": [], "truncated": [], "record": []}
        conversations = templates.with_system(batch["messages"], settings.default_system)
        for messages, index in zip(conversations, indices, strict=True):
            enc = templates.encode(tokenizer, messages, template)
            if not any(enc.assistant_mask):
                raise ConfigError(
                    f"chat template {template!r} marks no assistant tokens (record {index + 1}); "
                    "wrap assistant content in {% generation %}...{% endgeneration %}"
                )
            labels = sft_labels(
                enc.input_ids,
                enc.assistant_mask,
                train_on_prompt=settings.train_on_prompt,
                mask_history=settings.mask_history,
            )
            cut = settings.cutoff_len
            if settings.mask_history and all(x == IGNORE_INDEX for x in labels[:cut]):
                enc, labels = _recent_turns(tokenizer, template, settings, messages, enc, labels)
            if all(x == IGNORE_INDEX for x in labels[:cut]):
                continue  # nothing left to learn from once cut: dropped and counted
            out["input_ids"].append(enc.input_ids[:cut])
            out["labels"].append(labels[:cut])
            out["truncated"].append(len(enc.input_ids) > cut)
            out["record"].append(index + 1)
        return out

    return fn


def _recent_turns(
    tokenizer: Any,
    template: str,
    settings: TokenizeSettings,
    messages: list[dict],
    enc: Any,
    labels: list[int],
) -> tuple[Any, list[int]]:
    """Under mask_history, a conversation whose last turn (the one trained on) lies past cutoff_len keeps
    its most recent turns instead (the system message stays): the oldest exchanges are left out, one at a
    time, until the last assistant turn starts within it, as LLaMA-Factory keeps the latest turns. The
    conversation as it was when even the last exchange alone does not fit (the record is then dropped)."""
    system = [m for m in messages[:1] if m.get("role") == "system"]
    rest = messages[len(system) :]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "user"]
    for start in starts[1:]:
        shorter = templates.encode(tokenizer, [*system, *rest[start:]], template)
        trained = sft_labels(
            shorter.input_ids,
            shorter.assistant_mask,
            train_on_prompt=settings.train_on_prompt,
            mask_history=True,
        )
        if any(x != IGNORE_INDEX for x in trained[: settings.cutoff_len]):
            return shorter, trained
    return enc, labels


def _pair_batch(tokenizer: Any, template: str, kind: str, file: str, system: str | None) -> BatchFn:
    names = ("chosen", "rejected") if kind == "preference" else ("completion",)

    def fn(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        batch = {**batch, "prompt": templates.with_system(batch["prompt"], system)}
        prompts, texts = completion_texts(tokenizer, template, batch, names, indices, file)
        out: dict[str, list] = {"prompt": prompts, **texts}
        if kind == "kto":
            out["label"] = batch["label"]
        for name in ("prompt", *names):
            out[f"{name}_ids"] = tokenizer(out[name], add_special_tokens=False)["input_ids"]
        return out

    return fn


def _sft_prompts(batch: dict[str, list]) -> dict[str, list]:
    """Canonical sft records as prompt records: the turns before the last (assistant) turn, and its text
    as the answer."""
    messages = batch.pop("messages")
    n = len(messages)
    return {"prompt": [m[:-1] for m in messages], "answer": [m[-1]["content"] for m in messages]} | {
        "metadata": ["{}"] * n
    }


def _prompt_batch(tokenizer: Any, template: str, system: str | None) -> BatchFn:
    def fn(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        # TRL renders these messages too
        batch = {**batch, "prompt": templates.with_system(batch["prompt"], system)}
        texts = [
            templates.render(tokenizer, p, template, add_generation_prompt=True) for p in batch["prompt"]
        ]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return {**batch, "prompt_text": texts, "prompt_ids": ids}

    return fn


# Templates whose eos token ends a turn; a text (pt) ends with this token instead (LLaMA-Factory's choice).
END_OF_TEXT = {"llama3": "<|end_of_text|>", "llama3.1": "<|end_of_text|>"}


def document_end(tokenizer: Any, template: str) -> int:
    """The id of the token that ends each text of pretraining data: the tokenizer's eos, or the
    template's end-of-text token (END_OF_TEXT) where its eos ends a chat turn."""
    token = END_OF_TEXT.get(templates.canonical_template(template))
    if token is not None and token in tokenizer.get_vocab():
        return int(tokenizer.convert_tokens_to_ids(token))
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            "the tokenizer has no eos token to end each text of pretraining data with; "
            "set eos_token in its tokenizer_config.json"
        )
    return int(tokenizer.eos_token_id)


def block_start(tokenizer: Any) -> int | None:
    """The bos id every text block starts with: the tokenizer's, when it adds one as it encodes text."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    return bos if tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos] else None


def _text_batch(tokenizer: Any, end: int) -> BatchFn:
    def fn(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
        return {"input_ids": [[*x, end] for x in ids]}

    return fn


def text_blocks(
    texts: datasets.Dataset, cutoff_len: int, bos: int | None
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Every text's ids (`texts`, in order) joined and cut into blocks of `cutoff_len` tokens, each
    starting with `bos` when given; labels = input_ids. The tail shorter than a block is dropped."""
    import datasets
    import numpy as np
    import pyarrow as pa

    size = cutoff_len - (bos is not None)
    if size < 1:
        raise ConfigError("cutoff_len must be at least 2 for a tokenizer that starts every block with bos")
    stream = pc.list_flatten(texts.data.column("input_ids")).to_numpy()
    count = len(stream) // size
    body = stream[: count * size].astype(np.int32).reshape(count, size)
    if bos is not None:
        body = np.concatenate([np.full((count, 1), bos, dtype=np.int32), body], axis=1)
    offsets = pa.array(np.arange(0, count * cutoff_len + 1, cutoff_len, dtype=np.int32))
    blocks = pa.ListArray.from_arrays(offsets, pa.array(body.reshape(-1)))
    table = pa.table({"input_ids": blocks, "labels": blocks}).cast(features("text").arrow_schema)
    dropped = len(stream) - count * size
    stats = {"num_texts": len(texts), "num_text_tokens": len(stream), "dropped_tokens": dropped}
    return datasets.Dataset(table), stats


def part_sizes(meta: dict[str, Any], max_samples: int | None) -> list[int]:
    """Records each dataset of a mix (gym.data.mix; its meta.json lists the parts) keeps under
    `max_samples`: the first N of each, as LLaMA-Factory caps each dataset of a list."""
    return [min(part["num_records"], max_samples or part["num_records"]) for part in meta["mix_of"]]


def first_records(meta: dict[str, Any], max_samples: int, total: int) -> range | list[int]:
    """Indices of the records `max_samples` keeps: the first N, or the first N of each dataset of a mix."""
    if "mix_of" not in meta:
        return range(min(max_samples, total))  # a range: datasets selects it without an index mapping
    keep: list[int] = []
    start = 0
    for part, kept in zip(meta["mix_of"], part_sizes(meta, max_samples), strict=True):
        keep.extend(range(start, start + kept))
        start += part["num_records"]
    return keep


def check_markers(tokenizer: Any, template: str, model: str | Path) -> None:
    """Refuse a template whose control tokens the model's tokenizer splits (templates.split_markers)."""
    missing = templates.split_markers(tokenizer, template)
    if missing:
        shown = ", ".join(missing)
        raise ConfigError(
            f"template {template!r} writes {shown}, which the tokenizer of {model} does not have as single "
            "tokens: they would be trained as ordinary text, and the model would never learn to end its turn "
            "on one. Use a template whose tokens the tokenizer has (a registry model, or a folder gym wrote, "
            "has its own: leave out --template), or add them to the tokenizer with gym train's "
            f"--new_special_tokens {','.join(missing)}"
        )


def tokenize(
    dataset_dir: str | Path | Any,
    tokenizer_dir: str | Path | Any,
    template: str | None = None,
    settings: TokenizeSettings | dict[str, Any] | None = None,
    *,
    revision: str | None = None,
    as_prompts: bool = False,
    trust_remote_code: bool = False,
) -> TokenizeResult:
    """Tokenize the ingested dataset at `dataset_dir`; return the existing artifact when already there.

    `dataset_dir` may be the IngestResult itself, `tokenizer_dir` a ModelRef (its path; its template,
    revision and trust_remote_code unless given), `settings` a dict of TokenizeSettings fields.
    `as_prompts` (online RL's data) reads sft records as prompt records: every turn before the last
    assistant turn is the prompt, and that turn the answer rewards compare with (LLaMA-Factory's PPO
    samples from its sft files' prompts too). Other kinds are tokenized as they are.
    """
    dataset_dir = dataset_folder(dataset_dir, "dataset_dir", "ingested")
    template = template or getattr(tokenizer_dir, "template", None)
    if not isinstance(template, str) or not template:
        raise ConfigError(
            f"template is {template!r}: name the chat template (a ModelRef from gym.models.resolve brings "
            "its own)"
        )
    tokenizer_dir, revision, trust_remote_code = _tokenizer_source(tokenizer_dir, revision, trust_remote_code)
    if isinstance(settings, dict):
        settings = TokenizeSettings.model_validate(settings)
    elif settings is not None and not isinstance(settings, TokenizeSettings):
        raise ConfigError(f"settings is {settings!r:.60}: pass a TokenizeSettings, or a dict of its fields")
    settings = settings or TokenizeSettings()
    meta = load_meta(dataset_dir, "ingested")
    kind = meta["kind"]
    sft_as_prompts = as_prompts and kind == "sft"
    digest = hash_obj(
        {
            "dataset": meta["digest"],
            "template": templates.load_template(template),
            "tokenizer": tokenizer_identity(tokenizer_dir, revision),
            "settings": settings.model_dump(),
            "code": [hash_file(p) for p in _CODE],
            **({"as_prompts": True} if sft_as_prompts else {}),
        }
    )
    final = workspace.path("tokenized", digest)
    damaged = final.exists() and saved_problem(final)
    if final.exists() and not damaged:
        return TokenizeResult.model_validate({**load_meta(final, "tokenized")["result"], "path": final})
    if damaged:  # cut short (a full disk, a copy) or edited: made again, replacing it in one step
        print(
            f"gym: tokenized folder {final} can't be read ({damaged}): tokenizing it again",
            file=sys.stderr,
        )

    tokenizer = load_tokenizer(tokenizer_dir, revision, trust_remote_code)
    if kind != "text":
        check_markers(tokenizer, template, tokenizer_dir)
    ds = load_saved(dataset_dir)  # the ingested data: damaged, it is refused naming its folder
    capped_before = meta.get("split_of", {}).get("max_samples")  # gym.data.split kept the first N
    if settings.max_samples is not None and capped_before != settings.max_samples:
        ds = ds.select(first_records(meta, settings.max_samples, len(ds)))
    if settings.mix_strategy != "concat" and "mix_of" in meta:
        sizes = part_sizes(meta, settings.max_samples)
        probs, seed = settings.interleave_probs, settings.interleave_seed
        ds = interleave(ds, sizes, settings.mix_strategy, probs, seed, str(dataset_dir))
    if sft_as_prompts:
        ds, kind = ds.map(_sft_prompts, batched=True, features=ingested_features("prompt")), "prompt"
    if kind == "sft":
        fn = _sft_batch(tokenizer, template, settings)
    elif kind == "text":
        fn = _text_batch(tokenizer, document_end(tokenizer, template))
    elif kind == "prompt":
        fn = _prompt_batch(tokenizer, template, settings.default_system)
    else:
        fn = _pair_batch(tokenizer, template, kind, str(dataset_dir), settings.default_system)
    # Map cache files go to a scratch dir inside the artifact's temp dir, never into the dataset artifact:
    # removed with it on any failure, and by the next write of the artifact after a `kill -9`.
    with workspace.atomic_dir(final, replace=bool(damaged)) as tmp:
        work = tmp / "scratch"
        work.mkdir()
        out = ds.map(
            fn,
            batched=True,
            with_indices=True,
            remove_columns=ds.column_names,
            features=features("text_ids" if kind == "text" else kind),
            cache_file_name=str(work / "map.arrow"),
            desc=f"tokenize {kind}",
        )
        num_truncated = num_dropped = 0
        named: dict[str, list[int]] = {}
        text_stats: dict[str, int] = {}
        if kind == "sft":
            num_truncated = int(pc.sum(out.data.column("truncated")).as_py() or 0)
            num_dropped = len(ds) - len(out)
            named = _cut_records(out, len(ds))
            out = out.remove_columns(["truncated", "record"])
        if kind == "text":
            out, text_stats = text_blocks(out, settings.cutoff_len, block_start(tokenizer))
            if len(out) == 0:
                raise DataError(
                    f"dataset {origin(dataset_dir)}: the texts hold {text_stats['num_text_tokens']} tokens "
                    f"(each with its eos), fewer than one block of cutoff_len={settings.cutoff_len}",
                    hint="lower cutoff_len, or add text",
                )
        if len(out) == 0:
            raise DataError(
                f"dataset {origin(dataset_dir)}: no record has a trainable token within "
                f"cutoff_len={settings.cutoff_len}",
                hint="raise cutoff_len, or check the template marks assistant turns",
            )
        result = TokenizeResult(
            path=final,
            digest=digest,
            kind=kind,
            num_records=len(out),
            num_truncated=num_truncated,
            num_dropped=num_dropped,
            **named,
            stats={**stats_for(out, kind, settings.cutoff_len), **text_stats},
        )
        meta_out = {
            "result": result.model_dump(mode="json"),
            "dataset": meta["digest"],
            "template": template,
            "tokenizer": str(tokenizer_dir),
            "revision": revision,
            "settings": settings.model_dump(),
        }
        out.save_to_disk(str(tmp))
        shutil.rmtree(work)
        workspace.atomic_write_json(tmp / "meta.json", meta_out)
    return result
