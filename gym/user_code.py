"""Functions a user names by dotted path (`pkg.module:function` or `pkg.module.function`): reward functions,
multi-turn environments, evaluation metrics.

A module that cannot be imported, for whatever reason (missing, a syntax error, an exception it raises
while importing), is a ConfigError naming the spec and where it failed, before any model loads. A module in
the folder the command runs from imports as it does under `python -m` (a console script such as `gym` does
not put that folder on `sys.path` itself); an installed module of the same name comes first. A file path
(`./my_rewards.py:fn`, `src/my_rewards:fn`) is no module name: it is refused, naming the module to give.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym.errors import ConfigError


def split_spec(spec: str) -> tuple[str, str]:
    """(module, attribute) of `pkg.module:function` or `pkg.module.function` ('' where missing)."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    return module_name, attr


def load_callable(spec: str, what: str, hint: str = "pkg.module:function") -> Callable[..., Any]:
    """The function `spec` names; `what` names its role in messages ("reward", "metric", ...)."""
    if (advice := _file_path_advice(spec, what)) is not None:
        raise advice
    module_name, attr = split_spec(spec)
    if not module_name or not attr:
        raise ConfigError(f"{what} {spec!r}: expected a dotted path to a function, like {hint}")
    module = _import(module_name, spec, what)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{what} {spec!r}: module {module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def _file_path_advice(spec: str, what: str) -> ConfigError | None:
    """The error for a spec naming a file (`./my_rewards.py:fn`: a `/` or a `.py` ending) instead of a
    module: the module name to give instead, importable from the current directory where the file is
    under it (else from its folder, put on PYTHONPATH). None for a spec that names no file."""
    path, sep, attr = spec.partition(":")
    if not ("/" in path or "\\" in path or path.endswith(".py")):
        return None
    file = Path(os.path.abspath(Path(path).expanduser()))
    stem = file.with_suffix("") if file.suffix == ".py" else file
    function = attr if sep and attr else "function"
    try:
        parts = stem.relative_to(os.getcwd()).parts
        where = "importable from the current directory"
    except ValueError:  # outside the current directory: by its own name, from its folder
        parts = (stem.name,)
        where = f"importable with its folder {stem.parent} on PYTHONPATH"
    module = ".".join(parts) if parts and all(p.isidentifier() for p in parts) else "my_module"
    return ConfigError(
        f"{what} {spec!r}: {path!r} is a file path, not a module: give a module name {where}, like "
        f"{module}:{function}"
    )


def _import(module_name: str, spec: str, what: str) -> Any:
    try:
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            here = os.getcwd()
            top = module_name.split(".", 1)[0]
            if e.name != top or here in sys.path or "" in sys.path:
                raise
            sys.path.append(here)  # as `python -m` would find it; installed modules keep precedence
            return importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"{what} {spec!r}: cannot import module {module_name!r} ({e}); install it or put its folder on "
            "PYTHONPATH"
        ) from None
    except SyntaxError as e:
        raise ConfigError(
            f"{what} {spec!r}: module {module_name!r} has a syntax error at {e.filename}:{e.lineno} ({e.msg})"
        ) from None
    except Exception as e:  # the module's own code failed while importing
        frames = traceback.extract_tb(e.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        raise ConfigError(
            f"{what} {spec!r}: importing module {module_name!r} raised {type(e).__name__}{where}: {e}"
        ) from None
