"""Formats: raw records -> canonical sft / preference / kto records, and the errors for bad ones.

Run: .venv/bin/pytest tests/test_data_formats.py
"""

from __future__ import annotations

import pytest

from gym.data.formats import Where, apply_columns, detect_format, normalize, require_kind
from gym.errors import ConfigError, DataError

W = Where("data.jsonl", 7)


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def test_alpaca_joins_instruction_and_input():
    rec = {"instruction": "Translate.", "input": "你好", "output": "Hello"}
    assert normalize(rec, "alpaca", W) == {
        "messages": [msg("user", "Translate.\n你好"), msg("assistant", "Hello")]
    }
    rec = {"instruction": "Say hi.", "input": "", "output": "hi"}
    assert normalize(rec, "alpaca", W)["messages"][0] == msg("user", "Say hi.")


def test_an_openai_message_weight_other_than_1_is_refused_not_ignored():
    """OpenAI's fine-tuning format marks assistant turns not to train on with `"weight": 0`: gym ignored it
    and trained on them."""
    turns = [
        msg("user", "Hi"),
        {**msg("assistant", "Bad"), "weight": 0},
        msg("user", "Again"),
        msg("assistant", "Ok"),
    ]
    with pytest.raises(DataError) as caught:
        normalize({"messages": turns}, "openai", W)
    assert "record 7" in str(caught.value) and "message 2 (assistant) has weight 0" in str(caught.value)
    kept = [msg("user", "Hi"), {**msg("assistant", "Hello"), "weight": 1}]
    assert normalize({"messages": kept}, "openai", W)["messages"][1] == msg("assistant", "Hello")


def test_a_pair_missing_half_is_read_as_a_pair_and_said_to_miss_it():
    """`prompt` + `chosen` without `rejected` was guessed to be prompt records, and a preference method
    then refused prompt data, never naming the missing `rejected`."""
    for rec, missing in (
        ({"prompt": "hi", "chosen": "a"}, "rejected"),
        ({"prompt": "hi", "rejected": "b"}, "chosen"),
    ):
        assert detect_format(rec) == "preference"
        with pytest.raises(DataError, match=f"record 7, field '{missing}': missing"):
            normalize(rec, "preference", W)


def test_alpaca_system_and_history():
    rec = {"instruction": "Double it.", "output": "10", "system": "Be exact.", "history": [["2+3?", "5"]]}
    assert normalize(rec, "alpaca", W)["messages"] == [
        msg("system", "Be exact."),
        msg("user", "2+3?"),
        msg("assistant", "5"),
        msg("user", "Double it."),
        msg("assistant", "10"),
    ]


def test_sharegpt_and_openai():
    conv = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]
    out = normalize({"conversations": conv, "system": "Be kind."}, "sharegpt", W)
    assert out["messages"] == [msg("system", "Be kind."), msg("user", "Hi"), msg("assistant", "Hello")]
    out = normalize({"messages": [msg("user", "Hi"), msg("assistant", "Hello")]}, "openai", W)
    assert out["messages"] == [msg("user", "Hi"), msg("assistant", "Hello")]


def test_preference_styles():
    expected = {"prompt": [msg("user", "2+2?")], "chosen": "4", "rejected": "5"}
    styles = [
        {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
        {
            "prompt": [msg("user", "2+2?")],
            "chosen": [msg("assistant", "4")],
            "rejected": [msg("assistant", "5")],
        },
        {
            "chosen": [msg("user", "2+2?"), msg("assistant", "4")],
            "rejected": [msg("user", "2+2?"), msg("assistant", "5")],
        },
        {"instruction": "2+2?", "input": "", "chosen": "4", "rejected": "5"},
        {
            "conversations": [{"from": "human", "value": "2+2?"}],
            "chosen": {"from": "gpt", "value": "4"},
            "rejected": {"from": "gpt", "value": "5"},
        },
    ]
    for rec in styles:
        assert normalize(rec, "preference", W) == expected, rec


def test_implicit_prompt_must_share_the_prefix():
    rec = {
        "chosen": [msg("user", "a"), msg("assistant", "b")],
        "rejected": [msg("user", "x"), msg("assistant", "y")],
    }
    with pytest.raises(DataError, match="share every turn but the last") as e:
        normalize(rec, "preference", W)
    assert e.value.record == 7


@pytest.mark.parametrize(
    ("rec", "fmt", "field"),
    [
        ({"prompt": [msg("user", "q")], "chosen": [msg("assistant", "a"), msg("user", "b"),
          msg("assistant", "c")], "rejected": [msg("assistant", "d")]}, "preference", "chosen"),
        ({"prompt": "q", "completion": [msg("assistant", "a"), msg("assistant", "b")], "label": True}, "kto",
         "completion"),
    ],
)  # fmt: skip
def test_an_answer_of_several_messages_is_said_to_be_one(rec, fmt, field):
    """One message in a list is an answer: several were refused as "must be a string, got list"."""
    with pytest.raises(DataError) as e:
        normalize(rec, fmt, W)
    assert e.value.field == field
    assert e.value.message == f"must be one assistant message, got {len(rec[field])} messages"
    assert str(e.value.hint).startswith("the turns before the answer belong in the prompt")


def test_kto_styles_and_labels():
    expected = {"prompt": [msg("user", "2+2?")], "completion": "4", "label": True}
    for rec in [
        {"instruction": "2+2?", "output": "4", "label": True},
        {"prompt": "2+2?", "completion": "4", "label": "true"},
        {"prompt": [msg("user", "2+2?")], "completion": [msg("assistant", "4")], "label": 1},
        {"messages": [msg("user", "2+2?"), msg("assistant", "4")], "label": " TRUE "},
    ]:
        assert normalize(rec, "kto", W) == expected, rec
    assert normalize({"prompt": "p", "completion": "c", "label": "0"}, "kto", W)["label"] is False


@pytest.mark.parametrize("label", ["yes", 2, 0.5, None, [True]])
def test_kto_rejects_non_boolean_labels(label):
    with pytest.raises(DataError) as e:
        normalize({"prompt": "p", "completion": "c", "label": label}, "kto", W)
    assert e.value.field == "label" and e.value.record == 7 and "boolean" in str(e.value)


def test_missing_field_names_file_record_field_and_fix():
    with pytest.raises(DataError) as e:
        normalize({"instruction": "a", "answer": "b"}, "alpaca", W)
    text = str(e.value)
    assert e.value.field == "output" and "data.jsonl" in text and "record 7" in text
    assert "alpaca records need instruction and output" in text and "`columns`" in text


def test_mistyped_fields():
    with pytest.raises(DataError, match="must be a string, got int 42") as e:
        normalize({"instruction": "a", "output": 42}, "alpaca", W)
    assert e.value.field == "output"
    with pytest.raises(DataError, match="must be a non-empty list of messages") as e:
        normalize({"messages": "hello"}, "openai", W)
    assert e.value.field == "messages"
    with pytest.raises(DataError, match="history"):
        normalize({"instruction": "a", "output": "b", "history": ["q", "a"]}, "alpaca", W)


def test_conversation_rules():
    bad = {
        "user twice": [msg("user", "a"), msg("user", "b"), msg("assistant", "c")],
        "ends with user": [msg("user", "a"), msg("assistant", "b"), msg("user", "c")],
        "empty content": [msg("user", " "), msg("assistant", "b")],
        "unknown role": [{"role": "narrator", "content": "a"}, msg("assistant", "b")],
    }
    for name, messages in bad.items():
        with pytest.raises(DataError) as e:
            normalize({"messages": messages}, "openai", W)
        assert e.value.field == "messages", name
    with pytest.raises(DataError, match="must end with an assistant turn"):
        normalize({"messages": bad["ends with user"]}, "openai", W)


def test_tool_turns_are_rejected_with_a_reason():
    conv = [{"from": "human", "value": "Weather?"}, {"from": "function_call", "value": "{}"}]
    with pytest.raises(DataError, match="tool turns are not supported"):
        normalize({"conversations": conv}, "sharegpt", W)


def test_a_record_holding_images_is_refused_not_trained_on_as_text():
    """The column was dropped and `<image>` trained on as literal text (dataset_info.json's `images`
    was already refused)."""
    record = {"instruction": "<image>What is this?", "output": "A cat.", "images": ["cat.png"]}
    with pytest.raises(DataError, match="holds images: gym trains text-only models") as e:
        normalize(record, "alpaca", W)
    assert e.value.field == "images"
    assert normalize({**record, "images": []}, "alpaca", W)["messages"][-1]["content"] == "A cat."


def test_column_mapping_and_error_names_the_source_column():
    cols = {"instruction": "question", "output": "answer"}
    rec = apply_columns({"question": "2+3?", "answer": "5", "id": 1}, cols)
    assert normalize(rec, "alpaca", Where("qa.jsonl", 1, cols))["messages"][1] == msg("assistant", "5")
    rec = apply_columns({"question": "2+3?", "answer": 5}, cols)
    with pytest.raises(DataError) as e:
        normalize(rec, "alpaca", Where("qa.jsonl", 2, cols))
    assert e.value.field == "answer" and "'output'" in str(e.value)


def test_detect_format():
    assert detect_format(["messages"]) == "openai"
    assert detect_format(["conversations", "system"]) == "sharegpt"
    assert detect_format(["conversations", "chosen", "rejected"]) == "preference"
    assert detect_format(["prompt", "completion", "label"]) == "kto"
    assert detect_format(["instruction", "input", "output"]) == "alpaca"
    assert detect_format(["text", "url"]) == "text"
    assert detect_format(["body"]) is None


def test_require_kind():
    require_kind("sft", "sft")
    require_kind("preference", "dpo")
    require_kind("kto", "kto")
    with pytest.raises(ConfigError, match="'dpo' needs a preference dataset") as e:
        require_kind("sft", "dpo", dataset="demo_sft")
    assert "demo_sft" in str(e.value)
    with pytest.raises(ConfigError, match="needs a kto dataset"):
        require_kind("preference", "kto")
    with pytest.raises(ConfigError, match="unknown training method"):
        require_kind("sft", "nonsense")
    # The methods it suggests for the data are methods gym trains (it named cpo, which is none)
    from gym.data.formats import METHOD_KIND
    from gym.train import METHODS

    assert set(METHOD_KIND) <= set(METHODS)
    # Tokenized sft data reaches online RL from the Python API only: the flows tokenize it as prompts
    with pytest.raises(ConfigError, match=r"Tokenize it as prompts \(gym.data.tokenize's as_prompts=True"):
        require_kind("sft", "ppo", dataset="alpaca_en_demo")
    with pytest.raises(
        ConfigError, match=r"trains on preference data \(dpo, ipo, cdpo, hinge, orpo, simpo, rm\)"
    ):
        require_kind("preference", "sft")


def test_alpaca_with_only_input_is_the_user_turn_as_in_llamafactory():
    rec = {"instruction": "", "input": "some input", "output": "x"}
    assert normalize(rec, "alpaca", W)["messages"][0] == msg("user", "some input")
    assert normalize({"input": "q", "output": "x"}, "alpaca", W)["messages"][0] == msg("user", "q")
    with pytest.raises(DataError, match="is empty") as e:  # instruction is needed when input is empty too
        normalize({"instruction": " ", "input": "", "output": "x"}, "alpaca", W)
    assert e.value.field == "instruction"


@pytest.mark.parametrize(
    ("message", "says"),
    [
        (
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
            "'tool_calls'",
        ),
        ({"role": "assistant", "content": None, "function_call": {"name": "f"}}, "'function_call'"),
        ({"role": "tool", "tool_call_id": "1", "content": "sunny"}, "role 'tool'"),
    ],
)
def test_openai_tool_calls_are_rejected_as_tool_turns(message, says):
    messages = [msg("user", "Weather?"), message, msg("assistant", "Sunny.")]
    with pytest.raises(DataError, match="tool turns are not supported") as e:
        normalize({"messages": messages}, "openai", W)
    assert says in str(e.value) and "drop tool turns" in str(e.value) and e.value.field == "messages"


def test_openai_text_parts_and_the_developer_role():
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]
    rec = {
        "messages": [msg("developer", "Be kind."), {"role": "user", "content": parts}, msg("assistant", "Yo")]
    }
    assert normalize(rec, "openai", W)["messages"] == [
        msg("system", "Be kind."),
        msg("user", "Hi\nthere"),
        msg("assistant", "Yo"),
    ]
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    rec["messages"][1]["content"] = [parts[0], image]
    with pytest.raises(
        DataError, match="content part 2 is of type 'image_url'; gym trains on text only"
    ) as e:
        normalize(rec, "openai", W)
    assert e.value.field == "messages" and "message 2 (user)" in str(e.value)
    rec["messages"][1]["content"] = ["Hi"]
    with pytest.raises(DataError, match=r"content part 1 must be an object like"):
        normalize(rec, "openai", W)


def test_a_label_that_is_no_kto_label_beside_sft_fields_is_an_extra_column():
    chat = [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]
    for rec, fmt in [
        ({"instruction": "Classify: great", "output": "positive", "label": "sentiment"}, "alpaca"),
        ({"conversations": chat, "label": "greeting"}, "sharegpt"),
        ({"messages": [msg("user", "Hi"), msg("assistant", "Hello")], "label": 7}, "openai"),
    ]:
        assert detect_format(rec) == fmt, rec
        assert normalize(rec, fmt, W)["messages"][-1]["role"] == "assistant"
    for label in (True, 0, "false", " TRUE "):  # KTO labels make KTO data, as before
        assert detect_format({"instruction": "a", "output": "b", "label": label}) == "kto"
    assert detect_format({"prompt": "p", "completion": "c", "label": "yes"}) == "kto"  # KTO's own fields
    assert detect_format({"prompt": "p", "label": "yes"}) == "kto"  # nothing else fits


def test_an_error_in_a_guessed_format_says_so_and_how_to_name_another():
    rec = {"instruction": "a", "output": "b", "label": "maybe"}
    with pytest.raises(DataError) as e:
        normalize(rec, "kto", Where("data.jsonl", 7, guessed="kto"))
    text = str(e.value)
    assert "format kto was guessed from the first record's fields" in text and "`formatting`" in text
    assert "use true/false" in text  # the record's own hint stays
    with pytest.raises(DataError) as e:
        normalize(rec, "kto", W)
    assert "guessed" not in str(e.value)
    guessed = Where("data.jsonl", 7, guessed="alpaca")
    with pytest.raises(DataError) as e:  # a missing field: perhaps the guess was wrong
        normalize({"instruction": "a"}, "alpaca", guessed)
    assert "was guessed" in str(e.value)
    with pytest.raises(DataError) as e:  # the right fields with an empty answer: the guess is not why
        normalize({"instruction": "a", "output": " "}, "alpaca", guessed)
    assert "is empty" in str(e.value) and "guessed" not in str(e.value)


def test_a_role_that_is_no_string_or_no_tag_of_the_entry_is_named():
    """A list as a role raised TypeError (unhashable) out of the reader; a role an entry's custom tags
    don't spell was listed against gym's default role names."""
    from gym.data.formats import apply_tags

    turns = [{"role": ["user"], "content": "hi"}, msg("assistant", "x")]
    with pytest.raises(DataError, match=r"record 7, field 'messages': message 1 needs its role as a string"):
        normalize({"messages": turns}, "openai", W)
    spelled = [{"from": "USER", "value": "hi"}, {"from": "BOT", "value": "x"}, {"from": "SYS", "value": "y"}]
    tagged = apply_tags({"conversations": spelled}, {"user_tag": "USER", "assistant_tag": "BOT"})
    with pytest.raises(DataError, match=r"message 3 has unknown role 'SYS'; expected one of \['BOT', 'USER'"):
        normalize(tagged, "sharegpt", W)
    good = apply_tags({"conversations": spelled[:2]}, {"user_tag": "USER", "assistant_tag": "BOT"})
    assert normalize(good, "sharegpt", W)["messages"] == [msg("user", "hi"), msg("assistant", "x")]
