"""Flags generated from pydantic configs, and the Gym papers' flag names."""

from __future__ import annotations

import pytest

from flows.runner import build_parser, parse_config, print_summary
from gym.errors import GymError
from gym.pipeline import SftThenDpoConfig, TrainFlowConfig


def parse(cls, argv):
    return parse_config(cls, build_parser(cls).parse_args(argv))


def test_defaults_untouched_without_flags():
    assert parse(SftThenDpoConfig, []) == SftThenDpoConfig()


def test_every_field_is_a_flag_including_nested():
    cfg = parse(
        SftThenDpoConfig,
        [
            "--sft.learning-rate",
            "0.01",
            "--dpo.beta",
            "0.3",
            "--data.cutoff_len",
            "64",
            "--no-data.train_on_prompt",
            "--sft.lora.target_modules",
            "q_proj",
            "v_proj",
            "--eval_limit",
            "7",
            "--output.register_as",
            "m",
        ],
    )
    assert cfg.sft.learning_rate == 0.01 and cfg.dpo.beta == 0.3
    assert cfg.data.cutoff_len == 64 and cfg.data.train_on_prompt is False
    assert cfg.sft.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.eval_limit == 7 and cfg.output.register_as == "m"
    assert cfg.dpo.learning_rate == SftThenDpoConfig().dpo.learning_rate  # untouched


def test_paper_flag_names_map_onto_config():
    cfg = parse(
        TrainFlowConfig,
        [
            "--model_name_or_path",
            "qwen2.5-0.5b-instruct",
            "--template",
            "chatml",
            "--dataset",
            "my_data",
            "--finetuning_type",
            "lora",
            "--num_train_epochs",
            "2",
            "--output_dir",
            "/tmp/out",
        ],
    )
    assert cfg.model == "qwen2.5-0.5b-instruct" and cfg.template == "chatml" and cfg.dataset == "my_data"
    assert cfg.train.finetuning_type == "lora"
    assert cfg.train.num_train_epochs == 2 and cfg.train.max_steps == -1
    assert cfg.output.output_dir == "/tmp/out"


def test_max_steps_applies_to_every_stage_and_specific_flag_wins():
    cfg = parse(SftThenDpoConfig, ["--max-steps", "5", "--dpo.max_steps", "9"])
    assert cfg.sft.max_steps == 5 and cfg.dpo.max_steps == 9


def test_finetuning_type_as_method_name():
    assert parse(TrainFlowConfig, ["--finetuning_type", "dpo"]).train.method == "dpo"
    assert parse(TrainFlowConfig, ["--finetuning_type", "grpo"]).train.method == "grpo"
    with pytest.raises(GymError, match="no_such_method"):
        parse(TrainFlowConfig, ["--finetuning_type", "no_such_method"])


def test_a_number_among_fixed_choices_arrives_as_a_number():
    """`--train.quant.bits 4` (README's QLoRA example): a Literal[4, 8] field, so the text must become 4."""
    cfg = parse(TrainFlowConfig, ["--finetuning_type", "qlora", "--train.quant.bits", "4"])
    assert cfg.train.quant.bits == 4
    assert parse(TrainFlowConfig, ["--train.quant.quant_type", "fp4"]).train.quant.quant_type == "fp4"
    with pytest.raises(SystemExit):
        parse(TrainFlowConfig, ["--train.quant.bits", "5"])


def test_bad_value_is_rejected_by_validation():
    with pytest.raises(Exception, match="learning_rate"):
        parse(SftThenDpoConfig, ["--sft.learning_rate", "-1"])


def test_the_printed_summary_leaves_out_what_this_run_does_not_have(capsys):
    print_summary(
        {"pt_loss_last": 3.13779, "sft_loss_last": None, "dpo_reward_accuracy": None, "model_version": "1"}
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "== gym run summary =="
    assert [line.split() for line in lines[1:]] == [["model_version", "1"], ["pt_loss_last", "3.1378"]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--train.learning_rate", "abc"],
            "argument --train.learning-rate/--train.learning_rate: invalid float value: 'abc'",
        ),
        (["--data.max_samples", "many"], "invalid int value: 'many'"),
        (
            ["--train.lr_scheduler_kwargs", "{min_lr_rate: 0.1}"],
            "expected a JSON mapping such as "
            "{\"min_lr_rate\": 0.1} (got '{min_lr_rate: 0.1}': Expecting property name enclosed in "
            "double quotes at character 2)",
        ),
        (["--train.lr_scheduler_kwargs", "[0.1]"], "expected a mapping such as"),
    ],
)
def test_a_bad_flag_value_gets_a_short_usage_and_says_what_it_expects(capsys, argv, message):
    parser = build_parser(TrainFlowConfig, prog="gym train --method sft")
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(argv)
    assert stop.value.code == 2
    usage, error = capsys.readouterr().err.strip().splitlines()  # two lines, not the flow's whole usage
    assert usage == "usage: gym train --method sft [options]   (every option: gym train --method sft --help)"
    assert error.startswith("error: ") and message in error


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["--sft.learnign_rate", "1e-3"], "did you mean --sft.learning_rate or "),  # a typo
        (["--sft.lr", "1e-3"], "did you mean --sft.learning_rate?"),  # ambiguous: lr_scheduler_*
        (["--lr", "1e-3"], "did you mean --learning_rate?"),
        (["--epochs", "2"], "did you mean --num_train_epochs?"),
        (["--batch-size", "4"], "did you mean --per_device_train_batch_size?"),
        (["--beta", "0.2"], "--dpo.beta or --pref_beta?"),
    ],
)
def test_an_unknown_flag_gets_the_flag_it_may_mean(capsys, argv, suggested):
    parser = build_parser(SftThenDpoConfig, prog="sft_then_dpo.py")
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and suggested in error


def test_an_unknown_flag_with_nothing_like_it_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        build_parser(SftThenDpoConfig).parse_args(["--zzz", "1"])
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: unrecognized arguments: --zzz 1"


def test_a_dict_setting_takes_a_json_mapping():
    cfg = parse(TrainFlowConfig, ["--train.lr_scheduler_kwargs", '{"min_lr_rate": 0.1}'])
    assert cfg.train.lr_scheduler_kwargs == {"min_lr_rate": 0.1}


def test_help_shows_the_paper_flags_with_their_values_not_internal_names():
    text = build_parser(TrainFlowConfig, prog="gym train --method sft").format_help()
    assert "--model_name_or_path MODEL" in text and "--max-steps STEPS" in text and "--output_dir DIR" in text
    assert "ALIAS_" not in text


def test_a_flow_scripts_config_file_naming_a_stage_says_the_flow_has_its_own(tmp_path, capsys):
    """LLaMA-Factory's `stage:` in a file for `python flows/sft_then_dpo.py` was "unknown setting" alone."""
    from flows.runner import main
    from flows.sft_then_dpo import sft_then_dpo

    config = tmp_path / "mini.yaml"
    config.write_text("stage: sft\nmodel_name_or_path: gym-tiny\n")
    assert main(sft_then_dpo, SftThenDpoConfig, [str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}: unknown setting 'stage': this flow runs its own stages; leave it out" in err
