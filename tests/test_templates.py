"""Chat templates: every template renders exactly what its family's official chat_template renders,
add_generation_prompt opens the assistant turn, and the assistant mask covers exactly each
assistant content plus its end-of-turn marker (nothing from system/user turns).

The golden strings were produced once by rendering the official templates (named above each one,
taken from the model's tokenizer_config.json on the Hub) with transformers' chat-template renderer
and the family's real bos/eos strings; the official templates themselves are not in the repo.

Run: .venv/bin/pytest tests/test_templates.py
"""

from __future__ import annotations

import json

import jinja2
import pytest
from transformers import AutoTokenizer

from gym.errors import ConfigError, RegistryError
from gym.paths import assets_dir
from gym.registry import load_models, models_file
from gym.templates import (
    ALIASES,
    assistant_spans,
    canonical_template,
    encode,
    list_templates,
    load_template,
    render,
    render_text,
    render_with_spans,
)

SYSTEM = {"role": "system", "content": "You are a concise geography tutor."}
USER1 = {"role": "user", "content": "What is the capital of France?"}
ANSWER1 = {"role": "assistant", "content": "The capital of France is Paris."}
USER2 = {"role": "user", "content": "And of Italy?"}
ANSWER2 = {"role": "assistant", "content": "Rome is the capital of Italy."}
CONV = [SYSTEM, USER1, ANSWER1, USER2, ANSWER2]
PROMPT = CONV[:4]  # ends with a user turn: what a served model sees

# Each family's real (bos, eos) strings, from its tokenizer_config.json.
LLAMA3 = ("<|begin_of_text|>", "<|eot_id|>")
DEEPSEEK = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
TOKENS: dict[str, tuple[str | None, str]] = {
    "chatml": (None, "<|im_end|>"),
    "qwen2.5": (None, "<|im_end|>"),
    "qwen3": (None, "<|im_end|>"),
    "llama3": LLAMA3,
    "llama3.1": LLAMA3,
    "mistral": ("<s>", "</s>"),
    "gemma": ("<bos>", "<eos>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "phi4-mini": ("<|endoftext|>", "<|endoftext|>"),
    "phi4": ("<|endoftext|>", "<|im_end|>"),
    "deepseek": DEEPSEEK,
    "deepseek-llm": DEEPSEEK,
    "alpaca": ("<s>", "</s>"),
}

QWEN_HISTORY = (
    "<|im_start|>system\nYou are a concise geography tutor.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n"
    "<|im_start|>user\nAnd of Italy?<|im_end|>\n"
)
LLAMA_TURNS = (
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nThe capital of France is Paris.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nAnd of Italy?<|eot_id|>"
)
LLAMA31_SYSTEM = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    "You are a concise geography tutor.<|eot_id|>"
)

# Rendering of CONV (system, user, assistant, user, assistant).
GOLDEN = {
    # OpenAI ChatML as gym ships it (no default system message).
    "chatml": QWEN_HISTORY + "<|im_start|>assistant\nRome is the capital of Italy.<|im_end|>\n",
    # Qwen/Qwen2.5-7B-Instruct
    "qwen2.5": QWEN_HISTORY + "<|im_start|>assistant\nRome is the capital of Italy.<|im_end|>\n",
    # Qwen/Qwen3-8B: the turn after the last user query carries an (empty) think block.
    "qwen3": QWEN_HISTORY
    + "<|im_start|>assistant\n<think>\n\n</think>\n\nRome is the capital of Italy.<|im_end|>\n",
    # meta-llama/Meta-Llama-3-8B-Instruct
    "llama3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "You are a concise geography tutor.<|eot_id|>"
    + LLAMA_TURNS
    + "<|start_header_id|>assistant<|end_header_id|>\n\nRome is the capital of Italy.<|eot_id|>",
    # meta-llama/Llama-3.1-8B-Instruct
    "llama3.1": LLAMA31_SYSTEM
    + LLAMA_TURNS
    + "<|start_header_id|>assistant<|end_header_id|>\n\nRome is the capital of Italy.<|eot_id|>",
    # mistralai/Mistral-7B-Instruct-v0.3, system placed as mistral-common places it (before the last
    # user message). The HF chat_template drops the system message on a conversation that ends with
    # an assistant turn; see test_mistral_matches_official_when_the_conversation_ends_with_user.
    "mistral": "<s>[INST] What is the capital of France?[/INST] The capital of France is Paris.</s>"
    "[INST] You are a concise geography tutor.\n\nAnd of Italy?[/INST] Rome is the capital of Italy.</s>",
    # google/gemma-3-4b-it (Gemma 2's template raises on a system message)
    "gemma": "<bos><start_of_turn>user\nYou are a concise geography tutor.\n\nWhat is the capital of France?"
    "<end_of_turn>\n<start_of_turn>model\nThe capital of France is Paris.<end_of_turn>\n"
    "<start_of_turn>user\nAnd of Italy?<end_of_turn>\n"
    "<start_of_turn>model\nRome is the capital of Italy.<end_of_turn>\n",
    # microsoft/Phi-3.5-mini-instruct (and Phi-3-mini-4k-instruct)
    "phi3": "<|system|>\nYou are a concise geography tutor.<|end|>\n"
    "<|user|>\nWhat is the capital of France?<|end|>\n"
    "<|assistant|>\nThe capital of France is Paris.<|end|>\n<|user|>\nAnd of Italy?<|end|>\n"
    "<|assistant|>\nRome is the capital of Italy.<|end|>\n<|endoftext|>",
    # microsoft/Phi-4-mini-instruct
    "phi4-mini": "<|system|>You are a concise geography tutor.<|end|>"
    "<|user|>What is the capital of France?<|end|>"
    "<|assistant|>The capital of France is Paris.<|end|><|user|>And of Italy?<|end|>"
    "<|assistant|>Rome is the capital of Italy.<|end|><|endoftext|>",
    # microsoft/phi-4
    "phi4": "<|im_start|>system<|im_sep|>You are a concise geography tutor.<|im_end|>"
    "<|im_start|>user<|im_sep|>What is the capital of France?<|im_end|>"
    "<|im_start|>assistant<|im_sep|>The capital of France is Paris.<|im_end|>"
    "<|im_start|>user<|im_sep|>And of Italy?<|im_end|>"
    "<|im_start|>assistant<|im_sep|>Rome is the capital of Italy.<|im_end|>",
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-32B (same template across the R1 distills)
    "deepseek": "<｜begin▁of▁sentence｜>You are a concise geography tutor."
    "<｜User｜>What is the capital of France?"
    "<｜Assistant｜>The capital of France is Paris.<｜end▁of▁sentence｜>"
    "<｜User｜>And of Italy?<｜Assistant｜>Rome is the capital of Italy.<｜end▁of▁sentence｜>",
    # deepseek-ai/deepseek-llm-7b-chat
    "deepseek-llm": "<｜begin▁of▁sentence｜>You are a concise geography tutor.\n\n"
    "User: What is the capital of France?\n\nAssistant: The capital of France is Paris.<｜end▁of▁sentence｜>"
    "User: And of Italy?\n\nAssistant: Rome is the capital of Italy.<｜end▁of▁sentence｜>",
    # hiyouga/LLaMA-Factory src/llamafactory/data/template.py "alpaca" (its generated jinja); a given
    # system message is used verbatim, with no separator -- LLaMA-Factory's behaviour.
    "alpaca": "You are a concise geography tutor.### Instruction:\nWhat is the capital of France?\n\n"
    "### Response:\nThe capital of France is Paris.</s>\n\n### Instruction:\nAnd of Italy?\n\n"
    "### Response:\nRome is the capital of Italy.</s>\n\n",
}

# Rendering of PROMPT (system, user, assistant, user) with add_generation_prompt=True: identical to the
# official templates' output for every family (mistral included).
GOLDEN_PROMPT = {
    "chatml": QWEN_HISTORY + "<|im_start|>assistant\n",
    "qwen2.5": QWEN_HISTORY + "<|im_start|>assistant\n",
    "qwen3": QWEN_HISTORY + "<|im_start|>assistant\n",
    "llama3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "You are a concise geography tutor.<|eot_id|>"
    + LLAMA_TURNS
    + "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "llama3.1": LLAMA31_SYSTEM + LLAMA_TURNS + "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "<s>[INST] What is the capital of France?[/INST] The capital of France is Paris.</s>"
    "[INST] You are a concise geography tutor.\n\nAnd of Italy?[/INST]",
    "gemma": "<bos><start_of_turn>user\nYou are a concise geography tutor.\n\nWhat is the capital of France?"
    "<end_of_turn>\n<start_of_turn>model\nThe capital of France is Paris.<end_of_turn>\n"
    "<start_of_turn>user\nAnd of Italy?<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nYou are a concise geography tutor.<|end|>\n"
    "<|user|>\nWhat is the capital of France?<|end|>\n"
    "<|assistant|>\nThe capital of France is Paris.<|end|>\n<|user|>\nAnd of Italy?<|end|>\n<|assistant|>\n",
    "phi4-mini": "<|system|>You are a concise geography tutor.<|end|>"
    "<|user|>What is the capital of France?<|end|>"
    "<|assistant|>The capital of France is Paris.<|end|><|user|>And of Italy?<|end|><|assistant|>",
    "phi4": "<|im_start|>system<|im_sep|>You are a concise geography tutor.<|im_end|>"
    "<|im_start|>user<|im_sep|>What is the capital of France?<|im_end|>"
    "<|im_start|>assistant<|im_sep|>The capital of France is Paris.<|im_end|>"
    "<|im_start|>user<|im_sep|>And of Italy?<|im_end|><|im_start|>assistant<|im_sep|>",
    "deepseek": "<｜begin▁of▁sentence｜>You are a concise geography tutor."
    "<｜User｜>What is the capital of France?"
    "<｜Assistant｜>The capital of France is Paris.<｜end▁of▁sentence｜>"
    "<｜User｜>And of Italy?<｜Assistant｜><think>\n",
    "deepseek-llm": "<｜begin▁of▁sentence｜>You are a concise geography tutor.\n\n"
    "User: What is the capital of France?\n\nAssistant: The capital of France is Paris.<｜end▁of▁sentence｜>"
    "User: And of Italy?\n\nAssistant:",
    "alpaca": "You are a concise geography tutor.### Instruction:\nWhat is the capital of France?\n\n"
    "### Response:\nThe capital of France is Paris.</s>\n\n"
    "### Instruction:\nAnd of Italy?\n\n### Response:\n",
}

# What the loss sees for each assistant turn, around its content: (before, end-of-turn marker).
# `eos` stands for the tokenizer's eos_token; the others are literal markers of the template.
TURN_END = {
    "chatml": "<|im_end|>",
    "qwen2.5": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "llama3.1": "<|eot_id|>",
    "mistral": "eos",
    "gemma": "<end_of_turn>",
    "phi3": "<|end|>",
    "phi4-mini": "<|end|>",
    "phi4": "<|im_end|>",
    "deepseek": "<｜end▁of▁sentence｜>",
    "deepseek-llm": "eos",
    "alpaca": "eos",
}
LEADING_SPACE = {"mistral", "deepseek-llm"}  # the model writes the space before its answer


def expected_turns(name: str, eos: str) -> list[str]:
    end = eos if TURN_END[name] == "eos" else TURN_END[name]
    lead = " " if name in LEADING_SPACE else ""
    think = "<think>\n\n</think>\n\n" if name == "qwen3" else ""  # Qwen3's final turn
    return [lead + ANSWER1["content"] + end, lead + think + ANSWER2["content"] + end]


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return AutoTokenizer.from_pretrained(str(assets_dir() / "gym_tiny"))


def official_render(name: str, messages: list[dict], **kwargs) -> str:
    bos, eos = TOKENS[name]
    return render_text(messages, name, bos_token=bos, eos_token=eos, **kwargs)


def test_every_template_has_goldens_and_tokens():
    assert set(list_templates()) == set(GOLDEN) == set(GOLDEN_PROMPT) == set(TOKENS) == set(TURN_END)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_multi_turn_with_system(name):
    assert official_render(name, CONV) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GOLDEN_PROMPT))
def test_golden_generation_prompt(name):
    assert official_render(name, PROMPT, add_generation_prompt=True) == GOLDEN_PROMPT[name]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_generation_tags_do_not_change_the_text(name):
    """The generation-tag spans sit inside the same text `render_text` returns."""
    bos, eos = TOKENS[name]
    text, spans = render_with_spans(CONV, name, bos_token=bos, eos_token=eos)
    assert text == GOLDEN[name]
    assert [text[a:b] for a, b in spans] == expected_turns(name, eos)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_assistant_mask_on_gym_tiny(name, tiny_tokenizer):
    """Masked tokens decode to exactly each assistant content + end-of-turn marker, nothing else."""
    enc = encode(tiny_tokenizer, CONV, name)
    assert len(enc.input_ids) == len(enc.assistant_mask)
    assert tiny_tokenizer.decode(enc.input_ids) == render(tiny_tokenizer, CONV, name)
    spans = assistant_spans(enc.assistant_mask)
    decoded = [tiny_tokenizer.decode(enc.input_ids[a:b]) for a, b in spans]
    assert decoded == expected_turns(name, tiny_tokenizer.eos_token)
    masked = "".join(decoded)
    for turn in (SYSTEM, USER1, USER2):
        assert turn["content"] not in masked


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_generation_prompt_is_not_masked(name, tiny_tokenizer):
    enc = encode(tiny_tokenizer, PROMPT, name, add_generation_prompt=True)
    spans = assistant_spans(enc.assistant_mask)
    assert len(spans) == 1  # only the history's assistant turn
    assert tiny_tokenizer.decode(enc.input_ids[spans[0][0] : spans[0][1]]).strip().startswith("The capital")


def test_render_passes_the_tokenizers_special_tokens(tiny_tokenizer):
    assert render(tiny_tokenizer, CONV, "chatml") == GOLDEN["chatml"]
    # gym-tiny has no bos: llama3 starts straight with the header
    assert render(tiny_tokenizer, CONV, "llama3") == GOLDEN["llama3"].removeprefix("<|begin_of_text|>")


def test_qwen25_default_system_message():
    text = official_render("qwen2.5", [USER1], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen3_thinking_matches_official():
    """History reasoning is dropped, the final turn keeps reasoning_content (official Qwen3 output)."""
    history = {
        "role": "assistant",
        "content": "<think>\nFrance: Paris.\n</think>\n\nThe capital of France is Paris.",
    }
    final = {"role": "assistant", "content": ANSWER2["content"], "reasoning_content": "Italy: Rome."}
    head = (
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\nThe capital of France is Paris.<|im_end|>\n"
        "<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert official_render("qwen3", [USER1, history, USER2, final]) == (
        head + "<think>\nItaly: Rome.\n</think>\n\nRome is the capital of Italy.<|im_end|>\n"
    )
    no_think = official_render(
        "qwen3", [USER1, history, USER2], add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == head + "<think>\n\n</think>\n\n"


def test_deepseek_cuts_history_reasoning_but_keeps_the_trained_turn():
    think = {
        "role": "assistant",
        "content": "<think>\nFrance: Paris.\n</think>\n\nThe capital of France is Paris.",
    }
    history = official_render("deepseek", [USER1, think, USER2], add_generation_prompt=True)
    assert history == (  # official output
        "<｜begin▁of▁sentence｜><｜User｜>What is the capital of France?<｜Assistant｜>\n\n"
        "The capital of France is Paris.<｜end▁of▁sentence｜><｜User｜>And of Italy?<｜Assistant｜><think>\n"
    )
    trained = official_render("deepseek", [USER1, think])
    assert trained.endswith("<｜Assistant｜>" + think["content"] + "<｜end▁of▁sentence｜>")


def test_llama31_date_string():
    text = official_render("llama3.1", [USER1], date_string="05 Mar 2025")
    assert "Cutting Knowledge Date: December 2023\nToday Date: 05 Mar 2025\n\n<|eot_id|>" in text


def test_mistral_matches_official_when_the_conversation_ends_with_user():
    # Output of mistralai/Mistral-7B-Instruct-v0.3's own chat_template for this conversation.
    official = (
        "<s>[INST] What is the capital of France?[/INST] The capital of France is Paris.</s>"
        "[INST] You are a concise geography tutor.\n\nAnd of Italy?[/INST]"
    )
    assert official_render("mistral", PROMPT) == official


@pytest.mark.parametrize("name", ["mistral", "gemma"])
def test_roles_must_alternate(name):
    with pytest.raises(jinja2.TemplateError, match="alternate"):
        official_render(name, [SYSTEM, USER1, USER2])


@pytest.mark.parametrize("name", sorted(set(GOLDEN) - {"chatml"}))
def test_unsupported_roles_raise(name):
    with pytest.raises(jinja2.TemplateError):
        official_render(name, [USER1, ANSWER1, {"role": "tool", "content": "42"}])


def test_unknown_template_lists_available():
    with pytest.raises(ConfigError, match=r"available: .*chatml"):
        load_template("no-such-template")


# --- LLaMA-Factory's template names ------------------------------------------------------------

# What LLaMA-Factory 0.9.x renders, written out from its template definitions
# (src/llamafactory/data/template.py; Template._encode: prefix, system, then per turn format_user /
# format_assistant, the default system when none is given). Its `qwen` and `qwen3_nothink` share the
# ChatML slots: system "<|im_start|>system\n{{content}}<|im_end|>\n", user
# "<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n", assistant "{{content}}<|im_end|>\n";
# `qwen` adds default_system "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.".
LF_CHATML_SYSTEM = "<|im_start|>system\nYou are a concise geography tutor.<|im_end|>\n"
LF_CHATML_QWEN_SYSTEM = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
)
LF_CHATML_TURN = (
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    "The capital of France is Paris.<|im_end|>\n"
)
LF_CHATML_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
LF_CHATML_CONV = QWEN_HISTORY + "<|im_start|>assistant\nRome is the capital of Italy.<|im_end|>\n"
# LLaMA-Factory name: {conversation: its rendering}; "prompt" is [SYSTEM, USER1] with the generation prompt.
LLAMAFACTORY = {
    "qwen": {
        "system+user+assistant": LF_CHATML_SYSTEM + LF_CHATML_TURN,
        "user+assistant": LF_CHATML_QWEN_SYSTEM + LF_CHATML_TURN,
        "multi-turn": LF_CHATML_CONV,
        "prompt": LF_CHATML_SYSTEM + LF_CHATML_PROMPT,
    },
    "qwen3_nothink": {
        "system+user+assistant": LF_CHATML_SYSTEM + LF_CHATML_TURN,
        "user+assistant": LF_CHATML_TURN,
        "multi-turn": LF_CHATML_CONV,
        "prompt": LF_CHATML_SYSTEM + LF_CHATML_PROMPT,
    },
}
LF_CONVERSATIONS = {
    "system+user+assistant": ([SYSTEM, USER1, ANSWER1], False),
    "user+assistant": ([USER1, ANSWER1], False),
    "multi-turn": (CONV, False),
    "prompt": ([SYSTEM, USER1], True),
}
# LLaMA-Factory's `phi` (system "<|system|>\n{{content}}<|end|>\n", user
# "<|user|>\n{{content}}<|end|>\n<|assistant|>\n", assistant "{{content}}<|end|>\n", no eos after it).
LF_PHI = (
    "<|system|>\nYou are a concise geography tutor.<|end|>\n<|user|>\nWhat is the capital of France?<|end|>\n"
    "<|assistant|>\nThe capital of France is Paris.<|end|>\n"
)


def test_aliases_are_not_gym_names_and_name_gym_templates():
    names = list_templates()
    assert set(ALIASES) == set(LLAMAFACTORY)
    assert not set(ALIASES) & set(names), "list_templates() holds gym's names only"
    assert set(ALIASES.values()) <= set(names)
    assert canonical_template("qwen") == "qwen2.5" and canonical_template("qwen2.5") == "qwen2.5"


@pytest.mark.parametrize(("alias", "target"), sorted(ALIASES.items()))
def test_an_alias_renders_exactly_as_its_target(alias, target, tiny_tokenizer):
    assert load_template(alias) == load_template(target)
    for messages, prompt in LF_CONVERSATIONS.values():
        assert official_render(target, messages, add_generation_prompt=prompt) == render_text(
            messages,
            alias,
            bos_token=TOKENS[target][0],
            eos_token=TOKENS[target][1],
            add_generation_prompt=prompt,
        )
    assert encode(tiny_tokenizer, CONV, alias) == encode(tiny_tokenizer, CONV, target)


@pytest.mark.parametrize(
    ("alias", "conversation"), [(a, c) for a in sorted(LLAMAFACTORY) for c in LF_CONVERSATIONS]
)
def test_an_alias_renders_what_llamafactory_renders(alias, conversation):
    messages, prompt = LF_CONVERSATIONS[conversation]
    bos, eos = TOKENS[ALIASES[alias]]
    text = render_text(messages, alias, bos_token=bos, eos_token=eos, add_generation_prompt=prompt)
    assert text == LLAMAFACTORY[alias][conversation]


def test_llamafactory_phi_is_not_an_alias_of_phi3():
    """gym's phi3 ends a conversation with eos_token (as Phi-3's own template does); LLaMA-Factory's
    phi does not, so `phi` is no alias (the generation prompts agree)."""
    assert "phi" not in ALIASES
    assert official_render("phi3", [SYSTEM, USER1, ANSWER1]) == LF_PHI + "<|endoftext|>"
    prompt = official_render("phi3", [SYSTEM, USER1], add_generation_prompt=True)
    assert prompt == LF_PHI.split("The capital")[0]
    with pytest.raises(ConfigError, match=r"'phi' is not exactly gym's 'phi3' \(gym's ends a conversation"):
        load_template("phi")


def test_unknown_template_lists_gym_names_then_llamafactory_names():
    with pytest.raises(ConfigError) as err:
        load_template("no-such-template")
    available, aliases = str(err.value).split("; available: ")[1].split("; LLaMA-Factory's names: ")
    assert available.split(", ") == list_templates()
    assert aliases == "qwen (= qwen2.5), qwen3_nothink (= chatml)"


def test_a_registry_entry_may_name_an_alias_and_reads_as_gyms_name(tmp_path):
    doc = json.loads(models_file().read_text(encoding="utf-8"))
    qwen = next(i for i, e in enumerate(doc["models"]) if e["template"] == "qwen2.5")
    doc["models"][qwen]["template"] = "qwen"
    f = tmp_path / "models.json"
    f.write_text(json.dumps(doc), encoding="utf-8")
    assert load_models(f)[doc["models"][qwen]["name"]].template == "qwen2.5"
    doc["models"][qwen]["template"] = "qwen2"
    f.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(
        RegistryError, match=r"unknown chat template 'qwen2'.*LLaMA-Factory's names: qwen \(="
    ):
        load_models(f)


def test_gym_train_template_qwen_passes_validation(tmp_path):
    """`gym train --template qwen` and `template: qwen` in a LLaMA-Factory YAML get past preflight."""
    from flows import runner
    from flows.commands import train_plan
    from gym.preflight import check_model

    path = tmp_path / "run.yaml"
    path.write_text("template: qwen\n", encoding="utf-8")
    for argv in (["--template", "qwen"], [str(path)]):
        plan = train_plan(argv)
        parser = runner.build_parser(plan.config_cls)
        under = parser.parse_file(*plan.config_file) if plan.config_file else None
        config = runner.parse_config(plan.config_cls, parser.parse_args(plan.argv), under)
        assert config.template == "qwen"
        check_model(config.model, config.template)
    with pytest.raises(ConfigError, match=r"^template: unknown chat template 'phi'"):
        check_model("gym-tiny", "phi")
