"""Dynamic draft trees from a draft model (docs/algorithms.md 3, DySpec-style best-first expansion).

A node's value is the product of the draft model's probabilities along its path from the root (the last committed
token). Candidates live in a heap keyed by that value; each wave makes the `wave` best candidates nodes, then one
draft forward over [root, every node so far] with the tree mask gives the new nodes' distributions, whose top
`branch` continuations join the heap. It stops at the node budget (or `max_depth`). The tree grows wide where the
draft model hesitates and deep where it is sure, at the cost of one draft forward per wave, not per node.

Verification: the tree is a deterministic function of the context (top choices, no draws), so it is verified by
the deterministic-drafter tree rule (1.2) under sampling and greedily under greedy decoding: lossless either way.
The draft cache (ModelDrafter.root_logits / tree_logits): it holds the context after the root's logits; each wave
feeds the root and the whole tree again (the Backend contract's tree mask covers only new tokens, so nodes of an
earlier wave cannot stay cached without their siblings seeing each other) and leaves it holding the context.
"""
from __future__ import annotations

import heapq

import numpy as np

from ..tree import TreeDraft
from ..types import Logits, SamplingParams, Tokens
from .base import BackendNeed, DrafterCaps, TreeDrafter
from .model import ModelDrafter


class DynamicTreeDrafter(TreeDrafter):
    """`propose_tree` / `accept` (the tree-drafter side of the Drafter seam) over a ModelDrafter's backend."""

    caps = DrafterCaps(tree=True, pays_per_token=True, needs=frozenset({BackendNeed.TREE_MASK}))

    def __init__(self, model: ModelDrafter, nodes: int = 16, *, wave: int = 4, branch: int = 4,
                 max_depth: int = 8) -> None:
        if not 1 <= nodes <= 256 or wave < 1 or branch < 1 or max_depth < 1:
            raise ValueError(f"dynamic tree: need 1 <= nodes <= 256 (got {nodes}) and wave, branch, max_depth >= 1")
        backend = model.backend
        if not backend.caps.draft_trees:
            raise ValueError(f"{model.name}: its backend ({backend.name}) cannot run tree masks, which a dynamic "
                             "tree needs for its draft forwards; use the chain drafter (drop +tree) or an ONNX "
                             "artifact exported by this version")
        self.model, self.max_nodes = model, nodes
        self.wave, self.branch, self.max_depth = wave, branch, max_depth
        self.name = f"{model.name}+tree:{nodes}"
        self.weight_bytes_per_token = model.weight_bytes_per_token
        self.waves = 0  # draft forwards of the last tree (tests, stats)

    def begin(self, prompt: Tokens) -> None:
        self.model.begin(prompt)

    def propose_tree(self, context: Tokens, max_nodes: int, params: SamplingParams, rng: np.random.Generator
                     ) -> TreeDraft:
        """requires: context = every committed token; returns a tree of <= min(nodes, max_nodes) nodes (top choices
        of the raw draft distribution, no draws: params unused)."""
        m = self.model
        root = m.root_logits(context)[0]
        budget = max(0, min(self.max_nodes, max_nodes, m.capacity - len(context)))
        tokens, parents, values, depths = [int(context[-1])], [-1], [1.0], [0]  # node 0: the root
        heap: list[tuple[float, int, int]] = []
        self._push(heap, 0, root, 1.0)
        self.waves = 1
        while len(tokens) - 1 < budget and heap:
            fresh = []
            while heap and len(fresh) < self.wave and len(tokens) - 1 < budget:
                neg, parent, tok = heapq.heappop(heap)
                if depths[parent] < self.max_depth:
                    fresh.append(len(tokens))
                    tokens.append(tok)
                    parents.append(parent)
                    values.append(-neg)
                    depths.append(depths[parent] + 1)
            if len(tokens) - 1 >= budget or not fresh:
                break
            tree, order = bfs_tree(tokens, parents, depths)
            logits = m.tree_logits(context, tree)
            self.waves += 1
            row = {i: 1 + n for n, i in enumerate(order)}  # insertion index -> row of the BFS-ordered forward
            for j in fresh:
                self._push(heap, j, logits[row[j]], values[j])
        return bfs_tree(tokens, parents, depths)[0]

    def _push(self, heap: list, node: int, logits: Logits, value: float) -> None:
        """The node's top `branch` continuations as candidates worth value * p(token)."""
        x = np.asarray(logits, dtype=np.float64)
        p = np.exp(x - x.max())
        p /= p.sum()
        top = np.argpartition(-p, min(self.branch, len(p)) - 1)[:self.branch]
        for tok in top:
            if p[tok] > 0:
                heapq.heappush(heap, (-value * float(p[tok]), node, int(tok)))

    def accept(self, n_accepted: int, next_token: int) -> None:
        """Nothing to learn; `ModelDrafter.root_logits` reconciles the draft cache at the next tree."""


def bfs_tree(tokens: list, parents: list, depths: list) -> tuple[TreeDraft, list[int]]:
    """The nodes renumbered breadth-first (by depth, then insertion order: a parent precedes its children), and the
    insertion indices in that order."""
    order = sorted(range(1, len(tokens)), key=lambda i: (depths[i], i))
    index = {0: 0, **{i: n + 1 for n, i in enumerate(order)}}
    tree = TreeDraft(np.array([tokens[i] for i in order], dtype=np.int32),
                     np.array([index[parents[i]] for i in order], dtype=np.int64))
    return tree, order
