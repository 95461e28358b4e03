"""The stages of one Training-Free GRPO step, each a function of its inputs (and the LLM roles).

    rollout      policy answers a question (experiences injected), `n` samples per call; judged if
                 the reward is an LLM verdict
    reward       the group's rewards and whether it is informative (pure)
    summarize    stage 1: one rollout of an informative group -> a short account
    extract      stage 2: a group's summaries -> proposed operations (one repair retry)
    consolidate  stage 3: all proposals of the batch -> final operations (one repair retry); not
                 called when nothing was proposed

Every seed is derived from the run seed and what the call is for (epoch, question, sample; plus the
step's attempt for calls whose replies are parsed, so a redone step asks afresh), never from
timing, so the same inputs give the same calls in any completion order. gym.tfgrpo.engine
assembles a step from these; the Prefect flow runs each as a task.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from gym.templates import with_system
from gym.tfgrpo import prompts
from gym.tfgrpo.calls import Caller, CallRecord
from gym.tfgrpo.data import Question, StepPlan, derive_seed
from gym.tfgrpo.injection import inject
from gym.tfgrpo.library import Library
from gym.tfgrpo.ops import Op
from gym.tfgrpo.parse import parse_ops
from gym.tfgrpo.rewards import majority_rewards, parse_verdict, verify
from gym.tfgrpo.select import judge_group

if TYPE_CHECKING:
    from gym.tfgrpo.runtime import Runtime


class CallInfo(BaseModel):
    """A call as manifests list it: stage, cache key, usage, cost, error (texts live elsewhere)."""

    model_config = ConfigDict(frozen=True)

    stage: str
    key: str
    prompt_tokens: int
    completion_tokens: int
    cost: float
    error: str | None = None

    @classmethod
    def of(cls, record: CallRecord) -> CallInfo:
        return cls(
            stage=record.stage,
            key=record.key,
            prompt_tokens=record.usage.prompt_tokens,
            completion_tokens=record.usage.completion_tokens,
            cost=record.cost,
            error=record.error,
        )


class Rollout(BaseModel):
    model_config = ConfigDict(frozen=True)

    g: int
    text: str | None = None
    error: str | None = None
    judged: float | None = None


class RolloutChunk(BaseModel):
    rollouts: list[Rollout]
    calls: list[CallInfo]


class Rewarded(BaseModel):
    rewards: list[float | None]
    informative: bool
    reason: str


class Summary(BaseModel):
    text: str | None
    call: CallInfo | None = None


class StageOutput(BaseModel):
    """A parsed optimizer reply: the valid operations, the problems, the raw replies and the calls."""

    ops: list[Op] = []
    errors: list[str] = []
    replies: list[str] = []
    calls: list[CallInfo] = []
    source: str = "llm"

    @property
    def ok(self) -> bool:
        return not self.errors


def chunk_sizes(group_size: int, max_n: int) -> list[int]:
    """How the G samples of a group are split over calls (`n` per call at most `max_n`)."""
    sizes, left = [], group_size
    while left > 0:
        sizes.append(min(max_n, left))
        left -= sizes[-1]
    return sizes


def policy_messages(rt: Runtime, question: Question, library: Library) -> list[dict[str, str]]:
    """The question's prompt, opened by the policy's default system message if it has none, with the
    experiences injected after it (as serving and evaluating the shipped model render it)."""
    prompt = with_system([question.prompt], rt.default_system)[0]
    return inject(prompt, rt.experiences_for(question, library))


def rollout(rt: Runtime, step: StepPlan, question: Question, library: Library, chunk: int) -> RolloutChunk:
    """Chunk `chunk` of the group's samples (and their judge verdicts when the reward is `judge`)."""
    sizes = chunk_sizes(rt.settings.group_size, rt.policy.max_n)
    first = sum(sizes[:chunk])
    seed = derive_seed(rt.settings.seed, "rollout", step.epoch, question.id, chunk)
    record = rt.policy("rollout", policy_messages(rt, question, library), seed=seed, n=sizes[chunk])
    calls = [CallInfo.of(record)]
    if record.error is not None or record.texts is None:
        rollouts = [Rollout(g=first + i, error=record.error) for i in range(sizes[chunk])]
        return RolloutChunk(rollouts=rollouts, calls=calls)
    rollouts = []
    for i, text in enumerate(record.texts):
        judged = None
        if rt.settings.reward == "judge":
            verdict_seed = derive_seed(
                rt.settings.seed, "judge", step.epoch, question.id, first + i, step.attempt
            )
            verdict = rt.judge(
                "judge", prompts.judge_messages(question.text, text, question.answer), seed=verdict_seed
            )
            calls.append(CallInfo.of(verdict))
            judged = parse_verdict(verdict.text)
        rollouts.append(Rollout(g=first + i, text=text, judged=judged))
    return RolloutChunk(rollouts=rollouts, calls=calls)


def rollout_group(rt: Runtime, step: StepPlan, question: Question, library: Library) -> list[RolloutChunk]:
    """Every chunk of the group's samples, the calls concurrently (the endpoint's limit still holds)."""
    n = len(chunk_sizes(rt.settings.group_size, rt.policy.max_n))
    if n == 1:
        return [rollout(rt, step, question, library, 0)]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="tfgrpo-rollout") as pool:
        return list(pool.map(lambda c: rollout(rt, step, question, library, c), range(n)))


def reward(rt: Runtime, question: Question, rollouts: list[Rollout]) -> Rewarded:
    """The group's rewards (None where a rollout or its verdict failed) and whether it is informative."""
    kind = rt.settings.reward
    texts = [r.text for r in rollouts]
    rewards: list[float | None]
    if any(t is None for t in texts):
        rewards = [None if t is None else 0.0 for t in texts]
    elif kind == "majority":
        rewards = list(majority_rewards([t or "" for t in texts]))
    elif kind == "judge":
        rewards = [r.judged for r in rollouts]
    else:
        if question.answer is None:
            from gym.errors import ConfigError

            raise ConfigError(f"reward {kind!r} needs reference answers; question {question.id} has none")
        rewards = [verify(kind, t or "", question.answer) for t in texts]
    verdict = judge_group(rewards, rt.settings.eps)
    return Rewarded(rewards=rewards, informative=verdict.informative, reason=verdict.reason)


def summarize(
    rt: Runtime, step: StepPlan, question: Question, attempt: Rollout, value: float, library: Library
) -> Summary:
    """Stage 1 for one rollout of an informative group."""
    reference = question.answer if rt.settings.reward != "majority" else None
    messages = prompts.summarize_messages(question.text, attempt.text or "", value, reference, library)
    seed = derive_seed(rt.settings.seed, "summarize", step.epoch, question.id, attempt.g)
    record = rt.optimizer("summarize", messages, seed=seed)
    text = record.text.strip() if record.text and record.text.strip() else None
    return Summary(text=text, call=CallInfo.of(record))


def summarize_group(
    rt: Runtime,
    step: StepPlan,
    question: Question,
    rollouts: list[Rollout],
    rewarded: Rewarded,
    library: Library,
) -> list[Summary]:
    """Stage 1 for every rollout of an informative group, concurrently; none for another group."""
    if not rewarded.informative:
        return []
    values = [float(r or 0.0) for r in rewarded.rewards]
    with ThreadPoolExecutor(max_workers=len(rollouts), thread_name_prefix="tfgrpo-summarize") as pool:
        futures = [
            pool.submit(summarize, rt, step, question, ro, v, library)
            for ro, v in zip(rollouts, values, strict=True)
        ]
        return [f.result() for f in futures]


def ask_for_ops(
    optimizer: Caller, stage: str, messages: list[dict[str, str]], seed: int, library: Library
) -> StageOutput:
    """One call, parsed; one repair call with the errors if it had any."""
    out = StageOutput()
    for attempt in range(2):
        record = optimizer(stage if attempt == 0 else f"{stage}_repair", messages, seed=seed + attempt)
        out.calls.append(CallInfo.of(record))
        if record.error is not None or record.text is None:
            out.errors = [f"call failed: {record.error}"]
            return out  # the client already retried; a repair prompt cannot fix a transport error
        out.replies.append(record.text)
        ops, errors = parse_ops(record.text, library.aliases())
        out.ops, out.errors = ops, errors
        if not errors:
            return out
        messages = prompts.repair_messages(messages, record.text, errors)
    return out


def extract(
    rt: Runtime,
    step: StepPlan,
    question: Question,
    rewards: list[float],
    summaries: list[Summary],
    library: Library,
) -> StageOutput:
    """Stage 2 for one informative group: compare its attempts, propose operations."""
    missing = [s for s in summaries if s.text is None]
    if missing:
        error = next((s.call.error for s in missing if s.call is not None and s.call.error), None)
        why = f"its call failed: {error}" if error else "its reply was empty"
        return StageOutput(errors=[f"{len(missing)} of {len(summaries)} summaries are missing ({why})"])
    attempts = [(s.text or "", r) for s, r in zip(summaries, rewards, strict=True)]
    messages = prompts.extract_messages(question.text, attempts, library, rt.settings.max_ops_per_group)
    seed = derive_seed(rt.settings.seed, "extract", step.epoch, question.id, step.attempt)
    out = ask_for_ops(rt.optimizer, "extract", messages, seed, library)
    out.ops = out.ops[: rt.settings.max_ops_per_group]
    return out


def consolidate(
    rt: Runtime, step: StepPlan, library: Library, proposals: list[list[Op]]
) -> StageOutput | None:
    """Stage 3: the final operations for the batch; None (no call) when nothing was proposed."""
    proposals = [ops for ops in proposals if any(op.op != "none" for op in ops)]
    if not proposals:
        return None
    messages = prompts.consolidate_messages(library, proposals)
    seed = derive_seed(rt.settings.seed, "consolidate", step.index, step.attempt)
    return ask_for_ops(rt.optimizer, "consolidate", messages, seed, library)
