"""Export: adapters merged exactly (LoRA, DoRA, converted PiSSA), refused where a merge can't be exact,
a sharded hub-style directory with tokenizer, chat template and card, Ollama and GGUF extras."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from gym import tracking
from gym.errors import ConfigError
from gym.export import ExportSettings, export_model
from gym.lineage import Lineage
from gym.models import resolve
from gym.registration import register
from gym.templates import load_template
from gym.tfgrpo.injection import EXPERIENCE_FILE
from tests.serve_fixtures import noisy_tiny

IDS = torch.tensor([[5, 17, 300, 42, 7, 99]])


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def trained_adapter(out: Path, **lora) -> tuple[Path, torch.Tensor, str]:
    """A LoRA-family adapter over gym-tiny whose weights moved (as after training); returns its
    directory, the adapted model's logits and the base path."""
    base = resolve("gym-tiny").path
    model = AutoModelForCausalLM.from_pretrained(base)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], **lora)
    peft = get_peft_model(model, config)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param) * 0.2)
    peft.save_pretrained(out)
    return out, logits(peft), base


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_an_adapter_merges_into_its_base_exactly_in_sharded_safetensors(gym_home, tmp_path, dora):
    adapter, adapted, base = trained_adapter(tmp_path / "adapter", use_dora=dora, init_lora_weights=False)
    out = export_model(adapter, tmp_path / "out", ExportSettings(shard_size="400KB"), template="chatml")

    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert torch.allclose(logits(merged), adapted, atol=1e-5)
    assert not torch.allclose(logits(AutoModelForCausalLM.from_pretrained(base)), adapted, atol=1e-3)
    assert AutoTokenizer.from_pretrained(out).chat_template == load_template("chatml")
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    card = (out / "README.md").read_text()
    # Its base is the gym-tiny gym built (the folder adapter_config names): the card gives its registry name,
    # and no `base_model` metadata, which the Hub refuses on a push unless it names a model there
    front = card.split("\n---\n", 1)[0]
    assert card.startswith("---\n") and "base_model" not in front and str(base) not in card
    assert "| base model | `gym-tiny` |" in card


def test_dtype_converts_the_merged_weights_and_only_them(gym_home, tmp_path):
    adapter, adapted, _ = trained_adapter(tmp_path / "adapter", init_lora_weights=False)
    out = export_model(adapter, tmp_path / "bf16", ExportSettings(dtype="bfloat16"), template="chatml")
    merged = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert {p.dtype for p in merged.parameters()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    # merged in the stored precision, then rounded once: as close as bf16 weights get
    assert torch.allclose(logits(merged.float()), adapted, atol=0.02)  # the adapter moves them by ~1
    with pytest.raises(ConfigError, match="drop one of them"):
        export_model(adapter, tmp_path / "x", ExportSettings(dtype="bfloat16", adapter_only=True))


def test_pissa_merges_only_in_converted_form(gym_home, tmp_path):
    base = resolve("gym-tiny").path
    peft = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base),
        LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights="pissa"),
    )
    peft.peft_config["default"].init_lora_weights = True  # PEFT's recipe: keep the initial adapter
    peft.save_pretrained(tmp_path / "init")
    peft.peft_config["default"].init_lora_weights = "pissa"
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn_like(param) * 0.05)
    trained = logits(peft)
    peft.save_pretrained(tmp_path / "raw")
    peft.save_pretrained(
        tmp_path / "converted", path_initial_model_for_weight_conversion=str(tmp_path / "init")
    )

    with pytest.raises(ConfigError, match="rewrites the base weights"):
        export_model(tmp_path / "raw", tmp_path / "out-raw")
    assert not (tmp_path / "out-raw").exists()
    out = export_model(tmp_path / "converted", tmp_path / "out", template="chatml")
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(out)), trained, atol=1e-4)


def test_a_quantized_base_is_refused_and_the_adapter_exported_alone(gym_home, tmp_path):
    from transformers import BitsAndBytesConfig

    adapter, _, base = trained_adapter(tmp_path / "adapter", init_lora_weights=False)
    quantized = tmp_path / "base-4bit"
    q4 = BitsAndBytesConfig(load_in_4bit=True)
    AutoModelForCausalLM.from_pretrained(base, quantization_config=q4).save_pretrained(quantized)
    AutoTokenizer.from_pretrained(base).save_pretrained(quantized)

    with pytest.raises(ConfigError, match=r"quantized.*--adapter-only"):
        export_model(adapter, tmp_path / "out", base=str(quantized))
    assert not (tmp_path / "out").exists()
    out = export_model(adapter, tmp_path / "out", ExportSettings(adapter_only=True), base=str(quantized))
    assert (out / "adapter_model.safetensors").is_file() and not list(out.glob("model*.safetensors"))
    assert "PEFT adapter only" in (out / "README.md").read_text()


def test_a_registered_version_exports_with_the_registry_card_ollama_and_gguf_files(gym_home, tmp_path):
    model = noisy_tiny(tmp_path / "noisy")
    (model / EXPERIENCE_FILE).write_text(json.dumps({"items": [{"id": "a", "text": "Be brief."}]}))
    lineage = Lineage(
        base_model="gym-tiny",
        template="chatml",
        method="sft",
        datasets={"dataset": {"name": "demo_sft", "digest": "0123456789abcdef"}},
        hyperparameters={"train": {"learning_rate": "0.003"}},
        scores={"exact_match_after": 0.75},
    )
    register(model, "tiny-export", lineage, tracking.start_run("register"))

    settings = ExportSettings(ollama=True, gguf=True)
    out = export_model("models:/tiny-export@challenger", tmp_path / "hub", settings)
    card = (out / "README.md").read_text()
    assert card == MlflowClient(tracking.tracking_uri()).get_model_version("tiny-export", "1").description
    assert "0123456789abcdef" in card and "0.7500" in card and "learning_rate" in card
    assert torch.equal(
        logits(AutoModelForCausalLM.from_pretrained(out)), logits(AutoModelForCausalLM.from_pretrained(model))
    )
    assert json.loads((out / EXPERIENCE_FILE).read_text())["items"][0]["text"] == "Be brief."
    modelfile = (out / "Modelfile").read_text()
    assert "FROM ." in modelfile and "<|im_start|>{{ .Role }}" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile
    assert "model_type: llama" in (out / "GGUF.md").read_text()


def test_llamafactorys_template_names_export_as_the_templates_they_name(gym_home, tmp_path):
    """`qwen` renders what gym's qwen2.5 does: its Modelfile, GGUF notes and metadata are qwen2.5's (the
    Modelfile had no TEMPLATE and the notes said it had one)."""
    from flows.cli import main

    outs = {}
    for name in ("qwen", "qwen2.5"):
        outs[name] = tmp_path / name
        argv = ["export", "--model", "gym-tiny", "--out", str(outs[name]), "--template", name]
        assert main([*argv, "--ollama", "--gguf"]) == 0
    alias, canonical = outs["qwen"], outs["qwen2.5"]
    assert json.loads((alias / "gym_model.json").read_text())["template"] == "qwen2.5"
    modelfile = (alias / "Modelfile").read_text()
    assert "\nTEMPLATE " in modelfile and "You are Qwen" in modelfile
    assert modelfile == (canonical / "Modelfile").read_text()
    assert (alias / "GGUF.md").read_text() == (canonical / "GGUF.md").read_text()


def test_gym_export_refuses_to_overwrite_foreign_folders(gym_home, tmp_path, capsys):
    from flows.cli import main

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main(["export", "--model", "gym-tiny", "--out", str(foreign)]) == 2
    assert "was not written by gym" in capsys.readouterr().err and (foreign / "notes.txt").is_file()
    (tmp_path / "a_file").write_text("keep me")
    assert main(["export", "--model", "gym-tiny", "--out", str(tmp_path / "a_file")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert (tmp_path / "a_file").read_text() == "keep me"
    assert main(["export", "--model", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "neither a model" in capsys.readouterr().err
    assert main(["export", "--model", "gym-tiny", "--out", str(tmp_path / "ok"), "--ollama"]) == 0
    assert (tmp_path / "ok" / "model.safetensors").is_file() and (tmp_path / "ok" / "Modelfile").is_file()
    assert main(["export", "--model", "gym-tiny", "--out", str(tmp_path / "ok")]) == 0  # gym's own: replaced
    assert not (tmp_path / "ok" / "Modelfile").exists()


def test_a_shard_size_sharding_cannot_read_is_refused_before_the_model_is_resolved(
    gym_home, tmp_path, capsys
):
    """It was huggingface_hub's ValueError traceback, after the model had loaded."""
    from flows.cli import main

    for bad in ("0", "5", "0MB", "two GB", "1PB"):
        assert (
            main(["export", "--model", "no-such-model", "--out", str(tmp_path / "x"), "--shard-size", bad])
            == 2
        )
        err = capsys.readouterr().err.strip()
        says = "a size above 0 with its unit: KB, MB, GB or TB, e.g. 500MB or 2GB"
        assert err == f"error: --shard-size: {says} (got {bad!r})"
        assert not (tmp_path / "x").exists()
    for good in ("500MB", "0.5gb", "1.5 TB", "400KB"):
        assert ExportSettings(shard_size=good).shard_size == good


def test_only_an_earlier_export_is_replaced_never_a_trained_model_or_the_source(gym_home, tmp_path, capsys):
    """Training's model folders hold gym_model.json too: they (and a user's copy of one, with the
    user's own files in it) were replaced by `gym export --out` as if gym had exported them."""
    from flows.cli import main
    from gym import train
    from gym.train import TrainConfig
    from tests.helpers import tiny, tokenized

    config = TrainConfig(method="sft", finetuning_type="lora", max_steps=2, logging_steps=1)
    stage = train.run(config, tiny(), tokenized("demo_sft", tiny(), max_samples=16))
    trained = Path(stage.model_dir)
    before = {p.name: p.read_bytes() for p in trained.iterdir()}
    assert main(["export", "--model", "gym-tiny", "--out", str(trained)]) == 2
    assert f"lies inside {stage.stage_dir}, a folder gym's workspace keeps" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in trained.iterdir()} == before, "the trained model is untouched"
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in trained.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    (copy / "NOTES.txt").write_text("my notes")
    assert main(["export", "--model", "gym-tiny", "--out", str(copy)]) == 2
    assert (copy / "NOTES.txt").read_text() == "my notes"
    capsys.readouterr()
    # An export onto itself, or into the model it reads, would overwrite what it reads.
    out = tmp_path / "out"
    assert main(["export", "--model", str(stage.stage_dir), "--out", str(out)]) == 0
    for model, target in ((out, out), (out, out / "x")):
        assert main(["export", "--model", str(model), "--out", str(target)]) == 2
        assert "overlaps the model being exported" in capsys.readouterr().err
    # Nor into a stage's folders, from it or another source (its adapter, written into its model/)
    assert stage.adapter_dir is not None
    for model, target in (
        (stage.stage_dir, trained / "x"),
        (stage.adapter_dir, trained / "x"),
        (stage.adapter_dir, Path(stage.stage_dir) / "x"),
    ):
        assert main(["export", "--model", model, "--out", str(target)]) == 2
        assert f"lies inside {stage.stage_dir}, a folder gym's workspace keeps" in capsys.readouterr().err
        assert not target.exists()
    assert {p.name: p.read_bytes() for p in trained.iterdir()} == before
    # A path below a file can't be made: one error line, no traceback.
    (tmp_path / "a_file").write_text("keep me")
    assert main(["export", "--model", "gym-tiny", "--out", str(tmp_path / "a_file" / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is a file" in err and "Traceback" not in err


def test_a_training_stages_adapter_exports_with_the_stages_base_name_template_and_shareable_modes(
    gym_home, tmp_path
):
    """The adapter folder alone named its base by the workspace path it was built in, and no template;
    safetensors' files were 0600, unreadable to the people an export is for."""
    from gym import train, workspace
    from gym.train import TrainConfig
    from tests.helpers import tiny, tokenized

    config = TrainConfig(method="sft", finetuning_type="lora", max_steps=2, logging_steps=1)
    stage = train.run(config, tiny(), tokenized("demo_sft", tiny(), max_samples=16))
    assert stage.adapter_dir is not None
    out = export_model(stage.adapter_dir, tmp_path / "out")
    meta = json.loads((out / "gym_model.json").read_text())
    assert (meta["base_model"], meta["template"]) == ("gym-tiny", "chatml")
    assert "| base model | `gym-tiny` |" in (out / "README.md").read_text()
    assert "<|im_start|>" in AutoTokenizer.from_pretrained(out).chat_template
    mask = workspace.umask()
    modes = {p.name: p.stat().st_mode & 0o777 for p in [out, *out.iterdir()]}
    assert modes == {p.name: (0o777 if p.is_dir() else 0o666) & ~mask for p in [out, *out.iterdir()]}
    assert modes["model.safetensors"] & 0o044 == 0o044 & ~mask, "readable by others, as the umask allows"
    # Served, chatted with or trained from as if it were a model, the adapter folder says what to do.
    with pytest.raises(ConfigError, match=r"holds a PEFT adapter.*--adapter_name_or_path"):
        resolve(stage.adapter_dir)


def test_an_adapter_outside_a_stage_ignores_an_unrelated_model_folder_beside_it(gym_home, tmp_path):
    """Only a training stage's adapter/ reads its sibling model/'s facts: beside any other folder named
    model/, the adapter's own base and template stand."""
    adapter, _, _ = trained_adapter(tmp_path / "work" / "adapter", init_lora_weights=False)
    (tmp_path / "work" / "model").mkdir()
    (tmp_path / "work" / "model" / "gym_model.json").write_text(
        json.dumps({"base_model": "someone/else", "template": "llama3"})
    )
    out = export_model(adapter, tmp_path / "out")
    meta = json.loads((out / "gym_model.json").read_text())
    assert (meta["base_model"], meta["template"]) == ("gym-tiny", "chatml")  # its base's, not llama3


def test_an_adapter_copied_out_of_its_stage_exports_as_the_stage_does(gym_home, tmp_path, capsys):
    """Its base, a gym-tiny gym built, is known by its folder: the registry's name and template, so the
    export has the same chat template and Ollama TEMPLATE. --base takes a registry name; a base that is
    not there is one error line, before anything loads."""
    import shutil

    from flows.cli import main

    adapter, adapted, _ = trained_adapter(tmp_path / "stage" / "adapter", init_lora_weights=False)
    copy = Path(shutil.copytree(adapter, tmp_path / "elsewhere" / "adapter"))
    for name, extra in (("copy", []), ("named_base", ["--base", "gym-tiny"])):
        out = tmp_path / name
        assert main(["export", "--model", str(copy), *extra, "--out", str(out), "--ollama"]) == 0
        meta = json.loads((out / "gym_model.json").read_text())
        assert (meta["base_model"], meta["template"]) == ("gym-tiny", "chatml")
        modelfile = (out / "Modelfile").read_text()
        assert "\nTEMPLATE " in modelfile and "<|im_start|>" in modelfile
        assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(out)), adapted, atol=1e-5)
    capsys.readouterr()
    for base, expected in (
        (str(tmp_path / "no-such-base"), "no such directory"),
        ("someone/not-cached-anywhere", "not in the local Hugging Face cache and HF_HUB_OFFLINE=1"),
    ):
        target = tmp_path / "never"
        assert main(["export", "--model", str(copy), "--base", base, "--out", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and expected in err and "Traceback" not in err
        assert not target.exists()


def _lora_stage() -> Path:
    """A short LoRA SFT stage of gym-tiny: models/sft-<digest>/ with adapter/ and model/ (whose config.json
    says use_cache false, as training wrote it)."""
    from gym import train
    from gym.train import TrainConfig
    from tests.helpers import tiny, tokenized

    config = TrainConfig(method="sft", finetuning_type="lora", max_steps=2, logging_steps=1)
    stage = train.run(config, tiny(), tokenized("demo_sft", tiny(), max_samples=16))
    return Path(stage.stage_dir)


def test_a_stage_folders_card_has_the_scores_and_hyperparameters_a_flow_registers(gym_home, tmp_path):
    """It listed every Trainer number as a score (eval_runtime, epoch...) and no hyperparameters."""
    from gym import train
    from gym.lineage import eval_scores
    from gym.train import TrainConfig
    from gym.train.common import TrainResult
    from tests.helpers import tiny, tokenized

    config = TrainConfig(method="sft", finetuning_type="lora", max_steps=2, logging_steps=1)
    held_out = tokenized("demo_sft_eval", tiny(), max_samples=8)
    stage = Path(train.run(config, tiny(), tokenized("demo_sft", tiny(), max_samples=16), held_out).stage_dir)
    facts = TrainResult.model_validate_json((stage / "result.json").read_text())
    card = (export_model(stage, tmp_path / "out") / "README.md").read_text()
    hyperparameters = card.split("## Hyperparameters", 1)[1]
    assert "`sft.learning_rate`" in hyperparameters.split("##", 1)[0]
    scores, _ = eval_scores({"sft": facts}, None, None)
    assert set(scores) == {"sft_eval_loss", "sft_loss_last"}
    assert all(name in card for name in scores)
    for trainer_number in ("eval_runtime", "samples_per_second", "sft_epoch", "num_input_tokens_seen"):
        assert trainer_number not in card
    # and the data it trained on and held out, with digests, and its base's registry entry ("(none
    # recorded)" and "(not from gym's registry)" before)
    datasets = card.split("## Datasets", 1)[1].split("##", 1)[0]
    assert set(facts.datasets) == {"dataset", "eval_dataset"}
    for role, data in facts.datasets.items():
        assert f"| {role} | {data['name']} — digest `{data['digest']}` |" in datasets, datasets
    assert facts.datasets["dataset"]["name"] == "demo_sft"
    assert "`gym-tiny` (digest `" in card
    # an export of the export (as of a LLaMA-Factory-style output_dir) keeps the card: it was titled
    # with the folder's name and recorded none of it
    again = (export_model(tmp_path / "out", tmp_path / "again") / "README.md").read_text()
    assert sorted(again.splitlines()) == sorted(card.splitlines())  # its hyperparameters stored sorted
    assert again.splitlines()[:10] == card.splitlines()[:10]  # the front matter, the title


def test_the_cards_use_snippet_runs_against_the_export(gym_home, tmp_path, capsys):
    """The card's Python passed apply_chat_template's output (a BatchEncoding in transformers 5) to
    generate() as if it were a tensor: AttributeError. Run as written, with the export's folder for
    PATH_OR_REPO, it prints the model's reply."""
    import re

    out = export_model(noisy_tiny(tmp_path / "noisy"), tmp_path / "out", template="chatml")
    card = (out / "README.md").read_text()
    (snippet,) = re.findall(r"```python\n(.*?)```", card, re.DOTALL)
    capsys.readouterr()
    namespace: dict = {}
    exec(compile(snippet.replace("PATH_OR_REPO", str(out)), "card-snippet", "exec"), namespace)
    printed = capsys.readouterr().out
    prompt = namespace["inputs"]["input_ids"].shape[1]
    assert namespace["output"].shape[1] > prompt, "it generated"
    reply = namespace["tokenizer"].decode(namespace["output"][0][prompt:], skip_special_tokens=True)
    assert printed == f"{reply}\n" and reply.strip()


def _unwritable(root: str) -> Path:
    """A folder to export to that can't be made (under /proc or /sys); skips where it can."""
    import tempfile

    if not Path(root).is_dir():
        pytest.skip(f"no {root} here")
    try:
        with tempfile.TemporaryDirectory(dir=root):
            pytest.skip(f"{root} is writable here")
    except OSError:
        pass
    return Path(root) / "gym_qa_x"


@pytest.mark.parametrize("root", ["/proc", "/sys"])
def test_an_out_that_cannot_be_written_is_one_error_line_before_anything_loads(
    gym_home, tmp_path, capsys, monkeypatch, root
):
    """It was atomic_dir's PermissionError traceback, after the model had loaded."""
    import gym.export
    from flows.cli import main

    target = _unwritable(root)

    def loaded(*_args, **_kwargs):
        raise AssertionError("the model was looked up before --out was checked")

    monkeypatch.setattr(gym.export, "locate", loaded)
    for out in (target, target / "sub"):
        assert main(["export", "--model", "gym-tiny", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: can't write {out}: no folder can be made in {root} (")
        assert err.endswith("choose a directory you can write to\n") and err.count("\n") == 1
    # Were the check passed (a race), making the staging folder says the same, not a traceback.
    monkeypatch.setattr(gym.export.workspace, "check_writable", lambda folder: None)
    unwritable = f"can't write {target}: no folder can be made in {root}"
    with pytest.raises(ConfigError, match=unwritable), gym.export.replace_dir(target):
        raise AssertionError("never staged")


def test_an_adapter_only_export_names_its_base_as_the_card_does(gym_home, tmp_path):
    """adapter_config.json kept the workspace path of the gym-tiny it was trained on, while the card said
    gym-tiny: copied elsewhere the adapter could not find its base. A base in a user's own folder is kept,
    and the card says so."""
    import shutil

    adapter, adapted, base = trained_adapter(tmp_path / "adapter", init_lora_weights=False)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    out = export_model(adapter, tmp_path / "out", ExportSettings(adapter_only=True))
    config = json.loads((out / "adapter_config.json").read_text())
    original = json.loads((adapter / "adapter_config.json").read_text())
    assert config == {**original, "base_model_name_or_path": "gym-tiny"}, "only the base's name changes"
    card = (out / "README.md").read_text()
    assert "| base model | `gym-tiny` |" in card and "load `gym-tiny` and apply it with PEFT" in card
    assert base not in card
    # Copied to another folder (another machine), gym finds the base by that name and merges it exactly.
    copy = Path(shutil.copytree(out, tmp_path / "elsewhere" / "shared-adapter"))
    merged = export_model(copy, tmp_path / "merged")
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(merged)), adapted, atol=1e-5)

    # A base in the user's own folder: named as it was (nothing else would find it), and the card says so.
    mine = Path(shutil.copytree(base, tmp_path / "my-base"))
    config_path = adapter / "adapter_config.json"
    config_path.write_text(json.dumps({**original, "base_model_name_or_path": str(mine)}))
    out = export_model(adapter, tmp_path / "out-mine", ExportSettings(adapter_only=True), template="chatml")
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(mine)
    card = (out / "README.md").read_text()
    assert f"the local folder `{mine}`" in card and "set it to where that base is" in card


def test_exported_configs_generate_with_the_kv_cache(gym_home, tmp_path):
    """Training saves use_cache false; a stage's, its model folder's and a registered version's export kept
    it (a merged adapter's had true)."""
    stage = _lora_stage()
    assert json.loads((stage / "model" / "config.json").read_text())["use_cache"] is False
    model = noisy_tiny(tmp_path / "noisy")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "use_cache": False}))
    register(model, "tiny-cache", Lineage(base_model="gym-tiny", template="chatml"), tracking.start_run("r"))
    for name, source in (
        ("stage", stage),
        ("model", stage / "model"),
        ("adapter", stage / "adapter"),
        ("registered", "models:/tiny-cache@challenger"),
    ):
        out = export_model(source, tmp_path / name)
        assert json.loads((out / "config.json").read_text())["use_cache"] is True, name


def test_a_stages_adapter_and_model_folders_export_under_the_stages_name(gym_home, tmp_path):
    """The card of `<stage>/adapter` was titled `# adapter` (and its model folder's `# model`)."""
    stage = _lora_stage()
    for folder in ("adapter", "model"):
        out = export_model(stage / folder, tmp_path / folder)
        assert f"\n# {stage.name}\n" in (out / "README.md").read_text(), folder
    out = export_model(stage, tmp_path / "stage")
    assert f"\n# {stage.name}\n" in (out / "README.md").read_text()


def test_a_model_folder_named_model_outside_its_stage_keeps_its_base_and_an_export_its_method(
    gym_home, tmp_path
):
    """A copy of a stage's model/ elsewhere (and TF-GRPO's, whose stage has no result.json) exported as
    fine-tuned from itself: its own gym_model.json was taken for a stage sibling's and skipped. An
    export's gym_model.json now carries the method, so an export of it says how it was trained."""
    import shutil

    stage = _lora_stage()
    copy = shutil.copytree(stage / "model", tmp_path / "x" / "model")
    meta = json.loads((export_model(copy, tmp_path / "from-copy") / "gym_model.json").read_text())
    assert (meta["base_model"], meta["template"]) == ("gym-tiny", "chatml")

    first = export_model(stage, tmp_path / "first")
    assert json.loads((first / "gym_model.json").read_text())["method"] == "sft"
    again = export_model(first, tmp_path / "again")
    assert json.loads((again / "gym_model.json").read_text())["method"] == "sft"
    assert "method not recorded" not in (again / "README.md").read_text()


def test_a_template_the_tokenizer_cannot_encode_is_refused_and_nothing_is_written(gym_home, tmp_path):
    """`gym export --template llama3` on gym-tiny shipped Llama 3's chat template with a ChatML tokenizer
    (eos <|im_end|>): a model served from it never stops on <|eot_id|>. `gym data` refused the same."""
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"template 'llama3' writes <\|end_header_id\|>, <\|eot_id\|>"):
        export_model("gym-tiny", out, template="llama3")
    assert not out.exists()
    export_model("gym-tiny", out, template="chatml")
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text()


def test_a_base_given_for_a_full_model_gets_a_note(gym_home, tmp_path, capsys):
    export_model("gym-tiny", tmp_path / "out", base="qwen3-8b")
    assert "note: --base qwen3-8b is not read: gym-tiny is a full model" in capsys.readouterr().err


SLOW_EXPORT = """
import sys, time
import transformers.modeling_utils as mu
save = mu.PreTrainedModel.save_pretrained
def slow(self, *args, **kwargs):
    out = save(self, *args, **kwargs)
    print("WRITTEN", flush=True)
    time.sleep(60)  # as a big model's write takes
    return out
mu.PreTrainedModel.save_pretrained = slow
from flows.cli import main
from gym.cli import run_console
run_console(lambda: main(sys.argv[1:]))
"""


def test_an_export_stopped_with_sigterm_leaves_nothing_half_written(gym_home, tmp_path):
    """A plain `kill` (or `timeout`, a container stopping) mid-write left a hidden staging folder with the
    weights beside --out, removed only by a later export to the same folder; Ctrl-C left nothing."""
    import os
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    resolve("gym-tiny")  # built before: the one slow write is the export's
    out = tmp_path / "exports" / "tiny"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_EXPORT, "export", "--model", "gym-tiny", "--out", str(out)],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "WRITTEN" in line:
            break
    assert any(p.name.startswith(".") for p in out.parent.iterdir()), "the export was being staged"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err
    assert sorted(p.name for p in out.parent.iterdir()) == [], "no staging folder, no lock, no --out"
