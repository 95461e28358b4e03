"""Reward modelling (method rm): a score head on gym-tiny learns the demo's preferences, only the weights
its adaptation type trains move, and the saved model is a reward gym.rewards loads (`reward_model:<dir>`)
that ranks held-out answers exactly as the trainer measured.

Every run starts from gym-tiny's random weights (no SFT first) on the demo pairs, with the held-out
split evaluated in one batch, so the trainer's reward accuracy is the plain share of pairs ranked right.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym import train
from gym.errors import ConfigError
from gym.models import ModelRef, derived
from gym.train import TrainConfig, rm
from gym.train.config import LoraSettings
from tests.helpers import tiny, tokenized

TARGETS = ["q_proj", "v_proj"]
HEAD = "score.weight"


def adapted(name: str) -> bool:
    return any(f".{t}." in name for t in TARGETS)


# finetuning_type -> (learning rate, extra TrainConfig fields, the tensors that must change: all others
# must come out bit-identical to the start reward model's).
CASES = {
    "full": (1e-3, {}, lambda n: True),
    "freeze": (1e-3, {"freeze": {"layers": 1}}, lambda n: n.startswith("model.layers.1.") or n == HEAD),
    "lora": (3e-3, {}, lambda n: adapted(n) or n == HEAD),
    "qlora": (3e-3, {"quant": {"bits": 4}}, lambda n: adapted(n) or n == HEAD),
}


def rm_run(model: ModelRef, finetuning_type: str) -> train.TrainResult:
    lr, fields, _ = CASES[finetuning_type]
    config = TrainConfig(
        method="rm",
        finetuning_type=finetuning_type,
        learning_rate=lr,
        num_train_epochs=1,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=100,  # one batch: accuracy is the share of the 100 held-out pairs
        logging_steps=10,
        **{"lora": LoraSettings(r=8, alpha=16, target_modules=TARGETS), **fields},
    )
    return train.run(config, model, tokenized("demo_dpo", model), tokenized("demo_dpo_eval", model))


def start_weights(model: ModelRef, seed: int = 42) -> dict[str, torch.Tensor]:
    """The reward model a stage starts from: gym.train.run seeds the new head with the stage's seed."""
    from transformers import set_seed

    set_seed(seed)
    return {k: v.detach().clone() for k, v in rm.load_model(model).state_dict().items()}


@pytest.fixture(scope="module")
def full_rm(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRef, train.TrainResult]:
    """gym-tiny trained as a reward model (full fine-tuning), once for the tests that read it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(tmp_path_factory.mktemp("rm") / "gym_home"))
        base = tiny()
        return base, rm_run(base, "full")


def test_rm_raises_held_out_reward_accuracy(full_rm):
    _, result = full_rm
    assert result.metric_name == "reward_accuracy"
    assert result.metric_last == result.eval_after["eval_rewards/accuracies"]
    assert result.metric_first == result.eval_before["eval_rewards/accuracies"]
    # Held-out evaluation is deterministic on CPU: the rise is the training's (measured: 0.48 -> 0.60).
    assert result.metric_last > result.metric_first + 0.05, (result.metric_first, result.metric_last)
    assert result.eval_after["eval_rewards/margins"] > result.eval_before["eval_rewards/margins"]
    assert result.loss_last < result.loss_first
    # Its batches carry input_ids: real tokens are counted (50 steps of 16 pairs, 2 sequences of > 10 tokens).
    assert result.tokens_seen > 50 * 16 * 2 * 10 and result.tokens_per_second


@pytest.mark.parametrize("finetuning_type", sorted(CASES))
def test_each_type_trains_the_head_and_only_its_weights(gym_home, full_rm, finetuning_type):
    if finetuning_type == "full":
        base, result = full_rm
    else:
        base = tiny()
        result = rm_run(base, finetuning_type)
    before, after = start_weights(base), load_file(str(Path(result.model_dir) / "model.safetensors"))
    assert set(before) == set(after), "the saved model is the start reward model's tensors, nothing else"
    should_change = CASES[finetuning_type][2]
    assert {k for k in before if not torch.equal(before[k], after[k])} == {
        k for k in before if should_change(k)
    }
    assert result.eval_after["eval_rewards/margins"] > result.eval_before["eval_rewards/margins"]
    assert json.loads((Path(result.model_dir) / "config.json").read_text())["architectures"] == [
        "LlamaForSequenceClassification"
    ]
    if result.adapter_dir:  # the LoRA family: PEFT's SEQ_CLS task saves the head beside the adapter
        adapter = json.loads((Path(result.adapter_dir) / "adapter_config.json").read_text())
        assert adapter["task_type"] == "SEQ_CLS" and "score" in adapter["modules_to_save"]
        assert 0 < result.trainable_params < result.total_params


def _held_out_pairs() -> tuple[list, list, list]:
    from datasets import load_from_disk

    from gym.data.ingest import ingest
    from gym.data.registry import resolve_dataset

    records = load_from_disk(str(ingest(resolve_dataset("demo_dpo_eval")).path))
    return records["prompt"], records["chosen"], records["rejected"]


def _win_rate(model_dir: Path) -> float:
    """The share of held-out pairs whose chosen answer `reward_model:<dir>` scores above the rejected."""
    from gym.rewards import load_reward

    reward = load_reward(f"reward_model:{model_dir}")
    prompts, chosen, rejected = _held_out_pairs()
    good = reward(prompts, [[{"role": "assistant", "content": c}] for c in chosen])
    bad = reward(prompts, [[{"role": "assistant", "content": r}] for r in rejected])
    return sum(g > b for g, b in zip(good, bad, strict=True)) / len(good)  # type: ignore[operator]


def test_the_trained_model_is_a_reward_that_ranks_as_the_trainer_measured(full_rm, tmp_path):
    base, result = full_rm
    from gym.models import load_tokenizer

    start_dir = tmp_path / "start"  # the untrained reward model, saved as the stage saves its model
    from transformers import set_seed

    set_seed(42)
    rm.load_model(base).save_pretrained(start_dir)
    load_tokenizer(base).save_pretrained(start_dir)
    (start_dir / "gym_model.json").write_text(json.dumps({"template": base.template}))
    before, after = _win_rate(start_dir), _win_rate(Path(result.model_dir))
    assert after > before + 0.05, (before, after)
    # gym.rewards renders each conversation with the template and reads the score where training did:
    # its ranking of the 100 pairs is the trainer's held-out accuracy (one pair's float tie at most).
    assert before == pytest.approx(result.metric_first, abs=0.011)
    assert after == pytest.approx(result.metric_last, abs=0.011)


def test_rm_trains_on_exactly_the_tokens_gym_rewards_scores(full_rm):
    """gym's pairs (answer ids end at the end-of-turn token) plus the template's trailing "\\n" are what
    the reward model sees at inference: the whole conversation rendered and tokenized in one piece."""
    from datasets import load_from_disk

    from gym.models import load_tokenizer
    from gym.rewards.model import RewardModel

    base, result = full_rm
    tokenizer = load_tokenizer(base)
    tail = rm.turn_end_ids(tokenizer)
    assert tokenizer.decode(tail) == "\n"  # ChatML renders "answer<|im_end|>\n"
    pairs = rm.sequences(load_from_disk(str(tokenized("demo_dpo_eval", base))), tail, None, "held-out")
    scorer = RewardModel(result.model_dir)
    prompts, chosen, rejected = _held_out_pairs()
    for name, answers in (("chosen_ids", chosen), ("rejected_ids", rejected)):
        texts = scorer.texts(prompts, [[{"role": "assistant", "content": a}] for a in answers])
        assert pairs[name] == scorer._tokenizer(texts, add_special_tokens=False)["input_ids"]


def test_pairs_over_cutoff_len_are_left_out(gym_home, caplog):
    from datasets import load_from_disk

    data = load_from_disk(str(tokenized("demo_dpo_eval", tiny())))
    lengths = sorted(
        max(len(p) + len(c), len(p) + len(r)) + 1
        for p, c, r in zip(data["prompt_ids"], data["chosen_ids"], data["rejected_ids"], strict=True)
    )
    cutoff = lengths[len(lengths) // 2]
    kept = rm.sequences(data, [201], cutoff, "held-out")
    assert 0 < len(kept) < len(data) and all(len(ids) <= cutoff for ids in kept["chosen_ids"])
    assert "are longer than cutoff_len" in caplog.text
    from gym.errors import DataError

    with pytest.raises(DataError, match=r"raise --data\.cutoff_len"):
        rm.sequences(data, [201], 5, "held-out")


def test_sft_data_is_refused_before_any_model_loads(gym_home, monkeypatch):
    def no_model(*_, **__):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(rm, "load_model", no_model)
    base = tiny()
    with pytest.raises(ConfigError, match=r"method 'rm' needs a preference dataset .*chosen and rejected"):
        train.run(TrainConfig(method="rm"), base, tokenized("demo_sft", base, max_samples=8))
    assert not list((gym_home / "models").glob("rm-*")), "nothing was started"


def test_a_reward_model_is_refused_where_text_is_generated(full_rm):
    from gym.models import load_model

    base, result = full_rm
    with pytest.raises(ConfigError, match=r"is a reward model .* reward_model:"):
        load_model(derived(base, Path(result.model_dir), result.digest))


def test_export_keeps_the_score_head_and_says_it_is_a_reward_model(full_rm, tmp_path):
    from gym.export import export_model

    _, result = full_rm
    out = export_model(result.stage_dir, tmp_path / "out")
    assert load_file(str(out / "model.safetensors"))[HEAD].shape == (1, 64)
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "AutoModelForSequenceClassification" in card
    assert _win_rate(out) == _win_rate(Path(result.model_dir))


def test_the_flow_skips_exact_match_and_refuses_generation_evals_for_rm():
    from pydantic import ValidationError

    from flows.commands import demo_args, method_of
    from gym.pipeline import TrainFlowConfig

    assert method_of(["--stage", "rm"])[0] == "rm"
    assert demo_args("rm", []) == [
        "--train.method", "rm", "--dataset", "demo_dpo", "--method_eval_dataset", "demo_dpo_eval"
    ]  # fmt: skip
    config = TrainFlowConfig(dataset="demo_dpo", train=TrainConfig(method="rm"))
    assert config.exact_match_dataset() is None and config.held_out_notes() == []
    assert "eval_dataset" not in config.dataset_uses()
    with pytest.raises(ValidationError, match="exact match does not apply"):
        TrainFlowConfig(dataset="demo_dpo", eval_dataset="demo_sft_eval", train=TrainConfig(method="rm"))
    with pytest.raises(ValidationError, match="answers no benchmark questions"):
        TrainFlowConfig(dataset="demo_dpo", benchmarks=["mmlu"], train=TrainConfig(method="rm"))


@pytest.mark.slow
def test_gym_train_stage_rm_end_to_end(gym_home, tmp_path):
    """LLaMA-Factory's `--stage rm` with no other flags: the demo pairs, gym-tiny's defaults; registered
    in MLflow as a text-classification model, exported, and usable as a reward."""
    from mlflow import MlflowClient

    from tests.test_flows import run_script

    gym = str(Path(sys.executable).parent / "gym")
    out = run_script(
        [gym, "train", "--stage", "rm", "--output_dir", str(tmp_path / "rm"), "--json"], gym_home
    )
    assert out["metric_name"] == "reward_accuracy"
    assert out["metric_last"] > out["metric_first"], (out["metric_first"], out["metric_last"])
    assert out["rm_reward_accuracy"] == out["metric_last"]
    assert out["rm_reward_accuracy_before"] == out["metric_first"]
    assert out["exact_match_before"] is None and out["exact_match_after"] is None
    assert out["sft_loss_first"] is None  # no warm start
    from gym import tracking

    uri = tracking.tracking_uri()
    version = MlflowClient(uri).get_model_version(out["model_name"], out["model_version"])
    assert float(version.tags["score.rm_reward_accuracy"]) == pytest.approx(out["metric_last"])
    with tracking.using_uri(uri):
        import mlflow

        info = mlflow.models.get_model_info(f"models:/{out['model_name']}/{out['model_version']}")
    assert info.flavors["transformers"]["task"] == "text-classification"
    assert _win_rate(tmp_path / "rm") > 0.5
