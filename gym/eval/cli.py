"""`gym eval`: score a model on MMLU / C-Eval / CMMLU, or on any lm-eval task, from the command line.

    gym eval --model gym-tiny --benchmark mmlu --data-dir ../shared/data/eval/mmlu --limit 20 --json
    gym eval --model models:/gym-tiny-sft@champion --benchmark ceval --data-dir ./ceval --shots 0
    gym eval --model ./my-model --template chatml --lm-eval-task arc_easy --limit 100
    gym eval --model gym-tiny --benchmark mmlu --data-dir D --engine lm-eval   # lm-eval on D
    gym eval --model gym-tiny --benchmark mmlu=D       # the flows' form: the same as --data-dir D
    gym eval llama3_lora_eval.yaml      # LLaMA-Factory's eval YAML (gym/cli_llamafactory_tools.py)

`--model` is a registry name, a model folder or an MLflow model version (`models:/name@alias`).
Library only (no Prefect, no MLflow run); `python flows/evaluate.py` is the tracked pipeline
stage. Prints a table, and with `--json` ends with one JSON line: benchmark, overall, categories,
subjects, n_questions, seconds.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError

from gym.cli_options import ArgumentParser, flag_error
from gym.errors import ConfigError
from gym.eval.benchmarks import BENCHMARKS
from gym.eval.mc_score import resolve_device
from gym.eval.results import EvalResult
from gym.models import ModelRef


def build_parser() -> argparse.ArgumentParser:
    from gym.cli_llamafactory_tools import epilog

    parser = ArgumentParser(prog="gym eval", description=__doc__.split("\n\n")[0], epilog=epilog("eval"))
    parser.add_argument("--model", required=True, help="Registry name, model folder or models:/name@alias.")
    parser.add_argument("--template", help="Chat template for a model gym can't find one for.")
    parser.add_argument("--trust-remote-code", action="store_true", help="Let the model repo run its code.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--benchmark",
        type=_benchmark,
        metavar="{" + ",".join(BENCHMARKS) + "}[=DATA]",
        help="gym's own multiple-choice evaluator; NAME=DATA (as in a flow's benchmarks) sets --data-dir.",
    )
    what.add_argument("--lm-eval-task", nargs="+", metavar="TASK", help="lm-eval task/group names.")
    parser.add_argument("--data-dir", help="Benchmark files: folder, .zip or hub dataset id (default: hub).")
    parser.add_argument("--subjects", nargs="+", help="Only these subjects.")
    parser.add_argument("--mapping", help="mapping.json with subject names and categories.")
    parser.add_argument("--shots", type=int, help="Few-shot examples (gym: default 5; lm-eval: the task's).")
    parser.add_argument("--limit", type=int, help="Questions per subject (per task for lm-eval).")
    parser.add_argument("--batch-size", type=int, default=16, help="Questions per forward pass.")
    parser.add_argument("--style", choices=["lm-eval", "chat"], default="lm-eval", help="Prompt style.")
    parser.add_argument(
        "--engine",
        choices=["gym", "lm-eval"],
        help="Who scores --benchmark (default: gym; lm-eval tasks: lm-eval).",
    )
    parser.add_argument("--include-path", help="Folder of your own lm-eval task YAMLs.")
    parser.add_argument("--max-length", type=int, help="Context window in tokens (default: the model's).")
    parser.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if present).")
    parser.add_argument(
        "--output", help="Also write the full result (with every prediction) to this JSON file."
    )
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    parser.add_argument("--json", action="store_true", help="End with one line of JSON.")
    return parser


def cmd_eval(argv: Sequence[str]) -> int:
    from gym.cli_llamafactory_tools import translate

    parser = build_parser()
    args = parser.parse_args(translate("eval", argv, parser))
    _split_benchmark(parser, args)
    _check_flags(args)
    try:
        run = _prepare(args)  # settings, data and task names checked before the model is resolved
    except ValidationError as exc:
        raise flag_error(exc) from None
    result = run(_resolve_model(args))
    if args.output:  # before the table: a reader that leaves early (`| head`) doesn't lose the file
        from gym.workspace import atomic_write_text

        atomic_write_text(Path(args.output).expanduser(), result.model_dump_json(indent=1))
    print(table(result))
    if args.json:
        print(json.dumps(result.summary(), ensure_ascii=False, sort_keys=True))
    return 0


def _resolve_model(args: argparse.Namespace) -> ModelRef:
    """The model to score. A folder or registered version that names no gym template is scored as
    lm-eval scores it: plain prompts (--style lm-eval) need no chat template, and --style chat renders
    with its tokenizer's own (as gym serve does); --template picks gym's instead."""
    from gym.models import resolve
    from gym.serve.loading import own_template_ref, tokenizer_template

    ref = own_template_ref(args.model, args.template)
    if ref is None:
        return _merged_as_asked(resolve(args.model, args.template, args.trust_remote_code))
    if args.style == "chat":
        # none: the error says to pass --template
        tokenizer_template(Path(ref.path), args.model, trust_remote_code=args.trust_remote_code)
    return _merged_as_asked(ref.model_copy(update={"trust_remote_code": args.trust_remote_code}))


def _merged_as_asked(ref: ModelRef) -> ModelRef:
    """A merge gym made of --adapter_name_or_path into --model_name_or_path is named as the user asked
    for it (`ADAPTER on BASE`) in the result, not as the workspace folder it was merged into."""
    import json

    from gym.cli_llamafactory_tools import MERGE_SOURCE

    source = Path(ref.path) / MERGE_SOURCE
    if not source.is_file():
        return ref
    from gym.export import portable_base

    merged = json.loads(source.read_text(encoding="utf-8"))
    base = merged.get("base")
    base = (portable_base(base) or base) if base else "its base"  # gym-tiny, not the folder gym built it in
    return ref.model_copy(update={"name": f"{merged['adapter']} on {base}"})


def _benchmark(text: str) -> str:
    if text.partition("=")[0] not in BENCHMARKS:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {', '.join(BENCHMARKS)}, optionally as NAME=DATA)"
        )
    return text


def _split_benchmark(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--benchmark mmlu=DIR` (a flow's `benchmarks` entry) is `--benchmark mmlu --data-dir DIR`."""
    if not args.benchmark or "=" not in args.benchmark:
        return
    args.benchmark, _, data = args.benchmark.partition("=")
    if not data:
        parser.error(f"--benchmark {args.benchmark}=: name the data after '=' (a folder, .zip or hub id)")
    if args.data_dir is not None and args.data_dir != data:
        parser.error(
            f"--benchmark {args.benchmark}={data} and --data-dir {args.data_dir} name two data sources: "
            "give one"
        )
    args.data_dir = data


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that do nothing for what was asked, and an --output that can't be written: refused before
    anything runs (they were ignored, or failed after the whole evaluation)."""
    if args.lm_eval_task:
        named = (("--subjects", args.subjects), ("--data-dir", args.data_dir), ("--mapping", args.mapping))
        if given := [flag for flag, value in named if value]:
            raise ConfigError(
                f"{' and '.join(given)} choose gym's benchmark data (--benchmark), not lm-eval tasks: an "
                "lm-eval task reads its own (your own YAMLs go in --include-path)"
            )
        if args.engine == "gym":
            raise ConfigError("--lm-eval-task runs lm-eval: --engine gym scores --benchmark only")
    elif args.include_path:
        raise ConfigError(
            "--include-path indexes your lm-eval task YAMLs for --lm-eval-task; --benchmark reads --data-dir"
        )
    if args.output:
        out = Path(args.output).expanduser()
        above = next((p for p in out.parents if p.exists()), None)
        if out.is_dir() or (above is not None and not above.is_dir()):
            raise ConfigError(
                f"--output {args.output}: name a JSON file to write (a folder or a path below a file)"
            )
        _check_writable(args.output, out, above)


def _check_writable(given: str, out: Path, above: Path | None) -> None:
    """A file can be written at `out` (`above`: its nearest existing folder): tried now, with a file
    made and removed there, rather than found out after the whole evaluation."""
    import os
    import tempfile

    if out.exists() and not out.is_file():  # a device or a pipe (/dev/stdout): written through
        if not os.access(out, os.W_OK):
            raise ConfigError(f"--output {given}: not writable")
        return
    try:
        with tempfile.NamedTemporaryFile(dir=above or Path.cwd(), prefix=".gym-eval-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"--output {given}: can't write in {above} ({exc.strerror or exc}): name a file in a folder you "
            "can write to"
        ) from None


def _prepare(args: argparse.Namespace) -> Callable[[ModelRef], EvalResult]:
    if args.lm_eval_task:
        from gym.eval.lm_eval_bridge import LmEvalSettings, run_lm_eval, task_manager

        settings = LmEvalSettings(
            tasks=args.lm_eval_task,
            shots=args.shots,
            limit=args.limit,
            batch_size=args.batch_size,
            include_path=args.include_path,
            chat=args.style == "chat",
            max_length=args.max_length,
            device=args.device,
            progress=not args.no_progress,
        )
        manager = task_manager(settings)
        resolve_device(settings.device)
        return lambda model: run_lm_eval(model, settings, manager=manager)
    from gym.eval.mc_data import load_benchmark
    from gym.eval.multiple_choice import MCSettings, evaluate_benchmark

    mc = MCSettings(
        benchmark=args.benchmark,
        data_dir=args.data_dir,
        subjects=args.subjects,
        shots=5 if args.shots is None else args.shots,
        limit=args.limit,
        batch_size=args.batch_size,
        style=args.style,
        max_length=args.max_length,
        mapping=args.mapping,
        device=args.device,
        progress=not args.no_progress,
    )
    load_benchmark(mc.benchmark, mc.data_dir, subjects=mc.subjects, shots=mc.shots, mapping=mc.mapping)
    resolve_device(mc.device)
    if args.engine == "lm-eval":
        from gym.eval.lm_eval_tasks import run_on_local_files

        return lambda model: run_on_local_files(model, mc)
    return lambda model: evaluate_benchmark(model, mc)


def table(result: EvalResult) -> str:
    lines = [
        f"{result.benchmark} ({result.engine}, {result.model}): {result.metric} {result.overall:.4f} "
        f"over {result.n_questions} questions in {result.seconds:.1f}s"
    ]
    for name, value in result.categories.items():
        lines.append(f"  {name:36s} {value:.4f}")
    lines.append("")
    for subject, score in result.subjects.items():
        lines.append(f"  {subject:44s} {result.sizes.get(subject, 0):>5d}  {score:.4f}")
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)
