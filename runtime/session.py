"""A KV cache kept across decode calls: each call prefills only the tokens that differ from what the cache holds.

Chat turns and server requests that share a prefix (the system prompt, the conversation so far) reuse its K/V, as
llama.cpp's server does with its slot cache. One Session is one sequence; `decode(..., session=s)` uses it.

Invariant: `cache.length == len(tokens)` between calls; `tokens` are exactly the tokens whose K/V the cache holds.
"""
from __future__ import annotations

import numpy as np

from .backends.base import Backend, Cache
from .types import Tokens, as_tokens

DEFAULT_SESSION_CTX = 4096  # positions a session allocates when neither --ctx nor a smaller model context says


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class Session:
    """One sequence's target KV cache, reused by successive `decode` calls on the same backend.

    capacity: positions held (prompt + generated + draft room); default min(model context, DEFAULT_SESSION_CTX).
    The cache is allocated once; a llama.cpp backend holds one live cache, so a session must be the only user of
    its backend (apps/api.py's Engine serialises calls on one session).
    """

    def __init__(self, target: Backend, capacity: int | None = None) -> None:
        limit = target.config.context_length
        self.capacity = int(capacity or min(limit, DEFAULT_SESSION_CTX))
        if self.capacity > limit:
            raise ValueError(f"a session of {self.capacity} positions exceeds the model's context of {limit}; "
                             f"use --ctx {limit} or less")
        self.target = target
        self.cache: Cache = target.new_cache(self.capacity)
        self.tokens = np.zeros(0, dtype=np.int32)
        self.reused = 0  # prompt tokens the last call did not prefill

    def start(self, prompt: Tokens) -> int:
        """Keep the cached prefix the prompt shares (all but its last token, which the first step feeds) and
        return its length; the caller prefills prompt[kept:-1]."""
        prompt = as_tokens(prompt)
        keep = common_prefix(self.tokens, prompt[:-1])
        self.cache.rollback(keep)
        self.tokens = self.tokens[:keep]
        self.reused = keep
        return keep

    def finish(self, committed: np.ndarray) -> None:
        """Record the committed tokens after a call (ended, stopped or interrupted): the cache keeps the rows of
        committed[:-1] at most, since the last committed token is fed by the next step and never cached."""
        keep = min(self.cache.length, max(len(committed) - 1, 0))
        self.cache.rollback(keep)
        self.tokens = np.array(committed[:keep], dtype=np.int32)

    def reset(self) -> None:
        self.cache.rollback(0)
        self.tokens = np.zeros(0, dtype=np.int32)
