"""The papers' semantic extractor: Training-Free GRPO's three LLM stages, one call each.

    from gym.train.grpo.semantic_extractor import SemanticExtractor
    extractor = SemanticExtractor(APIModelAdapter.deepseek())          # any gym LLM client
    summary = extractor.summarize_trajectory(question, attempt, reward=1.0, reference="42")
    ops = extractor.extract_group_advantage(question, [s1, s2, s3], [1.0, 0.0, 0.0], em.library)
    final = extractor.consolidate_batch(em.library, [ops, other_ops])
    em.apply_operations(final)

The prompts, the tolerant parser, the repair retry and the call cache are the ones training uses
(gym.tfgrpo.prompts / parse / stages / calls); `last_errors` holds what the parser could not use
in the last extract or consolidate call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gym.tfgrpo import prompts
from gym.tfgrpo.calls import CallCache, Caller, Ledger
from gym.tfgrpo.clients import LLMClient
from gym.tfgrpo.config import RoleSettings, TfGrpoSettings
from gym.tfgrpo.library import Library
from gym.tfgrpo.ops import Op
from gym.tfgrpo.parse import parse_ops
from gym.tfgrpo.runtime import default_cache_dir
from gym.tfgrpo.stages import ask_for_ops


def _library(library: Any) -> Library:
    if library is None:
        return Library()
    return library if isinstance(library, Library) else library.library  # an ExperienceManager


class SemanticExtractor:
    """Training-Free GRPO's three LLM stages, one call each, with the optimizer LLM `llm`: summarize one
    attempt (`summarize_trajectory`), propose operations from a group's better and worse attempts
    (`extract_group_advantage`), and merge a batch's proposals into one consistent set
    (`consolidate_batch`). Calls go through gym's call cache (`cache_dir`, else the workspace's): one asked
    before is read from it, not paid again; `ledger` tallies the paid ones, and `last_errors` holds what
    the parser could not use in the last extract or consolidate call."""

    def __init__(
        self,
        llm: LLMClient,
        *,
        temperature: float = 0.3,
        max_tokens: int = 1024,
        max_ops: int = 3,
        seed: int = 0,
        cache_dir: str | Path | None = None,
    ) -> None:
        settings = TfGrpoSettings(optimizer=RoleSettings(temperature=temperature, max_tokens=max_tokens))
        role = settings.role("optimizer", llm.identity)
        self.ledger = Ledger()
        self.caller = Caller(
            llm, role, CallCache(Path(cache_dir) if cache_dir else default_cache_dir()), self.ledger
        )
        self.max_ops, self.seed = max_ops, seed
        self.last_errors: list[str] = []

    def summarize_trajectory(
        self, question: str, trajectory: str, reward: float, reference: str | None = None, library: Any = None
    ) -> str:
        """Stage 1: which approach, which experiences, where it went wrong, the outcome."""
        messages = prompts.summarize_messages(question, trajectory, reward, reference, _library(library))
        record = self.caller("summarize", messages, seed=self.seed)
        return (record.text or "").strip()

    def extract_group_advantage(
        self, question: str, summaries: list[str], rewards: list[float], library: Any = None
    ) -> list[Op]:
        """Stage 2: compare better and worse attempts; at most `max_ops` proposed operations."""
        lib = _library(library)
        messages = prompts.extract_messages(
            question, list(zip(summaries, rewards, strict=True)), lib, self.max_ops
        )
        out = ask_for_ops(self.caller, "extract", messages, self.seed, lib)
        self.last_errors = out.errors
        return list(out.ops[: self.max_ops])

    def consolidate_batch(self, library: Any, proposals: list[list[Op]]) -> list[Op]:
        """Stage 3: one consistent set of operations from every group's proposals (none if none)."""
        lib = _library(library)
        proposals = [p for p in proposals if p]
        if not proposals:
            self.last_errors = []
            return []
        out = ask_for_ops(
            self.caller, "consolidate", prompts.consolidate_messages(lib, proposals), self.seed, lib
        )
        self.last_errors = out.errors
        return list(out.ops)

    @staticmethod
    def parse_operations(text: str, library: Any = None) -> tuple[list[Op], list[str]]:
        """The tolerant parser: (valid operations, errors); never raises."""
        return parse_ops(text, _library(library).aliases())
