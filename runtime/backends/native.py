"""The native engine: specedge's own CPU kernels (csrc/native), built for the shapes speculation runs.

A GGUF's quantized blocks are repacked at load into groups of 16 output rows without changing any weight's value;
activations are quantized to int8 per 32 (as llama.cpp does for these formats), and one kernel verifies 1-16 rows
while reading each weight block once. Every row's arithmetic is fixed, whatever the call's width, the thread count
or the instruction set: its logits rows are bitwise batch-invariant by construction, so greedy speculation on it is
token-identical to its own plain decoding (docs/native.md; tests/test_native.py probes it anyway).

Python validates the file (tensor types and shapes against the config, via the GGUF reader that already checked
every offset against the file's size), owns the KV cache (fp16 numpy arrays, the position its only cursor) and the
RoPE tables (models/rope.py, as the NumPy reference builds them); C packs the weights and runs the forward.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import replace

import numpy as np

from ...models import rope as rope_tables
from ...models.block import Activation, Norm
from ...models.config import ModelConfig
from ..cores import default_threads
from ..kv import LengthCursor, compaction_slots
from ..types import Logits, Mask, Tokens
from . import native_lib as nl
from .base import BackendCaps, LayerPlan, check_room, gate_variance, tree_depths

MAX_ROWS = 64  # rows one C call takes: chains are split (a row's result does not depend on the split), trees not
KBLOCK = 16  # keys per K-cache block (SE_KBLOCK in csrc/native/se.h)
_MATS = {"q": 0, "k": 1, "v": 2, "o": 3, "gate": 4, "up": 5, "down": 6}  # se_model_set_mat's SE_W_*
_VECS = {"attn_norm": 0, "ffn_norm": 1, "q_bias": 2, "k_bias": 3, "v_bias": 4, "o_bias": 5, "q_norm": 6, "k_norm": 7,
         "post_attn_norm": 8, "post_ffn_norm": 9}  # SE_V_*


_FUSED = ("qkv", "gate_up")  # phi3's fused tensors: their row ranges are the separate matrices (_parts)


def _parts(short: str, config: ModelConfig) -> list[tuple[str, int, int]]:
    """(matrix, first row, rows) of a tensor: a fused q|k|v or gate|up tensor is its matrices' rows in order."""
    H, KV, hd, F = config.n_heads, config.n_kv_heads, config.head_dim, config.d_ff
    if short == "qkv":
        return [("q", 0, H * hd), ("k", H * hd, KV * hd), ("v", (H + KV) * hd, KV * hd)]
    if short == "gate_up":
        return [("gate", 0, F), ("up", F, F)]
    return [(short, 0, -1)]


class NativeUnsupported(ValueError):
    """This file or model shape is outside what the native engine runs; the message names it and the fix."""


def check_model(config: ModelConfig, types: dict[str, str]) -> None:
    """Refuse, naming the tensor or setting and the fix, what the kernels do not take (before any C runs)."""
    spec, fix = config.block, "use --backend ik or llamacpp for this file"
    if spec.norm not in (Norm.RMS, Norm.RMS_PLUS_ONE):
        raise NativeUnsupported(f"the native engine runs RMSNorm models, not {spec.norm.value} norms; {fix}")
    if config.head_dim % 16 or config.head_dim > 512 or config.d_model % 32 or config.d_ff % 32 or (config.n_heads * config.head_dim) % 32:
        raise NativeUnsupported(f"the native engine needs head_dim % 16 == 0 (at most 512) and d_model, d_ff, heads x head_dim "
                                f"multiples of 32 (this {config.arch}: head_dim {config.head_dim}, d_model "
                                f"{config.d_model}, d_ff {config.d_ff}); {fix}")
    for name, kind in types.items():
        matrix = name == "embed" or name == "lm_head" or name.rsplit(".", 1)[-1] in _MATS or name.endswith(_FUSED)
        if matrix and kind not in nl.PACKED:
            raise NativeUnsupported(f"tensor {name!r} is {kind}; the native engine packs {', '.join(nl.PACKED)} "
                                    f"weights so far (docs/native.md); {fix}")


_HUGE = 1 << 21


def huge_zeros(nbytes: int) -> np.ndarray:
    """A zeroed uint8 array of nbytes; from 2 MB up, 2 MB-aligned and advised MADV_HUGEPAGE (Linux), so the kernel
    may back it with huge pages as it does the packed weights (pack.c): streamed without a TLB miss every 4 KB,
    and the hardware prefetchers do not stop at every page end."""
    if nbytes < _HUGE:
        return np.zeros(nbytes, np.uint8)
    total = -(-nbytes // _HUGE) * _HUGE
    buf = np.zeros(total + _HUGE, np.uint8)  # untouched pages: the advice applies when they are first written
    off = (-buf.ctypes.data) % _HUGE
    if sys.platform == "linux":
        ctypes.CDLL(None).madvise(ctypes.c_void_p(buf.ctypes.data + off), ctypes.c_size_t(total), 14)  # MADV_HUGEPAGE
    return buf[off:off + nbytes]


def _huge_pair(k_shape, v_shape):
    """Two zeroed fp16-bit arrays; from 2 MB up, in one huge_zeros buffer: attention then streams them without a
    TLB miss a 4 KB page (SmolLM2-135M at 1024 cached tokens: T(1) -7%, T(5) -3%; at 256 within noise)."""
    nk, nv = int(np.prod(k_shape)) * 2, int(np.prod(v_shape)) * 2
    if nk + nv < _HUGE:
        return np.zeros(k_shape, np.uint16), np.zeros(v_shape, np.uint16)
    buf = huge_zeros(nk + nv)
    return buf[:nk].view(np.uint16).reshape(k_shape), buf[nk:].view(np.uint16).reshape(v_shape)


class NativeCache(LengthCursor):
    """fp16 K and V for every layer. V is [layers, kv heads, slots, head_dim]; K is the same positions in blocks of
    16 stored dims-major, [layers, kv heads, slots / 16, head_dim, 16], so one 16-key block's scores are 16 lanes
    of fused chains over head_dim with no reduction across lanes (docs/native.md). slots: capacity rounded up to 16."""

    def __init__(self, config: ModelConfig, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"KV cache capacity must be positive, got {capacity}")
        self._capacity = capacity
        self.slots = -(-capacity // KBLOCK) * KBLOCK
        L, KV, hd = config.n_layers, config.n_kv_heads, config.head_dim
        self.k, self.v = _huge_pair((L, KV, self.slots // KBLOCK, hd, KBLOCK), (L, KV, self.slots, hd))
        self._length = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def compact(self, src: np.ndarray, dst_start: int) -> None:
        """Move the rows at slots `src` (ascending) to dst_start, dst_start + 1, ... and set the length after them
        (the accepted path of a tree)."""
        src, dst = compaction_slots(src, dst_start)
        self.k[:, :, dst // KBLOCK, :, dst % KBLOCK] = self.k[:, :, src // KBLOCK, :, src % KBLOCK]
        self.v[:, :, dst] = self.v[:, :, src]
        self._length = dst_start + len(src)

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


class NativeBackend:
    """caps: tree masks, layer plans and taps (no LoRA-Drop reuse), any rollback, batch-invariant."""

    name = "native"
    caps = BackendCaps(tree_mask=True, layer_plan=True, layer_reuse=False, partial_rollback=True,
                       max_batch_tokens=4096,
                       reuse_hint="the native engine runs layer plans without LoRA-Drop reuse; use --backend numpy")

    def __init__(self, gguf, *, n_threads: int | None = None, batch_invariant: bool = True) -> None:
        """gguf: an opened GGUFModel (models/gguf_in.py): its reader has checked every tensor against the file.
        batch_invariant: what the file's gate probe found (assembly/engine_gate.py; False would be a bug in the
        kernels, declared rather than hidden)."""
        self._lib = lib = nl.load()
        cfg = self.config = gguf.config
        types = gguf.tensor_types()
        check_model(cfg, types)
        spec = cfg.block
        self.threads = default_threads(n_threads)
        c = nl.Cfg(cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size,
                   float(cfg.rms_eps), float(spec.embed_scale), nl.ACT[spec.activation.value], int(spec.qkv_bias),
                   int(spec.o_bias), int(spec.qk_norm), int(spec.post_norms), int(cfg.tied_embeddings), MAX_ROWS,
                   self.threads)
        self._model = lib.se_model_new(ctypes.byref(c))
        if not self._model:
            raise MemoryError(f"the native engine could not allocate a {cfg.arch} model")
        self._gguf = gguf
        expected = cfg.tensor_names()
        for name in expected:
            if name not in types:
                raise NativeUnsupported(f"{gguf.path}: tensor {name!r} is missing")
            layer, short = (-1, name) if not name.startswith("layers.") else (int(name.split(".")[1]),
                                                                             name.split(".", 2)[2])
            if short in ("embed", "lm_head") or short in _MATS or short in _FUSED:
                self._set_matrix(gguf, name, layer, short, expected[name])
            else:
                v = gguf.load_tensor(name).astype(np.float32).reshape(-1)
                if short.endswith("norm"):
                    v = np.asarray(spec.norm_scale(v), dtype=np.float32)
                rc = lib.se_model_set_vec(self._model, layer, 0 if short == "norm" else _VECS[short], nl.fptr(v),
                                          len(v))
                if rc != 0:
                    raise NativeUnsupported(f"{gguf.path}: tensor {name!r} was not taken (code {rc})")
        rc = lib.se_model_ready(self._model)
        if rc != 0:
            raise NativeUnsupported(f"{gguf.path}: the native engine found tensors missing (code {rc})")
        self._bytes = int(lib.se_model_bytes(self._model))
        self._ropes = [rope_tables.layer_rope(cfg, i) for i in range(cfg.n_layers)]
        self._inv = {r: rope_tables.inv_freq(r) for r in rope_tables.distinct_ropes(cfg)}
        self._half = np.array([0 if r is None else len(self._inv[r]) for r in self._ropes], dtype=np.int32)
        self._window = np.array([spec.layer(i).window or 0 for i in range(cfg.n_layers)], dtype=np.int32)
        self._all_layers = np.arange(cfg.n_layers, dtype=np.int32)
        self._half_p, self._window_p = self._half.ctypes.data, self._window.ctypes.data
        self._rows = np.arange(MAX_ROWS, dtype=np.int32)
        self._rows_p = self._rows.ctypes.data
        self._rope_len = 0
        self._trimmed: dict[bytes, nl.PackedMatrix] = {}
        self.isa = nl.isa_name(lib.se_isa())
        self.caps = replace(type(self).caps, max_context=cfg.context_length,
                            variance=None if batch_invariant else gate_variance("native", self.threads))

    # -- the Backend protocol -------------------------------------------------------------------------------------
    def _set_matrix(self, gguf, name: str, layer: int, short: str, shape: tuple[int, ...]) -> None:
        """Pack one matrix tensor (each part of a fused one) into the C model, its blocks as the file stores them."""
        kind, raw = gguf.raw_blocks(name)
        raw = np.ascontiguousarray(raw)
        n, k = shape
        for part, first, rows in _parts(short, self.config):
            rows = n if rows < 0 else rows
            block = np.ascontiguousarray(raw[first:first + rows])
            which = {"embed": 0, "lm_head": 1}.get(part, _MATS.get(part))
            rc = self._lib.se_model_set_mat(self._model, layer, which, nl.GGML_TYPES[kind], block.ctypes.data,
                                           block.shape[1], rows, k)
            if rc != 0:
                raise NativeUnsupported(f"{gguf.path}: tensor {name!r} ({kind}, {raw.shape}) does not pack as a "
                                        f"{rows} x {k} {part} matrix (rows {first}..{first + rows}; code {rc})")

    def new_cache(self, max_len: int) -> NativeCache:
        if max_len > self.config.context_length:
            raise ValueError(f"a cache of {max_len} positions exceeds the model's context {self.config.context_length}; "
                             "shorten the request or lower --ctx")
        return NativeCache(self.config, max_len)

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        """The packed weights one forward reads (the embedding read is one row per token, not counted)."""
        if plan is None or plan == LayerPlan():
            return self._bytes
        layers = plan.resolve(self.config.n_layers)
        head = self._bytes - self._layer_bytes() * self.config.n_layers
        return head + self._layer_bytes() * len(layers)

    def _layer_bytes(self) -> int:
        c = self.config
        params = 2 * c.d_model * (c.n_heads + c.n_kv_heads) * c.head_dim + 3 * c.d_model * c.d_ff
        return int(self._bytes * params / max(1, self._params_total()))

    def _params_total(self) -> int:
        c = self.config
        per_layer = 2 * c.d_model * (c.n_heads + c.n_kv_heads) * c.head_dim + 3 * c.d_model * c.d_ff
        return per_layer * c.n_layers + c.vocab_size * c.d_model * (1 if c.tied_embeddings else 2)

    def matmul(self, packed: nl.PackedMatrix, x: np.ndarray) -> np.ndarray:
        """A drafter's packed matrix (a draft head's, runtime/drafters/head.py) times x [rows, k] on this engine's
        thread pool, between forwards: PackedMatrix.matmul's bits, its output rows split over the threads."""
        return packed.matmul_on(self._model, x)

    def forward(self, tokens: Tokens, cache: NativeCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """Logits [T, V] for tokens appended at cache.length."""
        return self._run(tokens, cache, tree_mask, plan, (), logits=True)[0]

    def feed(self, tokens: Tokens, cache: NativeCache) -> None:
        """Append tokens without computing their logits (FeedingBackend): no LM head for a prompt."""
        self._run(tokens, cache, None, None, (), logits=False)

    def hidden(self, tokens: Tokens, cache: NativeCache, *, plan: LayerPlan | None = None,
               tree_mask: Mask | None = None, taps: tuple[int, ...] = ()) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """(h after the plan's last layer, before the final norm; {n: h after the first n layers}) (LayeredBackend)."""
        _, h, tapped = self._run(tokens, cache, tree_mask, plan, taps, logits=False, want_h=True)
        return h, tapped

    def logits_from_hidden(self, h: np.ndarray, rows: np.ndarray | None = None) -> Logits:
        """Final norm + LM head over [T, D] hidden states, or over vocabulary rows `rows` (a trimmed head packed
        once from the file's own blocks, so its logits equal the full head's at those rows)."""
        h = np.ascontiguousarray(h, dtype=np.float32)
        head, width = None, self.config.vocab_size
        if rows is not None:
            packed = self._trimmed_head(np.asarray(rows, dtype=np.int64))
            head, width = packed.handle, packed.n
        out = np.empty((h.shape[0], width), dtype=np.float32)
        for s in range(0, h.shape[0], MAX_ROWS):
            part = h[s:s + MAX_ROWS]
            if self._lib.se_head(self._model, nl.fptr(part), len(part), nl.fptr(out[s:s + MAX_ROWS]), head) != 0:
                raise ValueError(f"the native LM head failed on {part.shape}")
        return out

    def _trimmed_head(self, rows: np.ndarray) -> nl.PackedMatrix:
        key = rows.tobytes()
        if key not in self._trimmed:
            if len(self._trimmed) >= 4:
                self._trimmed.pop(next(iter(self._trimmed)))
            kind, raw = self._gguf.raw_blocks("embed" if self.config.tied_embeddings else "lm_head")
            self._trimmed[key] = nl.PackedMatrix(kind, np.asarray(raw)[rows])
        return self._trimmed[key]

    # -- one or more C calls ----------------------------------------------------------------------------------------
    def _run(self, tokens: Tokens, cache: NativeCache, tree_mask: Mask | None, plan: LayerPlan | None,
             taps: tuple[int, ...], *, logits: bool, want_h: bool = False):
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        t = int(tokens.shape[0])
        if t == 0:
            raise ValueError("forward needs at least one token")
        check_room(cache, t)
        if plan is None:
            layers = self._all_layers
        elif plan.reuse:
            raise ValueError(self.caps.reuse_hint)
        else:
            layers = np.asarray(plan.resolve(self.config.n_layers), np.int32)
        D, V = self.config.d_model, self.config.vocab_size
        out = np.empty((t, V), dtype=np.float32) if logits else None
        h = np.empty((t, D), dtype=np.float32) if want_h else None
        tap_list = tuple(n for n in taps if n == 0 or (n - 1) in layers)
        tapped = {n: np.empty((t, D), dtype=np.float32) for n in tap_list}
        if tree_mask is not None:
            mask = np.ascontiguousarray(np.asarray(tree_mask, dtype=bool), dtype=np.uint8)
            if mask.shape != (t, t):
                raise ValueError(f"tree mask has shape {mask.shape}, expected {(t, t)}")
            if t > MAX_ROWS:
                raise ValueError(f"the native engine verifies trees of up to {MAX_ROWS} nodes, got {t}")
            self._call(tokens, cache, cache.length + tree_depths(mask), mask, layers, tapped, h, out)
            return out, h, tapped
        for s in range(0, t, MAX_ROWS):
            n = min(MAX_ROWS, t - s)
            part = slice(s, s + n)
            self._call(tokens[part], cache, cache.length + np.arange(n), None, layers,
                       {k: v[part] for k, v in tapped.items()}, None if h is None else h[part],
                       None if out is None else out[part])
        return out, h, tapped

    def _rope_tables(self, positions: int) -> None:
        """cos/sin for every position below `positions` (grown by doubling), per distinct RoPE, as the NumPy
        reference computes them (float64 angles, then float32), and the per-layer pointers the call struct holds."""
        if positions <= self._rope_len:
            return
        n = max(positions, 2 * self._rope_len, 256)
        pos = np.arange(n, dtype=np.float64)
        self._tables = {}
        for r, inv in self._inv.items():
            angles = pos[:, None] * inv[None, :]
            m = r.scaling.attn_factor
            self._tables[r] = (np.ascontiguousarray((np.cos(angles) * m).astype(np.float32)),
                               np.ascontiguousarray((np.sin(angles) * m).astype(np.float32)))
        L = self.config.n_layers
        self._cos_p, self._sin_p = (ctypes.POINTER(ctypes.c_float) * L)(), (ctypes.POINTER(ctypes.c_float) * L)()
        for i, r in enumerate(self._ropes):
            if r is not None:
                self._cos_p[i], self._sin_p[i] = nl.fptr(self._tables[r][0]), nl.fptr(self._tables[r][1])
        self._rope_len = n

    def _call(self, tokens, cache, positions, mask, layers, tapped, h, out) -> None:
        n = len(tokens)
        positions = np.ascontiguousarray(positions, dtype=np.int32)
        self._rope_tables(int(positions.max()) + 1)
        tap_keys = np.array(list(tapped), dtype=np.int32)
        tap_p = (ctypes.c_void_p * max(1, len(tapped)))(*[b.ctypes.data for b in tapped.values()])
        out_buf = None if out is None else (out if out.flags.c_contiguous else np.empty_like(out))
        call = nl.Call(n, cache.length, cache.slots, tokens.ctypes.data, positions.ctypes.data,
                       None if mask is None else mask.ctypes.data, ctypes.addressof(self._cos_p),
                       ctypes.addressof(self._sin_p), self._half_p, self._window_p, cache.k.ctypes.data,
                       cache.v.ctypes.data, layers.ctypes.data, len(layers), tap_keys.ctypes.data, len(tap_keys),
                       ctypes.addressof(tap_p), None if h is None else h.ctypes.data, self._rows_p,
                       n if out is not None else 0, None if out_buf is None else out_buf.ctypes.data)
        rc = self._lib.se_forward(self._model, ctypes.byref(call))
        if rc != 0:
            why = {-2: "a token id outside the vocabulary"}.get(rc, f"code {rc}")
            raise ValueError(f"the native forward refused its call ({why}): {n} rows at {cache.length}")
        if out is not None and out_buf is not out:
            out[...] = out_buf
        cache.advance(n)

    def close(self) -> None:
        if getattr(self, "_model", None):
            self._lib.se_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()

