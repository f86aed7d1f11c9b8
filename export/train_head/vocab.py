"""The draft vocabulary: the Vd target tokens a head can draft, chosen from the answers' token counts.

d2t[i] is the absolute target id of draft id i, ascending (so the map is monotone); t2d is its inverse over the
target's vocabulary, -1 for tokens outside the draft vocabulary (their positions are left out of the loss).
"""
from __future__ import annotations

import numpy as np

DEFAULT_VD = 8192


def draft_vocab(answer_tokens: np.ndarray, vocab_size: int, vd: int = DEFAULT_VD, *,
                always: tuple[int, ...] = ()) -> np.ndarray:
    """d2t int64 [min(vd, vocab_size)]: the most frequent answer tokens (ties: the lower id), the `always` ids
    (end-of-turn) in any case; a vocabulary with fewer distinct answer tokens than vd is filled with unseen ids,
    lowest first."""
    if vd < 1:
        raise ValueError(f"the draft vocabulary needs at least one token, not {vd}")
    tokens = np.asarray(answer_tokens, dtype=np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"answer tokens outside the target's vocabulary of {vocab_size}")
    vd = min(vd, vocab_size)
    counts = np.bincount(tokens, minlength=vocab_size).astype(np.int64)
    boost = np.zeros(vocab_size, np.int64)
    boost[[a for a in always if 0 <= a < vocab_size]] = 1
    order = np.lexsort((np.arange(vocab_size), -counts, -boost))  # last key first: always, then count, then id
    return np.sort(order[:vd])


def target_to_draft(d2t: np.ndarray, vocab_size: int) -> np.ndarray:
    """t2d int64 [vocab_size]: the draft id of each target token, -1 outside the draft vocabulary."""
    t2d = np.full(vocab_size, -1, dtype=np.int64)
    t2d[d2t] = np.arange(len(d2t))
    return t2d
