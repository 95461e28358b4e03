"""Plots logged as run artifacts (matplotlib, headless).

Figures are built with matplotlib's object-oriented API (`matplotlib.figure.Figure`), as its docs
advise for code that isn't interactive: pyplot is never imported and the backend is never switched,
so a user who trains from a notebook keeps their inline plots, and no figure is left registered.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gym.workspace import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def _save(fig: Figure, out: Path) -> Path:
    """PNG bytes through a temp name: a reader never sees half a picture."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(out, buf.getvalue())
    return out


def loss_plot(
    curves: Mapping[str, Sequence[tuple[int, float]]], out: Path, title: str = "training loss"
) -> Path:
    """Draw one line per named loss curve into a PNG at `out`."""
    fig = _figure(6, 3.5)
    ax = fig.subplots()
    for name, points in curves.items():
        if points:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves) > 1:
        ax.legend()
    return _save(fig, out)


def category_bars(
    scores: Mapping[str, Mapping[str, float]], out: Path, title: str = "accuracy by category"
) -> Path:
    """Grouped bars: one group per category, one bar per series (e.g. before / after training)."""
    categories = sorted({c for series in scores.values() for c in series})
    width = 0.8 / max(len(scores), 1)
    fig = _figure(max(4.0, 1.3 * len(categories) + 2), 3.5)
    ax = fig.subplots()
    for i, (label, series) in enumerate(scores.items()):
        xs = [j + (i - (len(scores) - 1) / 2) * width for j in range(len(categories))]
        bars = ax.bar(xs, [series.get(c, 0.0) for c in categories], width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(categories)), categories, rotation=15 if len(categories) > 4 else 0)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if len(scores) > 1:
        ax.legend()
    return _save(fig, out)
