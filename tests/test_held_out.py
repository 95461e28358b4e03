"""Held-out data: `auto` picks the demo's held-out split on demo data only; `val_size` holds out yours.

Scoring a model trained on your data with the demo's digit tasks would report a number about tasks it
never trained for (and pay for generating it), so the flows only pick the demo's held-out data when
they train on demo data; a named dataset is always used as given. `val_size` (LLaMA-Factory's) splits
each stage's own data instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from flows.commands import demo_args
from flows.runner import describe
from gym import preflight
from gym.data.ingest import ingest, load_meta
from gym.data.registry import AUTO, held_out, resolve_dataset
from gym.data.split import held_out_count, split
from gym.errors import ConfigError
from gym.pipeline import OutputSettings, SftThenDpoConfig, TfGrpoFlowConfig, TrainFlowConfig
from gym.train.config import TrainConfig
from tests.test_flows import run_script


@pytest.fixture
def own_sft(tmp_path: Path) -> str:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"instruction": "Say hi.", "output": "hi"}) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture
def own_pairs(tmp_path: Path) -> str:
    path = tmp_path / "pairs.jsonl"
    row = {"prompt": "Say hi.", "chosen": "hi", "rejected": "bye"}
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("given", "trained_on", "expected"),
    [
        (AUTO, "demo_sft", "demo_sft_eval"),
        (AUTO, "demo_kto", "demo_sft_eval"),  # every demo dataset asks the same tasks
        (AUTO, "someone/hub-data", None),
        ("my_eval.jsonl", "demo_sft", "my_eval.jsonl"),  # named: used as given
        (None, "demo_sft", None),
    ],
)
def test_held_out_resolves_auto_only(given, trained_on, expected):
    assert held_out(given, trained_on, "demo_sft_eval") == expected


def test_train_flow_scores_the_demo_on_demo_data_and_nothing_on_yours(own_sft):
    demo = TrainFlowConfig()
    assert demo.eval_dataset == AUTO and demo.exact_match_dataset() == "demo_sft_eval"
    assert demo.dataset_uses()["eval_dataset"] == ("demo_sft_eval", "exact_match")
    assert demo.held_out_notes() == []

    mine = TrainFlowConfig(dataset=own_sft)
    assert mine.exact_match_dataset() is None and "eval_dataset" not in mine.dataset_uses()
    (note,) = mine.held_out_notes()
    assert own_sft in note and "--eval_dataset" in note

    named = TrainFlowConfig(dataset=own_sft, eval_dataset=own_sft)
    assert named.exact_match_dataset() == own_sft and named.held_out_notes() == []
    preflight.check(mine)
    preflight.check(named)


def test_promoting_on_exact_match_needs_held_out_data_of_your_own(own_sft):
    promote = OutputSettings(promote_metric="exact_match_after")
    preflight.check(TrainFlowConfig(output=promote))  # the demo: scored on demo_sft_eval
    with pytest.raises(ConfigError, match=r"records no score 'exact_match_after'.*name it with eval_dataset"):
        preflight.check(TrainFlowConfig(dataset=own_sft, output=promote))
    preflight.check(TrainFlowConfig(dataset=own_sft, eval_dataset=own_sft, output=promote))


def test_a_named_held_out_set_is_still_checked(own_sft):
    """auto never hides a mistake: a named held-out set of the wrong kind fails as before."""
    with pytest.raises(ConfigError, match="exact match needs sft"):
        preflight.check(TrainFlowConfig(dataset=own_sft, eval_dataset="demo_dpo"))


def test_sft_then_dpo_resolves_each_held_out_set_from_its_own_stage(own_sft, own_pairs):
    demo = SftThenDpoConfig()
    assert (demo.exact_match_dataset(), demo.dpo_held_out()) == ("demo_sft_eval", "demo_dpo_eval")

    own_dpo = SftThenDpoConfig(dpo_dataset=own_pairs)
    assert (own_dpo.exact_match_dataset(), own_dpo.dpo_held_out()) == ("demo_sft_eval", None)
    assert "dpo_eval_dataset" not in own_dpo.dataset_uses()
    (note,) = own_dpo.held_out_notes()
    assert "--dpo_eval_dataset" in note and own_pairs in note

    own_both = SftThenDpoConfig(sft_dataset=own_sft, dpo_dataset=own_pairs)
    assert (own_both.exact_match_dataset(), own_both.dpo_held_out()) == (None, None)
    assert len(own_both.held_out_notes()) == 2
    assert len(own_both.model_copy(update={"val_size": 0.1}).held_out_notes()) == 1, "DPO's: from val_size"
    preflight.check(own_both)


def test_tf_grpo_held_out_questions(own_sft):
    assert TfGrpoFlowConfig().held_out_questions() == "demo_sft_eval"
    mine = TfGrpoFlowConfig(dataset=own_sft)
    assert mine.held_out_questions() is None and "--eval_dataset" in mine.held_out_notes()[0]
    assert TfGrpoFlowConfig(dataset=own_sft, eval_dataset=None).held_out_notes() == []


# ---- val_size ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("val_size", "records", "count"),
    # a share rounds up, as datasets' train_test_split and LLaMA-Factory count it (0.1 of 4 held out 0)
    [(0.1, 200, 20), (0.25, 8, 2), (3, 10, 3), (1, 2, 1), (0.1, 4, 1), (0.1, 25, 3), (0.01, 20, 1)],
)
def test_val_size_is_a_share_or_a_count(val_size, records, count):
    assert held_out_count(val_size, records, "mine.jsonl") == count


@pytest.mark.parametrize(("val_size", "records"), [(0.95, 10), (10, 10), (0.999, 50), (2.5, 100)])
def test_val_size_that_leaves_a_part_empty_names_the_dataset_and_counts(val_size, records):
    with pytest.raises(ConfigError) as caught:
        held_out_count(val_size, records, "mine.jsonl")
    message = str(caught.value)
    assert message.startswith("val_size:")
    assert (
        "whole number" in message
        if val_size == 2.5
        else ("mine.jsonl" in message and str(records) in message)
    )


def test_split_parts_are_disjoint_complete_seeded_and_written_once(gym_home, tmp_path):
    rows = [{"instruction": f"Say {i}.", "output": str(i)} for i in range(50)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    data = ingest(resolve_dataset(str(path)))

    train, held = split(data, 0.2, seed=1)
    assert (train.num_records, held.num_records) == (40, 10) and train.kind == held.kind == "sft"
    from datasets import load_from_disk

    def outputs(part):
        return [m[-1]["content"] for m in load_from_disk(str(part.path))["messages"]]

    train_out, held_out_rows = outputs(train), outputs(held)
    assert not set(train_out) & set(held_out_rows)
    assert sorted(train_out + held_out_rows, key=int) == [str(i) for i in range(50)]
    assert held_out_rows != [str(i) for i in range(40, 50)], "held out at random, not the tail"
    assert load_meta(held.path)["split_of"]["digest"] == data.digest

    stamp = (held.path / "meta.json").stat().st_mtime_ns
    again_train, again_held = split(data, 0.2, seed=1)
    assert (again_train.path, again_held.path) == (train.path, held.path)
    assert (held.path / "meta.json").stat().st_mtime_ns == stamp, "written once, then reused"
    other = split(data, 0.2, seed=2)[1]
    assert other.path != held.path and outputs(other) != held_out_rows


def test_max_samples_keeps_the_first_records_before_val_size_holds_some_out(gym_home, tmp_path):
    """As LLaMA-Factory: max_samples 30 with val_size 0.2 of 40 records trains on 24 and holds out 6, all
    from the first 30 (it held 8 out of all 40, records past the 30th among them, then kept 30 of the
    shuffled rest: a random 30, not the first)."""
    from datasets import load_from_disk

    from gym.data.mix import ingest_named
    from gym.data.tokenize import TokenizeSettings, tokenize
    from gym.models import resolve

    rows = [{"instruction": f"Say {i}.", "output": str(i)} for i in range(40)]
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    one = ingest(resolve_dataset(str(tmp_path / "a.jsonl")))
    train, held = split(one, 0.2, seed=1, max_samples=30)
    assert (train.num_records, held.num_records) == (24, 6)
    kept = [int(m[-1]["content"]) for p in (train, held) for m in load_from_disk(str(p.path))["messages"]]
    assert sorted(kept) == list(range(30))
    model = resolve("gym-tiny")
    tokenized = tokenize(train.path, model.path, model.template, TokenizeSettings(max_samples=30))
    assert tokenized.num_records == 24  # not capped a second time
    # a mix: the first 30 of each dataset, 12 of the 60 held out
    mix = ingest_named(f"{tmp_path / 'a.jsonl'},{tmp_path / 'b.jsonl'}")
    mixed_train, mixed_held = split(mix, 0.2, seed=1, max_samples=30)
    assert (mixed_train.num_records, mixed_held.num_records) == (48, 12)
    parts = load_meta(mixed_train.path)["mix_of"]
    assert sum(p["num_records"] for p in parts) == 48 and all(p["num_records"] <= 30 for p in parts)
    ids = [
        m[-1]["content"] for p in (mixed_train, mixed_held) for m in load_from_disk(str(p.path))["messages"]
    ]
    assert max(int(i) for i in ids) == 29


def test_val_size_beside_another_held_out_source_fails_before_any_work(gym_home, own_sft):
    with pytest.raises(ConfigError, match=r"^val_size: .*method_eval_dataset 'demo_sft_eval'"):
        preflight.check(TrainFlowConfig(dataset=own_sft, val_size=0.1, method_eval_dataset="demo_sft_eval"))
    with pytest.raises(ConfigError, match=r"^val_size: Training-Free GRPO"):
        preflight.check(TrainFlowConfig(dataset=own_sft, val_size=0.1, train=TrainConfig(method="tf_grpo")))
    with pytest.raises(ValidationError) as caught:
        TrainFlowConfig(val_size=2.5)
    assert describe(caught.value) == (
        "val_size: neither a share below 1 (such as 0.1) nor a whole number of records (200) (got 2.5)"
    )
    assert not (gym_home / "models").exists()


def test_val_size_replaces_the_demo_held_out_set_on_the_command_line():
    assert "--method_eval_dataset" in demo_args("dpo", [])
    assert "--method_eval_dataset" not in demo_args("dpo", ["--val_size", "0.1"])


def test_sft_then_dpo_on_your_data_holds_out_part_of_each_stage(gym_home, own_sft, own_pairs, tmp_path):
    """Your data: no demo scoring (the log says so), each stage's held-out part from val_size."""
    rows = [{"instruction": f"Double {i}.", "output": str(2 * i)} for i in range(80)]
    Path(own_sft).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pairs = [{"prompt": f"Double {i}.", "chosen": str(2 * i), "rejected": str(2 * i + 1)} for i in range(40)]
    Path(own_pairs).write_text("".join(json.dumps(r) + "\n" for r in pairs), encoding="utf-8")
    args = ["--sft_dataset", own_sft, "--dpo_dataset", own_pairs, "--val_size", "0.1"]
    steps = ["--sft.max_steps", "12", "--dpo.max_steps", "4", "--json"]
    logs: list[str] = []
    out = run_script([sys.executable, "flows/sft_then_dpo.py", *args, *steps], gym_home, logs=logs)
    assert out["exact_match_before"] is None and out["exact_match_after"] is None
    assert "no exact match before/after" in logs[0], "val_size holds out stage data, not exact match's"
    assert "no held-out DPO reward accuracy" not in logs[0], "the DPO stage has its held-out part"
    assert out["sft_eval_loss"] < out["sft_eval_loss_before"], "the SFT stage learns on its held-out part"
    assert out["dpo_reward_accuracy"] is not None and out["metric_name"] == "reward_margin"
    assert "hold out 0.1 of" in logs[0]


def test_online_rl_without_held_out_prompts_says_its_signal_is_unmeasured():
    """`gym train --method ppo --dataset mine` reported metric_name mean_reward with null values and
    no word on why: mean_reward is sampled on held-out prompts only."""
    from gym.train.config import TrainConfig

    bare = TrainFlowConfig(dataset="my_prompts.jsonl", train=TrainConfig(method="ppo"), eval_dataset=None)
    notes = [n for n in bare.held_out_notes() if "mean_reward" in n]
    assert len(notes) == 1 and "--method_eval_dataset" in notes[0] and "--val_size" in notes[0]
    for given in ({"method_eval_dataset": "demo_prompts_eval"}, {"val_size": 0.1}):
        scored = bare.model_copy(update=given)
        assert not [n for n in scored.held_out_notes() if "mean_reward" in n]
    sft = TrainFlowConfig(dataset="my_prompts.jsonl", train=TrainConfig(method="sft"), eval_dataset=None)
    assert not [n for n in sft.held_out_notes() if "mean_reward" in n]  # SFT has no mean_reward
