"""The papers' API model adapter: black-box chat models (OpenAI, DeepSeek, vLLM, SGLang, Ollama,
gym serve) as the policy or the optimizer of Training-Free GRPO, which needs no gradients.

    from gym.train.grpo.api_model_adapter import APIModelAdapter
    deepseek = APIModelAdapter.deepseek("deepseek-chat")          # key from $DEEPSEEK_API_KEY
    local = APIModelAdapter("gym-tiny", base_url="http://127.0.0.1:8000/v1")
    local.generate("What is 2+2?")

It is gym.tfgrpo.clients.OpenAIClient (retries with backoff, timeouts, per-endpoint concurrency)
plus a one-call `generate`; the API key is read from an environment variable, never passed in.
"""

from __future__ import annotations

from gym.tfgrpo.clients import Messages, OpenAIClient

PRESETS = {
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "deepseek": ("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
}


class APIModelAdapter(OpenAIClient):
    def __init__(
        self,
        model: str,
        base_url: str = PRESETS["openai"][0],
        *,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.7,
        max_tokens: int = 1024,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        concurrency: int = 8,
        max_n: int = 1,
    ) -> None:
        super().__init__(
            base_url,
            model,
            api_key_env=api_key_env,
            timeout_s=timeout_s,
            max_retries=max_retries,
            concurrency=concurrency,
            max_n=max_n,
        )
        self.temperature, self.max_tokens = temperature, max_tokens

    @classmethod
    def openai(cls, model: str = "gpt-4o-mini", **kwargs: object) -> APIModelAdapter:
        base_url, key = PRESETS["openai"]
        return cls(model, base_url, api_key_env=key, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def deepseek(cls, model: str = "deepseek-chat", **kwargs: object) -> APIModelAdapter:
        base_url, key = PRESETS["deepseek"]
        return cls(model, base_url, api_key_env=key, **kwargs)  # type: ignore[arg-type]

    def generate(self, prompt: str | Messages, *, seed: int = 0, system: str | None = None) -> str:
        """One reply to a prompt (or chat messages)."""
        messages: Messages = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        )
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        done = self.complete(messages, temperature=self.temperature, max_tokens=self.max_tokens, seed=seed)
        return done.texts[0]
