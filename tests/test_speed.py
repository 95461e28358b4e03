"""Throughput settings: padding-free and packed batches keep sequences apart, "auto" picks what is
safe on the machine, and GPU-only backends fail before a model is loaded when they can't run."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from gym import train
from gym.errors import ConfigError
from gym.models import ModelRef, load_model, load_tokenizer
from gym.train import TrainConfig, sft, speed, varlen
from gym.train.config import with_defaults
from gym.train.speed import SpeedSettings
from tests.helpers import tiny, tokenized

SFT = TrainConfig(
    method="sft", learning_rate=3e-3, max_steps=6, per_device_train_batch_size=8, logging_steps=1
)


def with_speed(config: TrainConfig, **settings) -> TrainConfig:
    return config.model_copy(update={"speed": SpeedSettings(**settings)})


def sequence_losses(model, batch, boundaries=None) -> list[float]:
    """Mean next-token loss of each sequence in a padded or a padding-free batch.

    A padding-free row is split where `boundaries` (default: its own position ids) restart at 0.
    """
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits = model(**inputs).logits.float()
    labels = batch["labels"]
    token_loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="none", ignore_index=-100
    ).view(labels.shape[0], -1)
    counted = (labels[:, 1:] != -100).float()
    if "position_ids" not in batch:  # padded: one sequence per row
        return (token_loss.sum(1) / counted.sum(1)).tolist()
    positions = batch["position_ids"] if boundaries is None else boundaries
    starts = [*(positions[0] == 0).nonzero().flatten().tolist(), labels.shape[1]]
    return [
        float(token_loss[0, a : b - 1].sum() / counted[0, a : b - 1].sum())
        for a, b in itertools.pairwise(starts)
        if counted[0, a : b - 1].sum() > 0
    ]


def built_trainer(config: TrainConfig, model_ref: ModelRef, data: Path, tmp_path: Path):
    from datasets import load_from_disk

    config = with_defaults(config, model_ref.train_defaults)
    resolved = speed.resolve(config)
    return sft.build_trainer(
        model=load_model(model_ref, **speed.load_options(resolved)),
        tokenizer=load_tokenizer(model_ref),
        config=config,
        train_data=load_from_disk(str(data)),
        eval_data=None,
        output_dir=tmp_path / "out",
        peft_config=None,
        max_length=64,
    )


def test_padding_free_batch_gives_each_sequence_the_loss_it_has_alone(tmp_path):
    model_ref = tiny()
    data = tokenized("demo_sft", model_ref, max_samples=8)
    padded = built_trainer(with_speed(SFT, padding_free="off"), model_ref, data, tmp_path)
    flat = built_trainer(with_speed(SFT, padding_free="on"), model_ref, data, tmp_path)
    examples = [padded.train_dataset[i] for i in range(6)]
    padded_batch = padded.data_collator(examples)
    flat_batch = flat.data_collator(examples)
    assert "attention_mask" in padded_batch and "position_ids" in flat_batch
    assert flat_batch["input_ids"].shape[0] == 1, "padding-free: the whole batch is one row"
    assert int(flat_batch["input_ids"].numel()) == sum(len(e["input_ids"]) for e in examples), "no padding"

    model = flat.model.eval()
    alone = sequence_losses(model, padded_batch)
    together = sequence_losses(model, flat_batch)
    assert len(together) == len(alone) == 6
    assert together == pytest.approx(alone, abs=1e-5)
    # The control: the same row read as one long sequence lets later sequences see earlier ones.
    leaky = {**flat_batch, "position_ids": torch.arange(flat_batch["input_ids"].shape[1])[None]}
    mixed = sequence_losses(model, leaky, boundaries=flat_batch["position_ids"])
    assert max(abs(a - b) for a, b in zip(mixed[1:], alone[1:], strict=True)) > 1e-3


def test_padding_free_training_follows_the_padded_loss_curve():
    model = tiny()
    data = tokenized("demo_sft", model, max_samples=64)
    padded = train.run(with_speed(SFT, padding_free="off"), model, data)
    flat = train.run(with_speed(SFT, padding_free="on"), model, data)
    assert padded.digest != flat.digest
    assert [s for s, _ in flat.losses] == [s for s, _ in padded.losses]
    assert [v for _, v in flat.losses] == pytest.approx([v for _, v in padded.losses], rel=1e-4)
    assert flat.losses[-1][1] < flat.losses[0][1]
    assert flat.tokens_seen == padded.tokens_seen > 6 * 8 * 20, "both count real tokens, padding excluded"


def test_packing_fills_rows_with_several_sequences_and_learns(tmp_path):
    model_ref = tiny()
    data = tokenized("demo_sft", model_ref, max_samples=256)
    short = SFT.model_copy(update={"max_steps": 12, "per_device_train_batch_size": 2})
    config = with_speed(short, packing=True)
    trainer = built_trainer(config, model_ref, data, tmp_path)
    rows = trainer.train_dataset
    assert len(rows) < 256 / 2, "a 64-token row holds several 20-32-token sequences"
    assert all(sum(r["seq_lengths"]) <= 64 for r in rows)
    batch = trainer.data_collator([rows[0], rows[1]])
    restarts = int((batch["position_ids"][0] == 0).sum())
    assert restarts == len(rows[0]["seq_lengths"]) + len(rows[1]["seq_lengths"])
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses[-1] < 0.8 * losses[0], losses


def test_auto_on_this_machine_is_padding_free_sdpa_without_gpu_kernels():
    resolved = speed.resolve(SFT)
    if torch.cuda.is_available():
        pytest.skip("describes a machine without CUDA")
    assert resolved == speed.Resolved("sdpa", True, False, False, False, False)
    assert speed.load_options(resolved)["attn_implementation"] == varlen.NAME, "gym's per-sequence SDPA"
    args = train.common.trl_args(SFT, Path("out"))
    assert args["use_liger_kernel"] is False and args["torch_compile"] is False
    assert speed.sft_args(resolved, 1024)["padding_free"] is True
    # Only where a method's batches can be flattened, and not with eager attention (no per-sequence path).
    assert not speed.resolve(TrainConfig(method="dpo")).padding_free
    assert not speed.resolve(with_speed(SFT, attn_implementation="eager")).padding_free
    assert not speed.resolve(with_speed(SFT, padding_free="off")).padding_free


def test_auto_on_a_gpu_machine_turns_on_liger_flash_and_padding_free(monkeypatch):
    # What a CUDA machine with liger-kernel and flash-attn installed would report (no GPU here).
    monkeypatch.setattr(speed, "_cuda", lambda: True)
    monkeypatch.setattr(speed, "_installed", lambda module: True)
    on_gpu = speed.resolve(SFT.model_copy(update={"bf16": True}))
    assert on_gpu == speed.Resolved("flash_attention_2", True, False, True, False, False)
    fp32 = speed.resolve(SFT)
    assert fp32.attn_implementation == "sdpa" and not fp32.padding_free and fp32.liger
    dpo = speed.resolve(TrainConfig(method="dpo", bf16=True))
    assert not dpo.liger and not dpo.padding_free, "gym's DPO precomputes reference log-probs: no Liger"
    with pytest.raises(ConfigError, match="precomputed reference"):
        speed.resolve(with_speed(TrainConfig(method="dpo"), liger="on"))
    # Unsloth brings its own kernels: auto asks for neither flash-attn nor Liger beside it.
    bf16_unsloth = with_speed(SFT.model_copy(update={"bf16": True}), unsloth=True)
    assert speed.resolve(bf16_unsloth) == speed.Resolved("sdpa", False, False, False, True, False)
    with pytest.raises(ConfigError, match="unsloth brings its own attention kernels"):
        speed.resolve(with_speed(bf16_unsloth, unsloth=True, attn_implementation="flash_attention_2"))
    monkeypatch.setattr(speed, "_installed", lambda module: False)
    assert not speed.resolve(SFT).liger, "auto stays off where liger-kernel is not installed"
    with pytest.raises(ConfigError, match=r"pip install 'gym\[liger\]'"):
        speed.resolve(with_speed(SFT, liger="on"))


def test_what_auto_turned_on_is_said_before_training_and_nothing_when_given(monkeypatch):
    cpu = train.plan(SFT, tiny(), 8, 0)[1]
    if not torch.cuda.is_available():
        assert cpu["padding_free"].startswith("on: batches flattened into one row through gym's per-sequence")
    given = with_speed(SFT, padding_free="on", liger="off")
    assert not {"padding_free", "liger", "attn_implementation"} & set(train.plan(given, tiny(), 8, 0)[1])
    assert "padding_free" not in speed.choices(with_speed(SFT, packing=True)), "packing was asked for"
    monkeypatch.setattr(speed, "_cuda", lambda: True)
    monkeypatch.setattr(speed, "_installed", lambda module: True)
    on_gpu = speed.choices(SFT.model_copy(update={"bf16": True}))
    assert on_gpu["attn_implementation"].startswith("flash_attention_2")
    assert "flash-attn's varlen kernel" in on_gpu["padding_free"] and on_gpu["liger"].startswith("on")


MISSING = ModelRef(name="gone", path="/nonexistent/model", template="chatml", digest="x", base_model="gone")


@pytest.mark.parametrize(
    ("settings", "needs"),
    [
        ({"liger": "on"}, "Liger kernels: needs a CUDA GPU"),
        ({"attn_implementation": "flash_attention_2"}, "flash_attention_2 needs a CUDA GPU"),
        ({"unsloth": True}, "Unsloth: needs a CUDA GPU"),
        ({"torch_compile": True}, "torch_compile needs a CUDA GPU"),
    ],
)
def test_gpu_backends_fail_before_the_model_loads_where_they_cant_run(settings, needs):
    if torch.cuda.is_available():
        pytest.skip("the failure path of a machine without CUDA")
    data = tokenized("demo_sft", tiny(), max_samples=8)
    # The model folder does not exist: an error about it would mean loading was attempted first.
    with pytest.raises(ConfigError, match=needs):
        train.run(with_speed(SFT, **settings), MISSING, data)


def test_padding_free_or_packing_for_a_method_without_it_fails_early():
    for settings in ({"padding_free": "on"}, {"packing": True}):
        with pytest.raises(ConfigError, match="not available for method"):
            speed.resolve(with_speed(TrainConfig(method="dpo"), **settings))


def test_longlora_shifted_attention_keeps_padded_rows(monkeypatch):
    from gym.train import s2attn
    from tests.test_varlen import flattened, sequences

    # Why: S2-Attn groups the tokens of a row, so a flattened row's sequences are grouped together and
    # get other outputs than each alone (in eval mode, where S2-Attn is plain SDPA, they match).
    model = load_model(tiny(), attn_implementation="sdpa")
    s2attn.enable(model, 0.25)
    seqs = sequences()
    for mode, differs in (("eval", False), ("train", True)):
        getattr(model, mode)()
        with torch.no_grad():
            alone = torch.cat([model(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
            together = model(**flattened(seqs), use_cache=False).logits[0]
        assert bool((together - alone).abs().max() > 1e-2) is differs, mode
    longlora = SFT.model_copy(update={"finetuning_type": "longlora"})
    plain = longlora.model_copy(
        update={"longlora": longlora.longlora.model_copy(update={"shift_attention": False})}
    )
    for cuda in (False, True):  # this machine, and a GPU machine with flash-attn and Liger
        monkeypatch.setattr(speed, "_cuda", lambda cuda=cuda: cuda)
        monkeypatch.setattr(speed, "_installed", lambda module: True)
        bf16 = {"bf16": cuda}
        assert not speed.resolve(longlora.model_copy(update=bf16)).padding_free, "auto stays padded"
        assert speed.resolve(plain.model_copy(update=bf16)).padding_free, "without S2-Attn: as for lora"
    monkeypatch.setattr(speed, "_cuda", lambda: False)  # this machine again
    for settings in ({"padding_free": "on"}, {"packing": True}):
        with pytest.raises(ConfigError, match=r"shifted sparse attention.*shift_attention false"):
            speed.resolve(with_speed(longlora, **settings))
        assert speed.resolve(with_speed(plain, **settings)).padding_free
    # pt's blocks are packed already: LLaMA-Factory's pt YAML (packing: true) with shift_attn trains them.
    pt = longlora.model_copy(update={"method": "pt"})
    resolved = speed.resolve(with_speed(pt, packing=True))
    assert resolved == speed.resolve(pt)
    assert not resolved.padding_free and not resolved.packing


def test_neftune_keeps_the_padded_rows_its_noise_scale_was_set_for():
    from transformers.integrations.neftune import neftune_post_forward_hook

    # Why: transformers scales NEFTune's noise by 1/sqrt(row length x width); a flattened row holds the
    # whole batch, so the same alpha would add several times less noise than on padded rows.
    embed = torch.nn.Embedding(10, 16).train()
    embed.neftune_noise_alpha = 5.0
    embed.register_forward_hook(neftune_post_forward_hook)
    ids = torch.randint(0, 10, (8, 32))
    padded_noise = (embed(ids) - embed.weight[ids]).abs().max()
    flat_noise = (embed(ids.reshape(1, -1)) - embed.weight[ids.reshape(1, -1)]).abs().max()
    assert flat_noise < padded_noise / 2
    neftune = SFT.model_copy(update={"neftune_noise_alpha": 5.0})
    assert speed.resolve(SFT).padding_free or torch.cuda.is_available()
    assert not speed.resolve(neftune).padding_free, "auto stays padded"
    assert speed.resolve(with_speed(neftune, padding_free="on")).padding_free, "asked for: as TRL does"
    # ... with a word on what it does to the noise (it was silent)
    for asked in ({"padding_free": "on"}, {"packing": True}):
        said = speed.choices(with_speed(neftune, **asked))
        assert "several times less noise" in said["packing" if "packing" in asked else "padding_free"]
    assert not speed.choices(neftune)


def test_packing_with_padding_free_off_is_refused():
    # packing won, silently
    with pytest.raises(ConfigError, match=r"packing joins sequences into full rows.*but padding_free is off"):
        speed.resolve(with_speed(SFT, packing=True, padding_free="off"))


def test_flow_preflight_names_the_stage_whose_speed_option_cant_run():
    from gym import preflight
    from gym.pipeline import TrainFlowConfig

    preflight.check_methods(TrainFlowConfig())  # defaults are always valid
    if torch.cuda.is_available():
        pytest.skip("the failure path of a machine without CUDA")
    config = TrainFlowConfig(train=with_speed(SFT, liger="on"))
    with pytest.raises(ConfigError, match=r"^train\.speed: Liger kernels: needs a CUDA GPU"):
        preflight.check_methods(config)


def test_training_keeps_the_collector_off_older_objects_and_hands_them_back():
    import gc

    assert gc.get_freeze_count() == 0
    with speed.gc_frozen():
        assert gc.get_freeze_count() > 1000, "what lived before training is frozen"
    assert gc.get_freeze_count() == 0, "and handed back to the collector afterwards"
    gc.freeze()  # a caller's own freeze is left alone
    try:
        frozen = gc.get_freeze_count()
        younger = [[] for _ in range(1000)]  # would be frozen too if gc_frozen froze again
        # Frozen objects that die leave the count (other threads free some), so it may only fall.
        with speed.gc_frozen():
            assert gc.get_freeze_count() <= frozen, "nothing younger is frozen"
        assert gc.get_freeze_count() > frozen - len(younger), "the caller's freeze is kept"
    finally:
        gc.unfreeze()


def test_liger_comes_with_gym_where_triton_ships_wheels():
    import platform
    import sys
    from importlib.metadata import requires

    core = [r for r in requires("gym") or [] if r.startswith("liger-kernel") and "extra ==" not in r]
    assert core and "sys_platform == 'linux'" in core[0], "a core dependency on Linux, not only an extra"
    if sys.platform == "linux" and platform.machine() == "x86_64":
        assert speed._installed("liger_kernel"), "so 'auto' can turn it on wherever a CUDA GPU is"


# Run in a child process: Liger patches transformers' modeling code process-wide (its Triton kernels
# would then fail every later test on this CPU).
LIGER_CHECK = """
import sys
from datasets import load_from_disk
from gym import train
from gym.train import speed
from tests.helpers import tiny, tokenized
from tests.test_speed import SFT

def liger_forward(trainer):
    model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    return getattr(model.forward, "__module__", "").startswith("liger_kernel")

finetuning_type, out = sys.argv[1], sys.argv[2]
ref = tiny()
data = load_from_disk(str(tokenized("demo_sft", ref, max_samples=8)))
config = SFT.model_copy(update={"finetuning_type": finetuning_type})
speed._cuda = lambda: False
trainer = train.build_trainer(train.plan(config, ref, 8, 8)[0], ref, data, data, out, out, 64)[0]
assert not trainer.args.use_liger_kernel and not liger_forward(trainer), "no Liger: nothing patched"
speed._cuda = lambda: True  # "auto" then takes Liger (installed here)
config = train.plan(config, ref, 8, 8)[0]
assert speed.resolve(config).liger
trainer = train.build_trainer(config, ref, data, data, out, out, 64)[0]
print("LIGER", trainer.args.use_liger_kernel, liger_forward(trainer))
"""


@pytest.mark.parametrize("finetuning_type", ["full", "lora"])
def test_liger_is_in_the_model_before_the_evaluation_that_precedes_training(tmp_path, finetuning_type):
    """transformers patches Liger in when train() starts; gym scores the held-out data before that, so
    gym.train.build_trainer patches it in at once (else that evaluation builds the full logits)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "GYM_HOME": str(tmp_path / "gym")}
    proc = subprocess.run(
        [sys.executable, "-c", LIGER_CHECK, finetuning_type, str(tmp_path / "out")],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LIGER True True" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_held_out_score_before_training_runs_through_liger(recwarn):
    model = tiny()
    data, held_out = (
        tokenized("demo_sft", model, max_samples=64),
        tokenized("demo_sft_eval", model, max_samples=16),
    )
    result = train.run(SFT.model_copy(update={"bf16": True}), model, data, held_out)
    assert "eval_mean_token_accuracy" in result.eval_before, "Liger's loss reports token accuracy"
    assert not [w for w in recwarn if "did not return token_accuracy" in str(w.message)]
