"""Chain speculative sampling (docs/algorithms.md 1.1, Leviathan et al. 2023 / Chen et al. 2023) and the
deterministic-drafter rule (1.2). Both leave the emitted tokens distributed exactly as the target p.

Glossary (the names used across the runtime):
    p         target distributions, [k+1, V]: row i is conditioned on [context, x_1..x_i]
    q         draft distributions, [k, V], after the SAME logits processing as p (None: deterministic drafter)
    k         draft length; x_1..x_k the draft tokens
    accepted  draft tokens kept (a prefix of the draft)
    recovered the token sampled from the residual norm((p_i - q_i)+) at the first rejection
    bonus     the token sampled from p_{k+1} when all k draft tokens are accepted
    emitted = accepted + one (recovered or bonus): every verify yields >= 1 token.
All arithmetic is float64.
"""
from __future__ import annotations

import numpy as np

from ..sampling import sample
from ..types import Draft, NextKind, Probs, Verdict

# A residual with less mass than this is float64 noise: p and q agree, so fall back to p (docs/algorithms.md 1.1).
_RESIDUAL_EPS = 1e-12


def check_rows(draft: Draft, p: Probs) -> None:
    if p.ndim != 2 or p.shape[0] != draft.k + 1:
        raise ValueError(f"verification needs k+1 = {draft.k + 1} rows of p (one per input [last, *draft]), "
                         f"got p of shape {p.shape}")
    if draft.q is not None and draft.q.shape != (draft.k, p.shape[1]):
        raise ValueError(f"draft q has shape {draft.q.shape}, expected (k, V) = {(draft.k, p.shape[1])}")


class ChainSpeculativeVerifier:
    """Verify a chain draft against p, exactly preserving the target distribution.

    With q (model drafter), for i = 1..k:
        accept x_i if U < min(1, p_i(x_i) / q_i(x_i)); else emit recovered y ~ norm((p_i - q_i)+) and stop.
    Without q (n-gram / prompt lookup), for i = 1..k:
        y ~ p_i; accept x_i if y == x_i, else emit y as recovered and stop.
    All accepted -> bonus y ~ p_{k+1}. An empty draft (k = 0) just samples the bonus from p_1.

    Example (V = 3, k = 1): p = [[0.5, 0.3, 0.2], [...]], q = [[0.25, 0.75, 0.0]], draft [1]
        accept w.p. min(1, 0.3/0.75) = 0.4; on rejection the residual (p - q)+ = [0.25, 0, 0.2]
        gives recovered 0 w.p. 0.25/0.45 and 2 w.p. 0.2/0.45.
    """

    def verify(self, draft: Draft, p: Probs, rng: np.random.Generator) -> Verdict:
        """p: [k+1, V] target distributions at [last, *draft.tokens]; returns >= 1 emitted token."""
        check_rows(draft, p)  # p is read row by row, up to the first rejection (sampling.ProbRows forms no more)
        if draft.q is None:
            return _verify_deterministic(draft, p, rng)
        q = np.asarray(draft.q, dtype=np.float64)  # [k, V]
        for i, x in enumerate(draft.tokens):
            p_i = np.asarray(p[i], dtype=np.float64)  # [V]
            # U < min(1, p/q)  <=>  U * q < p  (no division; q(x) = 0 accepts iff p(x) > 0)
            if rng.random() * q[i, x] < p_i[x]:
                continue
            residual = np.maximum(p_i - q[i], 0.0)  # [V]
            row = residual if residual.sum() > _RESIDUAL_EPS else p_i
            return Verdict(n_accepted=i, next_token=sample(row, rng), kind=NextKind.RECOVERED)
        return Verdict(n_accepted=draft.k, next_token=sample(np.asarray(p[draft.k], dtype=np.float64), rng),
                       kind=NextKind.BONUS)


def _verify_deterministic(draft: Draft, p: Probs, rng: np.random.Generator) -> Verdict:
    """docs/algorithms.md 1.2: rejection sampling with a one-hot q; y ~ p_i is emitted whether or not it matches."""
    for i, x in enumerate(draft.tokens):
        y = sample(p[i], rng)
        if y != x:
            return Verdict(n_accepted=i, next_token=y, kind=NextKind.RECOVERED)
    return Verdict(n_accepted=draft.k, next_token=sample(p[draft.k], rng), kind=NextKind.BONUS)
