"""The OpenAI-compatible server over real HTTP on loopback, driven by the official `openai` client.

One engine (a noisy gym-tiny, so every prompt gets its own greedy answer) serves every test in
this module through uvicorn in a background thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gym.serve.app import build_app
from gym.serve.engine import Engine, RequestError
from gym.serve.params import SamplingParams
from gym.serve.scoring import plan
from gym.serve.server import serve_in_thread
from gym.serve.settings import Limits
from tests.serve_fixtures import module_noisy_tiny

# One worker runs this module under pytest-xdist, so its engine and server are built once.
pytestmark = pytest.mark.xdist_group("serve-http")

KEY = "test-key-0123456789"
NAME = "tiny"
LIMITS = Limits(max_tokens=64, max_prompt_tokens=128, max_concurrent=64, max_prompts=8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return module_noisy_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    with Engine.load(str(model_dir), name=NAME) as e:
        yield e


@pytest.fixture(scope="module")
def url(engine: Engine):
    with serve_in_thread(build_app(engine, LIMITS, api_key=KEY)) as base:
        yield base


@pytest.fixture()
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def direct_greedy(model_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate, one prompt, no server: the reference for served text."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    ids = out[0, len(prompt_ids) :].tolist()
    return ids[: ids.index(2)] if 2 in ids else ids  # 2 = <|im_end|>, gym-tiny's end of turn


def test_models_and_greedy_chat_equal_direct_generate(client, engine, model_dir):
    assert [m.id for m in client.models.list().data] == [NAME]
    reply = client.chat.completions.create(
        model=NAME, messages=ask("name a river"), max_tokens=12, temperature=0
    )
    prompt = engine.encode_chat(ask("name a river"))
    expected = engine._decoder.decode(direct_greedy(model_dir, prompt, 12), skip_special_tokens=True)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected
    assert reply.usage.prompt_tokens == len(prompt)
    assert 0 < reply.usage.completion_tokens <= 12
    assert choice.finish_reason == ("length" if reply.usage.completion_tokens == 12 else "stop")


def test_streaming_chat_equals_the_non_streamed_answer(client):
    kwargs = {"model": NAME, "messages": ask("tell me about the moon"), "max_tokens": 20, "temperature": 0}
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len([c for c in chunks if c.choices]) > 3
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions_take_several_prompts_and_n_choices(client):
    single = client.completions.create(model=NAME, prompt="the cat", max_tokens=6, temperature=0)
    assert single.object == "text_completion" and single.choices[0].text
    many = client.completions.create(
        model=NAME, prompt=["the cat", "a dog"], n=2, max_tokens=6, temperature=0
    )
    assert [c.index for c in sorted(many.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in many.choices}
    assert by_index[0] == by_index[1] == single.choices[0].text  # greedy: both choices alike
    assert by_index[2] != by_index[0]
    streamed = client.completions.create(
        model=NAME, prompt="the cat", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == single.choices[0].text


def test_a_seed_makes_sampling_repeatable(client):
    def sample(seed: int):
        reply = client.chat.completions.create(
            model=NAME, messages=ask("a story"), max_tokens=16, temperature=1.0, top_p=0.9, n=3, seed=seed
        )
        return [c.message.content for c in sorted(reply.choices, key=lambda c: c.index)]

    first = sample(7)
    assert sample(7) == first
    assert len(set(first)) == 3  # the n choices are independent draws
    assert sample(8) != first


def test_stop_strings_end_the_text_before_them(client):
    kwargs = {"model": NAME, "messages": ask("hello there"), "max_tokens": 24, "temperature": 1.0, "seed": 3}
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    # a 2-character stop from the middle, without U+FFFD (bytes of a character still in progress)
    start = next(i for i in range(len(full) // 2, len(full) - 1) if "\ufffd" not in full[i : i + 2])
    stop = full[start : start + 2]
    cut = full[: full.index(stop)]
    stopped = client.chat.completions.create(**kwargs, stop=[stop, "never-appears"])
    assert stopped.choices[0].message.content == cut and stopped.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(**kwargs, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == cut


def test_max_tokens_bounds_the_answer(client):
    reply = client.completions.create(
        model=NAME, prompt="x", max_tokens=9, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 9 and reply.choices[0].finish_reason == "length"


def test_32_concurrent_requests_all_succeed_batched_and_equal_to_one_at_a_time(url, engine):
    words = ["cat", "dog", "sun", "moon", "tree", "river"]
    prompts = [f"item {i}: {words[i % 6]}" for i in range(32)]
    alone = [
        engine.chat(ask(p), max_tokens=10, temperature=0).choices[0].text for p in prompts
    ]  # one request at a time, in-process
    batches_before = engine.stats["batches"]

    async def burst():
        aclient = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        calls = [
            aclient.chat.completions.create(model=NAME, messages=ask(p), max_tokens=10, temperature=0)
            for p in prompts
        ]
        try:
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await aclient.close()

    replies = asyncio.run(burst())
    errors = [r for r in replies if isinstance(r, BaseException)]
    assert errors == []
    assert [r.choices[0].message.content for r in replies] == alone
    assert len(set(alone)) > 20  # the prompts really differ
    assert engine.stats["batches"] - batches_before < 32 and engine.stats["largest_batch"] > 1


def test_the_api_key_is_required(url, client):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong-key", max_retries=0).models.list()
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Basic {KEY}"}).status_code == 401
    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{not json")
    assert bad.status_code == 401  # before any validation: strangers learn nothing
    assert httpx.get(f"{url}/health").status_code == 200


SAY_X = [{"role": "user", "content": "x"}]  # a user message needs content: these name another field
BAD_BODIES = [
    (b"{not json", 400, None),
    ({"model": NAME, "messages": []}, 400, "messages"),
    ({"model": NAME, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0.role"),
    ({"model": NAME, "messages": SAY_X, "temperature": 5}, 400, "temperature"),
    ({"model": NAME, "messages": SAY_X, "n": 0}, 400, "n"),
    ({"model": NAME, "messages": SAY_X, "top_p": 0}, 400, "top_p"),
    ({"model": NAME, "messages": SAY_X, "max_tokens": 65}, 400, "max_tokens"),
    ({"model": NAME, "messages": SAY_X, "stop": ["a"] * 5}, 400, "stop"),
    ({"model": NAME, "messages": SAY_X, "tools": [{"type": "x"}]}, 400, "tools"),
    # vLLM's extensions gym serve lacks change what is generated: accepted and dropped, they did nothing
    ({"model": NAME, "messages": SAY_X, "guided_choice": ["yes", "no"]}, 400, "guided_choice"),
    ({"model": NAME, "messages": SAY_X, "min_tokens": 4}, 400, "min_tokens"),
    ({"model": NAME, "messages": SAY_X, "top_k": -2}, 400, "top_k"),
    ({"model": NAME, "messages": SAY_X, "min_p": 1.5}, 400, "min_p"),
    ({"model": NAME, "messages": SAY_X, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"model": NAME, "messages": SAY_X, "continue_final_message": True}, 400, "continue_final_message"),
    ({"model": NAME, "messages": SAY_X, "echo": True}, 400, "echo"),
    ({"model": NAME, "messages": SAY_X, "best_of": 0}, 400, "best_of"),  # 0 == False let it through
    ({"model": NAME, "messages": SAY_X, "logprobs": True, "stream": True}, 400, "logprobs"),
    ({"model": NAME, "messages": SAY_X, "top_logprobs": 2}, 400, "top_logprobs"),
    ({"model": NAME, "messages": SAY_X, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"model": NAME, "messages": SAY_X, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ({"model": NAME, "messages": SAY_X, "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ({"model": NAME, "messages": SAY_X, "logit_bias": {"99999": 1}}, 400, "logit_bias"),
    (
        {"model": NAME, "messages": SAY_X, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    ({"model": NAME, "messages": [{"role": "user", "content": "word " * 200}]}, 400, "messages"),
    ({"model": NAME, "messages": SAY_X, "n": 33}, 400, "n"),
    ({"model": "gpt-4", "messages": SAY_X}, 404, "model"),
    ({"messages": SAY_X}, 400, "model"),
    # Python's json writes NaN, which the body parser reads: a bias must be a finite number too
    (
        json.dumps({"model": NAME, "messages": SAY_X, "logit_bias": {"5": float("nan")}}).encode(),
        400,
        "logit_bias.5",
    ),
    # JSON's escapes can spell a lone surrogate half, which no tokenizer reads (it was a 500)
    (
        json.dumps({"model": NAME, "messages": [{"role": "user", "content": "\ud800"}]}).encode(),
        400,
        "messages.0.content",
    ),
    (
        json.dumps(
            {
                "model": NAME,
                "messages": [{"role": "system", "content": [{"type": "text", "text": "a\udfff"}]}],
            }
        ).encode(),
        400,
        "messages.0.content",
    ),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_BODIES)
def test_bad_requests_get_4xx_in_openai_shape(url, body, status, param):
    headers = {"Authorization": f"Bearer {KEY}"}
    if isinstance(body, bytes):
        headers["Content-Type"] = "application/json"
        r = httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers)
    else:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["param"] == param
    assert "Value error" not in error["message"] and not error["message"].startswith("body:")


def test_fields_at_the_values_that_ask_for_nothing_are_accepted(client):
    """What clients send by default for the fields gym serve does not implement is no request for them."""
    neutral = {
        "tool_choice": "none",
        "suffix": "",
        "best_of": 1,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "skip_special_tokens": True,
        "add_generation_prompt": True,
        "response_format": {"type": "text"},
    }
    chat = client.chat.completions.create(model=NAME, messages=SAY_X, max_tokens=2, extra_body=neutral)
    assert chat.choices[0].finish_reason in ("stop", "length")
    text = client.completions.create(
        model=NAME, prompt="x", max_tokens=2, extra_body={"top_k": 0, "suffix": ""}
    )
    assert text.choices[0].finish_reason in ("stop", "length")


def test_a_request_past_the_window_names_the_field_to_change_with_openais_code(model_dir, engine):
    """The prompt alone too long: the prompt (a chat's messages), whatever max_tokens says; the budget too
    large: the field the client sent it in; `context_length_exceeded` either way."""
    window = engine.context_length
    assert window is not None
    limits = Limits(max_tokens=window, max_prompt_tokens=2 * window)
    words = "word " * window
    chat = {"model": NAME, "messages": [{"role": "user", "content": words}]}
    cases = [
        ("/v1/chat/completions", chat, "messages"),
        ("/v1/chat/completions", {**chat, "max_tokens": 1}, "messages"),
        ("/v1/completions", {"model": NAME, "prompt": words, "max_tokens": 1}, "prompt"),
        (
            "/v1/completions",
            {"model": NAME, "prompt": "word " * (window // 2), "max_tokens": window},
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {**chat, "messages": SAY_X, "max_completion_tokens": window},
            "max_completion_tokens",
        ),
    ]
    with serve_in_thread(build_app(engine, limits)) as base:
        for path, body, param in cases:
            r = httpx.post(f"{base}{path}", json=body, timeout=60)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert (error["param"], error["code"]) == (param, "context_length_exceeded"), (body, error)
            if param in ("messages", "prompt"):
                assert "lower max_tokens" not in error["message"]  # no budget makes room
        over = {**chat, "messages": SAY_X, "max_completion_tokens": window + 1}
        error = httpx.post(f"{base}/v1/chat/completions", json=over, timeout=60).json()["error"]
        assert error["param"] == "max_completion_tokens" and error["message"].startswith(
            "max_completion_tokens="
        )
        long = {"model": NAME, "prompt": "word " * (2 * window + 1)}
        error = httpx.post(f"{base}/v1/completions", json=long, timeout=60).json()["error"]
        assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")


def test_a_json_body_sent_as_a_form_is_told_its_content_type(url):
    """`curl -d '{...}'` sends the JSON as a form: "must be a JSON object" said nothing the sender saw."""
    body = json.dumps({"model": NAME, "messages": SAY_X, "max_tokens": 2})
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/x-www-form-urlencoded"}
    r = httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "Content-Type: application/json" in message and "application/x-www-form-urlencoded" in message
    headers["Content-Type"] = "application/json"
    r = httpx.post(f"{url}/v1/chat/completions", content=b"[1, 2]", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["message"] == "the request body must be a JSON object"


def test_bad_completion_prompts_get_400(url):
    headers = {"Authorization": f"Bearer {KEY}"}
    for prompt in ([99999], [], [-1, 3], ""):
        r = httpx.post(f"{url}/v1/completions", json={"model": NAME, "prompt": prompt}, headers=headers)
        assert r.status_code == 400, (prompt, r.text)
    # more prompts than the server's cap: refused before any is tokenized, the cap and the flag named
    r = httpx.post(f"{url}/v1/completions", json={"model": NAME, "prompt": ["hi"] * 9}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    message = r.json()["error"]["message"]
    assert "9 prompts" in message and "--limits.max_prompts" in message
    assert (
        httpx.post(
            f"{url}/v1/completions",
            json={"model": NAME, "prompt": ["hi"] * 8, "max_tokens": 1},
            headers=headers,
        ).status_code
        == 200
    )
    for field, value in (("prompt", "\ud800"), ("prompt", ["ok", "x\udc80"]), ("stop", "\ud83d")):
        body = {"model": NAME, "prompt": "ok", field: value}
        sent = {**headers, "Content-Type": "application/json"}  # json.dumps escapes the surrogate
        r = httpx.post(f"{url}/v1/completions", content=json.dumps(body).encode(), headers=sent)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert "unpaired surrogate" in r.json()["error"]["message"]


def test_a_served_model_is_retrieved_by_its_id_and_an_unknown_id_gets_404(client, url):
    """`GET /v1/models/{model}` was Starlette's bare 404 "Not Found" for every id."""
    card = client.models.retrieve(NAME)
    assert card.model_dump() == client.models.list().data[0].model_dump()
    assert (card.id, card.object, card.owned_by) == (NAME, "model", "gym")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4")
    error = caught.value
    assert (error.type, error.param, error.code) == ("invalid_request_error", "model", "model_not_found")
    assert "'gpt-4' does not exist" in error.message
    # an id with slashes reaches the route too (the client sends it as %2F, the server reads "/")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("org/gpt-4")
    assert caught.value.code == "model_not_found"
    assert httpx.get(f"{url}/v1/models/{NAME}").status_code == 401  # the key is needed here too


def test_a_model_whose_id_holds_slashes_is_retrieved(model_dir):
    """`gym serve --model models:/NAME@alias` serves under that URI: the id holds a slash."""
    uri = "models:/tiny@champion"
    with Engine.load(str(model_dir), name=uri) as named, serve_in_thread(build_app(named)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve(uri).id == uri == client.models.list().data[0].id


def post_chat(url: str, **body: object) -> httpx.Response:
    sent = {"model": NAME, "max_tokens": 2, **body}
    return httpx.post(f"{url}/v1/chat/completions", json=sent, headers={"Authorization": f"Bearer {KEY}"})


def test_only_an_assistant_message_may_go_without_content(url):
    """OpenAI answers a user or system message with null (or no) content with a 400 naming it; it was
    served as an empty message."""
    for messages, at, role in (
        ([{"role": "user", "content": None}], 0, "user"),
        ([{"role": "system", "content": None}, *ask("hi")], 0, "system"),
        ([{"role": "system", "content": "be brief"}, {"role": "user"}], 1, "user"),
        (
            [*ask("hi"), {"role": "assistant", "content": "yes"}, {"role": "developer", "content": None}],
            2,
            "developer",
        ),
    ):
        r = post_chat(url, messages=messages)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", f"messages.{at}.content")
        assert f"a {role} message needs content" in error["message"]
        assert "only an assistant message may leave it null" in error["message"]
    history = [*ask("hi"), {"role": "assistant", "content": None}, *ask("and then?")]
    assert post_chat(url, messages=history).status_code == 200


def test_a_content_part_other_than_text_is_refused_by_its_type(client):
    """An image part got "messages.0.content.str: Input should be a valid string", which says nothing
    of parts: the 400 now names the part and its type."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    for content, says in (
        ([image], "part 0 has type 'image_url'"),
        ([{"type": "text", "text": "hear this"}, audio], "part 1 has type 'input_audio'"),
        ([{"text": "untyped"}], "part 0 has no type"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": content}], max_tokens=2
            )
        error = caught.value
        assert error.param == "messages.0.content" and says in error.message, error.message
        assert "only text content parts" in error.message and "valid string" not in error.message
    parts = [{"type": "text", "text": "name "}, {"type": "text", "text": "a river"}]
    reply = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": parts}], max_tokens=2
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", float("nan")),
        ("top_p", float("nan")),
        ("temperature", float("inf")),
        ("presence_penalty", float("-inf")),
        ("frequency_penalty", float("nan")),
    ],
)
def test_a_number_that_is_not_finite_is_refused_as_such(url, field, value):
    """Python's json writes NaN and Infinity (not JSON, but parsed): NaN got "Input should be less than or
    equal to 2", a range it is not outside of."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for path, body in (
        ("/v1/chat/completions", {"messages": ask("hi")}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        sent = json.dumps({"model": NAME, "max_tokens": 2, **body, field: value})
        r = httpx.post(f"{url}{path}", content=sent, headers=headers)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field and error["message"] == f"{field}: Input should be a finite number"
    with pytest.raises(ValueError, match="finite number"):
        SamplingParams(**{field: value})  # in-process callers (gym chat's flags, the engine) alike


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(-5, 5000), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", ""]), "text": VALUES})
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "x"])},
    optional={"content": st.one_of(VALUES, st.lists(PART, max_size=2))},
)
FIELDS = {
    name: VALUES
    for name in (
        *("model", "temperature", "top_p", "n", "max_tokens", "stop", "seed", "stream", "logprobs", "echo"),
        *("top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias"),
        *("top_k", "min_p", "repetition_penalty"),
    )
}
FIELDS["messages"] = st.one_of(VALUES, st.lists(MESSAGE, max_size=3))
FIELDS["prompt"] = st.one_of(VALUES, st.lists(st.text(max_size=6), max_size=3))
FIELDS["stream_options"] = st.one_of(VALUES, st.fixed_dictionaries({"include_usage": VALUES}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    body=st.fixed_dictionaries({}, optional=FIELDS),
)
def test_no_input_makes_the_server_fail(url, path, body):
    """Whatever JSON arrives, the answer is a success or a 4xx, never a 5xx."""
    body = {"model": NAME, "max_tokens": 4, **body}
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    # json.dumps writes NaN/Infinity as Python does (not valid JSON): the server must refuse it with a 400.
    r = httpx.post(f"{url}{path}", content=json.dumps(body), headers=headers, timeout=60)
    assert r.status_code < 500, (body, r.text)


def test_requests_beyond_the_concurrency_cap_get_429(engine):
    app = build_app(engine, Limits(max_tokens=512, max_concurrent=1))
    with serve_in_thread(app) as base:
        body = {"model": NAME, "prompt": "x", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
        first: dict[str, int] = {}

        def long_request() -> None:
            first["status"] = httpx.post(f"{base}/v1/completions", json=body, timeout=120).status_code

        thread = threading.Thread(target=long_request)
        thread.start()
        deadline = time.monotonic() + 30
        while app.state.gate.active == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        second = httpx.post(f"{base}/v1/completions", json={**body, "max_tokens": 1}, timeout=60)
        thread.join()
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert second.json()["error"]["type"] == "rate_limit_error"
    assert first["status"] == 200


def test_an_unstreamed_request_stops_generating_when_its_client_leaves(model_dir):
    """A client that times out and closes its connection: the request generated on to its last token,
    holding its rows of the batch and its concurrency slot (429s for others) for a reply nobody reads."""
    import socket

    steps = []

    def step(*_: object) -> None:  # each forward: one generated token, made slow
        steps.append(1)
        time.sleep(0.01)

    with Engine.load(str(model_dir), name=NAME) as slow:
        slow.model.register_forward_pre_hook(step)
        app = build_app(slow, Limits(max_tokens=512, max_concurrent=1))
        with serve_in_thread(app) as base:
            host, port = base.removeprefix("http://").split(":")
            body = json.dumps({"model": NAME, "prompt": "x", "max_tokens": 400, "ignore_eos": True}).encode()
            head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            deadline = time.monotonic() + 30
            while len(steps) < 20 and time.monotonic() < deadline:
                time.sleep(0.01)
            sock.close()  # the client leaves 20 tokens into 400
            while app.state.gate.active and time.monotonic() < deadline:
                time.sleep(0.01)
            assert app.state.gate.active == 0
            left = len(steps)
            time.sleep(0.5)
            assert len(steps) == left < 200  # it stopped, and stays stopped
            after = httpx.post(f"{base}/v1/completions", json={"model": NAME, "prompt": "x", "max_tokens": 2})
            assert after.status_code == 200  # the slot is free


def reference_logprobs(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers' own forward, no server: row i is the distribution after ids[: i + 1]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def test_completions_score_the_echoed_prompt_and_the_answer(client, engine, model_dir):
    prompt = "The longest river in Europe is"
    out = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=2, echo=True
    )
    choice, scored = out.choices[0], out.choices[0].logprobs
    assert choice.text.startswith(prompt) and "".join(scored.tokens) == choice.text
    assert scored.text_offset == [sum(len(t) for t in scored.tokens[:i]) for i in range(len(scored.tokens))]
    ids = engine.encode_text(prompt)
    answer = direct_greedy(model_dir, ids, 4)
    assert choice.text == prompt + engine.decode(answer)
    assert len(scored.token_logprobs) == len(ids) + len(answer) and answer
    assert scored.token_logprobs[0] is None and scored.top_logprobs[0] is None  # no context yet
    reference = reference_logprobs(model_dir, ids + answer)
    for i, token in enumerate((ids + answer)[1:], start=1):
        assert scored.token_logprobs[i] == pytest.approx(reference[i - 1, token].item(), abs=1e-5)
        top = scored.top_logprobs[i]
        best = reference[i - 1].topk(2)
        assert len(top) in (2, 3)  # the two most likely, and the token itself when it is neither
        assert sorted(top.values(), reverse=True)[:2] == pytest.approx(best.values.tolist(), abs=1e-5)
    for i in range(len(ids), len(ids) + len(answer)):  # greedy: each answer token was the most likely
        assert scored.token_logprobs[i] == pytest.approx(max(scored.top_logprobs[i].values()), abs=1e-6)

    plain = client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0, logprobs=0)
    assert plain.choices[0].text == engine.decode(answer)  # without echo: the answer's tokens only
    assert plain.choices[0].logprobs.token_logprobs == pytest.approx(
        scored.token_logprobs[len(ids) :], abs=1e-6
    )
    echoed = client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == choice.text and echoed.choices[0].logprobs is None


def test_chat_logprobs_score_each_token_of_the_reply(client, engine, model_dir):
    reply = client.chat.completions.create(
        model=NAME, messages=ask("name a river"), max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    prompt = engine.encode_chat(ask("name a river"))
    answer = direct_greedy(model_dir, prompt, 6)
    assert len(content) == len(answer)
    reference = reference_logprobs(model_dir, prompt + answer)
    for i, (entry, token) in enumerate(zip(content, answer, strict=True)):
        assert entry.logprob == pytest.approx(reference[len(prompt) + i - 1, token].item(), abs=1e-5)
        assert entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)  # greedy


def penalized_greedy(
    model_dir: Path,
    prompt_ids: list[int],
    steps: int,
    presence: float = 0.0,
    frequency: float = 0.0,
    bias: dict[int, float] | None = None,
):
    """Greedy decoding with OpenAI's logit bias and penalties applied by hand, no server: the reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ids, reply = list(prompt_ids), []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        for token, value in (bias or {}).items():
            logits[token] += value
        for token in set(reply):
            logits[token] -= presence + frequency * reply.count(token)
        token = int(logits.argmax())
        if token == 2:  # <|im_end|>
            break
        reply.append(token)
        ids.append(token)
    return reply


def side_by_side(url: str, questions: list[str], extra: dict[str, float]) -> list[str | None]:
    """Greedy replies to each question with `extra` and without, all sent at once (batched together):
    [q0 with, q0 without, q1 with, ...]."""

    async def burst() -> list[Any]:
        aclient = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        calls = [
            aclient.chat.completions.create(
                model=NAME, messages=ask(q), max_tokens=16, temperature=0, extra_body=extra if given else {}
            )
            for q in questions
            for given in (True, False)
        ]
        try:
            return await asyncio.gather(*calls)
        finally:
            await aclient.close()

    return [r.choices[0].message.content for r in asyncio.run(burst())]


def test_presence_and_frequency_penalties_follow_openais_formula_row_by_row(url, engine, model_dir):
    questions = ["name a river", "name a mountain", "count to ten", "say hello"]
    plain = [engine.chat(ask(q), max_tokens=16, temperature=0).choices[0].text for q in questions]
    expected = [
        engine.decode(penalized_greedy(model_dir, engine.encode_chat(ask(q)), 16, 0.5, 1.5))
        for q in questions
    ]
    assert sum(p != e for p, e in zip(plain, expected, strict=True)) >= 2  # the penalties change answers
    batches_before = engine.stats["batches"]

    replies = side_by_side(url, questions, {"presence_penalty": 0.5, "frequency_penalty": 1.5})
    assert replies[0::2] == expected and replies[1::2] == plain
    assert engine.stats["batches"] - batches_before < len(replies)


def test_repetition_penalty_is_transformers_own_row_by_row_beside_other_lengths(url, engine, model_dir):
    """vLLM's `repetition_penalty` (accepted and ignored before): each row's as transformers' generate
    applies it to that prompt alone, whatever padding a batch with longer prompts gives the row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    questions = ["name a river", "count to ten, slowly and one by one", "say hello", "name a mountain"]

    def reference(question: str) -> str:
        prompt = engine.encode_chat(ask(question))
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=16, do_sample=False, repetition_penalty=1.8
            )
        ids = out[0, len(prompt) :].tolist()
        return engine.decode(ids[: ids.index(2)] if 2 in ids else ids)

    expected = [reference(q) for q in questions]
    plain = [engine.chat(ask(q), max_tokens=16, temperature=0).choices[0].text for q in questions]
    assert sum(p != e for p, e in zip(plain, expected, strict=True)) >= 2  # the penalty changes answers
    batches_before = engine.stats["batches"]

    replies = side_by_side(url, questions, {"repetition_penalty": 1.8})
    assert replies[0::2] == expected and replies[1::2] == plain
    assert engine.stats["batches"] - batches_before < len(replies)


def test_top_k_and_min_p_cut_what_is_sampled(client):
    """top_k 1, or min_p 1, leaves only the most likely token: sampling at temperature 1 is then greedy;
    a cut that keeps more leaves sampled text that differs between seeds."""
    greedy = client.completions.create(model=NAME, prompt="Once upon", max_tokens=12, temperature=0)
    for cut in ({"top_k": 1}, {"min_p": 1.0}):
        for seed in (1, 2):
            sampled = client.completions.create(
                model=NAME, prompt="Once upon", max_tokens=12, temperature=1.0, seed=seed, extra_body=cut
            )
            assert sampled.choices[0].text == greedy.choices[0].text, cut
    wide = {
        client.completions.create(
            model=NAME, prompt="Once upon", max_tokens=12, temperature=1.0, seed=seed, extra_body={"top_k": 9}
        )
        .choices[0]
        .text
        for seed in range(4)
    }
    assert len(wide) > 1


def test_repetition_penalty_skips_the_padding_before_a_rows_prompt():
    """A left-padded row's pad id is no token of its prompt (gym-tiny's pad is never generated, so the
    served test above cannot see this; a model padding with its eos would stop later than it should)."""
    from transformers import RepetitionPenaltyLogitsProcessor

    from gym.serve.sampling import Penalties

    params = [SamplingParams(repetition_penalty=2.0)] * 2
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 5, 7, 8, 9]])  # prompts of 4 and 2 tokens (pad: 5), then a reply
    scores = torch.linspace(-2.0, 2.0, 10).repeat(2, 1)
    out = Penalties(params, prompt_width=4, vocab_size=10, prompt_lengths=[4, 2])(ids, scores.clone())
    assert torch.equal(out[0], RepetitionPenaltyLogitsProcessor(2.0)(ids[:1], scores[:1].clone())[0])
    unpadded = RepetitionPenaltyLogitsProcessor(2.0)(ids[1:, 2:], scores[1:].clone())[0]
    assert torch.equal(out[1], unpadded) and out[1, 5] == scores[1, 5]


def test_top_k_and_min_p_keep_exactly_the_tokens_they_name():
    from gym.serve.sampling import min_p_cut, top_k_cut

    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.3, 0.2]])
    kept = top_k_cut(probs, torch.tensor([2, 0]))
    assert torch.equal(kept[0], torch.tensor([0.0, 0.4, 0.0, 0.3])) and torch.equal(kept[1], probs[1])
    kept = min_p_cut(probs, torch.tensor([0.7, 0.0]))  # 0.7 x 0.4 = 0.28: the 0.3 stays, the 0.2 goes
    assert torch.equal(kept[0], torch.tensor([0.0, 0.4, 0.0, 0.3])) and torch.equal(kept[1], probs[1])


def test_logit_bias_bans_and_forces_tokens(client, engine, model_dir):
    prompt = engine.encode_chat(ask("name a river"))
    plain = direct_greedy(model_dir, prompt, 6)
    ban = {plain[0]: -100.0}  # the answer's first token, never chosen again
    banned = client.chat.completions.create(
        model=NAME,
        messages=ask("name a river"),
        max_tokens=6,
        temperature=0,
        logit_bias={str(plain[0]): -100},
    )
    expected = penalized_greedy(model_dir, prompt, 6, bias=ban)
    assert banned.choices[0].message.content == engine.decode(expected) and plain[0] not in expected
    forced = engine.encode_text(" river")[0]
    reply = client.completions.create(
        model=NAME, prompt="name a river", max_tokens=4, temperature=0, logit_bias={str(forced): 100}
    )
    assert reply.choices[0].text == engine.decode([forced] * 4)


def test_an_answer_that_ends_at_once_still_scores_the_whole_echoed_prompt(client, engine, model_dir):
    """lm-eval reads a prompt's scores as token_logprobs[ctxlen:-1]: the one generated token must be
    listed even when it is the end of the text (forced here with a logit bias)."""
    prompt = "The longest river in Europe is the Volga"
    out = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True, logit_bias={"2": 100}
    )
    choice, scored = out.choices[0], out.choices[0].logprobs
    assert choice.finish_reason == "stop" and choice.text == prompt
    ids = engine.encode_text(prompt)
    assert len(scored.token_logprobs) == len(ids) + 1 and scored.tokens[-1] == ""
    reference = reference_logprobs(model_dir, [*ids, 2])  # 2 = <|im_end|>, the model's own score for it
    assert scored.token_logprobs[-1] == pytest.approx(reference[len(ids) - 1, 2].item(), abs=1e-5)
    assert out.usage.completion_tokens == 0  # the text it adds is empty


def test_scoring_several_sequences_in_one_pass_equals_scoring_each_alone(engine):
    texts = ["The river", "A much longer prompt about rivers, mountains and the cities between them", "Hi"]
    sequences = [engine.encode_text(t) for t in texts]
    together = engine.score(sequences, top=3, next_token=True)  # right-padded to the longest
    for ids, batched in zip(sequences, together, strict=True):
        alone = engine.score([ids], top=3, next_token=True)[0]
        assert len(batched) == len(ids) + 1 and batched[0] is None
        assert [s.token for s in batched[1:]] == [*ids[1:], alone[-1].token]
        for a, b in zip(alone[1:], batched[1:], strict=True):
            assert b.logprob == pytest.approx(a.logprob, abs=1e-5)
            assert [t for t, _ in b.top] == [t for t, _ in a.top]
        assert batched[-1].logprob == pytest.approx(max(lp for _, lp in batched[-1].top), abs=1e-6)  # greedy


LM_EVAL_REQUEST = {"max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True, "seed": 1234}


def _scored_both_ways(client, engine, prompts):
    """The same one-token greedy request through the scoring pass alone (what lm-eval sends) and
    through generation (a stop string that never occurs forces it); and how many batches each ran."""
    before = engine.stats["batches"]
    fast = client.completions.create(model=NAME, prompt=prompts, **LM_EVAL_REQUEST)
    middle = engine.stats["batches"]
    generated = client.completions.create(model=NAME, prompt=prompts, stop=["\x00"], **LM_EVAL_REQUEST)
    return fast, generated, (middle - before, engine.stats["batches"] - middle)


def assert_same_completions(fast, generated):
    assert fast.usage == generated.usage
    for a, b in zip(fast.choices, generated.choices, strict=True):
        assert (a.index, a.text, a.finish_reason) == (b.index, b.text, b.finish_reason)
        assert a.logprobs.tokens == b.logprobs.tokens and a.logprobs.text_offset == b.logprobs.text_offset
        assert a.logprobs.token_logprobs[0] is None and b.logprobs.token_logprobs[0] is None
        assert a.logprobs.token_logprobs[1:] == pytest.approx(b.logprobs.token_logprobs[1:], abs=1e-5)
        assert [list(t) for t in a.logprobs.top_logprobs[1:]] == [
            list(t) for t in b.logprobs.top_logprobs[1:]
        ]


def test_a_greedy_one_token_scored_completion_is_read_from_the_scoring_pass(client, engine):
    prompts = ["Question: which river is longest?\nAnswer: B", "The capital of France is", "2 + 2 ="]
    fast, generated, batches = _scored_both_ways(client, engine, prompts)
    assert batches[0] == 0 and batches[1] >= 1  # no generation for lm-eval's request; generation otherwise
    assert_same_completions(fast, generated)
    assert all(
        c.finish_reason == "length" and c.text.startswith(p)
        for c, p in zip(fast.choices, prompts, strict=True)
    )


def test_the_scoring_pass_ends_the_text_where_generation_would(model_dir):
    """When the most likely next token ends the text, the one-token answer is empty and lists that
    token, as generation's does (here the prompt's greedy token is made an end-of-sequence token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompt = "The capital of France is"
    with Engine.load(str(model_dir), name=NAME) as plain:
        greedy = plain.score([plain.encode_text(prompt)], next_token=True)[0][-1].token
        template = plain.chat_template
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.generation_config.eos_token_id = [2, greedy]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ending = Engine(model, tokenizer, name=NAME, chat_template=template)
    with ending, serve_in_thread(build_app(ending)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        fast, generated, batches = _scored_both_ways(client, ending, [prompt])
    assert batches[0] == 0 and batches[1] >= 1
    assert_same_completions(fast, generated)
    choice = fast.choices[0]
    assert choice.finish_reason == "stop" and choice.text == prompt and choice.logprobs.tokens[-1] == ""
    assert fast.usage.completion_tokens == 0


def test_echoed_token_texts_join_into_text_with_characters_split_over_tokens(client, engine):
    prompt = "naïve café: 中文字符 and 🙂🙃 emoji"
    ids = engine.encode_text(prompt)
    assert len(ids) > len(prompt.encode("utf-8")) // 2  # byte-level pieces: characters span tokens
    out = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=3, temperature=0, logprobs=0, echo=True
    )
    scored = out.choices[0].logprobs
    assert "".join(scored.tokens) == out.choices[0].text and out.choices[0].text.startswith(prompt)
    assert "" in scored.tokens[: len(ids)]  # a token ending mid-character shows no text of its own
    assert len(scored.tokens) == len(scored.token_logprobs) == len(scored.text_offset)


def test_sequences_opening_alike_score_as_each_alone_and_as_transformers_forward(engine, model_dir):
    """A few-shot context with four answers (lm-eval's request) runs the context once for all four."""
    context = engine.encode_text("Question: which of these rivers is the longest in Europe, and why?\n" * 3)
    answers = [engine.encode_text(a) for a in (" A", " B. the Volga", " C", " D. the Danube, by far")]
    sequences = [context + a for a in answers] + [context[:40]]  # and one that is only their opening
    assert [p.shared for p in plan(sequences)] == [39]  # one pass, the opening run once
    together = engine.score(sequences, top=2, next_token=True)
    assert_scored_as_alone_and_by_forward(engine, model_dir, sequences, together)


def assert_scored_as_alone_and_by_forward(engine, model_dir, sequences, together) -> None:
    """Each sequence's scores (top 2, and the next token) from a shared call equal those of a plain
    pass of its own and of transformers' forward."""
    for ids, batched in zip(sequences, together, strict=True):
        alone = engine.score([ids], top=2, next_token=True)[0]  # a plain pass of its own
        reference = reference_logprobs(model_dir, ids)
        assert len(batched) == len(ids) + 1 and batched[0] is None
        for i, (a, b) in enumerate(zip(alone[1:], batched[1:], strict=True), start=1):
            assert b.token == a.token and b.logprob == pytest.approx(a.logprob, abs=1e-5)
            assert b.logprob == pytest.approx(reference[i - 1, b.token].item(), abs=1e-5)
            assert [t for t, _ in b.top] == [t for t, _ in a.top]
        assert batched[-1].token == int(reference[-1].argmax())  # the token greedy decoding picks


class Counting(torch.nn.Module):
    """A served model as scoring runs it, the shape ([rows, tokens]) of each pass recorded."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.device, self.passes = model, model.device, []

    def forward(self, **inputs):
        self.passes.append(tuple(inputs["input_ids"].shape))
        return self.inner(**inputs)


def test_questions_under_one_context_each_run_once_and_score_as_transformers_forward(engine, model_dir):
    """lm-eval's request of several questions x their answers under one few-shot context: the context
    runs once, each question once more from a copy of its cache, then each answer."""
    from gym.serve import scoring

    context = engine.encode_text("The following are questions about the rivers of Europe.\n" * 4)
    questions = [
        "Question: which of these rivers is the longest in Europe, and through which countries and cities "
        "does it flow on its way to the sea?\nAnswer:",
        "Question: which river flows through Vienna, Bratislava, Budapest and Belgrade on its way east to "
        "the Black Sea?\nAnswer:",
    ]
    sequences = [
        context + engine.encode_text(q + a) for q in questions for a in (" A", " B. the Volga", " C")
    ]
    sequences.append(context + engine.encode_text(" and the lakes"))  # shares only the context
    (only,) = plan(sequences)
    rows = [sequences[i] for i in only.members]
    assert sorted(length > 0 for length, _ in scoring._branches(rows, only.shared)) == [False, True, True]
    counted = Counting(engine.model)
    together = scoring.score(counted, threading.Lock(), engine.pad_id, sequences, 2, True)
    calls = counted.passes
    assert len(calls) == 1 + 2 * 2 + 1  # the context; per question its text, then its answers; the rest
    assert sum(rows * width for rows, width in calls) < sum(map(len, sequences)) / 2
    assert_scored_as_alone_and_by_forward(engine, model_dir, sequences, together)


def test_a_call_starts_from_the_context_the_call_before_it_ran(engine, model_dir):
    """lm-eval's consecutive requests repeat the few-shot context: the second runs only what differs,
    and scores as transformers' forward does, whatever the two calls share."""
    from gym.serve import scoring

    context = engine.encode_text("The following are questions about the rivers of Europe.\n" * 4)
    memo = scoring.Memo()
    requests = [
        (2, "Question: which river is the longest?\nAnswer:"),
        (2, "Question: which river flows through Vienna?\nAnswer:"),
        (3, "Question: which river flows through Paris?\nAnswer:"),  # other alternatives: run in full
        (3, "The following are questions about the lakes of Europe."),  # parts early: from there on
    ]
    ran = []
    for top, text in requests:
        sequences = [context + engine.encode_text(text + a) for a in (" A", " B. the Volga", " C")]
        counted = Counting(engine.model)
        got = scoring.score(counted, threading.Lock(), engine.pad_id, sequences, top, True, memo)
        ran.append(sum(rows * width for rows, width in counted.passes))
        for ids, scored in zip(sequences, got, strict=True):
            reference = reference_logprobs(model_dir, ids)
            for i, entry in enumerate(scored[1:], start=1):
                assert entry.logprob == pytest.approx(reference[i - 1, entry.token].item(), abs=1e-5)
                want = reference[i - 1].topk(top).indices.tolist()
                assert [t for t, _ in entry.top] == want
        assert memo.tokens == sequences[0][: len(memo.tokens)] and memo.top == top
    assert ran[1] < ran[0] - len(context) + 3  # the context did not run again
    assert ran[2] > len(context)  # another `top`: the context's entries differ, it runs in full
    assert ran[3] < ran[2] - 20  # the part both contexts open with did not run again


def pieces(shortest: int, longest: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(5, 4000), min_size=shortest, max_size=longest)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    contexts=st.lists(pieces(8, 40), min_size=1, max_size=2),
    questions=st.lists(pieces(16, 30), min_size=1, max_size=3),
    calls=st.lists(
        st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), pieces(1, 4)), min_size=3, max_size=8),
        min_size=1,
        max_size=3,
    ),
    top=st.integers(0, 2),
)
def test_scores_are_the_same_however_calls_share_their_openings(engine, contexts, questions, calls, top):
    """Consecutive calls whose sequences open alike at random depths (a context, then a question, then
    an answer) score as each sequence does alone, with nothing kept from the call before."""
    from gym.serve import scoring

    memo = scoring.Memo()
    for call in calls:
        sequences = [
            contexts[c % len(contexts)] * 2 + questions[q % len(questions)] * 2 + a for c, q, a in call
        ]
        kept = scoring.score(engine.model, threading.Lock(), engine.pad_id, sequences, top, True, memo)
        for ids, got in zip(sequences, kept, strict=True):
            (alone,) = scoring.score(engine.model, threading.Lock(), engine.pad_id, [ids], top, True)
            # the given tokens, then the most likely next one (which a near-tie may pick differently)
            assert [e.token for e in got[1:-1]] == ids[1:] == [e.token for e in alone[1:-1]]
            assert [e.logprob for e in got[1:]] == pytest.approx([e.logprob for e in alone[1:]], abs=1e-5)
            for a, b in zip(got[1:], alone[1:], strict=True):  # the alternatives' scores, best first
                assert [lp for _, lp in a.top] == pytest.approx([lp for _, lp in b.top], abs=1e-5)


def test_a_model_without_a_copyable_cache_scores_each_row_in_full(engine):
    from gym.serve import scoring

    class WithoutCache(torch.nn.Module):  # as a model that keeps no KV cache answers
        def __init__(self, model):
            super().__init__()
            self.inner, self.device = model, model.device

        def forward(self, **inputs):
            out = self.inner(**inputs)
            out.past_key_values = None
            return out

    context = engine.encode_text("Question: which of these rivers is the longest in Europe?\n" * 3)
    sequences = [context + engine.encode_text(a) for a in (" A", " B", " C. the Danube")]
    assert plan(sequences)[0].shared  # a shared pass is planned
    got = scoring.score(WithoutCache(engine.model), threading.Lock(), engine.pad_id, sequences, 2, True)
    want = engine.score(sequences, top=2, next_token=True)
    for a, b in zip(got, want, strict=True):
        assert [e.token for e in a[1:]] == [e.token for e in b[1:]]
        assert [e.logprob for e in a[1:]] == pytest.approx([e.logprob for e in b[1:]], abs=1e-5)


def test_max_tokens_zero_scores_the_echoed_prompt_without_generating(client, engine, model_dir, url):
    """OpenAI's legacy completions (and harnesses written for them) score a prompt with
    `echo: true, max_tokens: 0`: the prompt comes back with its scores, nothing generated."""
    prompt = "The longest river in Europe is the Volga"
    ids = engine.encode_text(prompt)
    before = engine.stats["batches"]
    out = client.completions.create(
        model=NAME, prompt=[prompt, "2 + 2 ="], max_tokens=0, echo=True, logprobs=2
    )
    assert engine.stats["batches"] == before  # no generation
    choice, scored = out.choices[0], out.choices[0].logprobs
    assert (choice.text, choice.finish_reason) == (prompt, "length") and out.usage.completion_tokens == 0
    assert "".join(scored.tokens) == prompt and len(scored.token_logprobs) == len(ids)
    reference = reference_logprobs(model_dir, ids)
    assert scored.token_logprobs[0] is None
    assert scored.token_logprobs[1:] == pytest.approx(
        [reference[i - 1, t].item() for i, t in enumerate(ids) if i], abs=1e-5
    )
    assert out.choices[1].text == "2 + 2 ="
    plain = client.completions.create(model=NAME, prompt=prompt, max_tokens=0, logprobs=1)
    assert plain.choices[0].text == "" and plain.choices[0].logprobs.tokens == []
    assert client.completions.create(model=NAME, prompt=prompt, max_tokens=0).choices[0].logprobs is None
    for body in (
        {"model": NAME, "prompt": prompt, "max_tokens": 0, "stream": True},
        {"model": NAME, "messages": ask("hi"), "max_tokens": 0},
    ):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        r = httpx.post(f"{url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    with pytest.raises(RequestError, match="nothing to generate"):
        engine.generate(ids, SamplingParams(max_tokens=0))


def test_the_listening_socket_gives_connections_without_nagles_delay():
    """Every response over gym serve's own socket waited ~40 ms for the client's delayed ACK: asyncio
    (under uvicorn) turns Nagle off only on connections whose socket says it is TCP."""
    import socket

    from gym.serve.server import bind

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        seen: asyncio.Future[int] = loop.create_future()

        class Record(asyncio.Protocol):
            def connection_made(self, transport):
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        listening = bind("127.0.0.1", 0)
        server = await loop.create_server(Record, sock=listening)  # as uvicorn serves gym's socket
        host, port = listening.getsockname()[:2]
        _, writer = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0


def test_a_servers_default_max_tokens_is_what_a_chat_without_one_gets_and_a_request_may_ask_more(engine):
    """LLaMA-Factory's max_new_tokens (an inference YAML's) was the server's cap: a request asking for more
    got a 400. It is the default; a request's own max_tokens, up to the cap, overrides it."""
    from pydantic import ValidationError

    limits = Limits(max_tokens=64, default_max_tokens=3)
    body = {"model": NAME, "messages": SAY_X, "temperature": 0, "extra_body": {"ignore_eos": True}}
    with serve_in_thread(build_app(engine, limits)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        default = client.chat.completions.create(**body)
        assert default.usage is not None and default.usage.completion_tokens == 3
        asked = client.chat.completions.create(**body, max_tokens=10)
        assert asked.usage is not None and asked.usage.completion_tokens == 10
    with pytest.raises(ValidationError, match="default_max_tokens 65 is over max_tokens 64"):
        Limits(max_tokens=64, default_max_tokens=65)
