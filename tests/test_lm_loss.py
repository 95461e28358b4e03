"""SFT's loss without TRL's checkpointed chunks (gym.train.lm_loss): the same numbers and gradients as
TRL's function, in one piece or several, taken only inside gym's trainers and only below the budget;
TRL's chunks elsewhere."""

from __future__ import annotations

import shutil

import pytest
import torch
from trl.trainer import sft_trainer

from gym import train
from gym.train import TrainConfig, lm_loss
from tests.helpers import tiny, tokenized

VOCAB, WIDTH = 96, 16


@pytest.fixture
def trl_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls that went on to TRL's own chunked function."""
    assert lm_loss.install()
    calls: list[int] = []
    original = lm_loss._trl_loss

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(lm_loss, "_trl_loss", counted)
    return calls


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, 50, WIDTH, generator=g)
    weight = torch.randn(VOCAB, WIDTH, generator=g) / 4
    bias = torch.randn(VOCAB, generator=g)
    labels = torch.randint(0, VOCAB, (3, 50), generator=g)
    labels[0, :10] = -100  # a prompt
    labels[1, 35:] = -100  # padding
    labels[2, :] = -100  # a row with nothing to learn
    return hidden, weight, bias, labels


def losses_and_grads(fn, active: bool, **kwargs):
    hidden, weight, bias, labels = batch()
    hidden.requires_grad_()
    weight.requires_grad_()
    token = lm_loss._active.set(active)
    try:
        loss, correct, entropy, valid = fn(hidden, weight, 4, labels=labels, lm_head_bias=bias, **kwargs)
    finally:
        lm_loss._active.reset(token)
    loss.backward()
    return [loss.detach(), correct, entropy.detach(), valid, hidden.grad, weight.grad]


@pytest.mark.parametrize("piece", [lm_loss.PIECE, 64 * VOCAB], ids=["one_piece", "two_pieces"])
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"num_items_in_batch": torch.tensor(90)}, {"logit_scale": 0.5, "final_logit_softcapping": 3.0}],
    ids=["mean", "num_items_in_batch", "scaled_and_softcapped"],
)
def test_gyms_loss_equals_trls_chunks_in_value_metrics_and_gradients(trl_calls, monkeypatch, kwargs, piece):
    monkeypatch.setattr(lm_loss, "PIECE", piece)  # 64 positions a piece: the batch's 74 take two
    ours = losses_and_grads(lm_loss._loss, active=True, **kwargs)
    assert trl_calls == [], "below the budget gym computes the loss itself"
    theirs = losses_and_grads(lm_loss._trl_loss, active=True, **kwargs)
    assert len(trl_calls) == 1
    assert int(ours[3]) == int(theirs[3]) == 40 + 34, "shifted: 40 after the prompt, 34 before the padding"
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6)


def test_trls_chunks_outside_gyms_trainers_above_the_budget_and_without_targets(trl_calls, monkeypatch):
    losses_and_grads(lm_loss._loss, active=False)
    assert len(trl_calls) == 1, "an SFTTrainer that isn't gym's keeps TRL's loss"
    monkeypatch.setattr(lm_loss, "BUDGET", 74 * VOCAB - 1)  # 74 trained-on positions in the batch
    losses_and_grads(lm_loss._loss, active=True)
    assert len(trl_calls) == 2, "one position over the budget: TRL's chunks bound the memory"
    monkeypatch.setattr(lm_loss, "BUDGET", 74 * VOCAB)
    losses_and_grads(lm_loss._loss, active=True)
    assert len(trl_calls) == 2
    hidden, weight, _, labels = batch()
    token = lm_loss._active.set(True)
    try:
        loss, *_ = lm_loss._loss(hidden, weight, 4, labels=torch.full_like(labels, -100))
    finally:
        lm_loss._active.reset(token)
    assert len(trl_calls) == 3 and float(loss) == 0.0, "nothing to learn: TRL's zero loss"


def test_gym_sft_trains_through_it_with_trls_loss_curve(trl_calls, monkeypatch):
    assert sft_trainer._chunked_cross_entropy_loss is lm_loss._loss
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    config = TrainConfig(
        method="sft", learning_rate=3e-3, max_steps=6, per_device_train_batch_size=8, logging_steps=1
    )
    ours = train.run(config, model, data)
    assert trl_calls == [], "gym-tiny's batches of 8 fit the budget"
    assert ours.losses[-1][1] < ours.losses[0][1]
    monkeypatch.setattr(lm_loss, "BUDGET", 0)  # every call to TRL's chunks
    shutil.rmtree(ours.stage_dir)  # the same stage again, trained rather than read back
    theirs = train.run(config, model, data)
    assert len(trl_calls) == 6
    assert [v for _, v in ours.losses] == pytest.approx([v for _, v in theirs.losses], rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_gyms_loss_equals_trls_in_bf16(trl_calls):
    hidden, weight, bias, labels = (t.cuda() for t in batch())
    hidden, weight = hidden.bfloat16().requires_grad_(), weight.bfloat16().requires_grad_()
    results = []
    for fn in (lm_loss._loss, lm_loss._trl_loss):
        token = lm_loss._active.set(True)
        try:
            loss, correct, entropy, valid = fn(hidden, weight, 4, labels=labels, lm_head_bias=bias)
        finally:
            lm_loss._active.reset(token)
        grads = torch.autograd.grad(loss, [hidden, weight])
        results.append([loss.detach(), correct, entropy.detach(), valid, *grads])
    assert len(trl_calls) == 1, "gym's path on the GPU, TRL's for the comparison"
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=1e-3)
