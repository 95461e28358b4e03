"""The experience block reaches the system message, the same way wherever the model runs."""

from __future__ import annotations

import json

from gym.tfgrpo.injection import EXPERIENCE_FILE, inject, load_shipped


def test_inject_appends_to_an_existing_system_message_without_touching_the_input():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    out = inject(messages, ["When adding, carry tens."])
    assert (
        out[0]["content"].startswith("Be brief.\n\n")
        and "[G0]. When adding, carry tens." in out[0]["content"]
    )
    assert messages[0]["content"] == "Be brief." and out[1] == messages[1]


def test_inject_adds_a_system_message_and_is_a_no_op_without_experiences():
    messages = [{"role": "user", "content": "hi"}]
    assert inject(messages, None) == messages and inject(messages, []) == messages
    out = inject(messages, ["a", "b"])
    assert out[0]["role"] == "system" and "[G1]. b" in out[0]["content"] and out[1:] == messages


def test_load_shipped_reads_the_library_in_order(tmp_path):
    assert load_shipped(tmp_path) is None
    (tmp_path / EXPERIENCE_FILE).write_text(
        json.dumps({"items": [{"id": "e2", "text": "x"}, {"id": "e1", "text": "y"}]})
    )
    assert load_shipped(tmp_path) == ["x", "y"]
