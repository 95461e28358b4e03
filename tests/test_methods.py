"""The preference family learns: each method's held-out signal moves the right way from its start.

Every test starts from `warm_tiny` (gym-tiny after a short SFT) and trains a few steps on the demo
preference (or KTO) data, with the held-out split for the signal. Adaptation types vary across the
methods so both reference modes (precomputed, live) and PiSSA's reference adapter are exercised.
"""

from __future__ import annotations

import math

import pytest
import torch

from gym import train
from gym.errors import ConfigError
from gym.models import load_model, load_tokenizer
from gym.train import TrainConfig
from gym.train.config import LoraSettings
from tests.helpers import tokenized

LORA = LoraSettings(r=16, alpha=32)

# method -> (finetuning_type, learning rate, reference mode it should pick, training loss at step 1)
# Reference-based losses start where policy = reference: sigmoid log 2, IPO (1 / 2 beta)^2, hinge 1.
PAIRWISE = {
    "dpo": ("full", 1e-3, "precomputed", math.log(2)),
    "ipo": ("lora", 1e-3, "live", (1 / (2 * 0.1)) ** 2),
    "cdpo": ("full", 1e-3, "precomputed", math.log(2)),
    "hinge": ("pissa", 1e-3, "live", 1.0),
    "orpo": ("full", 1e-3, None, None),
    "simpo": ("lora", 1e-3, None, None),
}


def preference_run(model, method, finetuning_type, lr, data=("demo_dpo", "demo_dpo_eval"), **fields):
    config = TrainConfig(
        method=method,
        finetuning_type=finetuning_type,
        learning_rate=lr,
        max_steps=20,
        per_device_train_batch_size=16,
        logging_steps=5,
        lora=LORA,
        **fields,
    )
    return train.run(config, model, tokenized(data[0], model), tokenized(data[1], model, max_samples=64))


@pytest.mark.parametrize("method", sorted(PAIRWISE))
def test_pairwise_methods_raise_the_held_out_reward_margin(warm_tiny, method):
    finetuning_type, lr, mode, first_loss = PAIRWISE[method]
    result = preference_run(warm_tiny, method, finetuning_type, lr)
    assert result.metric_name == "reward_margin"
    # Held-out evaluation is deterministic: any rise beyond float noise is the method's doing.
    assert result.metric_last > result.metric_first + 1e-4, (result.metric_first, result.metric_last)
    assert result.metric_last == result.eval_after["eval_rewards/margins"]
    if mode is None:  # reference-free: no reference to choose
        assert "reference" not in result.choices
        return
    assert result.choices["reference"].startswith(mode)
    # Before training the policy is the reference: the margin is exactly 0 (PiSSA included, whose
    # residual base alone is not the starting model), and the loss is its value at zero margin.
    assert result.metric_first == pytest.approx(0.0, abs=1e-6)
    assert result.losses[0] == (1, pytest.approx(first_loss, rel=1e-4))


def test_kto_raises_desirable_over_undesirable_log_probability(warm_tiny):
    result = preference_run(warm_tiny, "kto", "full", 3e-4, data=("demo_kto", "demo_kto_eval"))
    assert result.metric_name == "logp_gap"
    gap_before = result.eval_before["eval_logps/chosen"] - result.eval_before["eval_logps/rejected"]
    assert result.metric_first == pytest.approx(gap_before)
    assert result.metric_last > result.metric_first + 0.05, (result.metric_first, result.metric_last)
    assert result.eval_after["eval_rewards/margins"] > 0  # rewards: log-ratios to the reference, 0 at start
    # Its batches carry input_ids: real tokens are counted (20 steps of 16 rows, each well over 5 tokens).
    assert result.tokens_seen > 20 * 16 * 5 and result.tokens_per_second


def same_policy_eval(method: str, model_ref, data, tmp_path, **settings) -> dict[str, float]:
    """Held-out metrics of `method` (TRL's evaluate) on `data` (one batch of 16) at a fixed LoRA policy:
    the adapter moved away from its reference copy, the same for every call."""
    from gym.train import METHODS, adapters

    config = TrainConfig(
        method=method, finetuning_type="lora", per_device_train_batch_size=16, max_steps=1, **settings
    )
    config, _ = train.plan(config.model_copy(update={"reference": "live"}), model_ref, 16, 16)
    torch.manual_seed(0)  # the same adapter initialisation for every call
    model = adapters.adapt(load_model(model_ref), config, model_ref, tmp_path)
    trainer = METHODS[method](
        model=model,
        tokenizer=load_tokenizer(model_ref),
        config=config,
        train_data=data,
        eval_data=data,
        output_dir=tmp_path,
        peft_config=None,
    )
    torch.manual_seed(0)
    for name, p in trainer.model.named_parameters():
        if "lora_B.default" in name:
            p.data.normal_(std=1.0)
    metrics = trainer.evaluate()
    metrics["chosen_token_ce"] = chosen_token_ce(trainer.model, data)
    return metrics


def chosen_token_ce(model, data) -> float:
    """Cross-entropy of the chosen answers' tokens, pooled over the batch (what an SFT loss on them is)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in data:
            prompt, chosen = row["prompt_ids"], row["chosen_ids"]
            logits = model(torch.tensor([prompt + chosen])).logits[0, len(prompt) - 1 : -1]
            total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(chosen), reduction="sum"))
            count += len(chosen)
    return total / count


def test_cdpo_is_dpo_plus_label_smoothing_times_the_margin(warm_tiny, tmp_path):
    """cDPO's loss per pair is -log sigmoid(x) + eps x (x: the reward margin), evaluated through TRL."""
    from datasets import load_from_disk

    data = load_from_disk(str(tokenized("demo_dpo_eval", warm_tiny, max_samples=16)))
    losses = {method: same_policy_eval(method, warm_tiny, data, tmp_path) for method in ("dpo", "cdpo")}
    margin = losses["dpo"]["eval_rewards/margins"]
    assert abs(margin) > 0.01 and losses["cdpo"]["eval_rewards/margins"] == pytest.approx(margin)
    assert losses["cdpo"]["eval_loss"] - losses["dpo"]["eval_loss"] == pytest.approx(0.1 * margin, rel=1e-3)


def test_sft_loss_weight_adds_the_chosen_answers_cross_entropy(warm_tiny, tmp_path):
    """RPO / LLaMA-Factory's pref_ftx: the loss is the preference loss + w x the chosen tokens' CE."""
    from datasets import load_from_disk

    data = load_from_disk(str(tokenized("demo_dpo_eval", warm_tiny, max_samples=16)))
    for method in ("dpo", "cdpo", "simpo"):
        plain = same_policy_eval(method, warm_tiny, data, tmp_path)
        added = same_policy_eval(method, warm_tiny, data, tmp_path, sft_loss_weight=0.5)
        ce, extra = plain["chosen_token_ce"], added["eval_loss"] - plain["eval_loss"]
        assert ce > 1.0 and extra == pytest.approx(0.5 * ce, rel=1e-3), method
    with pytest.raises(ValueError, match="ORPO's loss has an SFT term of its own"):
        TrainConfig(method="orpo", sft_loss_weight=1.0)
    with pytest.raises(ValueError, match="TRL's KTO loss has no SFT term"):
        TrainConfig(method="kto", sft_loss_weight=1.0)


@pytest.mark.parametrize(
    ("method", "dataset", "needs"),
    [
        ("kto", "demo_sft", "a boolean label"),
        ("orpo", "demo_kto", "chosen and rejected"),
        ("simpo", "demo_sft", "chosen and rejected"),
        ("hinge", "demo_kto", "chosen and rejected"),
        ("sft", "demo_dpo", "instruction and output"),
    ],
)
def test_wrong_data_says_what_the_method_needs_before_training(gym_home, warm_tiny, method, dataset, needs):
    with pytest.raises(ConfigError, match=f"needs a .* dataset .*{needs}") as err:
        train.run(TrainConfig(method=method), warm_tiny, tokenized(dataset, warm_tiny, max_samples=8))
    assert "format" in str(err.value)
    assert not list((gym_home / "models").glob(f"{method}-*")), "nothing was started"


def test_method_names_and_their_losses_agree():
    with pytest.raises(ConfigError, match=r"use method dpo with --train\.loss_type hinge"):
        train.config.with_defaults(TrainConfig(method="ipo", loss_type="hinge"), {})
    with pytest.raises(ConfigError, match="label_smoothing applies to the sigmoid loss"):
        from gym.train import dpo

        dpo.check(train.config.with_defaults(TrainConfig(method="ipo", label_smoothing=0.1), {}))
    simpo = train.config.with_defaults(TrainConfig(method="simpo", beta=2.5), {})
    assert simpo.simpo_gamma == 1.25  # the paper's gamma / beta = 0.5
    assert train.config.with_defaults(TrainConfig(method="cdpo"), {}).label_smoothing == 0.1


@pytest.mark.parametrize("method", ["orpo", "simpo"])
def test_row_trainers_count_the_tokens_they_train_on(warm_tiny, method):
    """ORPO/SimPO batches have no input_ids for the Trainer to count; gym counts what the model reads,
    each answer after its prompt, so their tokens/s exist like every other method's."""
    from datasets import load_from_disk

    from gym.data.ingest import load_meta
    from gym.train.pairs import fitting, row_from_ids

    data = tokenized("demo_dpo_eval", warm_tiny, max_samples=32)
    max_length = load_meta(data)["settings"]["cutoff_len"]
    rows = [row_from_ids(r, max_length) for r in fitting(load_from_disk(str(data)), max_length)]
    assert len(rows) == 32, "2 steps of 16 pairs: one epoch, every pair once"
    config = TrainConfig(method=method, max_steps=2, per_device_train_batch_size=16)
    result = train.run(config, warm_tiny, data)
    assert result.tokens_seen == sum(len(r["chosen_input_ids"]) + len(r["rejected_input_ids"]) for r in rows)
    assert result.tokens_per_second
