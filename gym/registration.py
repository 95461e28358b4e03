"""Registering a model in MLflow's registry: one version per distinct content, lineage tags, the
model card as the version's description, and an alias (`challenger` by default) on it.

Registering content that an existing version already holds (a re-run of an unchanged flow, the
same folder twice) adds no version: the alias moves to the existing one and the result says
`reused=True`. Content is compared by a digest of every file in the model directory.

`record_scores` adds scores measured later (flows/evaluate.py on `models:/name@alias`) to the version
that was evaluated: its `score.*` tags, its lineage record and its model card.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from gym import tracking
from gym.card import render
from gym.errors import ConfigError
from gym.hashing import hash_dir
from gym.lineage import LINEAGE_TAG, SCORE_PREFIX, SETUP_PREFIX, Lineage

CONTENT_TAG = "content_digest"


class Registered(BaseModel):
    """The version an alias points to after registering."""

    name: str
    version: str
    alias: str
    reused: bool = Field(description="True when an existing version with identical content was reused.")
    content_digest: str


CHAMPION = "champion"  # moved only by gym.promotion, when a version wins


def check_names(register_as: str | None = None, alias: str | None = None) -> None:
    """A flow's registered-model name and alias, by MLflow's own rules, before any work: a name MLflow
    refuses failed the flow after training, leaving a version without its alias. The champion alias
    is refused: registering under it skipped the promotion gate."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils import validation

    if alias == CHAMPION:
        raise ConfigError(
            f"output.alias {CHAMPION!r}: the champion moves only when a version wins a promotion; register "
            "as challenger (the default) and set output.promote_metric (or run gym promote)"
        )
    checks = []
    if alias is not None:
        checks += [
            ("output.alias", alias, validation._validate_model_alias_name),
            ("output.alias", alias, validation._validate_model_alias_name_reserved),
        ]
    if register_as is not None:
        checks.append(("output.register_as", register_as, validation._validate_model_name))
    for field, value, validate in checks:
        try:
            validate(value)
        except MlflowException as exc:
            raise ConfigError(f"{field} {value!r}: {exc.message.rstrip('.')}; give another") from None


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
    with tracking.registering(name, uri):
        return _register(Path(model_dir), name, lineage, run_id, alias, uri, digest)


def _register(
    model_dir: Path, name: str, lineage: Lineage, run_id: str, alias: str, uri: str | None, digest: str
) -> Registered:
    existing = tracking.find_version_by_tag(name, CONTENT_TAG, digest, uri)
    if existing is not None:
        if not tracking.version_description(name, existing, uri):  # a registration killed before its card
            tracking.set_version_description(name, existing, render(name, lineage), uri)
        tracking.set_alias(name, alias, existing, uri)
        if lineage.flow_run_id:
            tracking.set_version_tags(name, existing, {"gym.last_registered_by": lineage.flow_run_id}, uri)
        # A re-run that measured something the version lacks (a benchmark added) adds it; what the
        # version already holds stays as first measured.
        _update_scores(name, existing, lineage.scores, lineage.score_setups, uri, replace=False)
        return Registered(name=name, version=existing, alias=alias, reused=True, content_digest=digest)
    tags = {**lineage.tags(), CONTENT_TAG: digest}
    version = tracking.register_model(run_id, model_dir, name, tags, alias=alias, uri=uri)
    tracking.set_version_description(name, version, render(name, lineage), uri)
    return Registered(name=name, version=version, alias=alias, reused=False, content_digest=digest)


def evaluated_version(model_uri: str, model_digest: str) -> tuple[str, str]:
    """(name, version) of the registered version a ModelRef resolved from `model_uri` holds: the one
    the alias points to now, or, if it moved since, the version whose reference digest matches."""
    from gym.models import mlflow_digest

    name, version, run_id, _ = tracking.resolve_model_uri(model_uri)
    if mlflow_digest(name, version, run_id) == model_digest:
        return name, version
    for other, other_run, _ in tracking.list_versions(name):
        if mlflow_digest(name, other, other_run) == model_digest:
            return name, other
    raise ConfigError(f"{model_uri}: the evaluated version is no longer registered; scores not recorded")


def record_scores(
    name: str,
    version: str,
    scores: dict[str, float],
    setups: dict[str, str],
    evaluated_by: str | None = None,
    uri: str | None = None,
) -> Lineage:
    """Record scores measured on an existing version (a later evaluation replaces an earlier score of
    the same name); its card is rewritten to show them. Returns the version's updated lineage."""
    extra = {"gym.last_evaluated_by": evaluated_by} if evaluated_by else {}
    return _update_scores(name, version, scores, setups, uri, replace=True, extra=extra)


def _update_scores(
    name: str,
    version: str,
    scores: dict[str, float],
    setups: dict[str, str],
    uri: str | None,
    replace: bool,
    extra: dict[str, str] | None = None,
) -> Lineage:
    tags = tracking.resolve_model_uri(f"models:/{name}/{version}", uri=uri)[3]
    current = Lineage.from_tags(tags)
    if not replace:
        scores = {k: v for k, v in scores.items() if k not in current.scores}
        setups = {k: v for k, v in setups.items() if k in scores}
    if not scores and not extra:
        return current
    updated = current.model_copy(
        update={"scores": {**current.scores, **scores}, "score_setups": {**current.score_setups, **setups}}
    )
    new_tags: dict[str, str] = {**(extra or {})}
    new_tags.update({f"{SCORE_PREFIX}{k}": repr(float(v)) for k, v in scores.items()})
    new_tags.update({f"{SETUP_PREFIX}{k}": v for k, v in setups.items()})
    if LINEAGE_TAG in tags:  # versions registered before the lineage record existed keep their shape
        new_tags[LINEAGE_TAG] = updated.model_dump_json()
    tracking.set_version_tags(name, version, new_tags, uri)
    if scores:
        tracking.set_version_description(name, version, render(name, updated), uri)
    return updated
