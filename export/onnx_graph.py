"""Build the decoder graph (dynamic profile) from canonical weights with our own builder.

One graph serves prefill, plain decoding, verification of k+1 chain positions and of a token tree (format 4): the
new tokens are written at cache slots `L + arange(T)` with `L = seqlens_k + 1 - T`, for any cache length L; their
RoPE positions come from the `position_ids` input (L + arange(T) for a chain, L + depth for a tree) and the
`tree_bias` input (zeros for a chain) masks the non-ancestors among the new tokens on top of the causal mask
(docs/algorithms.md 1.4 "Tree attention").
One zero pad row runs through the whole network, so every node sees T + 1 >= 2 rows (batch invariance: pad_rows()).
Attention is com.microsoft GroupQueryAttention with shared past/present buffers: the runtime binds the same
preallocated [1, n_kv, max_ctx, head_dim] OrtValue as past_key.i and present_key.i, so the op writes only the T
new rows in place (no full-cache copy per step). Rollback is just a smaller seqlens_k on the next call.

The block is the one the config declares, emitted by export/onnx_block.py (the math of runtime/backends/numpy_ref.py);
this module adds the dynamic profile's plumbing: fused residual-add + RMSNorm nodes, GroupQueryAttention with its
RoPE tables (models/rope.py; one pair per distinct RoPE, do_rotary=0 on a layer without RoPE) and, for a layer with
a sliding window, the tree bias plus a window mask computed from the positions (`window_bias`). q/k norms split the
packed projection, norm each head and pack it again. Partial rotary (phi4-mini) is GroupQueryAttention's own: its
cos/sin tables are rot/2 wide, so it rotates the first rot dims of each head (check_dynamic: rot/2 a multiple of 8).

The GPU graph (ExportOptions kv_dtype=FLOAT16, trees=False, pad_row=False; export/onnx_export.gpu_options) is the same
network for CUDA's GroupQueryAttention: q|k|v Cast to float16 before the op and its output back to float32, cos/sin
tables and the past/present KV in float16 (CUDA's kernel takes no float32); no position_ids / tree_bias inputs (CUDA's
fused attention kernels take no attention bias): a chain-only graph, format 2, RoPE positions from seqlens_k; and no
pad row: the row serves the CPU kernels' batch invariance only, and CUDA's GroupQueryAttention computes wrong outputs
when its seqlens_k / total_sequence_length come from other nodes (the pad row's Adds) rather than from graph inputs
(onnxruntime-gpu 1.31.1; docs/accelerators.md). Sliding-window layers are refused there (they need the bias).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnx

from ..models import rope as rope_tables
from ..models.block import UnsupportedVariant
from ..models.config import ModelConfig
from ..models.rope import Rope
from .onnx_block import BlockEmitter, block, embed, norm_weight, out_projection, qkv_projection, qkv_sizes
from .onnx_ir import MS_DOMAIN, GraphBuilder
from .onnx_linear import ExportOptions, KVDtype, TensorRecord, WeightFormat, WeightSource, linear


PAD_ROWS = 1  # zero rows appended after the embedding, carried through every layer, cut after the head (pad_rows())
PAD_ROW = "network"  # the manifest's io.pad_row: where the pad row runs (artifacts without it: inside attention only)


def qkv_width(cfg: ModelConfig) -> int:
    return (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim


@dataclass(frozen=True)
class GraphIO:
    """Names of the graph's inputs and outputs (copied into the manifest; the runtime reads them from there)."""

    input_ids: str = "input_ids"  # int64 [1, T]
    seqlens_k: str = "seqlens_k"  # int32 [1]: cache length + T - 1
    total_length: str = "total_sequence_length"  # int32 scalar: cache length + T
    position_ids: str = "position_ids"  # int64 [1, T]: RoPE positions, cache length + depth (a chain: + arange(T))
    tree_bias: str = "tree_bias"  # float32 [1, 1, T, T]: 0 where key j is query i or its ancestor, -inf elsewhere
    logits: str = "logits"  # float32 [T, V]
    past_key: str = "past_key.{i}"  # float32 [1, n_kv, max_ctx, head_dim], bound to the same buffer as present_key
    past_value: str = "past_value.{i}"
    present_key: str = "present_key.{i}"
    present_value: str = "present_value.{i}"


@dataclass(frozen=True)
class AttnFeeds:
    """Per-call tensors GroupQueryAttention takes, built once per graph (padded: see pad_rows())."""

    seqlens: str  # int32 [1]
    total: str  # int32 scalar
    positions: str  # int64 [1, T + 1]
    bias: str  # float32 [1, 1, T + 1, L + T + 1]
    tables: Mapping[Rope, tuple[str, str]] = field(default_factory=dict)  # cos, sin [positions, rot/2] per RoPE
    windowed: Mapping[int, str] = field(default_factory=dict)  # window -> bias with the window mask added


def check_dynamic(cfg: ModelConfig, profile: str = "the dynamic ONNX profile") -> None:
    """Refuse the declared variants GroupQueryAttention cannot run. Partial rotary is its own: the op rotates the
    first 2 * cos_cache.shape[1] dims of each head and passes the rest through, but takes only tables whose width
    (rotary dim / 2) is a multiple of 8 (onnxruntime's GroupQueryAttention check); its CPU kernel also needs the
    head size to be a multiple of 16 (every released model's is; a tiny test model's may not be)."""
    if cfg.head_dim % 16:
        raise UnsupportedVariant(f"{profile} cannot run head size {cfg.head_dim} of {cfg.name or cfg.arch}: "
                                 "onnxruntime's GroupQueryAttention needs a multiple of 16; use the static profile "
                                 "or the NumPy backend")
    rot = rope_tables.rotary_dim(cfg)
    if rot != cfg.head_dim and (rot // 2) % 8:
        raise UnsupportedVariant(f"{profile} does not build the declared block variant rotary_fraction="
                                 f"{cfg.block.rotary_fraction} of {cfg.name or cfg.arch}: GroupQueryAttention needs "
                                 f"the rotary dim / 2 ({rot // 2}) to be a multiple of 8; use the static profile or "
                                 "the NumPy backend")


def build_decoder(cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO = GraphIO()
                  ) -> tuple[onnx.ModelProto, dict[str, TensorRecord]]:
    """The whole decoder: embed -> pad row -> n_layers blocks -> final norm -> LM head -> cut the pad row; returns
    (model, tensor records). Every node between the two pad-row nodes sees T + 1 rows (pad_rows())."""
    check_dynamic(cfg)
    if not opts.trees and cfg.block.windows():
        raise UnsupportedVariant(f"a chain-only (GPU) graph has no attention bias to carry the sliding window(s) "
                                 f"{list(cfg.block.windows())} of {cfg.name or cfg.arch}; export the CPU graph")
    g = GraphBuilder(cfg.name or cfg.arch)
    records: dict[str, TensorRecord] = {}
    ids = g.input(io.input_ids, np.int64, [1, "T"])
    seqlens = g.input(io.seqlens_k, np.int32, [1])
    total = g.input(io.total_length, np.int32, [])
    pad = PAD_ROWS if opts.pad_row else 0
    tables = rope_tables_for(g, cfg, range(cfg.n_layers), attn_dtype(opts), pad)
    pos, bias = tree_inputs(g, io, ids, total, pad) if opts.trees else ("", "")
    if opts.pad_row:
        seqlens, total = padded_lengths(g, seqlens, total)
    windowed = window_biases(g, cfg, range(cfg.n_layers), pos, bias) if opts.trees else {}
    if opts.trees and opts.kv_dtype is not KVDtype.FLOAT32:  # GroupQueryAttention's bias has the attention's dtype
        bias = cast(g, bias, opts, "tree/bias_cast")
        windowed = {w: cast(g, b, opts, f"window_{w}/bias_cast") for w, b in windowed.items()}
    feeds = AttnFeeds(seqlens, total, pos, bias, tables, windowed)
    em = DynamicBlocks(g, cfg, src, opts, records, io=io, feeds=feeds)
    h = embed(g, cfg, src, opts, ids, records)
    h = pad_rows(g, cfg, h) if opts.pad_row else h
    with g.scope("layers.0"):
        x = rms_norm(g, cfg, src, h, "layers.0.attn_norm", "attn_norm")
    for i in range(cfg.n_layers):
        after = f"layers.{i + 1}.attn_norm" if i + 1 < cfg.n_layers else "norm"
        with g.scope(f"layers.{i}"):
            h, m = block(em, i, x, h)
            x, h = skip_rms_norm(g, cfg, src, m, h, after, "next_norm")
    head(g, cfg, src, opts, io, x, records)
    return g.model(producer="specedge", doc=f"{cfg.arch} decoder, {opts.fmt.value} weights"), records


@dataclass
class DynamicBlocks(BlockEmitter):
    """The dynamic (and layered) profile's emitter: MatMulNBits-capable linears, fused norms, GroupQueryAttention."""

    io: GraphIO = GraphIO()
    feeds: AttnFeeds | None = None

    def linear(self, x: str, parts: list[str], prefix: str, name: str) -> str:
        y, recs = linear(self.g, x, parts, self.src, self.opts, prefix, name)
        self.records.update(recs)
        return y

    def norm(self, x: str, tensor: str, name: str) -> str:
        return rms_norm(self.g, self.cfg, self.src, x, tensor, name)

    def add_norm(self, delta: str, h: str, tensor: str, name: str) -> tuple[str, str]:
        return skip_rms_norm(self.g, self.cfg, self.src, delta, h, tensor, name)

    def attention(self, i: int, x: str) -> str:
        return attention(self, i, x)


def attn_dtype(opts: ExportOptions) -> np.dtype:
    """The dtype GroupQueryAttention computes in: its q|k|v, cos/sin tables, bias and KV cache."""
    return np.dtype(opts.kv_dtype.value)


def cast(g: GraphBuilder, x: str, opts: ExportOptions, name: str) -> str:
    """x (float32) in the attention's dtype."""
    return g.op1("Cast", [x], name, to=onnx.helper.np_dtype_to_tensor_dtype(attn_dtype(opts)))


def rope_tables_for(g: GraphBuilder, cfg: ModelConfig, layers, dtype: np.dtype = np.dtype(np.float32),
                    pad: int = PAD_ROWS) -> dict[Rope, tuple[str, str]]:
    """cos/sin tables of the RoPEs `layers` run."""
    used = {rope_tables.layer_rope(cfg, i) for i in layers} - {None}
    return {r: rope_table_pair(g, cfg, r, dtype, pad) for r in rope_tables.distinct_ropes(cfg) if r in used}


def rope_table_pair(g: GraphBuilder, cfg: ModelConfig, rope: Rope, dtype: np.dtype = np.dtype(np.float32),
                    pad: int = PAD_ROWS) -> tuple[str, str]:
    """cos/sin [context_length + pad, rot/2] (the pad row's position too), angles in float64 as the NumPy reference
    computes them, stored in `dtype`; named by models/rope.table_name ("rope.cos" for the config's own RoPE)."""
    cos, sin = rope_tables.cos_sin(rope, np.arange(cfg.context_length + pad))
    return (g.const(rope_tables.table_name(cfg, rope, "cos"), cos.astype(dtype)),
            g.const(rope_tables.table_name(cfg, rope, "sin"), sin.astype(dtype)))


def window_biases(g: GraphBuilder, cfg: ModelConfig, layers, pos: str, bias: str) -> dict[int, str]:
    """{window: bias + window mask} for the sliding windows `layers` use (none: {})."""
    windows = sorted({cfg.block.layer(i).window for i in layers} - {None})
    return {w: window_bias(g, pos, bias, w) for w in windows}


def window_bias(g: GraphBuilder, pos: str, bias: str, window: int) -> str:
    """The padded attention bias [1, 1, T + 1, L + T + 1] with -inf where a key is `window` or more positions behind
    its query: a query's position is its position_ids entry; a key in column c < L (committed) is at position c, the
    new and pad columns at their rows' positions (a tree's depths included).

        positions [1, T + 1] ─► Reshape [T + 1, 1] ─────────────────────┐
        Range(0, L) ─► Concat(positions) = key positions [L + T + 1] ─► Sub ─► >= window ─► Where(-inf, 0) ─► Add(bias)
    """
    with g.scope(f"window_{window}"):
        dims = g.op1("Shape", [bias], "dims", start=2, end=4)  # [T + 1, L + T + 1]
        rows, cols = g.op("Split", [dims], "rows_cols", n_out=2, axis=0, num_outputs=2)
        cached = g.op1("Squeeze", [g.op1("Sub", [cols, rows], "cached")], "cached_scalar")
        zero, one = (g.const_once(f"window.{v}", np.array(v, np.int64)) for v in (0, 1))
        flat = g.op1("Reshape", [pos, g.const_once("window.flat", np.array([-1], np.int64))], "query_positions")
        keys = g.op1("Concat", [g.op1("Range", [zero, cached, one], "cached_positions"), flat], "key_positions",
                     axis=0)
        queries = g.op1("Reshape", [pos, g.const_once("window.column", np.array([-1, 1], np.int64))], "query_column")
        behind = g.op1("Sub", [queries, keys], "behind")  # [T + 1, L + T + 1]
        far = g.op1("GreaterOrEqual", [behind, g.const(f"window.{window}.size", np.array(window, np.int64))], "far")
        mask = g.op1("Where", [far, g.const_once("window.neg_inf", np.array(-np.inf, np.float32)),
                               g.const_once("window.zero_f", np.array(0.0, np.float32))], "mask")
        return g.op1("Add", [bias, mask], "bias")


def pad_rows(g: GraphBuilder, cfg: ModelConfig, h: str, name: str = "pad_row", axis: int = 1) -> str:
    """Hidden states [1, T, D] (axis 1; [T, D]: axis 0) with PAD_ROWS zero rows appended: [1, T + 1, D].

        h [1, T, D] ─► Concat(zeros [1, 1, D]) ─► [1, T + 1, D] ─► every block ... LM head ─► unpad_rows ─► [T, V]

    Batch invariance (docs/onnx.md "Batch invariance"): onnxruntime's CPU kernels take a special path for one row
    that rounds differently from their path for two or more, where each row's result does not depend on the row
    count, its position or the other rows: MLAS's probs x V GEMV inside GroupQueryAttention (any CPU), and 4-bit
    MatMulNBits' M == 1 GEMV on AVX2 without AVX-512 (max 1e-6 per node; int8 activation rounding downstream turns
    that into different greedy tokens). With the pad row every node sees >= 2 rows, so a verify call over T tokens
    and T one-token calls give bit-identical logits. In attention the pad row sits at position L + T: no real row
    attends to it (causal), its K/V land in the cache's spare row (kv_pad_rows) and the next call overwrites them.
    The pad row's own values are never read by a real row.
    """
    shape = (1,) * axis + (PAD_ROWS, cfg.d_model)
    zeros = g.const_once(f"pad_row.zeros.{'x'.join(map(str, shape))}", np.zeros(shape, np.float32))
    return g.op1("Concat", [h, zeros], name, axis=axis)


def unpad_rows(g: GraphBuilder, x: str, axis: int, name: str = "unpad_row", outputs: tuple[str, ...] = ()) -> str:
    """x without its last PAD_ROWS entries along `axis` (the real T rows)."""
    return g.op("Slice", [x, g.const_once("pad_row.start", np.array([0], np.int64)),
                          g.const_once("pad_row.end", np.array([-PAD_ROWS], np.int64)),
                          g.const_once(f"pad_row.axis.{axis}", np.array([axis], np.int64))], name, outputs=outputs)[0]


def padded_lengths(g: GraphBuilder, seqlens: str, total: str) -> tuple[str, str]:
    """seqlens_k and total_sequence_length as GroupQueryAttention sees them: one pad row past the T real ones."""
    with g.scope("attn_pad"):
        pad = np.int32(PAD_ROWS)
        return (g.op1("Add", [seqlens, g.const("attn_pad.rows", np.array([pad]))], "seqlens_k"),
                g.op1("Add", [total, g.const("attn_pad.rows_scalar", np.array(pad))], "total_length"))


def tree_inputs(g: GraphBuilder, io: GraphIO, ids: str, total: str, pad: int = PAD_ROWS) -> tuple[str, str]:
    """position_ids [1, T + 1] and attention_bias [1, 1, T + 1, L + T + 1] as GroupQueryAttention sees them, from the
    graph inputs over the T real tokens: the pad row (see pad_rows()) gets position L + T and zero bias; the
    committed columns [0, L) get zero bias (every node sees the whole cache). pad=0 (a graph without the pad row):
    [1, T] and [1, 1, T, L + T].

        position_ids [1, T] ──────────────────────► Concat(L + T) ──► [1, T + 1]
        tree_bias [1, 1, T, T] ─► Pad(left L columns, 1 row and 1 column at the end, zeros) ──► [1, 1, T + 1, L + T + 1]
    """
    pos = g.input(io.position_ids, np.int64, [1, "T"])
    bias = g.input(io.tree_bias, np.float32, [1, 1, "T", "T"])
    with g.scope("tree"):
        tot = g.op1("Reshape", [g.op1("Cast", [total], "total", to=onnx.TensorProto.INT64),
                                g.const("tree.one_by_one", np.array([1, 1], np.int64))], "total_2d")  # [1, 1]: L + T
        if pad:
            pos = g.op1("Concat", [pos, tot], "pad_position", axis=1)
        t = g.op1("Shape", [ids], "t", start=1, end=2)
        cached = g.op1("Sub", [g.op1("Reshape", [tot, g.const("tree.flat", np.array([1], np.int64))], "total_1d"), t],
                       "cached")  # [1]: L
        pads = g.op1("Concat", [g.const("tree.pads_begin", np.zeros(3, np.int64)), cached,
                                g.const("tree.pads_end", np.array([0, 0, pad, pad], np.int64))],
                     "pads", axis=0)
        bias = g.op1("Pad", [bias, pads], "bias")  # constant 0
    return pos, bias


def rms_norm(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, x: str, tensor: str, name: str) -> str:
    """The declared RMSNorm of x over its last axis (weight `tensor`, its (1 + w) form for gemma-style norms)."""
    return g.op1("SimplifiedLayerNormalization", [x, norm_weight(g, cfg, src, tensor)], name,
                 axis=-1, epsilon=float(cfg.rms_eps), stash_type=1)


def skip_rms_norm(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, delta: str, h: str, tensor: str,
                  name: str) -> tuple[str, str]:
    """(RMSNorm(h + delta), h + delta) in one node: a residual Add and the next norm fused."""
    path = g.path(name)
    out = g.op("SkipSimplifiedLayerNormalization", [delta, h, norm_weight(g, cfg, src, tensor)], name,
               outputs=[path + "/out0", "", "", path + "/residual"], domain=MS_DOMAIN, epsilon=float(cfg.rms_eps))
    return out[0], out[3]


def attention(em: DynamicBlocks, i: int, x: str) -> str:
    """Fused q|k|v projection, GroupQueryAttention on the packed QKV (RoPE inside, in-place KV), output projection.
    x carries the pad row (pad_rows()): T + 1 rows, the last at position L + T.

        x ─► qkv_proj ─(+ q|k|v bias)─(q/k norm)─► GroupQueryAttention ─► o_proj
          past_key.i, past_value.i ────────────────────┘      └─► present_key.i, present_value.i (same buffers)

    Batch invariance: onnxruntime's CPU GroupQueryAttention multiplies probs x V with MLAS, which takes a GEMV path
    when the op sees one row and a GEMM path for two or more; with the pad row it always sees >= 2 (pad_rows()).
    Its K/V land at position L + T (beyond the cursor; the next call overwrites them); the runtime allocates
    PAD_ROWS extra cache rows for it, and seqlens/total/positions/bias count it (padded_lengths, tree_inputs).
    Trees: position_ids (RoPE) and attention_bias (added to the scores before the causal softmax) come from
    tree_inputs(); onnxruntime 1.31's CPU kernel honours both with the pad row. A zero bias adds exactly nothing, so
    chains stay bit-identical across T; a tree node off the first root path gets the same terms at other slots of
    the probs x V reduction, equal to its chain up to float rounding (~1e-6 relative in fp32).
    The layer's RoPE picks its cos/sin tables (none: do_rotary=0); a sliding window swaps in its windowed bias.
    The GPU graph (module docstring): Cast to float16 around the op, float16 KV, no positions or bias (chains: RoPE
    positions from seqlens_k), no pad row.
    """
    g, cfg, io, feeds, opts = em.g, em.cfg, em.io, em.feeds, em.opts
    qkv = qkv_projection(em, i, x)
    if cfg.block.qk_norm:
        qkv = _qk_norm(em, i, qkv)
    half = opts.kv_dtype is not KVDtype.FLOAT32
    if half:
        qkv = cast(g, qkv, opts, "qkv_cast")
    kv_shape, dt = [1, cfg.n_kv_heads, "max_ctx", cfg.head_dim], attn_dtype(opts)
    past_k = g.input(io.past_key.format(i=i), dt, kv_shape)
    past_v = g.input(io.past_value.format(i=i), dt, kv_shape)
    present_k = g.output(io.present_key.format(i=i), dt, kv_shape)
    present_v = g.output(io.present_value.format(i=i), dt, kv_shape)
    rope = rope_tables.layer_rope(cfg, i)
    cos, sin = ("", "") if rope is None else feeds.tables[rope]
    window = cfg.block.layer(i).window
    bias = feeds.bias if window is None else feeds.windowed[window]
    gqa_in = [qkv, "", "", past_k, past_v, feeds.seqlens, feeds.total, cos, sin, feeds.positions, bias]
    while gqa_in[-1] == "":  # omitted trailing optional inputs (a chain-only graph: no positions, no bias)
        gqa_in.pop()
    attn = g.op("GroupQueryAttention", gqa_in, "gqa", outputs=[g.path("gqa") + "/out0", present_k, present_v],
                domain=MS_DOMAIN, num_heads=cfg.n_heads, kv_num_heads=cfg.n_kv_heads, do_rotary=int(rope is not None),
                rotary_interleaved=0, scale=float(1.0 / np.sqrt(cfg.head_dim)))[0]
    if half:
        attn = g.op1("Cast", [attn], "out_cast", to=onnx.TensorProto.FLOAT)
    return out_projection(em, i, attn)


def _qk_norm(em: DynamicBlocks, i: int, qkv: str) -> str:
    """Per-head RMSNorm of q and k inside the packed projection.

        qkv ─► Split ─┬─ q ─► Reshape [1, T, H, hd] ─► norm(q_norm) ─► Reshape [1, T, H hd] ─┐
                      ├─ k ─► Reshape [1, T, KV, hd] ─► norm(k_norm) ─► Reshape ─────────────┼─► Concat ─► qkv
                      └─ v ──────────────────────────────────────────────────────────────────┘
    """
    g, cfg, p = em.g, em.cfg, f"layers.{i}"
    q, k, v = g.op("Split", [qkv, qkv_sizes(em)], "split_qkv", n_out=3, axis=-1)
    flat = g.const_once("attn.flat_heads", np.array([0, 0, -1], np.int64))
    heads = g.const_once("attn.heads", np.array([0, 0, -1, cfg.head_dim], np.int64))
    normed = []
    for name, t in (("q", q), ("k", k)):
        x = em.norm(g.op1("Reshape", [t, heads], f"{name}_heads"), f"{p}.{name}_norm", f"{name}_norm")
        normed.append(g.op1("Reshape", [x, flat], f"{name}_flat"))
    return g.op1("Concat", [*normed, v], "qk_normed", axis=-1)


def head(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO, h: str,
         records: dict[str, TensorRecord]) -> str:
    """LM head on the final-normed hidden states with the pad row (the last block applied `norm`); logits [T, V].
    A float tied head reuses the embedding table through Gemm(transB).

        x [1, T + 1, D] ─► Squeeze ─► lm_head ─► [T + 1, V] ─► unpad_rows ─► logits [T, V]
    """
    axes = g.const("head.squeeze_axes", np.array([0], np.int64))
    x = g.op1("Squeeze", [h, axes], "squeeze")
    name = "embed" if cfg.tied_embeddings else "lm_head"
    if opts.fmt in (WeightFormat.FP32, WeightFormat.FP16) and cfg.tied_embeddings:
        table = "embed.weight" if opts.fmt is WeightFormat.FP32 else g.op1("Cast", ["embed.weight"], "lm_head/cast",
                                                                            to=1)
        y = g.op1("Gemm", [x, table], "lm_head", transB=1)
    else:
        y, recs = linear(g, x, [name], src, opts, "lm_head", "lm_head")
        records["lm_head"] = recs[name]  # tied: the embedding table, stored a second time in the head's format
    if opts.pad_row:
        unpad_rows(g, y, 0, "logits", outputs=(io.logits,))
    else:  # the graph output keeps its name
        g.op("Identity", [y], "logits", outputs=(io.logits,))
    g.output(io.logits, np.float32, ["T", cfg.vocab_size])
    return io.logits
