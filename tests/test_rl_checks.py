"""Online RL (PPO, GRPO, GSPO) told the truth about what it trained on, each found by a QA sweep:

- a reward that is infinite, or a batched reward that returns None or one number, fails in one line;
- a multi-turn environment's code is part of the stage's identity, as a reward function's is;
- PPO leaves out the prompts no reward can score, and reports the completions it scored 0;
- the KL coefficient and clip range a stage used are recorded, the other method's settings are not,
  and giving a default explicitly reuses the stage;
- a setting the method does not read is refused whatever its value, from the command line too;
- in multi-turn episodes batched rewards score the last assistant turn, as per-completion ones do;
- PPO's sample rows hold each reward's score and a clean prompt; G=1's warning names G=1.

Run: .venv/bin/pytest -q tests/test_rl_checks.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gym import train
from gym.errors import ConfigError, GymError
from gym.models import ModelRef
from gym.rewards import base, load_reward
from gym.train import TrainConfig, rl_common
from gym.train.config import hyperparameters
from gym.train.rl_config import RLSettings
from tests.helpers import tiny, tokenized
from tests.test_rl_inputs import rl_config

REWARDS = """
def infinite(completion):
    return float("inf")


def forgot_return(prompts, completions, **kwargs):
    values = [1.0] * len(completions)


def one_number(prompts, completions, **kwargs):
    return 1.0


def odd_only(completion, *, prompt):
    return 1.0 if len(prompt[-1]["content"]) % 2 else None


SEEN = []


def seen(prompts, completions, completion_ids, **kwargs):
    SEEN.append((completions, completion_ids, kwargs.get("conversation")))
    return [float(len(c[-1]["content"])) for c in completions]
"""

ENVIRONMENT = """
def env(messages, record):
    return "Again?" if len(messages) < 3 else None
"""


@pytest.fixture
def qrl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's package `qrl`, importable: rewards in `qrl.r`, an environment in `qrl.env`."""
    (tmp_path / "qrl").mkdir()
    (tmp_path / "qrl" / "__init__.py").write_text("")
    (tmp_path / "qrl" / "r.py").write_text(REWARDS)
    (tmp_path / "qrl" / "env.py").write_text(ENVIRONMENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "qrl"
    for name in [n for n in sys.modules if n == "qrl" or n.startswith("qrl.")]:
        sys.modules.pop(name)


def call(spec: str, completions: list[str], **columns: object) -> list:
    prompts = [[{"role": "user", "content": "q"}]] * len(completions)
    return load_reward(spec)(prompts, [[{"role": "assistant", "content": c}] for c in completions], **columns)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- 1. an infinite reward ----------------------------------------------------------------------------


def test_an_infinite_reward_fails_the_run_in_one_line(qrl: Path):
    """PPO turned it into a huge finite reward and crashed in sampling ("probability tensor contains
    either inf, nan"); GRPO logged `reward: Infinity` and said no reward had applied."""
    words = (
        "reward qrl.r:infinite: returned float inf for completion 0; a reward is a finite number per "
        "completion (or None where it doesn't apply)"
    )
    with pytest.raises(ConfigError) as err:
        call("qrl.r:infinite", ["a", "b"])
    assert str(err.value) == words
    model = tiny()
    data = tokenized("demo_prompts", model, max_samples=16)
    with pytest.raises(GymError, match=r"^reward qrl\.r:infinite: returned float inf for completion \d+; "):
        train.run(rl_config("ppo", rewards=["qrl.r:infinite"]), model, data)
    # The closing warning says "no reward applied" only when none did: None or NaN, not a number.
    assert rl_common.signal_warnings("grpo", [{"reward": math.inf}]) == []
    said = rl_common.signal_warnings("grpo", [{"reward": math.nan}])[0]
    assert said.startswith("grpo: no reward applied to any completion (every reward function returned None")


# ---- 4. a batched reward that returns None or one number --------------------------------------------


@pytest.mark.parametrize(("name", "given"), [("forgot_return", "None"), ("one_number", "float 1.0")])
def test_a_batched_reward_that_returns_no_list_fails_in_one_line(qrl: Path, name: str, given: str):
    """`list(None)` in Reward.__call__: a TypeError traceback from inside TRL's trainer."""
    with pytest.raises(ConfigError) as err:
        call(f"qrl.r:{name}", ["a", "b"])
    assert str(err.value) == (
        f"reward qrl.r:{name}: returned {given} for a batch of 2 completions; a batched reward returns one "
        "value per completion (a list, None where one doesn't apply)"
    )


# ---- 2. the environment's code is part of the stage's identity ---------------------------------------


def test_editing_the_environment_trains_the_stage_again(qrl: Path, tmp_path: Path):
    """Only the rewards' code was keyed: an edited environment reused the stage trained with the old one."""
    import importlib

    from tasks.train import _rewards

    importlib.import_module("qrl.env")
    model = ModelRef(name="m", path="m", template="chatml", digest="d", base_model="m")
    config = rl_config("grpo", environment="qrl.env:env", max_turns=2)

    def keys() -> tuple:
        return _rewards(config), train.stage_digest(config, model, tmp_path / "data", None)

    first = keys()
    assert first == keys()
    (qrl / "env.py").write_text(ENVIRONMENT.replace('"Again?"', '"Once more?"'))
    second = keys()
    assert second[0] != first[0], "the task cache's key"
    assert second[1] != first[1], "the stage folder's digest"
    plain = rl_config("grpo")  # no environment: the keys as they were
    assert _rewards(plain) == base.identity(plain.rl.rewards)


# ---- 5. what a stage records and its digest -----------------------------------------------------------


def test_the_settings_a_method_uses_are_recorded_and_key_the_stage(tmp_path: Path):
    """The KL coefficient and clip range were missing from the record, PPO's settings were in GSPO's, and
    `--train.rl.kl_coef 0.04` on GSPO (its default) trained an identical stage again."""
    gspo = hyperparameters(TrainConfig(method="gspo"))["rl"]
    assert (gspo["kl_coef"], gspo["epsilon"], gspo["epsilon_high"], gspo["group_size"]) == (
        0.04,
        3e-4,
        4e-4,
        8,
    )
    assert not {"ppo_epochs", "vf_coef", "gamma", "lam", "whiten_rewards", "adaptive_kl_horizon"} & set(gspo)
    ppo = hyperparameters(TrainConfig(method="ppo"))["rl"]
    assert (ppo["kl_coef"], ppo["epsilon"], ppo["ppo_epochs"], ppo["vf_coef"]) == (0.05, 0.2, 4, 0.1)
    assert not {"group_size", "epsilon_high", "num_iterations", "max_turns", "use_vllm"} & set(ppo)
    model = ModelRef(name="m", path="m", template="chatml", digest="d", base_model="m")

    def digest(method: str, **rl: object) -> str:
        return train.stage_digest(TrainConfig(method=method, rl=RLSettings(**rl)), model, tmp_path, None)  # type: ignore[arg-type]

    assert digest("gspo", kl_coef=0.04) == digest("gspo")
    assert digest("grpo", group_size=8, num_iterations=1) == digest("grpo")
    assert digest("ppo", vf_coef=0.1) == digest("ppo")
    assert digest("gspo", kl_coef=0.0) != digest("gspo")


# ---- 6. a setting the method does not read, at its default value ---------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--method", "ppo", "--group-size", "8"],
            r"^train\.rl: group_size=8: PPO samples one completion per prompt .*, or use grpo or gspo$",
        ),
        (
            ["--method", "grpo", "--train.rl.vf_coef", "0.1"],
            r"^train\.rl: grpo does not read rl\.vf_coef=0\.1 \(PPO setting\); drop it, or use ppo$",
        ),
        (
            ["--method", "gspo", "--train.rl.whiten_rewards", "false"],
            r"^train\.rl: gspo does not read rl\.whiten_rewards=False \(PPO setting\)",
        ),
        (["--method", "ppo", "--train.rl.num_iterations", "1"], r"ppo does not read rl\.num_iterations=1 "),
    ],
)
def test_a_setting_the_method_does_not_read_is_refused_at_its_default_value_too(argv: list, words: str):
    """`--method ppo --group-size 8` trained and ignored it (`--group-size 4` was refused): the check
    compared with the default. The command line fills every default in before validating, so this goes
    the way the CLI does."""
    from flows.commands import train_plan
    from flows.runner import build_parser, parse_config
    from gym import preflight

    def config(args: list) -> object:
        plan = train_plan(args)
        return parse_config(
            plan.config_cls, build_parser(plan.config_cls, prog=plan.prog).parse_args(plan.argv)
        )

    with pytest.raises(ConfigError, match=words):
        preflight.check_methods(config(argv))
    preflight.check_methods(config(argv[:2]))  # the method alone: its defaults, nothing refused
    with pytest.raises(ConfigError, match="PPO samples one completion per prompt"):
        rl_common.check(TrainConfig(method="ppo", rl=RLSettings(group_size=8)))


# ---- 3 and 9. PPO: unscored prompts and completions, its sample rows ---------------------------------


def test_ppo_leaves_out_the_prompts_no_reward_can_score(tmp_path: Path, capsys):
    """PPO scored records without an `answer` 0 under `--reward final_answer` and trained on them."""
    from datasets import load_from_disk

    from gym.rewards import load_rewards

    model = tiny()
    rows = [
        {"prompt": f"Copy {i}", **({"answer": str(i)} if i % 2 else {})} for i in range(16)
    ]  # half without an answer
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_from_disk(str(tokenized(str(path), model)))
    window = rl_common.Window(1024, 512)
    only, _ = load_rewards(["final_answer"])
    kept, _ = rl_common.prompt_data(rl_config("ppo", batch=8), only, data, None, window)
    assert len(kept) == 8 and all(a is not None for a in kept["answer"])
    said = capsys.readouterr().err
    assert "gym: ppo: warning: 8 of 16 record(s) of the training data (" in said
    assert "left out: they have no `answer`, so final_answer cannot score their completions" in said
    both, _ = load_rewards(["final_answer", "answer_format"])  # answer_format scores every completion
    assert len(rl_common.prompt_data(rl_config("ppo", batch=8), both, data, None, window)[0]) == 16
    assert len(rl_common.prompt_data(rl_config("grpo", batch=8), only, data, None, window)[0]) == 16


def test_ppo_reports_the_completions_no_reward_applied_to(qrl: Path, caplog):
    """Their NaN made the logged reward NaN (the MLflow curve was lost) and the closing warning said
    nothing was learned; sample rows had no per-reward scores and the template's special tokens."""
    model = tiny()
    data = tokenized("demo_prompts", model, max_samples=16)
    config = rl_config("ppo", steps=2, rewards=["qrl.r:odd_only"])
    with caplog.at_level("WARNING", logger="gym.train"):
        result = train.run(config, model, data)
    metrics = jsonl(rl_common.metrics_file(result.stage_dir))
    logged = [m for m in metrics if "frac_unscored" in m]
    assert logged and all(0.0 <= m["frac_unscored"] <= 1.0 for m in logged)
    partly = [m for m in logged if 0.0 < m["frac_unscored"] < 1.0]
    assert partly, "some prompts have an odd length and some an even one"
    assert all(m["reward"] == 1.0 for m in partly), "the reward averages the completions it applied to"
    said = [r.getMessage() for r in caplog.records if r.name == "gym.train"]
    assert any("ppo: some completions got no reward" in m and "trained on as reward 0" in m for m in said), (
        said
    )
    assert not any("nothing was learned" in m for m in said), said
    rows = jsonl(rl_common.samples_file(result.stage_dir))
    assert rows and all("odd_only" in row and "<|im_start|>" not in row["prompt"] for row in rows)
    assert all(row["prompt"].strip() for row in rows)
    assert {row["odd_only"] for row in rows} <= {1.0, None}


# ---- 8. multi-turn: batched rewards score the last turn -------------------------------------------------


class FakeModel:
    """Answers each turn with the tokens of "a b" and the end-of-turn token (deterministic)."""

    def __init__(self, tokenizer):
        self.tok, self.device = tokenizer, "cpu"

    def generate(self, input_ids, attention_mask, generation_config):
        import torch

        reply = self.tok("a b", add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return torch.cat([input_ids, torch.tensor([reply] * len(input_ids))], dim=1)


def test_batched_rewards_score_the_last_turn_of_an_episode(qrl: Path):
    """They got the whole episode, the environment's turns included, and its tokens as completion_ids
    (longer than max_completion_length)."""
    import importlib

    from gym.models import load_tokenizer
    from gym.train.grpo.multiturn import multi_turn_rollout

    tok = load_tokenizer(tiny())
    prompt = [{"role": "user", "content": "Copy 12"}]
    rollout = multi_turn_rollout(importlib.import_module("qrl.env").env, 2, [{"prompt": prompt}])
    trainer = SimpleNamespace(
        processing_class=tok,
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
        model=FakeModel(tok),
        generation_config=None,
    )
    out = rollout([prompt], trainer)
    turn = tok("a b", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert out["last_turn_ids"] == [turn] and out["completion_ids"][0] != turn  # the environment replied
    episode = tok.decode(out["completion_ids"][0], skip_special_tokens=True)
    r = importlib.import_module("qrl.r")
    r.SEEN.clear()
    columns = {k: out[k] for k in ("last_turn", "last_turn_ids", "conversation")}
    scores = call("qrl.r:seen", [episode], completion_ids=out["completion_ids"], **columns)
    completions, ids, conversation = r.SEEN[0]
    assert completions == [[{"role": "assistant", "content": "a b"}]] and ids == [turn]
    assert scores == [3.0]
    assert conversation[0][-1]["content"] == "a b" and conversation[0][2] == {
        "role": "user",
        "content": "Again?",
    }


# ---- 9. G=1 ----------------------------------------------------------------------------------------------


def test_a_grpo_run_with_one_completion_per_group_says_group_size_1_is_why(caplog):
    """It said the rewards must tell completions apart: with G=1 nothing can."""
    model = tiny()
    with caplog.at_level("WARNING", logger="gym.train"):
        result = train.run(
            rl_config("grpo", batch=8, group_size=1, rewards=["answer_format"]),
            model,
            tokenized("demo_prompts", model, max_samples=8),
        )
    assert {m["group_size"] for m in jsonl(rl_common.metrics_file(result.stage_dir))} == {1}
    said = [r.getMessage() for r in caplog.records if r.name == "gym.train"]
    assert any(
        m.startswith("grpo: group_size=1: each prompt's one completion is its whole group") for m in said
    )
    assert not any("the rewards must tell completions apart" in m for m in said), said
