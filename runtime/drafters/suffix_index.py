"""The index behind the suffix drafter (runtime/drafters/suffix.py): where does the context's suffix occur in a token
corpus, and what followed it.

    SuffixIndex    a token buffer (-1 separates entries) and its positions sorted by the 3 tokens ending there, read
                   last token first: a suffix array cut at depth 3, extended past 3 by a vectorised backward compare
    SuffixMemory   the earlier requests' prompts and answers, bounded in tokens (oldest entries evicted), thread-safe:
                   `add` builds a new SuffixIndex under a lock; readers take `snapshot()`, an index nobody mutates

Why a depth-3 sorted index and not a suffix tree or automaton: in Python a tree costs a dict node per (position,
depth) and an automaton two dict states per token, both hundreds of bytes per token and a Python loop per insert;
neither evicts. Sorting int64 keys is one NumPy call (64k tokens: a few ms per finished request), a lookup is three
`searchsorted` calls plus one [candidates, 8] compare per 8 further tokens of match, and the occurrence counts the
confidence needs are the sizes of the candidate sets (the counts a suffix tree keeps on its nodes). The growing
request keeps its keys unsorted, searched by one vectorised compare over them (a few microseconds for a context of
thousands of tokens), and sorts them once they pass 4096.

Key of position i (tokens x, enc(t) = t + 1, 0 for "none": before the buffer or across a separator):
    key_i = enc(x_i) << 42 | enc(x_{i-1}) << 21 | enc(x_{i-2})
so the positions whose last m <= 3 tokens equal the context's last m are one contiguous range of the sorted keys.
Example: x = [5, 6, 7, -1, 6, 7]: the keys ending in [6, 7] are positions 2 and 5; the context [.., 6, 7] matches both
(m = 2), and only position 2 has a follower (x[3] is the separator, so it ends the entry).
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Sequence

import numpy as np

BITS = 21  # bits per key field: token ids below 2**21 - 1 (every vocabulary here: <= 262144)
DEPTH = 3  # tokens in a key
SEP = -1  # between entries; never equal to a context token, so no match or continuation crosses it
MASK = (1 << BITS) - 1  # one key field
MAX_ID = MASK - 1  # the largest token id (enc = id + 1 fits a field)
STEP = 8  # backward-compare columns per NumPy call past the key's depth


def keys_of(x: np.ndarray, start: int) -> np.ndarray:
    """[len(x) - start] int64 keys of positions start.. of x (x: int32 tokens, SEP between entries)."""
    new = x[start:]
    if len(new) and int(new.max()) > MAX_ID:
        raise ValueError(f"token id {int(new.max())} is past the suffix index's {MAX_ID} (21-bit key fields)")
    lead = x[max(start - (DEPTH - 1), 0):start]
    pad = np.concatenate([np.full(DEPTH - 1 - len(lead), SEP), lead, new]).astype(np.int64) + 1  # enc
    L = len(new)
    e0, e1, e2 = pad[2:2 + L], pad[1:1 + L], pad[:L]
    e2 = np.where(e1 == 0, 0, e2)  # a separator cuts the key: nothing before it belongs to this entry
    return e0 << (2 * BITS) | e1 << BITS | e2


class SuffixIndex:
    """Tokens, the key of each position, and the positions before `n_sorted` sorted by key. Positions past it (the
    tail: a growing request's) are searched by one vectorised compare; the tail is sorted in once it reaches
    `merge_at` positions (0: at once, as the memory's index is)."""

    def __init__(self, tokens: np.ndarray | None = None, merge_at: int = 4096) -> None:
        self.x = np.zeros(256, np.int32)  # [capacity]; the indexed tokens are x[:n]
        self.k = np.zeros(256, np.int64)  # [capacity] the key of each position
        self.n = self.n_sorted = 0
        self.merge_at = merge_at
        self.keys = np.zeros(0, np.int64)  # [n_sorted] the keys of positions < n_sorted, sorted
        self.order = np.zeros(0, np.int64)  # [n_sorted] their positions in key order (equal keys: ascending)
        if tokens is not None:
            self.extend(tokens)

    @property
    def tokens(self) -> np.ndarray:
        return self.x[:self.n]

    def extend(self, new: np.ndarray) -> None:
        """Append tokens and index their positions."""
        new = np.asarray(new, dtype=np.int32).reshape(-1)
        m, n = self.n, self.n + len(new)
        if n > len(self.x):
            size = max(n, 2 * len(self.x))
            self.x = np.concatenate([self.x[:m], np.zeros(size - m, np.int32)])
            self.k = np.concatenate([self.k[:m], np.zeros(size - m, np.int64)])
        self.x[m:n] = new
        self.n = n
        self.k[m:n] = keys_of(self.x[:n], m)
        if n - self.n_sorted >= self.merge_at:
            before_sep = np.nonzero(self.x[1:n] == SEP)[0]
            self.k[before_sep] = 0  # no follower: never a match (a separator ends an entry)
            self.order = np.argsort(self.k[:n], kind="stable")
            self.keys, self.n_sorted = self.k[:n][self.order], n

    def matches(self, rev: np.ndarray, max_depth: int) -> tuple[int, np.ndarray]:
        """The longest match of a context suffix: rev = the context reversed (rev[d] = context[-1 - d]). Returns
        (length, ends): the positions e whose last `length` tokens equal the context's last `length` (capped at
        max_depth) and that have a follower (x[e + 1] is a token); (0, []) when no token of it matches."""
        fields = [int(t) + 1 for t in rev[:DEPTH]]
        tail = self.k[self.n_sorted:self.n - 1]  # the last position has no follower
        found = [np.nonzero((tail >> (2 * BITS)) == fields[0])[0]] if len(tail) else []
        for d in range(1, len(fields) if found else 0):  # tail positions matching d + 1 tokens: a subset of d's
            if not len(found[-1]):
                break
            shift = BITS * (DEPTH - 1 - d)
            found.append(found[-1][((tail[found[-1]] >> shift) & MASK) == fields[d]])
        for m in range(len(fields), 0, -1):
            ends = self.n_sorted + found[m - 1] if m <= len(found) else np.zeros(0, np.int64)
            ends = ends[self.x[ends + 1] != SEP]  # (the tail of a general index may hold separators too)
            if self.n_sorted:
                lo = sum(f << (BITS * (DEPTH - 1 - d)) for d, f in enumerate(fields[:m]))
                i0, i1 = self.keys.searchsorted(lo), self.keys.searchsorted(lo + (1 << (BITS * (DEPTH - m))))
                if i1 > i0:
                    head = self.order[i0:i1]
                    ends = np.concatenate([head[head < self.n - 1], ends])
            if len(ends):
                return self._longest(ends, m, rev, max_depth)
        return 0, np.zeros(0, np.int64)

    def _longest(self, ends: np.ndarray, m: int, rev: np.ndarray, max_depth: int) -> tuple[int, np.ndarray]:
        """Extend the m-token matches backwards, STEP tokens per call; keep those of the greatest length."""
        depth = min(max_depth, len(rev))
        length = np.full(len(ends), min(m, depth))
        alive = np.arange(len(ends))
        d = m
        while d < depth and len(alive):
            w = min(STEP, depth - d)
            pos = ends[alive, None] - (d + np.arange(w))  # [A, w]
            tok = np.where(pos >= 0, self.x[np.maximum(pos, 0)], SEP)
            eq = tok == rev[d:d + w]
            run = np.where(eq.all(axis=1), w, eq.argmin(axis=1))
            length[alive] += run
            alive = alive[run == w]
            d += w
        best = int(length.max())
        return best, ends[length == best]

    def followers(self, ends: np.ndarray, k: int) -> np.ndarray:
        """[len(ends), k] the tokens after each end, SEP past the buffer's end (and from a separator on)."""
        idx = ends[:, None] + 1 + np.arange(k)
        rows = np.where(idx < self.n, self.x[np.minimum(idx, self.n - 1)], SEP)
        return np.where(np.cumsum(rows == SEP, axis=1) > 0, SEP, rows)


class SuffixMemory:
    """Earlier requests' prompt + answer token sequences, at most `budget` tokens in all (plus one separator per
    entry; the index holds ~20 bytes per token: 65536 tokens ~ 1.3 MB), oldest entries evicted first. An entry that
    extends the newest one (the next turn of the same chat, the same ask again) replaces it. Thread-safe."""

    def __init__(self, budget: int = 65536) -> None:
        if budget < 1:
            raise ValueError(f"a suffix memory budget is a token count >= 1, got {budget}")
        self.budget = budget
        self._entries: deque[np.ndarray] = deque()
        self._lock = threading.Lock()
        self._index = SuffixIndex()
        self.added = 0  # entries ever added (for --stats and tests)

    @property
    def n_tokens(self) -> int:
        return sum(len(e) for e in self._entries)

    @property
    def entries(self) -> list[np.ndarray]:
        with self._lock:
            return list(self._entries)

    def snapshot(self) -> SuffixIndex:
        """The current index; never mutated afterwards (a later `add` builds a new one)."""
        return self._index

    def add(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Remember one finished sequence (its last `budget` tokens when longer)."""
        entry = np.asarray(tokens, dtype=np.int32).reshape(-1)[-self.budget:].copy()
        if len(entry) < 2:  # nothing follows anything in it
            return
        with self._lock:
            last = self._entries[-1] if self._entries else None
            if last is not None and len(last) <= len(entry) and np.array_equal(entry[:len(last)], last):
                self._entries.pop()
            self._entries.append(entry)
            total = sum(len(e) for e in self._entries)
            while total > self.budget:
                total -= len(self._entries.popleft())
            parts = [p for e in self._entries for p in (e, np.array([SEP], np.int32))]
            self._index = SuffixIndex(np.concatenate(parts), merge_at=0)
            self.added += 1
