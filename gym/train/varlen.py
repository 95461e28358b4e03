"""Padding-free attention through SDPA: each sequence of a flattened batch attends only within itself.

A padding-free or packed batch is one row of sequences laid end to end, its position ids restarting
at each sequence. transformers' own SDPA path keeps them apart with a dense (tokens x tokens) block
mask, which disables SDPA's fused causal kernels and grows with the square of the row: on this
project's CPU machine it ran padding-free batches at 0.4x the speed of padded ones, and the issue's
H200 measurement found 2.5x slower. Here the attention layers instead gather the row's sequences
into a [sequences, heads, longest, dim] block, run SDPA with `is_causal` (its flash kernel on CPU
and GPU), and scatter the result back. Only attention sees padding; every other layer, and the
loss, runs on the real tokens alone. Sequences are grouped by length first (GROUP_RATIO), so a short
sequence is not padded to the row's longest. Measured on gym-tiny (benchmarks/methods.py): on the
demo data padding-free 0.22-0.40x -> 1.02x of padded, packed 0.27-0.44x -> 1.22x (its padding caps
it at 1.23x); with the length groups, on 2,000 MMLU questions as SFT data padding-free 1.29x -> 2.28x,
packed 1.84x -> 2.25x.

It plugs in through transformers' AttentionInterface and AttentionMaskInterface under the name
`gym_sdpa_varlen` (not saved in config.json: a saved model loads with plain SDPA). Anything that is
not a flattened batch (a padded batch, generation with a cache) goes to transformers' SDPA function
with the usual masks, so a model loaded this way evaluates and generates as with "sdpa". Causal,
sliding-window and bidirectional layers are kept per sequence; other mask overlays some multimodal
models add (image-token blocks, chunked attention) are not, as with flash-attn's varlen kernel:
train those with padded batches.

    model = load_model(ref, attn_implementation=varlen.NAME)   # gym.train.speed does this
"""

from __future__ import annotations

import weakref
from typing import Any

from gym.errors import ConfigError

NAME = "gym_sdpa_varlen"


def register() -> str:
    """Make NAME a valid `attn_implementation` in this process (idempotent); returns NAME."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(NAME, varlen_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, varlen_mask)
    return NAME


def varlen_mask(
    *args: Any,
    attention_mask: Any = None,
    q_length: int = 0,
    kv_length: int = 0,
    kv_offset: int = 0,
    **kwargs: Any,
) -> Any:
    """No mask for a flattened batch (the attention function reads the position ids); SDPA's otherwise."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and q_length == kv_length and kv_offset == 0:
        return None
    sizes = {"q_length": q_length, "kv_length": kv_length, "kv_offset": kv_offset}
    return sdpa_mask(*args, attention_mask=attention_mask, **sizes, **kwargs)


# Sequences are grouped by length before attention, each group padded to its own longest: a group holds
# the sequences within GROUP_RATIO of its longest, so attention's work per sequence is at most
# GROUP_RATIO**2 its own (one block padded to the batch's longest made a 20-token sequence beside a
# 99-token one cost 25x). Each group is one SDPA call; fewer, larger calls cost less per token, hence
# not one group per length.
GROUP_RATIO = 1.5


class Group:
    """Sequences of similar length, gathered into one [count, longest] block for SDPA."""

    def __init__(self, starts: Any, lengths: Any) -> None:
        import torch

        self.count = int(starts.numel())
        self.longest = int(lengths.max())
        offsets = torch.arange(self.longest, device=starts.device)
        self.valid = offsets[None, :] < lengths[:, None]  # [count, longest]
        # Indices into the flattened tokens; slots past a sequence's end repeat its first token (they are
        # never attended to causally and are dropped afterwards).
        self.index = torch.where(self.valid, starts[:, None] + offsets[None, :], starts[:, None]).reshape(-1)
        self.keep = self.valid.reshape(-1)


class Segments:
    """Where each sequence of a [batch, length] position-id tensor lies in its flattened tokens, grouped
    by length (GROUP_RATIO)."""

    def __init__(self, position_ids: Any) -> None:
        import torch

        batch, length = position_ids.shape
        previous = torch.cat([position_ids[:, :1] - 1, position_ids[:, :-1]], dim=1)
        start = (position_ids != previous + 1).reshape(-1)  # positions restart (or jump): a new sequence
        start[::length] = True  # every row starts one too
        starts = start.nonzero().flatten()
        ends = torch.cat([starts[1:], starts.new_tensor([batch * length])])
        lengths = ends - starts
        self.count = int(starts.numel())
        self.longest = int(lengths.max())
        order = torch.argsort(lengths, descending=True, stable=True)
        sizes: list[int] = []  # how many of the sequences, longest first, each group takes
        top = 0
        for n in lengths[order].tolist():
            if sizes and n * GROUP_RATIO > top:
                sizes[-1] += 1
            else:
                sizes.append(1)
                top = n
        self.groups = [Group(starts[part], lengths[part]) for part in torch.split(order, sizes)]
        # The groups' kept slots, concatenated, hold every token once: `inverse` puts them back in order.
        placed = torch.cat([g.index[g.keep] for g in self.groups])
        self.inverse = torch.empty_like(placed)
        self.inverse[placed] = torch.arange(placed.numel(), device=placed.device)


_last: tuple[Any, int, Segments] | None = None  # the last position ids seen: every layer gets the same tensor


def _segments(position_ids: Any) -> Segments:
    global _last
    if _last is not None and _last[0]() is position_ids and _last[1] == position_ids._version:
        return _last[2]
    found = Segments(position_ids)
    _last = (weakref.ref(position_ids), position_ids._version, found)
    return found


def varlen_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """The AttentionInterface function: [b, h, n, d] inputs, [b, n, h, d] output (as SDPA's)."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    batch, heads, n, dim = query.shape
    if attention_mask is not None or key.shape[2] != n or n < 2:  # padded, or decoding: plain SDPA
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal=is_causal, **kwargs
        )
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        raise ConfigError(
            f"padding-free batches through SDPA need the position ids in the attention layers, and "
            f"{type(module).__name__} does not pass them on; set padding_free off (and packing false), "
            "or use attn_implementation flash_attention_2 on a GPU"
        )
    segments = _segments(position_ids.expand(batch, -1) if position_ids.shape[0] != batch else position_ids)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window: int | None = kwargs.get("sliding_window")
    windowed = window is not None and segments.longest > window
    if segments.count == batch and causal and not windowed:  # one sequence per row: nothing to keep apart
        return sdpa_attention_forward(
            module, query, key, value, None, dropout, scaling, is_causal=True, **kwargs
        )
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    flat = [x.transpose(0, 1).reshape(heads, batch * n, dim) for x in (query, key, value)]
    pieces = []
    for group in segments.groups:
        count, longest = group.count, group.longest
        # [h, b * n, d] -> [count, h, longest, d]
        q, k, v = (
            x.index_select(1, group.index).view(heads, count, longest, dim).transpose(0, 1) for x in flat
        )
        mask = None
        if not causal:  # bidirectional within each sequence: hide the slots past its end
            mask = group.valid[:, None, None, :]
        elif window is not None and longest > window:  # causal, and at most `window` tokens back
            i = torch.arange(longest, device=query.device)
            mask = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window))[None, None]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal and mask is None, scale=scaling
        )
        pieces.append(out.transpose(1, 2).reshape(count * longest, heads, dim)[group.keep])
    out = torch.cat(pieces).index_select(0, segments.inverse)  # back in token order
    return out.view(batch, n, heads, dim), None
