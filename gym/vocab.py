"""New special tokens (LLaMA-Factory's `new_special_tokens`): the vocabulary step before training.

    gym train --method sft --dataset my_data --new_special_tokens "<think>" "</think>"
    gym train my_lf.yaml          # new_special_tokens: "<think>,</think>" (comma-separated)

`extend(ref, tokens)` writes, once per model and token list, a copy of the model in the workspace
(models/vocab-<digest>/) whose tokenizer holds the tokens as added tokens (never split, taken as
written) and whose embeddings have a row for each: transformers'
`resize_token_embeddings` with its mean initialisation (new rows drawn around the old embeddings'
mean and covariance, seeded, so the copy is the same every time). A tied output layer stays tied.
Tokenization, evaluation and training then use the copy like any model folder. The ModelRef it
returns lists the new rows' ids (`new_token_ids`): the LoRA family trains exactly those rows beside
the adapter (PEFT's trainable_token_indices, tied output layer included), freeze trains the
embeddings, full trains everything; a trained model records them, so a next stage trains them too.
A model whose embedding matrix already has spare rows (padded vocabularies such as Qwen's) is not
resized: the tokens take the next free rows, as in LLaMA-Factory.

Unlike LLaMA-Factory, the tokens are not marked special: gym decodes every reply, completion and
prediction with skip_special_tokens, which would erase them, so a `<think>` the model learnt would
never reach a GRPO reward, an exact-match score or an API reply. Kept as text, they do (Qwen3's own
`<think>` tokens are added the same way).
"""

from __future__ import annotations

import json
from typing import Any

from gym import workspace
from gym.errors import ConfigError
from gym.hashing import hash_obj
from gym.models import MODEL_META, ModelRef

SEED = 0  # the new rows' draw


def parse(tokens: list[str] | str | None) -> list[str]:
    """The token list from a list or LLaMA-Factory's comma-separated string (items with commas are
    split too, as LLaMA-Factory splits them); duplicates dropped."""
    items = [tokens] if isinstance(tokens, str) else list(tokens or [])
    out = [t.strip() for item in items for t in str(item).split(",")]
    if any(not t for t in out):
        raise ConfigError(
            f"new_special_tokens: an empty token in {tokens!r}; give the tokens as a list, or one string "
            "with commas between them (no trailing comma)"
        )
    return list(dict.fromkeys(out))


def extend(ref: ModelRef, tokens: list[str]) -> ModelRef:
    """`ref` with `tokens` added to its vocabulary (see the module docstring); `ref` itself if none."""
    if not tokens:
        return ref
    digest = hash_obj({"model": ref.digest, "new_special_tokens": tokens})
    folder = workspace.path("models", f"vocab-{digest}")
    meta = folder / MODEL_META
    if not meta.is_file():
        with workspace.atomic_dir(folder) as tmp:
            ids = _write(ref, tokens, tmp)
            record = {"template": ref.template, "base_model": ref.base_model, "new_special_tokens": tokens}
            if ref.default_system is not None:
                record["default_system"] = ref.default_system
            workspace.atomic_write_json(tmp / MODEL_META, record | {"new_token_ids": ids})
    ids = [int(i) for i in json.loads(meta.read_text(encoding="utf-8"))["new_token_ids"]]
    return ref.model_copy(
        update={"path": str(folder), "revision": None, "digest": digest, "new_token_ids": ids}
    )


def _write(ref: ModelRef, tokens: list[str], out: Any) -> list[int]:
    """Save the tokenizer with `tokens` and the model with rows for them into `out`; their ids."""
    import torch
    from transformers import AddedToken, AutoTokenizer

    from gym.models import load_model

    tokenizer: Any = AutoTokenizer.from_pretrained(
        ref.path, revision=ref.revision, trust_remote_code=ref.trust_remote_code
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in tokens])
    ids = [int(tokenizer.convert_tokens_to_ids(t)) for t in tokens]
    model = load_model(ref)
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return ids
