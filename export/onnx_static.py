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
The math is runtime/backends/numpy_ref.py's: RMSNorm in primitive ops (SimplifiedLayerNormalization is an
onnxruntime op), rotate_half RoPE from cos/sin tables gathered by position, grouped-query attention without
repeating K/V (query heads grouped under their KV head), SwiGLU, optional q/k/v biases, tied or separate head.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..models.config import ModelConfig
from ..runtime.backends.numpy_ref import rope_inv_freq
from .onnx_graph import embed, mlp
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

    cos: str  # [W, hd/2]
    sin: str
    slots: str  # int64 [KV, W, hd]: each new row's position, the ScatterElements indices
    bias: str  # [G*W, C]: the attention bias repeated for the G query heads of each KV head


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
    h = embed(g, cfg, src, opts, ids, records)
    for i in range(cfg.n_layers):
        with g.scope(f"layers.{i}"):
            h = block(g, cfg, src, opts, shape, io, i, h, prep, records)
    x = rms_norm(g, cfg, src, h, "norm", "norm")
    head(g, cfg, src, opts, shape, io, x, records)
    doc = f"{cfg.arch} decoder, {opts.fmt.value} weights, static shapes W={w} C={c}"
    return g.model(producer="specedge", doc=doc), records


def _shape(g: GraphBuilder, *dims: int) -> str:
    return g.const_once("shape." + "x".join(map(str, dims)), np.array(dims, np.int64))


def prepare(g: GraphBuilder, cfg: ModelConfig, shape: StaticShape, pos: str, bias: str) -> _Prep:
    """RoPE rows, scatter indices and the per-group bias, from position_ids and attention_bias.

        position_ids [1, W] ─┬─ Gather(cos/sin tables [C, hd/2]) ─► Reshape ─► cos, sin [W, hd/2]
                             └─ Reshape [1, W, 1] ─► Expand [KV, W, hd] ─► slots
        attention_bias [1, 1, W, C] ─► Reshape [W, C] ─► Tile(G, 1) ─► bias [G*W, C]
    """
    w, c, hd = shape.verify_width, shape.max_context, cfg.head_dim
    angles = np.arange(c, dtype=np.float64)[:, None] * rope_inv_freq(cfg)[None, :]
    rows = []
    for name, fn in (("cos", np.cos), ("sin", np.sin)):
        table = g.const(f"rope.{name}", fn(angles).astype(np.float32))
        rows.append(g.op1("Reshape", [g.op1("Gather", [table, pos], f"rope_{name}"), _shape(g, w, hd // 2)],
                          f"rope_{name}_rows"))
    col = g.op1("Reshape", [pos, _shape(g, 1, w, 1)], "slot_column")
    slots = g.op1("Expand", [col, _shape(g, cfg.n_kv_heads, w, hd)], "slots")
    flat = g.op1("Reshape", [bias, _shape(g, w, c)], "bias_rows")
    tiled = g.op1("Tile", [flat, _shape(g, cfg.group, 1)], "bias_groups")
    return _Prep(rows[0], rows[1], slots, tiled)


def rms_norm(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, x: str, tensor: str, name: str) -> str:
    """x / sqrt(mean(x^2) + eps) * w in standard ops (the NumPy reference's order).

        x ─► Pow 2 ─► ReduceMean(-1) ─► Add eps ─► Sqrt ─► Div(x, ·) ─► Mul w
    """
    with g.scope(name):
        sq = g.op1("Pow", [x, g.const_once("norm.two", np.array(2.0, np.float32))], "square")
        ms = g.op1("ReduceMean", [sq, g.const_once("norm.axes", np.array([-1], np.int64))], "mean", keepdims=1)
        eps = g.const_once("norm.eps", np.array(cfg.rms_eps, np.float32))
        rms = g.op1("Sqrt", [g.op1("Add", [ms, eps], "add_eps")], "sqrt")
        return g.op1("Mul", [g.op1("Div", [x, rms], "normalize"), g.const(tensor + ".weight", src.float(tensor))],
                     "scale")


def block(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, shape: StaticShape,
          io: StaticIO, i: int, h: str, prep: _Prep, records: dict[str, TensorRecord]) -> str:
    """One pre-norm block: h + attn(norm(h)), then + mlp(norm(.))."""
    p = f"layers.{i}"
    x = rms_norm(g, cfg, src, h, f"{p}.attn_norm", "attn_norm")
    with g.scope("attn"):
        a = attention(g, cfg, src, opts, shape, io, i, x, prep, records)
    h = g.op1("Add", [h, a], "attn_residual")
    x = rms_norm(g, cfg, src, h, f"{p}.ffn_norm", "ffn_norm")
    with g.scope("mlp"):
        m = mlp(g, src, opts, p, x, records, lin=standard_linear)
    return g.op1("Add", [h, m], "mlp_residual")


def rope(g: GraphBuilder, x: str, prep: _Prep, name: str) -> str:
    """rotate_half RoPE on x [heads, W, hd]: [x1 cos - x2 sin, x2 cos + x1 sin]."""
    with g.scope(name):
        x1, x2 = g.op("Split", [x], "halves", n_out=2, axis=-1, num_outputs=2)
        a = g.op1("Sub", [g.op1("Mul", [x1, prep.cos], "x1_cos"), g.op1("Mul", [x2, prep.sin], "x2_sin")], "first")
        b = g.op1("Add", [g.op1("Mul", [x2, prep.cos], "x2_cos"), g.op1("Mul", [x1, prep.sin], "x1_sin")], "second")
        return g.op1("Concat", [a, b], "rotated", axis=-1)


def attention(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, shape: StaticShape,
              io: StaticIO, i: int, x: str, prep: _Prep, records: dict[str, TensorRecord]) -> str:
    """Grouped-query attention over the C cache slots with the W new rows scattered in at their positions.

        x ─► qkv_proj ─► Split ─┬─ q ─► heads ─► RoPE ──────────────────────────► q [KV, G*W, hd]
                                ├─ k ─► heads ─► RoPE ─┬─► new_key.i
                                │                      └─► ScatterElements into past_key.i ─► keys [KV, C, hd]
                                └─ v ─► heads ─────────┬─► new_value.i
                                                       └─► ScatterElements into past_value.i ─► values [KV, C, hd]
        Softmax(q keysᵀ × scale + bias) ─► MatMul(values) ─► [1, W, H*hd] ─► o_proj ─► out
    """
    p, w = f"layers.{i}", shape.verify_width
    n_kv, n_h, hd = cfg.n_kv_heads, cfg.n_heads, cfg.head_dim
    qkv, recs = standard_linear(g, x, [f"{p}.q", f"{p}.k", f"{p}.v"], src, opts, f"{p}.attn.qkv_proj", "qkv_proj")
    records.update(recs)
    if cfg.qkv_bias:
        b = np.concatenate([src.float(f"{p}.{n}_bias") for n in "qkv"])
        qkv = g.op1("Add", [qkv, g.const(f"{p}.attn.qkv_proj.bias", b)], "qkv_bias")
    sizes = g.const_once("attn.qkv_sizes", np.array([n_h * hd, n_kv * hd, n_kv * hd], np.int64))
    q, k, v = g.op("Split", [qkv, sizes], "split_qkv", n_out=3, axis=-1)
    q = rope(g, _heads(g, q, w, n_h, hd, "q"), prep, "q_rope")
    k = rope(g, _heads(g, k, w, n_kv, hd, "k"), prep, "k_rope")
    v = _heads(g, v, w, n_kv, hd, "v")
    keys = _cache_with_new_rows(g, prep, k, io.past_key.format(i=i), io.new_key.format(i=i), "key", shape, n_kv, hd)
    values = _cache_with_new_rows(g, prep, v, io.past_value.format(i=i), io.new_value.format(i=i), "value", shape,
                                  n_kv, hd)
    qg = g.op1("Reshape", [q, _shape(g, n_kv, cfg.group * w, hd)], "q_groups")
    scores = g.op1("MatMul", [qg, g.op1("Transpose", [keys], "keys_t", perm=[0, 2, 1])], "scores")
    scale = g.const_once("attn.scale", np.array(1.0 / np.sqrt(hd), np.float32))
    masked = g.op1("Add", [g.op1("Mul", [scores, scale], "scaled"), prep.bias], "masked")
    probs = g.op1("Softmax", [masked], "softmax", axis=-1)
    ctx = g.op1("MatMul", [probs, values], "context")  # [KV, G*W, hd]
    ctx = g.op1("Transpose", [g.op1("Reshape", [ctx, _shape(g, n_h, w, hd)], "context_heads")], "context_rows",
                perm=[1, 0, 2])
    ctx = g.op1("Reshape", [ctx, _shape(g, 1, w, n_h * hd)], "context_flat")
    out, recs = standard_linear(g, ctx, [f"{p}.o"], src, opts, f"{p}.attn.o_proj", "o_proj")
    records.update(recs)
    return out


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
