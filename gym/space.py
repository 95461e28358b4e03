"""A Hugging Face Space that chats with a deployed model: app.py (Gradio + transformers, no gym
needed), requirements.txt and the Space's README.md metadata.

The app prompts the model as gym does: the chat template shipped in the model's tokenizer, plus
the TF-GRPO experience block (gym.tfgrpo.injection's exact text) when the model carries one: the
whole library, even one shipped with `retrieval_top_k` (the app has no embedding model to retrieve
with; `gym serve` and `gym eval` inject the per-question top k as training did).
A conversation longer than the model's context window keeps going as in `gym chat`: the oldest
exchanges are left out and the reply is shortened to the room left (gym.chat.fit); a message too long
on its own is a warning pop-up, and the chat goes on (gr.Error would leave Gradio's textbox disabled).
`MODEL_ID` (an environment variable) overrides which model it loads, so the same app runs on the
Space against the hub repo and locally against the deploy folder's `model/`.
"""

from __future__ import annotations

import json
from pathlib import Path

from gym.tfgrpo.injection import experience_block

REQUIREMENTS = ["gradio>=5,<7", "transformers==5.17.0", "torch", "accelerate", "safetensors"]

APP = '''"""Gradio chat for {title} (written by `gym deploy`). Run locally: python app.py"""

import os
from threading import Thread

import gradio as gr
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

MODEL_ID = os.environ.get("MODEL_ID", {model_id})
# The experience library gym injects into the system prompt of this model (None: it has none).
EXPERIENCES = {experiences}

tokenizer = AutoTokenizer.from_pretrained(MODEL_ID)
model = AutoModelForCausalLM.from_pretrained(MODEL_ID, dtype="auto").eval()
WINDOW = getattr(model.config, "max_position_embeddings", None)  # the model's context window


def with_experiences(messages):
    if not EXPERIENCES:
        return messages
    if messages and messages[0]["role"] == "system":
        return [{{**messages[0], "content": messages[0]["content"] + "\\n\\n" + EXPERIENCES}}, *messages[1:]]
    return [{{"role": "system", "content": EXPERIENCES}}, *messages]


def text(content):
    """A message's text: Gradio 6 gives content as a list of parts, Gradio 5 as a string."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


def conversation(history, message):
    """Gradio's history (messages, or Gradio 5's [user, bot] pairs) and the new message. A user message
    no reply followed (one refused as too long, or stopped before its first word) is left out."""
    messages = []
    for item in history:
        if isinstance(item, dict):
            messages.append({{"role": item["role"], "content": text(item["content"])}})
        else:
            messages += [{{"role": r, "content": text(c)}} for r, c in zip(("user", "assistant"), item) if c]
    replied = [m["role"] == "assistant" for m in messages[1:]] + [False]
    messages = [m for m, r in zip(messages, replied) if m["role"] != "user" or r]
    return [*messages, {{"role": "user", "content": message}}]


def prompt(messages):
    """The model's input for `messages`: its chat template, with the experiences."""
    messages = with_experiences(messages)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)


class TooLong(ValueError):
    """A message the model's window cannot hold, even alone."""


def fit(messages, max_tokens):
    """The input and reply length that fit the model's window: the oldest exchanges are left out (a
    system message stays) until there is room for the reply, which is shortened when even the newest
    message leaves less (as `gym chat` does)."""
    head = messages[:1] if messages[0]["role"] == "system" else []
    turns = messages[len(head):]
    while True:
        inputs = prompt([*head, *turns])
        room = WINDOW - inputs["input_ids"].shape[1] if WINDOW else max_tokens
        users = [i for i, m in enumerate(turns) if m["role"] == "user"]
        if room >= max_tokens or len(users) < 2:
            break
        turns = turns[users[1]:]
    if room < 1:
        raise TooLong(f"This message is too long for the model's {{WINDOW}}-token window: shorten it.")
    return inputs, min(int(max_tokens), room)


def respond(message, history, temperature=0.7, max_tokens=256):
    try:
        inputs, max_tokens = fit(conversation(history, message), int(max_tokens))
    except TooLong as exc:  # a pop-up, and the chat goes on (gr.Error here would leave the textbox disabled)
        gr.Warning(str(exc))
        return
    inputs = inputs.to(model.device)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    sampling = {{"do_sample": temperature > 0}}
    if temperature > 0:
        sampling["temperature"] = temperature
    kwargs = {{**inputs, **sampling, "max_new_tokens": int(max_tokens), "streamer": streamer}}
    Thread(target=model.generate, kwargs=kwargs).start()
    reply = ""
    for piece in streamer:
        reply += piece
        yield reply


demo = gr.ChatInterface(
    respond,
    title={title_literal},
    additional_inputs=[
        gr.Slider(0.0, 2.0, value=0.7, step=0.05, label="temperature"),
        gr.Slider(1, 1024, value=256, step=1, label="max tokens"),
    ],
)

if __name__ == "__main__":
    demo.launch()
'''


def write_space(
    out: Path, title: str, model_id: str, experiences: list[str] | None, model_repo: str | None
) -> None:
    """Write the Space's files into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    block = experience_block(experiences) if experiences else None
    app = APP.format(
        title=title,
        title_literal=json.dumps(f"Chat with {title}"),
        model_id=json.dumps(model_id),
        experiences=repr(block),
    )
    (out / "app.py").write_text(app, encoding="utf-8")
    (out / "requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n", encoding="utf-8")
    models = f"models:\n- {model_repo}\n" if model_repo else ""
    (out / "README.md").write_text(
        f"---\ntitle: {json.dumps(title)}\nsdk: gradio\napp_file: app.py\npinned: false\n{models}---\n\n"
        f"# {title}\n\nA chat page for `{model_repo or model_id}`, written by `gym deploy`.\n",
        encoding="utf-8",
    )
