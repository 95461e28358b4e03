"""Online RL on gym-tiny: PPO, GRPO and GSPO raise the held-out mean reward of the demo answer-format
task; G=1 leaves no advantage signal; advantages and the homogeneous-group filter on hand-built
groups; multi-turn rollouts mask the environment's tokens; bad configs fail before a model loads.

Every learning test starts from the same warm model: gym-tiny after a short SFT on demo_format_sft
(it answers in the requested form about half the time, so rewards differ within a group).

Run: .venv/bin/pytest -q tests/test_online_rl.py
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest
from datasets import load_from_disk
from safetensors.torch import load_file

from gym import train
from gym.errors import ConfigError, MissingExtraError
from gym.models import ModelRef, derived
from gym.train import TrainConfig
from gym.train.config import with_defaults
from gym.train.grpo.online import homogeneous_groups
from gym.train.ppo import adaptive_kl_coef
from gym.train.rl_common import samples_file
from gym.train.rl_config import RLSettings
from tests.helpers import tiny, tokenized

TOY = {"rewards": ["final_answer", "answer_format"], "reward_weights": [1.0, 0.5]}
WARM_SFT = TrainConfig(
    method="sft",
    learning_rate=3e-3,
    max_steps=300,
    per_device_train_batch_size=32,
    logging_steps=100,
    save_steps=10_000,
)


@pytest.fixture(scope="session")
def warm(tmp_path_factory: pytest.TempPathFactory) -> ModelRef:
    """The warm model, trained once per session in a workspace the xdist workers share (file-locked)."""
    base_temp = tmp_path_factory.getbasetemp()
    root = (base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp) / "online-rl-warm"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(root))
        base = tiny()
        result = train.run(WARM_SFT, base, tokenized("demo_format_sft", base))
        return derived(base, Path(result.model_dir), result.digest)


def rl_config(method: str, steps: int, batch: int = 64, lr: float = 3e-4, **rl: object) -> TrainConfig:
    return TrainConfig(
        method=method,  # type: ignore[arg-type]
        learning_rate=lr,
        max_steps=steps,
        per_device_train_batch_size=batch,
        logging_steps=5,
        save_steps=1000,
        rl=RLSettings(**{**TOY, **rl}),  # type: ignore[arg-type]
    )


def held_out(model: ModelRef) -> Path:
    return tokenized("demo_prompts_eval", model, max_samples=100)


def logged(result, key: str) -> list[float]:
    state = json.loads(next(Path(result.stage_dir).glob("checkpoints/**/trainer_state.json")).read_text())
    return [e[key] for e in state["log_history"] if key in e]


def assert_learned(result, min_gain: float = 0.1) -> None:
    assert result.metric_name == "mean_reward"
    assert result.metric_last > result.metric_first + min_gain, (result.eval_before, result.eval_after)
    # The form is what a few steps of RL teach: from about half the time to (nearly) always.
    assert result.eval_after["rewards/answer_format"] > result.eval_before["rewards/answer_format"] + 0.2


# ---- learning -----------------------------------------------------------------------------


def test_grpo_raises_held_out_mean_reward(warm: ModelRef):
    result = train.run(rl_config("grpo", 30), warm, tokenized("demo_prompts", warm), held_out(warm))
    assert_learned(result)
    assert result.tokens_per_second  # TRL's GRPO counts prompt and completion tokens
    rows = [json.loads(line) for line in samples_file(result.stage_dir).read_text().splitlines()]
    assert {r["step"] for r in rows} >= {5, 30} and {"prompt", "completion", "reward", "final_answer"} <= set(
        rows[0]
    )


def test_gspo_raises_held_out_mean_reward_with_sequence_clipping(warm: ModelRef):
    config = rl_config("gspo", 30, num_iterations=2)
    result = train.run(config, warm, tokenized("demo_prompts", warm), held_out(warm))
    assert_learned(result)
    # Second passes see ratios off 1 by more than GSPO's narrow range: sequences get clipped; KL is on.
    assert max(logged(result, "clip_ratio/region_mean")) > 0
    assert logged(result, "kl")[-1] > 0


def test_ppo_raises_held_out_mean_reward(warm: ModelRef, capsys):
    data = tokenized("demo_prompts", warm)
    config = rl_config("ppo", 8)
    capsys.readouterr()
    result = train.run(config, warm, data, held_out(warm))
    done = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ppo: done")]
    assert done and " tok/s" in done[-1], done  # its rate, as the other methods' lines give theirs
    assert_learned(result)
    assert result.global_step == 8 and result.resumed_from is None
    # It counts the tokens its rollouts sampled (TRL's PPO counts none): 8 x 64 prompts and their answers
    prompts = [len(ids) for ids in load_from_disk(str(data))["prompt_ids"]]
    longest = max(prompts) + config.rl.resolved("ppo").max_completion_length
    assert 8 * 64 * min(prompts) < result.tokens_seen <= 8 * 64 * longest and result.tokens_per_second
    # Its policy loss is the stage's loss curve (it was empty: PPO logs no plain `loss`)
    steps = [step for step, _ in result.losses]
    assert steps and steps[-1] == 8 and all(value == value for _, value in result.losses)
    # The trained value head serves as a reward model: a gym model with a score head.
    from gym.rewards import load_reward

    value = load_reward(f"reward_model:{result.stage_dir}/value_model")
    prompt = [{"role": "user", "content": "Copy the following digits.\n1234"}]
    scores = value([prompt, prompt], [[{"role": "assistant", "content": c}] for c in ("Answer: 1234", "zzz")])
    assert len(scores) == 2 and scores[0] != scores[1]


def test_grpo_with_one_completion_per_group_has_no_signal(warm: ModelRef):
    """G=1: each reward minus its own group mean is 0, so (without KL) no weight moves at all."""
    data = tokenized("demo_prompts", warm, max_samples=64)
    one = train.run(rl_config("grpo", 4, batch=16, group_size=1), warm, data)
    assert (
        load_file(Path(one.model_dir) / "model.safetensors").keys()
        == load_file(Path(warm.path) / "model.safetensors").keys()
    )
    before, after = (
        load_file(Path(warm.path) / "model.safetensors"),
        load_file(Path(one.model_dir) / "model.safetensors"),
    )
    assert all(before[k].equal(after[k]) for k in before), "G=1 moved a weight"
    assert set(logged(one, "frac_groups_homogeneous")) == {1.0}
    assert all(loss == 0 for _, loss in one.losses)
    four = train.run(rl_config("grpo", 4, batch=16, group_size=4), warm, data)
    after4 = load_file(Path(four.model_dir) / "model.safetensors")
    assert not all(before[k].equal(after4[k]) for k in before), "G=4 should learn from the same prompts"


# ---- advantages and the homogeneous-group filter on hand-built groups -----------------------

FIXED: list[float] = []


def fixed_rewards(prompts, completions, **_):
    """A reward that ignores the completions and hands out FIXED, in order."""
    return FIXED[: len(completions)]


def grpo_trainer(
    model: ModelRef, group: int, reward: str = "tests.test_online_rl:fixed_rewards", **rl: object
):
    from datasets import load_from_disk

    from gym.models import load_model, load_tokenizer
    from gym.train import METHODS

    data = load_from_disk(str(tokenized("demo_prompts", model, max_samples=8)))
    config = with_defaults(
        rl_config("grpo", 1, batch=2 * group, rewards=[reward], reward_weights=None, group_size=group, **rl),
        {},
    )
    trainer = METHODS["grpo"](
        model=load_model(model),
        tokenizer=load_tokenizer(model),
        config=config,
        train_data=data,
        eval_data=None,
        output_dir=Path(os.environ["GYM_HOME"]) / "out",
        peft_config=None,
    )
    trainer.model.train()
    rows = [dict(data[i]) for i in (0, 1) for _ in range(group)]  # what TRL's sampler yields: G copies
    return trainer, [{k: r[k] for k in ("prompt", "answer", "metadata")} for r in rows]


@pytest.mark.parametrize("scale", ["none", "group", "batch"])
def test_advantages_on_hand_computed_groups(scale: str):
    FIXED[:] = [1.0, 0.0, 0.0, 0.0, 3.0, 3.0, 1.0, 1.0]
    trainer, inputs = grpo_trainer(tiny(), 4, advantage_normalization=scale)
    got = trainer._generate_and_score_completions(inputs)["advantages"].tolist()
    groups = [FIXED[:4], FIXED[4:]]
    centred = [r - statistics.fmean(g) for g in groups for r in g]  # [0.75, -0.25 x3, 1, 1, -1, -1]
    if scale == "none":
        want = centred
    elif scale == "group":
        want = [
            c / (statistics.stdev(g) + 1e-4)
            for g, cs in zip(groups, (centred[:4], centred[4:]), strict=True)
            for c in cs
        ]
    else:
        want = [c / (statistics.stdev(FIXED) + 1e-4) for c in centred]
    assert got == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("filtered", [False, True])
def test_homogeneous_groups_leave_the_loss_when_filtered(filtered: bool):
    FIXED[:] = [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]  # the first group is homogeneous
    trainer, inputs = grpo_trainer(tiny(), 4, filter_homogeneous_groups=filtered)
    out = trainer._generate_and_score_completions(inputs)
    mask = out["completion_mask"]
    assert mask[4:].sum() > 0 and mask[4:].sum(dim=1).min() > 0, "the informative group keeps its tokens"
    assert (mask[:4].sum() == 0) == filtered
    assert out["num_items_in_batch"].item() == mask.sum().item()
    assert trainer._metrics["train"]["frac_groups_homogeneous"] == [0.5]


def test_homogeneous_groups_function():
    nan = float("nan")
    rewards = [1, 1, 1, 0, 1, 0.5, 0.5, 0.5, nan, 2, 2, nan, 7]
    assert homogeneous_groups(rewards, 3) == [True] * 3 + [False] * 3 + [True] * 3 + [True] * 3 + [True]
    assert homogeneous_groups([0.0, 1.0], 1) == [True, True], "G=1: every group is homogeneous"


def test_whiten_rewards_reaches_trls_ppo(tmp_path):
    from datasets import load_from_disk

    from gym.models import load_model, load_tokenizer
    from gym.train import ppo

    ref = tiny()
    data = tokenized("demo_prompts", ref, max_samples=8)
    with pytest.raises(ConfigError, match="whiten_rewards needs at least 8 rollouts per batch"):
        train.run(rl_config("ppo", 1, batch=4, whiten_rewards=True), ref, data)  # before any model loads
    for whiten in (False, True):
        config = with_defaults(rl_config("ppo", 1, batch=8, whiten_rewards=whiten), {})
        trainer = ppo.build_trainer(
            model=load_model(ref),
            tokenizer=load_tokenizer(ref),
            config=config,
            train_data=load_from_disk(str(data)),
            eval_data=None,
            output_dir=tmp_path / str(whiten),
            peft_config=None,
        )
        assert trainer.args.whiten_rewards is whiten


@pytest.mark.parametrize("bits", [4, 8])
def test_ppo_value_model_of_a_qlora_policy_starts_from_its_dequantized_weights(bits):
    """A qlora policy's backbone holds bitsandbytes layers; the value model (trained in full) gets their
    weights dequantized: close to the checkpoint's up to the quantization error, the rest exact."""
    pytest.importorskip("bitsandbytes", reason="bitsandbytes (gym[quant]) is absent")
    import torch

    from gym.models import load_model, load_tokenizer
    from gym.train import ppo, quant

    model = tiny()
    config = TrainConfig(method="ppo", finetuning_type="qlora", quant={"bits": bits})
    policy = load_model(model, **quant.load_kwargs(config))
    assert quant.is_quantized(policy)
    value = ppo.value_model(policy, load_tokenizer(model), seed=0)
    original = load_model(model).model.state_dict()
    backbone = value.model.state_dict()
    assert set(backbone) == set(original)
    for name, tensor in original.items():
        if name.endswith("proj.weight"):  # quantized in the policy
            error = (backbone[name] - tensor).abs().max() / tensor.abs().max()
            assert 0 < error < (0.2 if bits == 4 else 0.02), (name, float(error))  # NF4: 16 levels
        else:
            assert torch.equal(backbone[name], tensor), name


def test_adaptive_kl_coefficient():
    # Ziegler et al.: e = clip(KL/target - 1, -0.2, 0.2); coef *= 1 + e * n/horizon.
    assert adaptive_kl_coef(0.1, kl=12.0, target=6.0, horizon=1000, n_steps=100) == pytest.approx(0.1 * 1.02)
    assert adaptive_kl_coef(0.1, kl=6.6, target=6.0, horizon=1000, n_steps=100) == pytest.approx(0.1 * 1.01)
    assert adaptive_kl_coef(0.1, kl=0.0, target=6.0, horizon=1000, n_steps=100) == pytest.approx(0.1 * 0.98)
    assert adaptive_kl_coef(0.1, kl=6.0, target=6.0, horizon=1000, n_steps=100) == pytest.approx(0.1)


# ---- multi-turn rollouts ------------------------------------------------------------------

SEEN: list[str] = []


def ask_again(messages: list[dict], record: dict) -> str | None:
    """Environment: one follow-up question that names the ground truth, then the episode ends."""
    return f"Sure? It is {record['answer']}." if len(messages) < 3 else None


def last_turn_length(completion: str, answer: str | None) -> float:
    SEEN.append(completion)
    return float(len(completion))


def test_multi_turn_rollouts_mask_the_environment_and_score_the_last_turn(warm: ModelRef):
    trainer, inputs = grpo_trainer(
        warm,
        4,
        reward="tests.test_online_rl:last_turn_length",
        environment="tests.test_online_rl:ask_again",
        max_turns=3,
        max_completion_length=12,
    )
    SEEN.clear()
    out = trainer._generate_and_score_completions(inputs)
    tok = trainer.processing_class
    replied = 0
    for i, ids in enumerate(out["completion_ids"].tolist()):
        n = int(out["completion_mask"][i].sum())
        ids, model_tokens = ids[:n], out["tool_mask"][i].tolist()[:n]
        env_text = tok.decode([t for t, m in zip(ids, model_tokens, strict=True) if m == 0])
        last_env = max((j for j, m in enumerate(model_tokens) if m == 0), default=-1)
        # The reward saw the last assistant turn: the model's tokens after the environment's last reply.
        assert SEEN[i] == tok.decode(ids[last_env + 1 :], skip_special_tokens=True)
        if env_text:  # the first turn ended with the end-of-turn token, so the environment replied
            replied += 1
            assert (
                env_text.startswith("\n<|im_start|>user\n")
                and f"Sure? It is {inputs[i]['answer']}." in env_text
            )
            assert env_text.endswith("<|im_end|>\n<|im_start|>assistant\n"), (
                "the template opens the next turn"
            )
    assert replied > 0, "no episode reached a second turn"


# ---- errors before any model loads --------------------------------------------------------


def test_bad_online_configs_fail_before_loading_a_model(tmp_path: Path):
    model = tiny()
    data = tokenized("demo_prompts", model, max_samples=8)
    gone = model.model_copy(
        update={"path": str(tmp_path / "no-such-model")}
    )  # loading would fail differently
    with pytest.raises(MissingExtraError, match="vLLM"):
        train.run(rl_config("grpo", 1, use_vllm=True), gone, data)
    with pytest.raises(ConfigError, match="not a multiple of group_size=8"):
        train.run(rl_config("grpo", 1, batch=12), gone, data)
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        train.run(rl_config("gspo", 1, rewards=["nope"], reward_weights=None), gone, data)
    with pytest.raises(ConfigError, match="needs a prompt dataset"):
        train.run(rl_config("ppo", 1), gone, tokenized("demo_sft", model, max_samples=8))
    with pytest.raises(ConfigError, match="grpo or gspo"):
        train.run(rl_config("ppo", 1, environment="tests.test_online_rl:ask_again"), gone, data)
    with pytest.raises(ConfigError, match="group_size=3: PPO samples one completion per prompt"):
        train.run(rl_config("ppo", 1, group_size=3), gone, data)  # it was accepted, and unused
    # An environment with one turn was never called (it replies between turns): the run was single-turn.
    with pytest.raises(ConfigError, match="max_turns=1: the environment replies between assistant turns"):
        train.run(rl_config("grpo", 1, environment="tests.test_online_rl:ask_again"), gone, data)
    with pytest.raises(ConfigError, match="max_turns=3 without an environment"):
        train.run(rl_config("grpo", 1, max_turns=3), gone, data)


def test_fewer_prompts_than_one_batch_fail_before_loading_a_model(tmp_path: Path):
    """TRL drops an incomplete batch: PPO waited forever for a full one, GRPO and GSPO trained 0 steps and
    saved the model unchanged. The error says how many prompts a batch takes and what batch fits."""
    model = tiny()
    data = tokenized("demo_prompts", model, max_samples=8)
    gone = model.model_copy(update={"path": str(tmp_path / "no-such-model")})
    with pytest.raises(
        ConfigError, match=r"8 prompt\(s\), fewer than one batch.*= 16 prompt.*size to 8 or less"
    ):
        train.run(rl_config("ppo", 1, batch=16), gone, data)
    for method in ("grpo", "gspo"):  # 128 completions in groups of 8: 16 prompts
        with pytest.raises(
            ConfigError, match=r"group_size=8 completions per prompt = 16 prompt.*to 64 or less"
        ):
            train.run(rl_config(method, 1, batch=128), gone, data)
    # 8 prompts fill a batch of 64 completions in groups of 8: on to loading the model (not there)
    with pytest.raises(ConfigError, match=r"no-such-model does not exist"):
        train.run(rl_config("grpo", 1, batch=64), gone, data)


# ---- resume -------------------------------------------------------------------------------

RESUME = """
import sys
sys.path.insert(0, {repo!r})
from gym import train
from gym.models import ModelRef
from tests.helpers import tokenized
from tests.test_online_rl import resume_config
warm = ModelRef.model_validate_json({warm!r})
train.run(resume_config(), warm, tokenized("demo_prompts", warm, max_samples=256))
"""


def resume_config() -> TrainConfig:
    return rl_config("grpo", 60, batch=16, group_size=4).model_copy(
        update={"save_steps": 5, "save_total_limit": 3}
    )


def test_killed_grpo_run_resumes_from_its_last_checkpoint(warm: ModelRef, gym_home: Path):
    import signal
    import subprocess
    import sys
    import time

    repo = str(Path(__file__).resolve().parents[1])
    script = RESUME.format(repo=repo, warm=warm.model_dump_json())
    env = {**os.environ, "GYM_HOME": str(gym_home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        cwd=repo,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            if list((gym_home / "models").glob("grpo-*/checkpoints/checkpoint-*/trainer_state.json")):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "training finished (or failed) before it could be interrupted"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    stage = next(p for p in (gym_home / "models").glob("grpo-*") if p.is_dir())
    assert not (stage / "result.json").exists() and not (stage / "model").exists()

    result = train.run(resume_config(), warm, tokenized("demo_prompts", warm, max_samples=256))
    assert result.resumed_from is not None and "checkpoint-" in result.resumed_from
    assert 5 <= int(result.resumed_from.rsplit("-", 1)[1]) < 60 and result.global_step == 60
    steps = [s for s, _ in result.losses]
    assert steps[0] == 1 and steps[-1] == 60, "the history spans the run before and after the kill"
    logged_steps = [json.loads(line)["step"] for line in (stage / "checkpoints" / "metrics.jsonl").open()]
    assert set(logged_steps) >= set(range(5, 61, 5)), "reward metrics cover both runs"


def test_a_group_size_that_does_not_divide_the_default_batch_fails_in_the_flows_first_check():
    """With the batch left to its default, the check found no batch and passed: the run failed only when
    the stage began, after warm-start SFT had trained (~80 s)."""
    from gym import preflight
    from gym.pipeline import TrainFlowConfig
    from gym.train.rl_config import RLSettings

    config = TrainFlowConfig(train=TrainConfig(method="grpo", rl=RLSettings(group_size=3)))
    assert config.train.per_device_train_batch_size is None
    with pytest.raises(ConfigError, match=r"train\.rl: grpo: .* is not a multiple of group_size=3"):
        preflight.check_methods(config)
    fine = TrainFlowConfig(train=TrainConfig(method="grpo", rl=RLSettings(group_size=4)))
    preflight.check_methods(fine)
