"""LLaMA-Factory's flag names and YAML config files, for `gym train` and the flow scripts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from flows import runner
from flows.commands import method_of
from gym import cli_llamafactory as lf
from gym.cli_options import dotlist, read_config_file
from gym.data.demo import demo_records
from gym.errors import ConfigError
from gym.pipeline import SftThenDpoConfig, TfGrpoFlowConfig, TrainFlowConfig
from tests.test_flows import run_script

# A value to give each stage-wide name, different from gym's default for it.
SAMPLE = {
    float: ("0.37", 0.37),
    int: ("3", 3),
    str: ("constant", "constant"),
    bool: ("true", True),
}


def parse(argv: list[str], cls: Any = TrainFlowConfig, file: dict[str, Any] | None = None) -> dict[str, Any]:
    parser = runner.build_parser(cls)
    under = parser.parse_file(Path("run.yaml"), file) if file is not None else None
    return runner.parse_config(cls, parser.parse_args(argv), under).model_dump()


def train_of(argv: list[str]) -> dict[str, Any]:
    return parse(argv)["train"]  # type: ignore[no-any-return]


def at(tree: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        tree = tree[part]
    return tree


@pytest.mark.parametrize("name", sorted(lf.STAGE))
def test_each_stage_wide_name_sets_its_gym_setting_in_every_stage(name):
    path, kind = lf.STAGE[name]
    text, value = SAMPLE.get(kind, ("q_proj,v_proj", ["q_proj", "v_proj"]))  # type: ignore[arg-type]
    if name == "quantization_bit":
        text, value = "4", 4
    elif name == "quantization_type":
        text, value = "fp4", "fp4"
    elif name == "freeze_trainable_layers":
        text, value = "-3", -3
    elif name == "eval_strategy":
        text, value = "epoch", "epoch"
    elif name == "rope_scaling":
        text, value = "yarn", "yarn"
    elif name == "lr_scheduler_kwargs":
        text, value = '{"min_lr_rate": 0.1}', {"min_lr_rate": 0.1}
    elif name == "reward_model":
        text, value = "saves/rm", ["reward_model:saves/rm"]
    needs = ["--bf16", "true"] if name == "pure_bf16" else []
    config = parse([f"--{name}", text, *needs], SftThenDpoConfig)
    assert at(config["sft"], path) == value and at(config["dpo"], path) == value


@pytest.mark.parametrize(
    ("argv", "path", "value"),
    [
        (["--cutoff_len", "128"], "data.cutoff_len", 128),
        (["--max_samples", "50"], "data.max_samples", 50),
        (["--train_on_prompt"], "data.train_on_prompt", True),
        (["--mask_history", "true"], "data.mask_history", True),
        (["--mix_strategy", "interleave_over"], "data.mix_strategy", "interleave_over"),
        (["--interleave_probs", "0.7,0.3"], "data.interleave_probs", [0.7, 0.3]),
        (["--default_system", "Be brief."], "data.default_system", "Be brief."),
        (["--flash_attn", "fa2"], "train.speed.attn_implementation", "flash_attention_2"),
        (["--flash_attn", "disabled"], "train.speed.attn_implementation", "eager"),
        (["--enable_liger_kernel", "false"], "train.speed.liger", "off"),
        (["--pissa_init"], "train.lora.init", "pissa"),
        (["--disable_gradient_checkpointing", "false"], "train.gradient_checkpointing", True),
        (["--lora_target", "all", "--finetuning_type", "lora"], "train.lora.target_modules", None),
    ],
)
def test_names_that_translate_or_sit_at_the_top(argv, path, value):
    assert at(parse(argv), path) == value


LLAMAFACTORY_EVAL = """\
### eval
val_size: 0.1
per_device_eval_batch_size: 1
eval_strategy: {strategy}
eval_steps: 500
"""


@pytest.mark.parametrize("strategy", ["steps", "epoch", "no"])
def test_a_llamafactory_eval_section_sets_held_out_evaluation_during_training(tmp_path, strategy):
    path = tmp_path / "lf.yaml"
    path.write_text(LLAMAFACTORY_EVAL.format(strategy=strategy))  # `no`: YAML reads it as false
    config = parse([], file=read_config_file(path))
    assert config["val_size"] == 0.1
    train = config["train"]
    assert train["per_device_eval_batch_size"] == 1 and train["per_device_train_batch_size"] is None
    assert train["eval_strategy"] == strategy and train["eval_steps"] == 500
    sft_then_dpo = parse(["--eval_steps", "20"], SftThenDpoConfig)
    assert sft_then_dpo["sft"]["eval_steps"] == sft_then_dpo["dpo"]["eval_steps"] == 20


LLAMAFACTORY_OPTIMIZER = """\
### train
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs:
  min_lr_rate: 0.1
adam_beta2: 0.95
adam_epsilon: 1.0e-6
"""


def test_a_llamafactory_schedule_and_adam_settings_reach_the_stage(tmp_path):
    path = tmp_path / "lf.yaml"
    path.write_text(LLAMAFACTORY_OPTIMIZER)
    train = parse([], file=read_config_file(path))["train"]
    assert train["lr_scheduler_type"] == "cosine_with_min_lr"
    assert train["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    assert (train["adam_beta1"], train["adam_beta2"], train["adam_epsilon"]) == (0.9, 0.95, 1e-6)
    with pytest.raises(SystemExit):  # not a mapping: argparse's usage error names the flag
        parse(["--lr_scheduler_kwargs", "0.1"])


def test_a_bad_eval_strategy_names_the_values_there_are(tmp_path):
    path = tmp_path / "lf.yaml"
    path.write_text("eval_strategy: epochs\n")
    parser = runner.build_parser(TrainFlowConfig)
    with pytest.raises(ConfigError, match=r"eval_strategy is no, steps or epoch \(got 'epochs'\)"):
        parser.parse_file(path, read_config_file(path))


def test_lora_names_mean_an_adapter_with_alpha_twice_the_rank_as_in_llamafactory():
    train = parse(["--lora_rank", "16"])["train"]
    assert train["finetuning_type"] == "lora" and train["lora"]["r"] == 16 and train["lora"]["alpha"] == 32
    assert parse(["--lora_rank", "16", "--lora_alpha", "8"])["train"]["lora"]["alpha"] == 8
    assert parse(["--lora_rank", "16", "--train.lora.alpha", "4"])["train"]["lora"]["alpha"] == 4
    # The alpha a config file gives holds against a rank from the command line, and the file's type.
    train = parse(["--lora_rank", "16"], file={"lora_alpha": 64, "finetuning_type": "dora"})["train"]
    assert train["lora"]["alpha"] == 64 and train["finetuning_type"] == "dora"
    assert train_of(["--finetuning_type", "rslora", "--lora_dropout", "0.1"])["finetuning_type"] == "rslora"
    assert train_of(["--learning_rate", "1e-4"])["finetuning_type"] == "full", "no LoRA name: gym's default"
    # A rank below 1 is reported alone, not also as an alpha of 0 the user never gave.
    with pytest.raises(ValueError, match=r"lora\.r\b") as bad:
        parse(["--lora_rank", "0"])
    assert "alpha" not in str(bad.value)


def test_quantization_bit_means_qlora_and_refuses_full_weights():
    train = parse(["--finetuning_type", "lora", "--quantization_bit", "8"])["train"]
    assert train["finetuning_type"] == "qlora" and train["quant"]["bits"] == 8
    with pytest.raises(ConfigError, match=r"quantization_bit.*finetuning_type 'full'"):
        parse(["--finetuning_type", "full", "--quantization_bit", "4"])
    with pytest.raises(ConfigError, match="finetuning_type 'dora' is not it"):
        parse(["--finetuning_type", "dora", "--quantization_bit", "4"])


def test_gyms_own_flag_wins_and_the_command_line_wins_over_the_file():
    assert train_of(["--learning_rate", "1e-4", "--train.learning_rate", "2e-4"])["learning_rate"] == 2e-4
    assert train_of(["--train.learning_rate", "2e-4", "--learning_rate", "1e-4"])["learning_rate"] == 2e-4
    file = {"train": {"learning_rate": 3e-4, "max_steps": 7}, "cutoff_len": 64}
    config = parse(["--learning_rate", "1e-4"], file=file)
    assert config["train"]["learning_rate"] == 1e-4, "a name on the command line beats the file's field"
    assert config["train"]["max_steps"] == 7 and config["data"]["cutoff_len"] == 64
    assert parse(["--num_train_epochs", "2"], file={"max_steps": 9})["train"]["max_steps"] == -1


def test_flows_without_training_stages_do_not_take_the_names():
    parser = runner.build_parser(TfGrpoFlowConfig)
    with pytest.raises(SystemExit):
        parser.parse_args(["--learning_rate", "1e-4"])


def test_settings_gym_needs_no_value_for_are_accepted_with_a_note():
    parser = runner.build_parser(TrainFlowConfig)
    args = parser.parse_args(["--do_train", "--plot_loss", "true", "--resume_from_checkpoint", "none"])
    notes = lf.notes(args)
    assert len(notes) == 2 and notes[0].startswith("do_train:") and notes[1].startswith("plot_loss:")


@pytest.mark.parametrize(
    ("argv", "method"),
    [
        ("--stage sft", "sft"),
        ("--stage dpo", "dpo"),
        ("--stage dpo --pref_loss orpo", "orpo"),
        ("--stage dpo --pref_loss simpo", "simpo"),
        ("--stage dpo --pref_loss ipo", "ipo"),
        ("--pref_loss hinge", "hinge"),
        ("--stage kto", "kto"),
        ("--stage ppo", "ppo"),
        ("--stage pt", "pt"),
        ("--stage rm", "rm"),
        ("--stage dpo --method cdpo", "cdpo"),
        ("--method cdpo --pref_loss sigmoid", "cdpo"),
        ("", "sft"),
    ],
)
def test_stage_and_pref_loss_pick_the_method(argv, method):
    assert method_of(argv.split())[0] == method


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ("--stage rm --method dpo", "disagree"),
        ("--stage bogus", "'bogus' has no gym method; stages: pt, sft"),
        ("--stage sft --method dpo", "disagree"),
        ("--pref_loss kto_pair", "--method kto"),
        ("--method kto --pref_loss orpo", "picks method orpo, not kto"),
    ],
)
def test_stage_and_pref_loss_mistakes_say_what_to_do(argv, says):
    with pytest.raises(ConfigError, match=says):
        method_of(argv.split())


def test_boolean_flags_take_true_false_or_no(capsys):
    assert parse(["--train.bf16"])["train"]["bf16"] is True
    assert parse(["--train.bf16", "false"])["train"]["bf16"] is False
    assert parse(["--train.bf16=yes", "--no-train.bf16"])["train"]["bf16"] is False
    assert parse(["--bf16", "true"])["train"]["bf16"] is True
    with pytest.raises(SystemExit):
        parse(["--bf16", "maybe"])
    assert "--bf16: expected true or false (got 'maybe')" in capsys.readouterr().err


def test_config_file_keys_nest_or_dot_and_lists_and_nulls_work(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "model_name_or_path: gym-tiny\ntrain:\n  lora: {r: 4}\n  speed.packing: true\n"
        "train.freeze.extra_modules: [norm, lm_head]\nmethod_eval_dataset: null\nnum_train_epochs: 2\n"
    )
    config = parse([], file=read_config_file(path))
    assert config["model"] == "gym-tiny" and config["train"]["lora"]["r"] == 4
    assert config["train"]["speed"]["packing"] is True
    assert config["train"]["freeze"]["extra_modules"] == ["norm", "lm_head"]
    assert config["method_eval_dataset"] is None and config["train"]["num_train_epochs"] == 2


def test_yaml_lists_for_comma_separated_settings_read_as_llamafactory_reads_them(tmp_path):
    # LLaMA-Factory splits `dataset: a,b` (and lora_target, interleave_probs...) at commas and keeps a
    # YAML list as it is, so its files may write either; gym's own dataset settings take both too.
    path = tmp_path / "run.yaml"
    path.write_text(
        "dataset: [demo_sft, alpaca_en_demo]\ninterleave_probs: [0.7, 0.3]\nmix_strategy: interleave_under\n"
        "finetuning_type: lora\nlora_target: [q_proj, v_proj]\nmethod_eval_dataset: [a, b]\n"
    )
    config = parse([], file=read_config_file(path))
    assert config["dataset"] == "demo_sft,alpaca_en_demo"
    assert config["method_eval_dataset"] == "a,b"
    assert config["data"]["interleave_probs"] == [0.7, 0.3]
    assert config["train"]["lora"]["target_modules"] == ["q_proj", "v_proj"]
    path.write_text("dataset: [demo_sft, demo_sft]\ndpo_dataset: [demo_dpo]\n")
    paper = parse([], SftThenDpoConfig, file=read_config_file(path))
    assert (paper["sft_dataset"], paper["dpo_dataset"]) == ("demo_sft,demo_sft", "demo_dpo")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("lora_rnak: 8\n", "run.yaml: unknown setting 'lora_rnak'; did you mean lora_rank"),
        ("train:\n  learning_rat: 1\n", "setting 'train.learning_rat'; did you mean train.learning_rate"),
        ("lr: 1.0e-3\n", "run.yaml: unknown setting 'lr'; did you mean learning_rate?"),
        ("train:\n  epochs: 2\n", "unknown setting 'train.epochs'; did you mean train.num_train_epochs?"),
        ("learning_rate: abc\n", "run.yaml: argument --learning_rate: invalid float value: 'abc'"),
        ("- a\n- b\n", "run.yaml: expected a mapping of settings"),
        ("a: [\n", "run.yaml is not valid YAML or JSON"),
        ("default_system: [Be brief., Be kind.]\n", "run.yaml: default_system takes one value, not a list"),
        ("learning_rate: [1.0e-4]\n", "run.yaml: learning_rate takes one value, not a list ([0.0001])"),
        ("default_system: {be: brief}\n", "run.yaml: default_system takes one value, not a mapping"),
    ],
)
def test_config_file_mistakes_name_the_file_and_the_setting(tmp_path, text, says):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    parser = runner.build_parser(TrainFlowConfig)
    with pytest.raises(ConfigError) as caught:
        parser.parse_file(path, read_config_file(path))
    assert says in str(caught.value)


def test_bare_name_value_overrides_become_flags_only_for_known_names():
    known = {"--learning_rate", "--stage"}
    argv = ["learning_rate=1e-5", "--benchmarks", "mmlu=/data/mmlu", "seed=1", "--stage=dpo", "stage=sft"]
    assert dotlist(argv, known) == [
        "--learning_rate=1e-5",
        "--benchmarks",
        "mmlu=/data/mmlu",  # a value, not a name gym knows
        "seed=1",
        "--stage=dpo",
        "--stage=sft",
    ]


def test_gym_train_with_a_missing_or_broken_config_file_says_so_in_one_line(tmp_path, capsys):
    from flows.cli import main

    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err.strip() == f"error: config file {tmp_path / 'nope.yaml'} not found"
    bad = tmp_path / "bad.yml"
    bad.write_text("stage: bogus\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'bogus' has no gym method" in err[0]


LLAMAFACTORY_YAML = """\
### model
model_name_or_path: gym-tiny

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 4
lora_target: all

### dataset
dataset: lf_demo
dataset_dir: {data}
template: chatml
cutoff_len: 128
max_samples: 200
overwrite_cache: true
preprocessing_num_workers: 16
eval_dataset: none

### output
output_dir: {out}
logging_steps: 5
plot_loss: true
report_to: none

### train
per_device_train_batch_size: 8
gradient_accumulation_steps: 1
learning_rate: 3.0e-3
num_train_epochs: 1.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: false
resume_from_checkpoint: null
"""


@pytest.mark.slow
def test_a_llamafactory_training_yaml_trains_the_lora_it_describes(gym_home, tmp_path):
    """`gym train llama3_lora_sft.yaml`, as LLaMA-Factory's examples are run, on gym-tiny and demo data
    named in a dataset_info.json."""
    # The data as a LLaMA-Factory user has it: a dataset_info.json entry naming their columns
    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {"question": r["instruction"], "context": r["input"], "answer": r["output"]}
        for r in demo_records("demo_sft")
    ]
    (data / "lf_demo.json").write_text(json.dumps(rows[:300]))
    columns = {"prompt": "question", "query": "context", "response": "answer"}
    (data / "dataset_info.json").write_text(
        json.dumps({"lf_demo": {"file_name": "lf_demo.json", "columns": columns}})
    )
    path = tmp_path / "tiny_lora_sft.yaml"
    path.write_text(LLAMAFACTORY_YAML.format(out=tmp_path / "saves", data=data))
    gym = str(Path(sys.executable).parent / "gym")
    logs: list[str] = []
    # LLaMA-Factory's overrides after the file: `name=value`
    out = run_script([gym, "train", str(path), "lora_target=q_proj,v_proj", "--json"], gym_home, logs=logs)
    assert out["metric_name"] == "loss" and out["metric_last"] < out["metric_first"]
    stage = Path(out["model_dir"]).parent
    adapter = json.loads((stage / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8, "alpha = 2 x rank, as LLaMA-Factory sets it"
    assert set(adapter["target_modules"]) == {"q_proj", "v_proj"}
    assert (stage / "checkpoints" / "checkpoint-25").is_dir(), "200 records, batch 8, one epoch: 25 steps"
    assert (tmp_path / "saves" / "config.json").is_file(), "output_dir holds the model"
    assert "note: plot_loss: gym always plots the loss" in logs[0]
    assert out["exact_match_before"] is None, "eval_dataset: none, as the file says"


def test_a_config_file_in_the_papers_training_free_grpo_form_reaches_the_flow(tmp_path):
    """The paper's TF-GRPO flags as keys: finetuning_type grpo, training_free_grpo, grpo_group_size."""
    from flows.commands import train_plan

    path = tmp_path / "tf.yaml"
    path.write_text(
        "finetuning_type: grpo\ntraining_free_grpo: true\ngrpo_group_size: 3\nnum_train_epochs: 2\n"
    )
    plan = train_plan([str(path)])
    assert plan.flow == "flows.tf_grpo:tf_grpo" and plan.config_file is not None
    parser = runner.build_parser(plan.config_cls)
    under = parser.parse_file(*plan.config_file)
    config = runner.parse_config(plan.config_cls, parser.parse_args(plan.argv), under)
    assert isinstance(config, TfGrpoFlowConfig) and config.group_size == 3 and config.epochs == 2


def test_deepspeed_and_fp16_are_refused_saying_what_gym_does_instead():
    with pytest.raises(ConfigError, match="deepspeed: gym does not run DeepSpeed ZeRO yet") as error:
        parse(["--deepspeed", "examples/deepspeed/ds_z3_config.json"])
    assert "--train.distributed.num_processes" in str(error.value)
    with pytest.raises(ConfigError, match=r"fsdp: gym does not run FSDP \(sharded weights\) yet"):
        parse(["--fsdp", "full_shard auto_wrap"])  # was "unrecognized arguments"
    with pytest.raises(ConfigError, match="fp16: gym trains in bf16 mixed precision on a GPU with bfloat16"):
        parse(["--fp16", "true"])
    assert parse(["--fp16", "false", "--deepspeed", "null"])["train"]["bf16"] is None  # asks for nothing
    with pytest.raises(
        ConfigError, match=r"hf_hub_token: gym reads a hub token from \$HF_TOKEN only"
    ) as error:
        parse(["--hf_hub_token", "hf_secret_value"])
    assert "hf_secret_value" not in str(error.value)  # the token is never echoed
    assert "from the file" not in str(error.value)  # it was given on the command line


def test_a_lora_or_api_reward_model_is_refused_saying_what_to_do():
    assert parse(["--reward_model_type", "full"])["train"]["rl"]["rewards"] == ["exact_match"]
    for kind in ("lora", "api"):
        with pytest.raises(ConfigError, match=f"reward_model_type {kind}: .* merge a LoRA reward model"):
            parse(["--reward_model", "saves/rm", "--reward_model_type", kind])


@pytest.mark.parametrize(
    "argv",
    [
        ["--image_max_pixels", "262144"],
        ["--freeze_vision_tower"],
        ["--fp16"],
        ["--use_galore"],
        ["--ref_model", "saves/ref"],
        ["--quantization_method", "hqq"],
        ["--do_predict", "true"],
        ["--adapter_name_or_path", "saves/lora"],
        ["--ppo_score_norm", "true"],
        ["--disable_shuffling", "true"],
        ["--compute_accuracy", "true"],
        ["--model_revision", "v2.0"],
    ],
)
def test_settings_gym_lacks_and_bare_refused_flags_are_refused_saying_what_to_do(argv):
    with pytest.raises(ConfigError, match=rf"{argv[0][2:]}: gym[ ']"):
        parse(argv)
    assert parse(["--quantization_method", "bnb", "--use_galore", "false"])  # what gym does / asks nothing
    if argv[0] == "--freeze_vision_tower":
        assert parse(["--freeze_vision_tower", "false"])["train"]["finetuning_type"]  # asks for nothing


def test_more_trainer_settings_gym_needs_no_value_for_get_a_note(tmp_path):
    yaml = tmp_path / "run.yaml"
    settings = {
        "save_strategy": "steps",
        "logging_dir": "logs",
        "save_safetensors": "true",
        "use_fast_tokenizer": "true",
        "ddp_find_unused_parameters": "false",
        "include_num_input_tokens_seen": "true",
        "dataloader_pin_memory": "true",
        "tokenized_path": "saves/tokenized",
        "streaming": "true",
        "enable_thinking": "false",
        "tool_format": "qwen",
        "upcast_layernorm": "true",
        "create_new_adapter": "true",
        "print_param_status": "true",
        "ignore_pad_token_for_loss": "true",
    }
    yaml.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    parser = runner.build_parser(TrainFlowConfig)
    notes = lf.notes(parser.parse_file(yaml, read_config_file(yaml)))
    # `false` asks for nothing, so ddp_find_unused_parameters gets no note; the others do (enable_thinking's
    # default is true: false is a choice gym does not follow).
    assert sorted(n.split(":")[0] for n in notes) == [
        "create_new_adapter",
        "dataloader_pin_memory",
        "enable_thinking",
        "ignore_pad_token_for_loss",
        "include_num_input_tokens_seen",
        "logging_dir",
        "print_param_status",
        "save_safetensors",
        "save_strategy",
        "streaming",
        "tokenized_path",
        "tool_format",
        "upcast_layernorm",
        "use_fast_tokenizer",
    ]


@pytest.mark.parametrize(
    ("lines", "s2attn_on", "full"),
    [
        # LLaMA-Factory's LongLoRA recipe: S2-Attn and the embeddings and norms trained in full
        (["finetuning_type: lora", "shift_attn: true", "additional_target: embed_tokens,norm"], True, True),
        (["finetuning_type: lora", "shift_attn: true"], True, False),  # LoRA + S2-Attn only
        (["additional_target: embed_tokens,norm"], False, True),  # LoRA + modules_to_save only
    ],
)
def test_llamafactory_longlora_pieces_build_the_adapter_they_describe(tmp_path, lines, s2attn_on, full):
    from gym.models import load_model
    from gym.train import TrainConfig, adapters, s2attn
    from tests.helpers import tiny

    path = tmp_path / "lf.yaml"
    path.write_text("\n".join(lines) + "\n")
    stage = TrainConfig.model_validate(parse([], file=read_config_file(path))["train"])
    assert stage.finetuning_type == "longlora"
    ref = tiny()
    model = adapters.adapt(load_model(ref), stage, ref, Path("/nonexistent"))
    assert (model.config._attn_implementation == s2attn.NAME) is s2attn_on
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    beside = {n for n in trainable if "lora_" not in n}
    assert any("lora_A" in n for n in trainable)
    if full:
        assert any("embed_tokens" in n for n in beside) and any("layernorm" in n for n in beside)
    else:
        assert not beside, "the adapter alone trains"


def test_llamafactory_longlora_pieces_need_a_lora_adapter():
    default = TrainFlowConfig().train.finetuning_type
    assert parse(["--shift_attn", "false"])["train"]["finetuning_type"] == default, "asks for nothing"
    with pytest.raises(ConfigError, match=r"shift_attn goes with a LoRA adapter .* --finetuning_type lora"):
        parse(["--shift_attn", "--finetuning_type", "full"])


def test_a_llamafactory_yamls_eval_dataset_is_the_held_out_data_for_the_loss(tmp_path, capsys):
    """LLaMA-Factory's `eval_dataset` is held-out data for eval loss during training; it was read as gym's
    exact-match data, and eval_strategy/eval_steps were then ignored for want of held-out data."""
    from flows.commands import train_plan

    path = tmp_path / "lf.yaml"
    path.write_text("stage: sft\nfinetuning_type: lora\ndataset: demo_sft\neval_dataset: demo_sft_eval\n")
    plan = train_plan([str(path)])
    assert plan.config_file is not None
    settings = plan.config_file[1]
    assert settings["method_eval_dataset"] == "demo_sft_eval" and "eval_dataset" not in settings
    assert "note: eval_dataset is read as LLaMA-Factory reads it" in capsys.readouterr().err
    # gym's own files (no `stage`) and gym's own flag keep gym's meaning
    own = tmp_path / "own.yaml"
    own.write_text("dataset: demo_sft\neval_dataset: demo_sft_eval\n")
    own_plan = train_plan([str(own), "--method", "sft"])
    assert own_plan.config_file is not None and own_plan.config_file[1]["eval_dataset"] == "demo_sft_eval"


def test_settings_of_an_optimizer_gym_lacks_are_noted_as_unread_and_its_switch_refused():
    # LLaMA-Factory reads galore_rank only with use_galore; the name was "unknown", suggesting lora_rank
    parser = runner.build_parser(TrainFlowConfig)
    args = parser.parse_args(["--galore_rank", "16", "--badam_mode", "layer", "--apollo_scale", "32"])
    notes = lf.notes(args)
    assert {n.split(":")[0] for n in notes} == {"galore_rank", "badam_mode", "apollo_scale"}
    assert any(
        "galore_rank: read only with use_galore (the GaLore optimizer), which gym has not" in n for n in notes
    )
    with pytest.raises(ConfigError, match="use_badam: gym has no BAdam optimizer"):
        parse(["--use_badam", "true", "--badam_mode", "layer"])


def test_model_revision_main_asks_for_what_gym_loads():
    assert parse(["--model_revision", "main"])["train"]["finetuning_type"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("learning_rate: -1\n", "train.learning_rate: Input should be greater than 0"),
        ("hf_hub_token: hf_secret\n", "hf_hub_token: gym reads a hub token from $HF_TOKEN only"),
        ("finetuning_type: full\nquantization_bit: 4\n", "quantization_bit quantizes the frozen base"),
        ("template: default\n", "template: unknown chat template 'default'"),
        ("dataset: none.jsonl\n", "dataset: no such file or folder 'none.jsonl'"),
    ],
)
def test_a_mistake_in_a_config_file_names_the_file(tmp_path, gym_home, capsys, text, says):
    from flows.cli import main

    yaml = tmp_path / "run.yaml"
    yaml.write_text(f"model_name_or_path: gym-tiny\nstage: sft\n{text}")
    assert main(["train", str(yaml)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {yaml}: {says}"), err
    assert "hf_secret" not in "".join(err)


def test_a_mistake_on_the_command_line_is_not_blamed_on_the_config_file(tmp_path, gym_home, capsys):
    from flows.cli import main

    yaml = tmp_path / "run.yaml"
    yaml.write_text("learning_rate: -1\ndataset: demo_sft\n")
    # the command line's learning rate wins over the file's bad one; its dataset is the mistake
    assert main(["train", str(yaml), "--learning_rate", "1e-4", "--dataset", "none.jsonl"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: dataset: no such file or folder 'none.jsonl'"), err
    assert main(["train", str(yaml), "--learning_rate", "-2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: train.learning_rate: Input")
    # mistakes in both: each blamed where it was made (all of them were put on the file)
    assert main(["train", str(yaml), "--cutoff_len", "0"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        last.startswith("error: data.cutoff_len: Input should be")
        and f"; {yaml}: train.learning_rate" in last
    )
