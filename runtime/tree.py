"""Tree drafts (docs/algorithms.md 1.4, tree attention): nodes in BFS order under a root = the last committed token.

Indexing: node 0 is the root (already committed, fed as the first input of the step); nodes 1..n are the draft
tokens. `parents[i - 1]` is the parent of node i (0..i-1, so BFS order makes every parent precede its children).
The target forward takes [root, *tokens] with `mask()` as tree mask and returns one row of p per node.

Example (n = 4):            root(0)
                            /     \\
                         a(1)     b(2)          tokens  = [a, b, c, d]
                         /  \\                   parents = [0, 0, 1, 1]
                      c(3)  d(4)                depths  = [0, 1, 1, 2, 2]     path_to(4) = (1, 4)
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .types import Mask, Probs, Tokens


@dataclass(frozen=True)
class TreeDraft:
    """A draft tree; q[j] (model drafters) is the distribution node j's children were drawn from (j = 0..n, the
    root included), `with_replacement` says how (SpecInfer: i.i.d.; RSD: without replacement). q None: a
    deterministic drafter (token recycling, n-gram), verified by the 1.2 tree rule."""

    tokens: Tokens  # [n] int32, nodes 1..n
    parents: np.ndarray  # [n] int, parents[i-1] in 0..i-1
    q: Probs | None = None  # [n+1, V] float64: the children of node j were drawn from q[j]
    with_replacement: bool = False
    kind: int = 0  # the drafter's label for how it made this tree (runtime/draft_length)

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, dtype=np.int32).reshape(-1)
        parents = np.asarray(self.parents, dtype=np.int64).reshape(-1)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        n = len(tokens)
        if len(parents) != n:
            raise ValueError(f"a tree needs one parent per node: {n} tokens but {len(parents)} parents")
        if n and ((parents < 0).any() or (parents >= np.arange(1, n + 1)).any()):
            raise ValueError(f"parents {parents.tolist()} are not in BFS order: node i's parent must be in 0..i-1; "
                             "number the nodes breadth-first with the root as 0")
        if n and (np.diff(self.depths()[1:]) < 0).any():
            raise ValueError(f"parents {parents.tolist()} are not in BFS order: depths must not decrease")
        for j in range(n + 1 if not self.with_replacement else 0):  # without replacement siblings differ
            kids = tokens[parents == j]
            if len(set(kids.tolist())) != len(kids):
                raise ValueError(f"node {j} has repeated children {kids.tolist()}; a tree drawn without replacement "
                                 "needs distinct siblings (use with_replacement=True for SpecInfer-style drafts)")
        if self.q is not None and (self.q.ndim != 2 or self.q.shape[0] != n + 1):
            raise ValueError(f"tree q has shape {self.q.shape}, expected (n+1, V) = ({n + 1}, V): one row per node "
                             "including the root, the distribution its children were drawn from")

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def k(self) -> int:  # the chain name, for statistics: nodes drafted
        return self.n

    def depths(self) -> np.ndarray:
        """[n+1] int64: depth[0] = 0, depth[i] = depth[parent] + 1."""
        return self._depths.copy()

    @cached_property
    def _depths(self) -> np.ndarray:
        d = np.zeros(self.n + 1, dtype=np.int64)
        for i, par in enumerate(self.parents, start=1):
            d[i] = d[par] + 1
        return d

    def mask(self) -> Mask:
        """[n+1, n+1] bool: mask[i, j] = j is i or an ancestor of i (the tree attention mask, root included)."""
        m = np.eye(self.n + 1, dtype=bool)
        for i, par in enumerate(self.parents, start=1):
            m[i] |= m[par]  # parents precede children: the parent's row is complete
        return m

    def children(self, node: int) -> np.ndarray:
        """Node indices of node's children, in the order they were drawn (ascending index)."""
        return np.flatnonzero(self.parents == node) + 1

    def path_to(self, node: int) -> tuple[int, ...]:
        """The nodes from the root's child down to node (root excluded): path_to(0) = ()."""
        if not 0 <= node <= self.n:
            raise ValueError(f"node {node} is not in a tree of {self.n} nodes")
        path = []
        while node:
            path.append(node)
            node = int(self.parents[node - 1])
        return tuple(reversed(path))
