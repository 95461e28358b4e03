"""Plots logged as run artifacts (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def loss_plot(
    curves: Mapping[str, Sequence[tuple[int, float]]], out: Path, title: str = "training loss"
) -> Path:
    """Draw one line per named loss curve into a PNG at `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
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
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def category_bars(
    scores: Mapping[str, Mapping[str, float]], out: Path, title: str = "accuracy by category"
) -> Path:
    """Grouped bars: one group per category, one bar per series (e.g. before / after training)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = sorted({c for series in scores.values() for c in series})
    width = 0.8 / max(len(scores), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(categories) + 2), 3.5), dpi=100)
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
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
