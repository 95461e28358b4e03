"""Process-wide settings of a gym process (`gym ...`, `python flows/<name>.py`, a distributed stage's
worker).

Not a command; flows/cli.py, flows/runner.py and gym/train/worker.py call `tune_process` first thing.
Imports nothing heavy, so `gym registry list` stays free of Prefect and torch.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import signal
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

# Full (oldest-generation) collections wait for 100x more young-generation ones than CPython's default 10.
FULL_COLLECTION_THRESHOLD = 1000
# Optional packages that other libraries import eagerly but only a few runs use.
DEFERRED_IMPORTS = ("bitsandbytes",)


def tune_process() -> None:
    """What a gym command's process sets first: the collector's thresholds, deferred and skipped
    imports, and a quiet interpreter teardown after `gym.cli.exit_process`."""
    tune_collector()
    defer_imports()
    skip_unused_imports()
    index_distributions_once()
    atexit.register(_quiet_native_teardown)  # registered first, so it runs after every other exit handler


def _quiet_native_teardown() -> None:
    """Send the interpreter's teardown messages to /dev/null when the final collection is skipped.

    `gym.cli.exit_process` freezes every object so that the interpreter's exit does not spend 1-2.5 s
    collecting them. Triton's compiled module (imported by torch wherever Triton is installed: every
    CUDA build of torch, and Liger's dependency) then prints a nanobind "leaked instances" report of
    hundreds of lines as it is torn down: not a fault of the run, which is over. Triton's own worker
    processes silence the same report the same way. Runs after all other exit handlers (Prefect's,
    MLflow's), whose messages still show; only when objects are frozen and Triton is loaded.

    Ctrl-C pressed again while the process ends (people press it several times) must not stop it half
    way: the interrupt was printed as "Exception ignored in atexit callback" with its traceback, and
    then the report this function keeps off the console. So a KeyboardInterrupt here is set aside,
    further ones are ignored (the run is over), and the teardown is silenced all the same.
    """
    try:
        _silence_teardown()
    except KeyboardInterrupt:
        with contextlib.suppress(BaseException):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        with contextlib.suppress(BaseException):
            _silence_teardown(flush=False)  # what was cut short may have been a flush: not again


def _silence_teardown(flush: bool = True) -> None:
    if not gc.get_freeze_count() or "triton._C.libtriton" not in sys.modules:
        return
    for stream in (sys.stdout, sys.stderr) if flush else ():
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)


def tune_collector() -> None:
    """Hold back the garbage collector's full collections; young objects are collected as usual.

    A run imports Prefect, MLflow, torch, transformers and TRL over its first seconds, ~1M long-lived
    objects. With CPython's default thresholds that growth sets off ~10 full collections, each walking
    the whole heap and finding next to nothing (modules are not garbage): 1.3-2 s of CPU here, about a
    fifth of the imports' cost. Short-lived cycles still die in the young generations, and full
    collections still come, just less often. (Training itself runs with the older objects frozen out of
    the collector: gym.train.speed.gc_frozen.)
    """
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)


def defer_imports() -> None:
    """Load bitsandbytes when something first uses it, not when peft is imported.

    peft imports bitsandbytes whenever it is installed (gym's `quant` extra), and bitsandbytes wraps
    its kernels in torch.compile at import, which loads TorchInductor: 0.6-1.1 s of CPU in every run,
    though only QLoRA (and peft's LoRA layer dispatch) uses it. The package is put in sys.modules with
    its import metadata only (`__name__`, `__file__`, `__spec__`...); the first access to anything else,
    `__path__` included (a submodule import), runs its code in place, so every holder of the module
    then sees the real one. (importlib.util.LazyLoader is not enough: it loads on *any* attribute, and
    inspect.getmodule, which pydantic calls for docstrings, reads `__file__` of every module.)
    A package that is absent stays absent.
    """
    for name in DEFERRED_IMPORTS:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__dict__.pop("__path__", None)  # restored when the code runs
        module.__class__ = _Deferred
        sys.modules[name] = module


def skip_unused_imports() -> None:
    """Keep transformers from importing scikit-learn, which only its assisted generation uses.

    transformers imports `sklearn.metrics.roc_curve` with its generation code (so with every model)
    whenever scikit-learn is installed, to tune assisted generation's confidence threshold (a draft
    model proposing tokens); gym never generates that way. scikit-learn comes with gym's environment
    (MLflow and lm-eval depend on it) and its metrics take 0.5-1 s of CPU to import: paid by every run,
    not by a tool whose environment lacks it. Right after transformers' `import_utils` module has run,
    its `is_sklearn_available` answers False, so the generation code skips that import (and the
    threshold tuning, as it does where scikit-learn is not installed). Everything else that uses
    scikit-learn (lm-eval's metrics, MLflow) imports it as before.
    """
    if "transformers.utils.import_utils" not in sys.modules and not any(
        isinstance(f, _AfterImport) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _AfterImport("transformers.utils.import_utils", _sklearn_unused))


def _sklearn_unused(module: types.ModuleType) -> None:
    if callable(getattr(module, "is_sklearn_available", None)):
        module.is_sklearn_available = _false  # type: ignore[attr-defined]


def _false() -> bool:
    return False


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `patch(module)` once, right after the module `name` has run its code."""

    def __init__(self, name: str, patch: Callable[[types.ModuleType], None]) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once; and the finders after it find the real module
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Patching(spec.loader, self.patch)
        return spec


class _Patching(importlib.abc.Loader):
    """A module loader that runs `patch` on the module after the module's code (else as `loader`)."""

    def __init__(self, loader: Any, patch: Callable[[types.ModuleType], None]) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def index_distributions_once() -> None:
    """Build the import-name -> distribution index (`importlib.metadata.packages_distributions`) once
    per process.

    transformers and TRL each build it as they are imported, reading the file list (RECORD) of every
    installed distribution: ~0.5 s each here, with the ~230 distributions of gym's environment (LLaMA-
    Factory's ~110 take 0.2 s). Nothing installs packages under a running gym process, so the first
    result serves both; every caller gets its own copy, as each call did before (callers may change
    what they get).
    """
    once = importlib.metadata.packages_distributions
    if not isinstance(once, _Once):
        once = importlib.metadata.packages_distributions = _Once(once)
    share_distribution_index()


def share_distribution_index() -> None:
    """Let the `importlib_metadata` backport (the PyPI copy of importlib.metadata), once imported, answer
    with the index a gym process keeps (`index_distributions_once`; nothing changes in a process that
    keeps none). MLflow asks the backport for it as it logs a model, to warn about requirement
    mismatches: another 0.5 s scan otherwise."""
    once = importlib.metadata.packages_distributions
    backport = sys.modules.get("importlib_metadata")
    if isinstance(once, _Once) and backport is not None:
        backport.packages_distributions = once  # type: ignore[attr-defined]


class _Once:
    """A no-argument function returning a mapping of lists, computed on the first call; later calls
    get a copy of that result."""

    def __init__(self, function: Callable[[], Any]) -> None:
        self.__wrapped__ = function
        self.__doc__ = function.__doc__
        self._lock = threading.Lock()
        self._result: dict[str, list[str]] | None = None

    def __call__(self) -> dict[str, list[str]]:
        with self._lock:
            if self._result is None:
                self._result = {k: list(v) for k, v in self.__wrapped__().items()}
        return {k: list(v) for k, v in self._result.items()}


_LOADING = threading.RLock()


class _Deferred(types.ModuleType):
    """A module whose code has not run yet; `__getattr__` is only called for names not yet set."""

    def __getattr__(self, attr: str) -> Any:
        with _LOADING:
            if type(self) is _Deferred:
                spec = self.__spec__
                assert spec is not None and spec.loader is not None
                self.__class__ = types.ModuleType  # type: ignore[assignment] # from here on, a plain (partly initialised) module
                if spec.submodule_search_locations is not None:
                    self.__path__ = spec.submodule_search_locations
                try:
                    spec.loader.exec_module(self)
                except BaseException:
                    sys.modules.pop(spec.name, None)  # as a failed import leaves it: absent
                    raise
        return getattr(self, attr)
