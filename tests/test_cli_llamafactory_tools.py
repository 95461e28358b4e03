"""LLaMA-Factory's export and inference YAML files for gym export, chat and serve: a LoRA adapter on
gym-tiny merged exactly through a merge YAML, inference YAMLs read into chat and serve settings (and
one real request through the openai client), and the settings gym can't honour refused."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from flows.cli import main
from gym.chat import build_parser as chat_parser
from gym.cli_llamafactory_tools import shard_size, translate
from gym.models import resolve
from gym.serve.cli import build_parser as serve_parser
from gym.serve.cli import parse_settings
from gym.templates import load_template
from tests.conftest import REPO
from tests.test_export import SLOW_EXPORT  # its model writes take a minute

IDS = torch.tensor([[5, 17, 300, 42, 7, 99]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def lora_adapter(out: Path) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """A LoRA adapter on gym-tiny whose weights moved (as after training): its folder, the adapted
    model's logits and the base's."""
    base = AutoModelForCausalLM.from_pretrained(resolve("gym-tiny").path)
    before = logits(base)
    peft = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param) * 0.2)
    peft.save_pretrained(out)
    return out, logits(peft), before


def write_yaml(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture()
def adapter(gym_home, tmp_path):
    return lora_adapter(tmp_path / "saves" / "lora" / "sft")


def test_a_merge_yaml_exports_the_adapter_merged_into_its_base(adapter, tmp_path, capsys):
    folder, adapted, base = adapter
    merge = write_yaml(
        tmp_path / "merge.yaml",  # LLaMA-Factory's examples/merge_lora/llama3_lora_sft.yaml, on gym-tiny
        f"""### Note: DO NOT use quantized model or quantization_bit when merging lora adapters

### model
model_name_or_path: gym-tiny
adapter_name_or_path: {folder}
template: qwen
finetuning_type: lora
trust_remote_code: true

### export
export_dir: {tmp_path / "output"}
export_size: 0.0004
export_device: cpu
export_legacy_format: false
""",
    )
    assert main(["export", merge]) == 0
    err = capsys.readouterr().err
    assert "note: finetuning_type: gym tells an adapter from full weights" in err and "error" not in err

    out = tmp_path / "output"
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in shards:  # export_size 0.0004 GB: 400KB shards, save one larger tensor alone
        tensors = [name for name, file in weight_map.items() if file == shard.name]
        assert shard.stat().st_size <= 400_000 + 4096 or len(tensors) == 1, (shard.name, tensors)
    weights = [p.name for p in out.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl")]
    assert weights == []  # safetensors only
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert torch.allclose(logits(merged), adapted, atol=1e-5)
    assert not torch.allclose(logits(merged), base, atol=1e-3)
    assert AutoTokenizer.from_pretrained(out).chat_template == load_template("qwen2.5")

    # Flags after the file win over it: LLaMA-Factory's names, `name=value` and gym's own flags.
    assert main(["export", merge, "--export_dir", str(tmp_path / "again"), "export_size=1"]) == 0
    again = tmp_path / "again"
    assert (again / "model.safetensors").is_file() and not (again / "model.safetensors.index.json").exists()
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(again)), adapted, atol=1e-5)
    assert main(["export", merge, "--out", str(tmp_path / "gyms"), "--ollama"]) == 0
    assert (tmp_path / "gyms" / "Modelfile").is_file() and not (tmp_path / "output" / "Modelfile").exists()

    # LLaMA-Factory's names as flags alone; no adapter: model_name_or_path is the model exported.
    flags = ["--model_name_or_path", "gym-tiny", "--adapter_name_or_path", str(folder)]
    assert main(["export", *flags, "--export_dir", str(tmp_path / "flags")]) == 0
    assert torch.allclose(
        logits(AutoModelForCausalLM.from_pretrained(tmp_path / "flags")), adapted, atol=1e-5
    )
    assert main(["export", "--model_name_or_path", "gym-tiny", "--export_dir", str(tmp_path / "base")]) == 0
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(tmp_path / "base")), base)
    # infer_dtype is the export's dtype (LLaMA-Factory's export casts to it)
    half = [
        "--model_name_or_path",
        "gym-tiny",
        "--infer_dtype",
        "bfloat16",
        "--export_dir",
        str(tmp_path / "bf"),
    ]
    assert main(["export", *half]) == 0
    assert json.loads((tmp_path / "bf" / "config.json").read_text())["dtype"] == "bfloat16"

    # gym's own settings in the file too, dashed or not; `x: false` leaves an on/off flag off.
    own = write_yaml(
        tmp_path / "own.yaml",
        f"model_name_or_path: gym-tiny\nexport_dir: {tmp_path / 'own'}\nollama: true\ngguf: false\n"
        "shard_size: 1GB\nadapter-only: false\n",
    )
    assert main(["export", own]) == 0
    assert (tmp_path / "own" / "Modelfile").is_file() and not (tmp_path / "own" / "GGUF.md").exists()


def test_export_size_is_gym_shard_size():
    assert [shard_size(n) for n in (2, 2.0, 0.5, 0.0004)] == ["2GB", "2GB", "500000KB", "400KB"]


INFERENCE = """model_name_or_path: gym-tiny
adapter_name_or_path: {adapter}
template: qwen3_nothink
finetuning_type: lora
trust_remote_code: true
infer_backend: {backend}  # choices: [huggingface, vllm, sglang, ktransformers]
"""


def test_an_inference_yaml_gives_chat_and_serve_settings_with_the_adapter_merged_once(adapter, tmp_path):
    folder, adapted, _ = adapter
    notes = io.StringIO()
    yaml = write_yaml(
        tmp_path / "infer.yaml",
        INFERENCE.format(adapter=folder, backend="huggingface")
        + "temperature: 0.3\ntop_p: 0.9\ntop_k: 40\nrepetition_penalty: 1.2\nmax_new_tokens: 64\n"
        + "vllm_enforce_eager: true\n"
        + "default_system: Answer in one word.\n",
    )
    settings = parse_settings(translate("serve", [yaml, "--port", "0"], serve_parser(), out=notes))
    assert settings.backend == "transformers" and settings.port == 0 and settings.trust_remote_code
    assert settings.system == "Answer in one word."  # LLaMA-Factory's api opens chats with it; so does gym
    assert settings.template == "qwen3_nothink" and settings.limits.default_max_tokens == 64
    assert settings.limits.max_tokens == 1024  # LLaMA-Factory's API: a request's max_tokens overrides it
    longer = write_yaml(
        tmp_path / "longer.yaml",
        INFERENCE.format(adapter=folder, backend="huggingface") + "max_new_tokens: 4096\n",
    )
    limits = parse_settings(translate("serve", [longer, "--port", "0"], serve_parser(), out=notes)).limits
    assert (limits.default_max_tokens, limits.max_tokens) == (4096, 4096)
    assert settings.served_model_name == str(folder)  # clients name the adapter, not the merge's folder
    merged = Path(settings.model)
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(merged)), adapted, atol=1e-5)
    text = notes.getvalue()
    assert "note: adapter_name_or_path: gym serve loads full weights: merging" in text
    assert "note: temperature: each request to gym serve sets its own sampling" in text
    assert "note: top_k: each request to gym serve sets its own sampling (vLLM's top_k field" in text
    assert "note: repetition_penalty: each request to gym serve sets its own sampling" in text
    assert "note: vllm_enforce_eager: only read with infer_backend vllm" in text

    # `llamafactory-cli webchat`: the file after --ui; the merge is reused; flags after the file win.
    notes = io.StringIO()
    argv = [
        "--ui",
        yaml,
        "--port",
        "7001",
        "temperature=0.5",
        "--do_sample",
        "false",
        "--default_system",
        "Be brief.",
    ]
    args = chat_parser().parse_args(translate("chat", argv, chat_parser(), out=notes))
    assert args.ui and args.port == 7001 and args.model == str(merged) and args.trust_remote_code
    assert (args.temperature, args.top_p, args.max_tokens, args.system) == (0.0, 0.9, 64, "Be brief.")
    assert (args.top_k, args.repetition_penalty, args.min_p) == (40, 1.2, None)
    assert "using its merge for gym chat" in notes.getvalue()

    for backend in ("vllm", "sglang"):
        yaml = write_yaml(tmp_path / f"{backend}.yaml", INFERENCE.format(adapter=folder, backend=backend))
        assert (
            parse_settings(translate("serve", [yaml], serve_parser(), out=io.StringIO())).backend == backend
        )
        after = translate("serve", [yaml, "--backend", "transformers"], serve_parser(), out=io.StringIO())
        assert parse_settings(after).backend == "transformers"
        assert parse_settings(after).model == str(merged)  # same adapter, base and template: same merge

    # No adapter: model_name_or_path is the model; gym's own keys may sit in the file too.
    yaml = write_yaml(
        tmp_path / "plain.yaml", "model_name_or_path: gym-tiny\nport: 0\nlimits:\n  max_concurrent: 3\n"
    )
    settings = parse_settings(translate("serve", [yaml], serve_parser(), out=io.StringIO()))
    assert (settings.model, settings.port, settings.limits.max_concurrent) == ("gym-tiny", 0, 3)


def test_retraining_an_adapter_replaces_its_stale_merge_and_keeps_other_merges(adapter, tmp_path):
    from gym.cli_llamafactory_tools import merge_adapter

    folder, _, _ = adapter
    first = merge_adapter(str(folder), None, None, out=io.StringIO())
    said = io.StringIO()
    other_template = merge_adapter(str(folder), None, "qwen3", out=said)
    # the same weights under another template: stored once (a full copy each, before)
    weights = [(first / p.name, p) for p in other_template.glob("*.safetensors")]
    assert weights and all(a.stat().st_ino == b.stat().st_ino for a, b in weights)
    assert f"note: {other_template} shares its weights with {first}" in said.getvalue()
    _, retrained, _ = lora_adapter(folder)  # the same folder, trained again: new weights
    notes = io.StringIO()
    second = merge_adapter(str(folder), None, None, out=notes)
    assert second != first and not first.exists()  # the stale merge is gone...
    assert f"removed {first}, an earlier merge of {folder.resolve()}" in notes.getvalue()
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(second)), retrained, atol=1e-5)
    assert other_template.is_dir()  # ...a merge made with another template is not stale: kept
    assert sorted(p.name for p in second.parent.glob("merged-adapter-*")) == sorted(
        [second.name, other_template.name]
    )


def test_gym_chat_talks_through_an_inference_yaml(adapter, tmp_path, monkeypatch):
    import gym.chat

    folder, _, _ = adapter
    yaml = write_yaml(
        tmp_path / "infer.yaml",
        INFERENCE.format(adapter=folder, backend="huggingface")
        + "do_sample: false\nmax_new_tokens: 6\ndefault_system: Answer in one word.\n",
    )
    seen = {}
    real = gym.chat.terminal

    def terminal(engine, **params):
        lines, out = iter(["name a river", "/exit"]), io.StringIO()
        seen.update(params, name=engine.name)
        code = real(engine, read=lambda _prompt: next(lines), out=out, **params)
        seen["out"] = out.getvalue()
        return code

    monkeypatch.setattr(gym.chat, "terminal", terminal)
    assert main(["chat", yaml]) == 0
    assert Path(seen["name"]).name.startswith("merged-adapter-")
    assert (seen["temperature"], seen["max_tokens"], seen["system"]) == (0.0, 6, "Answer in one word.")
    assert "assistant> " in seen["out"]


def test_gym_serve_answers_the_openai_client_from_an_inference_yaml(adapter, tmp_path):
    folder, _, _ = adapter
    yaml = write_yaml(tmp_path / "infer.yaml", INFERENCE.format(adapter=folder, backend="huggingface"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "flows.cli", "serve", yaml, "--port", "0", "--served-model-name", "lf"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the socket listens
        assert "gym serve: lf at http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        client = openai.OpenAI(base_url=line.split(" at ", 1)[1].split()[0], api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="lf", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
        assert reply.choices[0].finish_reason in ("stop", "length")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "note: adapter_name_or_path: gym serve loads full weights" in err


@pytest.mark.parametrize(
    ("command", "text", "message"),
    [
        ("export", "export_legacy_format: true", "export_legacy_format: gym writes safetensors only"),
        ("export", "export_quantization_bit: 4\nexport_quantization_dataset: data/c4_demo.json", "GPTQ"),
        (
            "export",
            "export_hub_model_id: me/model",
            "gym deploy --model DIR --target OWNER/NAME --push_to_hub",
        ),
        ("export", "quantization_bit: 4", "quantization_bit: merging an adapter into a quantized model"),
        ("export", "export_sise: 2", "unknown setting 'export_sise'; did you mean export_size"),
        ("chat", "quantization_bit: 4", "gym chat loads full-precision weights"),
        ("chat", "num_beams: 4", "num_beams: gym generates without beam search"),
        ("chat", "infer_backend: ktransformers", "gym has no ktransformers backend"),
        ("chat", "temprature: 0.5", "unknown setting 'temprature'; did you mean temperature"),
        ("serve", "infer_backend: vllm\nvllm_gpu_util: 0.5", "gym serve starts vllm with its own defaults"),
        ("serve", "adapter_name_or_path: a,b", "gym merges one adapter at a time"),
        ("serve", "max_new_tokens: many", "argument --max_new_tokens: invalid int value"),
        ("export", "hf_hub_token: hf_secret", "hf_hub_token: gym reads a hub token from $HF_TOKEN only"),
        ("chat", "model_revision: v2", "model_revision: gym loads the revision a model's registry entry"),
        ("serve", "cache_dir: /tmp/hf", "cache_dir: set $HF_HOME"),
    ],
)
def test_settings_gym_cannot_honour_fail_with_what_to_do(command, text, message, tmp_path, capsys):
    yaml = write_yaml(
        tmp_path / "lf.yaml", f"model_name_or_path: gym-tiny\nexport_dir: {tmp_path / 'o'}\n{text}\n"
    )
    assert main([command, yaml]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"error: {yaml}: ") and message in lines[-1], lines
    assert not (tmp_path / "o").exists() and "hf_secret" not in "".join(lines)


def test_an_inference_yaml_naming_gyms_lora_output_dir_as_the_adapter_loads_it_as_the_model(
    adapter, tmp_path, gym_home
):
    """LLaMA-Factory's LoRA output_dir holds the adapter, so its inference YAML names it as
    adapter_name_or_path; gym's holds the model with its adapter merged in, and was refused there."""
    from gym.export import export_model

    folder, adapted, _ = adapter
    output_dir = export_model(folder, tmp_path / "gym_saves" / "sft")  # what `--output_dir` writes
    assert not (output_dir / "adapter_config.json").exists()
    notes = io.StringIO()
    yaml = write_yaml(tmp_path / "infer.yaml", INFERENCE.format(adapter=output_dir, backend="huggingface"))
    args = chat_parser().parse_args(translate("chat", [yaml], chat_parser(), out=notes))
    assert args.model == str(output_dir)
    assert "holds a model gym trained, its adapter already merged" in notes.getvalue()
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(args.model)), adapted, atol=1e-5)


def test_an_override_after_the_file_is_blamed_on_the_command_line_not_the_file(tmp_path, capsys):
    """`gym export merge.yaml export_legacy_format=true` said the YAML (which says false) had it; a typo in
    an override was a bare "unrecognized arguments" where the same typo in the file gets a suggestion."""
    yaml = write_yaml(
        tmp_path / "lf.yaml",
        f"model_name_or_path: gym-tiny\nexport_dir: {tmp_path / 'o'}\nexport_legacy_format: false\n",
    )
    assert main(["export", yaml, "export_legacy_format=true"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        last.startswith("error: export_legacy_format: gym writes safetensors only") and str(yaml) not in last
    )
    with pytest.raises(SystemExit) as ended:
        main(["train", yaml, "lerning_rate=1e-5"])
    assert ended.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "lerning_rate=1e-5" in last and "did you mean --learning_rate" in last
    assert not (tmp_path / "o").exists()


def test_a_serve_stopped_with_sigterm_while_merging_leaves_nothing_half_written(adapter, gym_home):
    """Its staging folder (the merged weights) stayed in the workspace, and it ended without a word."""
    folder, _, _ = adapter
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GYM_HOME": str(gym_home)}
    cmd = [sys.executable, "-c", SLOW_EXPORT, "serve", "--model_name_or_path", "gym-tiny"]
    cmd += ["--adapter_name_or_path", str(folder), "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "WRITTEN" in line:
                break
        models = gym_home / "models"
        assert [p for p in models.iterdir() if "merged-adapter" in p.name and p.name.startswith(".")]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err
    assert not [
        p.name for p in models.iterdir() if "merged-adapter" in p.name and not p.name.endswith(".lock")
    ]
