"""The static-shape decoder graph (profile "static"): every dimension fixed, standard ai.onnx ops only, for the NPU
execution providers (QNN, CoreML, XNNPACK) that compile a graph for one shape and take no com.microsoft ops.

    input_ids       int64   [1, W]          W = verify width (k + 1), C = max context, KV = n_kv_heads
    position_ids    int64   [1, W]          absolute positions, all < C
    attention_bias  float32 [1, 1, W, C]    0 where row i may read slot s, MASK_VALUE elsewhere
    past_key.i      float32 [1, KV, C, hd]  the runtime's cache buffers; slot s holds position s
    past_value.i    float32 [1, KV, C, hd]
    logits          float32 [1, W, V]
    new_key.i       float32 [1, KV, W, hd]  the W rows' rotated keys; the runtime copies the real rows into slots
    new_value.i     float32 [1, KV, W, hd]  [L, L + t) of its buffers after the call

Slot = position. In every layer the W new rows are scattered into a copy of the cache at their own positions
(ScatterElements) and each row attends over all C slots; the bias (built by the runtime) admits the slots up to the
row's own position, which is "the committed cache, then causal over the new rows" in one mask. Consequences:
- a token at position p meets the same keys at the same slot indices whether it comes in a verify batch or alone,
  and masked slots get probability exactly 0, so verify logits equal one-token logits bit for bit;
- rows past the cursor (rejected drafts, stale data) sit in masked slots: rollback only moves the cursor;
- a chunk shorter than W is padded with copies of its last row (same token, same position): they compute the same
  K/V, scatter the same values into the same slot, and their logits are dropped.
The block is the one the config declares, emitted by export/onnx_block.py (the math of runtime/backends/numpy_ref.py);
this profile supplies RMSNorm in primitive ops (SimplifiedLayerNormalization is an onnxruntime op), rotate_half RoPE
from cos/sin tables gathered by position (one pair per distinct RoPE, none on a layer without RoPE, the first
rotary dims only under partial rotary), grouped-query attention without repeating K/V (query heads grouped under
their KV head), and per sliding window a bias with the window mask added (`prepare`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnx

from ..models import rope as rope_tables
from ..models.config import ModelConfig
from ..models.rope import Rope
from .onnx_block import BlockEmitter, block, embed, norm_weight, out_projection, qkv_projection, qkv_sizes
from .onnx_ir import GraphBuilder
from .onnx_linear import STANDARD_FORMATS, ExportOptions, TensorRecord, WeightFormat, WeightSource, standard_linear

# Additive bias of a masked slot: exp(score + MASK_VALUE - rowmax) underflows to 0 in float32 and float16 alike, and
# the value is finite in float16 (NPUs often run attention in half precision; -inf invites NaN on fully masked rows).
MASK_VALUE = -1.0e4


@dataclass(frozen=True)
class StaticShape:
    """The fixed dimensions: W = verify width (k + 1 positions per call), C = cache slots (= max positions)."""

    verify_width: int = 5  # k = 4 drafts + the last token: decode's default k, and a chunk size for prompts
    max_context: int = 512  # holds a ~380-token prompt plus 128 new tokens; every call attends over all C slots

    def check(self, cfg: ModelConfig) -> None:
        if not 1 <= self.verify_width <= self.max_context:
            raise ValueError(f"--verify-width {self.verify_width} must be in 1..--max-context ({self.max_context})")
        if self.max_context > cfg.context_length:
            raise ValueError(f"--max-context {self.max_context} exceeds the model's context {cfg.context_length}")


@dataclass(frozen=True)
class StaticIO:
    """Graph input/output names (copied into the manifest; the runtime reads them from there)."""

    input_ids: str = "input_ids"
    position_ids: str = "position_ids"
    attention_bias: str = "attention_bias"
    past_key: str = "past_key.{i}"
    past_value: str = "past_value.{i}"
    logits: str = "logits"
    new_key: str = "new_key.{i}"
    new_value: str = "new_value.{i}"


@dataclass(frozen=True)
class _Prep:
    """Per-call tensors every layer shares, computed once at the top of the graph."""

    slots: str  # int64 [KV, W, hd]: each new row's position, the ScatterElements indices
    bias: str  # [G*W, C]: the attention bias repeated for the G query heads of each KV head
    tables: Mapping[Rope, tuple[str, str]] = field(default_factory=dict)  # cos, sin rows [W, rot/2] per RoPE
    windowed: Mapping[int, str] = field(default_factory=dict)  # window -> bias [G*W, C] with the window mask


def build_static_decoder(cfg: ModelConfig, src: WeightSource, opts: ExportOptions, shape: StaticShape,
                         io: StaticIO = StaticIO()) -> tuple[onnx.ModelProto, dict[str, TensorRecord]]:
    """The whole decoder at fixed shapes; returns (model, tensor records)."""
    if opts.fmt not in STANDARD_FORMATS:
        raise ValueError(f"the static profile takes --weights {', '.join(f.value for f in STANDARD_FORMATS)} "
                         f"(standard ONNX ops only); {opts.fmt.value} needs com.microsoft ops")
    shape.check(cfg)
    w, c = shape.verify_width, shape.max_context
    g = GraphBuilder(cfg.name or cfg.arch)
    records: dict[str, TensorRecord] = {}
    ids = g.input(io.input_ids, np.int64, [1, w])
    pos = g.input(io.position_ids, np.int64, [1, w])
    bias = g.input(io.attention_bias, np.float32, [1, 1, w, c])
    with g.scope("prep"):
        prep = prepare(g, cfg, shape, pos, bias)
    em = StaticBlocks(g, cfg, src, opts, records, shape=shape, io=io, prep=prep)
    h = embed(g, cfg, src, opts, ids, records)
    with g.scope("layers.0"):
        x = rms_norm(g, cfg, src, h, "layers.0.attn_norm", "attn_norm")
    for i in range(cfg.n_layers):
        after = f"layers.{i + 1}.attn_norm" if i + 1 < cfg.n_layers else "norm"
        with g.scope(f"layers.{i}"):
            h, m = block(em, i, x, h)
            x, h = em.add_norm(m, h, after, "next_norm")
    head(g, cfg, src, opts, shape, io, x, records)
    doc = f"{cfg.arch} decoder, {opts.fmt.value} weights, static shapes W={w} C={c}"
    return g.model(producer="specedge", doc=doc), records


@dataclass
class StaticBlocks(BlockEmitter):
    """The static profile's emitter: standard-op linears and norms, attention over all C slots."""

    shape: StaticShape = StaticShape()
    io: StaticIO = StaticIO()
    prep: _Prep | None = None

    def linear(self, x: str, parts: list[str], prefix: str, name: str) -> str:
        y, recs = standard_linear(self.g, x, parts, self.src, self.opts, prefix, name)
        self.records.update(recs)
        return y

    def norm(self, x: str, tensor: str, name: str) -> str:
        return rms_norm(self.g, self.cfg, self.src, x, tensor, name)

    def add_norm(self, delta: str, h: str, tensor: str, name: str) -> tuple[str, str]:
        h = self.g.op1("Add", [h, delta], f"{name}_residual")
        return rms_norm(self.g, self.cfg, self.src, h, tensor, name), h

    def attention(self, i: int, x: str) -> str:
        return attention(self, i, x)


def _shape(g: GraphBuilder, *dims: int) -> str:
    return g.const_once("shape." + "x".join(map(str, dims)), np.array(dims, np.int64))


def prepare(g: GraphBuilder, cfg: ModelConfig, shape: StaticShape, pos: str, bias: str) -> _Prep:
    """RoPE rows, scatter indices and the per-group biases, from position_ids and attention_bias.

        position_ids [1, W] ─┬─ Gather(cos/sin tables [C, rot/2]) ─► Reshape ─► cos, sin [W, rot/2] (per RoPE)
                             └─ Reshape [1, W, 1] ─► Expand [KV, W, hd] ─► slots
        attention_bias [1, 1, W, C] ─► Reshape [W, C] ─► Tile(G, 1) ─► bias [G*W, C]
        (per window: + Where(position - slot >= window, MASK_VALUE, 0) before the Tile)
    """
    w, c, hd = shape.verify_width, shape.max_context, cfg.head_dim
    tables = {}
    for r in rope_tables.distinct_ropes(cfg):
        rows = []
        for name, values in zip(("cos", "sin"), rope_tables.cos_sin(r, np.arange(c))):
            table = g.const(rope_tables.table_name(cfg, r, name), values.astype(np.float32))
            label = rope_tables.table_name(cfg, r, name).replace(".", "_")
            rows.append(g.op1("Reshape", [g.op1("Gather", [table, pos], label), _shape(g, w, r.dim // 2)],
                              f"{label}_rows"))
        tables[r] = (rows[0], rows[1])
    col = g.op1("Reshape", [pos, _shape(g, 1, w, 1)], "slot_column")
    slots = g.op1("Expand", [col, _shape(g, cfg.n_kv_heads, w, hd)], "slots")
    flat = g.op1("Reshape", [bias, _shape(g, w, c)], "bias_rows")
    tiled = g.op1("Tile", [flat, _shape(g, cfg.group, 1)], "bias_groups")
    windowed = {}
    for win in cfg.block.windows():
        with g.scope(f"window_{win}"):
            behind = g.op1("Sub", [g.op1("Reshape", [pos, _shape(g, w, 1)], "positions"),
                                   g.const_once("window.slots", np.arange(c, dtype=np.int64))], "behind")  # [W, C]
            far = g.op1("GreaterOrEqual", [behind, g.const(f"window.{win}.size", np.array(win, np.int64))], "far")
            mask = g.op1("Where", [far, g.const_once("window.masked", np.array(MASK_VALUE, np.float32)),
                                   g.const_once("window.zero", np.array(0.0, np.float32))], "mask")
            windowed[win] = g.op1("Tile", [g.op1("Add", [flat, mask], "bias"), _shape(g, cfg.group, 1)], "groups")
    return _Prep(slots, tiled, tables, windowed)


def rms_norm(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, x: str, tensor: str, name: str) -> str:
    """x / sqrt(mean(x^2) + eps) * w in standard ops (the NumPy reference's order).

        x ─► Pow 2 ─► ReduceMean(-1) ─► Add eps ─► Sqrt ─► Div(x, ·) ─► Mul w
    """
    with g.scope(name):
        sq = g.op1("Pow", [x, g.const_once("norm.two", np.array(2.0, np.float32))], "square")
        ms = g.op1("ReduceMean", [sq, g.const_once("norm.axes", np.array([-1], np.int64))], "mean", keepdims=1)
        eps = g.const_once("norm.eps", np.array(cfg.rms_eps, np.float32))
        rms = g.op1("Sqrt", [g.op1("Add", [ms, eps], "add_eps")], "sqrt")
        return g.op1("Mul", [g.op1("Div", [x, rms], "normalize"), norm_weight(g, cfg, src, tensor)], "scale")


def rope(g: GraphBuilder, x: str, cos: str, sin: str, rot: int, hd: int, name: str) -> str:
    """rotate_half RoPE on the first `rot` dims of x [heads, W, hd]: [x1 cos - x2 sin, x2 cos + x1 sin] (the other
    hd - rot dims pass through)."""
    with g.scope(name):
        rest = None
        if rot < hd:
            x, rest = g.op("Split", [x, g.const_once(f"rope.split_{rot}", np.array([rot, hd - rot], np.int64))],
                           "rotary_part", n_out=2, axis=-1)
        x1, x2 = g.op("Split", [x], "halves", n_out=2, axis=-1, num_outputs=2)
        a = g.op1("Sub", [g.op1("Mul", [x1, cos], "x1_cos"), g.op1("Mul", [x2, sin], "x2_sin")], "first")
        b = g.op1("Add", [g.op1("Mul", [x2, cos], "x2_cos"), g.op1("Mul", [x1, sin], "x1_sin")], "second")
        return g.op1("Concat", [a, b] + ([rest] if rest else []), "rotated", axis=-1)


def attention(em: StaticBlocks, i: int, x: str) -> str:
    """Grouped-query attention over the C cache slots with the W new rows scattered in at their positions.

        x ─► qkv_proj ─► Split ─┬─ q ─► heads ─(q_norm)─► RoPE ─────────────────────────► q [KV, G*W, hd]
                                ├─ k ─► heads ─(k_norm)─► RoPE ─┬─► new_key.i
                                │                               └─► ScatterElements into past_key.i ─► keys [KV, C, hd]
                                └─ v ─► heads ──────────────────┬─► new_value.i
                                                                └─► ScatterElements into past_value.i ─► values
        Softmax(q keysᵀ × scale + bias (of the layer's window)) ─► MatMul(values) ─► [1, W, H*hd] ─► o_proj ─► out
    """
    g, cfg, io, shape, prep = em.g, em.cfg, em.io, em.shape, em.prep
    w = shape.verify_width
    n_kv, n_h, hd = cfg.n_kv_heads, cfg.n_heads, cfg.head_dim
    qkv = qkv_projection(em, i, x)
    q, k, v = g.op("Split", [qkv, qkv_sizes(em)], "split_qkv", n_out=3, axis=-1)
    r = rope_tables.layer_rope(cfg, i)
    q, k = (_positioned(em, i, x, n, r, name) for x, n, name in ((q, n_h, "q"), (k, n_kv, "k")))
    v = _heads(g, v, w, n_kv, hd, "v")
    keys = _cache_with_new_rows(g, prep, k, io.past_key.format(i=i), io.new_key.format(i=i), "key", shape, n_kv, hd)
    values = _cache_with_new_rows(g, prep, v, io.past_value.format(i=i), io.new_value.format(i=i), "value", shape,
                                  n_kv, hd)
    qg = g.op1("Reshape", [q, _shape(g, n_kv, cfg.group * w, hd)], "q_groups")
    scores = g.op1("MatMul", [qg, g.op1("Transpose", [keys], "keys_t", perm=[0, 2, 1])], "scores")
    scale = g.const_once("attn.scale", np.array(1.0 / np.sqrt(hd), np.float32))
    window = cfg.block.layer(i).window
    bias = prep.bias if window is None else prep.windowed[window]
    masked = g.op1("Add", [g.op1("Mul", [scores, scale], "scaled"), bias], "masked")
    probs = g.op1("Softmax", [masked], "softmax", axis=-1)
    ctx = g.op1("MatMul", [probs, values], "context")  # [KV, G*W, hd]
    ctx = g.op1("Transpose", [g.op1("Reshape", [ctx, _shape(g, n_h, w, hd)], "context_heads")], "context_rows",
                perm=[1, 0, 2])
    ctx = g.op1("Reshape", [ctx, _shape(g, 1, w, n_h * hd)], "context_flat")
    return out_projection(em, i, ctx)


def _positioned(em: StaticBlocks, i: int, x: str, n: int, r, name: str) -> str:
    """q or k rows [1, W, n*hd] -> heads [n, W, hd], q/k-normed and rotated as the layer declares."""
    g, hd = em.g, em.cfg.head_dim
    x = _heads(g, x, em.shape.verify_width, n, hd, name)
    if em.cfg.block.qk_norm:
        x = em.norm(x, f"layers.{i}.{name}_norm", f"{name}_norm")
    if r is None:
        return x
    cos, sin = em.prep.tables[r]
    return rope(g, x, cos, sin, r.dim, hd, f"{name}_rope")


def _heads(g: GraphBuilder, x: str, w: int, n: int, hd: int, name: str) -> str:
    """[1, W, n*hd] -> [n, W, hd] (batch 1 dropped: every tensor stays at rank <= 4 for NPU compilers)."""
    rows = g.op1("Reshape", [x, _shape(g, w, n, hd)], f"{name}_rows")
    return g.op1("Transpose", [rows], f"{name}_heads", perm=[1, 0, 2])


def _cache_with_new_rows(g: GraphBuilder, prep: _Prep, rows: str, past_name: str, new_name: str, kind: str,
                         shape: StaticShape, n_kv: int, hd: int) -> str:
    """Output the new rows [KV, W, hd] as `new_name` and return past [KV, C, hd] with them scattered in at their
    positions (a copy: the graph never writes its inputs; the runtime commits the real rows)."""
    w, c = shape.verify_width, shape.max_context
    past = g.input(past_name, np.float32, [1, n_kv, c, hd])
    out = g.output(new_name, np.float32, [1, n_kv, w, hd])
    g.op("Reshape", [rows, _shape(g, 1, n_kv, w, hd)], f"new_{kind}", outputs=[out])
    flat = g.op1("Reshape", [past, _shape(g, n_kv, c, hd)], f"past_{kind}")
    return g.op1("ScatterElements", [flat, prep.slots, rows], f"{kind}s", axis=1)


def head(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, shape: StaticShape,
         io: StaticIO, x: str, records: dict[str, TensorRecord]) -> str:
    """LM head on the final-normed states; a float tied head reuses the embedding table through Gemm(transB).

        x [1, W, D] ─► Reshape [W, D] ─► lm_head ─► Reshape ─► logits [1, W, V]
    """
    w, v = shape.verify_width, cfg.vocab_size
    x = g.op1("Reshape", [x, _shape(g, w, cfg.d_model)], "head_rows")
    if opts.fmt in (WeightFormat.FP32, WeightFormat.FP16) and cfg.tied_embeddings:
        table = "embed.weight" if opts.fmt is WeightFormat.FP32 else g.op1("Cast", ["embed.weight"], "lm_head/cast",
                                                                            to=1)
        y = g.op1("Gemm", [x, table], "lm_head", transB=1)
    else:
        name = "embed" if cfg.tied_embeddings else "lm_head"
        y, recs = standard_linear(g, x, [name], src, opts, "lm_head", "lm_head")
        records["lm_head"] = recs[name]  # tied: the embedding table, stored a second time in the head's format
    g.op("Reshape", [y, _shape(g, 1, w, v)], "logits", outputs=[io.logits])
    g.output(io.logits, np.float32, [1, w, v])
    return io.logits
