"""Online RL inputs a user gets wrong, each failing (or warning) in one clear line instead of serving
stale results, crashing mid-run or running silently wrong:

- a reward module's constants are part of the stage's identity (edit it: the stage trains again);
- per-completion rewards get only the arguments they name, and one that can't be called is refused
  before any model loads;
- prompt data without answers, for the rewards that compare with one;
- prompts with no room for a completion within cutoff_len / the model's context;
- a user's reward that raises;
- settings of GRPO/GSPO given to PPO, and the other way round.

Run: .venv/bin/pytest -q tests/test_rl_inputs.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gym import train
from gym.errors import ConfigError, DataError, GymError
from gym.models import ModelRef
from gym.rewards import base, load_reward
from gym.train import TrainConfig, rl_common
from gym.train.rl_config import RLSettings
from tests.helpers import tiny, tokenized

REWARDS = """
MAXLEN = 3


def fn(completion, answer=None):
    return float(len(completion) < MAXLEN)


def kwonly_prompt(completion, *, prompt):
    return float(prompt[-1]["role"] == "user")


def meta_only(completion, *, metadata):
    return float(isinstance(metadata, dict))


def with_kwargs(completion, **kw):
    return float(set(kw) == {"answer", "prompt", "metadata", "completion_ids"})


def answer_by_name(completion, *, answer):
    return float(completion == answer)


def gold_second(completion, gold):
    return float(completion == gold)


def prompt_second(completion, prompt):
    return float(prompt[-1]["role"] == "user")


def no_completion(x, y, z):
    return 1.0


def needs_more(completion, *, extra):
    return 1.0


def raises(completion, answer=None):
    raise ValueError("boom from user reward")


def raises_batched(prompts, completions, **kwargs):
    raise KeyError("batched boom")
"""


@pytest.fixture
def qarew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's reward module `qarew.r`, importable; its file."""
    (tmp_path / "qarew").mkdir()
    (tmp_path / "qarew" / "__init__.py").write_text("")
    module = tmp_path / "qarew" / "r.py"
    module.write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module
    for name in [n for n in sys.modules if n == "qarew" or n.startswith("qarew.")]:
        sys.modules.pop(name)


def call(spec: str, completions: list[str], answers: list[str | None]) -> list:
    """Call a reward as TRL does: conversational prompts and completions, and the dataset's columns."""
    prompts = [[{"role": "user", "content": "q"}]] * len(completions)
    convo = [[{"role": "assistant", "content": c}] for c in completions]
    meta = [json.dumps({"k": 1})] * len(completions)
    return load_reward(spec)(prompts, convo, answer=answers, metadata=meta, completion_ids=[[1]] * len(convo))


def rl_config(method: str, steps: int = 1, batch: int = 16, **rl: object) -> TrainConfig:
    group = {} if method == "ppo" else {"group_size": 4}
    return TrainConfig(
        method=method,  # type: ignore[arg-type]
        learning_rate=1e-4,
        max_steps=steps,
        per_device_train_batch_size=batch,
        logging_steps=1,
        save_steps=1000,
        rl=RLSettings(**{"max_completion_length": 8, **group, **rl}),  # type: ignore[arg-type]
    )


def gone(model: ModelRef, tmp_path: Path) -> ModelRef:
    """The model at a path with nothing there: an error about it means the model started to load."""
    return model.model_copy(update={"path": str(tmp_path / "no-such-model")})


def prompts_file(tmp_path: Path, rows: list[dict], name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def copy_rows(n: int, answers: bool = True) -> list[dict]:
    rows = [{"prompt": f"Copy the following digits.\n{i}{i + 1}", "answer": f"{i}{i + 1}"} for i in range(n)]
    return rows if answers else [{"prompt": r["prompt"]} for r in rows]


LONG = "word " * 700  # ~700 tokens: beyond gym-tiny's context of 512


# ---- 1. the reward module's source is part of the stage's identity ---------------------------------


def test_editing_a_constant_the_reward_reads_trains_the_stage_again(qarew: Path, tmp_path: Path):
    """Only the function's compiled code was keyed: MAXLEN 3 -> 7 served the cached stage, same numbers."""
    import importlib

    importlib.import_module("qarew.r")
    model = ModelRef(name="m", path="m", template="chatml", digest="d", base_model="m")
    config = rl_config("grpo", rewards=["qarew.r:fn"])

    def keys() -> tuple:
        return base.identity(["qarew.r:fn"]), train.stage_digest(config, model, tmp_path / "data", None)

    first = keys()
    assert first == keys(), "the same module: the same keys"
    qarew.write_text(REWARDS.replace("MAXLEN = 3", "MAXLEN = 7"))  # the function's code is unchanged
    second = keys()
    assert second[0] != first[0], "the task cache's key"
    assert second[1] != first[1], "the stage folder's digest"
    assert base.identity(["exact_match"]) == ["exact_match"], "built-ins: gym's code is in every key already"


# ---- 2. per completion: only the arguments a reward names --------------------------------------------


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("kwonly_prompt", [1.0, 1.0]),
        ("meta_only", [1.0, 1.0]),
        ("with_kwargs", [1.0, 1.0]),  # every argument, the answer included, by name
        ("answer_by_name", [1.0, 0.0]),
        ("gold_second", [1.0, 0.0]),  # the second positional parameter is the answer, whatever its name
        ("prompt_second", [1.0, 1.0]),  # ... unless it is named for a context argument
        ("fn", [1.0, 0.0]),
    ],
)
def test_per_completion_rewards_get_only_the_arguments_they_name(qarew: Path, name: str, want: list):
    """`kwonly_prompt(completion, *, prompt)` and the others crashed with a TypeError traceback mid-run."""
    assert call(f"qarew.r:{name}", ["42", "4242"], ["42", "x"]) == want


@pytest.mark.parametrize(
    ("name", "words"),
    [
        (
            "no_completion",
            r"\(x, y, z\) cannot be called per completion \(given the completion, the answer: ",
        ),
        ("needs_more", r"\(completion, \*, extra\) cannot be called per completion \(.*'extra'"),
    ],
)
def test_a_reward_that_cannot_be_called_per_completion_fails_before_a_model_loads(
    qarew: Path, tmp_path: Path, name: str, words: str
):
    """`no_completion(x, y, z)` passed the load-time check (bind_partial) and failed at the first reward."""
    model = tiny()
    data = tokenized("demo_prompts", model, max_samples=8)
    with pytest.raises(ConfigError, match=rf"reward 'qarew.r:{name}': {words}") as err:
        train.run(rl_config("grpo", batch=8, rewards=[f"qarew.r:{name}"]), gone(model, tmp_path), data)
    message = str(err.value)
    assert (
        "\n" not in message and "fn(completion, answer=None, *, prompt, metadata, completion_ids)" in message
    )


def test_grpo_trains_with_rewards_that_name_only_what_they_use(qarew: Path):
    rewards = ["qarew.r:kwonly_prompt", "qarew.r:meta_only", "qarew.r:with_kwargs"]
    model = tiny()
    result = train.run(
        rl_config("grpo", rewards=rewards), model, tokenized("demo_prompts", model, max_samples=8)
    )
    assert result.global_step == 1
    rows = [json.loads(line) for line in rl_common.metrics_file(result.stage_dir).read_text().splitlines()]
    for name in ("kwonly_prompt", "meta_only", "with_kwargs"):
        assert rows[0][f"rewards/{name}/mean"] == 1.0, name


# ---- 3. prompt data without answers -------------------------------------------------------------------


def test_prompt_data_without_answers_is_refused_for_rewards_that_need_one(tmp_path: Path):
    """`exact_match` crashed mid-run in normalize(None) with an AttributeError traceback."""
    model = tiny()
    path = prompts_file(tmp_path, copy_rows(8, answers=False), "prompts_noans.jsonl")
    data = tokenized(str(path), model)
    config = rl_config("grpo", batch=8, rewards=["answer_format", "exact_match"])
    words = rf"reward exact_match compares .* `answer`, and the training data \({path}\) has none: add an"
    with pytest.raises(DataError, match=words) as err:
        train.run(config, model, data)
    with pytest.raises(DataError, match=words):
        rl_common.check_prompt_data(config, model, data, None, 1024)  # what gym.train.run can call early
    assert "\n" not in str(err.value) and "reward_model:SOURCE" in str(err.value)
    # Held-out data without answers is named as such; rewards that need no answer take such data.
    held_out = tokenized(str(prompts_file(tmp_path, copy_rows(4, answers=False), "held.jsonl")), model)
    answered = tokenized(str(prompts_file(tmp_path, copy_rows(8))), model)
    with pytest.raises(DataError, match=r"numeric_match compares .* the held-out data \(.*held\.jsonl\)"):
        rl_common.check_prompt_data(
            rl_config("grpo", batch=8, rewards=["numeric_match"]), model, answered, held_out, 1024
        )
    rl_common.check_prompt_data(
        rl_config("grpo", batch=8, rewards=["answer_format"]), model, data, None, 1024
    )


def test_records_without_an_answer_are_left_out_of_the_rewards_that_need_one(tmp_path: Path, capsys):
    from datasets import load_from_disk

    from gym.rewards import load_rewards

    model = tiny()
    rows = [r if i % 2 else {"prompt": r["prompt"]} for i, r in enumerate(copy_rows(8))]
    data = load_from_disk(str(tokenized(str(prompts_file(tmp_path, rows)), model)))
    rewards, _ = load_rewards(["exact_match", "answer_format"])
    config = rl_config("grpo", batch=8)
    kept, _ = rl_common.prompt_data(config, rewards, data, None, rl_common.Window(1024, 512))
    assert len(kept) == 8, "they stay for the other rewards"
    note = capsys.readouterr().err
    assert "gym: grpo: note: 4 of 8 record(s) of the training data (" in note
    assert "have no `answer`: exact_match leaves their completions unscored (None" in note


# ---- 4. prompts with no room for a completion ---------------------------------------------------------


def test_prompts_with_no_room_for_a_completion_are_left_out_with_a_warning(tmp_path: Path, capsys):
    """Prompts of thousands of tokens on gym-tiny (context 512) trained for minutes, silently wrong."""
    from datasets import load_from_disk

    from gym.models import load_model, load_tokenizer
    from gym.train import METHODS
    from gym.train.config import with_defaults

    model = tiny()
    rows = copy_rows(18)
    rows[2]["prompt"] = rows[5]["prompt"] = LONG
    data = tokenized(str(prompts_file(tmp_path, rows)), model)
    held_rows = copy_rows(4)
    held_rows[0]["prompt"] = LONG
    held_out = tokenized(str(prompts_file(tmp_path, held_rows, "held.jsonl")), model)
    config = with_defaults(rl_config("grpo"), {})
    trainer = METHODS["grpo"](
        model=load_model(model),
        tokenizer=load_tokenizer(model),
        config=config,
        train_data=load_from_disk(str(data)),
        eval_data=load_from_disk(str(held_out)),
        output_dir=tmp_path / "out",
        peft_config=None,
        max_length=1024,
    )
    prompts = [p[0]["content"] for p in trainer.train_dataset["prompt"]]
    assert len(prompts) == 16 and LONG not in prompts
    assert len(trainer.reward_eval.prompts) == 3
    lines = [line for line in capsys.readouterr().err.splitlines() if "left out" in line]
    assert len(lines) == 2, lines
    assert lines[0].startswith("gym: grpo: warning: 2 of 18 prompt(s) of the training data (")
    assert "(records 3, 6): over 504 tokens" in lines[0] and "rl.max_completion_length=8" in lines[0]
    assert "within 512, the model's context (data.cutoff_len=1024 is beyond it)" in lines[0]
    assert "1 of 4 prompt(s) of the held-out data" in lines[1] and "(record 1)" in lines[1]

    # The whole stage: it trains on the prompts that fit, and says which it left out.
    result = train.run(rl_config("grpo"), model, data)
    assert result.global_step == 1
    assert "2 of 18 prompt(s) of the training data" in capsys.readouterr().err


def test_no_prompt_with_room_for_a_completion_is_an_error(tmp_path: Path):
    model = tiny()
    data = tokenized(str(prompts_file(tmp_path, [{"prompt": LONG, "answer": "1"}] * 8)), model)
    config = rl_config("grpo", batch=8)
    words = r"grpo: every prompt of the training data \(.*\) is over 504 tokens.*the longest has \d+ tokens"
    with pytest.raises(DataError, match=words):
        train.run(config, model, data)
    with pytest.raises(DataError, match=words):
        rl_common.check_prompt_data(config, model, data, None, 1024)
    # Within cutoff_len (below the context), the window is cutoff_len: raising it is the way out.
    short = tokenized("demo_prompts", model, max_samples=8)
    words = r"within 20, data\.cutoff_len=20 \(the longest .*raise data\.cutoff_len \(up to the context, 512"
    with pytest.raises(DataError, match=words):
        rl_common.check_prompt_data(config, model, short, None, 20)
    # A completion as long as the window leaves room for no prompt: said so ("every prompt ... is over 0
    # tokens", before)
    long = rl_config("grpo", batch=8)
    long.rl.max_completion_length = 512
    words = (
        r"^grpo: rl\.max_completion_length=512 sampled tokens \(LLaMA-Factory's max_new_tokens\) leave no "
        r"room for a prompt within 20, data\.cutoff_len=20: lower rl\.max_completion_length below 20, or"
    )
    with pytest.raises(DataError, match=words):
        rl_common.check_prompt_data(long, model, short, None, 20)
    # Prompts left out so that fewer than a batch remain: the batch error, not 0 steps trained.
    rows = copy_rows(8)
    rows[0]["prompt"] = LONG
    with pytest.raises(ConfigError, match=r"7 prompt\(s\), fewer than one batch .* = 8 prompt"):
        rl_common.check_prompt_data(
            rl_config("grpo", batch=32),
            model,
            tokenized(str(prompts_file(tmp_path, rows)), model),
            None,
            1024,
        )


def test_prompt_data_errors_come_before_the_model_loads(tmp_path: Path):
    import shutil

    model = tiny()
    bare = tmp_path / "bare"  # its config.json (the context) and no weights: loading it would fail
    bare.mkdir()
    shutil.copy(Path(model.path) / "config.json", bare)
    unloadable = model.model_copy(update={"path": str(bare)})
    no_answers = tokenized(str(prompts_file(tmp_path, copy_rows(8, answers=False), "noans.jsonl")), model)
    with pytest.raises(DataError, match="reward exact_match compares"):
        train.run(rl_config("grpo", batch=8, rewards=["exact_match"]), unloadable, no_answers)
    long = tokenized(str(prompts_file(tmp_path, [{"prompt": LONG, "answer": "1"}] * 8, "long.jsonl")), model)
    with pytest.raises(DataError, match="every prompt"):
        train.run(rl_config("grpo", batch=8), unloadable, long)


# ---- 5. a user's reward that raises -------------------------------------------------------------------


def test_a_reward_that_raises_fails_the_run_in_one_line(qarew: Path):
    """It printed a ~225-line Prefect and trainer traceback."""
    model = tiny()
    data = tokenized("demo_prompts", model, max_samples=8)
    with pytest.raises(GymError) as err:  # the CLI prints it as one `error:` line
        train.run(rl_config("grpo", batch=8, rewards=["qarew.r:raises"]), model, data)
    assert isinstance(err.value, base.RewardError)
    assert (
        str(err.value) == "reward qarew.r:raises raised ValueError('boom from user reward') on completion 0"
    )
    assert isinstance(err.value.__cause__, ValueError)
    with pytest.raises(
        base.RewardError, match=r"raises_batched raised KeyError\('batched boom'\) on a batch of 2 "
    ):
        call("qarew.r:raises_batched", ["a", "b"], [None, None])


# ---- 6. settings the method does not read ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "settings", "words"),
    [
        (
            "ppo",
            {"epsilon_high": 0.5, "num_iterations": 3, "advantage_normalization": "none"},
            r"ppo does not read rl\.advantage_normalization='none', rl\.epsilon_high=0\.5, "
            r"rl\.num_iterations=3 \(GRPO/GSPO settings\); drop them, or use grpo or gspo",
        ),
        (
            "ppo",
            {"filter_homogeneous_groups": True},
            r"rl\.filter_homogeneous_groups=True \(GRPO/GSPO setting\)",
        ),
        ("ppo", {"moe_aux_loss_coef": 0.01}, r"ppo does not read rl\.moe_aux_loss_coef=0\.01"),
        ("ppo", {"max_turns": 2}, r"ppo does not read rl\.max_turns=2"),
        (
            "grpo",
            {"ppo_epochs": 2, "vf_coef": 0.5},
            r"grpo does not read rl\.ppo_epochs=2, rl\.vf_coef=0\.5 \(PPO",
        ),
        (
            "gspo",
            {"whiten_rewards": True},
            r"gspo does not read rl\.whiten_rewards=True \(PPO setting\); drop it, or",
        ),
        ("grpo", {"gamma": 0.9, "lam": 0.9}, r"rl\.gamma=0\.9, rl\.lam=0\.9"),
        ("gspo", {"adaptive_kl_target": 6.0}, r"gspo does not read rl\.adaptive_kl_target=6\.0"),
    ],
)
def test_settings_the_method_does_not_read_are_refused_before_a_model_loads(
    tmp_path: Path, method: str, settings: dict, words: str
):
    """PPO took --train.rl.epsilon_high, num_iterations and advantage_normalization, and ignored them."""
    model = tiny()
    data = tokenized("demo_prompts", model, max_samples=16)
    with pytest.raises(ConfigError, match=words):
        train.run(rl_config(method, **settings), gone(model, tmp_path), data)


def test_the_flows_first_check_refuses_them_too():
    from gym import preflight
    from gym.pipeline import TrainFlowConfig

    config = TrainFlowConfig(train=TrainConfig(method="ppo", rl=RLSettings(num_iterations=3)))
    with pytest.raises(ConfigError, match=r"^train\.rl: ppo does not read rl\.num_iterations=3"):
        preflight.check_methods(config)
    for method in ("grpo", "gspo"):  # the same setting where it is read
        preflight.check_methods(
            TrainFlowConfig(train=TrainConfig(method=method, rl=RLSettings(num_iterations=3)))
        )
    preflight.check_methods(TrainFlowConfig(train=TrainConfig(method="ppo", rl=RLSettings(ppo_epochs=2))))


# ---- a run with nothing to learn from says so --------------------------------------------------------


def test_a_run_whose_rewards_never_tell_completions_apart_says_nothing_was_learned(qarew: Path, caplog):
    """A constant reward (here 1.0 for every completion) or one that never applies trained to the end
    without a word: TRL's only trace is a curve (frac_reward_zero_std) in MLflow."""
    model = tiny()
    with caplog.at_level("WARNING", logger="gym.train"):
        train.run(
            rl_config("grpo", rewards=["qarew.r:meta_only"]),
            model,
            tokenized("demo_prompts", model, max_samples=8),
        )
    said = [r.getMessage() for r in caplog.records if r.name == "gym.train"]
    assert any("each prompt's completions got the same reward" in m for m in said), said

    assert rl_common.signal_warnings("grpo", [{"reward": float("nan")}, {"reward": None}])[0].startswith(
        "grpo: no reward applied to any completion"
    )
    varied = [{"reward": 0.5, "frac_reward_zero_std": 1.0}, {"reward": 0.6, "frac_reward_zero_std": 0.5}]
    assert rl_common.signal_warnings("grpo", varied) == []  # one step told them apart: something to learn
    assert rl_common.signal_warnings("ppo", [{"reward": 0.1}]) == []


def test_a_ppo_run_shorter_than_its_logging_interval_still_keeps_samples():
    """PPO wrote its sample completions only at steps that are multiples of logging_steps: a 2-step run
    (logging every 5) had none for the MLflow table the README lists."""
    model = tiny()
    config = rl_config("ppo", steps=2).model_copy(update={"logging_steps": 5})
    result = train.run(config, model, tokenized("demo_prompts", model, max_samples=16))
    rows = [json.loads(line) for line in rl_common.samples_file(result.stage_dir).read_text().splitlines()]
    assert rows and {row["step"] for row in rows} == {2} and all("completion" in row for row in rows)
