"""One process of a stage trained on several (gym.train.distributed); not a command of its own.

    torchrun --standalone --nproc_per_node N -m gym.train.worker <stage dir>/launch.json

Each process trains the stage described in launch.json through `gym.train._train`; the main process
saves the model and writes launch-result.json for the flow's process to read.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gym.train.torchrun import INTERRUPTED


def main(argv: list[str]) -> int:
    from gym.process import tune_process

    tune_process()  # as in the flow's own process: collector thresholds, bitsandbytes loaded on first use
    from gym import workspace
    from gym.models import ModelRef
    from gym.train import _train
    from gym.train.config import TrainConfig
    from gym.train.distributed import RESULT

    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    _load_cpu_indexed_storage()
    threading.Thread(target=_exit_with, args=(spec["parent_pid"],), daemon=True).start()
    stage_dir = Path(spec["stage_dir"])
    result = _train(
        TrainConfig.model_validate(spec["config"]),
        ModelRef.model_validate(spec["model"]),
        Path(spec["train_data"]),
        Path(spec["eval_data"]) if spec["eval_data"] else None,
        spec["digest"],
        stage_dir,
        spec["max_length"],
    )
    if result is not None:  # the main process
        workspace.atomic_write_text(stage_dir / RESULT, result.model_dump_json(indent=2))
    return 0


def _load_cpu_indexed_storage() -> None:
    """Let torch.load map onto "cpu:N". On CPU, accelerate gives each process the device cpu:<local
    rank>, and transformers resumes a checkpoint's optimizer state with that as map_location, which
    torch's own deserializers (exactly "cpu", "cuda...", ...) refuse: register one for it."""
    import torch

    def cpu_indexed(storage: Any, location: str) -> Any:
        return storage if location.startswith("cpu:") else None

    torch.serialization.register_package(30, lambda _obj: None, cpu_indexed)


def _exit_with(pid: int) -> None:
    """End this process when the flow's process (which launched torchrun) is gone, even killed with
    SIGKILL: a re-run then resumes the stage alone, instead of beside processes still training it."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass  # alive, owned by another user
        time.sleep(0.5)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C reaches every process: the flow's process says what to do, once
        sys.exit(INTERRUPTED)
