"""Preallocated KV cache: the position is the only cursor (llama2.c / gpt-fast).

Rollback sets the length; the next forward overwrites the rejected positions. Tree decoding
compacts the accepted path's rows into contiguous slots with `compact`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class LengthCursor:
    """The length cursor every cache shares: positions [0, length) are committed; rollback only moves it back.

    Subclasses give `capacity` and may override `_forget(length)` to drop storage past the new length.
    """

    _length: int = 0

    @property
    def length(self) -> int:
        return self._length

    @property
    def capacity(self) -> int:
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        """Forget positions >= length."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length}: cache holds {self._length} positions")
        if length < self._length:
            self._forget(length)
        self._length = length

    def advance(self, t: int) -> None:
        self._length += t

    def _forget(self, length: int) -> None:
        """Positions >= length are stale; preallocated storage is simply overwritten later."""


def compaction_slots(src, dst_start: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) for moving the rows at slots `src` (ascending) to dst_start, dst_start + 1, ... (a tree's accepted
    path into place); ValueError if a row would move away from the start."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.arange(dst_start, dst_start + len(src))
    if len(src) and (src < dst).any():
        raise ValueError("compaction only moves rows towards the start")
    return src, dst


@dataclass(frozen=True)
class KVSnapshot:
    length: int


class KVCache(LengthCursor):
    """K and V for every layer: k[layer] is [n_kv, capacity, head_dim] so one head's keys are contiguous."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int, dtype=np.float32) -> None:
        if capacity <= 0:
            raise ValueError(f"KV cache capacity must be positive, got {capacity}")
        self.k = np.zeros((n_layers, n_kv_heads, capacity, head_dim), dtype=dtype)
        self.v = np.zeros_like(self.k)
        # absent[layer, slot]: the layer wrote no K/V there (a LoRA-Drop drop step); its queries skip those slots.
        self.absent = np.zeros((n_layers, capacity), dtype=bool)
        self._length = 0

    @property
    def capacity(self) -> int:
        return int(self.k.shape[2])

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v ([n_kv, T, hd]) of the T new tokens at positions length..length+T-1 (length not advanced)."""
        t = k.shape[1]
        self.k[layer, :, self._length:self._length + t] = k
        self.v[layer, :, self._length:self._length + t] = v
        self.absent[layer, self._length:self._length + t] = False

    def skip(self, layer: int, t: int) -> None:
        """The layer writes no K/V for the T new tokens (length not advanced): later queries of it skip them."""
        self.absent[layer, self._length:self._length + t] = True

    def view(self, layer: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """K, V of the committed positions plus the t new ones: [n_kv, length + t, hd]."""
        end = self._length + t
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def compact(self, src: np.ndarray, dst_start: int) -> None:
        """Copy rows at positions `src` (ascending) to dst_start, dst_start+1, ... and set the length after them.

        Used after tree verification: the accepted path's KV moves into place.
        """
        src, dst = compaction_slots(src, dst_start)
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]
        self.absent[:, dst] = self.absent[:, src]
        self._length = dst_start + len(src)

    def snapshot(self) -> KVSnapshot:
        return KVSnapshot(self._length)

    def restore(self, snap: KVSnapshot) -> None:
        self.rollback(snap.length)

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)
