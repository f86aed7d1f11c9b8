"""Block verification (docs/algorithms.md 1.3; Sun et al., ICLR 2025): accept the longest prefix the block as a whole
allows, not token by token. Exact, and never accepts fewer tokens in expectation than chain sampling (1.1).

Glossary as in runtime/verify/chain.py. With p_0 = 1, for i = 1..k:
    p_i = min(1, p_{i-1} p(x_i | X^{i-1}) / q(x_i | X^{i-1}))
    h_i = R_i / (R_i + 1 - p_i) with R_i = sum_x (p_i p(x | X^i) - q(x | X^i))+   (i < k; 0 if 0/0),  h_k = p_k
tau = max{i : eta_i <= h_i} over independent uniforms (0 if none): accept x_1..x_tau; then
    tau < k: recovered y ~ norm((p_tau p(. | X^tau) - q(. | X^tau))+);   tau = k: bonus y ~ p(. | X^k).
Deterministic drafts (q None) use the 1.2 rule; greedy mode is prefix match (GreedyVerifier).
"""
from __future__ import annotations

import numpy as np

from ..sampling import sample
from ..types import Draft, NextKind, Probs, Verdict
from .chain import _RESIDUAL_EPS, _verify_deterministic, check_rows


def block_weights(p: Probs, q: Probs, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pk [k+1] with pk[0] = 1, h [k+1] with h[0] unused) for draft x [k], p [k+1, V], q [k, V] (float64)."""
    k = len(x)
    pk, h = np.ones(k + 1), np.zeros(k + 1)
    for i in range(1, k + 1):
        px, qx = p[i - 1, x[i - 1]], q[i - 1, x[i - 1]]
        ratio = px / qx if qx > 0 else (np.inf if px > 0 else 0.0)
        pk[i] = min(1.0, pk[i - 1] * ratio)
        if i < k:
            r = np.maximum(pk[i] * p[i] - q[i], 0.0).sum()
            den = r + 1.0 - pk[i]
            h[i] = r / den if den > 0 else 0.0
        else:
            h[i] = pk[i]
    return pk, h


def block_residual(pk_tau: float, p_row: np.ndarray, q_row: np.ndarray) -> np.ndarray:
    """The (unnormalised) distribution of the recovered token after accepting tau < k tokens."""
    res = np.maximum(pk_tau * p_row - q_row, 0.0)
    return res if res.sum() > _RESIDUAL_EPS else p_row


class BlockVerifier:
    """Verify a chain draft with block verification; same seam as ChainSpeculativeVerifier."""

    def verify(self, draft: Draft, p: Probs, rng: np.random.Generator) -> Verdict:
        """p: [k+1, V] target distributions at [last, *draft.tokens]; returns >= 1 emitted token."""
        check_rows(draft, p)
        if draft.q is None:  # row by row, as the chain rule reads them
            return _verify_deterministic(draft, p, rng)
        p = np.asarray(p, dtype=np.float64)  # block weights read every row
        q, k = np.asarray(draft.q, dtype=np.float64), draft.k
        if k == 0:
            return Verdict(0, sample(p[0], rng), NextKind.BONUS)
        pk, h = block_weights(p, q, draft.tokens)
        eta = np.array([rng.random() for _ in range(k)])  # scan all: tau is the LAST i with eta_i <= h_i
        hits = np.flatnonzero(eta <= h[1:])
        tau = int(hits[-1]) + 1 if len(hits) else 0
        if tau == k:
            return Verdict(k, sample(p[k], rng), NextKind.BONUS)
        return Verdict(tau, sample(block_residual(pk[tau], p[tau], q[tau]), rng), NextKind.RECOVERED)
