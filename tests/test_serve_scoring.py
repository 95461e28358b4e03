"""How `gym serve` plans its scoring passes and reads token texts, without a model (pure functions);
the scores themselves are checked against transformers' forward in tests/test_serve.py."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from gym.serve.logprobs import pieces, pieces_many
from gym.serve.scoring import SCORE_TOKENS, SHARED_PREFIX, Pass, _branches, plan
from gym.tiny import tokenizer_dir


def test_sequences_that_open_alike_share_a_pass_and_the_rest_are_padded_together():
    rng = random.Random(0)
    context = [rng.randrange(1000) for _ in range(100)]
    question = [
        context + [rng.randrange(1000) for _ in range(rng.randint(1, 5))] + [7, c] for c in (1, 2, 3, 4)
    ]
    loners = [[rng.randrange(1000) for _ in range(n)] for n in (3, 50, 20)]
    short = [[5, 6, 1], [5, 6, 2]]  # they open alike, but too little to be worth a pass of its own
    sequences = [*loners[:1], *question, *loners[1:], *short]
    passes = plan(sequences)
    assert sorted(i for p in passes for i in p.members) == list(range(len(sequences)))  # each once
    shared = [p for p in passes if p.shared]
    assert len(shared) == 1 and sorted(shared[0].members) == [1, 2, 3, 4]
    common = min(len(sequences[i]) for i in shared[0].members)
    assert SHARED_PREFIX <= shared[0].shared < common  # every member keeps at least its last token
    assert all(
        sequences[i][: shared[0].shared] == sequences[1][: shared[0].shared] for i in shared[0].members
    )
    padded = [p for p in passes if not p.shared]
    assert sorted(i for p in padded for i in p.members) == [0, 5, 6, 7, 8]


def test_a_sequence_that_is_the_opening_of_another_keeps_its_last_token():
    a = list(range(40))
    passes = plan([a, [*a, 99, 98]])
    assert passes == [Pass([0, 1], shared=39)]


def test_continuations_that_go_on_alike_branch_from_the_shared_opening():
    rng = random.Random(1)
    context = [rng.randrange(1000) for _ in range(SHARED_PREFIX + 5)]
    questions = [[rng.randrange(1000) for _ in range(SHARED_PREFIX + n)] for n in (0, 3, 9)]
    sequences = [context + q + [7, a] for q in questions for a in (1, 2, 3)]
    sequences.append([*context, 5, 5, 5])  # goes on like no other row
    sequences.append(context + questions[0][: SHARED_PREFIX - 1] + [9])  # too little in common
    (only,) = plan(sequences)
    assert only.shared == len(context)
    rows = [sequences[i] for i in only.members]
    branches = _branches(rows, only.shared)
    assert sorted(m for _, members in branches for m in members) == list(range(len(rows)))  # each once
    split = {frozenset(only.members[m] for m in members): length for length, members in branches}
    assert split.pop(frozenset({9, 10})) == 0  # the rows sharing nothing further: one padded batch
    for q, question in enumerate(questions):  # the question and the cue before each answer, run once
        assert split.pop(frozenset(range(3 * q, 3 * q + 3))) == len(question) + 1
    assert not split
    for length, members in branches:  # each row keeps its last token for its own pass
        assert all(len(context) + length < len(rows[m]) for m in members)


def test_passes_stay_within_the_token_budget():
    context = list(range(SHARED_PREFIX))
    width = SCORE_TOKENS // 4
    sequences = [[*context, i, *range(width)] for i in range(10)]  # each leaves `width` + 1 of its own
    passes = plan(sequences)
    assert sorted(i for p in passes for i in p.members) == list(range(10))
    assert all(len(p.members) * (width + 1) <= SCORE_TOKENS for p in passes)
    assert len(passes) > 1
    many = [list(range(i, i + 600)) for i in range(0, 6000, 600)]  # nothing shared: padded batches
    assert all(len(p.members) * 600 <= SCORE_TOKENS and not p.shared for p in plan(many))


TOK = AutoTokenizer.from_pretrained(tokenizer_dir())  # gym-tiny's byte-level BPE, shipped in the repo


def decode_many(batch: list[list[int]]) -> list[str]:
    return TOK.batch_decode(batch, skip_special_tokens=True)


TEXTS = ["naïve café ", "中文字符", "🙂🙃", " and", " the river", "\n", "ü"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from(TEXTS), min_size=1, max_size=8), min_size=1, max_size=5), st.data())
def test_texts_of_sequences_that_open_alike_equal_each_read_alone(parts, data):
    sequences = []
    for p in parts:
        ids = TOK("".join(p), add_special_tokens=False)["input_ids"]
        if sequences and data.draw(
            st.booleans()
        ):  # open like an earlier one, cut anywhere (mid-character too)
            base = data.draw(st.sampled_from(sequences))
            ids = base[: data.draw(st.integers(0, len(base)))] + ids
        sequences.append(ids)
    together = pieces_many(decode_many, sequences)
    for ids, got in zip(sequences, together, strict=True):
        assert got == pieces(decode_many, ids)
        assert "".join(got) == TOK.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


def test_only_a_cache_that_keeps_every_position_is_kept_for_the_next_call():
    """Cutting a cache back to a shared opening is exact only where every layer keeps all positions."""
    from transformers import DynamicCache, LlamaConfig, MistralConfig

    from gym.serve.scoring import _croppable

    assert _croppable(DynamicCache(config=LlamaConfig(num_hidden_layers=2)))
    assert not _croppable(DynamicCache(config=MistralConfig(num_hidden_layers=2, sliding_window=16)))
    assert not _croppable(None)
