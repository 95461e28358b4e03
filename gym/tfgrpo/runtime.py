"""What a Training-Free GRPO run holds while it runs: settings, the three LLM roles bound to the
call cache and the cost ledger, and the run directory.

    rt = Runtime(settings, model="gym-tiny", dataset=digest)             # clients from the settings
    rt = Runtime(settings, model=None, clients={"policy": c, "optimizer": o}, run_dir=path)  # given

`config_hash` covers what decides the run's learning (settings, who answers each role and how it
samples, the dataset, the library it starts from when not an empty one); the run directory is named
by it unless given, so a changed setting never resumes into another run's steps. `with_start` decides
whether a run starts from a library it is given (`experience_lib_path`'s, `ExperienceManager`'s): not
when that library is the output of the same run (re-running a command that writes to
`experience_lib_path` resumes its run instead of learning on from its own output): the library the
same run without it ended with, or one whose file records (`origin`) a run this command makes again.
`refresh` (gym train's --refresh-cache) asks every call again instead of reading the call cache, and
redoes every step instead of reading finished ones back.

Roles without an endpoint run their model locally; one local model is loaded once per process,
whichever roles use it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from gym import workspace
from gym.errors import GymError
from gym.hashing import hash_obj
from gym.tfgrpo.calls import CallCache, Caller, Ledger
from gym.tfgrpo.clients import LLMClient, LocalClient, OpenAIClient
from gym.tfgrpo.config import ROLES, ResolvedRole, TfGrpoSettings
from gym.tfgrpo.data import Question
from gym.tfgrpo.library import Library
from gym.tfgrpo.retrieval import Retriever, select

logger = logging.getLogger("gym.train")
_LOCAL: dict[tuple[str, str | None, bool], LocalClient] = {}
_LOCAL_LOCK = threading.Lock()
SPEND_FILE = "spend.json"  # in the run directory: tokens and cost its paid calls used, all invocations


def default_cache_dir() -> Path:
    """Calls are content-addressed, so every run of the workspace can share one cache."""
    return workspace.path("runs", "tfgrpo", "calls")


def client_for(role: ResolvedRole, template: str | None = None, trust_remote_code: bool = False) -> LLMClient:
    if role.endpoint:
        return OpenAIClient(
            role.endpoint,
            role.model,
            api_key_env=role.api_key_env,
            timeout_s=role.timeout_s,
            max_retries=role.max_retries,
            concurrency=role.concurrency,
            max_n=role.max_n,
        )
    with _LOCAL_LOCK:
        key = (role.model, template, trust_remote_code)
        if key not in _LOCAL:
            _LOCAL[key] = LocalClient(role.model, template=template, trust_remote_code=trust_remote_code)
        return _LOCAL[key]


class Runtime:
    def __init__(
        self,
        settings: TfGrpoSettings,
        *,
        model: str | None,
        run_dir: Path | None = None,
        dataset: str = "",
        clients: Mapping[str, LLMClient] | None = None,
        cache_dir: Path | None = None,
        template: str | None = None,
        trust_remote_code: bool = False,
        start: Library | None = None,
        refresh: bool = False,
    ) -> None:
        self.settings, self.model, self.refresh = settings, model, refresh
        self.start = start if start is not None and start.items else None  # the library it starts from
        self.cache = CallCache(cache_dir or default_cache_dir(), read=not refresh)
        self.ledger = Ledger(settings.budget_tokens, settings.budget_usd)
        given = dict(clients or {})
        callers = {}
        for name in ROLES:
            role = settings.role(name, model or _identity_of(given.get(name) or given.get("policy")))
            client = given.get(name) or (given.get("policy") if not _configured(settings, name) else None)
            client = client or client_for(role, template, trust_remote_code)
            callers[name] = Caller(client, role, self.cache, self.ledger)
        self.policy, self.optimizer, self.judge = callers["policy"], callers["optimizer"], callers["judge"]
        # A local policy trained with a default system message: its prompts open with it, as the served
        # model's will (a model behind an endpoint applies its own).
        self.default_system: str | None = getattr(self.policy.client, "default_system", None)
        self.config_hash = hash_obj(
            {
                "settings": settings.learning_fields(),
                "dataset": dataset,
                "roles": {
                    name: {
                        "model": c.client.identity,
                        **c.role.model_dump(include={"temperature", "max_tokens"}),
                    }
                    for name, c in callers.items()
                },
                "max_n": self.policy.max_n,
                **({"start": self.start.content_hash()} if self.start is not None else {}),
            }
        )
        self.run_dir = (
            Path(run_dir) if run_dir is not None else workspace.path("runs", "tfgrpo", self.config_hash)
        )
        self.ledger.attach(self.run_dir / SPEND_FILE)  # budgets are the run's, over every invocation
        self._retriever = Retriever()  # loads its model on first use

    @property
    def origin(self) -> dict[str, str | None]:
        """What a library this run writes records of it: its config hash and the library it started
        from (with_start finds the run again from them)."""
        return {"config_hash": self.config_hash, "start": self.start.content_hash() if self.start else None}

    def experiences_for(self, question: Question, library: Library) -> list[str]:
        """The experience texts injected for `question`: all of them, or the top-k most similar."""
        return select(question.text, library.texts, self.settings.retrieval_top_k, self._retriever)


def _configured(settings: TfGrpoSettings, name: str) -> bool:
    role = getattr(settings, name)
    return role.endpoint is not None or role.model is not None


def _identity_of(client: LLMClient | None) -> str | None:
    return client.identity if client is not None else None


def with_start(
    make: Callable[[Library | None], Runtime],
    initial: Library | None,
    written_by: Mapping[str, str | None] | None = None,
    versions: Path | None = None,
) -> Runtime:
    """`make(start)`'s Runtime, starting from `initial` unless it is empty or is this run's own output
    (written to `experience_lib_path` by a previous run of the same command): the final library of the
    same run started without it, or a library whose file records (`written_by`, Runtime.origin) a run
    that `make` makes again from the library that run started from (found by its hash among
    `versions`, `experience_lib_path`'s versions/ folder, or in that run's directory). Then the run
    resumes as it was."""
    plain = make(None)
    if initial is None or not initial.items:
        return plain
    final = plain.run_dir / "library.json"
    if final.is_file() and Library.load(final).content_hash() == initial.content_hash():
        return plain
    own = _own_run(make, plain, written_by, versions)
    if own is not None:
        return own
    logger.warning(
        "TF-GRPO starts from the library given (%d experiences, version %d, %s), not an empty one: its "
        "run is a new one, and its `before` evaluation scores that library",
        len(initial.items),
        initial.version,
        initial.content_hash()[:12],
    )
    return make(initial)


def _own_run(
    make: Callable[[Library | None], Runtime],
    plain: Runtime,
    written_by: Mapping[str, str | None] | None,
    versions: Path | None,
) -> Runtime | None:
    """The Runtime of the run that wrote the library (`written_by`), when `make` makes that run again."""
    if not written_by or not written_by.get("config_hash"):
        return None
    if written_by["config_hash"] == plain.config_hash:
        return plain
    start = written_by.get("start")
    if not start:
        return None
    folders = [versions] if versions is not None else []
    folders.append(plain.run_dir.parent / str(written_by["config_hash"]) / "libraries")
    for folder in folders:
        for path in sorted(folder.glob(f"v*-{start}.json")):
            try:
                library = Library.load(path)
            except GymError:
                continue
            rt = make(library)
            if rt.config_hash == written_by["config_hash"]:
                return rt
    return None
