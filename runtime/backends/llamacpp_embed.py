"""A GGUF generation model's embedding mode through llama.cpp (llama-cpp-python): text -> one normalised vector.

A second llama.cpp context on the same file with `embeddings` on and MEAN pooling (the hidden states after the
final norm, averaged over the text's tokens; llama.cpp's own `--pooling mean`), each vector L2-normalised, as
llama-server returns for `/v1/embeddings` with `--embedding --pooling mean`. Texts longer than the context are
refused, not cut. Loaded on first use, beside the generating context (the weights are mmapped once by the OS).
"""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Sequence

import numpy as np

from ..cores import default_threads


class LlamaCppEmbedder:
    """`embed(texts)` -> float32 [n, n_embd], rows L2-normalised; `count_tokens(texts)`."""

    pooling = "mean"

    def __init__(self, path: str | Path, *, n_ctx: int = 2048, n_threads: int | None = None) -> None:
        try:
            import llama_cpp
        except ImportError:
            raise ImportError("embeddings from a GGUF model need llama-cpp-python: pip install 'specedge[llama]'") \
                from None
        with contextlib.redirect_stderr(io.StringIO()):
            self.llm = llama_cpp.Llama(model_path=str(path), embedding=True, n_ctx=n_ctx, n_batch=n_ctx,
                                       n_ubatch=n_ctx, n_threads=default_threads(n_threads),
                                       pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
        self.n_ctx, self.dim, self.name = n_ctx, self.llm.n_embd(), Path(path).name

    def weight_bytes(self) -> int:
        return 0  # the generating engine's file: counted once, by the engine

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(self.llm.tokenize(t.encode(), add_bos=True, special=False)) for t in texts]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        for i, n in enumerate(self.count_tokens(texts)):
            if n > self.n_ctx:
                raise ValueError(f"input[{i}] is {n} tokens; the embedding context holds {self.n_ctx}: shorten it")
        out = []
        for t in texts:  # one sequence per call: llama-cpp-python's batched embed packs sequences per n_batch
            v = np.asarray(self.llm.embed(t, normalize=False, truncate=False), np.float32).reshape(-1)
            out.append(v / max(float(np.linalg.norm(v)), 1e-12))
        return np.stack(out)
