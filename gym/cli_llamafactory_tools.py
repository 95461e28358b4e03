"""LLaMA-Factory's export, inference and evaluation YAML files, and their names as flags, for gym export,
chat, serve and eval.

    gym export merge.yaml              # llamafactory-cli export merge.yaml
    gym chat inference.yaml            # llamafactory-cli chat inference.yaml
    gym chat --ui inference.yaml       # llamafactory-cli webchat inference.yaml
    gym serve inference.yaml           # llamafactory-cli api inference.yaml
    gym eval eval.yaml                 # llamafactory-cli eval eval.yaml
    gym export --model_name_or_path gym-tiny --adapter_name_or_path saves/x --export_dir out

`translate` turns a command line (a config file anywhere before `--`, LLaMA-Factory's names as
flags or `name=value`, gym's own flags) into the command's own flags: the file's settings first,
then the command line's, so flags win over the file and gym's own flag for a setting wins over
LLaMA-Factory's name for it. A file may hold gym's own settings too (`port: 0`, `shard-size: 2GB`).

`adapter_name_or_path` is the model gym loads with `model_name_or_path` as its base: `gym export`
merges it (as LLaMA-Factory does); `gym chat`, `gym serve` and `gym eval` load full weights, so the
adapter is merged once, exactly as `gym export` merges it, into a folder of the workspace that is
reused while the adapter and base are unchanged. The eval YAML's own settings (`task`, `n_shot`,
...) are gym/cli_llamafactory_eval.py's.

Settings gym needs no value for are accepted with a `note:` saying why (`NOT_NEEDED`); settings
gym cannot honour fail with what to do instead (`REFUSED`); an unknown key fails naming the file,
the key and the closest names.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from gym.cli_llamafactory import ASKS_NOTHING
from gym.cli_llamafactory import REFUSED as TRAIN_REFUSED
from gym.cli_options import (
    CONFIG_SUFFIXES,
    SEP,
    ArgumentParser,
    Switch,
    dotlist,
    file_argv,
    read_config_file,
)
from gym.errors import ConfigError
from gym.serve.settings import Limits

DEST = "llamafactory_tools"  # argparse dests are f"{DEST}.{name}"
COMMANDS = ("export", "chat", "serve", "eval")
BACKENDS = {"huggingface": "transformers", "vllm": "vllm", "sglang": "sglang"}  # infer_backend -> --backend


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(allowed)} (got {text!r})")
        return text

    return parse


def _gigabytes(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a shard size in GB must be positive (got {text})")
    return value


Parse = Callable[[str], Any] | type[bool]

# LLaMA-Factory's names (hparams/model_args.py, data_args.py, generating_args.py) -> value parser;
# bool: a true/false flag. Which command reads which name, and how: `translate`.
MODEL: dict[str, Parse] = {  # every command
    "model_name_or_path": str,  # the model; with an adapter, its base
    "adapter_name_or_path": str,  # the adapter, merged into model_name_or_path
    "template": str,  # --template (LLaMA-Factory's `qwen`, `qwen3_nothink` too)
    "trust_remote_code": bool,  # --trust-remote-code
    "finetuning_type": str,
    "infer_dtype": choice("auto", "float16", "bfloat16", "float32"),
    "flash_attn": str,
    "quantization_bit": int,
    "hf_hub_token": str,
    "cache_dir": str,
    "model_revision": str,
}
EXPORT: dict[str, Parse] = {  # gym export
    "export_dir": str,  # --out
    "export_size": _gigabytes,  # --shard-size NGB (a fraction of a GB too: 0.5 -> 500MB)
    "export_device": choice("cpu", "auto"),
    "export_legacy_format": bool,
    "export_hub_model_id": str,
    "export_quantization_bit": int,
    "export_quantization_dataset": str,
    "export_quantization_nsamples": int,
    "export_quantization_maxlen": int,
}
INFERENCE: dict[str, Parse] = {  # gym chat and gym serve
    "infer_backend": choice("huggingface", "vllm", "sglang", "ktransformers"),  # serve: --backend
    "do_sample": bool,  # false: chat --temperature 0
    "temperature": float,  # chat --temperature
    "top_p": float,  # chat --top-p
    "max_new_tokens": int,  # chat --max-tokens; serve --limits.default_max_tokens
    "default_system": str,  # chat and serve --system
    "top_k": int,  # chat --top-k
    "num_beams": int,
    "max_length": int,
    "repetition_penalty": float,  # chat --repetition-penalty
    "length_penalty": float,
    "skip_special_tokens": bool,
    "enable_thinking": bool,
    "vllm_maxlen": int,
    "vllm_gpu_util": float,
    "vllm_enforce_eager": bool,
    "vllm_max_lora_rank": int,
    "vllm_config": str,
    "sglang_maxlen": int,
    "sglang_mem_fraction": float,
    "sglang_tp_size": int,
    "sglang_config": str,
    "sglang_lora_backend": str,
}
NAMES: dict[str, Parse] = {**MODEL, **EXPORT, **INFERENCE}  # export, chat and serve
# Sampling gym serve takes per request, and what a request that names none gets.
SAMPLING = {
    "temperature": "OpenAI's API: temperature 1.0",
    "top_p": "OpenAI's API: top_p 1.0",
    "do_sample": "OpenAI's API: sampling at temperature 1.0",
    "top_k": "vLLM's top_k field: no top-k cut",
    "repetition_penalty": "vLLM's repetition_penalty field: no penalty",
}
# Engine settings gym serve would have to pass on to vLLM / SGLang, and what the engine does instead.
ENGINE_SETTINGS = {
    "vllm_maxlen": "the model's context length",
    "vllm_gpu_util": "0.9 of the GPU's memory",
    "vllm_config": "its defaults",
    "sglang_maxlen": "the model's context length",
    "sglang_mem_fraction": "its own memory fraction",
    "sglang_tp_size": "one GPU",
    "sglang_config": "its defaults",
}

# Values that are what gym does anyway: accepted without a note.
QUIET: dict[str, Any] = {
    "infer_dtype": "auto",
    "flash_attn": "auto",
    "export_device": "cpu",
    "export_legacy_format": False,
    "do_sample": True,
    "num_beams": 1,
    "repetition_penalty": 1.0,
    "length_penalty": 1.0,
    "skip_special_tokens": True,
    "vllm_enforce_eager": False,
    "download_mode": "reuse_dataset_if_exists",
}
# Settings gym needs no value for, and why (a `note:` when given).
NOT_NEEDED: dict[str, str] = {
    "finetuning_type": "gym tells an adapter from full weights by its files (adapter_config.json)",
    "infer_dtype": "gym loads the dtype the checkpoint stores (torch_dtype in its config.json)",
    "flash_attn": "gym loads models with transformers' default attention (sdpa where the model has it)",
    "enable_thinking": "the chat template decides: qwen3 thinks, qwen3_nothink (gym's chatml) doesn't",
    "export_device": "gym export merges on the CPU: exact, and it needs no GPU memory",
    "export_quantization_dataset": "only export_quantization_bit reads it",
    "export_quantization_nsamples": "only export_quantization_bit reads it",
    "export_quantization_maxlen": "only export_quantization_bit reads it",
    "max_length": "max_new_tokens sets the reply's length (in LLaMA-Factory too, unless it is 0)",
    "length_penalty": "it weighs beam search, which gym doesn't do",
    "vllm_max_lora_rank": "gym merges the adapter before serving: vLLM gets full weights, no LoRA",
    "sglang_lora_backend": "gym merges the adapter before serving: SGLang gets full weights, no LoRA",
    "vllm_enforce_eager": "gym serve starts vLLM with its default CUDA graphs (only start-up time and "
    "memory differ)",
    "seed": "gym eval takes each subject's first n_shot dev examples as lm-eval does (LLaMA-Factory draws "
    "them at random): nothing to seed",
    "download_mode": "gym eval reads task_dir's files as they are, or the hub's copy through the hub cache",
}
# Settings gym cannot honour, and what to do instead (one `error:` line, exit status 2).
REFUSED: dict[str, str] = {
    "export_legacy_format": "gym writes safetensors only (a pickled .bin file can run code when it is "
    "loaded): remove export_legacy_format",
    "export_hub_model_id": "gym export writes a local folder: remove export_hub_model_id and push the "
    "export with `gym deploy --model DIR --target OWNER/NAME --push_to_hub`",
    "export_quantization_bit": "gym export writes the merged weights unquantized (no GPTQ): remove "
    "export_quantization_bit and quantize the exported folder with a quantization tool (for llama.cpp, "
    "`gym export --gguf` writes how)",
    "num_beams": "gym generates without beam search: remove num_beams",
    "skip_special_tokens": "gym's replies never contain special tokens: remove skip_special_tokens",
    **{name: TRAIN_REFUSED[name] for name in ("hf_hub_token", "cache_dir", "model_revision")},
}
QUANTIZED = {
    "export": "merging an adapter into a quantized model is not exact (LLaMA-Factory refuses it too): "
    "remove quantization_bit",
    "chat": "gym chat loads full-precision weights: remove quantization_bit",
    "serve": "gym serve loads full-precision weights: remove quantization_bit",
    "eval": "gym eval loads full-precision weights: remove quantization_bit",
}
EPILOG = (
    "LLaMA-Factory: `gym {command} FILE.yaml` reads its {kind} YAML files, and its names work as flags "
    "(--model_name_or_path, --adapter_name_or_path, {names}...; gym/cli_llamafactory_tools.py)."
)


def epilog(command: str) -> str:
    """The line a command's --help ends with."""
    if command == "export":
        return EPILOG.format(command=command, kind="export (merge)", names="--export_dir, --export_size")
    if command == "eval":
        return EPILOG.format(command=command, kind="evaluation", names="--task, --task_dir, --n_shot")
    return EPILOG.format(command=command, kind="inference", names="--infer_backend, --temperature")


def translate(command: str, argv: Sequence[str], own: argparse.ArgumentParser, out: Any = None) -> list[str]:
    """`argv` for `gym <command>` with a LLaMA-Factory config file and names, as the command's own flags.

    `own` is the command's parser (its flags pass through, and may be keys of the file). Notes go
    to `out` (stderr); a setting gym can't honour raises ConfigError. An adapter for chat or serve
    is merged here, once (see the module docstring).
    """
    from gym import cli_llamafactory_eval as evaluation  # it builds on this module

    table = evaluation.NAMES if command == "eval" else NAMES
    path, rest = _find_file(list(argv), own, table)
    if "-h" in rest or "--help" in rest:
        return rest
    names = _parser(f"gym {command}", table)
    spelled = _underscored(own)
    known = {**own._option_string_actions, **spelled, **names._option_string_actions}
    file_values: dict[str, Any] = {}
    file_own: list[str] = []
    if path is not None:
        names.source = path  # a bad value names the file
        try:
            flags = file_argv(path, read_config_file(path), known)
            namespace, file_own = names.parse_known_args(flags)
        finally:
            names.source = None
        file_values = _given(namespace)
        file_own = _own_flags(file_own, own, spelled)
    flags = dotlist(rest, known)
    namespace, cmd_own = names.parse_known_args(flags)
    values = {**file_values, **_given(namespace)}
    if not values:
        return [*file_own, *cmd_own]
    if path is None and flags == rest and all(f"--{name}" in own._option_string_actions for name in values):
        # Only the command's own flags, which LLaMA-Factory happens to share (`gym eval --template
        # chatml`): gym's meaning, not LLaMA-Factory's (whose `template` also picks eval's chat style).
        return rest
    own_flags = [*file_own, *cmd_own]
    where = f"{path}: " if path is not None else ""
    notes = check(command, values, where, given_here=set(_given(namespace)))
    for note in notes:
        print(f"note: {note}", file=out or sys.stderr)
    build = {"export": _export, "eval": evaluation.flags}.get(command, _inference)
    translated = build(command, values, own_flags, where, out)
    return [*file_own, *translated, *cmd_own]


def check(
    command: str, values: dict[str, Any], where: str = "", given_here: Collection[str] = ()
) -> list[str]:
    """The notes for the LLaMA-Factory settings `values` given to `gym <command>`; raises ConfigError
    (`where` first, unless the setting is one of `given_here`: on the command line) for the first one gym
    cannot honour."""
    from gym import cli_llamafactory_eval as evaluation  # it builds on this module

    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}")
    notes: list[str] = []

    def refuse(name: str, why: str) -> None:
        raise ConfigError(f"{'' if name in given_here else where}{name}: {why}")

    backend = BACKENDS.get(str(values.get("infer_backend", "huggingface")))
    benchmark = None
    if command == "eval" and "task" in values:
        try:
            benchmark = evaluation.eval_task(str(values["task"]))
        except ConfigError as exc:
            refuse("task", str(exc))
    greedy = values.get("do_sample") is False or values.get("temperature") == 0
    for name, value in values.items():
        if name in QUIET and value == QUIET[name]:
            continue
        if command == "export" and name in INFERENCE:
            notes.append(f"{name}: an inference setting (gym chat, gym serve); gym export doesn't read it")
            continue
        if command != "export" and name in EXPORT:
            notes.append(f"{name}: read by gym export only")
            continue
        if name == "quantization_bit":
            refuse(name, QUANTIZED[command])
        elif command == "eval" and name in ("task", "lang", "template", "save_dir"):
            note = evaluation.note(name, value, benchmark)
            if note is not None:
                notes.append(f"{name}: {note}")
        elif name == "adapter_name_or_path" and "," in str(value):
            refuse(
                name,
                f"gym merges one adapter at a time ({value!r}): export the base with the first one "
                "(`gym export`), then use that folder as model_name_or_path with the next",
            )
        elif name == "infer_backend" and backend is None:
            refuse(name, f"gym has no {value} backend: use huggingface, vllm or sglang")
        elif name == "infer_backend" and command == "chat" and value != "huggingface":
            notes.append(
                f"{name}: gym chat runs gym's own engine (transformers); `gym serve` serves the same "
                f"YAML with {value}"
            )
        elif name == "top_k" and greedy:
            notes.append(f"{name}: greedy decoding (do_sample false or temperature 0) doesn't read it")
        elif name in REFUSED and str(value).lower() not in ASKS_NOTHING.get(name, ()):
            refuse(name, REFUSED[name])
        elif name in SAMPLING and command == "serve":
            notes.append(
                f"{name}: each request to gym serve sets its own sampling ({SAMPLING[name]} when a request "
                "names none)"
            )
        elif name.startswith(("vllm_", "sglang_")):
            engine = name.partition("_")[0]
            if command == "chat":
                notes.append(f"{name}: gym chat runs gym's own engine, not {engine}")
            elif backend != engine:
                notes.append(f"{name}: only read with infer_backend {engine}")
            elif name in ENGINE_SETTINGS:
                refuse(
                    name,
                    f"gym serve starts {engine} with its own defaults ({ENGINE_SETTINGS[name]}), "
                    f"passing no engine settings: remove {name}, or start {engine} yourself on the "
                    "folder `gym export` writes",
                )
            else:
                notes.append(f"{name}: {NOT_NEEDED[name]}")
        elif name == "infer_dtype" and command == "export":
            continue  # gym export's --dtype
        elif name in NOT_NEEDED:
            notes.append(f"{name}: {NOT_NEEDED[name]}")
    return notes


def _export(command: str, values: dict[str, Any], own: Sequence[str], where: str, out: Any) -> list[str]:
    argv: list[str] = []
    template = values.get("template")
    if not has(own, "--model"):
        model, adapter = values.get("model_name_or_path"), values.get("adapter_name_or_path")
        if adapter is None and model is None:
            raise ConfigError(
                f"{where}model_name_or_path is missing: the model (or an adapter's base) to export"
            )
        if adapter is not None:
            argv += ["--model", str(_adapter_folder(adapter, stage_ok=True))]
            if model is not None and not has(own, "--base"):
                base, template = weights(model, template)
                argv += ["--base", base]
        else:
            argv += ["--model", str(model)]
    if "export_dir" in values:
        argv += ["--out", values["export_dir"]]
    elif not has(own, "--out"):
        raise ConfigError(f"{where}export_dir is missing: the folder to write")
    if "export_size" in values:
        argv += ["--shard-size", shard_size(values["export_size"])]
    if values.get("infer_dtype", "auto") != "auto":
        argv += ["--dtype", str(values["infer_dtype"])]
    if template is not None:
        argv += ["--template", template]
    if values.get("trust_remote_code"):
        argv += ["--trust-remote-code"]
    return argv


def _inference(command: str, values: dict[str, Any], own: Sequence[str], where: str, out: Any) -> list[str]:
    argv: list[str] = []
    template = values.get("template")
    trust = bool(values.get("trust_remote_code"))
    if has(own, "--model") and values.get("adapter_name_or_path") is not None:
        raise ConfigError(
            f"{where}adapter_name_or_path goes with model_name_or_path, not with gym's --model (which "
            f"loads a whole model as it is): pass the base as --model_name_or_path and gym {command} merges "
            "the adapter into it"
        )
    if not has(own, "--model"):
        model, adapter = values.get("model_name_or_path"), values.get("adapter_name_or_path")
        if adapter is None and model is None:
            raise ConfigError(f"{where}model_name_or_path is missing: the model to {command} with")
        if adapter is not None:
            base, template = weights(model, template) if model is not None else (None, template)
            merged = merge_adapter(adapter, base, template, trust, command, out)
            argv += ["--model", str(merged)]
            if command == "serve" and not has(own, "--served-model-name", "--served_model_name"):
                argv += ["--served-model-name", adapter]  # what clients ask for, not the merge's folder
        else:
            argv += ["--model", str(model)]
    if template is not None:
        argv += ["--template", template]
    if trust:
        argv += ["--trust-remote-code"]
    if command == "serve":
        if "infer_backend" in values:
            argv += ["--backend", BACKENDS[values["infer_backend"]]]
        if "max_new_tokens" in values:  # a request's max_tokens overrides it, as in LLaMA-Factory's API
            default = values["max_new_tokens"]
            argv += ["--limits.default_max_tokens", str(default)]
            if default > Limits.model_fields["max_tokens"].default:
                argv += ["--limits.max_tokens", str(default)]
        if values.get("default_system") is not None:
            argv += ["--system", values["default_system"]]
        return argv
    if "temperature" in values:
        argv += ["--temperature", str(values["temperature"])]
    if values.get("do_sample") is False:
        argv += ["--temperature", "0"]  # greedy, whatever the temperature
    if "top_p" in values:
        argv += ["--top-p", str(values["top_p"])]
    if "top_k" in values:
        argv += ["--top-k", str(values["top_k"])]
    if "repetition_penalty" in values:
        argv += ["--repetition-penalty", str(values["repetition_penalty"])]
    if "max_new_tokens" in values:
        argv += ["--max-tokens", str(values["max_new_tokens"])]
    if values.get("default_system") is not None:
        argv += ["--system", values["default_system"]]
    return argv


def shard_size(gigabytes: float) -> str:
    """LLaMA-Factory's export_size (GB per shard) as gym's --shard-size: 2 -> 2GB, 0.5 -> 500MB."""
    if float(gigabytes).is_integer():
        return f"{int(gigabytes)}GB"
    return f"{max(1, round(gigabytes * 1_000_000))}KB"


def weights(model: str, template: str | None) -> tuple[str, str | None]:
    """Where `model` (an adapter's base) loads from with from_pretrained, and the chat template to use:
    a gym registry name is its weights (gym-tiny built on first use) with its registry template unless
    `template` is given; a folder or hub id is itself."""
    if Path(model).expanduser().is_dir():
        return model, template
    from gym import registry

    specs = registry.load_models()
    if model in specs or model.lower() in {str(s.hub_id).lower() for s in specs.values() if s.hub_id}:
        from gym.models import resolve

        ref = resolve(model)  # the entry's own template: gym-tiny is built once, whatever `template` is
        return ref.path, template or ref.template
    return model, template


def merge_adapter(
    adapter: str,
    base: str | None,
    template: str | None,
    trust_remote_code: bool = False,
    command: str = "chat",
    out: Any = None,
) -> Path:
    """The workspace folder holding `adapter` merged into `base` (default: the adapter's own base), as
    `gym export` merges it; written on first use and reused while adapter, base and gym are unchanged."""
    from gym import workspace
    from gym.export import MARKER, ExportSettings, export_model
    from gym.hashing import hash_obj, library_digest, stamp

    full = Path(adapter).expanduser()
    if (
        not (full / "adapter_config.json").is_file()
        and (full / MARKER).is_file()
        and (full / "config.json").is_file()
    ):
        # LLaMA-Factory's LoRA output_dir holds the adapter; gym's holds the model, its adapter merged in
        print(
            f"note: adapter_name_or_path: {adapter} holds a model gym trained, its adapter already merged "
            f"(gym writes output_dir so): gym {command} loads it as the model",
            file=out or sys.stderr,
        )
        return full
    folder = _adapter_folder(adapter)
    key = {"adapter": stamp(folder), "base": base, "template": template, "gym": library_digest()}
    merged = workspace.path("models", f"merged-adapter-{hash_obj(key)}")
    if (merged / MARKER).is_file():
        print(
            f"note: adapter_name_or_path: using its merge for gym {command} in {merged}",
            file=out or sys.stderr,
        )
        return merged
    print(
        f"note: adapter_name_or_path: gym {command} loads full weights: merging {adapter} into "
        f"{base or 'its base'} once, into {merged}",
        file=out or sys.stderr,
    )
    from gym.cli import terminated_as_exit

    settings = ExportSettings(trust_remote_code=trust_remote_code)
    with terminated_as_exit():  # a `kill` while merging leaves no staging folder (as `gym export`)
        written = export_model(folder, merged, settings, base=base, template=template)
    source = {"adapter": str(folder.resolve()), "base": base, "template": template}
    workspace.atomic_write_json(written / MERGE_SOURCE, source)
    _drop_stale_merges(written, source, out or sys.stderr)
    _share_weights(written, source, out or sys.stderr)
    return written


MERGE_SOURCE = "gym_merge_source.json"  # in a merge's folder: the adapter, base and template it was made from


def _drop_stale_merges(current: Path, source: dict[str, Any], out: Any) -> None:
    """Delete earlier merges of the same adapter, base and template: the adapter (or gym) has changed
    since, so they would never be used again and only fill the disk."""
    for folder in sorted(current.parent.glob("merged-adapter-*")):
        record = folder / MERGE_SOURCE
        if folder == current or not record.is_file():
            continue
        try:
            same = json.loads(record.read_text(encoding="utf-8")) == source
        except (OSError, ValueError):
            continue
        if same:
            shutil.rmtree(folder, ignore_errors=True)
            print(f"note: removed {folder}, an earlier merge of {source['adapter']}", file=out)


def _share_weights(current: Path, source: dict[str, Any], out: Any) -> None:
    """Hard-link the weights of `current` to those of a merge of the same adapter and base made with
    another template, where they are the same bytes: the merge was stored again for each template
    (a full copy of the model: ~15 GB each for a 7B one)."""
    import filecmp

    for folder in sorted(current.parent.glob("merged-adapter-*")):
        record = folder / MERGE_SOURCE
        if folder == current or not record.is_file():
            continue
        try:
            other = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (other.get("adapter"), other.get("base")) != (source["adapter"], source["base"]):
            continue
        shared = 0
        for mine in sorted(current.glob("*.safetensors")):
            theirs = folder / mine.name
            if not theirs.is_file() or theirs.stat().st_ino == mine.stat().st_ino:
                continue
            if theirs.stat().st_size != mine.stat().st_size or not filecmp.cmp(mine, theirs, shallow=False):
                continue
            link = mine.with_name(f".{mine.name}.link")
            link.unlink(missing_ok=True)
            try:
                os.link(theirs, link)
                os.replace(link, mine)  # in one step: the file is whole whichever a reader opens
                shared += 1
            except OSError:  # a file system without hard links: each keeps its copy
                link.unlink(missing_ok=True)
        if shared:
            print(
                f"note: {current} shares its weights with {folder} (the same merge, with template "
                f"{other.get('template')})",
                file=out,
            )
            return


def _adapter_folder(adapter: str, stage_ok: bool = False) -> Path:
    """The local folder of a PEFT adapter (`stage_ok`: or of a gym training stage holding one)."""
    folder = Path(adapter).expanduser()
    if (folder / "adapter_config.json").is_file() or (stage_ok and folder.is_dir()):
        return folder
    what = "no such folder" if not folder.is_dir() else "no adapter_config.json in it"
    raise ConfigError(
        f"adapter_name_or_path {adapter}: {what} (gym reads adapters from a local folder; for a hub "
        "adapter, `hf download REPO --local-dir DIR` first)"
    )


def _parser(prog: str, names: dict[str, Parse] = NAMES) -> ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        usage=f"{prog} [FILE.yaml] [LLaMA-Factory names] [{prog}'s own flags]",
        add_help=False,
        allow_abbrev=False,  # `--model` is gym's flag, never short for --model_name_or_path
    )
    for name, parse in names.items():
        flag, dest = f"--{name}", f"{DEST}{SEP}{name}"
        if parse is bool:
            parser.add_argument(flag, dest=dest, action=Switch)
        else:
            parser.add_argument(flag, dest=dest, type=parse, metavar=name.upper())
    return parser


def _given(namespace: argparse.Namespace) -> dict[str, Any]:
    prefix = f"{DEST}{SEP}"
    return {k.removeprefix(prefix): v for k, v in vars(namespace).items() if v is not None}


def _find_file(
    argv: Sequence[str], own: argparse.ArgumentParser, names: dict[str, Parse]
) -> tuple[Path | None, list[str]]:
    """The config file (the first YAML/JSON path that is no flag's value, anywhere before `--`) and the
    other arguments: `gym chat --ui inference.yaml` as well as `gym chat inference.yaml --ui`."""
    takes_value = {
        option
        for action in [*own._actions, *_parser("", names)._actions]
        if action.nargs != 0 and action.nargs != "?"
        for option in action.option_strings
    }
    after_flag = False
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if not after_flag and not arg.startswith("-") and arg.lower().endswith(CONFIG_SUFFIXES):
            return Path(arg), [*argv[:i], *argv[i + 1 :]]
        after_flag = arg in takes_value
    return None, list(argv)


def _underscored(own: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The command's dashed flags spelled with underscores (`shard_size: 2GB` in a file: --shard-size)."""
    return {
        _snake(option): action
        for option, action in own._option_string_actions.items()
        if option.startswith("--") and "-" in option[2:]
    }


def _own_flags(flags: Sequence[str], own: argparse.ArgumentParser, spelled: dict[str, Any]) -> list[str]:
    """A file's flags for the command itself, as it spells them; `x: false` for an on/off flag of its
    own (`--x` turns it on) leaves it off."""
    out = []
    for flag in flags:
        name, eq, value = flag.partition("=")
        action = spelled.get(name) or own._option_string_actions.get(name)
        if action is not None and name in spelled:
            name = next(o for o in action.option_strings if _snake(o) == name)
        if action is not None and action.nargs == 0 and eq:
            if value.lower() in ("false", "none"):
                continue
            eq = value = ""
        out.append(f"{name}{eq}{value}")
    return out


def _snake(option: str) -> str:
    return f"--{option[2:].replace('-', '_')}"


def has(flags: Iterable[str], *options: str) -> bool:
    return any(f == o or f.startswith(f"{o}=") for f in flags for o in options)
