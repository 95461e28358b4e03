"""A preference pair through the model once: [prompt, chosen answer, rejected answer] in one row.

TRL's DPOTrainer runs each pair as two rows, prompt + chosen and prompt + rejected, so every prompt
goes through the model twice. `share` lays a batch of such rows out as one row per pair instead,
with position ids that restart the rejected answer where the prompt ends and a 4D attention mask
in which the rejected answer sees the prompt and itself but not the chosen answer: every token's
hidden state is the one it has in its own row (the same attention, over the same keys, at the same
positions), while the prompt is computed once. `locate` maps the positions TRL reads in its rows to
the shared rows, for gym.train.completion_logits to gather them before the LM head. DPO's trainer
uses it, and CPO's (simpo) and ORPO's, which also keep each row's padding in place (their logits'
means read it).

Only where that holds exactly: right-padded rows whose completion runs from the end of an identical
prompt to the end of the row, a model on SDPA or eager attention (the ones that take a custom 4D
mask; flash-attn, gym's varlen and LongLoRA's shifted attention build their own), and no sliding
window shorter than the shared rows. Otherwise the rows stay as TRL made them. On the demo data
(prompts of ~21 tokens, answers of ~3) a batch's model tokens fall by ~40%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ATTENTION = ("sdpa", "eager")  # implementations that apply a given 4D mask as it is
SAVING = 0.9  # share only if the shared rows hold at most this share of the original tokens


@dataclass(frozen=True)
class Shared:
    """One row per pair; `rows` [2 x pairs] the shared row of each original row (chosen rows first)."""

    ids: Any  # [pairs, length]
    positions: Any  # [pairs, length]
    allowed: Any  # [pairs, 1, length, length] bool: query attends to key
    rows: Any
    prompt: Any  # [2 x pairs] prompt length of each original row
    chosen: Any  # [2 x pairs] the chosen answer's length of each original row's pair

    def mask(self, implementation: str) -> Any:
        """The 4D mask as the attention implementation takes it: bool for SDPA, additive for eager."""
        import torch

        if implementation == "sdpa":
            return self.allowed
        blocked = torch.zeros(self.allowed.shape, dtype=torch.float32, device=self.allowed.device)
        return blocked.masked_fill(~self.allowed, torch.finfo(torch.float32).min)

    def locate(self, index: Any, rows: Any = None) -> Any:
        """Positions `index` [n, K] of original rows `rows` [n] (default: all of them, in order), in
        their shared rows."""
        import torch

        half = self.ids.shape[0]
        if rows is None:
            rows = torch.arange(index.shape[0], device=index.device)
        rejected = (rows >= half)[:, None]
        moved = torch.where(
            rejected & (index >= self.prompt[rows][:, None]), index + self.chosen[rows][:, None], index
        )
        return moved.clamp(max=self.ids.shape[1] - 1)

    def gather(self, states: Any, index: Any, rows: Any = None) -> Any:
        """`states` [pairs, length, ...] of the shared rows at positions `index` [n, K] of the original
        rows `rows` [n] (default: all of them, in order)."""
        import torch

        index = index.to(states.device)
        if rows is None:
            rows = torch.arange(index.shape[0], device=states.device)
        rows = rows.to(states.device)
        return states[(rows % self.ids.shape[0])[:, None], self.locate(index, rows)]


def share(ids: Any, attention: Any, completion: Any, padding: bool = False) -> Shared | None:
    """The pairs of a DPO batch (`ids`, `attention`, `completion` [2 x pairs, length], chosen rows
    then rejected rows) as shared rows, or None where they don't fit the layout or save little.

    `padding`: each row's padding comes along after its answer, with the positions and the attention
    it has in its row (it sees the row's tokens; no token sees it), for callers that read the
    padding positions' hidden states too (TRL's CPO and ORPO average the logits over them)."""
    import torch

    count, length = ids.shape
    if count == 0 or count % 2 or attention.shape != ids.shape or completion.shape != ids.shape:
        return None
    half = count // 2
    steps = torch.arange(length, device=ids.device)
    ends = attention.sum(dim=1)
    if not bool((attention.bool() == (steps < ends[:, None])).all()):
        return None  # not right-padded
    answer = completion.bool()
    if not bool(answer.any(dim=1).all()):
        return None
    starts = answer.int().argmax(dim=1)
    if not bool((answer == ((steps >= starts[:, None]) & (steps < ends[:, None]))).all()):
        return None  # an answer that doesn't run from its prompt's end to the row's end
    prompt = starts[:half]
    if not bool((prompt == starts[half:]).all()):
        return None
    if not bool(((ids[:half] == ids[half:]) | (steps >= prompt[:, None])).all()):
        return None  # the two rows of a pair differ in their prompt
    tails = (length if padding else ends) - starts  # each row after its prompt: answer (and padding)
    chosen, rejected = tails[:half], tails[half:]
    total = prompt + chosen + rejected
    width = int(total.max())
    if half * width > SAVING * count * length:
        return None
    t = torch.arange(width, device=ids.device)[None, :]
    first = t < (prompt + chosen)[:, None]  # prompt and chosen answer: the chosen row as it is
    inside = t < total[:, None]
    pair = torch.arange(half, device=ids.device)[:, None]
    source = torch.where(first, t, t - chosen[:, None]).clamp(0, length - 1)
    source_row = torch.where(first, pair, pair + half)
    shared_ids = ids[source_row, source]
    key = inside & attention[source_row, source].bool()  # a row's padding is no one's key
    in_chosen = first & (t >= prompt[:, None])
    in_rejected = inside & ~first
    causal = t[:, :, None] >= t[:, None, :]  # [1, query, key]
    allowed = causal & key[:, None, :] & ~(in_rejected[:, :, None] & in_chosen[:, None, :])
    return Shared(
        ids=shared_ids,
        positions=source,
        allowed=allowed[:, None],
        rows=torch.arange(count, device=ids.device) % half,
        prompt=starts,
        chosen=torch.cat([chosen, chosen]),  # the chosen row's tail: where a rejected tail begins
    )


def fits(model: Any, width: int) -> bool:
    """Whether `model` (a transformers model) computes shared rows of `width` tokens as their own rows:
    an attention that applies a given 4D mask, no sliding window shorter than the rows, and positions
    taken from `position_ids` (not rebuilt from a 2D mask, as ALiBi models such as Bloom and MPT do)."""
    import inspect

    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ATTENTION:
        return False
    window = getattr(config, "sliding_window", None)
    if (isinstance(window, int) and window < width) or getattr(config, "alibi", False) is True:
        return False  # a window the custom mask would drop; Falcon's ALiBi option reads the 2D mask
    try:
        return "position_ids" in inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return False
