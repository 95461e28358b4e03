"""TF-GRPO: libraries written by hand, budgets over a whole run, per-role concurrency, the served
weights' digest on a slow server, operations written one per line, and runs where no group differs."""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from gym.errors import DataError, GymWarning
from gym.tfgrpo import clients
from gym.tfgrpo.calls import BudgetExceeded, CallCache, Caller, Ledger
from gym.tfgrpo.clients import Completion, OpenAIClient, Usage
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question
from gym.tfgrpo.engine import train
from gym.tfgrpo.library import Library
from gym.tfgrpo.ops import Delete, apply
from gym.tfgrpo.parse import parse_ops
from gym.tfgrpo.runtime import SPEND_FILE, Runtime
from tests.tfgrpo_fakes import FakeEndpoint

MSG = [{"role": "user", "content": "q"}]


# ---- a library written by hand ------------------------------------------------------------------------


def test_a_hand_written_library_gets_new_ids_after_its_own():
    """Its next_id defaulted to 0, so the first experience learned was E0 again: one delete removed two."""
    text = '{"items": [{"id": "E0", "text": "When seeding, do A."}, {"id": "E4", "text": "When B, do B."}]}'
    library = Library.from_json(text, "lib.json")  # no format header: as a shipped library is written
    assert library.next_id == 5
    grown = apply(library, parse_ops('[{"operation": "add", "text": "When C, do C."}]', {})[0]).library
    assert grown.ids == ["E0", "E4", "E5"]
    smaller = apply(grown, [Delete(id="E0")]).library
    assert smaller.texts == ["When B, do B.", "When C, do C."]


@pytest.mark.parametrize(
    ("items", "extra", "expected"),
    [
        (
            '{"id": "E0", "text": "a"}, {"id": "E0", "text": "b"}',
            "",
            r"items\[1\] \(id 'E0'\): id given twice",
        ),
        ('{"id": "E0", "text": "  "}', "", r"items\[0\] \(id 'E0'\): empty text"),
        (
            '{"id": "E0", "text": "one two three"}',
            ', "max_words": 2',
            "3 words, over the library's max_words of 2",
        ),
        ('{"id": "E0", "text": "a"}, {"id": "E1", "text": "b"}', ', "max_items": 1', "2 items, over .* of 1"),
    ],
)
def test_a_hand_written_library_gym_could_not_have_written_is_refused_naming_the_item(items, extra, expected):
    with pytest.raises(DataError, match=expected) as e:
        Library.from_json(f'{{"items": [{items}]{extra}}}', "lib.json")
    assert str(e.value).startswith("file lib.json, field ")


def test_a_file_that_is_no_library_is_still_refused():
    with pytest.raises(DataError, match="not an experience library"):
        Library.from_json('{"experiences": []}', "lib.json")


# ---- the budget is the run's -----------------------------------------------------------------------------


def test_the_budget_counts_what_earlier_invocations_of_the_run_paid(tmp_path):
    """A run stopped at its budget and started again with the same budget spent as much again."""
    spend = tmp_path / "run" / SPEND_FILE
    with FakeEndpoint(lambda body: "one two three") as url:
        client = OpenAIClient(url, "m")
        settings = TfGrpoSettings(endpoint=url)
        role = settings.role("policy", "m")

        def caller(budget: int) -> Caller:
            ledger = Ledger(max_tokens=budget)
            ledger.attach(spend)
            return Caller(client, role, CallCache(tmp_path / "calls"), ledger)

        first = caller(8)
        first("rollout", MSG, seed=1)  # 1 prompt + 3 completion tokens
        first("rollout", MSG, seed=2)
        with pytest.raises(BudgetExceeded, match=r"token budget spent \(8 of 8\)"):
            first("rollout", MSG, seed=3)
        again = caller(8)  # the same budget: nothing more is paid
        with pytest.raises(BudgetExceeded, match=r"\(8 of 8 by the run's paid calls so far\)"):
            again("rollout", MSG, seed=3)
        assert again("rollout", MSG, seed=2).text == "one two three"  # answered calls stay free
        raised = caller(12)  # raised to 12: 4 tokens more in all
        raised("rollout", MSG, seed=3)
        with pytest.raises(BudgetExceeded, match=r"\(12 of 12"):
            raised("rollout", MSG, seed=4)


class Always:
    """A client whose every answer is `text`."""

    max_n = 1

    def __init__(self, identity: str, text: str) -> None:
        self.identity, self.text, self.calls = identity, text, 0

    def complete(self, messages, *, temperature, max_tokens, seed, n=1):
        self.calls += 1
        return Completion(texts=[self.text] * n, usage=Usage(prompt_tokens=10, completion_tokens=2))


QUESTIONS = [Question(id=str(i), prompt=[{"role": "user", "content": f"q{i}"}], answer="7") for i in range(3)]


def test_a_run_keeps_what_its_paid_calls_spent_in_its_run_directory(tmp_path):
    s = TfGrpoSettings(group_size=2, epochs=1, batch_size=3, reward="numeric", seed=1)
    clients_ = {"policy": Always("p", "7"), "optimizer": Always("o", "[]")}
    rt = Runtime(s, model=None, run_dir=tmp_path / "run", clients=clients_)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GymWarning)
        result = train(rt, QUESTIONS)
    import json

    assert json.loads((rt.run_dir / SPEND_FILE).read_text()) == {"tokens": result.tokens, "cost_usd": 0.0}
    assert result.tokens == 6 * 12


# ---- concurrency per role --------------------------------------------------------------------------------


def most_in_flight(url: str, endpoint: FakeEndpoint, concurrency: int, calls: int = 8) -> int:
    endpoint.max_in_flight = 0
    client = OpenAIClient(url, "m", concurrency=concurrency)
    with ThreadPoolExecutor(max_workers=calls) as pool:
        list(
            pool.map(
                lambda seed: client.complete(MSG, temperature=1.0, max_tokens=4, seed=seed), range(calls)
            )
        )
    return endpoint.max_in_flight


def test_a_role_keeps_to_its_own_limit_whatever_another_client_of_the_endpoint_asked():
    """The endpoint's limiter was created with the first caller's limit: a later client (another role, or
    the next run of a notebook) asking for 8 got 1, and one asking for 1 got another's 8."""
    endpoint = FakeEndpoint(lambda body: "4", latency_s=0.3)
    with endpoint as url:
        assert most_in_flight(url, endpoint, 1) == 1
        assert most_in_flight(url, endpoint, 8) > 1
        assert most_in_flight(url, endpoint, 1) == 1
    same = clients.endpoint_semaphore(url, 3)
    assert clients.endpoint_semaphore(url, 3) is same  # roles asking the same share one limit


# ---- the served weights' digest ---------------------------------------------------------------------------


def models_answer(status: int, delay: float = 0.0):
    def answer():
        time.sleep(delay)
        return status, {"object": "list", "data": [{"id": "m", "object": "model", "digest": "w1"}]}

    return answer


@pytest.mark.parametrize(
    ("status", "delay", "warned"), [(200, 0.0, False), (404, 0.0, False), (503, 0.0, True), (200, 1.0, True)]
)
def test_a_model_list_the_server_was_slow_to_give_is_warned_of(monkeypatch, status, delay, warned):
    """A /v1/models slower than 5 s (a busy server) gave no digest: a new run identity, silently, so an
    interrupted run started from scratch, paying every call again."""
    monkeypatch.setattr(clients, "DIGEST_TIMEOUT_S", 0.3)
    with (
        FakeEndpoint(lambda body: "4", models=models_answer(status, delay)) as url,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        client = OpenAIClient(url, "m", max_retries=0)
    said = [str(w.message) for w in caught if issubclass(w.category, GymWarning)]
    assert client.digest == ("w1" if status == 200 and not delay else None)
    assert bool(said) == warned
    if warned:
        assert said[0].startswith(f"{url}/models gave no model list in two tries of up to 0.3 s")
        assert "does not resume a run that was" in said[0]


def test_the_model_list_waits_longer_than_a_busy_second():
    assert clients.DIGEST_TIMEOUT_S >= 30


# ---- operations, one per line ----------------------------------------------------------------------------


def test_operations_written_one_per_line_are_all_read():
    text = '{"operation": "add", "text": "When A, do A."}\n{"operation": "add", "text": "When B, do B."}'
    ops, errors = parse_ops(text, {})
    assert [op.text for op in ops] == ["When A, do A.", "When B, do B."] and errors == []


def test_two_separate_lists_are_an_error_that_asks_for_one():
    """The second list was dropped silently: no repair, the step not degraded."""
    text = '[{"operation": "add", "text": "When A, do A."}]\nAlso: [{"operation": "add", "text": "When B."}]'
    assert parse_ops(text, {}) == (
        [],
        ["2 separate lists of operations; write every operation in one JSON list"],
    )


def test_prose_after_the_list_is_not_a_second_list():
    text = '[{"operation": "add", "text": "When A, do A."}]\nThis merges [1, 2] and keeps {"x": 1}.'
    ops, errors = parse_ops(text, {})
    assert [op.text for op in ops] == ["When A, do A."] and errors == []


# ---- a run where no group differs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group_size", "answer", "reward", "expected"),
    [
        (1, "7", "numeric", "with --group_size 1 no group can"),
        (2, "The answer is seven.", "auto", "every scored answer got 0; with --reward auto a text answer"),
        (2, "7", "numeric", "every scored answer got 1; a larger --group_size"),
    ],
)
def test_a_run_that_never_had_an_informative_group_says_it_learned_nothing(
    tmp_path, group_size, answer, reward, expected
):
    s = TfGrpoSettings(group_size=group_size, epochs=1, batch_size=3, reward=reward, seed=1)
    optimizer = Always("o", "[]")
    rt = Runtime(
        s,
        model=None,
        run_dir=tmp_path / "run",
        clients={"policy": Always("p", answer), "optimizer": optimizer},
    )
    questions = [q.model_copy(update={"answer": "seven" if reward == "auto" else "7"}) for q in QUESTIONS]
    with pytest.warns(GymWarning, match="no group of the 1 steps had rewards that differ") as caught:
        result = train(rt, questions)
    assert expected in str(caught[-1].message) and result.library_size == 0 and optimizer.calls == 0


def test_a_run_with_an_informative_group_says_nothing_of_it(tmp_path):
    s = TfGrpoSettings(group_size=2, epochs=1, batch_size=3, reward="numeric", seed=1)
    lock, answers = threading.Lock(), iter(["7", "3"] * 10)

    class Alternating(Always):
        def complete(self, messages, **kwargs):
            with lock:
                self.text = next(answers)
            return super().complete(messages, **kwargs)

    rt = Runtime(s, model=None, run_dir=tmp_path / "run",
                 clients={"policy": Alternating("p", ""), "optimizer": Always("o", "[]")})  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(rt, QUESTIONS)
    assert not [w for w in caught if "rewards that differ" in str(w.message)]


# ---- room for a prompt -----------------------------------------------------------------------------------


def test_a_reply_length_that_fills_the_served_context_is_refused_before_the_run(gym_home):
    """gym-tiny's 512-token window and the policy's default max_tokens of 512: the server refused every
    call of the README's offline run, which ended only after all of them."""
    from types import SimpleNamespace

    from gym.errors import ConfigError
    from gym.pipeline import TfGrpoFlowConfig
    from gym.preflight import check_reply_room
    from gym.serve.app import build_app
    from gym.serve.server import serve_in_thread

    engine = SimpleNamespace(name="gym-tiny", context_length=512, digest=None)
    with serve_in_thread(build_app(engine)) as base:  # type: ignore[arg-type]
        url = f"{base}/v1"
        with pytest.raises(
            ConfigError, match=r"policy.max_tokens: 512 tokens to generate leave no room"
        ) as e:
            check_reply_room(TfGrpoFlowConfig(endpoint=url, model="gym-tiny"))
        assert "--policy.max_tokens below it (e.g. 128)" in str(e.value)
        check_reply_room(TfGrpoFlowConfig(endpoint=url, model="gym-tiny", policy={"max_tokens": 64},
                                          optimizer={"max_tokens": 256}))  # fmt: skip
        with pytest.raises(ConfigError, match=r"optimizer\.max_tokens: 1024"):
            check_reply_room(TfGrpoFlowConfig(endpoint=url, model="gym-tiny", policy={"max_tokens": 64}))
        check_reply_room(TfGrpoFlowConfig(endpoint=url, model="another-name"))  # no length listed: no check
