"""Timing one target forward (the verify-cost curve T(n) of perf/verify_cost.py and the device profile)."""
from __future__ import annotations

import time

import numpy as np

def heap_tree_mask(n: int, fanout: int) -> np.ndarray:
    """Ancestor-or-self mask [n, n] of the tree where node i's parent is (i - 1) // fanout (BFS order)."""
    mask = np.eye(n, dtype=bool)
    for i in range(1, n):
        mask[i] |= mask[(i - 1) // fanout]
    return mask


def time_forward(backend, cache, n: int, rng: np.random.Generator, clock=time.perf_counter,
                 tree_fanout: int | None = None) -> float:
    base = cache.length
    toks = rng.integers(0, backend.config.vocab_size, n).astype(np.int32)
    mask = None if tree_fanout is None else heap_tree_mask(n, tree_fanout)
    t0 = clock()
    backend.forward(toks, cache, tree_mask=mask)
    dt = clock() - t0
    cache.rollback(base)
    return dt
