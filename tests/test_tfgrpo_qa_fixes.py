"""TF-GRPO QA findings: failed held-out calls are missing (not 0), refusals are said with the setting to
change, a re-run with --experience-lib-path resumes its own run, K is recorded wherever the library is
written, what answers behind an endpoint is part of its identity, and the low-severity messages.

The remote LLM API is tests/tfgrpo_fakes.py's FakeEndpoint (a real HTTP server on loopback)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gym.errors import ConfigError, DataError
from gym.tfgrpo.clients import EndpointError, OpenAIClient
from gym.tfgrpo.config import TfGrpoSettings
from gym.tfgrpo.data import Question, check_answers, load_questions
from gym.tfgrpo.engine import train
from gym.tfgrpo.injection import EXPERIENCE_FILE, HEADER
from gym.tfgrpo.library import Experience, Library
from gym.tfgrpo.runtime import Runtime
from tests.tfgrpo_fakes import FakeEndpoint

CONTEXT = "This model's maximum context length is 512 tokens. However, you requested 600 tokens"
REFUSED = (400, {}, {"error": {"message": CONTEXT, "type": "invalid_request_error"}})
ADD = '[{"operation": "add", "text": "When asked, answer 7."}]'
QUESTIONS = [Question(id=str(i), prompt=[{"role": "user", "content": f"q{i}"}], answer="7") for i in range(3)]


def endpoint(refuse_library: bool = False, refuse_optimizer: bool = False) -> FakeEndpoint:
    """A policy right or wrong by seed and an optimizer that adds one experience; `refuse_library`: the
    policy's prompts holding the library are refused for context length (as gym serve and vLLM do),
    `refuse_optimizer`: every optimizer call is."""

    def answer(body: dict[str, Any]) -> Any:
        messages = body["messages"]
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        if not system or system.startswith(HEADER):  # the policy
            if refuse_library and system:
                return REFUSED
            return ["7" if (body["seed"] + i) % 2 else "3" for i in range(body.get("n") or 1)]
        if refuse_optimizer:
            return REFUSED
        return "It answered." if system.startswith("You review") else ADD

    return FakeEndpoint(answer)


def settings(url: str, **kw: Any) -> TfGrpoSettings:
    base: dict[str, Any] = dict(
        endpoint=url, group_size=4, epochs=1, batch_size=3, reward="numeric", seed=1, eval_samples=2
    )
    return TfGrpoSettings(**{**base, **kw})


# ---- 1: failed held-out calls ---------------------------------------------------------------------------


def test_refused_evaluation_calls_are_missing_not_zero_and_degraded_steps_are_said(gym_home, tmp_path):
    """The library-injected prompt overflowing the context made every later evaluation call fail: they
    were scored as wrong answers (mean_at_k [0.58, 0.0, 0.0], exit 0, nothing said)."""
    with endpoint(refuse_library=True) as url:
        rt = Runtime(settings(url, epochs=2), model="fake", run_dir=tmp_path / "run")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = train(rt, QUESTIONS, QUESTIONS[:2])
    said = [str(w.message) for w in caught]
    assert isinstance(result.mean_at_k[0], float)  # the empty library's prompts were answered
    assert result.mean_at_k[1:] == [None, None] and result.pass_at_k[1:] == [None, None]
    stored = json.loads((rt.run_dir / "result.json").read_text())
    assert stored["mean_at_k"][1:] == [None, None]
    evaluation = json.loads((rt.run_dir / "evals" / "epoch1.json").read_text())
    assert evaluation["report"] is None and evaluation["failed"] == 2 * 2
    missing = next(m for m in said if "held-out Mean@k/Pass@k missing (null) for epoch1, epoch2" in m)
    assert f"HTTP 400: {CONTEXT}" in missing and "--policy.max_tokens N" in missing
    assert "\n" not in missing
    # the second epoch's rollouts were refused too: its step is degraded, and that is said, with why
    assert result.degraded_steps == 1
    degraded = next(m for m in said if "1 of 2 steps degraded" in m)
    assert f"HTTP 400: {CONTEXT}" in degraded and "--policy.max_tokens" in degraded


# ---- 4: an optimizer refused every time -------------------------------------------------------------------


def test_a_run_whose_optimizer_was_refused_every_time_fails_naming_its_max_tokens(gym_home, tmp_path):
    """gym serve of gym-tiny as the optimizer (512-token window, default max_tokens 1,024) refused every
    call: the run ended 0 with "a summary is missing (its call failed)"."""
    with endpoint(refuse_optimizer=True) as url:
        rt = Runtime(settings(url), model="fake", run_dir=tmp_path / "run")
        with pytest.raises(ConfigError) as caught:
            train(rt, QUESTIONS)
    message = str(caught.value)
    assert "optimizer calls (summarize, extract, consolidate) was answered, so nothing was learned" in message
    assert f"(HTTP 400: {CONTEXT})" in message
    assert "lower the optimizer's max_tokens (now 1024: --optimizer.max_tokens N" in message
    assert "\n" not in message and "reachable" not in message


def test_a_flow_that_learned_nothing_does_not_say_done_before_its_error(prefect_server, tmp_path, capsys):
    """The console said `tf_grpo: done, 1 step in 0:08, library 0 items`, then the run failed."""
    from flows.cli import main

    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "7"}) + "\n" for i in range(3)))
    with endpoint(refuse_optimizer=True) as url:
        argv = f"train --method tf_grpo --endpoint {url} --model fake --dataset {data} --eval_dataset none "
        argv += "--group-size 4 --epochs 1 --batch_size 3 --reward numeric"
        assert main(argv.split()) == 2
    err = capsys.readouterr().err
    assert "so nothing was learned" in err.strip().splitlines()[-1] and "tf_grpo: done" not in err


def test_a_missing_summary_says_why_its_call_failed():
    from gym.tfgrpo import stages
    from gym.tfgrpo.data import StepPlan

    call = stages.CallInfo(stage="summarize", key="k", prompt_tokens=0, completion_tokens=0, cost=0.0,
                           error="BadRequestError: Error code: 400 - too long")  # fmt: skip
    rt = SimpleNamespace(settings=TfGrpoSettings())
    step = StepPlan(index=0, epoch=0, batch=0, questions=(0,))
    summaries = [stages.Summary(text="ok"), stages.Summary(text=None, call=call)]
    out = stages.extract(rt, step, QUESTIONS[0], [1.0, 0.0], summaries, Library())  # type: ignore[arg-type]
    why = "its call failed: BadRequestError: Error code: 400 - too long"
    assert out.errors == [f"1 of 2 summaries are missing ({why})"]


# ---- 3 and 5: --experience-lib-path ---------------------------------------------------------------------


def prepared(url: str, lib: Path, **kw: Any) -> Any:
    from gym.train import tf_grpo

    s = settings(url, experience_lib_path=str(lib), retrieval_top_k=50, **kw)
    run = tf_grpo.prepare(s, "fake", QUESTIONS, "digest-of-questions")
    return run, train(tf_grpo.runtime(run), QUESTIONS, initial=run.start)


def test_rerunning_a_command_that_started_from_a_library_resumes_instead_of_learning_on(gym_home, tmp_path):
    """The library at --experience-lib-path became the starting library of every re-run of the same
    command: a new run dir, new paid calls, the library overwritten (2 -> 4 -> 5 items)."""
    lib = tmp_path / "lib"
    given = Library(items=(Experience(id="E0", text="When adding, carry the tens."),), next_id=1)
    given.save(lib / EXPERIENCE_FILE)
    with endpoint() as url:
        run, first = prepared(url, lib)
        assert run.start == given and first.paid_calls > 0 and first.library_size > 1
        written = json.loads((lib / EXPERIENCE_FILE).read_text())
        assert written["tf_grpo_run"] == {"config_hash": run.config_hash, "start": given.content_hash()}
        assert written["retrieval_top_k"] == 50  # K recorded here as in the shipped model (finding 5)
        again_run, again = prepared(url, lib)
        assert again_run.run_dir == run.run_dir and again.paid_calls == 0
        assert again.library_hash == first.library_hash
        assert Library.load(lib / EXPERIENCE_FILE).content_hash() == first.library_hash
        # another command (a changed setting) does start from the library it finds there
        other_run, _ = prepared(url, lib, seed=2)
        assert other_run.run_dir != run.run_dir and other_run.start is not None
        assert other_run.start.content_hash() == first.library_hash


class Policy:
    """An API client double (what APIModelAdapter is): right or wrong by seed; the optimizer adds."""

    identity, max_n = "fake-api", 1

    def complete(self, messages, *, temperature, max_tokens, seed, n=1):
        from gym.tfgrpo.clients import Completion, Usage

        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        if not system or system.startswith(HEADER):
            texts = ["7" if (seed + i) % 2 else "3" for i in range(n)]
        else:
            texts = ["It answered." if system.startswith("You review") else ADD] * n
        return Completion(texts=texts, usage=Usage(prompt_tokens=3, completion_tokens=1))


def test_grpo_trainer_records_k_in_its_output_dir_and_resumes_its_own_library(gym_home, tmp_path):
    """GRPOTrainer(..., retrieval_top_k=2) shipped an output_dir experiences.json without K; and its
    library_path, once a run had started from a library there, was learned on from by every re-run."""
    from gym.train.grpo import GRPOTrainer
    from gym.train.grpo.experience_manager import ExperienceManager

    given = Library(items=(Experience(id="E0", text="When adding, carry the tens."),), next_id=1)
    given.save(tmp_path / "lib" / EXPERIENCE_FILE)

    def trainer() -> GRPOTrainer:
        return GRPOTrainer(
            model=Policy(),
            args=SimpleNamespace(output_dir=str(tmp_path / "out"), num_train_epochs=1, seed=1),
            experience_manager=ExperienceManager(library_path=tmp_path / "lib"),
            train_dataset=[{"question": q.text, "answer": q.answer} for q in QUESTIONS],
            group_size=4,
            batch_size=3,
            reward="numeric",
            retrieval_top_k=2,
        )

    first = trainer().train()
    shipped = json.loads((tmp_path / "out" / EXPERIENCE_FILE).read_text())
    assert shipped["retrieval_top_k"] == 2 and len(shipped["items"]) == first.library_size
    again = trainer().train()
    assert again.run_dir == first.run_dir and again.paid_calls == 0
    assert again.library_hash == first.library_hash


# ---- 2: what answers behind an endpoint -----------------------------------------------------------------


def test_gym_serve_lists_a_digest_that_the_client_folds_into_its_identity(gym_home, tmp_path):
    """Another model served behind the same URL and name reused every cached call (paid_calls 0)."""
    from gym.serve.app import build_app
    from gym.serve.server import serve_in_thread

    identities = []
    for digest in ("weights-a", "weights-b", None):
        engine: Any = SimpleNamespace(name="m", context_length=512, digest=digest)
        with serve_in_thread(build_app(engine)) as base:
            import httpx

            card = httpx.get(f"{base}/v1/models").json()["data"][0]
            assert card.get("digest") == digest
            client = OpenAIClient(f"{base}/v1", "m")
            identities.append((client.identity, base))
    (a, base_a), (b, base_b), (plain, base_c) = identities
    assert a == f"openai:{base_a}/v1#m@weights-a" and b == f"openai:{base_b}/v1#m@weights-b"
    assert plain == f"openai:{base_c}/v1#m"  # a server listing no digest: the URL and name


def test_refresh_asks_every_call_again_and_redoes_the_steps(gym_home, tmp_path):
    """--refresh-cache (Runtime.refresh) is the way past the call cache for a server listing no digest."""
    fake = endpoint()
    with fake as url:
        first = train(Runtime(settings(url), model="fake", run_dir=tmp_path / "run"), QUESTIONS)
        asked = len(fake.requests)
        cached = train(Runtime(settings(url), model="fake", run_dir=tmp_path / "run"), QUESTIONS)
        assert cached.paid_calls == 0 and len(fake.requests) == asked
        fresh = Runtime(settings(url), model="fake", run_dir=tmp_path / "run", refresh=True)
        refreshed = train(fresh, QUESTIONS)
    assert refreshed.paid_calls == first.paid_calls and len(fake.requests) == 2 * asked
    assert refreshed.library_hash == first.library_hash  # the same answers: the same library


# ---- 6, 7, 8, 9: messages ---------------------------------------------------------------------------------


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_missing_answer_names_its_file_and_its_own_record(gym_home, tmp_path):
    a = write(tmp_path / "a.jsonl", [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(3)])
    b = write(tmp_path / "b.jsonl", [{"question": "2+2?", "answer": "4"}, {"question": "3+3?"}])
    questions, _ = load_questions(f"{a},{b}")
    with pytest.raises(ConfigError, match=rf"training record 2 of --dataset {b} has no answer"):
        check_answers("auto", questions, None)
    one, _ = load_questions(b)
    with pytest.raises(ConfigError, match=rf"training record 2 of --dataset {b} has no answer"):
        check_answers("auto", one, None)


def test_questions_beyond_the_limit_are_said_to_be_left_out(gym_home, tmp_path, capsys):
    data = write(tmp_path / "q.jsonl", [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(5)])
    questions, _ = load_questions(data, limit=3)
    assert len(questions) == 3
    note = f"uses the first 3 of the 5 questions of {data} (--max-train-questions 3: raise it"
    assert note in capsys.readouterr().err
    load_questions(data, limit=5)
    assert "uses the first" not in capsys.readouterr().err


def test_show_says_a_library_is_empty_or_malformed(tmp_path, capsys):
    from gym.tfgrpo.cli import cmd_tfgrpo

    Library().save(tmp_path / "empty" / EXPERIENCE_FILE)
    assert cmd_tfgrpo(["show", str(tmp_path / "empty")]) == 0
    out = capsys.readouterr()
    assert "the experience library is empty" in out.out and HEADER not in out.out
    bad = tmp_path / "bad" / EXPERIENCE_FILE
    bad.parent.mkdir()
    bad.write_text('{"foo": 1}')
    with pytest.raises(DataError) as caught:
        cmd_tfgrpo(["show", str(tmp_path / "bad")])
    assert str(bad) in str(caught.value) and "not an experience library" in str(caught.value)
    assert "inject" not in capsys.readouterr().err


def test_a_key_variable_that_is_not_set_is_said_to_be_unset(monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    refused = (401, {}, {"error": {"message": "invalid or missing API key", "code": "invalid_api_key"}})
    with FakeEndpoint(lambda body: refused) as url:
        client = OpenAIClient(url, "m", api_key_env="NOPE_KEY")
        with pytest.raises(EndpointError) as caught:
            client.complete([{"role": "user", "content": "hi"}], temperature=0, max_tokens=4, seed=0)
    message = str(caught.value)
    assert "$NOPE_KEY is not set" in message and "refused the API key in" not in message
    assert "export NOPE_KEY=" in message


def test_gym_serve_says_which_library_it_injects():
    from gym.serve.cli import experience_line
    from gym.tfgrpo.injection import ShippedLibrary

    whole = experience_line(ShippedLibrary(texts=["a", "b", "c"], hash="0123456789abcdef", version=4))
    assert "3 experiences (version 4, hash 0123456789ab)" in whole and "all of them" in whole
    some = experience_line(ShippedLibrary(texts=["a", "b", "c"], version=4, retrieval_top_k=2))
    assert "the 2 most similar to each request's question (retrieval_top_k 2)" in some
