"""The Ollama Modelfile's TEMPLATE renders a conversation exactly as the model's Jinja chat template does.

Each conversation is rendered twice: by the Jinja template (transformers' renderer, as training and
serving use it) and by the Go TEMPLATE the Modelfile carries, run through tests/go_template.py the way
Ollama runs it (system messages collated into .System, consecutive roles merged). The BOS token is
left out of the Jinja side: llama.cpp adds it when it tokenizes, so Ollama's templates never write it.
The stop sequences must include the marker the Jinja template writes after an assistant turn.
"""

from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from gym.models import resolve
from gym.ollama import TEMPLATES, modelfile, stop_sequences
from gym.templates import load_template
from tests.go_template import ollama_render, render

CONVERSATIONS = {
    "system and two turns": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?\nAnswer in digits."},
    ],
    "two turns": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "one question": [{"role": "user", "content": "天空为什么是蓝色的？"}],
}
# The end-of-sequence token a family's tokenizer has (the Jinja templates that write eos_token use it).
EOS = {"alpaca": "</s>", "mistral": "</s>", "deepseek-llm": "<｜end▁of▁sentence｜>"}


def jinja(name: str, messages: list[dict[str, str]], generation_prompt: bool = True) -> str:
    rendered, _ = render_jinja_template(
        [messages],
        chat_template=load_template(name),
        add_generation_prompt=generation_prompt,
        bos_token="",
        eos_token=EOS.get(name, "<|endoftext|>"),
    )
    return rendered[0]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_go_template_renders_every_conversation_as_the_jinja_template(name):
    go_template, stops = TEMPLATES[name]
    for label, messages in CONVERSATIONS.items():
        assert ollama_render(go_template, messages) == jinja(name, messages), f"{name}: {label}"
    # What the Jinja template writes right after an assistant's words ends a turn: Ollama must stop there.
    finished = jinja(name, [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "XYZ"}], False)
    after = finished.split("XYZ", 1)[1]
    assert any(after.startswith(stop) for stop in stops), f"{name}: {after!r} starts with none of {stops}"


def test_gym_tiny_modelfile_template_matches_its_tokenizer():
    tiny = resolve("gym-tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny.path)
    text = modelfile(tiny.template, tokenizer.eos_token)
    (template,) = re.findall(r'^TEMPLATE """(.*?)"""$', text, re.DOTALL | re.MULTILINE)
    stops = re.findall(r"^PARAMETER stop (.+)$", text, re.MULTILINE)
    assert [s.strip('"') for s in stops] == stop_sequences(tiny.template, tokenizer.eos_token)
    for messages in CONVERSATIONS.values():
        expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ollama_render(template, messages) == expected


def test_the_interpreter_follows_go_semantics_and_refuses_what_it_does_not_know():
    data = {
        "System": "",
        "Messages": [{"Role": "user", "Content": "a"}, {"Role": "assistant", "Content": "b"}],
    }
    assert render("x\n  {{- if .System }}S{{ else }}none{{ end -}}\n  y", data) == "xnoney"
    loop = (
        "{{ range $i, $_ := .Messages }}{{ $i }}{{ if eq (len (slice $.Messages $i)) 1 }}!{{ end }}{{ end }}"
    )
    assert render(loop, data) == "01!"
    assert render('{{ if and .Messages (ne .System "") }}A{{ else if not .System }}B{{ end }}', data) == "B"
    with pytest.raises(ValueError, match="unknown function"):
        render("{{ printf .System }}", data)
    with pytest.raises(ValueError, match="missing"):
        render("{{ if .System }}open", data)
