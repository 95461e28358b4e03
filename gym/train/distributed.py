"""Training on several processes with DDP: one process per GPU (or N processes on CPU).

    gym train --method sft --train.distributed.num_processes 4     # 4 GPUs, DDP
    gym train --method sft --train.distributed.num_processes 2     # on CPU: 2 processes over gloo

`num_processes: auto` (the default) trains on every visible CUDA GPU, as LLaMA-Factory does when it
sees more than one; one GPU or none trains in the flow's own process. With more than one process,
`gym.train.run` writes the stage's inputs to `launch.json` in the stage directory and runs
`torchrun --standalone --nproc_per_node N -m gym.train.worker launch.json` (PyTorch's launcher;
the Trainer sets up DDP through accelerate, shards the batches and averages gradients). Every
process runs the same `gym.train._train`; the main one saves the model and writes the stage's
result, which the flow's process reads back. Batches are per process: the global batch is
per_device_train_batch_size x num_processes x gradient_accumulation_steps, as in transformers.
An interrupted launch resumes from the stage's last checkpoint when run again, as in one process.
DeepSpeed ZeRO and FSDP (sharded weights, for models that don't fit one GPU) are not wired yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gym import workspace
from gym.errors import ConfigError, GymError

if TYPE_CHECKING:
    from gym.models import ModelRef
    from gym.train.common import TrainResult
    from gym.train.config import TrainConfig

SPEC = "launch.json"  # in the stage directory: what every process trains
RESULT = "launch-result.json"  # written by the main process
# Methods that train through one Trainer on a dataset, which accelerate's DDP shards. Online RL
# generates (and TF-GRPO calls a model) inside its own loop: they run in one process.
METHODS = ("sft", "pt", "dpo", "ipo", "cdpo", "hinge", "kto", "orpo", "simpo", "rm")


class DistributedSettings(BaseModel):
    """How many processes train the stage (accelerate's DDP)."""

    model_config = ConfigDict(extra="forbid")

    num_processes: int | Literal["auto"] = Field(
        "auto",
        description="Processes training the stage with accelerate's DDP, one per GPU: auto = every visible "
        "CUDA GPU when there are several, else 1 (this process). On CPU, N > 1 runs N processes over gloo.",
    )

    @field_validator("num_processes", mode="before")
    @classmethod
    def _whole_or_auto(cls, value: object) -> object:
        text = str(value).strip().lower()
        if text == "auto":
            return "auto"
        if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
            raise ValueError("a number of processes of at least 1, or auto")
        return int(text)


def resolve(config: TrainConfig) -> TrainConfig:
    """`num_processes` made concrete, checked against the method and the machine before any model loads."""
    wanted = config.distributed.num_processes
    gpus = _gpu_count()
    single = _single_process_only(config)
    if wanted == "auto":
        n = gpus if gpus > 1 and single is None else 1
    else:
        n = int(wanted)
        if n > 1 and single is not None:
            raise ConfigError(f"distributed.num_processes={n}: {single}; use 1 (or auto)")
        if n > 1 and gpus and n > gpus:
            raise ConfigError(
                f"distributed.num_processes={n}, but {gpus} CUDA GPU(s) are visible: one process per GPU; "
                f"use {gpus} or fewer (or auto)"
            )
    return config.model_copy(update={"distributed": DistributedSettings(num_processes=n)})


def _single_process_only(config: TrainConfig) -> str | None:
    """Why the stage trains in one process, or None if it can train on several."""
    if config.method not in METHODS:
        return (
            f"method {config.method!r} trains in one process (its loop generates or calls a model itself); "
            f"several processes train {', '.join(METHODS)}"
        )
    if config.speed.unsloth:
        return "unsloth trains on one GPU (its open-source release); turn it off for several"
    if config.finetuning_type == "qlora":
        return (
            "qlora trains in one process (each process would load the quantized base); use lora for several"
        )
    return None


def needed(config: TrainConfig) -> bool:
    """Whether the (resolved) stage trains on several processes."""
    return config.distributed.num_processes != 1


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch(
    config: TrainConfig,
    model: ModelRef,
    train_data: Path,
    eval_data: Path | None,
    digest: str,
    stage_dir: Path,
    max_length: int,
) -> TrainResult:
    """Train the stage on `config.distributed.num_processes` processes; the main one's result."""
    from gym.train.common import TrainResult

    n = int(config.distributed.num_processes)
    spec = stage_dir / SPEC
    result = stage_dir / RESULT
    result.unlink(missing_ok=True)
    workspace.atomic_write_json(
        spec,
        {
            "config": config.model_dump(mode="json"),
            "model": model.model_dump(mode="json"),
            "train_data": str(train_data),
            "eval_data": str(eval_data) if eval_data else None,
            "digest": digest,
            "stage_dir": str(stage_dir),
            "max_length": max_length,
            "parent_pid": os.getpid(),  # the processes end when this one does (gym.train.worker)
        },
    )
    # PyTorch's own launcher (torchrun): one process per GPU, or N over gloo on CPU; the Trainer sets up
    # accelerate's DDP from its environment. (`accelerate launch` starts a single process on CPU.)
    command = [
        sys.executable,
        "-m",
        "gym.train.torchrun",  # torchrun, without its traceback on Ctrl-C
        "--standalone",  # one machine, a free rendezvous port
        "--nproc_per_node",
        str(n),
        "-m",
        "gym.train.worker",
        str(spec),
    ]
    print(f"gym: {config.method}: training on {n} processes (DDP)", file=sys.stderr, flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    code = subprocess.run(command, env=env).returncode
    from gym.train.torchrun import INTERRUPTED  # here: `-m gym.train.torchrun` must not find it imported

    if code == INTERRUPTED:
        raise KeyboardInterrupt  # the processes stopped on Ctrl-C: the run ends as an interrupted one
    if code != 0 or not result.is_file():
        raise GymError(
            f"{config.method}: the {n} training processes failed (exit status {code}); their output is "
            "above. Re-running resumes from the stage's last checkpoint."
        )
    return TrainResult.model_validate_json(result.read_text(encoding="utf-8"))
