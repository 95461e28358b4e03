"""Reward models: a sequence-classification model with one output (a `score` head) scores each
prompt + completion, rendered as a conversation with the reward model's own chat template.

    from gym.rewards.model import RewardModel
    rm = RewardModel("path/to/reward-model")       # or a registry name, or a hub id
    rm(prompts=[[{"role": "user", "content": "2+2?"}]], completions=[[{"role": "assistant", "content": "4"}]])

SOURCE may be a registry entry (its template comes from the registry), a local directory (a gym
model carries its template in gym_model.json; others use the tokenizer's own chat template), or a
hub id. A gym model with a trained value/score head, such as the value model a PPO stage saves
(`<stage>/value_model`), works as a reward model. Weights load on first use, from safetensors,
without remote code; a directory without a `score` head is refused (a randomly initialised head
would hand out random rewards).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gym.errors import ConfigError
from gym.rewards.base import completion_text

HEAD = "score.weight"


def _has_score_head(directory: Path) -> bool:
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            if any(k == HEAD or k.endswith("." + HEAD) for k in st.keys()):  # noqa: SIM118 - not a mapping
                return True
    return False


class RewardModel:
    """Batched TRL-style reward: one float per (prompt, completion) from a reward model."""

    def __init__(self, source: str, batch_size: int = 32):
        self.source = source
        self.batch_size = batch_size
        self.path, self.template, self.revision = self._resolve(source)
        self._model: Any = None
        self._tokenizer: Any = None

    @staticmethod
    def _resolve(source: str) -> tuple[str, str | None, str | None]:
        local = Path(source).expanduser()
        if local.is_dir():
            if not (local / "config.json").is_file():
                raise ConfigError(f"reward model {source}: not a model directory (no config.json)")
            if not _has_score_head(local):
                raise ConfigError(
                    f"reward model {source}: no `{HEAD}` in its safetensors weights; give a sequence-"
                    "classification model with a trained score head (e.g. a PPO stage's value_model)"
                )
            meta = local / "gym_model.json"
            template = json.loads(meta.read_text()).get("template") if meta.is_file() else None
            return str(local.resolve()), template, None
        from gym.models import resolve

        ref = resolve(source)  # a registry name or hub id (offline: must be in the HF cache)
        if Path(ref.path).is_dir() and not _has_score_head(Path(ref.path)):
            raise ConfigError(f"reward model {source}: the model at {ref.path} has no `{HEAD}` head")
        return ref.path, ref.template, ref.revision

    def _load(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from gym.templates import load_template

        tok = AutoTokenizer.from_pretrained(self.path, revision=self.revision)
        if self.template:
            tok.chat_template = load_template(self.template)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForSequenceClassification.from_pretrained(
            self.path, revision=self.revision, num_labels=1, use_safetensors=True, trust_remote_code=False
        )
        model.config.pad_token_id = tok.pad_token_id  # the score is read at the last non-pad token
        self._tokenizer, self._model = tok, model.eval()

    def texts(self, prompts: list[Any], completions: list[Any]) -> list[str]:
        """Prompt + completion rendered as one conversation with the reward model's template."""
        if self._tokenizer is None:
            self._load()
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
            conversation = [*messages, {"role": "assistant", "content": completion_text(completion)}]
            out.append(self._tokenizer.apply_chat_template(conversation, tokenize=False))
        return out

    def __call__(self, prompts: list[Any], completions: list[Any], **_: Any) -> list[float]:
        import torch

        texts = self.texts(list(prompts), list(completions))
        scores: list[float] = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = self._tokenizer(
                    texts[i : i + self.batch_size],
                    return_tensors="pt",
                    padding=True,
                    padding_side="right",
                    add_special_tokens=False,
                ).to(self._model.device)
                scores += self._model(**batch).logits[:, 0].float().tolist()
        return scores
