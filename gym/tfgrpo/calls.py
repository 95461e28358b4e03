"""Content-addressed LLM calls: an on-disk cache, a cost ledger with a budget guard, and roles.

Every call is keyed by what decides its answer (who answers, the messages, temperature, max
tokens, seed, n), so a run killed at any point resumes without paying for a call twice, and a
changed setting never reuses a stale answer. Entries are written atomically; a failed call is not
stored (a retry calls again). The ledger counts what was paid in this process, per stage, and
refuses new paid calls once a budget is spent (`BudgetExceeded`: the run stops and resumes later).

    caller = Caller(client, role, cache, ledger)
    record = caller("summarize", messages, seed=7)      # record.text / record.error, record.usage
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from pydantic import BaseModel

from gym import workspace
from gym.errors import GymError
from gym.hashing import hash_obj
from gym.tfgrpo.clients import Completion, LLMClient, LLMError, Messages, Usage
from gym.tfgrpo.config import ResolvedRole


class BudgetExceeded(GymError):
    """The run's token or cost budget is spent; raise it to resume where it stopped."""


class CallRecord(BaseModel):
    """One call as a step manifest records it: deterministic fields only (no timing, no cache hits)."""

    stage: str
    key: str
    texts: list[str] | None = None
    error: str | None = None
    usage: Usage = Usage()
    cost: float = 0.0

    @property
    def text(self) -> str | None:
        return self.texts[0] if self.texts else None


def call_key(
    identity: str, messages: Messages, temperature: float, max_tokens: int, seed: int, n: int
) -> str:
    return hash_obj(
        {"model": identity, "messages": messages, "t": temperature, "max": max_tokens, "seed": seed, "n": n},
        length=32,
    )


class CallCache:
    """`<root>/<key[:2]>/<key>.json`: the request and its completion. `read=False` reads nothing (every
    call is made again) and still records the new answers."""

    def __init__(self, root: Path, read: bool = True) -> None:
        self.root, self.read = Path(root), read

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> Completion | None:
        path = self._path(key)
        if not self.read or not path.is_file():
            return None
        try:
            return Completion.model_validate(json.loads(path.read_text(encoding="utf-8"))["completion"])
        except (ValueError, KeyError):
            return None  # unreadable entry: call again and overwrite it

    def put(self, key: str, request: dict[str, object], completion: Completion) -> None:
        workspace.atomic_write_json(
            self._path(key), {"request": request, "completion": completion.model_dump(mode="json")}
        )


class StageTally(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0


class Ledger:
    """Paid calls of this process, per stage, with an optional budget (thread-safe).

    The budget is the run's: once `attach`ed to the run's spend file, what earlier invocations of the
    same run paid counts too (a run stopped at its budget and started again with the same budget stops
    at once; raising the budget to N lets the run spend N in all)."""

    def __init__(self, max_tokens: int | None = None, max_usd: float | None = None) -> None:
        self.max_tokens, self.max_usd = max_tokens, max_usd
        self.stages: dict[str, StageTally] = {}
        self.cached = 0
        self._lock = threading.Lock()
        self._spend_file: Path | None = None
        self._before_tokens, self._before_usd = 0, 0.0  # paid by earlier invocations of the run

    def attach(self, spend_file: Path) -> None:
        """Count what the run's earlier invocations paid (`spend_file`), and keep it up to date."""
        try:
            before = json.loads(spend_file.read_text(encoding="utf-8"))
            tokens, usd = int(before["tokens"]), float(before["cost_usd"])
        except (OSError, ValueError, TypeError, KeyError):  # none yet (or unreadable: start from zero)
            tokens, usd = 0, 0.0
        with self._lock:
            self._spend_file, self._before_tokens, self._before_usd = spend_file, tokens, usd

    @property
    def run_tokens(self) -> int:
        """Tokens the run's paid calls used, this invocation's and earlier ones'."""
        return self._before_tokens + self.tokens

    @property
    def run_cost(self) -> float:
        return self._before_usd + self.cost

    @property
    def tokens(self) -> int:
        return sum(t.prompt_tokens + t.completion_tokens for t in self.stages.values())

    @property
    def cost(self) -> float:
        return sum(t.cost for t in self.stages.values())

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.stages.values())

    def check(self) -> None:
        with self._lock:
            run = " by the run's paid calls so far" if self._before_tokens or self._before_usd else ""
            if self.max_tokens is not None and self.run_tokens >= self.max_tokens:
                raise BudgetExceeded(
                    f"token budget spent ({self.run_tokens} of {self.max_tokens}{run}); raise "
                    "--budget_tokens (the run's total) and run again to resume"
                )
            if self.max_usd is not None and self.run_cost >= self.max_usd:
                raise BudgetExceeded(
                    f"cost budget spent (${self.run_cost:.4f} of ${self.max_usd}{run}); raise --budget_usd "
                    "(the run's total) and run again to resume"
                )

    def record(self, stage: str, usage: Usage, cost: float) -> None:
        with self._lock:
            tally = self.stages.setdefault(stage, StageTally())
            tally.calls += 1
            tally.prompt_tokens += usage.prompt_tokens
            tally.completion_tokens += usage.completion_tokens
            tally.cost += cost
            if self._spend_file is not None:
                spent = {"tokens": self.run_tokens, "cost_usd": round(self.run_cost, 9)}
                workspace.atomic_write_json(self._spend_file, spent)

    def hit(self) -> None:
        with self._lock:
            self.cached += 1

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "calls": sum(t.calls for t in self.stages.values()),
                "cached_calls": self.cached,
                "tokens": sum(t.prompt_tokens + t.completion_tokens for t in self.stages.values()),
                "cost_usd": round(sum(t.cost for t in self.stages.values()), 6),
                "stages": {k: v.model_dump() for k, v in sorted(self.stages.items())},
            }


class Caller:
    """A client bound to its role, the call cache and the ledger."""

    def __init__(self, client: LLMClient, role: ResolvedRole, cache: CallCache, ledger: Ledger) -> None:
        self.client, self.role, self.cache, self.ledger = client, role, cache, ledger

    @property
    def max_n(self) -> int:
        return min(self.client.max_n, self.role.max_n)

    def cost_of(self, usage: Usage) -> float:
        return (
            usage.prompt_tokens * self.role.price_prompt
            + usage.completion_tokens * self.role.price_completion
        ) / 1e6

    def __call__(self, stage: str, messages: Messages, *, seed: int, n: int = 1) -> CallRecord:
        role = self.role
        key = call_key(self.client.identity, messages, role.temperature, role.max_tokens, seed, n)
        completion = self.cache.get(key)
        if completion is not None:
            self.ledger.hit()
        else:
            self.ledger.check()
            try:
                completion = self.client.complete(
                    messages, temperature=role.temperature, max_tokens=role.max_tokens, seed=seed, n=n
                )
            except LLMError as exc:
                return CallRecord(stage=stage, key=key, error=str(exc))
            self.ledger.record(stage, completion.usage, self.cost_of(completion.usage))
            request = {"model": self.client.identity, "messages": messages, "seed": seed, "n": n,
                       "temperature": role.temperature, "max_tokens": role.max_tokens}  # fmt: skip
            self.cache.put(key, request, completion)
        return CallRecord(
            stage=stage,
            key=key,
            texts=completion.texts,
            usage=completion.usage,
            cost=self.cost_of(completion.usage),
        )
