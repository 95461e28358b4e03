"""The README's "Python, without Prefect" example runs as written (fewer steps) and trains.

Run: .venv/bin/pytest tests/test_readme_python.py
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def example(after: str) -> str:
    """The first ```python block after the line `after`."""
    text = README.read_text()
    found = re.search(re.escape(after) + r"\s*```python\n(.*?)```", text, re.S)
    assert found, f"README has no python block after {after!r}"
    return found.group(1)


def test_the_python_example_trains_the_embedded_model(gym_home, capsys):
    code = example("Python, without Prefect:")
    assert "max_steps=100" in code
    namespace: dict = {}
    exec(compile(code.replace("max_steps=100", "max_steps=20"), str(README), "exec"), namespace)
    result = namespace["result"]
    assert result.global_step == 20 and result.metric_name == "loss"
    assert result.metric_last < result.metric_first
    assert Path(result.model_dir, "model.safetensors").is_file()
    printed = capsys.readouterr().out.split()
    assert printed == [str(result.metric_first), "->", str(result.metric_last), result.model_dir]
