"""Greedy verification: the target's argmax decides (docs/algorithms.md 1.1, greedy mode).

Glossary: accepted = draft tokens kept; recovered = the target's argmax at the first mismatch;
bonus = the target's argmax after the last draft token when all k are accepted.
"""
from __future__ import annotations

import numpy as np

from ..types import Draft, NextKind, Probs, Verdict
from .chain import check_rows


class GreedyVerifier:
    """Accept while x_i == argmax p_i; then emit argmax p at the first mismatch (or after the last: bonus).

    Example: draft [5, 7, 2], argmax of p rows [5, 7, 9, 4]
        -> positions 0, 1 match, 2 does not -> Verdict(n_accepted=2, next_token=9, RECOVERED).
    Draft [5, 7] with argmax rows [5, 7, 4] -> Verdict(2, 4, BONUS). Empty draft, argmax [3] -> Verdict(0, 3, BONUS).
    """

    def verify(self, draft: Draft, p: Probs, rng: np.random.Generator) -> Verdict:
        """p: [k+1, V]; rng is unused (greedy needs no randomness) but kept for the seam."""
        check_rows(draft, p)
        return self.verify_ids(draft, np.argmax(p, axis=1))  # [k+1]; ties -> lowest id

    def verify_ids(self, draft: Draft, top: np.ndarray) -> Verdict:
        """The same verdict from the target's greedy choices top [k+1] (sampling.greedy_ids: no one-hot rows)."""
        if len(top) != draft.k + 1:
            raise ValueError(f"verification needs k+1 = {draft.k + 1} greedy choices (one per input [last, *draft]), "
                             f"got {len(top)}")
        miss = np.flatnonzero(top[:draft.k] != draft.tokens)
        n = int(miss[0]) if len(miss) else draft.k
        kind = NextKind.BONUS if n == draft.k else NextKind.RECOVERED
        return Verdict(n_accepted=n, next_token=int(top[n]), kind=kind)
