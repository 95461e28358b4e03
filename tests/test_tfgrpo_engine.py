"""One step at a time: exact LLM call counts, manifests, degraded steps, resume after a kill, and
byte-identical results whatever order an HTTP endpoint answers in."""

from __future__ import annotations

import re
import threading
import warnings
from pathlib import Path

import pytest

from gym.tfgrpo.clients import Completion, OpenAIClient, Usage
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question
from gym.tfgrpo.engine import train
from gym.tfgrpo.library import Library
from gym.tfgrpo.runtime import Runtime
from gym.tfgrpo.sim import SimEnv, SimOptimizer, SimPolicy, default_settings
from gym.tfgrpo.step import load_manifest
from tests.tfgrpo_fakes import FakeEndpoint


class Scripted:
    """A client answering with `answer(messages, seed)`; counts calls per stage prefix."""

    max_n = 1

    def __init__(self, identity, answer):
        self.identity, self.answer = identity, answer
        self.calls = 0
        self._lock = threading.Lock()

    def complete(self, messages, *, temperature, max_tokens, seed, n=1):
        with self._lock:
            self.calls += 1
        text = self.answer(messages, seed)
        return Completion(texts=[text] * n, usage=Usage(prompt_tokens=10, completion_tokens=2))


QUESTIONS = [Question(id=str(i), prompt=[{"role": "user", "content": f"q{i}"}], answer="7") for i in range(3)]


def policy_answer(messages, seed):
    q = messages[-1]["content"]
    return {"q0": "7", "q2": "3"}.get(q, "7" if seed % 2 else "3")  # q1: right or wrong by seed


def run(tmp_path, optimizer_answer, **settings):
    s = TfGrpoSettings(group_size=4, epochs=1, batch_size=3, reward="numeric", seed=1, **settings)
    policy, optimizer = Scripted("p", policy_answer), Scripted("o", optimizer_answer)
    rt = Runtime(s, model=None, run_dir=tmp_path / "run", clients={"policy": policy, "optimizer": optimizer})
    result = train(rt, QUESTIONS)
    return result, load_manifest(rt.run_dir, 0), policy, optimizer


def kind(messages):
    system = messages[0]["content"]
    if len(messages) > 2:
        return "repair"
    return (
        "summarize" if system.startswith("You review") else "extract" if "distil" in system else "consolidate"
    )


def test_calls_per_step_summaries_only_for_informative_groups(tmp_path):
    def optimizer(messages, seed):
        return {
            "summarize": "It answered.",
            "extract": '[{"operation": "add", "text": "When asked, answer 7."}]',
            "consolidate": '[{"operation": "add", "text": "When asked, answer 7."}]',
        }[kind(messages)]

    result, manifest, policy, opt = run(tmp_path, optimizer)
    groups = {g.question: g for g in manifest.groups}
    assert sorted(groups["1"].rewards) == [0.0, 0.0, 1.0, 1.0] or 0.0 < sum(groups["1"].rewards) < 4
    assert {q: g.informative for q, g in groups.items()} == {"0": False, "1": True, "2": False}
    assert groups["0"].reason == "all rewards equal (1)" and groups["2"].reason == "all rewards equal (0)"
    assert policy.calls == 12  # 3 questions x G=4, n=1 per call
    assert opt.calls == 4 + 1 + 1  # summaries of q1's 4 rollouts, 1 extraction, 1 consolidation
    assert {k: v.calls for k, v in manifest.usage.items()} == {
        "consolidate": 1, "extract": 1, "rollout": 12, "summarize": 4
    }  # fmt: skip
    assert manifest.status == "done" and manifest.final_ops_from == "consolidation"
    library = Library.load(result.library_file)
    assert library.texts == ["When asked, answer 7."] and library.version == 1
    assert manifest.library_in == Library().content_hash() and manifest.library_out == library.content_hash()
    assert result.llm_calls == 18 and result.tokens == 18 * 12


def test_no_consolidation_call_when_nothing_was_proposed(tmp_path):
    result, manifest, _, opt = run(tmp_path, lambda m, s: "[]" if kind(m) == "extract" else "It answered.")
    assert opt.calls == 4 + 1 and manifest.consolidation is None
    assert manifest.final_ops_from == "nothing proposed" and result.library_version == 0


def test_unreadable_replies_get_one_repair_then_degrade_safely(tmp_path):
    # extraction: junk, then a valid repair; consolidation: junk twice -> the group's proposals are used
    def optimizer(messages, seed):
        k = kind(messages)
        if k == "repair" and "Consolidate" in messages[1]["content"]:
            return "still no JSON"
        return {
            "summarize": "ok",
            "extract": "Let me think... nothing structured",
            "repair": '[{"op": "add", "text": "When asked, answer 7."}]',
            "consolidate": "I would add things.",
        }[k]

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # degraded, but it learned: no warning
        result, manifest, _, opt = run(tmp_path, optimizer)
    assert opt.calls == 4 + 2 + 2
    assert manifest.usage["extract_repair"].calls == 1 and manifest.usage["consolidate_repair"].calls == 1
    assert manifest.status == "degraded" and any("consolidate" in p for p in manifest.problems)
    assert manifest.final_ops_from == "proposals"
    assert Library.load(result.library_file).texts == ["When asked, answer 7."]
    assert result.degraded_steps == 1
    # a resume redoes the degraded step with fresh optimizer calls (new seeds), rollouts from the cache
    s = TfGrpoSettings(group_size=4, epochs=1, batch_size=3, reward="numeric", seed=1)
    policy, again = Scripted("p", policy_answer), Scripted("o", optimizer)
    rt = Runtime(s, model=None, run_dir=tmp_path / "run", clients={"policy": policy, "optimizer": again})
    train(rt, QUESTIONS)
    assert policy.calls == 0 and again.calls == 4 and load_manifest(rt.run_dir, 0).attempt == 1


def test_junk_everywhere_never_corrupts_the_library(tmp_path):
    # A run in which every step degraded and nothing was learned says so (it finished silently).
    with pytest.warns(RuntimeWarning, match=r"TF-GRPO: all 1 steps degraded, so nothing was learned"):
        result, manifest, _, _ = run(
            tmp_path, lambda m, s: '{"operation": "update", "id": "G9", "text": "x"}'
        )
    assert manifest.status == "degraded" and result.library_version == 0
    assert Library.load(result.library_file) == Library()


def test_a_run_whose_every_call_failed_is_an_error_not_a_model(tmp_path):
    """An unreachable endpoint ended a run with exit 0, an empty library and a registered challenger."""
    from gym.errors import ConfigError
    from gym.tfgrpo.clients import LLMError

    def unreachable(messages, seed):
        raise LLMError("openai:http://127.0.0.1:9/v1#m: APIConnectionError: Connection error.")

    settings = TfGrpoSettings(group_size=4, epochs=1, batch_size=3, reward="numeric", seed=1)
    clients = {"policy": Scripted("p", unreachable), "optimizer": Scripted("o", unreachable)}
    rt = Runtime(settings, model=None, run_dir=tmp_path / "run", clients=clients)
    with pytest.raises(
        ConfigError,
        match=r"none of the \d+ calls to the model was answered.*Connection error.*up and reachable",
    ):
        train(rt, QUESTIONS)


CONTEXT = (
    "this model's maximum context length is 512 tokens; the request needs 4108 (12 in the prompt, 4096 to "
    "generate): shorten the prompt or lower max_tokens"
)


@pytest.mark.parametrize(
    "error, expected, unexpected",
    [
        (  # gym serve refusing a max_tokens larger than its context, as the openai client words it
            f"openai:http://127.0.0.1:8000/v1#gym-tiny: BadRequestError: Error code: 400 - {CONTEXT}",
            [f"the endpoint refused the requests (HTTP 400: {CONTEXT})", "--policy.max_tokens N", "now 4096"],
            ["reachable"],
        ),
        (
            "openai:http://127.0.0.1:8000/v1#gpt: NotFoundError: Error code: 404 - model 'gpt' does not "
            "exist; this server serves 'gym-tiny'",
            ["refused the requests (HTTP 404: model 'gpt' does not exist", "model name ('gym-tiny'"],
            ["reachable", "max_tokens"],
        ),
        (
            "openai:http://h/v1#m: UnprocessableEntityError: Error code: 422 - " + "x" * 1000,
            ["(HTTP 422: " + "x" * 297 + "...)", "--policy.*"],
            ["x" * 298, "reachable"],
        ),
        (
            "openai:http://h/v1#m: AuthenticationError: Error code: 401 - Incorrect API key provided",
            ["refused the requests (HTTP 401: Incorrect API key", "$OPENAI_API_KEY"],
            ["reachable"],
        ),
        (  # no HTTP answer, a timeout, a server error, rate limits: the endpoint was not there to answer
            "openai:http://127.0.0.1:9/v1#m: APIConnectionError: Connection error.",
            ["(the first error: openai:http://127.0.0.1:9/v1#m: APIConnectionError", "up and reachable"],
            ["refused"],
        ),
        ("openai:http://h/v1#m: APITimeoutError: Request timed out.", ["up and reachable"], ["refused"]),
        (
            "openai:http://h/v1#m: InternalServerError: Error code: 500 - boom",
            ["Error code: 500 - boom", "up and reachable"],
            ["refused"],
        ),
        (
            "openai:http://h/v1#m: RateLimitError: Error code: 429 - slow down",
            ["up and reachable"],
            ["refused"],
        ),
    ],
)
def test_why_no_call_was_answered_names_the_cause_and_the_setting(error, expected, unexpected):
    """A run whose every call gym serve refused for context length (HTTP 400) was told to check that
    the endpoint is up and reachable: a client error is the endpoint refusing the request as sent."""
    from gym.tfgrpo.engine import unanswered_advice

    policy = TfGrpoSettings(endpoint="http://127.0.0.1:8000/v1", policy={"max_tokens": 4096}).role(
        "policy", "gym-tiny"
    )
    advice = unanswered_advice(error, policy)
    assert all(e in advice for e in expected), advice
    assert not any(u in advice for u in unexpected), advice


def test_a_hosted_api_without_its_key_is_refused_before_any_call(monkeypatch):
    """The README's APIModelAdapter.deepseek() run without $DEEPSEEK_API_KEY made every call fail,
    and the run ended silently with an empty library."""
    from gym.errors import ConfigError
    from gym.train.grpo.api_model_adapter import APIModelAdapter

    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"needs an API key and \$DEEPSEEK_API_KEY is not set"):
        APIModelAdapter.deepseek()
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-test")
    assert APIModelAdapter.deepseek().base_url == "https://api.deepseek.com/v1"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a server of one's own needs none
    assert OpenAIClient("http://127.0.0.1:8000/v1", "gym-tiny").model == "gym-tiny"


class Killed(BaseException):
    """Stands for the process dying mid-call."""


class Life:
    """Calls left before the process "dies"; shared by every client of the run."""

    def __init__(self, budget):
        self.budget, self.done = budget, 0
        self.lock = threading.Lock()


class Mortal:
    """Wraps a client; once the shared budget of successful calls is spent, every call dies."""

    def __init__(self, inner, life):
        self.inner, self.life, self.identity, self.max_n = inner, life, inner.identity, inner.max_n

    def complete(self, messages, **kw):
        with self.life.lock:
            if self.life.done >= self.life.budget:
                raise Killed
            self.life.done += 1
        return self.inner.complete(messages, **kw)


def sim_run(run_dir: Path, budget: float = float("inf")):
    env = SimEnv(seed=3, families=4, train_per_family=3, eval_per_family=2)
    settings = default_settings(seed=3).model_copy(update={"epochs": 2, "batch_size": 4, "group_size": 3})
    life = Life(budget)
    clients = {"policy": Mortal(SimPolicy(env), life), "optimizer": Mortal(SimOptimizer(), life)}
    rt = Runtime(settings, model=None, run_dir=run_dir, clients=clients, cache_dir=run_dir / "calls")
    train_q, eval_q = env.questions()
    try:
        result = train(rt, train_q, eval_q)
    except Killed:
        result = None
    return result, life.done


def step_files(run_dir: Path) -> dict[str, bytes]:
    files = [
        *run_dir.glob("steps/*/manifest.json"),
        *run_dir.glob("libraries/*.json"),
        run_dir / "library.json",
    ]
    return {str(f.relative_to(run_dir)): f.read_bytes() for f in files}


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6, 0.99])
def test_resume_after_a_kill_repeats_no_completed_call_and_ends_the_same(tmp_path, fraction):
    full, full_calls = sim_run(tmp_path / "full")
    kill_after = int(fraction * full_calls) + 1
    killed, first_calls = sim_run(tmp_path / "killed", budget=kill_after)
    assert killed is None and first_calls == kill_after
    resumed, second_calls = sim_run(tmp_path / "killed")
    assert resumed is not None and first_calls + second_calls == full_calls
    assert resumed.library_hash == full.library_hash and resumed.mean_at_k == full.mean_at_k
    assert step_files(tmp_path / "killed") == step_files(tmp_path / "full")


def test_byte_identical_runs_whatever_order_the_endpoint_answers_in(tmp_path):
    env = SimEnv(seed=5, families=4, train_per_family=3, eval_per_family=1)
    policy, optimizer = SimPolicy(env), SimOptimizer()

    def answer(body):
        client = policy if body["model"] == "policy" else optimizer
        return client.complete(
            body["messages"], temperature=0, max_tokens=1, seed=body["seed"], n=body["n"]
        ).texts

    settings = default_settings(seed=5).model_copy(update={"epochs": 2, "batch_size": 4, "group_size": 3})
    endpoint = FakeEndpoint(answer, jitter_s=0.01)
    train_q, eval_q = env.questions()
    orders = []
    with endpoint as url:
        for name in ("a", "b"):
            start = len(endpoint.completed)
            clients = {"policy": OpenAIClient(url, "policy"), "optimizer": OpenAIClient(url, "optimizer")}
            rt = Runtime(
                settings,
                model=None,
                run_dir=tmp_path / name,
                clients=clients,
                cache_dir=tmp_path / f"c{name}",
            )
            train(rt, train_q, eval_q)
            orders.append([(r["model"], r["seed"]) for r in endpoint.completed[start:]])
    assert sorted(orders[0]) == sorted(orders[1]) and orders[0] != orders[1]  # same calls, other order
    assert step_files(tmp_path / "a") == step_files(tmp_path / "b")
    manifests = [m for m in step_files(tmp_path / "a") if m.startswith("steps")]
    assert len(manifests) == 6 and all(re.match(r"steps/\d{4}/manifest.json", m) for m in manifests)
