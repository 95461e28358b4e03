"""Prompts and token ids for multiple-choice questions, built the way lm-eval 0.4 builds them.

Two prompt styles:

- "lm-eval" (default): lm-eval's plain-text prompt: the subject's description, then each
  few-shot example as `<question>\\nA. ..\\nD. ..\\nAnswer: <letter>` joined by blank lines, then
  the question; each choice is the continuation `" A"` .. `" D"` (target delimiter: one space).
- "chat": few-shot examples as user/assistant turns through the model's chat template, the
  description as the system message, and the bare letter right after the generation prompt:
  lm-eval's `--apply_chat_template --fewshot_as_multiturn` (and LLaMA-Factory's style).

A TF-GRPO model's experience library (`experiences`) is injected as everywhere else
(gym.tfgrpo.injection; a shipped library with `retrieval_top_k` gives each question the experiences
most similar to its own text, the last user turn of the chat style, in both styles): appended to
the system message in the chat style; first, where lm-eval puts `--system_instruction`, in the
plain style (so the prompt equals lm-eval's with that instruction).

Token ids follow lm-eval's `_encode_pair` and `_loglikelihood_tokens`: trailing whitespace of
the context moves to the continuation, the continuation's tokens are those of context+choice
after the context's tokens, and a context longer than the model's window loses tokens on the left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gym.eval.benchmarks import LETTERS, BenchmarkSpec
from gym.eval.mc_data import Question, SubjectData
from gym.tfgrpo.injection import ShippedLibrary, inject, inject_text

PromptStyle = Literal["lm-eval", "chat"]
PROMPT_STYLES: tuple[str, ...] = ("lm-eval", "chat")
DEFAULT_MAX_LENGTH = 2048  # lm-eval's HFLM default when neither config nor tokenizer says
TOKENIZER_INFINITY = 1000000000000000019884624838656  # transformers' "model_max_length unset"


def format_question(spec: BenchmarkSpec, q: Question) -> str:
    """lm-eval's doc_to_text for MMLU, C-Eval and CMMLU."""
    c = q.choices
    return f"{q.question.strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\n{spec.answer_cue}"


def description(spec: BenchmarkSpec, subject: SubjectData) -> str:
    return spec.description.format(name=subject.info.name)


def text_context(spec: BenchmarkSpec, subject: SubjectData, q: Question) -> str:
    shots = "".join(f"{format_question(spec, s)} {LETTERS[s.answer]}\n\n" for s in subject.shots)
    return description(spec, subject) + shots + format_question(spec, q)


def chat_messages(spec: BenchmarkSpec, subject: SubjectData, q: Question) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": description(spec, subject)}]
    for s in subject.shots:
        messages.append({"role": "user", "content": format_question(spec, s)})
        messages.append({"role": "assistant", "content": LETTERS[s.answer]})
    messages.append({"role": "user", "content": format_question(spec, q)})
    return messages


@dataclass(frozen=True)
class Encoded:
    """One question's token ids: `context` then, per choice, its continuation tokens."""

    context: list[int]
    continuations: tuple[list[int], ...]

    @property
    def shared(self) -> bool:
        """All choices differ only in their last token: one forward pass scores all four."""
        first = self.continuations[0]
        return all(len(c) == len(first) and c[:-1] == first[:-1] for c in self.continuations)


class Encoder:
    """Text -> token ids exactly as lm-eval's HFLM (causal backend, default arguments) does.

    lm-eval encodes the context and then context+choice whole, four times per question. gym
    encodes the context once (with character offsets) and each context+choice only over a short
    window at the end: from a token boundary `WINDOW` tokens back. The window's tokens are taken
    only if starting there reproduces the context's own tokens and appending the choice leaves
    the window's first token alone; otherwise that choice is encoded whole, as lm-eval does.
    """

    WINDOW = 8

    def __init__(
        self,
        tokenizer: Any,
        render_chat: Any | None = None,
        experiences: list[str] | ShippedLibrary | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.render_chat = render_chat  # messages -> text with the generation prompt (chat style)
        # A TF-GRPO model's library: every text into every prompt, or a shipped library's choice per question.
        self.experiences = experiences
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self._prefix_text = tokenizer.decode(prefix) if prefix is not None else None
        # Windows need offsets (fast tokenizers) and specials only at the start (BOS), never at the end.
        probe = "gym probe text"
        with_special = list(tokenizer.encode(probe))
        plain = list(tokenizer.encode(probe, add_special_tokens=False))
        self._n_prefix = len(with_special) - len(plain)
        self.windowed = bool(tokenizer.is_fast) and with_special[self._n_prefix :] == plain
        self.whole_encodes = 0  # continuations that needed the whole text encoded
        self._checked: tuple[str, bool] = ("", False)  # last window, and whether it starts cleanly

    def special(self, text: str) -> dict[str, bool]:
        # lm-eval's tok_encode: the tokenizer's own special tokens, unless the text already starts
        # with the BOS (or, without one, EOS) text, as chat templates often do.
        if self._prefix_text and text.startswith(self._prefix_text):
            return {"add_special_tokens": False}
        return {}

    # verbose=False: no "longer than the maximum sequence length ... indexing errors" warning from
    # transformers; prompts are cut to the window on the left afterwards, and the run's note counts them.
    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, verbose=False, **self.special(text)))

    def question(self, spec: BenchmarkSpec, subject: SubjectData, q: Question, style: PromptStyle) -> Encoded:
        context, delimiter = self.context(spec, subject, q, style), "" if style == "chat" else " "
        return self.pair(context, [delimiter + letter for letter in LETTERS])

    def context(self, spec: BenchmarkSpec, subject: SubjectData, q: Question, style: PromptStyle) -> str:
        """The question's prompt text in `style`, experiences injected."""
        if isinstance(self.experiences, ShippedLibrary):
            texts: list[str] | None = self.experiences.texts_for(format_question(spec, q))
        else:
            texts = self.experiences
        if style == "chat":
            if self.render_chat is None:
                raise ValueError("the chat style needs a chat template renderer")
            return str(self.render_chat(inject(chat_messages(spec, subject, q), texts)))
        return inject_text(text_context(spec, subject, q), texts)

    def pair(self, context: str, continuations: list[str]) -> Encoded:
        """lm-eval's `_encode_pair` for one context and several continuations."""
        spaces = len(context) - len(context.rstrip())
        moved = context[len(context) - spaces :] if spaces else ""
        context = context[: len(context) - spaces]
        special = self.special(context)
        if not self.windowed:
            ids = self.encode(context)
            return Encoded(ids, tuple(self.encode(context + moved + c)[len(ids) :] for c in continuations))
        enc = self.tokenizer(context, return_offsets_mapping=True, verbose=False, **special)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        start = self._window_start(ids, offsets, special)
        conts = []
        for cont in continuations:
            tail = self._window(context, ids, offsets, start, moved + cont) if start is not None else None
            if tail is None:
                self.whole_encodes += 1
                tail = list(self.tokenizer.encode(context + moved + cont, verbose=False, **special))[
                    len(ids) :
                ]
            conts.append(tail)
        return Encoded(ids, tuple(conts))

    def _window_start(self, ids: list[int], offsets: Any, special: dict[str, bool]) -> int | None:
        first = 0 if special else self._n_prefix
        k = len(ids) - self.WINDOW
        while k > first and offsets[k][0] != offsets[k - 1][1]:  # a clean character boundary
            k -= 1
        return k if k > first else None

    def _window(self, context: str, ids: list[int], offsets: Any, k: int, cont: str) -> list[int] | None:
        cut = offsets[k][0]
        window = context[cut:]
        if self._checked[0] != window:  # the same for every choice of a question
            fresh = list(self.tokenizer.encode(window, add_special_tokens=False, verbose=False))
            self._checked = (window, fresh == ids[k:])
        if not self._checked[1]:
            return None
        tail = list(self.tokenizer.encode(window + cont, add_special_tokens=False, verbose=False))
        if not tail or tail[0] != ids[k]:
            return None
        return tail[len(ids) - k :]


def max_length(model_config: Any, tokenizer: Any, override: int | None = None) -> int:
    """The context window lm-eval's HFLM uses: the config's n_positions / max_position_embeddings /
    n_ctx, else the tokenizer's model_max_length, else 2048."""
    if override:
        return override
    cfg = getattr(model_config, "text_config", None) or model_config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(cfg, attr, None)
        if value is not None:
            return int(value)
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit != TOKENIZER_INFINITY:
        return int(limit)
    return DEFAULT_MAX_LENGTH
