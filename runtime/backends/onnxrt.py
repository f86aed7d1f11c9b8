"""ONNX Runtime backend: runs an exported decoder artifact (models/manifest.py) behind the Backend protocol.

KV design: each cache owns preallocated [1, n_kv, capacity, head_dim] OrtValues per layer (the manifest's kv_dtype:
float32, or float16 for the GPU graphs; in CUDA memory on --device cuda, so the cache never crosses to the host and
only the logits rows come back) and one IOBinding
that binds each of them as both past_key.i and present_key.i. GroupQueryAttention sees the shared buffer and
writes the T new rows in place at positions [length, length + T); nothing else of the cache moves. The length
cursor is the only state: forward passes seqlens_k = length + T - 1 and total_sequence_length = length + T, and
rollback just lowers the cursor (the rejected rows are overwritten next time).

Trees (format 4 artifacts, docs/algorithms.md 1.4 "Tree attention"): the nodes still go to slots [length, length + T);
position_ids carry length + depth and tree_bias masks the non-ancestors among them. A chain binds
position_ids = length + arange(T) and a zero bias: one graph, no tree-only session. After verification
`OnnxCache.compact` copies the accepted path's rows into place with NumPy on the arrays that back the bound OrtValues
(CUDA buffers: copied to the host, compacted and copied back, once per tree step).

The GPU graph (no pad row) runs every call at one fixed width, GPU_VERIFY_WIDTH rows (`fixed_width`): the real tokens
first, then copies of the last one, whose K/V land in scratch slots past the real rows (overwritten by the next call,
as a rollback's are) and whose logits are dropped; longer calls run in chunks of that width. Causal attention keeps
the pad rows out of the real rows, and every matmul sees the same row count whether one token or nine are verified,
so CUDA's kernels (chosen by row count) give a token the same logits in plain decoding and in a verify call: greedy
speculative output equals plain greedy (docs/accelerators.md "Lossless on CUDA").

CUDA graphs (`cuda_graph`, on by default on CUDA): with every call the same shape, onnxruntime can capture a cache's
whole run once and replay it (enable_cuda_graph), which takes the per-kernel launch cost out of a step (H100,
SmolLM2: 2.1 ms a call against 3.7). A graph replays the buffer addresses it was captured with, so a graph cache binds
everything on the device once (input ids, seqlens_k, the logits, the KV) and only updates their contents; and
GroupQueryAttention reads total_sequence_length on the host, so it is the buffer's full length, a constant (the
attention reads only the rows seqlens_k covers: the logits are bit for bit those of a run without the graph). Each
graph belongs to one set of buffers: a graph cache's buffers are sized to the power of two at or above its capacity,
a released cache's buffers and graph go back to a pool for the next cache they can hold, and beyond MAX_CUDA_GRAPHS
sets a cache runs without a graph (same logits, slower).

Artifacts of the static-shape profile run on StaticOnnxBackend (onnx_static.py); `runtime.backends.open_onnx` picks the class
from the manifest.
"""
from __future__ import annotations

import itertools
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np

from ...models.config import ModelConfig
from ...models.manifest import (CHAIN_FORMAT_VERSION, PAD_ROW_ATTENTION, PAD_ROW_NONE, Manifest, Profile,
                                manifest_with_profile)
from ..cores import cpu_info
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, Variance, check_capacity, check_room, tree_depths
from .onnx_providers import Device
from .onnx_session import open_session, read_bytes_per_token


class GraphSlot:
    """What one CUDA graph replays: device buffers bound once (input ids [1, W], seqlens_k, logits [W, V]) beside a
    cache's KV buffers and binding, and the graph's id (onnxruntime's gpu_graph_id)."""

    def __init__(self, backend: "OnnxBackend", binding, rows: int, graph_id: int) -> None:
        ort, io, w = backend.ort, backend.io, backend.fixed_width
        self.graph_id, self.rows = graph_id, rows
        self.ids = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, w), np.int64), "cuda", 0)
        self.seqlens = ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.int32), "cuda", 0)
        # read on the host, so a constant: the buffer's rows, but no more than the RoPE tables hold (a graph call
        # never reaches past them: calls there narrow and run outside the graph)
        self.total = ort.OrtValue.ortvalue_from_numpy(np.array(min(rows, backend.config.context_length), np.int32))
        self.logits = ort.OrtValue.ortvalue_from_numpy(np.zeros((w, backend.config.vocab_size), np.float32), "cuda", 0)
        binding.bind_ortvalue_input(io["input_ids"], self.ids)
        binding.bind_ortvalue_input(io["seqlens_k"], self.seqlens)
        binding.bind_ortvalue_input(io["total_length"], self.total)
        binding.bind_ortvalue_output(io["logits"], self.logits)
        self.run_options = ort.RunOptions()
        self.run_options.add_run_config_entry("gpu_graph_id", str(graph_id))


class OnnxCache(LengthCursor):
    """Per-sequence KV buffers and the IOBinding that ties them to the session's past/present names (with a CUDA
    graph: a pooled set of them, GraphSlot)."""

    def __init__(self, backend: "OnnxBackend", capacity: int) -> None:
        self._capacity = capacity
        self._length = 0
        self._io = backend.io
        self.graph: GraphSlot | None = None
        self._plain = None  # a graph cache's binding for runs outside its graph (plain_binding)
        pooled = backend.take_graph_buffers(capacity)
        if pooled is not None:  # a released graph cache's buffers, at least as large
            _, (self.binding, self._buffers, self._arrays, self.graph) = pooled
            self._dtype = np.dtype(backend.io.get("kv_dtype", "float32"))
            self._device = backend.kv_device
            weakref.finalize(self, backend.release_graph_buffers, *pooled)
            return
        if not (backend.cuda_graph and backend.graphs_left()):
            self._new_buffers(backend, capacity)
            return
        # a new graph: buffers for the power of two at or above the capacity (from 256, within the model's
        # context), so that later caches of other sizes can take them when this one is released
        slot_capacity = min(max(256, 1 << (capacity - 1).bit_length()), backend.config.context_length)
        self._new_buffers(backend, max(slot_capacity, capacity))
        self.graph = backend.new_graph(self.binding, self._buffers[0].shape()[2])
        weakref.finalize(self, backend.release_graph_buffers, max(slot_capacity, capacity),
                         (self.binding, self._buffers, self._arrays, self.graph))

    def _new_buffers(self, backend: "OnnxBackend", capacity: int) -> None:
        ort = backend.ort
        c, io = backend.config, backend.io
        # kv_pad_rows: the graph writes scratch K/V rows just past the last real one (export/onnx_graph.pad_rows)
        # fixed_width: a padded call's scratch rows past the last real one
        scratch = int(io.get("kv_pad_rows", 0)) + backend.fixed_width
        shape = (1, c.n_kv_heads, capacity + scratch, c.head_dim)
        self._dtype = np.dtype(io.get("kv_dtype", "float32"))
        self._device = backend.kv_device  # "cpu" or "cuda": where the buffers live
        self.binding = backend.session.io_binding()
        self.binding.bind_output(io["logits"], "cpu")  # first output: get_outputs()[0] is the logits
        self._buffers = []  # keeps the OrtValues alive for the binding's lifetime: key, value of each layer
        self._arrays: list[np.ndarray] = []  # the memory those CPU OrtValues wrap (no copy): compact writes here
        for _ in range(2 * c.n_layers):
            arr = np.zeros(shape, self._dtype)
            # CUDA: a device buffer initialised from the zeros (the host array is then dropped)
            self._buffers.append(ort.OrtValue.ortvalue_from_numpy(
                arr, *((self._device, 0) if self._device != "cpu" else ())))
            if self._device == "cpu":
                self._arrays.append(arr)
        bind_kv(self.binding, io, self._buffers)

    @property
    def capacity(self) -> int:
        return self._capacity

    def plain_binding(self, session):
        """The binding for a run outside the graph (inputs bound per call): the cache's own, or for a graph cache a
        second one over the same KV buffers (its graph keeps its device inputs bound)."""
        if self.graph is None:
            return self.binding
        if self._plain is None:
            self._plain = session.io_binding()
            self._plain.bind_output(self._io["logits"], "cpu")  # first output: get_outputs()[0] is the logits
            bind_kv(self._plain, self._io, self._buffers)
        return self._plain

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(b.shape())) * self._dtype.itemsize for b in self._buffers)

    def compact(self, src: np.ndarray, dst_start: int) -> None:
        """Copy the K/V rows at slots `src` (ascending, each >= its destination) to dst_start, dst_start + 1, ... in
        every layer and set the length after them (the accepted path of a tree, docs/algorithms.md 1.4).
        requires: src within [0, length); returns nothing; rows past the new length are stale."""
        if self._device == "cpu":
            self._length = compact_rows(self._arrays, 2, self._length, src, dst_start)
            return
        arrays = [b.numpy() for b in self._buffers]  # device buffers: a host copy, compacted, copied back
        self._length = compact_rows(arrays, 2, self._length, src, dst_start)
        for buf, arr in zip(self._buffers, arrays):
            buf.update_inplace(arr)


def bind_kv(binding, io: dict, buffers: list) -> None:
    """Binds each layer's key and value buffer as both its past and its present (the op writes the new rows in
    place); buffers: key, value of layer 0, then of layer 1, ..."""
    for j, buf in enumerate(buffers):
        past, present = ("past_key", "present_key") if j % 2 == 0 else ("past_value", "present_value")
        binding.bind_ortvalue_input(io[past].format(i=j // 2), buf)
        binding.bind_ortvalue_output(io[present].format(i=j // 2), buf)


def compact_rows(arrays, axis: int, length: int, src: np.ndarray, dst_start: int) -> int:
    """Copy the slots `src` of every array (slot axis `axis`) to dst_start, dst_start + 1, ...; returns the new
    length. The checks and the copy OnnxCache.compact and the layered cache share (no copy for rows in place)."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.arange(dst_start, dst_start + len(src))
    if len(src) and (src[0] < 0 or src[-1] >= length or (src < dst).any() or (np.diff(src) <= 0).any()):
        raise ValueError(f"compact: source slots {src.tolist()} must ascend within [0, {length}) and "
                         f"not lie before their destinations from {dst_start}")
    keep = int(np.searchsorted(src != dst, True))  # rows already in place (a leading run of src == dst)
    if keep < len(src):
        index = (slice(None),) * axis
        for arr in arrays:
            arr[index + (dst[keep:],)] = arr[index + (src[keep:],)]
    return dst_start + len(src)


class OnnxBackend:
    """caps: chains, and tree masks on format 4 artifacts (older ones and the GPU graph have no position_ids/tree_bias
    inputs: their caps say tree_mask=False and a tree forward says why); layer plans run on the layered profile
    (onnx_layered.py)."""

    name = "onnx"

    def __init__(self, manifest: Manifest | str | Path, *, device: Device | str = Device.CPU,
                 threads: int | None = None, verify: bool = True, log=None, fixed_width: int | None = None,
                 cuda_graph: bool = True) -> None:
        """fixed_width: rows of every session run (calls padded to it, longer ones chunked); None: GPU_VERIFY_WIDTH
        for the GPU graph (no pad row: the module docstring), 0 (calls run at their own width) for the others.
        cuda_graph: capture and replay each cache's runs where they can be (CUDA, a fixed width, the KV cache in
        CUDA memory: the module docstring); False runs every call plainly."""
        self.manifest = manifest_with_profile(manifest, Profile.DYNAMIC, verify=verify)
        self.config: ModelConfig = self.manifest.config
        self.io = self.manifest.io
        # format 4 graphs have the position_ids and tree_bias inputs; version 2 ones run chains only
        self.tree_io = self.manifest.raw["format_version"] != CHAIN_FORMAT_VERSION
        self.tree_hint = tree_refusal(self.manifest, self.tree_io)
        if fixed_width is None:
            fixed_width = GPU_VERIFY_WIDTH if self.manifest.pad_row == PAD_ROW_NONE else 0
        if fixed_width < 0:
            raise ValueError(f"fixed_width must be >= 0 (0: calls at their own width), got {fixed_width}")
        self.fixed_width = min(fixed_width, self.config.context_length)
        self.caps = BackendCaps(tree_mask=self.tree_hint is None, layer_plan=False, partial_rollback=True,
                                max_batch_tokens=self.config.context_length, tree_inputs=self.tree_io,
                                tree_hint=self.tree_hint,
                                variance=artifact_variance(self.manifest, self.fixed_width, cpu_info()[1]))
        cuda_graph = cuda_graph and self.fixed_width > 0 and self.io.get("kv_dtype") == "float16"
        self.ort, self.session, self.choice, self.threads = open_session(self.manifest, device, threads, log,
                                                                         cuda_graph=cuda_graph)
        # the cache lives in CUDA memory when CUDA runs the attention: float16 graphs (a float32 graph's
        # GroupQueryAttention falls back to the CPU provider, which must see host buffers to update them in place)
        self.kv_device = "cuda" if self.choice.on_gpu and self.io.get("kv_dtype") == "float16" else "cpu"
        self.cuda_graph = self.kv_device == "cuda" and "enable_cuda_graph" in self.choice.providers[0][1]
        self._no_graph = None  # run options of a run that is not captured (a graph session would capture id 0)
        if self.cuda_graph:
            self._no_graph = self.ort.RunOptions()
            self._no_graph.add_run_config_entry("gpu_graph_id", "-1")
        self._graph_ids = itertools.count(1)
        self._graphs = 0  # graphs captured (each with its buffers, live or pooled)
        self._pool: list[tuple[int, tuple]] = []  # released graph caches: (capacity, (binding, buffers, arrays, slot))
        self._weight_bytes = read_bytes_per_token(self.manifest.model_path)

    def new_cache(self, max_len: int) -> OnnxCache:
        check_capacity(self.config, max_len)
        return OnnxCache(self, max_len)

    def graphs_left(self) -> bool:
        return self._graphs < MAX_CUDA_GRAPHS

    def new_graph(self, binding, rows: int) -> GraphSlot:
        self._graphs += 1
        return GraphSlot(self, binding, rows, next(self._graph_ids))

    def take_graph_buffers(self, capacity: int) -> tuple[int, tuple] | None:
        """(its capacity, the buffers and graph) of the smallest released graph cache that holds `capacity` positions
        (None: there is none)."""
        fits = [i for i, (cap, _) in enumerate(self._pool) if cap >= capacity]
        if not fits:
            return None
        return self._pool.pop(min(fits, key=lambda i: self._pool[i][0]))

    def release_graph_buffers(self, capacity: int, pooled: tuple) -> None:
        self._pool.append((capacity, pooled))

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        """Initializer bytes one decode step reads (read_bytes_per_token)."""
        return self._weight_bytes

    def forward(self, tokens: Tokens, cache: OnnxCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """float32 logits [T, V] for tokens appended at cache.length (slots length + arange(T)); one session run for
        all T positions (with fixed_width: runs of that many rows, _forward_fixed). tree_mask [T, T] (base.py
        contract; format 4 artifacts): RoPE positions length + depth."""
        t = len(tokens)
        if plan is not None:
            raise ValueError("the ONNX backend runs the full model (no layer plans)")
        if t == 0:
            raise ValueError("forward needs at least one token")
        check_room(cache, t)
        if self.fixed_width and tree_mask is None:
            return self._forward_fixed(np.asarray(tokens, dtype=np.int64), cache)
        return self._run(np.asarray(tokens, dtype=np.int64), cache, tree_mask)

    def _forward_fixed(self, tokens: np.ndarray, cache: OnnxCache) -> Logits:
        """Runs of exactly fixed_width rows (the module docstring): chunks of the tokens, each padded with copies of
        its last token; the pad rows' logits are dropped and the cursor advances over the real tokens only. Near the
        end of the model's context (where the RoPE tables end) the last run narrows to what is left."""
        w, out = self.fixed_width, []
        for start in range(0, len(tokens), w):
            chunk = tokens[start:start + w]
            n = len(chunk)
            width = max(n, min(w, self.config.context_length - cache.length))
            padded = np.concatenate([chunk, np.full(width - n, chunk[-1], dtype=np.int64)])
            rows = self._run(padded, cache, None)[:n]
            out.append(rows if len(tokens) <= w else rows.copy())  # a graph's logits buffer is reused by the next
            cache.rollback(cache.length - (width - n))
        return out[0] if len(out) == 1 else np.concatenate(out)

    def _run(self, tokens: np.ndarray, cache: OnnxCache, tree_mask: Mask | None) -> Logits:
        """One session run: tokens appended at cache.length; the cursor advances over all of them."""
        t = len(tokens)
        total = cache.length + t
        if cache.graph is not None and t == self.fixed_width:  # a replay (or the capture) of this cache's graph
            g = cache.graph
            g.ids.update_inplace(tokens.reshape(1, t))
            g.seqlens.update_inplace(np.array([total - 1], dtype=np.int32))
            self.session.run_with_iobinding(cache.binding, g.run_options)
            cache.advance(t)
            return g.logits.numpy()
        b, io = cache.plain_binding(self.session), self.io
        b.bind_cpu_input(io["input_ids"], tokens.reshape(1, t))
        b.bind_cpu_input(io["seqlens_k"], np.array([total - 1], dtype=np.int32))
        b.bind_cpu_input(io["total_length"], np.array(total, dtype=np.int32))
        if self.tree_io:
            pos, bias = tree_feeds(cache.length, t, tree_mask)
            b.bind_cpu_input(io["position_ids"], pos)
            b.bind_cpu_input(io["tree_bias"], bias)
        elif tree_mask is not None:
            raise ValueError(self.tree_hint)
        b.bind_output(io["logits"], "cpu")  # unallocated again: T changes between calls
        self.session.run_with_iobinding(b, self._no_graph)
        logits = b.get_outputs()[0].numpy()
        cache.advance(t)
        return logits


# Weight formats whose matmuls quantize activations to 8 bits (MatMulNBits accuracy level 4, DynamicQuantizeMatMul).
GPU_VERIFY_WIDTH = 16  # rows of every call on the GPU graph (T(16)/T(1) = 1.26 on the H100: docs/accelerators.md)
MAX_CUDA_GRAPHS = 8  # captured graphs per backend (one per set of cache buffers); more caches run without one

INT8_ACTIVATIONS = frozenset({"int8", "int4", "int8-dynamic"})


def tree_refusal(manifest: Manifest, tree_io: bool) -> str | None:
    """Why this artifact may not verify token trees in lossless decoding (None: it may).

    Tree rows equal their chains only up to float rounding (the attention kernel's softmax sums group the ancestors'
    scores differently when siblings sit between them); fp32/fp16 artifacts keep that at ~1e-4 (measured: greedy token
    recycling identical to plain greedy on 18/18 dev prompts x 128 tokens), but 8-bit activation rounding amplifies
    it into different greedy tokens (int4: 12 of 18 prompts diverged). Forward still accepts tree masks on any
    format 4 artifact, for measurement (perf/tree_parity.py)."""
    if not tree_io and manifest.pad_row == PAD_ROW_NONE:
        return (f"{manifest.root.name} is a GPU graph (exported with --gpu), which verifies chains only: CUDA's fused "
                "GroupQueryAttention kernels take no attention bias, so it has no tree inputs; use a chain drafter "
                "such as ngram, or the CPU graph (export without --gpu) for token trees")
    if not tree_io:
        return (f"{manifest.root} was exported before tree attention (format version {CHAIN_FORMAT_VERSION}): "
                "re-export it with `specedge export` to verify token trees on the ONNX backend")
    if manifest.weight_format in INT8_ACTIVATIONS:
        return (f"{manifest.root.name} ({manifest.weight_format}) quantizes activations to 8 bits, which turns the "
                "float rounding between tree and chain attention into different greedy tokens (lossless tree "
                "verification needs an fp32 or fp16 artifact); use a chain drafter such as ngram, or export "
                "--weights fp32")
    return None


GPU_GRAPH_VARIANCE = Variance(
    "is a GPU graph (exported with --gpu: no batch-invariance pad row) run at each call's own width: a token's logits "
    "depend on how many tokens its call verifies (CUDA kernels chosen by row count, float16 attention; on the CPU "
    "provider its one-row paths), which flips greedy tokens where the top two logits are close",
    "the default fixed width (every call padded to 16 rows) or the CPU graph (export without --gpu) decode "
    "losslessly")
OLD_PAD_ROW_VARIANCE = Variance(
    "was exported before the pad row ran through the whole network: on this CPU (no AVX-512) its 4-bit matmuls "
    "round one-token calls differently from verify calls", "re-export it with `specedge export`")


def artifact_variance(manifest: Manifest, fixed_width: int, cpu_flags: Sequence[str]) -> Variance | None:
    """Why an artifact's verify batches may round differently from its one-token calls on this CPU (None: they do not;
    every ONNX backend declares it in caps.variance).

    The GPU graph has no pad row: it is batch-invariant only as OnnxBackend runs it by default, every call padded to
    one fixed width (GPU_VERIFY_WIDTH); at each call's own width (fixed_width=0) it is not, on any device and CPU, in
    any weight format (docs/accelerators.md). An int4 artifact whose pad row runs through attention only (exported
    before io.pad_row) gives one-token calls a 4-bit MatMulNBits with one row, which on CPUs without AVX-512 takes
    onnxruntime's M == 1 kernel and rounds differently from a verify call's rows (docs/onnx.md "Batch invariance")."""
    if manifest.pad_row == PAD_ROW_NONE and not fixed_width:
        return GPU_GRAPH_VARIANCE
    if "avx512f" in cpu_flags or manifest.pad_row != PAD_ROW_ATTENTION:
        return None
    if not any(str(t.get("storage", "")).startswith("nbits4") for t in manifest.tensors.values()):
        return None
    return OLD_PAD_ROW_VARIANCE


def tree_feeds(length: int, t: int, tree_mask: Mask | None) -> tuple[np.ndarray, np.ndarray]:
    """(position_ids int64 [1, T], tree_bias float32 [1, 1, T, T]) for T tokens appended at `length`.

    A chain: positions length + arange(T), bias zero (the graph's causal mask does the rest). A tree (base.py: BFS
    order, mask[i, j] = j is i or an ancestor of i): positions length + depth, bias -inf off the ancestor-or-self
    mask. Ancestors must precede their descendants (GroupQueryAttention stays causal over slots) and node 0 is the
    root."""
    if tree_mask is None:
        return (np.arange(length, length + t, dtype=np.int64).reshape(1, t), np.zeros((1, 1, t, t), np.float32))
    mask = np.asarray(tree_mask, dtype=bool)
    if mask.shape != (t, t) or not mask.diagonal().all() or np.triu(mask, 1).any() or not mask[:, 0].all():
        raise ValueError(f"tree_mask must be [T, T] = [{t}, {t}] ancestor-or-self, nodes in BFS order from the root "
                         f"(lower triangular, true diagonal and first column); got shape {mask.shape}")
    pos = (length + tree_depths(mask)).reshape(1, t)
    bias = np.where(mask, np.float32(0), np.float32(-np.inf)).reshape(1, 1, t, t)
    return pos, bias
