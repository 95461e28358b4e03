"""gym-tiny: the embedded default model, built locally from a seed instead of downloaded.

`ensure_tiny(builder, template)` returns a normal Hugging Face model directory (config.json,
model.safetensors, generation_config.json, tokenizer files with the chat template set) under
`$GYM_HOME/models/gym-tiny-<digest>/`, building it on first use. The digest covers the builder
entry from registry/models.json, the shipped tokenizer files and the chat template text, so
the same inputs always name (and, on CPU, produce byte for byte) the same weights.

The directory loads like any hub model, offline and without trust_remote_code:

    AutoModelForCausalLM.from_pretrained(path); AutoTokenizer.from_pretrained(path)

Run: .venv/bin/python -m gym.tiny   (builds with the default builder and prints the path)
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

from filelock import FileLock

from gym import workspace
from gym.errors import ConfigError
from gym.hashing import hash_file, hash_obj
from gym.paths import assets_dir
from gym.templates import load_template

KIND = "gym-tiny"
# Bump when the build procedure changes in a way the inputs do not show (e.g. saved dtype).
BUILD_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


# The registry entry's builder (registry/models.json). Sized by scripts/check_demo_learnable.py: on
# a 2-core CPU it learns the demo tasks (held-out exact match ~0.8) in ~45 s of TRL SFT; deeper or
# wider variants learned no better in the same wall time.
def registry_builder() -> dict[str, Any]:
    """The gym-tiny `builder` entry of registry/models.json (the one source of its config)."""
    from gym.registry import get_model

    builder = get_model(KIND).builder
    if builder is None:
        raise ConfigError(f"registry entry {KIND!r} has no builder")
    return copy.deepcopy(builder)


def tokenizer_dir() -> Path:
    """The shipped tokenizer (built by scripts/build_tiny_tokenizer.py)."""
    return assets_dir() / "gym_tiny"


def tiny_digest(builder: dict, template: str) -> str:
    """Content name of the model that `builder` + tokenizer + `template` produce."""
    return hash_obj(
        {
            "version": BUILD_VERSION,
            "builder": builder,
            "tokenizer": {name: hash_file(tokenizer_dir() / name, 64) for name in TOKENIZER_FILES},
            "template": load_template(template),
        }
    )


def _check_builder(builder: dict) -> tuple[int, dict[str, Any]]:
    if builder.get("kind") != KIND:
        raise ConfigError(f"builder kind must be {KIND!r}, got {builder.get('kind')!r}")
    seed, config = builder.get("seed", 0), builder.get("config")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"builder.seed must be an integer, got {seed!r}")
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConfigError("builder.config must be a dict with a 'model_type' (e.g. 'llama')")
    vocab = json.loads((tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    if config.get("vocab_size", 0) < len(vocab):
        raise ConfigError(
            f"builder.config.vocab_size={config.get('vocab_size')} is smaller than the tokenizer's "
            f"{len(vocab)} tokens; raise it"
        )
    return seed, config


def _build(out: Path, seed: int, config: dict[str, Any], chat_template: str) -> None:
    """Write a freshly initialised model and the tokenizer into `out` (torch's global RNG untouched)."""
    import torch
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    kwargs = dict(config)
    try:  # transformers checks a config when built (heads dividing the width, a known model_type...)
        cfg = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
        cfg.dtype = torch.float32
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:  # no retry helps a mistake
        cause = exc.__cause__ if isinstance(exc, StrictDataclassError) and exc.__cause__ else exc
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise ConfigError(f"builder.config can't build a model ({first}): fix it") from None
    model.generation_config = GenerationConfig(
        eos_token_id=config.get("eos_token_id"),
        pad_token_id=config.get("pad_token_id"),
        bos_token_id=config.get("bos_token_id"),
    )
    model.save_pretrained(out, safe_serialization=True)

    tokenizer = load_shipped_tokenizer()
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)
    workspace.shareable(out)  # mkdtemp's 0700 and safetensors' 0600 would keep others out


def load_shipped_tokenizer() -> Any:
    """The shipped tokenizer, constructed from its two files only.

    Built directly rather than through AutoTokenizer.from_pretrained, which records
    environment-dependent kwargs (is_local, local_files_only) into the saved config.
    """
    from transformers import PreTrainedTokenizerFast

    kwargs = json.loads((tokenizer_dir() / "tokenizer_config.json").read_text(encoding="utf-8"))
    kwargs.pop("tokenizer_class", None)
    return PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_dir() / "tokenizer.json"), **kwargs)


def ensure_tiny(builder: dict | None = None, template: str = "chatml") -> Path:
    """Path of the gym-tiny model dir for `builder` (a registry `builder` entry), building it if absent.

    Safe to call from several processes at once: one builds (under a file lock, into a temp dir
    renamed into place), the others wait and reuse its result.
    """
    builder = registry_builder() if builder is None else builder
    seed, config = _check_builder(builder)
    final = workspace.path("models", f"{KIND}-{tiny_digest(builder, template)}")
    if (final / "model.safetensors").is_file():
        return final
    with FileLock(str(final.with_name(f".{final.name}.lock"))):
        if not (final / "model.safetensors").is_file():
            with workspace.atomic_dir(final) as tmp:
                _build(tmp, seed, config, load_template(template))
    return final


def count_parameters(path: Path) -> int:
    """Number of distinct parameters in a saved model dir (tied weights counted once)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
            total += math.prod(f.get_slice(name).get_shape())
    return total


if __name__ == "__main__":
    p = ensure_tiny()
    print(p, f"{count_parameters(p):,} parameters")
