"""Optional serving backends: vLLM and SGLang serve the same model when they are installed (GPU).

`gym serve --backend vllm|sglang` resolves the model like gym's own engine (registry name, model
directory or MLflow URI; the same chat template, written to a file) and hands the process over to
the backend's OpenAI-compatible server. Where the backend is missing it fails before any work,
saying what to install. Neither backend injects a TF-GRPO experience library, so a model that
ships one is refused rather than served without it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from gym import workspace
from gym.errors import ConfigError, MissingExtraError
from gym.hashing import hash_obj
from gym.serve.settings import ServeSettings

BACKENDS = {
    "vllm": ("vllm", "pip install vllm (needs a CUDA GPU)"),
    "sglang": ("sglang", 'pip install "sglang[all]" (needs a CUDA GPU)'),
}


def require(backend: str) -> None:
    module, how = BACKENDS[backend]
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"--backend {backend} needs the {module} package, which is not installed: {how}"
        )


def command(settings: ServeSettings, template_file: str, model_path: str) -> list[str]:
    """The backend's server command line (the API key travels in the environment, never in argv)."""
    name = settings.served_model_name or settings.model
    common = ["--host", settings.host, "--port", str(settings.port)]
    if settings.backend == "vllm":
        server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
        return [*server, "--served-model-name", name, "--chat-template", template_file, *common]
    server = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path]
    return [*server, "--served-model-name", name, "--chat-template", template_file, *common]


def exec_backend(settings: ServeSettings, api_key: str | None) -> int:
    """Replace this process with the backend's server (it handles signals itself)."""
    if api_key is not None and settings.backend == "sglang":
        raise ConfigError(
            "--backend sglang takes its API key only as a command-line flag, which every user of this "
            "machine can read (ps): serve with --backend vllm or transformers to require a key, or put an "
            "authenticating proxy in front of SGLang"
        )
    require(settings.backend)
    from gym.serve.loading import resolve_served

    served = resolve_served(settings.model, settings.template, settings.trust_remote_code, settings.system)
    if served.experiences:
        raise ConfigError(
            f"{settings.model} ships a TF-GRPO experience library that {settings.backend} would not inject "
            "into prompts: serve it with --backend transformers"
        )
    template_file = workspace.path("runs", f"chat-template-{hash_obj(served.chat_template)}.jinja")
    workspace.atomic_write_text(template_file, served.chat_template)
    argv = command(settings, str(template_file), served.path)
    env = dict(os.environ)
    if api_key is not None:
        env["VLLM_API_KEY"] = api_key  # vLLM reads it from here
    os.execvpe(argv[0], argv, env)
    return 0  # not reached
