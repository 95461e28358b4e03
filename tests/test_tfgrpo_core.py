"""The pure core of Training-Free GRPO: library, operations (property tests), parser, selection, metrics."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym.errors import DataError
from gym.tfgrpo.library import Experience, Library, diff
from gym.tfgrpo.metrics import bootstrap_ci, mean_at_k, mean_pass_at_k, pass_at_k, report
from gym.tfgrpo.ops import Add, Delete, Merge, NoOp, Update, apply
from gym.tfgrpo.parse import parse_ops
from gym.tfgrpo.select import judge_group

WORDS = ["when", "adding", "carry", "the", "tens", "check", "signs", "first", "reverse", "digits"]
texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=8).map(" ".join)


@st.composite
def libraries(draw):
    n = draw(st.integers(0, 6))
    ids = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n, unique=True))
    items = tuple(Experience(id=f"E{i}", text=draw(texts.filter(str.strip))) for i in sorted(ids))
    cap = draw(st.integers(max(1, n), n + 3))
    return Library(
        version=draw(st.integers(0, 3)),
        next_id=max(ids, default=-1) + 1 + draw(st.integers(0, 3)),
        max_items=cap,
        max_words=draw(st.integers(3, 8)),
        items=items,
    )


def ops_for(library: Library):
    ids = st.sampled_from([*library.ids, "E99", "X"]) if library.ids else st.sampled_from(["E99", "X"])
    return st.lists(
        st.one_of(
            st.builds(Add, text=texts),
            st.builds(Update, id=ids, text=texts),
            st.builds(Delete, id=ids),
            st.builds(Merge, ids=st.lists(ids, min_size=0, max_size=3).map(tuple), text=texts),
            st.just(NoOp()),
        ),
        max_size=8,
    )


@st.composite
def library_and_ops(draw):
    library = draw(libraries())
    return library, draw(ops_for(library))


@settings(max_examples=300, deadline=None)
@given(library_and_ops())
def test_apply_properties(case):
    library, ops = case
    before = library.to_json()
    result = apply(library, ops)
    new = result.library
    assert library.to_json() == before  # input untouched
    assert len(result.applied) + len(result.rejected) == sum(not isinstance(o, NoOp) for o in ops)
    assert len(set(new.ids)) == len(new.ids)  # ids unique
    fresh = set(new.ids) - set(library.ids)
    assert all(int(i[1:]) >= library.next_id for i in fresh)  # never reused
    assert new.next_id == library.next_id + len(fresh)
    assert len(new.items) <= library.max_items
    assert all(len(t.split()) <= library.max_words for t in new.texts if t not in library.texts)
    deleted = {o.id for o in result.applied if isinstance(o, Delete)}
    assert not deleted & set(new.ids)
    for op in ops:  # delete beats update
        if isinstance(op, Update) and op.id in deleted:
            assert op not in result.applied
    for op in result.applied:  # merge removes its sources, keeps lineage
        if isinstance(op, Merge):
            assert not set(op.ids) & set(new.ids)
            assert any(i.sources == tuple(dict.fromkeys(op.ids)) for i in new.items)
    if not result.applied:
        assert new == library
    else:
        assert new.version == library.version + 1
    assert Library.from_json(new.to_json()) == new  # JSON round trip is identity


@settings(max_examples=100, deadline=None)
@given(libraries(), st.integers(0, 5))
def test_all_none_leaves_hash_and_version(library, n):
    result = apply(library, [NoOp()] * n)
    assert result.library.content_hash() == library.content_hash()
    assert result.library.version == library.version and not result.rejected


def lib(*item_texts: str, **caps) -> Library:
    items = tuple(Experience(id=f"E{i}", text=t) for i, t in enumerate(item_texts))
    return Library(next_id=len(items), items=items, **caps)


def test_apply_rejects_with_reasons_and_precedence():
    library = lib("When adding, carry tens.", "When comparing, check signs.", "When stuck, reread.")
    result = apply(
        library,
        [
            Update(id="E0", text="When adding, carry the tens."),
            Delete(id="E0"),
            Update(id="E1", text="a"),
            Update(id="E1", text="b"),
            Merge(ids=("E1", "E2"), text="When stuck or comparing, reread and check signs."),
            Update(id="E42", text="x"),
            Add(text="when adding, CARRY tens"),
            Add(text=" ".join(["word"] * 40)),
            Add(text="When reversing, read digits right to left."),
        ],
    )
    reasons = [r.op.op + ":" + getattr(r.op, "id", "") + ":" + r.reason for r in result.rejected]
    assert any("E0" in r and "delete wins" in r for r in reasons)
    assert sum("merge wins" in r for r in reasons) == 2  # both updates of E1 lose to the merge
    assert any("unknown id 'E42'" in r for r in reasons)
    assert any("over the cap" in r for r in reasons)
    new = result.library
    # the duplicate add of E0's text is not a duplicate any more: E0 was deleted in this batch
    assert new.ids == ["E3", "E4", "E5"] and new.get("E3").sources == ("E1", "E2")
    assert new.version == 1 and new.next_id == 6


def test_two_updates_of_one_id_conflict_and_the_item_cap_holds():
    library = lib("a b", "c d", max_items=3)
    result = apply(
        library, [Update(id="E0", text="x"), Update(id="E0", text="y"), Add(text="e"), Add(text="f")]
    )
    assert [r.reason for r in result.rejected] == [
        "conflicting updates of E0 in one batch",
        "conflicting updates of E0 in one batch",
        "library full (3 items)",
    ]
    assert result.library.texts == ["a b", "c d", "e"]


def test_library_persists_atomically_and_detects_tampering(tmp_path):
    library = apply(lib(), [Add(text="When adding, carry tens.")]).library
    path = library.save(tmp_path / "lib.json")
    assert Library.load(path) == library and path.read_text() == library.to_json()
    from gym.tfgrpo.injection import load_shipped

    (tmp_path / "experiences.json").write_text(path.read_text())
    assert load_shipped(tmp_path) == ["When adding, carry tens."]
    data = json.loads(path.read_text())
    data["items"][0]["text"] = "tampered"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match="content hash"):
        Library.load(path)
    path.write_text("{not json")
    with pytest.raises(DataError, match="not JSON"):
        Library.load(path)


def test_show_prints_a_library_file_or_the_folder_holding_it(tmp_path, capsys):
    """`gym tfgrpo show ./out` on a model folder (an export, a GRPOTrainer output_dir) said "no such
    experience library file"; the file itself, and a run directory's library.json, read as well."""
    from flows.cli import main
    from gym.tfgrpo.injection import shipped_json

    library = apply(lib(), [Add(text="When adding, carry tens.")]).library
    model, run_dir = tmp_path / "out", tmp_path / "run"
    model.mkdir()
    (model / "experiences.json").write_text(shipped_json(library.to_json(), 2))  # as a model ships it
    library.save(run_dir / "library.json")
    for where in (model, model / "experiences.json", run_dir):
        assert main(["tfgrpo", "show", str(where)]) == 0
        assert "When adding, carry tens." in capsys.readouterr().out
    assert main(["tfgrpo", "show", str(model), "--json"]) == 0
    assert Library.from_json(capsys.readouterr().out) == library
    assert main(["tfgrpo", "show", str(tmp_path / "empty")]) == 2  # nothing there: as before
    assert "no such experience library file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["tfgrpo", "show", str(tmp_path / "empty")]) == 2
    assert "holds no experience library (experiences.json or library.json)" in capsys.readouterr().err
    # The short form serving reads (a library written by hand) is a library: shown, and whole as JSON.
    (model / "experiences.json").write_text(
        json.dumps({"items": [{"id": "E0", "text": "When in doubt, add."}]})
    )
    assert main(["tfgrpo", "show", str(model)]) == 0
    shown = capsys.readouterr()
    assert "When in doubt, add." in shown.out and shown.err == ""
    assert main(["tfgrpo", "show", str(model), "--json"]) == 0
    assert Library.from_json(capsys.readouterr().out).texts == ["When in doubt, add."]
    # A model's experiences.json edited by hand (its hash no longer matches) was refused by show while
    # gym serve injected it: shown as serving injects it, saying why the library check failed.
    edited = json.loads(library.to_json())
    edited["items"][0]["text"] = "When in doubt, add."
    (model / "experiences.json").write_text(json.dumps(edited))
    assert main(["tfgrpo", "show", str(model)]) == 0
    shown = capsys.readouterr()
    assert "When in doubt, add." in shown.out and "shown as gym serve, chat and eval inject it" in shown.err
    assert main(["tfgrpo", "show", str(model), "--json"]) == 2  # the library JSON needs a whole library


def test_diff_between_versions():
    old = lib("a", "b", "c")
    new = apply(old, [Update(id="E0", text="A"), Delete(id="E1"), Merge(ids=("E1", "E2"), text="m")]).library
    assert new.ids == ["E0", "E2"]  # the merge lost to the delete of E1
    d = diff(old, new)
    assert [i.id for i in d.removed] == ["E1"] and [(o.text, n.text) for o, n in d.changed] == [("a", "A")]
    assert "**updated** `E0`" in d.markdown() and diff(new, new).empty


ALIASES = {"G0": "E3", "G1": "E7", "G2": "E9"}


@pytest.mark.parametrize(
    ("text", "ops", "n_errors"),
    [
        ('Sure! Here you go:\n```json\n[{"operation": "add", "text": "When x, do y."}]\n```\nHope it helps.',
         [Add(text="When x, do y.")], 0),
        ('[{"option": "MODIFY", "experience": "When a, b.", "modified_from": "[G1]"},]',
         [Update(id="E7", text="When a, b.")], 0),
        ("[// keep it\n {'op': 'delete', 'id': 'G2'}, # trailing\n /* block */ {'op': 'none'}]",
         [Delete(id="E9"), NoOp()], 0),
        ('{"operations": [{"operation": "merge", "merged_from": ["G0", 1], "text": "[G0]. When c, d."}]}',
         [Merge(ids=("E3", "E7"), text="When c, d.")], 0),
        ('[{"operation": "update", "id": "G5", "text": "t"}, {"operation": "add", "text": "u"}]',
         [Add(text="u")], 1),
        ('[{"operation": "delete", "id": "E7"}, {"operation": "delete", "id": "E8"}]', [Delete(id="E7")], 1),
        ("[]", [], 0),
        ("Looking at [G3] first. Then: [{\"operation\": \"remove\", \"id\": 0}] done", [Delete(id="E3")], 0),
        ('[{"operation": "rename", "id": "G0"}, "add this", {"operation": "add"}]', [], 3),
        ('[{"operation": "merge", "ids": "G0", "text": "x"}]', [], 1),
        ("I think nothing should change.", [], 1),
        ("", [], 1),
        ("```json\n[{\"operation\": \"add\", \"text\": \"unterminated\n```", [], 1),
        ('[{"operation": "add", "text": "When \\"quoted\\" // not a comment, keep it."}]',
         [Add(text='When "quoted" // not a comment, keep it.')], 0),
    ],
)  # fmt: skip
def test_parser_over_messy_outputs(text, ops, n_errors):
    got, errors = parse_ops(text, ALIASES)
    assert got == ops and len(errors) == n_errors, errors


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("[]{}\",:#/*'Gopadtexn 0123\n")), max_size=80))
def test_parser_never_raises(text):
    ops, errors = parse_ops(text, ALIASES)
    assert isinstance(ops, list) and isinstance(errors, list)
    assert all(o.op in ("add", "update", "delete", "merge", "none") for o in ops)


def test_group_selection_keeps_only_informative_groups():
    assert judge_group([1, 0, 1]).informative
    assert not judge_group([0.5, 0.5, 0.5]).informative
    assert not judge_group([1]).informative
    incomplete = judge_group([1, None, 0])
    assert not incomplete.informative and incomplete.reason.startswith("incomplete")


def test_metrics():
    assert mean_at_k([[1, 0, 1], [0, 0, 0]]) == pytest.approx(1 / 3)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert mean_pass_at_k([[1, 0], [0, 0]], k=2) == 0.5
    rows = [[float(i % 3 == 0)] * 4 for i in range(30)]
    low, high = bootstrap_ci(rows, mean_at_k, seed=1)
    assert low <= mean_at_k(rows) <= high and low < high
    r = report(rows, k=2, seed=1, samples=200)
    assert r.questions == 30 and r.pass_at_k_ci[0] <= r.pass_at_k <= r.pass_at_k_ci[1]
