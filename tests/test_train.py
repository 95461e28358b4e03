"""Training on the embedded gym-tiny: learning is asserted, not just that a step ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gym import train
from gym.errors import ConfigError
from gym.models import derived
from gym.train import TrainConfig
from gym.train.config import LoraSettings
from tests.helpers import tiny, tokenized

SFT = TrainConfig(
    method="sft", learning_rate=3e-3, max_steps=40, per_device_train_batch_size=16, logging_steps=5
)


def weights(model_dir: str | Path) -> dict:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def mean(xs):
    return sum(xs) / len(xs)


def test_sft_full_loss_falls_and_all_weights_train():
    model = tiny()
    result = train.run(SFT, model, tokenized("demo_sft", model, max_samples=512))
    losses = [loss for _, loss in result.losses]
    assert mean(losses[-2:]) < 0.6 * losses[0], losses
    assert result.trainable_params == result.total_params
    before, after = weights(model.path), weights(result.model_dir)
    changed = [k for k in before if not before[k].equal(after[k])]
    assert len(changed) == len(before), "full fine-tuning should update every tensor"
    assert result.global_step == 40 and result.resumed_from is None


def test_the_last_step_is_logged_so_the_signal_ends_where_training_did():
    """transformers logs every logging_steps only: 7 steps at 5 would end the curve, loss_last and
    metric_last at step 5."""
    model = tiny()
    result = train.run(
        SFT.model_copy(update={"max_steps": 7}), model, tokenized("demo_sft", model, max_samples=64)
    )
    assert [step for step, _ in result.losses] == [1, 5, 7]
    assert result.metric_name == "loss" and result.metric_last == result.losses[-1][1] != result.losses[-2][1]


def warmed_up(steps: int = 60):
    """gym-tiny after a short full SFT: adapters and preference tuning start from a trained model."""
    base = tiny()
    warm = train.run(
        SFT.model_copy(update={"max_steps": steps}), base, tokenized("demo_sft", base, max_samples=1024)
    )
    return derived(base, Path(warm.model_dir), warm.digest)


def test_sft_lora_trains_only_the_adapter_and_merges():
    model = warmed_up()
    lora = LoraSettings(r=32, alpha=64)
    config = SFT.model_copy(update={"finetuning_type": "lora", "max_steps": 60, "lora": lora})
    result = train.run(
        config, model, tokenized("demo_sft", model, max_samples=1024), tokenized("demo_sft_eval", model)
    )
    # Held-out loss, measured by the trainer before and after: the adapter learned something general.
    assert result.eval_after["eval_loss"] < 0.97 * result.eval_before["eval_loss"]
    assert 0 < result.trainable_params < 0.5 * result.total_params
    assert (Path(result.adapter_dir) / "adapter_model.safetensors").is_file()
    before, after = weights(model.path), weights(result.model_dir)
    assert set(before) == set(after), "the merged model has the base model's tensors, no lora_ leftovers"
    assert before["model.embed_tokens.weight"].equal(after["model.embed_tokens.weight"])
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not before[q_proj].equal(after[q_proj]), "the adapter was merged into the adapted layers"


def test_dpo_raises_reward_accuracy_and_margin_on_held_out_pairs():
    model = warmed_up(300)
    config = TrainConfig(
        method="dpo", learning_rate=1e-3, beta=0.5, max_steps=50, per_device_train_batch_size=16
    )
    result = train.run(config, model, tokenized("demo_dpo", model), tokenized("demo_dpo_eval", model))
    # Before training the policy is the reference: every reward, hence every margin, is 0.
    assert result.eval_before["eval_rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert result.eval_after["eval_rewards/margins"] > 0.15
    accuracy_before = result.eval_before["eval_rewards/accuracies"]
    assert result.eval_after["eval_rewards/accuracies"] > max(0.58, accuracy_before)


def test_finished_stage_is_returned_without_training_again():
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    config = SFT.model_copy(update={"max_steps": 4})
    first = train.run(config, model, data)
    stamp = (Path(first.model_dir) / "model.safetensors").stat().st_mtime_ns
    second = train.run(config, model, data)
    assert second == first
    assert (Path(first.model_dir) / "model.safetensors").stat().st_mtime_ns == stamp
    other = train.run(config.model_copy(update={"learning_rate": 1e-3}), model, data)
    assert other.digest != first.digest


def test_a_finished_stage_whose_model_was_deleted_or_whose_workspace_moved(gym_home, monkeypatch):
    import shutil

    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    config = SFT.model_copy(update={"max_steps": 3, "save_steps": 1})
    first = train.run(config, model, data)
    weights_first = weights(first.model_dir)
    files_first = {p.name: p.read_bytes() for p in Path(first.model_dir).iterdir()}
    shutil.rmtree(first.model_dir)  # its result.json stays: it was handed back naming a folder that is gone
    again = train.run(config, model, data)
    assert (Path(again.model_dir) / "config.json").is_file()
    assert all((weights(again.model_dir)[k] == w).all() for k, w in weights_first.items())  # the same run
    # every file as the uninterrupted run wrote it (generation_config.json's eos was an int, not train()'s
    # list): registration digests them all, and would add a version holding the same weights
    assert {p.name: p.read_bytes() for p in Path(again.model_dir).iterdir()} == files_first

    moved = gym_home.parent / "moved_home"  # a workspace copied elsewhere keeps each stage's result.json
    shutil.copytree(gym_home, moved)
    monkeypatch.setenv("GYM_HOME", str(moved))
    there = train.run(config, model, data)
    assert Path(there.model_dir).is_relative_to(moved) and Path(there.stage_dir).is_relative_to(moved)
    assert (Path(there.model_dir) / "config.json").is_file()


def test_a_lora_stage_whose_adapter_was_deleted_saves_it_again(gym_home):
    import shutil

    model = tiny()
    data = tokenized("demo_sft", model, max_samples=32)
    config = SFT.model_copy(update={"max_steps": 2, "finetuning_type": "lora"})
    first = train.run(config, model, data)
    assert first.adapter_dir is not None
    shutil.rmtree(first.adapter_dir)  # its cached result would name it on and on
    again = train.run(config, model, data)
    assert again.adapter_dir is not None and (Path(again.adapter_dir) / "adapter_config.json").is_file()


def test_wrong_data_kind_fails_before_loading_the_model():
    model = tiny()
    with pytest.raises(ConfigError, match="preference"):
        train.run(TrainConfig(method="dpo"), model, tokenized("demo_sft", model, max_samples=8))


@pytest.mark.parametrize(
    ("method", "data"), [("dpo", "demo_dpo"), ("simpo", "demo_dpo"), ("kto", "demo_kto")]
)
def test_prompts_that_fill_cutoff_len_leave_no_answer_so_training_is_refused_before_a_model_loads(
    method, data, monkeypatch
):
    """KTO and SimPO/ORPO failed with TRL's traceback (an empty dataset); DPO trained on nothing, its loss
    at log 2 throughout, and registered the result."""
    from gym.errors import DataError

    model = tiny()
    short = tokenized(data, model, max_samples=16, cutoff_len=16)  # every prompt has 16 tokens or more
    monkeypatch.setattr(train, "build_trainer", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(
        DataError, match=rf"{method}: every training \w+'s prompt alone is cutoff_len=16 tokens"
    ):
        train.run(TrainConfig(method=method, max_steps=1), model, short)


def test_pairs_whose_prompt_fills_cutoff_len_are_left_out_of_dpo_and_counted(capsys):
    """DPO trained on them with no answer token (teaching nothing) and no word about it."""
    from datasets import load_from_disk

    model = tiny()
    data = tokenized("demo_dpo", model, max_samples=32, cutoff_len=22)
    over = sum(len(p) >= 22 for p in load_from_disk(str(data))["prompt_ids"])
    assert 0 < over < 32
    seen = {}
    real = train.build_trainer

    def build(*args, **kwargs):
        built = real(*args, **kwargs)  # (trainer, tokenizer, loader, stretch)
        seen["rows"] = len(built[0].train_dataset)
        return built

    train.build_trainer = build
    try:
        result = train.run(TrainConfig(method="dpo", max_steps=1), model, data)
    finally:
        train.build_trainer = real
    assert seen["rows"] == 32 - over and result.global_step == 1
    err = capsys.readouterr().err
    assert f"{over} of 32 training pair(s) have a prompt of cutoff_len=22 tokens or more" in err


def test_pretokenized_dpo_ids_equal_trl_conversational_tokenization():
    """gym hands DPOTrainer its own ids; they must be what TRL would compute from the messages."""
    from datasets import load_from_disk

    from gym.models import load_tokenizer

    model = tiny()
    ds = load_from_disk(str(tokenized("demo_dpo", model, max_samples=16)))
    raw = load_from_disk(str(_ingested("demo_dpo")))
    tok = load_tokenizer(model)
    for row, rec in zip(ds, raw, strict=False):
        prompt = tok.apply_chat_template(
            rec["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
        )
        full = tok.apply_chat_template(
            [*rec["prompt"], {"role": "assistant", "content": rec["chosen"]}], tokenize=True, return_dict=True
        )
        assert row["prompt_ids"] == list(prompt["input_ids"])
        trl_chosen = list(full["input_ids"])[len(prompt["input_ids"]) :]
        # TRL keeps the newline the template prints after the end-of-turn token; gym ends at the token.
        assert trl_chosen[: len(row["chosen_ids"])] == row["chosen_ids"]
        assert tok.decode(trl_chosen[len(row["chosen_ids"]) :]).strip() == ""


def _ingested(name: str) -> Path:
    from gym.data.ingest import ingest
    from gym.data.registry import resolve_dataset

    return Path(ingest(resolve_dataset(name)).path)


RESUME_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from gym import train
    from gym.train import TrainConfig
    from tests.helpers import tiny, tokenized
    model = tiny()
    config = TrainConfig(method="sft", learning_rate=3e-3, max_steps={steps}, per_device_train_batch_size=8,
                         logging_steps=5, save_steps=10, save_total_limit=3)
    print(train.run(config, model, tokenized("demo_sft", model, max_samples=256)).model_dump_json())
    """
)


def test_interrupted_training_resumes_from_its_last_checkpoint(gym_home):
    repo = str(Path(__file__).resolve().parents[1])
    script = RESUME_SCRIPT.format(repo=repo, steps=60)
    env = {**os.environ, "GYM_HOME": str(gym_home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        cwd=repo,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            ckpts = list((gym_home / "models").glob("sft-*/checkpoints/checkpoint-*/trainer_state.json"))
            if ckpts:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "training finished before it could be interrupted"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    stage = next((gym_home / "models").glob("sft-*"))
    assert not (stage / "result.json").exists() and not (stage / "model").exists(), (
        "no final model after a kill"
    )

    config = TrainConfig(
        method="sft",
        learning_rate=3e-3,
        max_steps=60,
        per_device_train_batch_size=8,
        logging_steps=5,
        save_steps=10,
        save_total_limit=3,
    )
    model = tiny()
    result = train.run(config, model, tokenized("demo_sft", model, max_samples=256))
    assert result.resumed_from is not None and "checkpoint-" in result.resumed_from
    resumed_step = int(result.resumed_from.rsplit("-", 1)[1])
    assert 10 <= resumed_step < 60
    assert result.global_step == 60
    steps = [s for s, _ in result.losses]
    assert steps[0] == 1 and steps[-1] == 60, "the loss history spans the run before and after the kill"


def logged(stage_dir: str, key: str) -> list[float]:
    """`key` at each logged step, from the stage's last checkpoint's trainer state."""
    import json

    (state,) = Path(stage_dir).glob("checkpoints/checkpoint-*/trainer_state.json")
    return [e[key] for e in json.loads(state.read_text())["log_history"] if key in e]


def test_warmup_steps_ramp_the_learning_rate_up_instead_of_warmup_ratio(gym_home):
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    short = dict(method="sft", learning_rate=1e-3, max_steps=8, logging_steps=1, save_steps=8)
    ramp = logged(train.run(TrainConfig(warmup_steps=4, **short), model, data).stage_dir, "learning_rate")
    assert ramp[:5] == pytest.approx([0, 2.5e-4, 5e-4, 7.5e-4, 1e-3])  # 4 steps up to the peak
    assert ramp[5] < ramp[4]  # then the cosine decay
    # Unset, warmup_ratio (5% of 8 steps: 1 step) applies.
    default = logged(train.run(TrainConfig(**short), model, data).stage_dir, "learning_rate")
    assert default[:2] == pytest.approx([0, 1e-3]) and default[2] < default[1]
    # One step (a smoke test) would be that 0: it gets no warmup and trains at the peak.
    once = train.run(TrainConfig(**(short | {"max_steps": 1, "save_steps": 1})), model, data)
    assert logged(once.stage_dir, "learning_rate") == pytest.approx([1e-3])
    before, after = weights(model.path), weights(once.model_dir)
    assert all(not before[k].equal(after[k]) for k in before)


def test_adam_settings_and_scheduler_arguments_reach_the_optimizer_and_the_schedule(gym_home):
    import math

    import torch

    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    config = TrainConfig(
        method="sft",
        learning_rate=1e-3,
        max_steps=4,
        logging_steps=1,
        save_steps=4,
        warmup_steps=0,
        adam_beta1=0.8,
        adam_beta2=0.95,
        adam_epsilon=1e-6,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.5},
    )
    result = train.run(config, model, data)
    (checkpoint,) = Path(result.stage_dir).glob("checkpoints/checkpoint-*")
    group = torch.load(checkpoint / "optimizer.pt", weights_only=True)["param_groups"][0]
    assert tuple(group["betas"]) == (0.8, 0.95) and group["eps"] == 1e-6
    # cosine from 1e-3 down to half of it (min_lr_rate) over 4 steps, not down to 0
    expected = [5e-4 + 5e-4 * 0.5 * (1 + math.cos(math.pi * t / 4)) for t in range(4)]
    assert logged(result.stage_dir, "learning_rate") == pytest.approx(expected)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"lr_scheduler_type": "cosinus"}, r"train.lr_scheduler_type: 'cosinus' is not a transformers "),
        (
            {"lr_scheduler_kwargs": {"min_lr_rate": 0.1}},
            r"train.lr_scheduler_kwargs: cosine takes num_cycles, not min_lr_rate",
        ),
        # these failed inside the train task, after ingest, tokenization and the model's loading
        (
            {"lr_scheduler_type": "cosine_with_min_lr"},
            r"lr_scheduler_kwargs: cosine_with_min_lr needs exactly one of min_lr or min_lr_rate",
        ),
        (
            {
                "lr_scheduler_type": "cosine_warmup_with_min_lr",
                "lr_scheduler_kwargs": {"min_lr": 0, "min_lr_rate": 0},
            },
            r"cosine_warmup_with_min_lr needs exactly one of min_lr or min_lr_rate",
        ),
        ({"lr_scheduler_type": "warmup_stable_decay"}, r"warmup_stable_decay needs num_decay_steps \(lr_sch"),
        ({"lr_scheduler_type": "reduce_lr_on_plateau"}, r"steps on the held-out loss: it needs evaluations"),
        ({"lr_scheduler_type": "greedy"}, r"train.lr_scheduler_type: greedy steps on the held-out loss"),
        (
            {"optim": "adamw_torh"},
            r"train.optim: 'adamw_torh' is not a transformers optimizer \(did you mean adamw_torch",
        ),
        (
            {"optim": "bogus"},
            r"train.optim: 'bogus' is not a transformers optimizer; choose from adamw_torch, ",
        ),
    ],
)
def test_a_schedule_transformers_cannot_build_fails_before_any_model(settings, says):
    from gym import preflight
    from gym.pipeline import TrainFlowConfig

    with pytest.raises(ConfigError, match=says):
        preflight.check_methods(TrainFlowConfig(train=TrainConfig(**settings)))
    for good in (
        {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr": 1e-5}},
        {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"num_decay_steps": 10}},
        {"lr_scheduler_type": "reduce_lr_on_plateau", "eval_steps": 10},
        {"optim": "adafactor"},
    ):
        preflight.check_methods(TrainFlowConfig(train=TrainConfig(**good)))


def test_a_schedule_on_held_out_loss_without_held_out_data_fails_before_the_model_loads(tmp_path):
    model = tiny()
    gone = model.model_copy(
        update={"path": str(tmp_path / "no-such-model")}
    )  # loading would fail differently
    config = TrainConfig(method="sft", max_steps=2, lr_scheduler_type="reduce_lr_on_plateau", eval_steps=1)
    with pytest.raises(
        ConfigError, match=r"lr_scheduler_type: reduce_lr_on_plateau steps on the held-out loss"
    ):
        train.run(config, gone, tokenized("demo_sft", model, max_samples=8))


def test_neftune_noises_the_embeddings_while_training_only(gym_home):
    import torch
    from transformers import AutoModelForCausalLM

    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    short = dict(method="sft", learning_rate=3e-3, max_steps=6, logging_steps=1, save_steps=6)
    plain = train.run(TrainConfig(**short), model, data)
    noisy = train.run(TrainConfig(neftune_noise_alpha=5.0, **short), model, data)
    assert noisy.losses[0][1] != plain.losses[0][1]  # the first step already sees noisy embeddings
    assert noisy.losses[-1][1] < noisy.losses[0][1]  # and it learns
    # The saved model carries no noise: two forward passes agree.
    trained = AutoModelForCausalLM.from_pretrained(noisy.model_dir).train()
    ids = torch.tensor([[5, 17, 300, 42, 7]])
    with torch.no_grad():
        assert torch.equal(trained(ids).logits, trained(ids).logits)


def test_records_cutoff_len_cut_or_left_out_and_pairs_without_a_preference_are_reported(
    gym_home, capsys, tmp_path
):
    """They were counted in the tokenized data's meta and said nowhere: a user's long records vanished
    silently (sft), or trained with their answers cut away (pairs)."""
    import datasets

    from gym.data.ingest import load_meta

    data = Path(__file__).parent / "fixtures" / "data"
    whole = datasets.load_from_disk(str(tokenized(str(data / "alpaca.jsonl"), tiny())))
    cut = min(len(ids) for ids in whole["input_ids"]) - 1  # every record is cut; some lose all labels
    sft = tokenized(str(data / "alpaca.jsonl"), tiny(), cutoff_len=cut)
    result = load_meta(sft)["result"]
    # Named by their numbers in the file: left out = no label within the cut; the others are all cut.
    dropped = [i for i, labels in enumerate(whole["labels"], 1) if set(labels[:cut]) == {-100}]
    kept = [i for i in range(1, len(whole) + 1) if i not in dropped]
    assert (result["dropped_records"], result["truncated_records"]) == (dropped, kept) and dropped and kept
    train.run(TrainConfig(method="sft", max_steps=1), tiny(), sft)
    err = capsys.readouterr().err
    one, *_ = dropped
    assert (
        f"gym: sft: note: 1 of {len(whole)} record(s) left out (record {one}): within cutoff_len={cut}" in err
    )
    which = ", ".join(map(str, kept))
    assert (
        f"note: {len(kept)} of {len(kept)} record(s) cut to cutoff_len={cut} tokens (records {which})" in err
    )
    pairs = tokenized(str(data / "preference_lf.json"), tiny(), cutoff_len=cut)
    over = load_meta(pairs)["result"]["stats"]["num_over_cutoff"]
    assert over
    train.run(TrainConfig(method="dpo", max_steps=1), tiny(), pairs)
    err = capsys.readouterr().err
    assert f"gym: dpo: note: {over} of " in err and "same text" not in err
    # A pair whose chosen and rejected answers are one text teaches no preference: trained on silently.
    same = tmp_path / "same.jsonl"
    rows = [{"prompt": f"q{i}", "chosen": "yes", "rejected": "no"} for i in range(5)]
    rows += [{"prompt": "q5", "chosen": "same", "rejected": "same"}]
    same.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train.run(TrainConfig(method="orpo", max_steps=1), tiny(), tokenized(str(same), tiny()))
    assert "gym: orpo: note: 1 of 6 pair(s) have the same text as chosen and rejected answer" in (
        capsys.readouterr().err
    )
    untouched = tokenized("demo_sft", tiny(), max_samples=16)
    train.run(TrainConfig(method="sft", max_steps=1), tiny(), untouched)
    assert "record(s)" not in capsys.readouterr().err


def test_adapter_settings_the_finetuning_type_does_not_read_get_a_note():
    """`--finetuning_type full --lora_rank 16` trained in full and said nothing of the rank."""
    from gym.train import adapters
    from gym.train.config import FreezeSettings, LoraSettings

    rank16 = LoraSettings(r=16, alpha=32)
    assert "lora settings are unused: finetuning_type full" in str(
        adapters.unused_settings(TrainConfig(finetuning_type="full", lora=rank16))
    )
    assert "freeze settings are unused" in str(
        adapters.unused_settings(TrainConfig(finetuning_type="dora", freeze=FreezeSettings(layers=1)))
    )
    for read in (
        TrainConfig(finetuning_type="lora", lora=rank16),
        TrainConfig(finetuning_type="freeze", freeze=FreezeSettings(layers=1)),
        TrainConfig(finetuning_type="full", lora=LoraSettings()),  # as good as unset
        TrainConfig(finetuning_type="full"),
    ):
        assert adapters.unused_settings(read) is None


def test_resuming_a_tied_embedding_model_warns_of_no_missing_key_but_a_real_one_still_warns(gym_home):
    """gym-tiny's output layer shares the embedding's weight, saved once: every resume warned
    "There were missing keys in the checkpoint model loaded: ['lm_head.weight']", which is not so."""
    import logging
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from gym.train.common import MISSING_KEYS, tied_keys_not_missing

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("transformers.trainer")
    log.addHandler(handler)
    try:
        config = TrainConfig(method="sft", max_steps=3, save_steps=1, logging_steps=1)
        data = tokenized("demo_sft", tiny(), max_samples=64)
        stage = Path(train.run(config, tiny(), data).stage_dir)
        (stage / "result.json").unlink()  # as if killed after the checkpoint of step 2
        shutil.rmtree(stage / "model")
        shutil.rmtree(stage / "checkpoints" / "checkpoint-3")
        resumed = train.run(config, tiny(), data)
        assert resumed.resumed_from is not None and resumed.resumed_from.endswith("checkpoint-2")
        assert not [m for m in seen if m.startswith(MISSING_KEYS)], seen
        model = AutoModelForCausalLM.from_pretrained(resumed.model_dir)
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
        with tied_keys_not_missing(model):  # a key that is really missing still warns
            log.warning(MISSING_KEYS + "['model.norm.weight'].")
            log.warning(MISSING_KEYS + "['lm_head.weight'].")
        assert [m for m in seen if m.startswith(MISSING_KEYS)] == [MISSING_KEYS + "['model.norm.weight']."]
    finally:
        log.removeHandler(handler)
