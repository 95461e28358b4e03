"""Functions users name by dotted path (rewards, environments, metrics): a module that fails to import for
any reason is one clear error naming the spec and where, and a module in the working folder imports as
`python -m` would find it (the README's `--reward my_pkg.rewards:fn`, run by the `gym` console script)."""

from __future__ import annotations

import sys
import uuid

import pytest

from gym.errors import ConfigError
from gym.eval.generation import resolve_metric
from gym.rewards import load_rewards
from gym.train.rl_common import load_environment
from gym.user_code import load_callable


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """An empty working folder that is not on sys.path (as under the `gym` console script)."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def _module(folder, body: str) -> str:
    name = f"user_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(body)
    return name


def test_a_package_in_the_working_folder_imports_like_python_dash_m(folder):
    pkg = f"pkg_{uuid.uuid4().hex[:8]}"
    (folder / pkg).mkdir()
    (folder / pkg / "__init__.py").write_text("")
    (folder / pkg / "rewards.py").write_text("def fn(completion, answer=None):\n    return 0.5\n")
    rewards, weights = load_rewards([f"{pkg}.rewards:fn"])
    assert [r.spec for r in rewards] == [f"{pkg}.rewards:fn"] and weights == [1.0]
    assert rewards[0](["x"], ["y"]) == [0.5]


def test_a_module_missing_everywhere_still_says_where_to_put_it(folder):
    with pytest.raises(
        ConfigError, match=r"reward 'absent_xyz:fn': cannot import module 'absent_xyz'.*PYTHONPATH"
    ):
        load_rewards(["absent_xyz:fn"])


def test_a_syntax_error_names_the_file_and_line(folder):
    name = _module(folder, "def fn(completion)\n    return 1.0\n")
    with pytest.raises(ConfigError) as e:
        load_rewards([f"{name}:fn"])
    message = str(e.value)
    assert f"reward '{name}:fn'" in message and "syntax error" in message
    assert f"{name}.py:1" in message


def test_an_exception_raised_while_importing_is_named_with_its_line(folder):
    name = _module(folder, "import os\n\nraise RuntimeError('config missing')\n")
    with pytest.raises(ConfigError) as e:
        load_environment(f"{name}:env")
    message = str(e.value)
    assert f"environment '{name}:env'" in message
    assert "RuntimeError" in message and "config missing" in message and f"{name}.py:3" in message


def test_metrics_get_the_same_messages(folder):
    name = _module(folder, "import no_such_dependency_xyz\n")
    with pytest.raises(
        ConfigError, match=rf"metric '{name}:f1': cannot import module '{name}'.*no_such_dependency_xyz"
    ):
        resolve_metric(f"{name}:f1")


def test_a_working_folder_module_does_not_shadow_an_installed_one(folder):
    (folder / "json.py").write_text("def dumps(x):\n    return 'shadowed'\n")
    assert load_callable("json:dumps", "metric")([1]) == "[1]"
