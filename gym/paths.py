"""Where gym's shipped data lives: the registry (JSON + Jinja) and package assets."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def registry_dir() -> Path:
    """`$GYM_REGISTRY`, else the repo's registry/ (editable install), else the copy in the wheel."""
    if env := os.environ.get("GYM_REGISTRY"):
        return Path(env)
    for candidate in (_PKG.parent / "registry", _PKG / "_registry"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("gym registry/ not found; set GYM_REGISTRY to its path")


def assets_dir() -> Path:
    return _PKG / "assets"
