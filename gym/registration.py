"""Registering a model in MLflow's registry: one version per distinct content, lineage tags, the
model card as the version's description, and an alias (`challenger` by default) on it.

Registering content that an existing version already holds (a re-run of an unchanged flow, the
same folder twice) adds no version: the alias moves to the existing one and the result says
`reused=True`. Content is compared by a digest of every file in the model directory.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from gym import tracking
from gym.card import render
from gym.hashing import hash_dir
from gym.lineage import Lineage

CONTENT_TAG = "content_digest"


class Registered(BaseModel):
    """The version an alias points to after registering."""

    name: str
    version: str
    alias: str
    reused: bool = Field(description="True when an existing version with identical content was reused.")
    content_digest: str


def register(
    model_dir: Path,
    name: str,
    lineage: Lineage,
    run_id: str,
    alias: str = "challenger",
    uri: str | None = None,
) -> Registered:
    """Register `model_dir` (full, merged weights) as a version of `name` and point `alias` at it."""
    digest = hash_dir(Path(model_dir))
    existing = tracking.find_version_by_tag(name, CONTENT_TAG, digest, uri)
    if existing is not None:
        tracking.set_alias(name, alias, existing, uri)
        if lineage.flow_run_id:
            tracking.set_version_tags(name, existing, {"gym.last_registered_by": lineage.flow_run_id}, uri)
        return Registered(name=name, version=existing, alias=alias, reused=True, content_digest=digest)
    tags = {**lineage.tags(), CONTENT_TAG: digest}
    version = tracking.register_model(run_id, Path(model_dir), name, tags, alias=alias, uri=uri)
    tracking.set_version_description(name, version, render(name, lineage), uri)
    return Registered(name=name, version=version, alias=alias, reused=False, content_digest=digest)
