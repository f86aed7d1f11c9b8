"""Prompt lookup / n-gram drafter (docs/algorithms.md 2.6): copy what followed the latest earlier occurrence
of the context's last n tokens. No model, no q: verified by the deterministic-drafter rule (1.2).
"""
from __future__ import annotations

import numpy as np

from ..types import Draft, SamplingParams, Tokens
from .base import Drafter


class NgramDrafter(Drafter):
    """Propose the tokens that followed the latest earlier occurrence of the context's suffix.

    For n = max_n .. min_n: take the last n tokens of the context; find their latest occurrence that
    ends before the final position; propose the (up to) k tokens that followed it. The first n with a
    match wins; no match at any n gives an empty draft.

    Example (max_n = 3, min_n = 1, k = 3):
        context  = [1, 2, 3, 4, 1, 2, 3, 9, 2, 3]      (positions 0..9)
        n = 3: suffix [9, 2, 3] has no earlier occurrence
        n = 2: suffix [2, 3] occurs at 1..2 and 5..6; the latest ends at 7
        -> propose context[7:10] = [9, 2, 3]
    Near the end fewer than k tokens may follow: context [5, 6, 5] -> n=1 [5] ends at 1 -> [6, 5].

    Cost: a hash index {n-gram tuple: end of its latest occurrence} is built in `begin` and extended
    with the newly appended tokens at each `propose`, so a step costs O(new tokens * n), not O(context).
    If the context is not an extension of the indexed one (a new sequence without `begin`), it is rebuilt.
    """

    name = "ngram"
    weight_bytes_per_token = 0

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self._buf = np.zeros(0, dtype=np.int32)  # [capacity] the indexed context is _buf[:_n]
        self._n = 0
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest occurrence

    def begin(self, prompt: Tokens) -> None:
        self._n, self._index = 0, {}
        self._extend(np.asarray(prompt).reshape(-1))

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """requires: context = every committed token; returns a Draft of 0..k tokens, q = None (params unused)."""
        context = np.asarray(context).reshape(-1)
        m = self._n
        if len(context) < m or not np.array_equal(context[:m], self._buf[:m]):
            self.begin(context)
        else:
            self._extend(context[m:])
        return self._match(self._buf[:len(context)], k)

    def continuation(self, tail: Tokens, k: int) -> Draft:
        """The draft `propose` would make for a context ending in `tail` (which may run past the committed context,
        e.g. into a model's draft), from the committed context's index only; nothing is indexed or changed.
        requires: the last propose saw the committed context."""
        return self._match(np.asarray(tail, dtype=np.int32).reshape(-1), k)

    def _match(self, suffix: np.ndarray, k: int) -> Draft:
        """Longest n in max_n..min_n whose last-n tokens of `suffix` are indexed: the <= k committed tokens after
        their latest occurrence."""
        L = len(suffix)
        if k > 0:
            for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
                end = self._index.get(tuple(suffix[L - n:L].tolist()))
                if end is not None:
                    return Draft(tokens=self._buf[end:min(end + k, self._n)].copy(), q=None, kind=n)
        return Draft(tokens=np.zeros(0, dtype=np.int32), q=None)

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Nothing to do: the committed tokens reach the index through the next `propose`'s context."""

    def _extend(self, new: np.ndarray) -> None:
        """Append tokens; index every n-gram that now ends before the final position.

        An n-gram ending at e (exclusive) is indexed once token e exists: it has a follower to propose,
        and the current suffix never matches itself.
        """
        m, L = self._n, self._n + len(new)
        if L > len(self._buf):  # grow x2: appends are amortised O(1)
            self._buf = np.concatenate([self._buf[:m], np.zeros(max(L, 2 * len(self._buf), 256) - m, np.int32)])
        self._buf[m:L] = new
        self._n = L
        lo = max(m, 1) - self.max_n  # ends < max(m, 1) were indexed before; keep max_n tokens of left context
        window = self._buf[max(lo, 0):L].tolist()
        off = max(lo, 0)
        for end in range(max(m, 1), L):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._index[tuple(window[end - n - off:end - off])] = end
