"""Token Recycling (docs/algorithms.md 2.7; Luo et al. 2024): draft trees from the target's own recent top-k lists.

State: adj [V, 8] int32, adj[t] = the top-8 next tokens the target gave the last time it saw t as an input
(-1: never seen). It is never reset: it carries over between sequences of one drafter object.
Draft: a static tree template filled breadth-first, token[node] = adj[token[parent], rank(node)], root = the last
committed token; nodes whose token is unknown (-1) are dropped with their subtrees.
Update: after every target forward, for every input row (every tree node): adj[token] = top8(logits[row]).
No q: verified by the deterministic tree rule (1.2) or greedily.

Template: best-first by a prior acceptance per sibling rank, so a node's value is the product of its path's priors
and the first n nodes always form a tree. The paper's ~80-node, 6-level template is sized for a GPU where verify
cost hardly depends on width; on a CPU each node costs, so the size is a parameter (TEMPLATE_SIZES).
"""
from __future__ import annotations

import heapq

import numpy as np

from ..sampling import top_rows
from ..tree import TreeDraft
from ..types import Logits, SamplingParams, Tokens
from .base import BackendNeed, DrafterCaps, TreeDrafter

TOP = 8  # successors kept per token
TEMPLATE_SIZES = (8, 16, 32, 80)
# Prior probability that the rank-r successor is the target's next token; only the order of the path products
# matters (which nodes the template keeps). From rank hit rates measured at the root on SmolLM2-135M (4 dev prompts,
# greedy: .36, .08, .03, .01, .03, .03, 0, 0 over 77 rounds), smoothed to be decreasing. Against the first guess
# (.45, .15, .08, ...) tau moved by <= 0.04 at 8-80 nodes on 4 prompts x 48 tokens: within noise.
RANK_PRIOR = (0.36, 0.08, 0.035, 0.025, 0.02, 0.015, 0.01, 0.008)


def tree_template(n_nodes: int, max_depth: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """(parents [n], ranks [n]) of the n best nodes in BFS order (parents index nodes, 0 = root).

    Example: tree_template(4) -> parents [0, 0, 1, 3], ranks [0, 1, 0, 0]: the chain of first choices
    (values .36, .13, .047) plus the root's second choice (.08), sorted breadth-first.
    """
    if n_nodes < 0:
        raise ValueError(f"a tree template needs >= 0 nodes, got {n_nodes}")
    heap = [(-RANK_PRIOR[r], (r,)) for r in range(TOP)]  # (−value, path of ranks from the root)
    chosen: list[tuple[int, ...]] = []
    while heap and len(chosen) < n_nodes:
        negv, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < max_depth:
            for r in range(TOP):
                heapq.heappush(heap, (negv * RANK_PRIOR[r], path + (r,)))
    chosen.sort(key=lambda path: (len(path), path))  # BFS: by depth, then parent order, then rank
    index = {(): 0, **{path: i + 1 for i, path in enumerate(chosen)}}
    parents = np.array([index[path[:-1]] for path in chosen], dtype=np.int64)
    ranks = np.array([path[-1] for path in chosen], dtype=np.int64)
    return parents, ranks


class RecycleDrafter(TreeDrafter):
    """Token Recycling drafter: `propose_tree` / `observe` / `accept` (the tree-drafter side of the Drafter seam)."""

    caps = DrafterCaps(tree=True, observes_logits=True, needs=frozenset({BackendNeed.TREE_MASK}))

    def __init__(self, vocab_size: int, nodes: int = 16) -> None:
        if nodes not in TEMPLATE_SIZES and not 1 <= nodes <= 256:
            raise ValueError(f"recycle template size {nodes} is out of range; use one of {TEMPLATE_SIZES} "
                             "or 1..256 nodes")
        self.name = f"recycle:{nodes}"
        self.max_nodes = nodes
        self.adj = np.full((vocab_size, TOP), -1, dtype=np.int32)  # [V, 8]
        self._parents, self._ranks = tree_template(nodes)

    def begin(self, prompt: Tokens) -> None:
        """Nothing to reset: adj carries over between sequences (the paper's 'never reset')."""

    def propose_tree(self, context: Tokens, max_nodes: int, params: SamplingParams, rng: np.random.Generator
                     ) -> TreeDraft:
        """requires: context = every committed token; returns a tree of <= min(template, max_nodes) nodes (no q:
        params unused)."""
        n = min(self.max_nodes, max_nodes)
        tok = np.full(n + 1, -1, dtype=np.int64)
        tok[0] = int(context[-1])
        for i in range(1, n + 1):  # BFS: the parent is filled before its children
            parent = tok[self._parents[i - 1]]
            if parent >= 0:
                tok[i] = self.adj[parent, self._ranks[i - 1]]
        keep = np.flatnonzero(tok[1:] >= 0) + 1  # a dropped node's children are dropped too (parent -1)
        renumber = np.zeros(n + 1, dtype=np.int64)
        renumber[keep] = np.arange(1, len(keep) + 1)
        return TreeDraft(tok[keep].astype(np.int32), renumber[self._parents[keep - 1]])

    def observe(self, tokens: Tokens, logits: Logits) -> None:
        """After a target forward over tokens [T] with logits [T, V]: adj[token] = its row's top-8, best first."""
        m = min(TOP, logits.shape[1])  # a vocabulary under 8 leaves the last columns unknown (-1)
        self.adj[np.asarray(tokens, dtype=np.int64), :m] = top_rows(np.asarray(logits), m)

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Nothing to do: what the target said is already in adj (observe)."""
