"""QA findings on training: adapter settings a type doesn't read, freeze that trains nothing, the closing
progress line's tokens/s."""

from __future__ import annotations

import io
import types

import pytest
from transformers import TrainerState

from gym import errors, progress
from gym import train as gym_train
from gym.train import TrainConfig, adapters
from gym.train import progress as train_progress
from gym.train.config import FreezeSettings, LongLoraSettings, QuantSettings
from tests.helpers import tiny, tokenized

# ---- finding 1: QLoRA and LongLoRA settings under a type that doesn't read them -------------------------


def test_quant_and_longlora_settings_a_type_does_not_read_get_a_note_naming_the_type_that_does():
    """`--finetuning_type lora --train.quant.bits 4` trained unquantized LoRA and said nothing."""
    bits4 = QuantSettings(bits=4)
    ratio = LongLoraSettings(group_size_ratio=0.5)
    for kind in ("lora", "full", "freeze", "dora", "longlora"):
        note = str(adapters.unused_settings(TrainConfig(finetuning_type=kind, quant=bits4)))
        assert note.startswith("the quant settings are unused: ") and "--finetuning_type qlora" in note
        assert f"finetuning_type {kind} loads the model unquantized" in note
    for kind in ("lora", "full", "qlora"):
        note = str(adapters.unused_settings(TrainConfig(finetuning_type=kind, longlora=ratio)))
        assert note.startswith("the longlora settings are unused: ") and "--finetuning_type longlora" in note
        assert note.endswith(f"not {kind}")
    both = adapters.unused_settings(TrainConfig(finetuning_type="lora", quant=bits4, longlora=ratio))
    assert both is not None and "the longlora settings are unused" in both and "the quant settings" in both
    for read in (
        TrainConfig(finetuning_type="qlora", quant=bits4),
        TrainConfig(finetuning_type="longlora", longlora=ratio),
        TrainConfig(finetuning_type="lora", quant=QuantSettings(), longlora=LongLoraSettings()),  # defaults
    ):
        assert adapters.unused_settings(read) is None


def test_a_lora_stage_given_quant_settings_says_they_are_unused(capsys):
    model = tiny()
    config = TrainConfig(method="sft", finetuning_type="lora", max_steps=1, quant=QuantSettings(bits=4))
    result = gym_train.run(config, model, tokenized("demo_sft", model, max_samples=8))
    err = capsys.readouterr().err
    assert "gym: sft: note: the quant settings are unused: " in err and "--finetuning_type qlora" in err
    assert "quant" not in result.hyperparameters  # it trained unquantized, as the note says


# ---- finding 2: freeze.layers 0 with nothing else to train, refused before the model loads --------------


def test_freeze_that_trains_nothing_is_refused_before_any_model_loads(tmp_path):
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=8)
    gone = model.model_copy(update={"path": str(tmp_path / "no-such-model")})  # loading it would fail
    config = TrainConfig(method="sft", finetuning_type="freeze", max_steps=1, freeze=FreezeSettings(layers=0))
    with pytest.raises(errors.ConfigError) as refused:
        gym_train.run(config, gone, data)
    assert (
        str(refused.value)
        == adapters.NOTHING_TO_FREEZE
        == ("freeze trains nothing: set freeze.layers to a non-zero N, or freeze.extra_modules")
    )
    with pytest.raises(errors.ConfigError, match=r"^freeze trains nothing"):  # modules are the layers' parts
        adapters.check(config.model_copy(update={"freeze": FreezeSettings(layers=0, modules=["mlp"])}), model)
    # Something else trains: named modules, a reward model's new head, new tokens' embedding rows.
    adapters.check(
        config.model_copy(update={"freeze": FreezeSettings(layers=0, extra_modules=["norm"])}), model
    )
    adapters.check(config.model_copy(update={"method": "rm"}), model)
    adapters.check(config, model.model_copy(update={"new_token_ids": [512]}))
    adapters.check(config.model_copy(update={"finetuning_type": "lora"}), model)  # freeze unused: a note


def test_freeze_that_trains_nothing_is_refused_by_the_flows_preflight(gym_home):
    """It was refused in the train task only, after ingesting, tokenizing and the held-out evaluation."""
    from gym import preflight
    from gym.pipeline import TrainFlowConfig

    nothing = TrainConfig(method="sft", finetuning_type="freeze", freeze=FreezeSettings(layers=0))
    with pytest.raises(errors.ConfigError, match=r"^train\.freeze trains nothing"):
        preflight.check(TrainFlowConfig(train=nothing))
    extra = nothing.model_copy(update={"freeze": FreezeSettings(layers=0, extra_modules=["norm"])})
    preflight.check(TrainFlowConfig(train=extra))
    preflight.check(TrainFlowConfig(train=nothing, new_special_tokens=["<tool>"]))


# ---- finding 3: the closing line's tokens/s is the run's average, not the last interval's ---------------


def test_the_done_line_shows_the_runs_average_tokens_per_second_not_the_last_intervals():
    out = io.StringIO()
    bar = progress.Progress("sft", 1880, stream=out, tty=False, now=0.0)
    bar.update(1880, loss=1.0, tokens_per_s=25_900.0, now=179.0)  # the last interval ran fast
    bar.done(now=179.0, tokens=8517.0 * 179)
    assert out.getvalue().splitlines()[-1] == "sft: done, 1880 steps in 2:59, loss 1 -> 1, 8.5k tok/s"
    out = io.StringIO()  # tokens unknown: no rate, rather than the last interval's as if it were the stage's
    bar = progress.Progress("sft", 10, stream=out, tty=False, now=0.0)
    bar.update(10, loss=1.0, tokens_per_s=25_900.0, now=10.0)
    bar.done(now=10.0)
    assert "tok/s" not in out.getvalue().splitlines()[-1]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.parametrize("resumed", [False, True])
def test_the_trainers_closing_line_averages_the_tokens_this_run_counted(monkeypatch, capsys, resumed):
    """`sft: done, 1880 steps in 2:59, ... 25.9k tok/s` while the JSON said 8517 tok/s."""
    clock = Clock()
    fake_time = types.SimpleNamespace(monotonic=clock.monotonic)
    monkeypatch.setattr(progress, "time", fake_time)
    monkeypatch.setattr(train_progress, "time", fake_time)
    monkeypatch.delenv(progress.VERBOSE_ENV, raising=False)
    start, before = (100, 40_000) if resumed else (0, 0)
    state = TrainerState(max_steps=200, global_step=start, num_input_tokens_seen=before)
    callback = train_progress.ProgressCallback("sft")
    callback.on_train_begin(None, state, None)
    for step, tokens, at in ((150, 10_000, 80.0), (200, 30_000, 84.0)):  # 125 tok/s, then 5,000 tok/s
        clock.now, state.global_step, state.num_input_tokens_seen = at, step, before + tokens
        callback.on_log(None, state, None, logs={"loss": 1.0, "num_tokens": tokens})
    clock.now = 100.0
    callback.on_train_end(None, state, None)
    done = capsys.readouterr().err.splitlines()[-1]
    since = " since the resume" if resumed else ""
    assert done.endswith(", 300 tok/s" + since), done  # 30,000 tokens in 100 s, whatever came before


def test_a_model_name_given_to_train_run_says_to_resolve_it_first(tmp_path):
    """The Python API's `train.run(config, "gym-tiny", data)` raised AttributeError: 'str' object has no
    attribute 'train_defaults'."""
    with pytest.raises(
        errors.ConfigError, match=r"model 'gym-tiny': pass the ModelRef that gym.models.resolve"
    ):
        gym_train.run(TrainConfig(method="sft", max_steps=1), "gym-tiny", tmp_path)  # type: ignore[arg-type]
