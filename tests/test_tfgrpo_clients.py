"""LLM clients over real loopback HTTP (retries, timeouts, key from the environment, per-endpoint
concurrency), the call cache, the cost ledger, and rewards. The local client: test_tfgrpo_http.py."""

from __future__ import annotations

import threading

import pytest

from gym.tfgrpo.calls import BudgetExceeded, CallCache, Caller, Ledger
from gym.tfgrpo.clients import LLMError, OpenAIClient
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.rewards import final_answer, majority_rewards, parse_verdict, verify
from tests.tfgrpo_fakes import FakeEndpoint, completion

MSG = [{"role": "user", "content": "2+2?"}]


def ask(client, seed=0, n=1):
    return client.complete(MSG, temperature=0.5, max_tokens=8, seed=seed, n=n)


def test_retries_429_and_5xx_with_backoff_and_sends_key_from_env_and_seed(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-test-123")
    replies = iter([(429, {"retry-after-ms": "5"}, {}), (500, {"retry-after-ms": "5"}, {})])
    endpoint = FakeEndpoint(lambda body: next(replies, (200, {}, completion(["4"]))))
    with endpoint as url:
        assert ask(OpenAIClient(url, "m", api_key_env="MY_KEY", max_retries=2), seed=5).texts == ["4"]
    assert len(endpoint.requests) == 3
    assert endpoint.headers[0]["authorization"] == "Bearer sk-test-123"
    assert endpoint.requests[0]["seed"] == 5 and endpoint.requests[0]["model"] == "m"


def test_gives_up_after_retries_and_on_timeouts():
    failing = FakeEndpoint(lambda body: (500, {"retry-after-ms": "1"}, {"error": {"message": "boom"}}))
    with failing as url, pytest.raises(LLMError, match="InternalServerError"):
        ask(OpenAIClient(url, "m", max_retries=1))
    assert len(failing.requests) == 2
    slow = FakeEndpoint(lambda body: "late", latency_s=1.0)
    with slow as url, pytest.raises(LLMError, match="Timeout"):
        ask(OpenAIClient(url, "m", timeout_s=0.2, max_retries=0))


def test_concurrency_is_limited_per_endpoint():
    endpoint = FakeEndpoint(lambda body: "ok", latency_s=0.05)
    with endpoint as url:
        clients = [OpenAIClient(url, "m", concurrency=2), OpenAIClient(url, "other", concurrency=2)]
        threads = [threading.Thread(target=ask, args=(clients[i % 2], i)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(endpoint.requests) == 8 and endpoint.max_in_flight == 2


def role(**kw):
    return TfGrpoSettings(**kw).role("policy", "m")


def test_cache_serves_repeated_calls_and_never_stores_failures(tmp_path):
    calls = {"n": 0}

    def answer(body):
        calls["n"] += 1
        return (500, {"retry-after-ms": "1"}, {}) if body["messages"][0]["content"] == "fail" else "4"

    with FakeEndpoint(answer) as url:
        ledger = Ledger()
        caller = Caller(OpenAIClient(url, "m", max_retries=0), role(), CallCache(tmp_path), ledger)
        first = caller("rollout", MSG, seed=1)
        again = caller("rollout", MSG, seed=1)
        other = caller("rollout", MSG, seed=2)
        assert first.text == again.text == other.text == "4" and first.key == again.key != other.key
        assert calls["n"] == 2 and ledger.cached == 1
        bad = [{"role": "user", "content": "fail"}]
        assert caller("rollout", bad, seed=1).error and caller("rollout", bad, seed=1).error
        assert calls["n"] == 4  # a failure is called again, never served from the cache
        # a fresh process (new caller, same cache directory) pays for nothing it already has
        fresh = Caller(OpenAIClient(url, "m"), role(), CallCache(tmp_path), Ledger())
        assert fresh("rollout", MSG, seed=2).text == "4" and calls["n"] == 4


def test_ledger_prices_per_stage_and_the_budget_stops_paid_calls(tmp_path):
    with FakeEndpoint(lambda body: "one two three") as url:
        ledger = Ledger(max_tokens=8)
        r = role(policy={"price_prompt": 1.0, "price_completion": 2.0})
        caller = Caller(OpenAIClient(url, "m"), r, CallCache(tmp_path), ledger)
        rec = caller("summarize", MSG, seed=1)  # 1 prompt + 3 completion tokens
        assert rec.usage.total == 4 and rec.cost == pytest.approx((1 * 1.0 + 3 * 2.0) / 1e6)
        caller("extract", MSG, seed=2)
        snap = ledger.snapshot()
        assert snap["tokens"] == 8 and set(snap["stages"]) == {"summarize", "extract"}
        with pytest.raises(BudgetExceeded, match="token budget"):
            caller("extract", MSG, seed=3)
        assert caller("extract", MSG, seed=2).text == "one two three"  # cached calls stay free


def test_rewards():
    assert verify("auto", "the answer is 4.0", "4") == 1.0 and verify("auto", "北京", "北京") == 1.0
    assert verify("exact", "4.0", "4") == 0.0
    # auto is numeric only when the reference is a number: not when it merely holds one, nor for a digit
    # string whose leading zeros count (the demo's reversed digits)
    assert verify("auto", "I would say 12", "Vitamin B12 deficiency") == 0.0
    assert verify("auto", "14", "014") == 0.0 and verify("auto", "014", "014") == 1.0
    assert verify("auto", "\\frac{1}{4}", "\\frac{1}{2}") == 0.0
    for reference in ("1,024", "-3.5", "1/2", "$12", "40%", "\\boxed{7}", " 7 "):
        assert verify("auto", f"so it is {reference.strip()}", reference) == 1.0, reference
    assert majority_rewards(["so 4", "4", "5", "x"]) == [1.0, 1.0, 0.0, 0.0]
    assert majority_rewards(["4", "5"]) == [0.0, 0.0]  # tie: nothing rewarded
    assert final_answer("first line\nlast LINE ") == "last line"
    assert parse_verdict("Verdict: CORRECT.") == 1.0 and parse_verdict("incorrect") == 0.0
    assert parse_verdict("maybe") is None


@pytest.mark.parametrize("status", [401, 500])
def test_a_key_the_server_quotes_back_is_never_shown(monkeypatch, status):
    """Some servers and proxies quote the Authorization header in their error: the error (which becomes
    the console line, the step manifests and Prefect's logs and states) and its traceback never show it."""
    import traceback

    from gym.errors import GymError

    key = "sk-quoted-back-0123456789"
    monkeypatch.setenv("MY_KEY", key)

    def answer(body):
        return status, {"retry-after-ms": "1"}, {"error": {"message": f"Incorrect key: Bearer {key}"}}

    with FakeEndpoint(answer) as url, pytest.raises(GymError) as caught:
        ask(OpenAIClient(url, "m", api_key_env="MY_KEY", max_retries=0))
    shown = "".join(traceback.format_exception(caught.value))
    assert "Incorrect key" in str(caught.value) and "***" in str(caught.value)
    assert key not in shown and key[:12] not in shown
