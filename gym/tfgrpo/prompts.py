"""The prompts of Training-Free GRPO's three optimizer stages (and the judge's), written for gym.

Stage 1 (summarize) turns one rollout into a short account of what the attempt did, which
experiences it used and where it went wrong. Stage 2 (extract) compares the better and worse
attempts of one group and proposes at most a few operations on the library. Stage 3
(consolidate) sees every proposal of a batch with the library and writes the final operations,
merging near-duplicates. Every function returns chat messages; every JSON reply is read by
gym.tfgrpo.parse, which accepts the shapes asked for here (and many others).
"""

from __future__ import annotations

import json

from gym.tfgrpo.library import Library
from gym.tfgrpo.ops import Add, Delete, Merge, NoOp, Op, Update

Messages = list[dict[str, str]]

OPS_FORMAT = """Reply with a JSON list and nothing else. Each element is one operation:
  {"operation": "add", "text": "When ..., ..."}
  {"operation": "update", "id": "G2", "text": "When ..., ..."}
  {"operation": "delete", "id": "G5"}
  {"operation": "merge", "ids": ["G1", "G4"], "text": "When ..., ..."}
Use the [G..] labels shown for existing experiences. Reply [] when nothing should change."""


def library_listing(library: Library) -> str:
    if not library.items:
        return "(the library is empty)"
    return "\n".join(f"[G{i}] {item.text}" for i, item in enumerate(library.items))


def summarize_messages(
    question: str, attempt: str, reward: float, reference: str | None, library: Library
) -> Messages:
    """Stage 1: one rollout -> a short step-by-step account of it."""
    outcome = f"reward {reward:g}" + (
        f"; the reference answer is {reference!r}" if reference is not None else ""
    )
    user = (
        f"Problem:\n{question}\n\nAttempt:\n{attempt}\n\nOutcome: {outcome}\n\n"
        f"Experiences the solver was shown:\n{library_listing(library)}\n\n"
        "Summarize the attempt step by step in at most 120 words: which approach it took, which of the "
        "experiences (by [G..] label) it applied or ignored, where it went wrong if it did, and how the "
        "outcome follows from that. Plain text, no JSON."
    )
    return [
        {"role": "system", "content": "You review problem-solving attempts precisely and briefly."},
        {"role": "user", "content": user},
    ]


def extract_messages(
    question: str, attempts: list[tuple[str, float]], library: Library, max_ops: int
) -> Messages:
    """Stage 2: a group's summaries (with rewards) -> at most `max_ops` proposed operations."""
    shown = "\n\n".join(
        f"Attempt {i + 1} (reward {reward:g}):\n{summary}" for i, (summary, reward) in enumerate(attempts)
    )
    user = (
        f"Problem:\n{question}\n\n{shown}\n\nCurrent experience library:\n{library_listing(library)}\n\n"
        "Compare the attempts with higher reward against those with lower reward. What did the better "
        "ones do that the worse ones did not? Turn that difference into at most "
        f"{max_ops} operations on the library. A new or updated experience is one sentence of at most "
        f"{library.max_words} words in the form 'When [condition], [do X].', general enough to help on "
        "other problems (no numbers or names from this one). Prefer updating an experience that "
        "covers the same situation over adding a near-duplicate; delete one that misled the solver.\n\n"
        + OPS_FORMAT
    )
    return [
        {"role": "system", "content": "You distil reusable problem-solving experience from attempts."},
        {"role": "user", "content": user},
    ]


def render_op(op: Op, alias_of: dict[str, str]) -> dict[str, object]:
    """An operation as the prompt shows it (stable ids replaced by their [G..] labels)."""
    if isinstance(op, Add):
        return {"operation": "add", "text": op.text}
    if isinstance(op, Update):
        return {"operation": "update", "id": alias_of.get(op.id, op.id), "text": op.text}
    if isinstance(op, Delete):
        return {"operation": "delete", "id": alias_of.get(op.id, op.id)}
    if isinstance(op, Merge):
        return {"operation": "merge", "ids": [alias_of.get(i, i) for i in op.ids], "text": op.text}
    assert isinstance(op, NoOp)
    return {"operation": "none"}


def consolidate_messages(library: Library, proposals: list[list[Op]]) -> Messages:
    """Stage 3: every group's proposals of one batch + the library -> the final operations."""
    alias_of = {stable: alias for alias, stable in library.aliases().items()}
    shown = "\n".join(
        f"Group {g + 1}: {json.dumps([render_op(op, alias_of) for op in ops], ensure_ascii=False)}"
        for g, ops in enumerate(proposals)
    )
    user = (
        f"Current experience library ({len(library.items)} of at most {library.max_items}):\n"
        f"{library_listing(library)}\n\nOperations proposed from this batch, group by group:\n{shown}\n\n"
        "Consolidate them into the final operations for the library: keep the useful ones, merge "
        "proposals and experiences that say the same thing (use merge with the ids of existing "
        "ones), resolve conflicting proposals into one, drop vague or problem-specific ones, and stay "
        f"within {library.max_items} experiences of at most {library.max_words} words each.\n\n" + OPS_FORMAT
    )
    return [
        {"role": "system", "content": "You curate a compact library of problem-solving experiences."},
        {"role": "user", "content": user},
    ]


def repair_messages(messages: Messages, reply: str, errors: list[str]) -> Messages:
    """One more turn asking for a corrected reply, listing what was wrong with the last one."""
    problems = "\n".join(f"- {e}" for e in errors[:10])
    return [
        *messages,
        {"role": "assistant", "content": reply},
        {
            "role": "user",
            "content": f"That reply could not be used:\n{problems}\n\nWrite it again, correctly. "
            + OPS_FORMAT,
        },
    ]


def judge_messages(question: str, attempt: str, reference: str | None) -> Messages:
    """LLM judge: is the attempt's final answer correct (against the reference when there is one)?"""
    ref = f"\n\nReference answer:\n{reference}" if reference is not None else ""
    return [
        {"role": "system", "content": "You grade answers strictly. Reply with one word: CORRECT or WRONG."},
        {"role": "user", "content": f"Problem:\n{question}{ref}\n\nAnswer to grade:\n{attempt}"},
    ]
