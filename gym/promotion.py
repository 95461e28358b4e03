"""Promotion: move the `champion` alias to the `challenger` version only when it beats the champion
on a chosen score by more than a margin, and record why it did or didn't.

    gym promote --name gym-tiny-sft --metric exact_match_after [--margin 0.02] [--mode auto] [--json]

Scores are the `score.<name>` tags of the versions, named as gym/lineage.py documents: written at
registration (exact_match_after, mmlu_after, mmlu_after.stem, dpo_reward_accuracy, sft_loss_last...)
or by a later evaluation of the version (mmlu, exact_match). `--mode auto` (the default): lower wins
for a loss or perplexity, higher for everything else; max or min say it. The challenger is the
version `--challenger` (default `challenger`) points to; a flow passes its `output.alias`. A metric that
neither version has is an error listing the ones they have. The first challenger with the score
becomes champion; a challenger without it, a champion without it, or two benchmark scores measured
differently (other shots or question counts: `score_setup.<name>`) keep the champion where it is.
Every decision is written on the challenger's version as `promotion.*` tags (and, from a flow, a
Prefect artifact).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from gym import tracking
from gym.cli_options import ArgumentParser
from gym.errors import ConfigError
from gym.lineage import HELD_OUT_SETUP, same_setup, scores_of, setups_of
from gym.secrets import link_url

Mode = Literal["max", "min"]
ModeChoice = Literal["auto", "max", "min"]
LOWER_IS_BETTER = ("loss", "perplexity", "ppl")  # in a metric's name: auto compares it with min


def resolve_mode(metric: str, mode: ModeChoice) -> Mode:
    """`mode` as given, or for auto min when the metric's name says it is a loss or perplexity."""
    if mode != "auto":
        return mode
    return "min" if any(word in metric.lower() for word in LOWER_IS_BETTER) else "max"


class Promotion(BaseModel):
    """One promotion decision."""

    name: str
    metric: str
    margin: float
    mode: Mode
    challenger: str
    challenger_score: float | None
    previous_champion: str | None
    champion_score: float | None
    champion: str | None  # where the champion alias points now
    promoted: bool
    reason: str

    @property
    def current_score(self) -> float | None:
        """The score of the version the champion alias points to now."""
        if self.champion == self.challenger:
            return self.challenger_score
        return self.champion_score if self.champion == self.previous_champion else None

    def markdown(self) -> str:
        verdict = "promoted" if self.promoted else "kept the champion"
        before = f"v{self.previous_champion}" if self.previous_champion else "none"
        rows = [
            ("challenger", f"v{self.challenger}", _fmt(self.challenger_score)),
            ("champion before", before, _fmt(self.champion_score)),
            ("champion now", f"v{self.champion}" if self.champion else "none", _fmt(self.current_score)),
        ]
        table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
        return (
            f"## Promotion of `{self.name}`: {verdict}\n\n{self.reason}\n\n"
            f"Metric `{self.metric}` ({'higher' if self.mode == 'max' else 'lower'} is better), "
            f"margin {self.margin}.\n\n| | version | {self.metric} |\n|---|---|---|\n{table}\n"
        )


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def promote(
    name: str,
    metric: str,
    margin: float = 0.0,
    mode: ModeChoice = "auto",
    challenger_alias: str = "challenger",
    champion_alias: str = "champion",
    uri: str | None = None,
) -> Promotion:
    """Decide, move `champion_alias` if the challenger wins, and tag the challenger with the decision."""
    resolved = resolve_mode(metric, mode)
    if challenger_alias == champion_alias:
        raise ConfigError(f"--challenger {challenger_alias!r}: name the alias of the version to judge")
    if not (0 <= margin < math.inf):  # NaN fails both: no comparison with it means anything
        raise ConfigError(f"--margin must be a finite number >= 0, got {margin}")
    tracking.check_store(uri, field="--tracking-uri")
    challenger = tracking.version_by_alias(name, challenger_alias, uri)
    if challenger is None:
        store = link_url(tracking.tracking_uri(uri))  # a login in MLFLOW_TRACKING_URI is not shown
        raise ConfigError(f"{name}@{challenger_alias} does not exist in {store}: register one first")
    version, tags = challenger
    score = scores_of(tags).get(metric)
    current = tracking.version_by_alias(name, champion_alias, uri)
    champion, champion_score = (current[0], scores_of(current[1]).get(metric)) if current else (None, None)
    known = scores_of(tags).keys() | (scores_of(current[1]).keys() if current else set())
    if metric not in known:
        raise ConfigError(
            f"--metric {metric!r}: neither {name}@{challenger_alias} nor {name}@{champion_alias} has "
            f"that score; available: {', '.join(sorted(known)) or 'none (register with evaluations first)'}"
        )
    promoted, reason = _decide(
        version, score, champion, champion_score, metric, margin, resolved, sorted(scores_of(tags))
    )
    if current is not None and champion != version and None not in (score, champion_score):
        # two scores measured differently are not compared, whichever is higher: the reason says so
        same, why = _same_setup(metric, tags, current[1], champion or "", reason)
        promoted, reason = (promoted, reason) if same else (False, why)
    if promoted:
        tracking.set_alias(name, champion_alias, version, uri)
    decision = Promotion(
        name=name,
        metric=metric,
        margin=margin,
        mode=resolved,
        challenger=version,
        challenger_score=score,
        previous_champion=champion,
        champion_score=champion_score,
        champion=version if promoted else champion,
        promoted=promoted,
        reason=reason,
    )
    if champion == version:
        return decision  # nothing decided: its tags keep why (and over which version) it was promoted
    tracking.set_version_tags(
        name,
        version,
        {
            "promotion.decision": "promoted" if promoted else "kept",
            "promotion.reason": reason,
            "promotion.metric": metric,
            "promotion.margin": margin,
            "promotion.compared_with": champion or "none",
            "promotion.time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        uri,
    )
    return decision


def _decide(
    version: str,
    score: float | None,
    champion: str | None,
    champion_score: float | None,
    metric: str,
    margin: float,
    mode: Mode,
    available: list[str],
) -> tuple[bool, str]:
    if score is None:
        have = ", ".join(available) or "none"
        return False, f"challenger v{version} has no {metric!r} score (it has: {have}); champion unchanged"
    if champion == version:
        return False, f"v{version} is already the champion"
    if champion is None:
        return True, f"no champion yet: v{version} ({metric} {score:.4f}) becomes champion"
    if champion_score is None:
        return False, f"champion v{champion} has no {metric!r} score to compare with; champion unchanged"
    gain = score - champion_score if mode == "max" else champion_score - score
    versus = f"{metric} {score:.4f} vs {champion_score:.4f}"
    if gain > margin:
        return True, f"v{version} beats champion v{champion}: {versus} (by {gain:.4f} > margin {margin})"
    return False, f"v{version} does not beat champion v{champion} by more than {margin}: {versus}"


def _same_setup(
    metric: str, challenger: dict[str, str], champion: dict[str, str], champion_version: str, reason: str
) -> tuple[bool, str]:
    """A score compares only with one measured the same way: a benchmark's shots, questions (which, and how
    many) and engine; a held-out metric's number of records (a champion registered before held-out setups
    were recorded is compared as before)."""
    evaluation = metric.split(".", 1)[0]  # mmlu_after.stem was measured by evaluation mmlu_after
    ours, theirs = setups_of(challenger).get(evaluation), setups_of(champion).get(evaluation)
    legacy = theirs is None and (ours or "").startswith(HELD_OUT_SETUP)  # scored before gym recorded how
    if same_setup(ours, theirs) or legacy:
        return True, reason
    return False, (
        f"{metric} was measured differently on the challenger ({ours or 'setup not recorded'}) and on "
        f"champion v{champion_version} ({theirs or 'setup not recorded'}); champion unchanged: evaluate "
        "both the same way (flows/evaluate.py --model models:/NAME@ALIAS) and promote on that score"
    )


def check_flow_metric(config: Any) -> None:
    """A training flow's `output.promote_metric` must be a score the flow records (gym/lineage.py's
    names): checked before any work, so a typo doesn't surface after training."""
    from gym.data.registry import AUTO
    from gym.preflight import stages

    output = getattr(config, "output", None)
    metric = getattr(output, "promote_metric", None)
    if not metric:
        return
    # Stage scores are named after the flow's stage: the method in the train flow, the field in others.
    prefixes = {s.method for s in stages(config).values()} | (set(stages(config)) - {"train"})
    if getattr(config, "warm_start", None):
        prefixes.add("sft")
    evaluations = {f"{label}_{phase}" for label in _labels(config) for phase in ("before", "after")}
    held_out = _held_out_metrics(config)
    if held_out is None:  # a metric giving several numbers (rouge, a custom one): any name may come
        evaluations_ok = metric.endswith(("_before", "_after"))
    else:
        evaluations_ok = metric in {f"{m}_{phase}" for m in held_out for phase in ("before", "after")}
    stage_ok = metric.startswith(tuple(f"{p}_" for p in prefixes))
    if evaluations_ok or stage_ok or metric.split(".", 1)[0] in evaluations:
        return
    names = [f"{m}_after" for m in sorted(held_out or [])]
    names += [f"{e}[.<category>]" for e in sorted(evaluations)]
    names += [f"{p}_loss_last" for p in sorted(prefixes)]
    unnamed = getattr(config, "eval_dataset", None) == AUTO and not held_out
    raise ConfigError(
        f"output.promote_metric: this flow records no score {metric!r}; it records {', '.join(names)} "
        "(evaluations also as <name>_before, and each stage's <stage>_<reward or metric> scores)"
        + ("; held-out metrics need held-out data of your own: name it with eval_dataset" if unnamed else "")
    )


def _held_out_metrics(config: Any) -> set[str] | None:
    """Names of the held-out metrics the flow records (None when one may give several numbers)."""
    resolve = getattr(config, "exact_match_dataset", None)  # eval_dataset with `auto` resolved
    if not (resolve() if resolve else getattr(config, "eval_dataset", None)):
        return set()
    names = {"exact_match"}
    for metric in getattr(config, "eval_metrics", []):
        if metric not in ("exact_match", "bleu"):
            return None
        names.add(metric)
    return names


def _labels(config: Any) -> list[str]:
    entries = getattr(config, "benchmarks", None) or []
    if not entries:
        return []
    from gym.eval.suite import parse

    return [parse(entry).label for entry in entries]


def cmd_promote(argv: Sequence[str]) -> int:
    """`gym promote`: decide and print the decision (Markdown, or JSON with --json)."""
    parser = ArgumentParser(prog="gym promote", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", "--model", required=True, help="Registered model name (or --model).")
    parser.add_argument(
        "--metric",
        required=True,
        help="Score to compare (a score.<metric> version tag: exact_match_after, mmlu_after, mmlu...).",
    )
    parser.add_argument(
        "--margin", type=float, default=0.0, help="The challenger must win by more than this."
    )
    parser.add_argument(
        "--mode",
        choices=["auto", "max", "min"],
        default="auto",
        help="max: higher is better; min: lower; auto: min for a loss or perplexity, else max.",
    )
    parser.add_argument(
        "--challenger",
        default="challenger",
        help="Alias of the version to judge (default challenger; a flow's output.alias).",
    )
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow tracking URI (default: the workspace's)."
    )
    parser.add_argument("--json", action="store_true", help="Print the decision as JSON.")
    args = parser.parse_args(argv)
    decision = promote(args.name, args.metric, args.margin, args.mode, args.challenger, uri=args.tracking_uri)
    print(json.dumps(decision.model_dump()) if args.json else decision.markdown())
    return 0
