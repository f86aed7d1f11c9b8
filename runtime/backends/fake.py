"""Test doubles shipped with the package (Gemma `gm.text` habit): a first-order Markov "model".

The next-token logits depend only on the current token, logits = table[token], so exact sequence
probabilities are products of table rows: a ground truth for losslessness tests of the decode loop.
"""
from __future__ import annotations

import numpy as np

from ...models.config import ModelConfig
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, check_room


class FakeCache(LengthCursor):
    """Holds the fed tokens; rollback is setting the length (the position is the only cursor)."""

    def __init__(self, capacity: int) -> None:
        self.tokens_buf = np.zeros(capacity, dtype=np.int32)  # [capacity]
        self._length = 0

    @property
    def capacity(self) -> int:
        return len(self.tokens_buf)

    @property
    def tokens(self) -> Tokens:
        return self.tokens_buf[:self._length]

    def append(self, tokens: Tokens) -> None:
        check_room(self, len(tokens))
        self.tokens_buf[self._length:self._length + len(tokens)] = tokens
        self._length += len(tokens)


class MarkovBackend:
    """Backend whose logits row for token t is table[t].

    table: [V, V] float32 logits, table[a, b] = logit of b following a.
    Example: table = log([[0.9, 0.1], [0.5, 0.5]]); forward([0, 1]) -> [table[0], table[1]];
        P(0 -> 1 -> 1) under plain sampling = 0.1 * 0.5.
    """

    caps = BackendCaps()

    def __init__(self, table: np.ndarray, name: str = "markov", *, context_length: int = 4096) -> None:
        table = np.asarray(table, dtype=np.float32)
        if table.ndim != 2 or table.shape[0] != table.shape[1]:
            raise ValueError(f"a Markov table must be [V, V] logits, got shape {table.shape}")
        self.table = table
        self.table.setflags(write=False)
        self.name = name
        V = table.shape[0]
        self.config = ModelConfig(arch="markov", n_layers=1, d_model=8, n_heads=1, n_kv_heads=1, head_dim=8, d_ff=16,
                                  vocab_size=V, rms_eps=1e-6, rope_theta=10000.0, context_length=context_length,
                                  tied_embeddings=True, name=name)
        self.n_forwards = 0  # target calls made, for tests of the decode loop

    def new_cache(self, max_len: int) -> FakeCache:
        return FakeCache(max_len)

    def forward(self, tokens: Tokens, cache: FakeCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """Appends tokens to the cache; returns float32 [T, V] = table[tokens]."""
        if tree_mask is not None or plan is not None:
            raise ValueError("MarkovBackend supports neither tree masks nor layer plans (caps are all off)")
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        cache.append(tokens)
        self.n_forwards += 1
        return self.table[tokens].copy()

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        return int(self.table.nbytes)


def random_markov_table(vocab_size: int, seed: int = 0, scale: float = 2.0) -> np.ndarray:
    """A seeded random [V, V] float32 logits table (standard normal * scale)."""
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal((vocab_size, vocab_size))).astype(np.float32)
