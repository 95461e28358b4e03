"""LLaMA-Factory's evaluation YAML (`llamafactory-cli eval x.yaml`) as `gym eval x.yaml`: its keys read
into gym eval's flags (task as benchmark and split, task_dir's layout, an adapter merged as for gym
chat), the settings gym can't honour refused with what to do, and real runs on a fixture MMLU in
LLaMA-Factory's task_dir layout and on the real MMLU (skipped when it is absent)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from flows.cli import main
from gym.cli_llamafactory_tools import translate
from gym.eval.cli import build_parser
from tests.conftest import REPO
from tests.eval_fixtures import write_benchmark
from tests.test_cli_llamafactory_tools import logits, lora_adapter, write_yaml

REAL_MMLU = REPO.parent / "shared" / "data" / "eval" / "mmlu"

# LLaMA-Factory's examples/train_lora/llama3_lora_eval.yaml, on gym-tiny.
LF_EVAL = """### model
model_name_or_path: gym-tiny
adapter_name_or_path: {adapter}
trust_remote_code: true

### method
finetuning_type: lora

### dataset
task: {task}  # choices: [mmlu_test, ceval_validation, cmmlu_test]
task_dir: {task_dir}
template: fewshot
lang: en
n_shot: 5

### output
save_dir: {save_dir}

### eval
batch_size: 4
"""


def parse(argv: list[str], notes: io.StringIO | None = None):
    parser = build_parser()
    return parser.parse_args(translate("eval", argv, parser, out=notes or io.StringIO()))


def task_dir(root: Path, *benchmarks: str) -> Path:
    """LLaMA-Factory's `evaluation/` layout: <benchmark>/ holding mapping.json and <benchmark>.zip."""
    for benchmark in benchmarks:
        write_benchmark(benchmark, root / benchmark, as_zip=True)
    return root


def test_an_eval_yaml_gives_gym_eval_flags_with_the_adapter_merged(tmp_path):
    folder, adapted, _ = lora_adapter(tmp_path / "saves" / "lora" / "sft")
    data = task_dir(tmp_path / "evaluation", "mmlu")
    yaml = write_yaml(
        tmp_path / "eval.yaml",
        LF_EVAL.format(adapter=folder, task="mmlu_test", task_dir=data, save_dir=tmp_path / "saves" / "eval"),
    )
    notes = io.StringIO()
    args = parse([yaml], notes)
    assert (args.benchmark, args.data_dir, args.shots, args.batch_size) == ("mmlu", str(data / "mmlu"), 5, 4)
    assert args.output == str(tmp_path / "saves" / "eval" / "results.json")
    assert args.style == "lm-eval" and args.template is None and args.trust_remote_code  # template: fewshot
    merged = Path(args.model)
    assert merged.name.startswith("merged-adapter-")
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(merged)), adapted, atol=1e-5)
    text = notes.getvalue()
    assert "note: adapter_name_or_path: gym eval loads full weights: merging" in text
    assert "note: template: LLaMA-Factory's plain few-shot prompt: gym eval's default" in text
    assert "note: save_dir: gym eval writes its whole result" in text
    assert "note: lang" not in text  # en is MMLU's language: nothing to say

    # The merge is reused; flags after the file win over it, LLaMA-Factory's names as flags too.
    notes = io.StringIO()
    args = parse([yaml, "--n_shot", "2", "--batch-size", "8", "--output", str(tmp_path / "r.json")], notes)
    assert (args.model, args.shots, args.batch_size, args.output) == (
        str(merged),
        2,
        8,
        str(tmp_path / "r.json"),
    )
    assert "using its merge for gym eval" in notes.getvalue()


@pytest.mark.parametrize(
    ("task", "benchmark", "lang_note"),
    [("mmlu_test", "mmlu", True), ("ceval_validation", "ceval", False), ("cmmlu_test", "cmmlu", False)],
)
def test_task_is_the_benchmark_and_task_dir_holds_its_folder(task, benchmark, lang_note, tmp_path):
    data = task_dir(tmp_path / "evaluation", benchmark)
    yaml = write_yaml(
        tmp_path / "eval.yaml",
        f"model_name_or_path: gym-tiny\ntask: {task}\ntask_dir: {data}\nlang: zh\nseed: 42\n"
        "template: llama3\ndownload_mode: reuse_dataset_if_exists\n",
    )
    notes = io.StringIO()
    args = parse([yaml], notes)
    assert (args.model, args.benchmark, args.data_dir) == ("gym-tiny", benchmark, str(data / benchmark))
    assert args.shots is None and args.batch_size == 16 and args.output is None  # gym's defaults
    # A chat template: few-shot examples as chat turns, LLaMA-Factory's way (gym's chat style).
    assert (args.template, args.style) == ("llama3", "chat")
    text = notes.getvalue()
    assert "note: template: few-shot examples as user/assistant turns through the llama3" in text
    assert "note: seed: gym eval takes each subject's first n_shot dev examples" in text
    assert ("note: lang: gym eval writes each benchmark's prompt in its own language" in text) is lang_note
    assert "download_mode" not in text  # LLaMA-Factory's default
    assert parse([yaml, "--style", "lm-eval"]).style == "lm-eval"  # gym's own flag wins


def test_gyms_own_template_flag_keeps_gyms_prompt_style():
    """`--template` is also a LLaMA-Factory name (which picks the chat style): alone among gym's own
    flags it is gym's, a chat template for the model and nothing more."""
    notes = io.StringIO()
    args = parse(["--model", "gym-tiny", "--template", "chatml", "--benchmark", "mmlu"], notes)
    assert (args.template, args.style) == ("chatml", "lm-eval") and notes.getvalue() == ""
    assert parse(["--model", "gym-tiny", "--template=chatml", "--benchmark", "mmlu"]).style == "lm-eval"
    # With LLaMA-Factory's own names beside it, it is LLaMA-Factory's template, as in its YAML.
    lf = ["--model_name_or_path", "gym-tiny", "--template", "llama3", "--task", "mmlu_test"]
    assert (parse(lf).template, parse(lf).style) == ("llama3", "chat")


def test_without_task_dir_llamafactory_default_folder_else_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yaml = write_yaml(tmp_path / "eval.yaml", "model_name_or_path: gym-tiny\ntask: cmmlu_test\n")
    notes = io.StringIO()
    assert parse([yaml], notes).data_dir is None  # gym eval reads the hub's copy
    assert "note: task_dir: no evaluation/cmmlu (LLaMA-Factory's default task_dir)" in notes.getvalue()
    assert "haonan-li/cmmlu" in notes.getvalue()
    task_dir(tmp_path / "evaluation", "cmmlu")
    assert parse([yaml]).data_dir == "evaluation/cmmlu"
    assert parse([yaml, "--data-dir", "elsewhere"]).data_dir == "elsewhere"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "task: mmlu_tset",
            "task: gym eval scores mmlu's test split, the one lm-eval scores: use task mmlu_test",
        ),
        ("task: mmlu_validation", "use task mmlu_test (got 'mmlu_validation')"),
        ("task: ceval_test", "task: C-Eval's test split has no public answers: use task ceval_validation"),
        (
            "task: cmmlu_train",
            "the train split holds the few-shot examples (the dev files): use task cmmlu_test",
        ),
        ("task: bbh_test", "another benchmark runs through lm-eval: remove task and run `gym eval --model M"),
        ("task: mmlu_test\ntaks_dir: evaluation", "unknown setting 'taks_dir'; did you mean task_dir"),
        ("task: mmlu_test\ntemperature: 0.5", "unknown setting 'temperature'"),  # not an eval setting
        ("task: mmlu_test\nquantization_bit: 4", "quantization_bit: gym eval loads full-precision weights"),
        ("task: mmlu_test\nlang: fr", "argument --lang: expected one of en, zh (got 'fr')"),
        (
            "task: mmlu_test\ntask_dir: {tmp}/nowhere",
            "task_dir: no {tmp}/nowhere/mmlu (LLaMA-Factory's layout",
        ),
        ("n_shot: 5", "task is missing: the benchmark and split to score (mmlu_test, ceval_validation"),
        # were gym's flag names (`--shots: Input should be ...`), without the file
        ("task: mmlu_test\nn_shot: 9", "n_shot: give 0 to 5 (the few-shot examples come from each subject's"),
        ("task: mmlu_test\nbatch_size: 0", "batch_size: give at least 1 (got 0)"),
        # LLaMA-Factory refuses an existing save_dir: an earlier run's results.json was replaced
        ("task: mmlu_test\nsave_dir: {tmp}/done", "save_dir: {tmp}/done already exists: give another one"),
    ],
)
def test_settings_gym_eval_cannot_honour_fail_with_what_to_do(text, message, tmp_path, capsys):
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "results.json").write_text("{}")
    yaml = write_yaml(tmp_path / "eval.yaml", f"model_name_or_path: gym-tiny\n{text.format(tmp=tmp_path)}\n")
    assert main(["eval", yaml]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"error: {yaml}: ") and message.format(tmp=tmp_path) in lines[-1], lines
    assert (tmp_path / "done" / "results.json").read_text() == "{}"


def test_task_and_benchmark_naming_two_benchmarks_is_refused_and_one_with_its_data_skips_task_dir(
    tmp_path, capsys
):
    """`task: mmlu_test` with `--benchmark cmmlu=D` ran CMMLU silently from the command line, and from a
    file blamed a --data-dir the user never typed; the same benchmark with its data now reads that data."""
    yaml = write_yaml(tmp_path / "eval.yaml", "model_name_or_path: gym-tiny\ntask: mmlu_test\n")
    cmmlu = write_benchmark("cmmlu", tmp_path / "cmmlu")
    assert main(["eval", yaml, "--benchmark", f"cmmlu={cmmlu}"]) == 2
    assert "task mmlu_test and --benchmark cmmlu=" in capsys.readouterr().err
    mmlu = write_benchmark("mmlu", tmp_path / "mine")
    args = build_parser().parse_args(translate("eval", [yaml, "--benchmark", f"mmlu={mmlu}"], build_parser()))
    assert args.benchmark == f"mmlu={mmlu}" and args.data_dir is None


def _run(yaml: str, capsys, *extra: str) -> dict:
    assert main(["eval", yaml, "--no-progress", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_gym_eval_scores_an_eval_yaml_on_task_dir_files(tmp_path, capsys):
    data = task_dir(tmp_path / "evaluation", "mmlu")
    save_dir = tmp_path / "saves" / "eval"
    yaml = write_yaml(
        tmp_path / "eval.yaml",
        LF_EVAL.format(adapter="x", task="mmlu_test", task_dir=data, save_dir=save_dir).replace(
            "adapter_name_or_path: x\n", ""
        ),
    )
    summary = _run(yaml, capsys, "--n_shot", "2")
    assert summary["benchmark"] == "mmlu" and summary["shots"] == 2 and summary["n_questions"] == 12
    assert 0.0 <= summary["overall"] <= 1.0 and summary["categories"]  # per-category accuracy, as LF's
    full = json.loads((save_dir / "results.json").read_text())
    assert full["overall"] == summary["overall"] and full["categories"] == summary["categories"]
    assert [len(p) for p in full["predictions"].values()] == [6, 6]


def test_a_merged_adapters_score_names_the_adapter_and_its_base(tmp_path, capsys):
    """The result's `model` was the workspace folder the adapter was merged into (merged-adapter-...),
    naming neither what was asked for nor its base."""
    folder, _, _ = lora_adapter(tmp_path / "saves" / "lora" / "sft")
    data = task_dir(tmp_path / "evaluation", "mmlu")
    save_dir = tmp_path / "saves" / "eval"
    yaml = write_yaml(
        tmp_path / "eval.yaml",
        LF_EVAL.format(adapter=folder, task="mmlu_test", task_dir=data, save_dir=save_dir),
    )
    summary = _run(yaml, capsys, "--limit", "1", "--n_shot", "0")
    assert summary["model"] == f"{folder.resolve()} on gym-tiny"
    assert json.loads((save_dir / "results.json").read_text())["model"] == summary["model"]


@pytest.mark.skipif(not REAL_MMLU.is_dir(), reason="the real MMLU is not on this machine")
def test_gym_eval_scores_an_eval_yaml_on_the_real_mmlu(tmp_path, capsys):
    save_dir = tmp_path / "saves" / "eval"
    yaml = write_yaml(
        tmp_path / "eval.yaml",
        LF_EVAL.format(adapter="x", task="mmlu_test", task_dir=REAL_MMLU.parent, save_dir=save_dir).replace(
            "adapter_name_or_path: x\n", ""
        ),
    )
    summary = _run(yaml, capsys, "--limit", "2", "--subjects", "abstract_algebra", "anatomy")
    assert summary["n_questions"] == 4 and set(summary["subjects"]) == {"abstract_algebra", "anatomy"}
    assert set(summary["categories"]) == {"STEM", "Other"}  # per-category accuracy, as LF reports
    assert json.loads((save_dir / "results.json").read_text())["n_questions"] == 4
