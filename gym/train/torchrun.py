"""PyTorch's launcher (torchrun) as gym.train.distributed starts it; not a command of its own.

    python -m gym.train.torchrun --standalone --nproc_per_node N -m gym.train.worker launch.json

The same as `python -m torch.distributed.run ...`, except on Ctrl-C: the interrupt reaches every
process, and torchrun's agent answered it with its own traceback. Here it exits with status 130 in
silence (the workers do too), and the flow's process says what to do, once.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except (KeyboardInterrupt, SignalException):
        return INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
