"""Suffix drafter, a memory of past answers (SuffixDecoding, arXiv 2411.04975; ik_llama.cpp `--spec-type suffix`):
`--drafter suffix[:<budget>]`, and `<drafter>+suffix[:<budget>]` to combine it with ngram or a draft model.

Two corpora are searched each round (runtime/drafters/suffix_index.py): the current request (its prompt and output so
far, indexed as it grows) and the memory (earlier requests' prompts and answers, `SuffixMemory`, shared by every call
of one drafter: the server's and a chat's calls on one model; each call adds its prompt + answer when it ends).

A round (docs/algorithms.md 2.9):
  1. the longest suffix of the context found in either corpus, up to max_depth (24) tokens: length m and the
     occurrences of that length in both (a frequency table, as SuffixDecoding's tree node counts);
  2. a chain walked through the occurrences' followers: at each step the most frequent next token; its probability
     is (rows with it) / (rows still alive, those that ended included); the draft stops when the product of these
     probabilities falls below p_min (0.1) or at min(k, ceil(alpha * m)) tokens (alpha 1: a short match drafts
     little).
No q: verified by the deterministic-drafter rule (1.2), so it is lossless. The draft's `kind` is KIND + min(m, 8),
so the adaptive draft length learns acceptance per match length apart from n-gram (1..3) and model (0) drafts.

Example: memory [5, 6, 7, 8, SEP, 5, 6, 7, 9, SEP, 5, 6, 7, 8, SEP], context [1, 5, 6, 7], k 4: m = 3 (three
occurrences of [5, 6, 7]); followers 8, 9, 8: 8 with p 2/3, then every row ends: draft [8], kind KIND + 3.

`SuffixTreeDrafter` (`suffix+tree[:<nodes>]`) grows the same occurrences into a tree, best first by path probability.
`LongerDrafter` combines it with another chain drafter: the suffix draft when it already has k tokens (the other,
maybe paid, drafter does not run), else the longer of the two (a tie: the suffix draft, which costs nothing).
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from ..backends.base import Backend
from ..tree import TreeDraft
from ..types import Draft, SamplingParams, Tokens
from .base import Drafter, TreeDrafter
from .dytree import bfs_tree
from .chain import ChainDrafter
from .suffix_index import MAX_ID, SEP, SuffixIndex, SuffixMemory

KIND = 100  # suffix drafts are labelled KIND + 1 .. KIND + 8 (the match length, capped)
EMPTY = Draft(tokens=np.zeros(0, dtype=np.int32), q=None)


def walk(rows: np.ndarray, k: int, p_min: float) -> tuple[np.ndarray, float]:
    """The most frequent path through `rows` [R, >= k] (followers, SEP where a row ends): up to k tokens while the
    product of the step probabilities stays >= p_min; returns (tokens, that product)."""
    out, prob = [], 1.0
    for j in range(k):
        if len(rows) == 0:
            break
        col = rows[:, j]
        if len(rows) == 1 or (col == col[0]).all():  # one path: probability 1 while it lasts
            if col[0] == SEP:
                break
            out.append(int(col[0]))
            continue
        vals, counts = np.unique(col[col != SEP], return_counts=True)
        if len(vals) == 0:
            break
        best = int(np.argmax(counts))
        p = counts[best] / len(rows)
        if prob * p < p_min:
            break
        prob *= p
        out.append(int(vals[best]))
        rows = rows[col == vals[best]]
    return np.array(out, dtype=np.int32), prob


class SuffixDrafter(Drafter):
    """The current request and a SuffixMemory, searched for the context's longest suffix (module docstring).
    `memory` None: a new one of `budget` tokens (the registry builds one per drafter, so one per loaded model)."""

    name = "suffix"
    weight_bytes_per_token = 0

    def __init__(self, memory: SuffixMemory | None = None, *, budget: int = 65536, max_depth: int = 24,
                 alpha: float = 1.0, p_min: float = 0.1, max_rows: int = 1024) -> None:
        if max_depth < 1 or alpha <= 0 or not 0 <= p_min <= 1 or max_rows < 1:
            raise ValueError(f"suffix drafter: needs max_depth >= 1, alpha > 0, 0 <= p_min <= 1 and max_rows >= 1, got "
                             f"{max_depth}, {alpha}, {p_min}, {max_rows}")
        self.memory = memory if memory is not None else SuffixMemory(budget)
        self.max_depth, self.alpha, self.p_min, self.max_rows = max_depth, alpha, p_min, max_rows
        self._req = SuffixIndex()
        self._mem = self.memory.snapshot()
        self.from_memory = 0  # rounds whose longest match was (also) in the memory (for tests)

    def check(self, target: Backend) -> None:
        """Start-up: the index's key fields hold every token id of the target's vocabulary."""
        if target.config.vocab_size - 1 > MAX_ID:
            raise ValueError(f"the suffix drafter indexes token ids up to {MAX_ID}, and this model's vocabulary has "
                             f"{target.config.vocab_size} tokens: use ngram")

    def begin(self, prompt: Tokens) -> None:
        """A new request: index its prompt; take the memory as it is now (later adds are seen by the next request)."""
        self._req = SuffixIndex(np.asarray(prompt, dtype=np.int32).reshape(-1))
        self._mem = self.memory.snapshot()

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """requires: context = every committed token; returns 0..k tokens, q = None (params unused)."""
        m, rows = self.rows(context, k)
        tokens = walk(rows, rows.shape[1], self.p_min)[0] if m else rows[0, :0]
        return Draft(tokens=tokens, q=None, kind=KIND + min(m, 8)) if len(tokens) else EMPTY

    def rows(self, context: Tokens, k: int) -> tuple[int, np.ndarray]:
        """Index the committed context, then step 1 of the module docstring: (m, followers [R, min(k, ceil(alpha m))])
        of the longest match's occurrences; (0, an empty [1, 0]) without one."""
        context = np.asarray(context, dtype=np.int32).reshape(-1)
        done = self._req.n
        if len(context) < done or not np.array_equal(context[:done], self._req.tokens):
            self.begin(context)  # not an extension of the indexed request (a new sequence without begin)
        elif len(context) > done:
            self._req.extend(context[done:])
        if k <= 0 or not len(context):
            return 0, np.zeros((1, 0), np.int32)
        rev = context[::-1][:self.max_depth]
        found = [(src, *src.matches(rev, self.max_depth)) for src in (self._mem, self._req) if src.n]
        m = max((length for _, length, _ in found), default=0)
        if m == 0:
            return 0, np.zeros((1, 0), np.int32)
        n = min(k, math.ceil(self.alpha * m))
        # memory rows first, the request's last: the row cap keeps the request's, then the memory's last (index order)
        parts = [src.followers(ends, n) for src, length, ends in found if length == m]
        if found[0][0] is self._mem and found[0][1] == m:
            self.from_memory += 1
        return m, np.concatenate(parts)[-self.max_rows:]

    def finish(self, tokens: Tokens) -> None:
        """The request ended: its prompt and answer join the memory."""
        self.memory.add(tokens)


class LongerDrafter(ChainDrafter):
    """[suffix, other]: the suffix draft if it has k tokens, else the longer of both (module docstring). The drafter
    whose draft is verified hears the verdict; each draft keeps its own verification rule (1.2 without q, 1.1 with)."""

    def __init__(self, suffix: SuffixDrafter, other: Drafter) -> None:
        super().__init__([suffix, other], name=f"{other.name}+suffix")
        self.suffix, self.other = suffix, other

    @property
    def rounds(self) -> dict[str, int]:
        """Which part's draft was verified each round (for --stats and tests)."""
        return {"suffix": self.counts[0], "other": self.counts[1]}

    def propose(self, context: Tokens, k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        draft, self.source = self.suffix.propose(context, k, params, rng), 0
        if draft.k < k:
            theirs = self.other.propose(context, k, params, rng)
            if theirs.k > draft.k:
                draft, self.source = theirs, 1
        self.counts[self.source] += 1
        return draft

    def accept(self, n_accepted: int, next_token: int) -> None:
        self.sources[self.source].accept(n_accepted, next_token)


class SuffixTreeDrafter(TreeDrafter):
    """`suffix+tree[:<nodes>]`: the same occurrences grown into a tree, best first by path probability (the product
    of the step probabilities, as SuffixDecoding scores its trees), up to `nodes` nodes while that stays >= p_min;
    the depth is capped at ceil(alpha m) as the chain's length is. Deterministic (no q): the 1.2 tree rule verifies
    it. Needs a target with tree masks (numpy, native; onnx fp32/fp16)."""

    def __init__(self, chain: SuffixDrafter, nodes: int = 16) -> None:
        if not 1 <= nodes <= 256:
            raise ValueError(f"suffix tree: the node count is in 1..256, got {nodes}")
        self.chain, self.max_nodes, self.name = chain, nodes, "suffix+tree"
        self.memory = chain.memory

    def check(self, target: Backend) -> None:
        super().check(target)
        self.chain.check(target)

    def begin(self, prompt: Tokens) -> None:
        self.chain.begin(prompt)

    def finish(self, tokens: Tokens) -> None:
        self.chain.finish(tokens)

    def propose_tree(self, context: Tokens, max_nodes: int, params: SamplingParams, rng: np.random.Generator
                     ) -> TreeDraft:
        """requires: context = every committed token; returns a tree of <= min(nodes, max_nodes) nodes."""
        budget = min(self.max_nodes, max_nodes)
        m, rows = self.chain.rows(context, budget)
        tree = grow(rows, budget, self.chain.p_min)
        return TreeDraft(tree.tokens, tree.parents, kind=KIND + min(m, 8))


def grow(rows: np.ndarray, max_nodes: int, p_min: float) -> TreeDraft:
    """The best-first tree of the paths through `rows` [R, D] (SEP where a row ends): a node's value is the product of
    (rows with its token) / (rows alive at its parent) along its path; nodes valued below p_min are not added."""
    tokens, parents, depths, heap, tick = [0], [0], [0], [], 0

    def expand(node: int, alive: np.ndarray, depth: int, value: float) -> None:
        nonlocal tick
        if depth >= rows.shape[1] or not len(alive):
            return
        col = rows[alive, depth]
        vals, counts = np.unique(col[col != SEP], return_counts=True)
        for v, c in zip(vals.tolist(), counts.tolist()):
            if value * c / len(alive) >= p_min:
                tick += 1
                heapq.heappush(heap, (-value * c / len(alive), tick, node, v, alive[col == v], depth + 1))

    expand(0, np.arange(len(rows)), 0, 1.0)
    while heap and len(tokens) - 1 < max_nodes:
        neg, _, parent, token, alive, depth = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        depths.append(depth)
        expand(len(tokens) - 1, alive, depth, -neg)
    return bfs_tree(tokens, parents, depths)[0]
