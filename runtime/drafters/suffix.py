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

`LongerDrafter` combines it with another chain drafter: the suffix draft when it already has k tokens (the other,
maybe paid, drafter does not run), else the longer of the two (a tie: the suffix draft, which costs nothing).
"""
from __future__ import annotations

import math

import numpy as np

from ..backends.base import Backend
from ..types import Draft, SamplingParams, Tokens
from .base import Drafter
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
        self.from_memory = 0  # drafts with a follower from the memory (for tests and --stats)

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
        context = np.asarray(context, dtype=np.int32).reshape(-1)
        m = self._req.n
        if len(context) < m or not np.array_equal(context[:m], self._req.tokens):
            self.begin(context)  # not an extension of the indexed request (a new sequence without begin)
        elif len(context) > m:
            self._req.extend(context[m:])
        return self.draft(context, k) if k > 0 and len(context) else EMPTY

    def draft(self, context: np.ndarray, k: int) -> Draft:
        """The draft for a committed context (steps 1 and 2 of the module docstring)."""
        rev = context[::-1][:self.max_depth]
        found = [(src, *src.matches(rev, self.max_depth)) for src in (self._mem, self._req) if src.n]
        m = max((length for _, length, _ in found), default=0)
        if m == 0:
            return EMPTY
        n = min(k, math.ceil(self.alpha * m))
        # memory rows first, the request's last: the row cap keeps the request's, then the memory's last (index order)
        parts = [src.followers(ends, n) for src, length, ends in found if length == m]
        rows = np.concatenate(parts)[-self.max_rows:]
        tokens, _ = walk(rows, n, self.p_min)
        if len(tokens) and found[0][0] is self._mem and found[0][1] == m:
            self.from_memory += 1
        return Draft(tokens=tokens, q=None, kind=KIND + min(m, 8)) if len(tokens) else EMPTY

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
