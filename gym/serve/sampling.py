"""Per-request sampling inside one batched `generate`: penalties, temperature, top_p and seed row by row.

transformers' `generate` applies one sampling configuration to a whole batch. A server batches
requests that each carry their own OpenAI parameters, so the engine runs `generate` greedily and
gives it `RowSampler`, a `LogitsProcessor` that draws each sampled row's token with that row's
temperature, nucleus and random generator (`draw`: the rows' distributions batched, one uniform
number per row) and leaves only that token for the greedy step to pick. Greedy rows (temperature
0) pass through untouched. A seeded request draws from its own `torch.Generator`, so its text
does not depend on which other requests share its batch.
`Penalties` runs before it: OpenAI's logit bias, vLLM's repetition penalty on the tokens of each
row's prompt and reply, and OpenAI's presence and frequency penalties on the tokens each row has
generated so far. Sampled rows are cut to their top-k and min-p (vLLM's) as well as their nucleus.
"""

from __future__ import annotations

import secrets
from typing import Any

import torch
from transformers import LogitsProcessor

from gym.serve.params import SamplingParams

SEED_STRIDE = 1_000_003  # choice j of a seeded request draws from seed * SEED_STRIDE + j


def row_generator(seed: int | None, choice: int, device: Any = "cpu") -> Any:
    """The random generator of one choice (on the model's device): derived from the request's seed,
    else fresh entropy."""
    base = secrets.randbits(62) if seed is None else (seed * SEED_STRIDE + choice) % (1 << 62)
    return torch.Generator(device=device).manual_seed(base)


def nucleus(probs: Any, top_p: Any) -> Any:
    """Zero every probability outside each row's top-p nucleus (the most likely token always stays)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above
    sorted_probs = sorted_probs.masked_fill(before >= top_p.unsqueeze(-1), 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def top_k_cut(probs: Any, k: Any) -> Any:
    """Zero every probability below each row's k-th largest (k 0: the row is left whole)."""
    ranked = probs.sort(dim=-1, descending=True).values
    kth = ranked.gather(-1, (k.clamp(min=1, max=probs.shape[-1]) - 1).unsqueeze(-1))
    kth = torch.where(k.unsqueeze(-1) > 0, kth, torch.zeros_like(kth))
    return probs.masked_fill(probs < kth, 0.0)


def min_p_cut(probs: Any, min_p: Any) -> Any:
    """Zero every probability below `min_p` times its row's largest (min_p 0: the row is left whole)."""
    floor = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(-1)
    return probs.masked_fill(probs < floor, 0.0)


def draw(probs: Any, generators: list[Any]) -> Any:
    """One token per row by inverse transform sampling: a uniform number from the row's own generator,
    located in the row's cumulative distribution ([rows, 1] ids). Only the draws are row by row;
    `torch.multinomial` with one generator per row took ~90 us a row at a 4k vocabulary, ~3 ms at
    150k, per generated token. A token of probability 0 is never drawn."""
    u = torch.cat([torch.rand(1, generator=gen, device=gen.device) for gen in generators])
    exact = torch.float32 if probs.device.type == "mps" else torch.float64  # MPS has no float64
    cdf = probs.to(exact).cumsum(dim=-1)
    target = (u.to(probs.device, exact) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)


class RowSampler(LogitsProcessor):
    """LogitsProcessor drawing sampled rows' tokens with per-row parameters (see module docstring)."""

    def __init__(self, params: list[SamplingParams], generators: list[Any]) -> None:
        self.rows = [i for i, p in enumerate(params) if not p.greedy]
        self.temperature = torch.tensor([params[i].temperature for i in self.rows])
        self.top_p = torch.tensor([params[i].top_p for i in self.rows])
        self.nucleus = any(params[i].top_p < 1.0 for i in self.rows)
        self.top_k = torch.tensor([params[i].top_k for i in self.rows])
        self.min_p = torch.tensor([params[i].min_p for i in self.rows])
        self.cut_k = any(params[i].top_k > 0 for i in self.rows)
        self.cut_min_p = any(params[i].min_p > 0 for i in self.rows)
        self.generators = [generators[i] for i in self.rows]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if not self.rows:
            return scores
        index = torch.tensor(self.rows, device=scores.device)
        logits = scores.index_select(0, index).float() / self.temperature.to(scores.device).unsqueeze(-1)
        probs = logits.softmax(dim=-1)
        if self.cut_k:  # vLLM's order: top-k, then the nucleus of what is left, then min-p
            probs = top_k_cut(probs, self.top_k.to(scores.device))
            probs = probs / probs.sum(dim=-1, keepdim=True)
        if self.nucleus:
            probs = nucleus(probs, self.top_p.to(scores.device))
        if self.cut_min_p:
            probs = min_p_cut(probs, self.min_p.to(scores.device))
        picked = draw(probs, self.generators)
        forced = torch.full((len(self.rows), scores.shape[-1]), float("-inf"), device=scores.device)
        forced.scatter_(1, picked, 0.0)
        out = scores.clone()
        out[index] = forced.to(scores.dtype)
        return out


class Penalties(LogitsProcessor):
    """Logit adjustments, row by row, in vLLM's order: each row's `logit_bias` is added to its tokens'
    logits; `repetition_penalty` (vLLM's and transformers') divides the positive logit, and multiplies
    the negative one, of every token the row's prompt or reply holds; then (OpenAI's) a token's logit
    loses `frequency_penalty` for each time the row's reply already holds it, and `presence_penalty`
    once if it holds it at all. Rows are left-padded to `prompt_width`: a row's prompt is its last
    `prompt_lengths[row]` positions of it (the padding before it is no token of the row)."""

    def __init__(
        self,
        params: list[SamplingParams],
        prompt_width: int,
        vocab_size: int,
        prompt_lengths: list[int] | None = None,
    ) -> None:
        self.prompt_width = prompt_width
        self.presence = torch.tensor([p.presence_penalty for p in params])
        self.frequency = torch.tensor([p.frequency_penalty for p in params])
        self.repetition = None
        if any(p.repetition_penalty != 1.0 for p in params):
            self.repetition = torch.tensor([p.repetition_penalty for p in params])
            lengths = torch.tensor(prompt_lengths or [prompt_width] * len(params))
            self.padding = torch.arange(prompt_width).unsqueeze(0) < (prompt_width - lengths).unsqueeze(-1)
        self.bias = None
        if any(p.logit_bias for p in params):
            self.bias = torch.zeros(len(params), vocab_size)
            for row, p in enumerate(params):
                for token, value in p.logit_bias:
                    self.bias[row, token] = value

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.bias is not None:
            width = min(scores.shape[-1], self.bias.shape[-1])  # the head may be wider than the vocabulary
            biased = scores.float()
            biased[:, :width] += self.bias[:, :width].to(scores.device)
            scores = biased.to(scores.dtype)
        if self.repetition is not None:
            scores = self._repeat(input_ids, scores)
        reply = input_ids[:, self.prompt_width :]
        if reply.shape[1] == 0:
            return scores
        counts = torch.zeros(scores.shape, device=scores.device, dtype=torch.float32)
        counts.scatter_add_(1, reply, torch.ones(reply.shape, device=scores.device, dtype=torch.float32))
        frequency = self.frequency.to(scores.device).unsqueeze(-1)
        presence = self.presence.to(scores.device).unsqueeze(-1)
        penalty = counts * frequency + (counts > 0).float() * presence
        return (scores.float() - penalty).to(scores.dtype)

    def _repeat(self, input_ids: Any, scores: Any) -> Any:
        assert self.repetition is not None
        held = torch.ones(input_ids.shape, device=scores.device, dtype=torch.float32)
        held[:, : self.prompt_width].masked_fill_(self.padding.to(scores.device), 0.0)
        seen = torch.zeros(scores.shape, device=scores.device, dtype=torch.float32)
        seen.scatter_add_(1, input_ids, held)
        penalty = self.repetition.to(scores.device).unsqueeze(-1)
        logits = scores.float()
        repeated = torch.where(logits > 0, logits / penalty, logits * penalty)
        top = torch.finfo(scores.dtype).max  # a penalty near 0 must not make a half-precision logit inf
        return torch.where(seen > 0, repeated, logits).clamp(-top, top).to(scores.dtype)
