"""Tree verification (docs/algorithms.md 1.2 tree rule, 1.4): walk down the draft tree from the root, keep one path.

Glossary (as for chains, runtime/verify/chain.py): p = target distributions, one row per node ([n+1, V], row j
conditioned on the root path to node j); q[j] = the draft distribution node j's children were drawn from;
accepted = the kept path's nodes; recovered = the token sampled when no child of the last kept node is accepted;
bonus = the token sampled at an accepted leaf. Every verify emits >= 1 token. Arithmetic is float64.

Three rules, one walk:
    greedy         descend into the child equal to argmax p[node]; emit argmax p at the last accepted node
    deterministic  (q None, 1.2) y ~ p[node]; descend if y is a child, else emit y
    recursive      (q given, 1.4) children x_1..x_m in drawing order: accept x_i w.p. min(1, p_i(x_i) / q_i(x_i));
                   else p_{i+1} = norm((p_i - q_i)+), q_{i+1} = q_i with x_i zeroed (RSD, without replacement)
                   or q_i (SpecInfer, with replacement); all rejected -> y ~ p_{m+1}
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sampling import sample
from ..tree import TreeDraft
from ..types import NextKind, Probs
from .chain import _RESIDUAL_EPS


@dataclass(frozen=True)
class TreeVerdict:
    path: tuple[int, ...]  # accepted node indices (1..n), root's child first; () if none
    next_token: int  # bonus (at a leaf) or recovered
    kind: NextKind

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def verify_tree(tree: TreeDraft, p: Probs, rng: np.random.Generator, *, greedy: bool) -> TreeVerdict:
    """p: [n+1, V] target distributions at [root, *tree.tokens]; returns the accepted path and the next token.

    Example (greedy): tokens [5, 7, 2], parents [0, 0, 1], argmax rows [7, 2, 9, 4]
        root: argmax 7 = node 2's token -> descend to 2; node 2 has no children -> bonus argmax p[2] = 9
        -> TreeVerdict(path=(2,), next_token=9, BONUS).
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] != tree.n + 1:
        raise ValueError(f"tree verification needs n+1 = {tree.n + 1} rows of p (one per input [root, *nodes]), "
                         f"got p of shape {p.shape}")
    step = _greedy_step if greedy else _sampled_step if tree.q is None else _recursive_step
    path, node = [], 0
    while True:
        kids = tree.children(node)
        child, token = step(tree, p, node, kids, rng)
        if child is None:
            kind = NextKind.BONUS if len(kids) == 0 else NextKind.RECOVERED
            return TreeVerdict(tuple(path), int(token), kind)
        path.append(child)
        node = child


def _greedy_step(tree, p, node, kids, rng):
    top = int(np.argmax(p[node]))
    hit = kids[tree.tokens[kids - 1] == top]
    return (int(hit[0]), None) if len(hit) else (None, top)


def _sampled_step(tree, p, node, kids, rng):
    """1.2: rejection sampling with one-hot q; y ~ p[node] is emitted when it is not a child."""
    y = sample(p[node], rng)
    hit = kids[tree.tokens[kids - 1] == y]
    return (int(hit[0]), None) if len(hit) else (None, y)


def _recursive_step(tree, p, node, kids, rng):
    """1.4: recursive rejection sampling over the children in drawing order."""
    pr, qr = p[node].copy(), np.asarray(tree.q[node], dtype=np.float64).copy()
    for c in kids:
        x = int(tree.tokens[c - 1])
        if rng.random() * qr[x] < pr[x]:  # U < min(1, p/q) without division
            return int(c), None
        residual = np.maximum(pr - qr, 0.0)
        if residual.sum() > _RESIDUAL_EPS:
            pr = residual / residual.sum()
        if not tree.with_replacement:
            qr[x] = 0.0
            if qr.sum() > 0:
                qr /= qr.sum()
    return None, sample(pr, rng)
