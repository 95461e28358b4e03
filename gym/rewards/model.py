"""Reward models: a sequence-classification model with one output (a `score` head) scores each
prompt + completion, rendered as a conversation with the reward model's own chat template.

    from gym.rewards.model import RewardModel
    rm = RewardModel("path/to/reward-model")       # or a registry name, or a hub id
    rm(prompts=[[{"role": "user", "content": "2+2?"}]], completions=[[{"role": "assistant", "content": "4"}]])

SOURCE may be a registry entry (its template comes from the registry), a local directory (a gym
model carries its template in gym_model.json; others use the tokenizer's own chat template), or a
hub id `owner/name` (its tokenizer's own chat template; offline, it must be in the Hugging Face
cache). A gym model with a trained value/score head, such as the value model a PPO stage saves
(`<stage>/value_model`), works as a reward model. Weights load on first use, from safetensors
only (a folder or cached hub model holding pickles only is refused first), without remote code
unless `trust_remote_code` is asked for. A model without a trained score head is refused, whatever
the source: a folder or cached snapshot whose safetensors have no `score` head and whose config is
no sequence-classification model before anything loads, and any model that transformers reports a
newly initialised head for when it loads (a randomly initialised head would hand out random rewards).
A tokenizer with no chat template, where gym names none either, is refused too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gym.errors import ConfigError
from gym.rewards.base import completion_text

HEAD = "score.weight"
# Where a tokenizer keeps its own chat template (transformers 5 writes chat_template.jinja).
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _has_score_head(directory: Path) -> bool:
    """Whether the folder's safetensors hold a `score` head, or its config is a sequence-classification
    model (its head may have another name, e.g. BERT's and DeBERTa's `classifier`: loading checks it)."""
    from safetensors import safe_open

    from gym.models import is_reward_model

    files = sorted(directory.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            if any(k == HEAD or k.endswith("." + HEAD) for k in st.keys()):  # noqa: SIM118 - not a mapping
                return True
    return is_reward_model(directory)


def _has_chat_template(directory: Path) -> bool | None:
    """Whether the tokenizer in `directory` has a chat template of its own (None: no tokenizer config
    there to tell, e.g. a hub snapshot not fully downloaded)."""
    if any((directory / name).is_file() for name in TEMPLATE_FILES):
        return True
    if (directory / "additional_chat_templates").is_dir():
        return True
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    return bool(json.loads(config.read_text()).get("chat_template"))


def _no_head(source: str, where: str) -> ConfigError:
    return ConfigError(
        f"reward model {source}: no `{HEAD}` in its safetensors weights{where}; give a sequence-"
        "classification model with a trained score head (e.g. a PPO stage's value_model)"
    )


def _no_template(source: str) -> ConfigError:
    return ConfigError(
        f"reward model {source}: its tokenizer has no chat template to render the prompt and completion "
        "with; give a reward model whose tokenizer has one, or a gym model folder (gym_model.json names "
        "its template)"
    )


def _check_folder(source: str, folder: Path, template: str | None, snapshot: bool = False) -> None:
    """What can be told of a reward model from its folder (or cached hub snapshot) before it loads:
    safetensors weights, a score head, a chat template. A snapshot may hold only some files (the rest
    downloads when it loads, and is checked then)."""
    from gym.models import require_safetensors

    require_safetensors(folder, "reward model")
    weights = not snapshot or any(folder.glob("*.safetensors"))  # a snapshot's may download later
    if weights and not _has_score_head(folder):
        raise _no_head(source, f" ({folder})" if str(folder) != source else "")
    if template is None and _has_chat_template(folder) is False:
        raise _no_template(source)


def _cached_snapshot(hub_id: str, revision: str | None) -> Path | None:
    """The Hugging Face cache's snapshot folder of `hub_id` at `revision`, None if it is not cached."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(hub_id, "config.json", revision=revision)
    return Path(cached).parent if isinstance(cached, str) else None


class RewardModel:
    """Batched TRL-style reward: one float per (prompt, completion) from a reward model."""

    def __init__(self, source: str, batch_size: int = 32, trust_remote_code: bool = False):
        self.source = source
        self.batch_size = batch_size
        self.trust_remote_code = trust_remote_code  # run the model repo's own Python code: only if asked
        self.path, self.template, self.revision = self._resolve(source)
        self._model: Any = None
        self._tokenizer: Any = None

    @staticmethod
    def _resolve(source: str) -> tuple[str, str | None, str | None]:
        from gym import secrets
        from gym.models import check_reachable, path_like, registry_entry, resolve

        if "://" in source:  # a URL (its login, if any, never echoed): no source from_pretrained reads
            raise ConfigError(
                f"reward model {secrets.strip_url(source)}: a URL is not a model source; give a registry "
                "name, a hub id (owner/name) or a local folder"
            )
        local = Path(source).expanduser()
        if local.is_dir():
            if not (local / "config.json").is_file():
                raise ConfigError(f"reward model {source}: not a model directory (no config.json)")
            meta = local / "gym_model.json"
            template = json.loads(meta.read_text()).get("template") if meta.is_file() else None
            _check_folder(source, local, template)
            return str(local.resolve()), template, None
        own: str | None  # the template gym names (None: the tokenizer's own)
        revision: str | None
        if registry_entry(source) is None and "/" in source and not path_like(source):
            # any other hub id `owner/name`: its tokenizer's own chat template (gym names none)
            check_reachable(source, "main")  # offline: must be in the HF cache, said clearly
            path, own, revision = source, None, "main"
        else:
            ref = resolve(source)  # a registry name or MLflow version (offline: must be in the HF cache)
            path, own, revision = ref.path, ref.template, ref.revision
        folder = Path(path) if Path(path).is_dir() else _cached_snapshot(path, revision)
        if folder is not None:
            _check_folder(source, folder, own, snapshot=not Path(path).is_dir())
        return path, own, revision

    def _load(self) -> None:
        from gym.templates import load_template

        with self._own_code():
            tok, (model, info) = self._from_pretrained()
        if self.template:
            tok.chat_template = load_template(self.template)
        if not tok.chat_template:
            raise _no_template(self.source)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        backbone = f"{model.base_model_prefix}."
        new_head = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(backbone))
        if new_head:  # transformers initialised the head at random: random rewards
            raise ConfigError(
                f"reward model {self.source}: no trained score head in its weights (transformers would "
                f"initialise {', '.join(new_head[:3])} at random); give a sequence-classification model "
                f"with a trained score head (e.g. a PPO stage's value_model; `{HEAD}`)"
            )
        model.config.pad_token_id = tok.pad_token_id  # the score is read at the last non-pad token
        self._tokenizer, self._model = tok, model.eval()

    def _from_pretrained(self) -> tuple[Any, Any]:
        """The tokenizer and (model, loading info); remote code runs only if asked for (never prompted)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(
            self.path, revision=self.revision, trust_remote_code=self.trust_remote_code
        )
        loaded = AutoModelForSequenceClassification.from_pretrained(
            self.path,
            revision=self.revision,
            num_labels=1,
            use_safetensors=True,
            trust_remote_code=self.trust_remote_code,
            output_loading_info=True,
        )
        return tok, loaded

    @contextlib.contextmanager
    def _own_code(self) -> Iterator[None]:
        """A model that needs its repository's own Python code, not asked to run it: one line, not
        transformers' ValueError telling to pass an argument no `reward_model:` spec has."""
        try:
            yield
        except ValueError as exc:
            if self.trust_remote_code or "trust_remote_code" not in str(exc):
                raise
            raise ConfigError(
                f"reward model {self.source}: it needs its repository's own Python code (custom code in its "
                "config's auto_map), which gym does not run for a reward model; give a model transformers "
                "supports without it"
            ) from None

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
