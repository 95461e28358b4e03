"""Run-artifact plots: valid PNGs, written whole, without touching the caller's matplotlib state."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

from gym.plots import category_bars, loss_plot


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data.endswith(b"IEND\xaeB`\x82"), f"{path} is cut short"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plots_are_whole_pngs_of_the_figure_size(tmp_path: Path) -> None:
    loss = loss_plot({"sft": [(1, 2.0), (2, 1.5)], "dpo": [(1, 0.7)]}, tmp_path / "a" / "loss.png")
    scores = {"before": {"stem": 0.25}, "after": {"stem": 0.5, "other": 0.75}}
    bars = category_bars(scores, tmp_path / "b.png")
    assert png_size(loss) == (600, 350)
    assert png_size(bars) == (460, 350)  # 1.3 inches per category + 2, at 100 dpi
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b.png", "loss.png"]  # no temp files left


def test_plotting_keeps_the_callers_backend_and_figures(tmp_path: Path) -> None:
    """A notebook user's backend (e.g. inline) must survive gym logging a loss plot."""
    code = f"""
import matplotlib
matplotlib.use("svg")
import matplotlib.pyplot as plt
mine = plt.figure()
from pathlib import Path
from gym.plots import loss_plot
loss_plot({{"sft": [(1, 2.0), (2, 1.0)]}}, Path({str(tmp_path / "loss.png")!r}))
print(matplotlib.get_backend(), plt.get_fignums())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["svg", "[1]"], out.stdout + out.stderr
