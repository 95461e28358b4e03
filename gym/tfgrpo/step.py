"""One step's record and its commit: apply the final operations, write the manifest atomically.

`steps/<k>/manifest.json` holds the config hash, the library hashes in and out, every rollout and
reward, each stage's outputs (raw replies, operations, errors), what was applied or rejected and
why, token usage and cost per stage, and the status: `done`, or `degraded` when something failed
(a failed call, an unreadable reply even after the repair retry) and only what was valid was
applied. It contains nothing that depends on timing or on which calls came from the cache, so two
runs over the same answers write the same bytes. The library version is written before the
manifest, so a manifest on disk always points at a library that exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from gym import workspace
from gym.tfgrpo.calls import StageTally
from gym.tfgrpo.data import StepPlan
from gym.tfgrpo.library import Library
from gym.tfgrpo.ops import Op, Rejected, apply
from gym.tfgrpo.stages import CallInfo, Rollout, StageOutput


class GroupRecord(BaseModel):
    question: str
    rollouts: list[Rollout]
    rewards: list[float | None]
    informative: bool
    reason: str
    summaries: list[str | None] = []
    extraction: StageOutput | None = None
    calls: list[CallInfo] = []


class StepManifest(BaseModel):
    step: int
    epoch: int
    batch: int
    attempt: int
    config_hash: str
    library_in: str
    library_out: str
    version_in: int
    version_out: int
    groups: list[GroupRecord]
    consolidation: StageOutput | None
    final_ops_from: Literal["nothing proposed", "consolidation", "proposals"]
    applied: list[Op]
    rejected: list[Rejected]
    usage: dict[str, StageTally]
    status: Literal["done", "degraded"]
    problems: list[str]

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.usage.values())

    @property
    def tokens(self) -> int:
        return sum(t.prompt_tokens + t.completion_tokens for t in self.usage.values())


def manifest_path(run_dir: Path, index: int) -> Path:
    return Path(run_dir) / "steps" / f"{index:04d}" / "manifest.json"


def library_path(run_dir: Path, version: int, content_hash: str) -> Path:
    """Every version the run produced (a redone step may produce another library of one version)."""
    return Path(run_dir) / "libraries" / f"v{version:04d}-{content_hash}.json"


def usage_of(calls: list[CallInfo]) -> dict[str, StageTally]:
    usage: dict[str, StageTally] = {}
    for call in calls:
        tally = usage.setdefault(call.stage, StageTally())
        tally.calls += 1
        tally.prompt_tokens += call.prompt_tokens
        tally.completion_tokens += call.completion_tokens
        tally.cost = round(tally.cost + call.cost, 9)
    return dict(sorted(usage.items()))


def problems_of(groups: list[GroupRecord], consolidation: StageOutput | None) -> list[str]:
    problems = []
    for g in groups:
        if g.reason.startswith("incomplete"):
            problems.append(f"question {g.question}: {g.reason}")
        if g.extraction is not None:
            problems += [f"question {g.question}: extract: {e}" for e in g.extraction.errors]
    if consolidation is not None:
        problems += [f"consolidate: {e}" for e in consolidation.errors]
    return problems


def final_ops(
    groups: list[GroupRecord], consolidation: StageOutput | None
) -> tuple[list[Op], Literal["nothing proposed", "consolidation", "proposals"]]:
    """What to apply: the consolidation's operations; if its reply stayed unreadable and gave none,
    the groups' own proposals (validated by `apply` like any other operations)."""
    if consolidation is None:
        return [], "nothing proposed"
    if consolidation.ops or consolidation.ok:
        return list(consolidation.ops), "consolidation"
    return [op for g in groups if g.extraction for op in g.extraction.ops], "proposals"


def commit(
    run_dir: Path,
    step: StepPlan,
    config_hash: str,
    library: Library,
    groups: list[GroupRecord],
    consolidation: StageOutput | None,
) -> tuple[StepManifest, Library]:
    """Apply the step's operations, save the new library version, then write the manifest."""
    ops, source = final_ops(groups, consolidation)
    result = apply(library, ops)
    calls = [c for g in groups for c in g.calls]
    calls += [c for g in groups if g.extraction for c in g.extraction.calls]
    calls += consolidation.calls if consolidation else []
    problems = problems_of(groups, consolidation)
    manifest = StepManifest(
        step=step.index,
        epoch=step.epoch,
        batch=step.batch,
        attempt=step.attempt,
        config_hash=config_hash,
        library_in=library.content_hash(),
        library_out=result.library.content_hash(),
        version_in=library.version,
        version_out=result.library.version,
        groups=groups,
        consolidation=consolidation,
        final_ops_from=source,
        applied=list(result.applied),
        rejected=list(result.rejected),
        usage=usage_of(calls),
        status="degraded" if problems else "done",
        problems=problems,
    )
    if result.changed:
        new = result.library
        new.save(library_path(run_dir, new.version, new.content_hash()))
    workspace.atomic_write_json(manifest_path(run_dir, step.index), manifest.model_dump(mode="json"))
    return manifest, result.library


def load_manifest(run_dir: Path, index: int) -> StepManifest | None:
    path = manifest_path(run_dir, index)
    if not path.is_file():
        return None
    try:
        return StepManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError:
        return None  # unreadable (should not happen: written atomically): redo the step
