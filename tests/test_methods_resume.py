"""A training process killed mid-run resumes from its last checkpoint and ends bit-identical to an
uninterrupted run (CPU training is deterministic), for SFT-LoRA and for DPO-LoRA (whose reference
is the adapter's frozen initial copy beside the trained one: the case transformers alone resumes
wrongly, see gym.train.adapters.restore_adapter)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gym import train
from gym.train import TrainConfig
from tests.helpers import tiny, tokenized

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "sft-lora": (dict(method="sft", finetuning_type="lora", learning_rate=3e-3), "demo_sft", None),
    "dpo-lora": (
        dict(method="dpo", finetuning_type="lora", learning_rate=1e-3, reference="live"),
        "demo_dpo",
        "demo_dpo_eval",
    ),
}
STEPS = dict(max_steps=30, per_device_train_batch_size=8, logging_steps=5, save_steps=5, save_total_limit=2)
SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from tests.test_methods_resume import run_case
    run_case({case!r})
    """
)


def run_case(case: str, samples: int = 240) -> train.TrainResult:
    """The same stage in any process: gym-tiny, the case's config, its demo data."""
    fields, data, held_out = CASES[case]
    model = tiny()
    eval_data = tokenized(held_out, model, max_samples=16) if held_out else None
    config = TrainConfig(**fields, **STEPS)
    return train.run(config, model, tokenized(data, model, max_samples=samples), eval_data)


def kill_after_first_checkpoint(case: str, home: Path) -> None:
    env = {**os.environ, "GYM_HOME": str(home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(repo=str(REPO), case=case)],
        env=env,
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if list(home.glob("models/*/checkpoints/checkpoint-*/trainer_state.json")):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "training finished (or failed) before it could be interrupted"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_killed_run_resumes_to_the_same_final_weights(case, tmp_path, monkeypatch):
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "uninterrupted"))
    whole = run_case(case)
    assert whole.resumed_from is None

    home = tmp_path / "killed"
    kill_after_first_checkpoint(case, home)
    assert not list(home.glob("models/*/result.json")), "no result after a kill"
    monkeypatch.setenv("GYM_HOME", str(home))
    resumed = run_case(case)

    assert resumed.resumed_from is not None and 5 <= int(resumed.resumed_from.rsplit("-", 1)[1]) < 30
    assert resumed.global_step == whole.global_step == 30
    assert resumed.losses == whole.losses, "the loss history spans the run before and after the kill"
    a = load_file(str(Path(whole.model_dir) / "model.safetensors"))
    b = load_file(str(Path(resumed.model_dir) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "final weights differ"
    if case.startswith("dpo"):
        for key in ("eval_loss", "eval_rewards/margins", "eval_rewards/accuracies"):
            assert resumed.eval_after[key] == whole.eval_after[key]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_ended_after_its_last_checkpoint_resumes_without_training_a_step_more(case, gym_home):
    """The process died between the last step's checkpoint and the final save (what is left: the
    checkpoints, no model, no result). Re-run, the stage ends at the same step with the same weights:
    transformers alone would train one step past max_steps (when the data holds more batches)."""
    whole = run_case(case, samples=320)
    stage = Path(whole.stage_dir)
    assert (stage / "checkpoints" / "checkpoint-30" / "trainer_state.json").is_file()
    (stage / "result.json").unlink()
    for folder in ("model", "adapter"):
        shutil.rmtree(stage / folder, ignore_errors=True)
    again = run_case(case, samples=320)
    assert again.resumed_from is not None and again.resumed_from.endswith("checkpoint-30")
    assert again.global_step == 30 and again.losses == whole.losses
    a = load_file(str(Path(whole.model_dir) / "model.safetensors"))
    b = load_file(str(Path(again.model_dir) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "final weights differ"
    if case.startswith("dpo"):
        for key in ("eval_loss", "eval_rewards/margins", "eval_rewards/accuracies"):
            assert again.eval_after[key] == whole.eval_after[key]
