"""Models for serving, export and registry tests.

`noisy_tiny` is gym-tiny with every weight perturbed by seeded noise: fresh gym-tiny answers every
prompt greedily with the same run of newlines, which would make "the served text equals direct
generate" true for the wrong reason; the noisy copy answers each prompt differently. Its folder has
no gym metadata, so serving it also exercises the tokenizer's own chat template.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gym.models import resolve

NOISE_STD = 0.1


def noisy_tiny(out: Path, seed: int = 0, std: float = NOISE_STD) -> Path:
    """Write gym-tiny with seeded Gaussian noise added to its weights into `out` (tokenizer included)."""
    import torch
    from transformers import AutoModelForCausalLM

    base = Path(resolve("gym-tiny").path)
    shutil.copytree(base, out, dirs_exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * std)
    model.save_pretrained(out)
    return out


# Debian's chromium, for the Gradio pages (playwright drives it headless)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def module_noisy_tiny(factory: Any) -> Path:
    """`noisy_tiny` for a module's fixtures (`tmp_path_factory`), built in a workspace of its own."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GYM_HOME", str(factory.mktemp("home")))
        return noisy_tiny(factory.mktemp("model") / "noisy")
