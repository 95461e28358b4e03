"""LLaMA-Factory's evaluation YAML for `gym eval` (`llamafactory-cli eval x.yaml`), the eval part of
gym/cli_llamafactory_tools.py, whose `translate` reads the file and calls `note` and `flags` here.

    gym eval llama3_lora_eval.yaml        # task: mmlu_test, n_shot: 5, save_dir: ...

An eval YAML's `task` (`mmlu_test`) is the benchmark and the split: gym scores the split lm-eval
scores (`TASKS`), read from `task_dir/<benchmark>/` (LLaMA-Factory's layout: mapping.json and
<benchmark>.zip). `n_shot`, `batch_size` and `save_dir` are gym eval's --shots, --batch-size and
--output (save_dir/results.json); `template: fewshot` is gym's plain prompt, a chat template its
chat style.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gym.cli_llamafactory_tools import MODEL, Parse, choice, has, merge_adapter, weights
from gym.errors import ConfigError

EVAL: dict[str, Parse] = {  # gym eval (hparams/evaluation_args.py); with MODEL, all its eval YAML holds
    "task": str,  # --benchmark, the split checked: mmlu_test, ceval_validation, cmmlu_test (TASKS)
    "task_dir": str,  # --data-dir TASK_DIR/<benchmark> (its mapping.json and <benchmark>.zip)
    "n_shot": int,  # --shots
    "batch_size": int,  # --batch-size
    "save_dir": str,  # --output SAVE_DIR/results.json
    "lang": choice("en", "zh"),
    "seed": int,
    "download_mode": choice("reuse_dataset_if_exists", "reuse_cache_if_exists", "force_redownload"),
}

# LLaMA-Factory's task is `<benchmark>_<split>` (split: its dataset scripts' train = dev, validation =
# val, test); gym scores each benchmark's one split with answers that lm-eval scores.
TASKS = {"mmlu": "test", "ceval": "validation", "cmmlu": "test"}
LANGS = {"mmlu": "en", "ceval": "zh", "cmmlu": "zh"}  # the language of gym's (lm-eval's) prompt
PLAIN_TEMPLATE = "fewshot"  # LLaMA-Factory's template for plain-text few-shot prompts
NAMES: dict[str, Parse] = {**MODEL, **EVAL}  # all an eval YAML holds (LLaMA-Factory's eval reads no others)


def eval_task(task: str) -> str:
    """The benchmark of LLaMA-Factory's eval `task` (`mmlu_test`: mmlu), if gym scores that split;
    ConfigError (with the task to use instead) if not."""
    benchmark, _, split = task.partition("_")
    if benchmark not in TASKS:
        raise ConfigError(
            f"gym eval scores mmlu, ceval and cmmlu itself ({tasks()}); another benchmark runs through "
            f"lm-eval: remove task and run `gym eval --model M --lm-eval-task NAME` (got {task!r})"
        )
    if split == TASKS[benchmark]:
        return benchmark
    if benchmark == "ceval" and split == "test":
        why = "C-Eval's test split has no public answers"
    elif split == "train":
        why = "the train split holds the few-shot examples (the dev files)"
    else:
        why = f"gym eval scores {benchmark}'s {TASKS[benchmark]} split, the one lm-eval scores"
    raise ConfigError(f"{why}: use task {benchmark}_{TASKS[benchmark]} (got {task!r})")


def tasks() -> str:
    return ", ".join(f"{b}_{s}" for b, s in TASKS.items())


def note(name: str, value: Any, benchmark: str | None) -> str | None:
    if name == "task":
        return None  # checked: gym scores that split
    if name == "save_dir":
        return (
            "gym eval writes its whole result (overall, categories, subjects, every prediction) to "
            "save_dir/results.json and prints the scores; LLaMA-Factory's results.json held the "
            "predictions and its results.log the scores"
        )
    if name == "lang":
        if benchmark is not None and LANGS[benchmark] == value:
            return None
        return (
            "gym eval writes each benchmark's prompt in its own language, as lm-eval does (mmlu English, "
            f"ceval and cmmlu Chinese); lang {value} isn't read"
        )
    if value == PLAIN_TEMPLATE:
        return (
            "LLaMA-Factory's plain few-shot prompt: gym eval's default prompt style, lm-eval's text "
            "(`--style lm-eval`)"
        )
    return (
        f"few-shot examples as user/assistant turns through the {value} chat template, as LLaMA-Factory "
        f"does: gym eval --style chat --template {value} (`template: {PLAIN_TEMPLATE}` gives lm-eval's plain "
        "prompt)"
    )


def flags(command: str, values: dict[str, Any], own: Sequence[str], where: str, out: Any) -> list[str]:
    argv: list[str] = []
    template = values.get("template")
    chat_template = None if template == PLAIN_TEMPLATE else template
    trust = bool(values.get("trust_remote_code"))
    if not has(own, "--model"):
        model, adapter = values.get("model_name_or_path"), values.get("adapter_name_or_path")
        if adapter is None and model is None:
            raise ConfigError(f"{where}model_name_or_path is missing: the model to evaluate")
        if adapter is not None:
            base, merge_template = (
                weights(model, chat_template) if model is not None else (None, chat_template)
            )
            argv += ["--model", str(merge_adapter(adapter, base, merge_template, trust, command, out))]
        else:
            argv += ["--model", str(model)]
    if chat_template is not None:
        argv += ["--template", chat_template]
        if not has(own, "--style"):
            argv += ["--style", "chat"]
    if trust:
        argv += ["--trust-remote-code"]
    lm_eval = has(own, "--lm-eval-task")
    benchmark = eval_task(str(values["task"])) if "task" in values else None
    given = _value(own, "--benchmark")
    if benchmark is not None and given is not None:
        if given.partition("=")[0] != benchmark:
            raise ConfigError(
                f"{where}task {values['task']} and --benchmark {given} name two benchmarks: give one"
            )
        if "=" in given:
            benchmark = None  # --benchmark NAME=DATA names its data: task_dir is not read
    if benchmark is not None and not lm_eval and given is None:
        argv += ["--benchmark", benchmark]
    elif benchmark is None and not lm_eval and not has(own, "--benchmark"):
        raise ConfigError(f"{where}task is missing: the benchmark and split to score ({tasks()})")
    if benchmark is not None and not lm_eval and not has(own, "--data-dir"):
        task_dir = values.get("task_dir")
        folder = Path(task_dir or "evaluation").expanduser() / benchmark
        if folder.exists():
            argv += ["--data-dir", str(folder)]
        elif task_dir is not None:
            raise ConfigError(
                f"{where}task_dir: no {folder} (LLaMA-Factory's layout: {task_dir}/{benchmark}/ holding "
                f"mapping.json and {benchmark}.zip); or give gym's --data-dir: a folder, a .zip or a hub id"
            )
        else:
            from gym.eval.benchmarks import get_spec

            print(
                f"note: task_dir: no {folder} (LLaMA-Factory's default task_dir): gym eval reads "
                f"{benchmark} from the hub ({get_spec(benchmark).hub_id})",
                file=out or sys.stderr,
            )
    if "n_shot" in values:
        if not 0 <= values["n_shot"] <= 5:
            raise ConfigError(
                f"{where}n_shot: give 0 to 5 (the few-shot examples come from each subject's dev split, "
                f"which holds 5; got {values['n_shot']})"
            )
        argv += ["--shots", str(values["n_shot"])]
    if "batch_size" in values:
        if values["batch_size"] < 1:
            raise ConfigError(f"{where}batch_size: give at least 1 (got {values['batch_size']})")
        argv += ["--batch-size", str(values["batch_size"])]
    if "save_dir" in values and not has(own, "--output"):
        save_dir = Path(values["save_dir"]).expanduser()
        if save_dir.exists() and (not save_dir.is_dir() or any(save_dir.iterdir())):
            raise ConfigError(
                f"{where}save_dir: {save_dir} already exists: give another one, or delete it (LLaMA-Factory "
                "refuses it too, so that no earlier result is overwritten)"
            )
        argv += ["--output", str(save_dir / "results.json")]
    return argv


def _value(flags: Sequence[str], option: str) -> str | None:
    """The value given to `option` in `flags` (`--x V` or `--x=V`; the last one), else None."""
    found = None
    for i, flag in enumerate(flags):
        if flag == option and i + 1 < len(flags):
            found = flags[i + 1]
        elif flag.startswith(f"{option}="):
            found = flag.partition("=")[2]
    return found
