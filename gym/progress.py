"""Progress a person can follow: one live bar per stage on a terminal, a few lines otherwise.

    sft  ━━━━━━━━━━━━━━━━━━━━━━━━━━━━────────────  470/1880  loss 1.234  41.2k tok/s  ETA 1:25
    sft: 25% (step 470/1880)  loss 1.234  41.2k tok/s  ETA 1:25          (not a terminal)

`Progress` only formats and writes; gym.train.progress feeds it from the Trainer. With
`GYM_VERBOSE=1` (what `--verbose` sets) the caller prints every raw log line instead.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import IO

VERBOSE_ENV = "GYM_VERBOSE"
BAR_WIDTH = 28
REDRAW_S = 0.2  # a terminal line redrawn at most 5 times a second
LINE_EVERY_S = 300.0  # not a terminal: a line at each quarter, and at least every 5 minutes


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").lower() in ("1", "true", "yes", "on")


# What the console shows by default: gym's own lines (Prefect's task lines, one progress bar per
# training stage, the summary, a command's result). Libraries' progress bars and info lines stay off
# unless `--verbose` / GYM_VERBOSE=1 (a variable already in the environment wins).
QUIET = {
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # also transformers' (loading and writing weights)
    "TQDM_DISABLE": "1",  # TRL's reference log-prob pass
    "MLFLOW_LOGGING_LEVEL": "ERROR",
    "TRL_EXPERIMENTAL_SILENCE": "1",  # the warning on every import of trl.experimental (PPO, ORPO, SimPO)
}


def console_defaults(verbose: bool = False) -> None:
    """Set the environment a command's console needs, before the libraries that read it are imported.

    Environment variables rather than library calls: they also reach processes the command starts
    (Prefect's temporary API, launched trainers, a server's workers).
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        return
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # its CPU-kernel notice on every import


def clock(seconds: float) -> str:
    """`1:05` (m:ss) or `2:03:04` (h:mm:ss)."""
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def rate(per_s: float) -> str:
    return f"{per_s / 1000:.1f}k" if per_s >= 1000 else f"{per_s:.0f}"


class Progress:
    """One stage's progress: `update` as steps complete, `done` at the end."""

    def __init__(
        self,
        stage: str,
        total: int,
        *,
        start: int = 0,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        now: float | None = None,
        unit: str = "step",
    ) -> None:
        self.stage, self.total, self.start = stage, max(total, 1), start
        self.unit = unit  # what a step is: "step", "question" ...
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.began = time.monotonic() if now is None else now
        self.step = start
        self.loss: float | None = None
        self.first_loss: float | None = None  # the first loss `update` gets, unless set before
        self.tokens_per_s: float | None = None
        self.note: str | None = None  # what else the stage reports (a TF-GRPO library's size)
        self._drawn = -1.0
        self._next_quarter = (start * 4 // self.total) + 1
        self._last_line = self.began
        if not self.tty:
            resumed = f", resuming at step {start}" if start else ""
            self._write(f"{stage}: {self.total} {unit}s{resumed}\n")

    def update(
        self,
        step: int,
        loss: float | None = None,
        tokens_per_s: float | None = None,
        now: float | None = None,
        note: str | None = None,
    ) -> None:
        now = time.monotonic() if now is None else now
        self.step = step
        if note is not None:
            self.note = note
        if loss is not None:
            self.loss = loss
            self.first_loss = loss if self.first_loss is None else self.first_loss
        if tokens_per_s is not None:
            self.tokens_per_s = tokens_per_s
        if self.tty:
            if now - self._drawn >= REDRAW_S or step >= self.total:
                self._drawn = now
                self._write("\r" + self.bar(now) + "\x1b[K")
            return
        quarter = step * 4 // self.total
        if (quarter >= self._next_quarter and step < self.total) or now - self._last_line >= LINE_EVERY_S:
            self._next_quarter = quarter + 1
            self._last_line = now
            percent = 100 * step // self.total
            self._write(f"{self.stage}: {percent}% ({self.unit} {step}/{self.total}){self.numbers(now)}\n")

    def done(self, now: float | None = None, tokens: float | None = None) -> None:
        """The closing line. `tokens`: those this run processed, for its average tokens/s over the time
        shown (the live rate `update` got covers the last interval only, not the stage: none is shown
        without them)."""
        now = time.monotonic() if now is None else now
        if self.tty:
            self._write("\r" + self.bar(now) + "\x1b[K\n")
        losses = ""
        if self.first_loss is not None and self.loss is not None:
            losses = f", loss {self.first_loss:.4g} -> {self.loss:.4g}"
        speed = ""
        if tokens and now > self.began:
            since = " since the resume" if self.start else ""
            speed = f", {rate(tokens / (now - self.began))} tok/s{since}"
        note = f", {self.note}" if self.note else ""
        # The steps this run took in the time shown: after a resume, those since it (the others ran
        # before the interruption), and so its tokens/s; `first_loss` is the stage's first, which the
        # caller may set from the history the resume brought back (gym.train), as the stage's result and
        # summary have it.
        ran = self.step - self.start
        resumed = f" (resumed at {self.start})" if self.start else ""
        took = f"{ran} {self.unit}{'s' * (ran != 1)}{resumed} in {clock(now - self.began)}"
        self._write(f"{self.stage}: done, {took}{losses}{speed}{note}\n")

    def eta(self, now: float) -> float | None:
        done = self.step - self.start
        if done <= 0:
            return None
        return (now - self.began) / done * (self.total - self.step)

    def numbers(self, now: float) -> str:
        parts = []
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.tokens_per_s:
            parts.append(f"{rate(self.tokens_per_s)} tok/s")
        if self.note:
            parts.append(self.note)
        eta = self.eta(now)
        if eta is not None and self.step < self.total:
            parts.append(f"ETA {clock(eta)}")
        return "".join(f"  {p}" for p in parts)

    def bar(self, now: float) -> str:
        filled = BAR_WIDTH * min(self.step, self.total) // self.total
        bar = "━" * filled + "─" * (BAR_WIDTH - filled)
        width = len(str(self.total))
        return f"{self.stage}  {bar}  {self.step:>{width}}/{self.total}{self.numbers(now)}"

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()
