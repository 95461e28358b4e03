"""Shifted sparse attention (S2-Attn, LongLoRA: Chen et al. 2024) as a transformers attention backend.

While training, each sequence is cut into groups of `ratio x length` tokens and attention stays
inside a group; half of the heads use groups shifted by half a group, so information still flows
between neighbouring groups. Unlike LongLoRA's reference code, which rolls the shifted half around
the sequence (its first group then sees the last tokens), the shifted groups here start with half
a group of masked padding, so no token ever attends to a later one. In eval mode (and whenever a
sequence is too short to group) it is exact SDPA attention: LongLoRA uses full attention at inference.

It plugs in through transformers' own extension points (AttentionInterface and
AttentionMaskInterface, registered under the name "gym_s2attn"), so it works for every model whose
attention dispatches through them; for any other model `enable` fails naming what is missing.

    s2attn.enable(model, 0.25)    # then train; s2attn.disable(model) before saving
"""

from __future__ import annotations

import math
from typing import Any

from gym.errors import ConfigError

NAME = "gym_s2attn"
_RATIO = "_gym_s2attn_ratio"  # set on each attention module by `enable`


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, s2_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the same 4D masks as SDPA


def enable(model: Any, ratio: float) -> None:
    """Switch `model` (a transformers PreTrainedModel) to S2-Attn with groups of `ratio` x length."""
    _register()
    model.set_attn_implementation(NAME)  # only warns for a model that can't switch: check it did
    if model.config._attn_implementation != NAME:
        raise ConfigError(
            f"longlora's shifted sparse attention needs a model whose attention runs through transformers' "
            f"AttentionInterface; {type(model).__name__} does not. Set --train.longlora.shift_attention "
            "false to train LongLoRA (LoRA + embeddings and norms) with the model's own attention"
        )
    heads = getattr(model.config, "num_attention_heads", 0)
    if heads < 2:
        raise ConfigError(f"S2-Attn shifts half of the attention heads: {type(model).__name__} has {heads}")
    for module in model.modules():
        if hasattr(module, "num_key_value_groups"):  # the attention modules
            setattr(module, _RATIO, ratio)


def disable(model: Any) -> None:
    """Back to SDPA (before saving: a saved model must load without gym's backend registered)."""
    if getattr(model.config, "_attn_implementation", None) == NAME:
        model.set_attn_implementation("sdpa")


def _blocks(x: Any, front: int, group: int) -> Any:
    """[b, h, n, d] -> [b * groups, h, group, d], after `front` zeros before and padding to whole groups."""
    import torch.nn.functional as F

    b, h, n, d = x.shape
    back = -(front + n) % group
    x = F.pad(x, (0, 0, front, back))
    m = x.shape[2] // group
    return x.view(b, h, m, group, d).permute(0, 2, 1, 3, 4).reshape(b * m, h, group, d)


def _mask_blocks(allowed: Any, front: int, group: int) -> Any:
    """[b, 1, n, n] bool -> the [b * groups, 1, group, group] diagonal blocks of the padded mask."""
    import torch
    import torch.nn.functional as F

    b, _, n, _ = allowed.shape
    back = -(front + n) % group
    padded = F.pad(allowed, (front, back, front, back), value=False)
    m = padded.shape[-1] // group
    blocks = padded.view(b, 1, m, group, m, group).diagonal(dim1=2, dim2=4)  # [b, 1, group, group, m]
    blocks = blocks.permute(0, 4, 1, 2, 3).reshape(b * m, 1, group, group)
    # Padding rows would attend to nothing (NaN in softmax): let every row see itself; real rows already do.
    return blocks | torch.eye(group, dtype=torch.bool, device=blocks.device)


def s2_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """The AttentionInterface function: [b, h, n, d] inputs, [b, n, h, d] output (as SDPA's)."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    n, heads = query.shape[2], query.shape[1]
    ratio = getattr(module, _RATIO, None)
    group = math.ceil(n * ratio) if ratio else n
    if not module.training or key.shape[2] != n or group < 2 or group >= n or heads < 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if attention_mask is None:
        allowed = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()[None, None]
        allowed = allowed.expand(query.shape[0], 1, n, n)
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask
    else:  # an additive float mask: 0 where attention is allowed
        allowed = attention_mask == 0
    allowed = allowed.expand(query.shape[0], 1, n, n)
    half = heads // 2
    outputs = []
    for heads_slice, front in ((slice(0, half), 0), (slice(half, heads), group // 2)):
        q, k, v = (t[:, heads_slice] for t in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            _blocks(q, front, group),
            _blocks(k, front, group),
            _blocks(v, front, group),
            attn_mask=_mask_blocks(allowed, front, group),
            dropout_p=dropout,
            scale=scaling,
        )
        b = query.shape[0]
        out = out.view(b, -1, out.shape[1], group, out.shape[-1]).permute(0, 2, 1, 3, 4)
        out = out.reshape(b, out.shape[1], -1, out.shape[-1])[:, :, front : front + n]
        outputs.append(out)
    return torch.cat(outputs, dim=1).transpose(1, 2).contiguous(), None
