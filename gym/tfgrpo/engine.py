"""Training-Free GRPO as a plain Python loop (no Prefect): epochs x steps, resumable, concurrent.

    result = train(Runtime(settings, model="gym-tiny", run_dir=d), questions, eval_questions)

Within a step, each group runs as soon as its own rollouts are back (rollout -> reward ->
summarize -> extract), all groups at once, so the step takes about its longest chain of dependent
calls; the consolidation waits for every group. The endpoint's concurrency limit holds throughout
(gym.tfgrpo.clients). A step whose manifest exists for the same config and input library is not
run again (its library is read back), so a killed run resumes where it stopped, and every LLM call
it had completed comes from the call cache. `flows/tf_grpo.py` runs the same stages as Prefect tasks.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel

from gym import workspace
from gym.errors import ConfigError, GymWarning
from gym.tfgrpo import stages
from gym.tfgrpo.clients import REFUSAL_CHARS, WINDOW_FULL, LocalClient, http_refusal
from gym.tfgrpo.config import ResolvedRole
from gym.tfgrpo.data import Question, StepPlan, check_answers, derive_seed, plan_steps, steps_per_epoch
from gym.tfgrpo.injection import EXPERIENCE_FILE, shipped_json
from gym.tfgrpo.library import Library
from gym.tfgrpo.metrics import MetricReport, report
from gym.tfgrpo.rewards import verify
from gym.tfgrpo.runtime import Runtime
from gym.tfgrpo.step import GroupRecord, StepManifest, commit, library_path, load_manifest

CALL_THREADS = 64


class EvalRecord(BaseModel):
    tag: str
    library_hash: str
    report: MetricReport | None
    """None when a call failed: the evaluation is missing, not scored on what happened to come back."""
    rewards: list[list[float]]
    calls: list[stages.CallInfo]
    failed: int = 0
    """Calls that got no answer (each after the client's retries): not scored as wrong answers."""

    @property
    def error(self) -> str | None:
        """The first failed call's error."""
        return next((c.error for c in self.calls if c.error), None)


class RunResult(BaseModel):
    run_dir: str
    library_file: str
    library_size: int
    library_version: int
    library_hash: str
    steps: int
    degraded_steps: int
    llm_calls: int
    tokens: int
    cost_usd: float
    paid_calls: int
    cached_calls: int
    mean_at_k: list[float | None]
    """Held-out Mean@k before and after each epoch; None for an evaluation whose calls failed."""
    pass_at_k: list[float | None]
    train_reward_first: float | None
    train_reward_last: float | None
    seconds: float


def group_record(
    question: Question,
    chunks: list[stages.RolloutChunk],
    rewarded: stages.Rewarded,
    summaries: list[stages.Summary] | None = None,
    extraction: stages.StageOutput | None = None,
) -> GroupRecord:
    """One group's outcome, as the step manifest records it."""
    summaries = summaries or []
    return GroupRecord(
        question=question.id,
        rollouts=[r for chunk in chunks for r in chunk.rollouts],
        rewards=rewarded.rewards,
        informative=rewarded.informative,
        reason=rewarded.reason,
        summaries=[s.text for s in summaries],
        extraction=extraction,
        calls=[c for chunk in chunks for c in chunk.calls]
        + [s.call for s in summaries if s.call is not None],
    )


def run_group(
    rt: Runtime, step: StepPlan, question: Question, library: Library, pool: ThreadPoolExecutor
) -> GroupRecord:
    """rollout -> reward -> (informative groups only) summarize -> extract, for one question."""
    n_chunks = len(stages.chunk_sizes(rt.settings.group_size, rt.policy.max_n))
    futures = [pool.submit(stages.rollout, rt, step, question, library, c) for c in range(n_chunks)]
    chunks = [f.result() for f in futures]
    rollouts = [r for chunk in chunks for r in chunk.rollouts]
    rewarded = stages.reward(rt, question, rollouts)
    if not rewarded.informative:
        return group_record(question, chunks, rewarded)
    summaries = stages.summarize_group(rt, step, question, rollouts, rewarded, library)
    values = [float(r or 0.0) for r in rewarded.rewards]
    extraction = stages.extract(rt, step, question, values, summaries, library)
    return group_record(question, chunks, rewarded, summaries, extraction)


def run_step(
    rt: Runtime, step: StepPlan, library: Library, questions: list[Question], pool: ThreadPoolExecutor
) -> tuple[StepManifest, Library]:
    batch = [questions[i] for i in step.questions]
    with ThreadPoolExecutor(max_workers=len(batch), thread_name_prefix="tfgrpo-group") as groups_pool:
        groups = list(groups_pool.map(lambda q: run_group(rt, step, q, library, pool), batch))
    proposals = [g.extraction.ops for g in groups if g.extraction is not None]
    consolidation = stages.consolidate(rt, step, library, proposals)
    return commit(rt.run_dir, step, rt.config_hash, library, groups, consolidation)


def resumable(rt: Runtime, step: StepPlan, library: Library) -> tuple[StepPlan, Library | None]:
    """(the step to run, None), or (the step, the library it produced) when it is already done (never
    when the run refreshes: Runtime.refresh)."""
    if rt.refresh:
        return step, None
    previous = load_manifest(rt.run_dir, step.index)
    if (
        previous is None
        or previous.config_hash != rt.config_hash
        or previous.library_in != library.content_hash()
    ):
        return step, None
    if previous.status == "degraded" and rt.settings.retry_degraded:
        return step.model_copy(update={"attempt": previous.attempt + 1}), None
    if previous.library_out == previous.library_in:
        return step, library
    path = library_path(rt.run_dir, previous.version_out, previous.library_out)
    return step, Library.load(path) if path.is_file() else None


def evaluate(
    rt: Runtime, questions: list[Question], library: Library, tag: str, pool: ThreadPoolExecutor
) -> EvalRecord:
    """Held-out Mean@k and Pass@k of the policy with `library` injected (k = settings.eval_samples)."""
    k = rt.settings.eval_samples
    sizes = stages.chunk_sizes(k, rt.policy.max_n)

    def one(question: Question, chunk: int) -> stages.CallRecord:
        seed = derive_seed(rt.settings.seed, "eval", question.id, chunk)
        return rt.policy("eval", stages.policy_messages(rt, question, library), seed=seed, n=sizes[chunk])

    futures: list[list[Future[stages.CallRecord]]] = [
        [pool.submit(one, q, c) for c in range(len(sizes))] for q in questions
    ]
    kind = rt.settings.reward if rt.settings.reward in ("exact", "numeric") else "auto"
    rows, calls = [], []
    for question, fs in zip(questions, futures, strict=True):
        records = [f.result() for f in fs]
        calls += [stages.CallInfo.of(r) for r in records]
        texts = [t for r in records for t in r.texts or []]
        rows.append([verify(kind, t, question.answer or "") for t in texts])
    # A failed call is no wrong answer: scoring it as one reported a library the endpoint refused to
    # answer with (its prompt over the context, say) as Mean@k 0. The evaluation is missing instead.
    failed = sum(c.error is not None for c in calls)
    record = EvalRecord(
        tag=tag,
        library_hash=library.content_hash(),
        report=None if failed else report(rows, k=k, seed=rt.settings.seed),
        rewards=rows,
        calls=calls,
        failed=failed,
    )
    workspace.atomic_write_json(rt.run_dir / "evals" / f"{tag}.json", record.model_dump(mode="json"))
    return record


def evaluate_alone(rt: Runtime, questions: list[Question], library: Library, tag: str) -> EvalRecord:
    """`evaluate` with its own thread pool (for callers that have none, like a Prefect task)."""
    with ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="tfgrpo-eval") as pool:
        return evaluate(rt, questions, library, tag, pool)


def start_library(rt: Runtime, initial: Library | None = None) -> tuple[Library, Path]:
    """The run's version 0 (empty with the settings' caps, or `initial`), saved."""
    s = rt.settings
    library = initial or Library(max_items=s.max_items, max_words=s.max_words)
    return library, library.save(library_path(rt.run_dir, library.version, library.content_hash()))


def train(
    rt: Runtime,
    questions: list[Question],
    eval_questions: list[Question] | None = None,
    initial: Library | None = None,
    on_step: Callable[[StepManifest, Library], None] | None = None,
    max_steps: int | None = None,
) -> RunResult:
    """Learn a library over `questions` (epochs x batches, or `max_steps` steps: see plan_steps);
    evaluate before and after each epoch (and after the last step, where max_steps ends inside one)."""
    start = time.perf_counter()
    s = rt.settings
    check_answers(s.reward, questions, eval_questions)
    library, _ = start_library(rt, initial)
    plan = plan_steps(len(questions), s.batch_size, s.epochs, s.seed, max_steps)
    manifests: list[StepManifest] = []
    evals: list[EvalRecord] = []
    with ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="tfgrpo-call") as pool:
        if eval_questions:
            evals.append(evaluate(rt, eval_questions, library, "before", pool))
        for step in plan:
            step, done = resumable(rt, step, library)
            if done is not None:
                manifest = load_manifest(rt.run_dir, step.index)
                assert manifest is not None
                library = done
            else:
                manifest, library = run_step(rt, step, library, questions, pool)
            manifests.append(manifest)
            if on_step is not None:
                on_step(manifest, library)
            tag = eval_tag(plan, step.index, len(questions), s.batch_size)
            if eval_questions and tag is not None:
                evals.append(evaluate(rt, eval_questions, library, tag, pool))
    return finish(rt, library, manifests, evals, time.perf_counter() - start)


def eval_tag(plan: list[StepPlan], index: int, n_questions: int, batch_size: int) -> str | None:
    """The held-out evaluation after step `index`: `epoch<e>` at the end of an epoch, `step<k>` after
    the plan's last step where it ends inside one (max_steps); None between."""
    step = plan[index]
    if index + 1 < len(plan) and plan[index + 1].epoch == step.epoch:
        return None
    epoch_done = step.batch + 1 == steps_per_epoch(n_questions, batch_size)
    return f"epoch{step.epoch + 1}" if epoch_done else f"step{index + 1}"


REACHABILITY = "check that the endpoint is up and reachable and its API key is set"
OPTIMIZER_STAGES = ("summarize", "extract", "extract_repair", "consolidate", "consolidate_repair")


def unanswered_advice(
    error: str, role: ResolvedRole, stage: str | None = None, rt: Runtime | None = None
) -> str:
    """Why calls of `role` (at `stage`) went unanswered and what to change, from a failed call's `error`.
    A client error (HTTP 4xx) is the endpoint refusing the request as sent: its message and the setting
    to change; otherwise (no connection, a timeout, a 5xx, rate limits after the client's retries) the
    endpoint was not there to answer. A model run in this process (no endpoint) has no endpoint or key
    to check: its error says what happened, and a prompt past its window what makes the prompt long."""
    if rt is not None and isinstance(getattr(rt, role.name).client, LocalClient):
        fix = f"; {_window_fix(stage, rt)}" if WINDOW_FULL in error else ""
        return f" (the first error: {error[:REFUSAL_CHARS]}){fix}"
    refused = http_refusal(error)
    if refused is None or refused[0] >= 500 or refused[0] in (408, 429):
        return f" (the first error: {error[:REFUSAL_CHARS]}); {REACHABILITY}"
    status, message = refused
    if len(message) > REFUSAL_CHARS:
        message = message[: REFUSAL_CHARS - 3] + "..."
    said = message or "no message"
    return f": the endpoint refused the requests (HTTP {status}: {said}); {_fix(status, message, role)}"


def _window_fix(stage: str | None, rt: Runtime) -> str:
    """What fills a local model's window at `stage`: the settings that shorten that prompt."""
    longer = "or run the role on a model with a longer context window"
    if stage in ("summarize", "judge"):  # the prompt quotes the policy's answers
        quoted = "the group's answers" if stage == "summarize" else "an answer"
        return (
            f"the {stage} prompt quotes {quoted}, each up to the policy's max_tokens (now "
            f"{rt.policy.role.max_tokens}): lower --policy.max_tokens (a smaller --group_size quotes fewer), "
            f"{longer}"
        )
    if stage in OPTIMIZER_STAGES:  # extract and consolidate quote the optimizer's own summaries / proposals
        return (
            f"the {stage} prompt quotes the optimizer's earlier replies, each up to its max_tokens (now "
            f"{rt.optimizer.role.max_tokens}): lower --optimizer.max_tokens, {longer}"
        )
    return (  # rollouts and held-out evaluation: the question and the injected library
        "the policy's prompt is the question and the experience library: shorten the questions, inject "
        f"fewer experiences (--retrieval_top_k K), {longer}"
    )


def _fix(status: int, message: str, role: ResolvedRole) -> str:
    """The setting a refusal points at."""
    text, where, name = message.lower(), role.endpoint or "the endpoint", role.name
    if status in (401, 403):
        return f"check the API key: ${role.api_key_env} must hold one that {where} accepts"
    if status == 404:
        return (
            f"check that the model name ({role.model!r}: --model or --{name}.model) is one {where} "
            "serves, and that the endpoint is its OpenAI-compatible base URL (…/v1)"
        )
    if "max_tokens" in text or "context" in text:
        library = (
            " (the policy's prompt also holds the experience library: --retrieval_top_k K injects fewer)"
            if name == "policy"
            else ""
        )
        return (
            f"lower the {name}'s max_tokens (now {role.max_tokens}: --{name}.max_tokens N, or "
            f'{name}={{"max_tokens": N}} from Python) to what the endpoint allows: prompt and reply together '
            f"must fit the model's context{library}"
        )
    return f"change the {name}'s settings (--{name}.*) to what the endpoint accepts"


def _first_error(calls: Iterable[stages.CallInfo]) -> str | None:
    """The first failed call's error, a refusal (HTTP 4xx: what a setting can fix) before any other."""
    errors = [c.error for c in calls if c.error]
    refusals = [e for e in errors if (r := http_refusal(e)) is not None and r[0] < 500]
    return next(iter(refusals or errors), None)


def _calls(manifests: list[StepManifest]) -> list[stages.CallInfo]:
    """Every call of the steps (rollouts, verdicts, summaries, extraction and consolidation)."""
    calls = [c for m in manifests for g in m.groups for c in g.calls]
    calls += [c for m in manifests for g in m.groups if g.extraction for c in g.extraction.calls]
    return calls + [c for m in manifests if m.consolidation for c in m.consolidation.calls]


def _role_of(rt: Runtime, stage: str) -> ResolvedRole:
    if stage in OPTIMIZER_STAGES:
        return rt.optimizer.role
    return rt.judge.role if stage == "judge" else rt.policy.role


def _degraded_note(rt: Runtime, manifests: list[StepManifest]) -> str:
    """The first problem of the degraded steps, with the refusal behind it and what to change."""
    degraded = [m for m in manifests if m.status == "degraded"]
    first = next((p for m in degraded for p in m.problems), "no reason recorded")
    failed = [c for c in _calls(degraded) if c.error]
    error = _first_error(failed)
    if error is None:
        return f"the first problem: {first}"
    stage = next(c.stage for c in failed if c.error == error)
    advice = unanswered_advice(error, _role_of(rt, stage), stage, rt)
    return f"the first problem: {first}; {len(failed)} calls failed{advice}"


def _check_evals(rt: Runtime, evals: list[EvalRecord]) -> None:
    """Say which held-out evaluations are missing (a call failed), quoting why and what to change."""
    missing = [e for e in evals if e.report is None]
    if not missing:
        return
    failed, calls = sum(e.failed for e in missing), sum(len(e.calls) for e in missing)
    error = _first_error(c for e in missing for c in e.calls) or "no error recorded"
    tags = ", ".join(e.tag for e in missing)
    advice = unanswered_advice(error, rt.policy.role, "eval", rt)
    warnings.warn(
        f"TF-GRPO: held-out Mean@k/Pass@k missing (null) for {tags}: {failed} of their {calls} calls got no "
        f"answer, and a failed call is not scored{advice}; then run again (the answered calls are reused)",
        GymWarning,
        stacklevel=3,
    )


def _check_informative(rt: Runtime, manifests: list[StepManifest]) -> None:
    """Warn when no group of any step had rewards that differ: the optimizer was never asked, so the
    run learned nothing, and say what makes groups differ."""
    groups = [g for m in manifests for g in m.groups]
    if not groups or any(g.informative for g in groups):
        return
    s = rt.settings
    if s.group_size == 1:
        why = "with --group_size 1 no group can (use 2 or more; the papers use 5)"
    else:
        rewards = {r for g in groups for r in g.rewards if r is not None}
        said = (
            f"every scored answer got {rewards.pop():g}"
            if len(rewards) == 1
            else "the rewards never differed"
        )
        exact = s.reward in ("auto", "exact")
        match = (
            "; with --reward " + s.reward + " a text answer scores only when it is the reference exactly "
            "(case and wording; a number is compared as a number), so a chatty model may never score: "
            "--reward judge compares meaning"
            if exact
            else ""
        )
        why = f"{said}{match}; a larger --group_size or a higher --policy.temperature spreads them"
    warnings.warn(
        f"TF-GRPO: no group of the {len(manifests)} steps had rewards that differ, so nothing was summarized "
        f"and the library is as it began: {why}",
        GymWarning,
        stacklevel=3,
    )


def mean_reward(manifest: StepManifest) -> float | None:
    values = [r for g in manifest.groups for r in g.rewards if r is not None]
    return sum(values) / len(values) if values else None


def finish(
    rt: Runtime, library: Library, manifests: list[StepManifest], evals: list[EvalRecord], seconds: float
) -> RunResult:
    unchanged = bool(manifests) and manifests[-1].version_out == manifests[0].version_in
    degraded = [m for m in manifests if m.status == "degraded"]
    if unchanged and len(degraded) == len(manifests):
        calls = sum(m.calls for m in manifests)
        if calls and not sum(m.tokens for m in manifests):  # no call was answered: not a run to ship
            first = next((p for m in manifests for p in m.problems), "no reason recorded")
            errors = (r.error for m in manifests for g in m.groups for r in g.rollouts if r.error)
            advice = unanswered_advice(next(errors, first), rt.policy.role, "rollout", rt)
            raise ConfigError(
                f"TF-GRPO: none of the {calls} calls to the model was answered, so nothing was learned"
                f"{advice}, then run again: the steps are redone"
            )
        optimizer = [c for c in _calls(manifests) if c.stage in OPTIMIZER_STAGES]
        if optimizer and all(c.error for c in optimizer):  # the policy answered, the optimizer never did
            error = _first_error(optimizer) or "no error recorded"
            stage = next((c.stage for c in optimizer if c.error == error), None)
            advice = unanswered_advice(error, rt.optimizer.role, stage, rt)
            raise ConfigError(
                f"TF-GRPO: none of the {len(optimizer)} optimizer calls (summarize, extract, consolidate) "
                f"was answered, so nothing was learned{advice}, then "
                "run again: the steps are redone"
            )
        warnings.warn(
            f"TF-GRPO: all {len(manifests)} steps degraded, so nothing was learned (the library is as it "
            f"began); {_degraded_note(rt, manifests)}",
            GymWarning,
            stacklevel=2,
        )
    elif any(c.error for c in _calls(degraded)):  # degraded by failed calls, not by unreadable replies
        warnings.warn(
            f"TF-GRPO: {len(degraded)} of {len(manifests)} steps degraded (each applied only what was "
            f"valid); {_degraded_note(rt, manifests)}",
            GymWarning,
            stacklevel=2,
        )
    _check_evals(rt, evals)
    _check_informative(rt, manifests)
    library_file = library.save(rt.run_dir / "library.json")
    if rt.settings.experience_lib_path:
        path = Path(rt.settings.experience_lib_path)
        export_library(rt.run_dir, path, rt.settings.retrieval_top_k, rt.origin)
    # An evaluation of a library the run already evaluated (an epoch that changed nothing) makes the same
    # calls, answered from the cache: the run's calls, tokens and cost count each once.
    eval_calls = list({c.key: c for e in evals for c in e.calls}.values())
    ledger = rt.ledger.snapshot()
    result = RunResult(
        run_dir=str(rt.run_dir),
        library_file=str(library_file),
        library_size=len(library.items),
        library_version=library.version,
        library_hash=library.content_hash(),
        steps=len(manifests),
        degraded_steps=sum(m.status == "degraded" for m in manifests),
        llm_calls=sum(m.calls for m in manifests) + len(eval_calls),
        tokens=sum(m.tokens for m in manifests)
        + sum(c.prompt_tokens + c.completion_tokens for c in eval_calls),
        cost_usd=round(
            sum(t.cost for m in manifests for t in m.usage.values()) + sum(c.cost for c in eval_calls), 6
        ),
        paid_calls=int(ledger["calls"]),  # type: ignore[call-overload]
        cached_calls=int(ledger["cached_calls"]),  # type: ignore[call-overload]
        mean_at_k=[e.report.mean_at_k if e.report else None for e in evals],
        pass_at_k=[e.report.pass_at_k if e.report else None for e in evals],
        train_reward_first=mean_reward(manifests[0]) if manifests else None,
        train_reward_last=mean_reward(manifests[-1]) if manifests else None,
        seconds=round(seconds, 3),
    )
    workspace.atomic_write_json(rt.run_dir / "result.json", result.model_dump(mode="json"))
    return result


def export_library(
    run_dir: Path,
    target: Path,
    retrieval_top_k: int | None = None,
    run: dict[str, str | None] | None = None,
) -> None:
    """Copy the final library and every version to `target` (experiences.json + versions/);
    experiences.json records `retrieval_top_k` (what injecting it selects, as a shipped model's does)
    and `run`, the run that wrote it (Runtime.origin: re-running the same command resumes that run)."""
    for version in sorted((run_dir / "libraries").glob("v*.json")):
        workspace.atomic_write_text(target / "versions" / version.name, version.read_text(encoding="utf-8"))
    final = (run_dir / "library.json").read_text(encoding="utf-8")
    workspace.atomic_write_text(target / EXPERIENCE_FILE, shipped_json(final, retrieval_top_k, run))
