"""Export a trained model directory to a user-chosen path (atomically, never clobbering user files)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gym import workspace
from gym.errors import ConfigError

MARKER = "gym_model.json"


def export_model(model_dir: Path, output_dir: Path) -> Path:
    """Copy `model_dir` to `output_dir`. An existing `output_dir` is replaced only if gym wrote it."""
    output_dir = Path(output_dir).expanduser().resolve()
    if output_dir.exists() and any(output_dir.iterdir()) and not (output_dir / MARKER).is_file():
        raise ConfigError(
            f"output_dir {output_dir} exists and was not written by gym; choose an empty or new directory"
        )
    staged = output_dir.with_name(f".{output_dir.name}.export")
    shutil.rmtree(staged, ignore_errors=True)
    with workspace.atomic_dir(staged) as tmp:
        shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
    if output_dir.exists():
        old = output_dir.with_name(f".{output_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        output_dir.rename(old)
        staged.rename(output_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staged.rename(output_dir)
    return output_dir
