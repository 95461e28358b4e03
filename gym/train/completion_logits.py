"""Preference log-probs from the completion positions alone: the LM head skips prompt and padding.

TRL 1.12's DPOTrainer and KTOTrainer project every position of each prompt + completion row to the
vocabulary, then mask all but the completion: log-softmax, entropy and the logits metrics run over the
whole [rows, length, vocabulary] block. On the demo data (prompts of ~21 tokens, answers of ~3) that is
about six times the positions the loss reads. gym's trainers hand TRL's own `_compute_loss` and
`compute_ref_log_probs` a compact batch instead: per row, the position before the completion and the
completion itself (each ids / completion-mask pair, KTO's KL rows too, gathered into [rows, longest
completion + 1]), while the model still reads every token: during the call, a pre-hook on each model
TRL calls swaps the full ids back in, and a pre-hook on that model's output embedding gathers the
compact positions' hidden states, so the LM head (and any logit scaling or softcapping after it) runs
on those alone; a forward that computes its logits without calling that module (a patched one) gets
its full logits cut to the windows after it returns, so the arithmetic holds either way. Everything
TRL derives from the logits (every loss type, ld_alpha, WPO weights, KTO's KL estimate, entropy, token
accuracy, the logits metrics) is masked by the completion mask, so it comes out the same;
`attention_mask` stays whole (TRL counts tokens with it). Tests compare loss, gradients and metrics
with TRL's own path.

Measured on this machine (OMP_NUM_THREADS=1, gym-tiny, the demo data, batches of 16, 40 steps,
`benchmarks/methods.py`), gym / the TRL trainer's tokens/s: dpo 2.8x, ipo 2.5x, cdpo 2.6x, hinge 2.5x,
kto 2.0-2.4x (1.00-1.14x before). The gain follows the share of prompt and padding in a batch.
DPO's batches (a pair's chosen row, then its rejected row) also run each pair as one row with its
prompt once, where that is exact (gym.train.shared_prompt); the windows are then gathered from the
shared rows. `pair_trainer` does the windows and the shared rows for the trainers that build their
own forward (CPO, which gym's simpo runs: 2.5x; ORPO: 1.6x).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from gym.train import shared_prompt


def window(completion_mask: Any) -> tuple[Any, Any] | None:
    """Per row, the positions whose logits TRL reads (it shifts: the logit at t predicts token t + 1).

    Returns (`index`, `mask`), both [rows, K + 1]: `index` the full positions to keep (the one before a
    row's first completion token, then K more), `mask` the completion mask at those positions, zero at
    the first (TRL's shift drops it) and past the row's end. None when the window would not be shorter
    than the row (nothing to save)."""
    import torch

    length = completion_mask.shape[1]
    shifted = completion_mask[:, 1:].bool()  # TRL's shift_completion_mask: labels at positions 1..L-1
    if length < 2 or not bool(shifted.any()):
        return None
    steps = torch.arange(length - 1, device=completion_mask.device)
    has = shifted.any(dim=1)
    first = torch.where(has, shifted.int().argmax(dim=1), 0)  # logit position of each row's first label
    last = torch.where(has, (shifted * steps).amax(dim=1), 0)
    span = int((last - first + 1).clamp(min=0).amax())  # K: the widest run of labels, gaps included
    if span + 1 >= length:
        return None
    offsets = torch.arange(span + 1, device=completion_mask.device)
    raw = first[:, None] + offsets  # logit positions f .. f + K; the last one's logit TRL drops
    index = raw.clamp(max=length - 1)
    mask = completion_mask.gather(1, index) * (raw <= length - 1) * (offsets > 0)
    return index, mask.to(completion_mask.dtype)


def gather(states: Any, index: Any) -> Any:
    """states [rows, length, d] at the window positions `index` [rows, K + 1]."""
    return states.gather(1, index.to(states.device)[..., None].expand(-1, -1, states.shape[-1]))


def _base(module: Any, unwrap: Any) -> Any:
    """The transformers model under a DDP / accelerate wrapper and a PEFT one."""
    from peft import PeftModel

    model = unwrap(module)
    return model.get_base_model() if isinstance(model, PeftModel) else model


def _output_head(module: Any, unwrap: Any) -> Any:
    get = getattr(_base(module, unwrap), "get_output_embeddings", None)
    return get() if callable(get) else None


def _attention(model: Any) -> str:
    return str(getattr(getattr(model, "config", None), "_attn_implementation", "sdpa"))


@dataclasses.dataclass(frozen=True)
class _Cut:
    """What a forward under way reads: the window `index` of rows of `shape` (shared rows, if any)."""

    index: Any
    shape: tuple[int, ...]
    shared: shared_prompt.Shared | None = None

    def take(self, states: Any) -> Any:
        if self.shared is not None:
            return self.shared.gather(states, self.index)
        return gather(states, self.index)


@contextlib.contextmanager
def compact(
    inputs: dict[str, Any],
    sequences: list[tuple[str, str]],
    models: list[Any],
    unwrap: Any,
    pairs: bool = False,
) -> Iterator[dict[str, Any] | None]:
    """`inputs` with each (ids key, completion-mask key) pair of `sequences` cut to its completion
    windows, while `models` (the modules TRL will call with them) see the full ids and project only
    the windows to the vocabulary. Yields None (nothing hooked) where that can't be done or saves
    nothing; a pair whose windows save nothing stays whole. `pairs` (DPO's batches: chosen rows, then
    rejected rows): a keyword call with the batch's own `attention_mask` runs each pair as one row
    with its prompt once (gym.train.shared_prompt), where the layout and every model allow it."""
    called = list({id(m): m for m in models if m is not None}.values())
    heads = [_output_head(m, unwrap) for m in called]
    windows = {key: window(inputs[mask_key]) for key, mask_key in sequences if key in inputs}
    if not any(windows.values()) or any(h is None for h in heads):
        yield None
        return
    small = dict(inputs)
    attention = inputs.get("attention_mask")
    bases = {id(m): _base(m, unwrap) for m in called}
    # Every ids tensor a model may be called with in here -> (those ids, the full ids, the cut, shared).
    known: dict[int, tuple[Any, Any, _Cut, shared_prompt.Shared | None]] = {}
    for key, mask_key in sequences:
        found = windows.get(key)
        if found is None:
            continue
        index, mask = found
        full = inputs[key]
        small[key], small[mask_key] = full.gather(1, index), mask
        shared = None
        if pairs and key == "input_ids" and attention is not None:
            shared = shared_prompt.share(full, attention, inputs[mask_key])
            if shared is not None and not all(
                shared_prompt.fits(b, shared.ids.shape[1]) for b in bases.values()
            ):
                shared = None
        cut = _Cut(index, tuple(full.shape))
        known[id(small[key])] = (small[key], full, cut, shared)
        known[id(full)] = (full, full, cut, None)  # a wrapper (DDP, PEFT) passing the swapped ids on
        if shared is not None:
            known[id(shared.ids)] = (
                shared.ids,
                shared.ids,
                _Cut(index, tuple(shared.ids.shape), shared),
                None,
            )
    # The cut of the forward under way, and whether the output layer took it.
    current: list[Any] = [None, False]

    def restore_ids(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        positional = "input_ids" not in kwargs and bool(args)
        ids = args[0] if positional else kwargs.get("input_ids")
        entry = known.get(id(ids))
        if entry is None or entry[0] is not ids:
            current[:] = [None, False]  # a call this context didn't cut: its logits stay whole
            return None
        _, full, cut, shared = entry
        if (
            shared is not None
            and not positional
            and kwargs.get("attention_mask") is attention
            and not kwargs.get("output_router_logits")  # an MoE's router statistics count every token
            and set(kwargs) <= {"input_ids", "attention_mask", "use_cache", "output_router_logits"}
        ):  # other inputs (position ids, images, token types) are laid out by row: TRL's rows
            current[:] = [_Cut(cut.index, tuple(shared.ids.shape), shared), False]
            mask = shared.mask(_attention(bases.get(id(module))))
            return args, {
                **kwargs,
                "input_ids": shared.ids,
                "attention_mask": mask,
                "position_ids": shared.positions,
            }
        current[:] = [cut, False]
        if full is ids:
            return None
        if positional:
            return (full, *args[1:]), kwargs
        return args, {**kwargs, "input_ids": full}

    def keep_window(module: Any, args: tuple[Any, ...]) -> Any:
        cut = current[0]
        if cut is None:
            return None
        hidden = args[0]
        if tuple(hidden.shape[:2]) != cut.shape:
            return None  # not the sequence's hidden states: left to `cut_logits`
        current[1] = True
        return (cut.take(hidden), *args[1:])

    def cut_logits(module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        """After the model: if its output layer didn't take the window (a patched forward computing the
        logits itself), cut the full logits to it, so TRL's arithmetic still lines up."""
        cut, took = current
        current[:] = [None, False]
        logits = getattr(output, "logits", None)
        if cut is None or took or logits is None:
            return None
        if tuple(logits.shape[:2]) != cut.shape:
            raise RuntimeError(
                f"gym's completion-only logits expected logits for {cut.shape} positions, got "
                f"{tuple(logits.shape[:2])}: this model's forward slices them itself"
            )
        output.logits = cut.take(logits)
        return output

    handles = []
    try:
        for m in called:
            handles.append(m.register_forward_pre_hook(restore_ids, with_kwargs=True))
            handles.append(m.register_forward_hook(cut_logits, with_kwargs=True))
        for head in {id(h): h for h in heads}.values():  # a LoRA policy and its reference share one
            handles.append(head.register_forward_pre_hook(keep_window))
        yield small
    finally:
        for handle in handles:
            handle.remove()


# The (ids, completion mask) pairs each TRL trainer's loss reads logits for.
SEQUENCES = {
    "DPOTrainer": [("input_ids", "completion_mask")],
    "KTOTrainer": [("input_ids", "completion_mask"), ("KL_input_ids", "KL_completion_mask")],
}


def trainer(trainer_cls: type) -> type:
    """`trainer_cls` (TRL's DPOTrainer or KTOTrainer, or a subclass) computing its log-probs from
    completion windows: TRL's `_compute_loss` and `compute_ref_log_probs` run on the compact batch."""
    sequences = next(SEQUENCES[c.__name__] for c in trainer_cls.__mro__ if c.__name__ in SEQUENCES)
    pairs = any(c.__name__ == "DPOTrainer" for c in trainer_cls.__mro__)  # rows: chosen ones, then rejected

    class CompletionLogits(trainer_cls):  # type: ignore[misc, valid-type]
        def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
            if return_outputs or self.args.torch_compile:  # callers of the outputs expect full-length logits
                return super()._compute_loss(model, inputs, return_outputs)
            called = [model, self.model, self.ref_model]  # TRL's policy, PEFT-reference and reference calls
            with compact(inputs, sequences, called, self.accelerator.unwrap_model, pairs) as small:
                return super()._compute_loss(model, inputs if small is None else small, return_outputs)

        def compute_ref_log_probs(self, model: Any, inputs: dict[str, Any]) -> Any:
            if self.args.torch_compile:
                return super().compute_ref_log_probs(model, inputs)
            with compact(inputs, sequences, [model], self.accelerator.unwrap_model, pairs) as small:
                return super().compute_ref_log_probs(model, inputs if small is None else small)

    return CompletionLogits


def pair_trainer(trainer_cls: type) -> type:
    """`trainer_cls` (TRL's CPOTrainer, which gym's simpo runs, or ORPOTrainer, or a subclass) computing
    its pairs' log-probs from completion windows.

    Their `concatenated_forward` reads the logits at the answers' positions (log-probs; CPO's NLL term
    when `cpo_alpha` > 0 also masks the prompt) and reports the mean of every logit of every position
    as `logits/chosen` and `logits/rejected`. Here the LM head sees the windows alone; the logits'
    mean comes from the hidden states, exactly: the mean over the vocabulary of a linear head's output
    at a position is that position's hidden state times the mean weight row (plus the mean bias).
    ORPO's NLL term reads the chosen rows' prompts too (TRL 1.12's choice): those rows stay whole and
    only the rejected ones are cut. Where a model changes its head's output (Gemma 2's softcapping,
    Cohere's or Granite's scaling) or computes logits without that module, the first batch shows it and
    the trainer keeps TRL's own forward from then on."""
    import torch
    from torch import nn

    IGNORE = -100  # the label of "not an answer token" in these trainers, fixed in TRL 1.12
    orpo = any(c.__name__ == "ORPOTrainer" for c in trainer_cls.__mro__)

    class PairCompletionLogits(trainer_cls):  # type: ignore[misc, valid-type]
        _gym_windows = True  # set False for good once a model shows it post-processes its head's output

        def concatenated_forward(self, model: Any, batch: dict[str, Any]) -> Any:
            if (
                self.is_encoder_decoder
                or self.aux_loss_enabled
                or self.args.torch_compile
                or not self._gym_windows
            ):
                return super().concatenated_forward(model, batch)
            head = _output_head(model, self.accelerator.unwrap_model)
            cat = self.concatenated_inputs(
                batch,
                is_encoder_decoder=False,
                padding_value=self.padding_value if orpo else self.pad_token_id,
                device=self.accelerator.device,
            )
            labels, ids = cat["concatenated_labels"], cat["concatenated_input_ids"]
            attention = cat["concatenated_attention_mask"]
            chosen = batch["chosen_labels"].shape[0]
            cut = chosen if orpo else 0  # rows from `cut` on are cut to their windows
            found = window((labels[cut:] != IGNORE).long())
            if found is None or type(head) is not nn.Linear:
                return super().concatenated_forward(model, batch)
            index, mask = found
            # Each pair as one row, its prompt once, every position of TRL's rows kept (padding too:
            # the logits' means read it); `at` reads TRL's rows' positions from whichever rows ran.
            base = _base(model, self.accelerator.unwrap_model)
            shared = shared_prompt.share(ids, attention, (labels != IGNORE).long(), padding=True)
            if shared is not None and not shared_prompt.fits(base, shared.ids.shape[1]):
                shared = None
            run = shared.ids if shared is not None else ids
            rows = torch.arange(ids.shape[0], device=ids.device)
            everywhere = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)

            def at(states: Any, positions: Any, which: Any) -> Any:
                if shared is not None:
                    return shared.gather(states, positions, which)
                return states[which.to(states.device)[:, None], positions.to(states.device)]

            seen: dict[str, Any] = {}

            def keep_window(module: Any, args: tuple[Any, ...]) -> Any:
                hidden = args[0]
                if "means" in seen or tuple(hidden.shape[:2]) != tuple(run.shape):
                    return None
                # Each position's mean logit, at every position of TRL's rows: [rows, length].
                means = hidden.detach().float() @ module.weight.detach().float().mean(dim=0)
                if module.bias is not None:
                    means = means + module.bias.detach().float().mean()
                seen["means"] = at(means, everywhere, rows)
                windows = at(hidden, index, rows[cut:])
                if not cut:
                    return (windows, *args[1:])
                seen["windows"] = nn.functional.linear(windows, module.weight, module.bias)
                # The head's own call: the chosen rows whole.
                return (at(hidden, everywhere[:cut], rows[:cut]), *args[1:])

            handles = [
                head.register_forward_pre_hook(keep_window),
                head.register_forward_hook(lambda module, args, output: seen.setdefault("head", output)),
            ]
            kwargs: dict[str, Any] = {"attention_mask": attention}
            if shared is not None:
                kwargs = {"attention_mask": shared.mask(_attention(base)), "position_ids": shared.positions}
            try:
                outputs = model(run, use_cache=False, **kwargs)
            finally:
                for handle in handles:
                    handle.remove()
            if "means" not in seen or outputs.logits is not seen.get("head"):
                # Logits post-processed after the head, or made without it: TRL's forward from now on.
                self._gym_windows = False
                del outputs, seen
                return super().concatenated_forward(model, batch)
            logits: Any = outputs.logits  # ORPO: [chosen rows, length, vocab]; CPO: [rows, K + 1, vocab]
            windows = seen.get("windows", logits)
            targets = torch.where(mask.bool(), labels[cut:].gather(1, index), IGNORE)
            means = seen["means"]
            if (
                orpo
            ):  # TRL's NLL: the chosen rows, prompt and answer; the logits' means without the last position
                whole = torch.where(attention[:chosen] == 1, ids[:chosen], IGNORE)
                nll = cross_entropy(logits, whole, IGNORE)
                chosen_logps = self.get_batch_logps(logits, labels[:chosen], average_log_prob=True)
                rejected_logps = self.get_batch_logps(windows, targets, average_log_prob=True)
                return chosen_logps, rejected_logps, logits[:, :-1], means[chosen:, :-1], nll
            if self.cpo_alpha == 0:
                nll = torch.tensor(0.0).to(self.accelerator.device)
            else:  # CPO's cross-entropy over the chosen answers' labels, from the windows
                nll = cross_entropy(windows[:chosen], targets[:chosen], IGNORE)
            average = self.loss_type in ("ipo", "simpo")
            logps = self.get_batch_logps(windows, targets, average_log_prob=average, is_encoder_decoder=False)
            return logps[:chosen], logps[chosen:], means[:chosen], means[chosen:], nll

    return PairCompletionLogits


def cross_entropy(logits: Any, labels: Any, ignore: int) -> Any:
    """Mean next-token cross-entropy over the labelled positions, as TRL's CPO and ORPO compute it."""
    from torch import nn

    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1).to(logits.device),
        ignore_index=ignore,
    )
