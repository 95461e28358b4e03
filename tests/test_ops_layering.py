"""Layering: the library (gym/) never imports Prefect, flows/ or tasks/; orchestration sits above it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UPPER = ("prefect", "flows", "tasks")


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_library_module_imports_prefect_or_the_layers_above():
    offenders = {
        str(p.relative_to(REPO)): sorted(imported_roots(p) & set(UPPER)) for p in (REPO / "gym").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_using_the_library_loads_no_prefect():
    # What a Python user imports (the README's example) plus the library's commands and services.
    modules = ["gym", "gym.models", "gym.data.ingest", "gym.data.tokenize", "gym.train", "gym.tracking"]
    modules += ["gym.cli", "gym.pipeline", "gym.preflight", "gym.services", "gym.progress", "gym.summary"]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {UPPER!r}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
