"""ONNX Runtime backend for the layered profile (export/onnx_layered.py): one session per segment, so any LayerPlan.

    tokens ─► embed ─► h ─► layer i (for i in the plan) ─► h ─► head ─► logits      (plan=None: every layer)
                             └ K/V rows i written in place at [length, length + T)

Trees and LoRA-Drop drop steps (format 6 artifacts): every layer takes position_ids (cache length + depth) and an
attn_bias over the cached and new columns; the new columns carry the tree's ancestor mask (onnxrt.tree_feeds) and
a cached column is -inf where that layer wrote no K/V (`LayeredCache.absent`: a drop step replaced the layer there,
docs/algorithms.md 2.5), as the NumPy reference skips such slots. Format 5 artifacts still run chains and plans.
Hidden states stay OrtValues between sessions, as the pair (residual r, delta d) with h = r + d that the next
segment adds inside its fused norm (export/onnx_layered.py: all layers equal the monolithic graph bit for bit); the
seqlens/total inputs are two small OrtValues every layer binding holds, rewritten in place once per forward. KV as
in onnxrt.py: per layer one preallocated buffer bound as both past and present, so a drafter running a plan writes
the planned layers' rows and the verify forward (all layers) overwrites them (docs/algorithms.md 2.3, 2.4: shared KV).
Weights: each layer's tensors live only in that layer's session; initializers several graphs name (RoPE tables,
a tied float head's embedding) are read once into OrtValues and given to every session (add_initializer), so the
whole artifact is in memory once. Threads: all sessions run on the process's one onnxruntime pool (ort_threads.py);
with SPECEDGE_ORT_THREADPOOL=session each owns a pool, and `spinning=False` (default) stops idle pools from
spinning while the next segment's pool works (docs/onnx.md, "Thread pools", has the measurements).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ...models.config import ModelConfig
from ...models.manifest import LAYERED_CHAIN_FORMAT_VERSION, Manifest, Profile, manifest_with_profile
from ..cores import cpu_info, default_threads
from ..kv import LengthCursor
from ..types import Logits, Mask, Tokens
from .base import BackendCaps, LayerPlan, check_capacity, check_room
from .onnx_providers import Device, select_providers
from .ort_threads import session_options
from .onnx_session import import_ort, read_bytes_per_token
from .onnxrt import artifact_variance, compact_rows, tree_feeds, tree_refusal


def _load_external(manifest: Manifest, name: str, graph: Path):
    """The float/int array of initializer `name` as stored in the shared data file (read from `graph`'s proto)."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(graph), load_external_data=False)
    t = next(t for t in model.graph.initializer if t.name == name)
    onnx.external_data_helper.load_external_data_for_tensor(t, str(manifest.root))
    return numpy_helper.to_array(t)


class LayeredCache(LengthCursor):
    """Per-sequence KV buffers and one IOBinding per layer session (past = present = the layer's buffers)."""

    def __init__(self, backend: "OnnxLayeredBackend", capacity: int) -> None:
        ort, c, io = backend.ort, backend.config, backend.io
        self._capacity = capacity
        self._length = 0
        shape = (1, c.n_kv_heads, capacity + int(io.get("kv_pad_rows", 0)), c.head_dim)
        self.seqlens = np.zeros(1, np.int32)  # rewritten in place per forward: the bindings hold views of them
        self.total = np.zeros((), np.int32)
        lens = ort.OrtValue.ortvalue_from_numpy(self.seqlens), ort.OrtValue.ortvalue_from_numpy(self.total)
        self._buffers, self.bindings = [lens], []
        self._arrays: list[np.ndarray] = []  # the memory the K/V OrtValues wrap (no copy): compact writes here
        # absent[layer, slot]: a LoRA-Drop drop step replaced the layer there (no K/V written); its queries skip it
        self.absent = np.zeros((c.n_layers, shape[2]), dtype=bool)
        for i, session in enumerate(backend.layers):
            b = session.io_binding()
            b.bind_output(io["hidden_out"], "cpu")  # first outputs: get_outputs()[:2] is the pair (r, d)
            b.bind_output(io["delta_out"], "cpu")
            b.bind_ortvalue_input(io["seqlens_k"], lens[0])
            b.bind_ortvalue_input(io["total_length"], lens[1])
            for past, present in (("past_key", "present_key"), ("past_value", "present_value")):
                arr = np.zeros(shape, np.float32)
                buf = ort.OrtValue.ortvalue_from_numpy(arr)
                b.bind_ortvalue_input(io[past].format(i=i), buf)
                b.bind_ortvalue_output(io[present].format(i=i), buf)
                self._buffers.append(buf)
                self._arrays.append(arr)
            self.bindings.append(b)

    @property
    def capacity(self) -> int:
        return self._capacity

    def kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys, values) buffers of one layer, [1, n_kv, capacity + pad, head_dim] (the bound memory itself)."""
        return self._arrays[2 * layer], self._arrays[2 * layer + 1]

    def compact(self, src: np.ndarray, dst_start: int) -> None:
        """The accepted path of a tree into place, in every layer (onnxrt.OnnxCache.compact), absent marks too."""
        compact_rows([self.absent], 1, self._length, src, dst_start)
        self._length = compact_rows(self._arrays, 2, self._length, src, dst_start)


class OnnxLayeredBackend:
    """caps: chains, layer plans (any ascending subset, early exit), hidden-state taps; on format 6 artifacts also
    LoRA-Drop drop steps (LayerPlan.reuse) and tree masks (lossless trees on fp32/fp16 weights, as onnxrt.py)."""

    name = "onnx-layered"

    def __init__(self, manifest: Manifest | str | Path, *, device: Device | str = Device.CPU,
                 threads: int | None = None, verify: bool = True, log=None, spinning: bool = False) -> None:
        self.manifest = manifest_with_profile(manifest, Profile.LAYERED, verify=verify)
        self.config: ModelConfig = self.manifest.config
        self.io = self.manifest.io
        self.ort = ort = import_ort()
        self.threads = default_threads(threads)
        self.choice = select_providers(device, ort.get_available_providers(), threads=self.threads)
        if log is not None and Device(device) is Device.AUTO:
            log(self.choice.note)
        self.spinning = spinning
        seg, root = self.manifest.raw["segments"], self.manifest.root
        # one OrtValue per shared initializer; the arrays must outlive the sessions (ORT does not copy them)
        self._shared = {n: ort.OrtValue.ortvalue_from_numpy(_load_external(self.manifest, n, self._holder(n)))
                        for n in seg["shared"]}
        self.embed = self._session(root / seg["embed"])
        self.layers = [self._session(root / f) for f in seg["layers"]]
        self.head = self._session(root / seg["head"])
        self._layer_bytes = [read_bytes_per_token(root / f) for f in seg["layers"]]
        self._edge_bytes = read_bytes_per_token(root / seg["embed"]) + read_bytes_per_token(root / seg["head"])
        # format 6 layers take position_ids and attn_bias (trees, drop steps); format 5 ones run chains and plans
        self.attn_io = self.manifest.raw["format_version"] != LAYERED_CHAIN_FORMAT_VERSION
        self.reuse_hint = None if self.attn_io else (
            f"{self.manifest.root} was exported before LoRA-Drop drop steps and trees ran on the layered profile "
            f"(format version {LAYERED_CHAIN_FORMAT_VERSION}): re-export it with `specedge export --profile layered`")
        self.tree_hint = self.reuse_hint or tree_refusal(self.manifest, True)
        self.caps = BackendCaps(tree_mask=self.tree_hint is None, layer_plan=True, layer_reuse=self.attn_io,
                                partial_rollback=True, max_batch_tokens=self.config.context_length,
                                tree_inputs=self.attn_io, tree_hint=self.tree_hint, reuse_hint=self.reuse_hint,
                                variance=artifact_variance(self.manifest, 0, cpu_info()[1]))

    def _holder(self, name: str) -> Path:
        """A segment graph that holds initializer `name` (the first layer for RoPE tables, else the head; a RoPE
        only later layers run, models/rope.py, is in one of them)."""
        import onnx
        seg = self.manifest.raw["segments"]
        for f in (seg["layers"][0], seg["head"], seg["embed"], *seg["layers"][1:]):
            g = onnx.load(str(self.manifest.root / f), load_external_data=False).graph
            if any(t.name == name for t in g.initializer):
                return self.manifest.root / f
        raise ValueError(f"{self.manifest.root}: shared initializer {name!r} is in no segment graph; re-export")

    def _session(self, path: Path):
        import onnx
        ort = self.ort
        opts, self.threads = session_options(ort, self.threads, spinning=self.spinning)
        opts.enable_cpu_mem_arena = False  # 32 arenas each grown by prefill: +93 MiB; no speed change measured
        opts.enable_mem_pattern = False  # 10-14 MiB less after a prefill; no speed change measured
        names = {t.name for t in onnx.load(str(path), load_external_data=False).graph.initializer}
        for name, value in self._shared.items():
            if name in names:
                opts.add_initializer(name, value)
        return ort.InferenceSession(str(path), sess_options=opts, providers=[p for p, _ in self.choice.providers],
                                    provider_options=[o for _, o in self.choice.providers])

    def new_cache(self, max_len: int) -> LayeredCache:
        check_capacity(self.config, max_len)
        return LayeredCache(self, max_len)

    def weight_bytes(self, plan: LayerPlan | None = None) -> int:
        """Initializer bytes one decode step under `plan` reads: the planned layers (a drop step's low-rank factors
        instead of its layer), the embedding row and the head."""
        plan = plan or LayerPlan()
        layers, reused = plan.resolve(self.config.n_layers), {r.layer for r in plan.reuse}
        low_rank = sum(int(r.a.nbytes + r.b.nbytes) for r in plan.reuse)
        return self._edge_bytes + low_rank + sum(self._layer_bytes[i] for i in layers if i not in reused)

    def forward(self, tokens: Tokens, cache: LayeredCache, *, tree_mask: Mask | None = None,
                plan: LayerPlan | None = None) -> Logits:
        """float32 logits [T, V] for tokens appended at cache.length, through the plan's layers (all by default)."""
        return self._head(*self._run(tokens, cache, plan, tree_mask, ())[0])

    def hidden(self, tokens: Tokens, cache: LayeredCache, *, plan: LayerPlan | None = None,
               tree_mask: Mask | None = None, taps: tuple[int, ...] = ()) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """(h [T, D] after the plan's last layer, before the final norm; {n: h after the first n layers}) for tokens
        appended at cache.length; the planned layers write their K/V rows and cache.length grows by T."""
        pair, tapped = self._run(tokens, cache, plan, tree_mask, taps)
        return _sum(pair), tapped

    def logits_from_hidden(self, h: np.ndarray, rows: np.ndarray | None = None) -> Logits:
        """Final norm + LM head: [T, D] -> float32 logits [T, V]. rows (a VocabTrim subset) needs an artifact with
        a trimmed head, which this export does not write yet."""
        if rows is not None:
            raise ValueError("this layered artifact has no trimmed LM head for a vocabulary subset (rows=...); "
                             "re-export with a VocabTrim head or call logits_from_hidden(h) for the full vocabulary")
        h = np.ascontiguousarray(h, dtype=np.float32)[None]
        value = self.ort.OrtValue.ortvalue_from_numpy
        return self._head(value(h), value(np.zeros_like(h)))  # r + 0 = h exactly: same logits as forward

    def _run(self, tokens: Tokens, cache: LayeredCache, plan: LayerPlan | None, tree_mask: Mask | None,
             taps: tuple[int, ...]):
        """((r, d) OrtValues [1, T, D] with h = r + d, taps) through embed and the plan's layers; advances the
        cache."""
        plan = plan or LayerPlan()
        layers, reuse = plan.resolve(self.config.n_layers), {r.layer: r for r in plan.reuse}
        if (tree_mask is not None or reuse) and not self.attn_io:
            raise ValueError(self.reuse_hint)
        t = len(tokens)
        if t == 0:
            raise ValueError("forward needs at least one token")
        check_room(cache, t)
        io = self.io
        start, total = cache.length, cache.length + t
        cache.seqlens[0] = total - 1  # the bindings see these through their OrtValues
        cache.total[()] = total
        ids = np.asarray(tokens, dtype=np.int64).reshape(1, t)
        value = self.ort.OrtValue.ortvalue_from_numpy
        r = self.embed.run_with_ort_values([io["hidden_out"]], {io["input_ids"]: value(ids)})[0]
        pair = (r, value(np.zeros((1, t, self.config.d_model), np.float32)))
        tapped = {0: _sum(pair)} if 0 in taps else {}
        feeds = _AttentionFeeds(self, cache, tokens, tree_mask) if self.attn_io else None
        for i in layers:
            if i in reuse:  # LoRA-Drop drop step: a low-rank delta in NumPy, no attention, no K/V write
                h = _sum(pair)
                pair = (value(h[None]), value(np.ascontiguousarray(reuse[i].delta(h), dtype=np.float32)[None]))
                cache.absent[i, start:total] = True
            else:
                pair = self._layer(i, cache, pair, feeds)
            if i + 1 in taps:
                tapped[i + 1] = _sum(pair)
        cache.advance(t)
        return pair, tapped

    def _layer(self, i: int, cache: LayeredCache, pair, feeds: "_AttentionFeeds | None"):
        """Layer i's session on h = r + d; returns its (r', d') and writes its K/V rows (clearing absent marks)."""
        io, b = self.io, cache.bindings[i]
        if feeds is not None:
            feeds.bind(b, i)
            cache.absent[i, feeds.length:feeds.length + feeds.t] = False
        b.bind_ortvalue_input(io["hidden_in"], pair[0])
        b.bind_ortvalue_input(io["delta_in"], pair[1])
        b.bind_output(io["hidden_out"], "cpu")
        b.bind_output(io["delta_out"], "cpu")
        self.layers[i].run_with_iobinding(b)
        return tuple(b.get_outputs()[:2])

    def _head(self, r, d) -> Logits:
        io = self.io
        return self.head.run_with_ort_values([io["logits"]], {io["hidden_in"]: r, io["delta_in"]: d})[0].numpy()


class _AttentionFeeds:
    """position_ids and the per-layer attn_bias of one forward (format 6): zero over the cached columns but -inf at
    a layer's absent slots, the tree's ancestor mask (onnxrt.tree_feeds) over the new ones. Layers with the same
    absent slots share one OrtValue."""

    def __init__(self, backend: OnnxLayeredBackend, cache: LayeredCache, tokens: Tokens, tree_mask: Mask | None):
        length, t = cache.length, len(tokens)
        pos, new = tree_feeds(length, t, tree_mask)
        self.value, self.io, self.cache = backend.ort.OrtValue.ortvalue_from_numpy, backend.io, cache
        self.length, self.t = length, t
        self.pos = self.value(pos)
        self.base = np.zeros((1, 1, t, length + t), np.float32)
        self.base[..., length:] = new
        self.biases: dict[bytes, object] = {}

    def bind(self, binding, layer: int) -> None:
        gone = np.flatnonzero(self.cache.absent[layer, :self.length])
        key = gone.tobytes()
        if key not in self.biases:
            bias = self.base if not len(gone) else self.base.copy()
            bias[..., gone] = -np.inf
            self.biases[key] = self.value(bias)
        binding.bind_ortvalue_input(self.io["position_ids"], self.pos)
        binding.bind_ortvalue_input(self.io["attn_bias"], self.biases[key])


def _sum(pair) -> np.ndarray:
    """h [T, D] = r + d (float32, the same add the next segment's fused norm does)."""
    return pair[0].numpy()[0] + pair[1].numpy()[0]
