"""SFT's cross-entropy over the positions it trains on, in cache-sized pieces without checkpointing.

TRL 1.12's SFTTrainer (its default `loss_type="chunked_nll"`) projects only the trained-on positions
(labels != -100) to the vocabulary, in chunks of 256 positions, each under activation checkpointing, so
that a long batch's logits never exist at once. That bounds memory for large vocabularies; it costs a
second projection in the backward pass, a chunk padded to 256 rows whatever the batch holds (29
trained-on positions of a 152k vocabulary cost a 256-row chunk), and the checkpoint machinery per chunk.
Where the log-probs the backward pass keeps fit in `BUDGET` elements (128 MiB in fp32: 8,192 positions
of gym-tiny's 4k vocabulary, ~220 of a 152k one), gym computes the loss itself: the same positions, sums
and metrics (token accuracy, entropy), in pieces of `PIECE` logits (512 positions of a 4k vocabulary,
64 of a 32k+ one), each projected once, as one matrix product. Above the budget, and under DeepSpeed
ZeRO-3 (a partitioned output layer), TRL's chunks.

Measured on this machine (OMP_NUM_THREADS=1), loss and backward, TRL's chunks -> gym's pieces:
113 trained-on positions of 8 x 30 tokens (gym-tiny's demo batches), 4k vocabulary, 19.5 -> 5.9 ms;
1,007 x 4k 85 -> 53 ms; 8,184 x 4k 706 -> 480 ms; 1,023 x 32k 922 -> 566 ms; 29 x 152k 1,198 -> 107
ms; 199 x 152k 1,093 -> 808 ms.

Only gym's trainers take this path (`trainer(trainer_cls)` wraps their `compute_loss`); any other
SFTTrainer in the process keeps TRL's function.
"""

from __future__ import annotations

import contextvars
from typing import Any

# Trained-on positions x vocabulary size up to which gym computes the loss itself (the log-probs kept
# for the backward pass: 128 MiB in fp32); above it, TRL's checkpointed chunks bound the memory.
BUDGET = 2**25
# Logits per piece (8 MiB in fp32, cache-sized on a CPU): 512 positions of a 4k vocabulary, 64 of 32k+.
PIECE = 2**21
_active: contextvars.ContextVar[bool] = contextvars.ContextVar("gym_lm_loss", default=False)
_trl_loss: Any = None


def install() -> bool:
    """Route TRL's chunked SFT loss through `_loss` (once per process). False where this TRL has no such
    function (another TRL than the one gym pins): its own loss then runs, unchanged."""
    global _trl_loss
    from trl.trainer import sft_trainer

    if _trl_loss is None:
        original = getattr(sft_trainer, "_chunked_cross_entropy_loss", None)
        if original is None:
            return False
        _trl_loss = original
        sft_trainer._chunked_cross_entropy_loss = _loss
    return True


def trainer(trainer_cls: type) -> type:
    """`trainer_cls` (SFTTrainer or a subclass) whose loss computations take gym's path."""
    if not install():
        return trainer_cls

    class GymLoss(trainer_cls):  # type: ignore[misc, valid-type]
        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            token = _active.set(True)
            try:
                return super().compute_loss(*args, **kwargs)
            finally:
                _active.reset(token)

    GymLoss.__name__ = GymLoss.__qualname__ = trainer_cls.__name__
    return GymLoss


def _loss(
    hidden_states: Any,
    lm_head_weight: Any,
    chunk_size: int,
    labels: Any = None,
    shift_labels: Any = None,
    num_items_in_batch: Any = None,
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
    lm_head_bias: Any = None,
) -> tuple[Any, Any, Any, Any]:
    """TRL's `_chunked_cross_entropy_loss` contract: (loss, correct tokens, entropy sum, valid tokens)."""
    import torch
    import torch.nn.functional as F

    trl_args = (hidden_states, lm_head_weight, chunk_size)
    trl_kwargs = {
        "labels": labels,
        "shift_labels": shift_labels,
        "num_items_in_batch": num_items_in_batch,
        "logit_scale": logit_scale,
        "final_logit_softcapping": final_logit_softcapping,
        "lm_head_bias": lm_head_bias,
    }
    if not _active.get() or hasattr(lm_head_weight, "ds_id") or (labels is None and shift_labels is None):
        return _trl_loss(*trl_args, **trl_kwargs)  # type: ignore[no-any-return]
    if shift_labels is not None:  # already aligned with the hidden states (context parallelism)
        hidden = hidden_states.reshape(-1, hidden_states.size(-1))
        targets = shift_labels.reshape(-1)
    else:
        hidden = hidden_states[..., :-1, :].reshape(-1, hidden_states.size(-1))
        targets = labels[..., 1:].reshape(-1)
    valid = targets != -100
    n_valid = valid.sum()
    count = int(n_valid)  # one host sync, as TRL's chunk count has
    if count == 0 or count * lm_head_weight.size(0) > BUDGET:
        return _trl_loss(*trl_args, **trl_kwargs)  # type: ignore[no-any-return]
    hidden, targets = hidden[valid], targets[valid]
    rows = max(64, min(512, PIECE // lm_head_weight.size(0)))
    loss = correct = entropy = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, count, rows):
        logits = hidden[start : start + rows].float() @ lm_head_weight.float().t()
        if lm_head_bias is not None:
            logits = logits + lm_head_bias.float()
        if logit_scale != 1.0:
            logits = logits * logit_scale
        if final_logit_softcapping is not None:
            logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
        log_p = F.log_softmax(logits, dim=-1)
        piece = targets[start : start + rows]
        loss = loss + F.nll_loss(log_p, piece, reduction="sum")
        with torch.no_grad():
            correct = correct + (logits.argmax(dim=-1) == piece).sum().float()
            entropy = entropy - (log_p.exp() * log_p).sum()
    if num_items_in_batch is None:
        loss = loss / n_valid
    else:
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss, correct, entropy, n_valid
