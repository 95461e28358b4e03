"""The Trainer's progress for people and for logs (replaces transformers' PrinterCallback).

On the console: one bar per stage on a terminal, a few lines otherwise (gym.progress), with steps,
loss, tokens/s (between the last two logs; on the closing line, the run's average) and ETA; with
GYM_VERBOSE=1 every log dict, as transformers prints it. Always: each log dict as a line on the
`gym.train` logger, which the task layer sends to Prefect's run logs.

The last step is always logged (transformers logs every `logging_steps` only), so a stage's loss
curve, MLflow's metrics and the JSON line's `loss_last`/`metric_last` end where training ended.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from transformers import TrainerCallback

from gym import progress

logger = logging.getLogger("gym.train")


class ProgressCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.verbose = progress.verbose()
        self.bar: progress.Progress | None = None
        # (time, tokens seen) at the previous log, for tokens/s between logs
        self._tokens: tuple[float, float] | None = None
        # The Trainer's count of tokens seen when this run began (a resume brings the stage's back)
        self._tokens_at_start = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_local_process_zero and not self.verbose:
            self.bar = progress.Progress(self.stage, state.max_steps, start=state.global_step)
            self._tokens_at_start = state.num_input_tokens_seen or 0
            # Resumed: the run's first loss (logged before the interruption, as the stage's result and the
            # JSON summary have it), not the resumed part's.
            from gym.train.common import losses_from

            if losses := losses_from(state.log_history):
                self.bar.first_loss = losses[0][1]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step)
        if state.global_step >= state.max_steps:
            control.should_log = True  # the Trainer's own control object: no need to return it

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not state.is_local_process_zero or not logs:
            return
        logs = {k: v for k, v in logs.items() if k != "total_flos"}
        # The held-out score before training is logged before the trainer knows its steps (0/0)
        at = f"step {state.global_step}/{state.max_steps}" if state.max_steps else "before training"
        logger.info("%s %s %s", self.stage, at, json.dumps(logs))
        if self.verbose:
            print({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in logs.items()})
            return
        from gym.train.common import LOSS_KEYS

        key = next((k for k in LOSS_KEYS if k in logs), None)  # PPO's policy loss under its own name
        if self.bar is not None and key is not None:
            self.bar.update(state.global_step, loss=float(logs[key]), tokens_per_s=self._rate(logs))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            # The run's average over the tokens the Trainer counted, as the stage's result
            # (TrainResult.tokens_per_second: the tokens since the start or resume / train_seconds); none
            # where it counts none.
            self.bar.done(tokens=(state.num_input_tokens_seen or 0) - self._tokens_at_start)
            self.bar = None

    def _rate(self, logs: dict[str, Any]) -> float | None:
        """Tokens per second between two logs, from TRL's running `num_tokens` count (or the Trainer's
        `num_input_tokens_seen`, for trainers that don't log one)."""
        count = logs.get("num_tokens", logs.get("num_input_tokens_seen"))
        if count is None:
            return None
        now, seen = time.monotonic(), float(count)
        previous, self._tokens = self._tokens, (now, seen)
        if previous is None or now <= previous[0] or seen < previous[1]:
            return None
        return (seen - previous[1]) / (now - previous[0])


class StepsFromArgs(TrainerCallback):  # type: ignore[misc]
    """A resumed run saves (and logs, and evaluates) every as many steps as its own settings say: the
    Trainer brings back the interrupted run's `save_steps` with its state, and only warns when they
    differ, so a run started again with `--save_steps 100` kept saving every 50 (gym.train's stage
    identity leaves save_steps out, so that such a run resumes at all)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        state.compute_steps(args, state.max_steps)
