"""`gym train`'s and the flow scripts' command lines: an unknown adaptation type named as such, `lora_target:
all` as a LoRA setting, the command line's method over a config file's, and flags spelled in full."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows import runner
from flows.commands import cmd_train, method_of, train_plan
from gym.cli_options import ArgumentParser, dotlist
from gym.errors import ConfigError
from gym.pipeline import TrainFlowConfig

UNKNOWN = r"unknown --finetuning_type '{}'; adaptation types: full, freeze, lora, .*\(or a method: sft, "


def config_of(argv: list[str]) -> dict[str, Any]:
    """The flow config `gym train ARGV` runs (nothing runs)."""
    plan = train_plan(argv)
    parser = runner.build_parser(plan.config_cls, prog=plan.prog)
    assert isinstance(parser, ArgumentParser)
    under = parser.parse_file(*plan.config_file) if plan.config_file else None
    args = parser.parse_args(dotlist(plan.argv, parser._option_string_actions))  # as runner.main
    where = plan.config_file[0] if plan.config_file else None  # as runner.main: errors name the file
    return runner.parse_config(plan.config_cls, args, under, where).model_dump()


# 1. A misspelled adaptation type is not a method that disagrees with the one named.


@pytest.mark.parametrize(
    ("argv", "bad"),
    [
        ("--method sft --finetuning_type lorax", "lorax"),
        ("--stage sft --finetuning_type lorax", "lorax"),
        ("--pref_loss simpo --finetuning_type dorra", "dorra"),
        ("--finetuning_type lorax", "lorax"),
    ],
)
def test_an_unknown_finetuning_type_is_named_as_unknown_even_beside_a_method(argv, bad, capsys):
    with pytest.raises(ConfigError, match=UNKNOWN.format(bad)):
        method_of(argv.split())
    assert cmd_train(argv.split()) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: unknown --finetuning_type '{bad}'") and "disagree" not in err, err
    assert len(err.splitlines()) == 1


def test_a_known_method_as_finetuning_type_still_disagrees_with_another_method():
    with pytest.raises(ConfigError, match=r"--finetuning_type dpo .* and method kto .* disagree"):
        method_of(["--method", "kto", "--finetuning_type", "dpo"])


@pytest.mark.parametrize("other", [["--method", "kto"], ["--train.method", "kto"]])
def test_the_flow_script_refuses_a_method_as_finetuning_type_beside_another_method(other, capsys):
    """`python flows/train.py --finetuning_type dpo --method kto` trained KTO, dropping the paper's form."""
    from flows.train import train

    assert runner.main(train, TrainFlowConfig, ["--finetuning_type", "dpo", *other]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --finetuning_type dpo (a method, in the papers' form) and method kto"), err
    same = runner.parse_config(
        TrainFlowConfig,
        runner.build_parser(TrainFlowConfig).parse_args(["--finetuning_type", "dpo", "--method", "dpo"]),
    )
    assert same.train.method == "dpo"


# 2. `lora_target: all` is a LoRA setting (every projection), as LLaMA-Factory's usual value.


def test_lora_target_all_on_the_command_line_trains_a_lora_adapter_on_every_projection():
    argv = ["--method", "sft", "--dataset", "d/alpaca.jsonl", "--lora_target", "all", "--max-steps", "1"]
    train = config_of(argv)["train"]
    assert train["finetuning_type"] == "lora" and train["lora"]["target_modules"] is None
    assert train["lora"]["alpha"] == 16  # gym's default, not set by lora_target
    # Named modules, and a type given beside `all`, are as before.
    assert config_of([*argv[:5], "q_proj,v_proj"])["train"]["lora"]["target_modules"] == ["q_proj", "v_proj"]
    full = config_of([*argv, "--finetuning_type", "full"])["train"]
    assert full["finetuning_type"] == "full" and full["lora"]["target_modules"] is None
    assert config_of([*argv, "--finetuning_type", "dora"])["train"]["finetuning_type"] == "dora"


@pytest.mark.parametrize("target", ["all", "[all]"])
def test_a_llamafactory_yaml_with_lora_target_all_and_no_finetuning_type_trains_lora(tmp_path, target):
    path = tmp_path / "lora_sft.yaml"
    path.write_text(f"stage: sft\nmodel_name_or_path: gym-tiny\nlora_target: {target}\n")
    train = config_of([str(path)])["train"]
    assert train["finetuning_type"] == "lora" and train["lora"]["target_modules"] is None
    train = config_of([str(path), "lora_rank=4"])["train"]
    assert train["lora"]["r"] == 4 and train["lora"]["alpha"] == 8 and train["finetuning_type"] == "lora"
    # The file's type wins over the implied one, as the command line's over the file's.
    path.write_text("stage: sft\nfinetuning_type: full\nlora_target: all\n")
    assert config_of([str(path)])["train"]["finetuning_type"] == "full"
    assert config_of([str(path), "--finetuning_type", "lora"])["train"]["finetuning_type"] == "lora"


# 3. The command line's method-choosing keys win over a config file's.

DPO_SIGMOID = "stage: dpo\npref_loss: sigmoid\nmodel_name_or_path: gym-tiny\n"
DPO_SIMPO = "stage: dpo\npref_loss: simpo\nmodel_name_or_path: gym-tiny\n"


@pytest.mark.parametrize(
    ("text", "argv", "method", "note"),
    [
        (DPO_SIGMOID, "stage=sft --dataset demo_sft", "sft", "pref_loss sigmoid"),
        (DPO_SIGMOID, "--stage kto", "kto", "pref_loss sigmoid"),
        (DPO_SIGMOID, "--method sft", "sft", "pref_loss sigmoid"),
        (DPO_SIGMOID, "--finetuning_type orpo", "orpo", "pref_loss sigmoid"),
        ("stage: dpo\nmodel_name_or_path: gym-tiny\n", "--method kto", "kto", None),
        ("stage: dpo\n", "method=kto", "kto", None),
        ("method: dpo\n", "--stage kto", "kto", None),
        ("finetuning_type: simpo\n", "--method orpo", "orpo", None),
        # What only refines the command line's `--stage dpo`, or agrees with its method, holds.
        (DPO_SIMPO, "--stage dpo", "simpo", None),
        ("method: cdpo\n", "--stage dpo", "cdpo", None),
        (DPO_SIGMOID, "--method cdpo", "cdpo", None),
        (DPO_SIGMOID, "--method dpo", "dpo", None),
        (DPO_SIMPO, "--pref_loss orpo", "orpo", None),
        (DPO_SIMPO, "--method dpo", "dpo", "pref_loss simpo"),
        # An adaptation type on the command line leaves the file's method, and the file's type gives way.
        ("finetuning_type: dpo\n", "--finetuning_type lora", "dpo", None),
        ("stage: kto\nfinetuning_type: lora\n", "--finetuning_type full", "kto", None),
        # The file's training-free switch applies to the command line's grpo only.
        ("finetuning_type: grpo\ntraining_free_grpo: true\n", "--method grpo", "tf_grpo", None),
        ("finetuning_type: grpo\ntraining_free_grpo: true\n", "--method sft", "sft", "training_free_grpo"),
        # Nothing on the command line picks: the file does, as before.
        (DPO_SIMPO, "--learning_rate 1e-5", "simpo", None),
        ("finetuning_type: grpo\n", "--training_free_grpo", "tf_grpo", None),
    ],
)
def test_the_command_lines_method_wins_over_the_config_files(tmp_path, capsys, text, argv, method, note):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    plan = train_plan([str(path), *argv.split()])
    assert plan.prog == f"gym train --method {method}"
    err = capsys.readouterr().err
    if note is None:
        assert "note:" not in err, err
    else:
        assert f"note: {note} (in {path}) does not apply to method {method}, which the command line" in err
        assert len(err.strip().splitlines()) == 1


def test_a_files_pref_loss_the_command_line_overrides_reaches_neither_the_flow_nor_its_config(tmp_path):
    path = tmp_path / "lfdpo.yaml"
    path.write_text(DPO_SIGMOID)
    config = config_of([str(path), "stage=sft", "--dataset", "demo_sft"])
    assert config["train"]["method"] == "sft" and config["train"]["loss_type"] is None
    assert config["model"] == "gym-tiny" and config["dataset"] == "demo_sft"
    types = config_of([str(path), "--finetuning_type", "orpo", "--max-steps", "1"])["train"]
    assert types["method"] == "orpo" and types["finetuning_type"] == "full"
    path.write_text("finetuning_type: dpo\n")
    train = config_of([str(path), "--finetuning_type", "lora"])["train"]
    assert train["method"] == "dpo" and train["finetuning_type"] == "lora"


@pytest.mark.parametrize(
    ("text", "argv", "says"),
    [
        (DPO_SIGMOID, "--stage sft --pref_loss sigmoid", "--pref_loss sigmoid picks method dpo, not sft"),
        (DPO_SIGMOID, "--method kto --stage sft", "--stage sft and --method kto disagree"),
        ("stage: sft\npref_loss: sigmoid\n", "--dataset demo_sft", "--pref_loss sigmoid picks method dpo"),
        ("stage: sft\npref_loss: sigmoid\n", "--stage sft", "--pref_loss sigmoid picks method dpo"),
        ("stage: rm\nmethod: dpo\n", "--stage kto", "--stage rm and --method dpo disagree"),
        ("finetuning_type: lorax\n", "--method sft", UNKNOWN.format("lorax")),
        ("stage: dpo\n", "--training_free_grpo", "method 'dpo' has no training-free form"),
    ],
)
def test_contradictions_within_the_command_line_or_within_the_file_are_still_refused(
    tmp_path, text, argv, says
):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=says):
        train_plan([str(path), *argv.split()])


# 4. Flags are taken as spelled in full; the flow script takes gym train's --method.


def test_the_train_flow_script_takes_gym_trains_method_flag(capsys):
    parser = runner.build_parser(TrainFlowConfig)
    assert isinstance(parser, ArgumentParser)
    config = runner.parse_config(TrainFlowConfig, parser.parse_args(["--method", "dpo"]))
    assert config.train.method == "dpo"  # once: "ambiguous option: --method could match --method-eval-..."
    args = parser.parse_args(["--method", "dpo", "--train.method", "kto"])
    assert runner.parse_config(TrainFlowConfig, args).train.method == "kto", "gym's own flag wins"
    under = parser.parse_file(Path("run.yaml"), {"method": "orpo"})  # a config file's `method: orpo`
    assert runner.parse_config(TrainFlowConfig, parser.parse_args([]), under).train.method == "orpo"
    with pytest.raises(SystemExit) as done:  # `python flows/train.py --method dpo --help`
        runner.main("flows.train:train", TrainFlowConfig, ["--method", "dpo", "--help"])
    assert done.value.code == 0 and "--method METHOD" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"train\.method"):
        runner.parse_config(TrainFlowConfig, parser.parse_args(["--method", "dpoo"]))


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--learning", "0.5"], "--learning"),
        (["--lora_r", "4"], "--lora_r"),
        (["--max_sample", "5"], "--max_sample"),
        (["--train.learning", "0.5"], "--train.learning"),
        (["--method-eval", "demo_dpo_eval"], "--method-eval"),
    ],
)
def test_abbreviated_flags_are_refused_as_a_config_file_refuses_them(capsys, argv, flag):
    parser = runner.build_parser(TrainFlowConfig)
    with pytest.raises(SystemExit) as done:
        parser.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and err[-1].startswith(f"error: unrecognized arguments: {flag}"), err
    with pytest.raises(ConfigError, match=f"unknown setting '{flag[2:]}'"):
        parser.parse_file(Path("run.yaml"), {flag[2:]: argv[1]})


def test_gym_train_takes_its_method_choosing_flags_in_full_only(capsys):
    method, _, rest = method_of(["--meth", "dpo", "--pref", "simpo"])
    assert method == "sft" and rest == ["--meth", "dpo", "--pref", "simpo"]
    with pytest.raises(SystemExit):
        cmd_train(["--meth", "dpo"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: unrecognized arguments: --meth"), last


def test_do_train_false_and_overwrite_output_dir_false_are_honoured_not_passed_over(tmp_path):
    """`do_train: false` trained and registered a model; `overwrite_output_dir: false` replaced the folder:
    both false values were taken for "not given" (only true ones got their note)."""
    base = "stage: sft\ndo_train: {train}\nfinetuning_type: lora\ndataset: d\nmax_steps: 1\n"
    path = tmp_path / "eval_only.yaml"
    path.write_text(base.format(train="false"))
    with pytest.raises(ConfigError, match=rf"^{path}: do_train: false: gym train always trains; .*gym eval"):
        config_of([str(path)])
    path.write_text(base.format(train="true"))
    assert config_of([str(path)])["train"]["method"] == "sft"

    out = tmp_path / "saves"
    out.mkdir()
    (out / "model.safetensors").write_text("x")
    path.write_text(base.format(train="true") + f"output_dir: {out}\noverwrite_output_dir: false\n")
    with pytest.raises(ConfigError, match=r"overwrite_output_dir: false, and output_dir .*saves holds files"):
        config_of([str(path)])
    empty = tmp_path / "fresh"
    path.write_text(base.format(train="true") + f"output_dir: {empty}\noverwrite_output_dir: false\n")
    assert config_of([str(path)])["output"]["output_dir"] == str(empty)

    # The two from different places, as the run will use them: the folder was replaced, or a run into
    # a new folder refused for the file's own output_dir.
    path.write_text(base.format(train="true") + f"output_dir: {empty}\n")
    with pytest.raises(
        ConfigError, match=r"^overwrite_output_dir: false, and output_dir .*saves holds files"
    ):
        config_of([str(path), "--overwrite_output_dir", "false", "--output_dir", str(out)])
    with pytest.raises(
        ConfigError, match=r"^overwrite_output_dir: false, and output_dir .*saves holds files"
    ):
        config_of([str(path), f"output_dir={out}", "overwrite_output_dir=false"])
    path.write_text(base.format(train="true") + "overwrite_output_dir: false\n")
    with pytest.raises(
        ConfigError, match=rf"^{path}: overwrite_output_dir: false, and output_dir .*saves holds"
    ):
        config_of([str(path), f"output_dir={out}"])
    path.write_text(base.format(train="true") + f"output_dir: {out}\noverwrite_output_dir: false\n")
    assert config_of([str(path), f"output_dir={empty}"])["output"]["output_dir"] == str(empty)
    assert config_of([str(path), "--overwrite_output_dir", "true"])["output"]["output_dir"] == str(out)
