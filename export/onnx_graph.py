"""Build the decoder graph (llama / qwen2 families) from canonical weights with our own builder.

One graph serves prefill, plain decoding, verification of k+1 chain positions and of a token tree (format 4): the
new tokens are written at cache slots `L + arange(T)` with `L = seqlens_k + 1 - T`, for any cache length L; their
RoPE positions come from the `position_ids` input (L + arange(T) for a chain, L + depth for a tree) and the
`tree_bias` input (zeros for a chain) masks the non-ancestors among the new tokens on top of the causal mask
(ALGORITHMS.md 1.4 "Tree attention").
Attention is com.microsoft GroupQueryAttention with shared past/present buffers: the runtime binds the same
preallocated [1, n_kv, max_ctx, head_dim] OrtValue as past_key.i and present_key.i, so the op writes only the T
new rows in place (no full-cache copy per step). Rollback is just a smaller seqlens_k on the next call.

The math matches runtime/backends/numpy_ref.py: RMSNorm (eps from the config), rotate_half RoPE with the config's
theta and scaling, GQA, SwiGLU, optional q/k/v biases (qwen2), tied or separate LM head.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..models.config import ModelConfig
from ..runtime.backends.numpy_ref import rope_inv_freq
from .onnx_ir import MS_DOMAIN, GraphBuilder
from .onnx_linear import ExportOptions, TensorRecord, WeightFormat, WeightSource, linear


PAD_ROWS = 1  # zero rows appended to every GroupQueryAttention call (see attention())


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


def build_decoder(cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO = GraphIO()
                  ) -> tuple[onnx.ModelProto, dict[str, TensorRecord]]:
    """The whole decoder: embed -> n_layers blocks -> final norm -> LM head; returns (model, tensor records)."""
    g = GraphBuilder(cfg.name or cfg.arch)
    records: dict[str, TensorRecord] = {}
    ids = g.input(io.input_ids, np.int64, [1, "T"])
    seqlens = g.input(io.seqlens_k, np.int32, [1])
    total = g.input(io.total_length, np.int32, [])
    cos, sin = rope_tables(g, cfg)
    pos, bias = tree_inputs(g, io, ids, total)
    seqlens, total = padded_lengths(g, seqlens, total)
    h = embed(g, cfg, src, opts, ids, records)
    with g.scope("layers.0"):
        x = rms_norm(g, cfg, src, h, "layers.0.attn_norm", "attn_norm")
    for i in range(cfg.n_layers):
        after = f"layers.{i + 1}.attn_norm" if i + 1 < cfg.n_layers else "norm"
        with g.scope(f"layers.{i}"):
            x, h = block(g, cfg, src, opts, io, i, x, h, after, (seqlens, total, cos, sin, pos, bias), records)
    head(g, cfg, src, opts, io, x, records)
    return g.model(producer="specedge", doc=f"{cfg.arch} decoder, {opts.fmt.value} weights"), records


def rope_tables(g: GraphBuilder, cfg: ModelConfig) -> tuple[str, str]:
    """cos/sin [context_length + PAD_ROWS, head_dim/2] (the pad row's position too), angles in float64 as the NumPy
    reference computes them."""
    angles = np.arange(cfg.context_length + PAD_ROWS, dtype=np.float64)[:, None] * rope_inv_freq(cfg)[None, :]
    return (g.const("rope.cos", np.cos(angles).astype(np.float32)),
            g.const("rope.sin", np.sin(angles).astype(np.float32)))


def padded_lengths(g: GraphBuilder, seqlens: str, total: str) -> tuple[str, str]:
    """seqlens_k and total_sequence_length as GroupQueryAttention sees them: one pad row past the T real ones."""
    with g.scope("attn_pad"):
        pad = np.int32(PAD_ROWS)
        return (g.op1("Add", [seqlens, g.const("attn_pad.rows", np.array([pad]))], "seqlens_k"),
                g.op1("Add", [total, g.const("attn_pad.rows_scalar", np.array(pad))], "total_length"))


def tree_inputs(g: GraphBuilder, io: GraphIO, ids: str, total: str) -> tuple[str, str]:
    """position_ids [1, T + 1] and attention_bias [1, 1, T + 1, L + T + 1] as GroupQueryAttention sees them, from the
    graph inputs over the T real tokens: the pad row (see attention()) gets position L + T and zero bias; the
    committed columns [0, L) get zero bias (every node sees the whole cache).

        position_ids [1, T] ──────────────────────► Concat(L + T) ──► [1, T + 1]
        tree_bias [1, 1, T, T] ─► Pad(left L columns, 1 row and 1 column at the end, zeros) ──► [1, 1, T + 1, L + T + 1]
    """
    pos = g.input(io.position_ids, np.int64, [1, "T"])
    bias = g.input(io.tree_bias, np.float32, [1, 1, "T", "T"])
    with g.scope("tree"):
        tot = g.op1("Reshape", [g.op1("Cast", [total], "total", to=onnx.TensorProto.INT64),
                                g.const("tree.one_by_one", np.array([1, 1], np.int64))], "total_2d")  # [1, 1]: L + T
        pos = g.op1("Concat", [pos, tot], "pad_position", axis=1)
        t = g.op1("Shape", [ids], "t", start=1, end=2)
        cached = g.op1("Sub", [g.op1("Reshape", [tot, g.const("tree.flat", np.array([1], np.int64))], "total_1d"), t],
                       "cached")  # [1]: L
        pads = g.op1("Concat", [g.const("tree.pads_begin", np.zeros(3, np.int64)), cached,
                                g.const("tree.pads_end", np.array([0, 0, PAD_ROWS, PAD_ROWS], np.int64))],
                     "pads", axis=0)
        bias = g.op1("Pad", [bias, pads], "bias")  # constant 0
    return pos, bias


def embed(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, ids: str,
          records: dict[str, TensorRecord]) -> str:
    """Token embedding rows [1, T, D]; float16 tables (fp16 format) are cast after the gather (one row per token)."""
    table = src.float("embed")
    if opts.fmt is WeightFormat.FP16:
        rows = g.op1("Gather", [g.const("embed.weight", table.astype(np.float16)), ids], "embed")
        records["embed"] = _float_record(g.path("embed"), "fp16", src, table.astype(np.float16))
        return g.op1("Cast", [rows], "embed/cast", to=1)
    records["embed"] = _float_record(g.path("embed"), "fp32", src, table)
    return g.op1("Gather", [g.const("embed.weight", table), ids], "embed")


def _float_record(path: str, storage: str, src: WeightSource, stored: np.ndarray) -> TensorRecord:
    ref = src.float("embed")
    approx = stored.astype(np.float32)
    return TensorRecord(path, storage, src.source_type("embed"), bool(np.array_equal(approx, ref)),
                        float(np.abs(approx - ref).max()))


def rms_norm(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, x: str, tensor: str, name: str) -> str:
    return g.op1("SimplifiedLayerNormalization", [x, g.const(tensor + ".weight", src.float(tensor))], name,
                 axis=-1, epsilon=float(cfg.rms_eps), stash_type=1)


def skip_rms_norm(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, delta: str, h: str, tensor: str,
                  name: str) -> tuple[str, str]:
    """(RMSNorm(h + delta), h + delta) in one node: a residual Add and the next norm fused."""
    path = g.path(name)
    out = g.op("SkipSimplifiedLayerNormalization", [delta, h, g.const(tensor + ".weight", src.float(tensor))], name,
               outputs=[path + "/out0", "", "", path + "/residual"], domain=MS_DOMAIN, epsilon=float(cfg.rms_eps))
    return out[0], out[3]


def block(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO, i: int, x: str,
          h: str, next_norm: str, attn_inputs: tuple[str, ...], records: dict[str, TensorRecord]
          ) -> tuple[str, str]:
    """One pre-norm transformer block; takes (x = attn_norm(h), h), returns (next_norm(h'), h').

        x ─► attn ─► SkipRMSNorm(+h, ffn_norm) ─► mlp ─► SkipRMSNorm(+h, next norm) ─► x'
        h ──────────────┴─────────── h ───────────────────────┴────────────────────── h'
    The next layer's attn_norm (or the final norm) is fused with this block's last residual Add.
    """
    p = f"layers.{i}"
    with g.scope("attn"):
        a = attention(g, cfg, src, opts, io, i, x, attn_inputs, records)
    x, h = skip_rms_norm(g, cfg, src, a, h, f"{p}.ffn_norm", "ffn_norm")
    with g.scope("mlp"):
        m = mlp(g, src, opts, p, x, records)
    return skip_rms_norm(g, cfg, src, m, h, next_norm, "next_norm")


def attention(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO, i: int, x: str,
              attn_inputs: tuple[str, ...], records: dict[str, TensorRecord]) -> str:
    """Fused q|k|v projection, GroupQueryAttention on the packed QKV (RoPE inside, in-place KV), output projection.

        x ─► qkv_proj ─(+ q|k|v bias)─► Concat(zero row) ─► GroupQueryAttention ─► Slice(drop row) ─► o_proj ─► out
          past_key.i, past_value.i ───────────────────────────┘        └─► present_key.i, present_value.i (same buffers)

    Batch invariance: onnxruntime's CPU GroupQueryAttention multiplies probs x V with MLAS, which takes a GEMV path
    when the op sees one row and a GEMM path for two or more; the two round differently (~1e-7 relative), and int8
    activation rounding downstream amplifies that into logit differences up to ~1 between a verify batch and
    one-token decoding. A zero row appended at position L+T keeps every call on the GEMM path, where rows are computed
    identically for any row count and any zero-padded total length, so T=1 and T=k+1 give bit-identical logits.
    The pad row's K/V land at position L+T (beyond the cursor; the next call overwrites them) and no real row attends
    to it (causal). The runtime allocates PAD_ROWS extra cache rows for it.
    Trees: position_ids (RoPE) and attention_bias (added to the scores before the causal softmax) come from
    tree_inputs(); onnxruntime 1.31's CPU kernel honours both with the pad row. A zero bias adds exactly nothing, so
    chains stay bit-identical across T; a tree node off the first root path gets the same terms at other slots of
    the probs x V reduction, equal to its chain up to float rounding (~1e-6 relative in fp32).
    """
    p = f"layers.{i}"
    seqlens, total, cos, sin, positions, tree_bias = (tuple(attn_inputs) + ("", ""))[:6]  # chain-only graphs: 4
    qkv, recs = linear(g, x, [f"{p}.q", f"{p}.k", f"{p}.v"], src, opts, f"{p}.attn.qkv_proj", "qkv_proj")
    records.update(recs)
    if cfg.qkv_bias:
        bias = np.concatenate([src.float(f"{p}.{n}_bias") for n in "qkv"])
        qkv = g.op1("Add", [qkv, g.const(f"{p}.attn.qkv_proj.bias", bias)], "qkv_bias")
    kv_shape = [1, cfg.n_kv_heads, "max_ctx", cfg.head_dim]
    past_k = g.input(io.past_key.format(i=i), np.float32, kv_shape)
    past_v = g.input(io.past_value.format(i=i), np.float32, kv_shape)
    present_k = g.output(io.present_key.format(i=i), np.float32, kv_shape)
    present_v = g.output(io.present_value.format(i=i), np.float32, kv_shape)
    d = qkv_width(cfg)
    if not g.has_const("attn_pad.zeros"):
        g.const("attn_pad.zeros", np.zeros((1, PAD_ROWS, d), np.float32))
    padded = g.op1("Concat", [qkv, "attn_pad.zeros"], "pad_rows", axis=1)
    gqa_in = [padded, "", "", past_k, past_v, seqlens, total, cos, sin, positions, tree_bias]
    while gqa_in[-1] == "":  # omitted trailing optional inputs
        gqa_in.pop()
    attn = g.op("GroupQueryAttention", gqa_in, "gqa", outputs=[g.path("gqa") + "/out0", present_k, present_v],
                domain=MS_DOMAIN, num_heads=cfg.n_heads, kv_num_heads=cfg.n_kv_heads, do_rotary=1, rotary_interleaved=0,
                scale=float(1.0 / np.sqrt(cfg.head_dim)))[0]
    attn = g.op1("Slice", [attn, g.const_once("attn_pad.start", np.array([0], np.int64)),
                           g.const_once("attn_pad.end", np.array([-PAD_ROWS], np.int64)),
                           g.const_once("attn_pad.axis", np.array([1], np.int64))], "unpad_rows")
    out, recs = linear(g, attn, [f"{p}.o"], src, opts, f"{p}.attn.o_proj", "o_proj")
    records.update(recs)
    return out


def mlp(g: GraphBuilder, src: WeightSource, opts: ExportOptions, p: str, x: str,
        records: dict[str, TensorRecord], lin=linear) -> str:
    """SwiGLU with a fused gate|up projection (`lin` builds the linears: onnx_linear.linear or standard_linear).

        x ─► gate_up_proj ─► Split ─┬─ gate ─► Sigmoid ─► Mul(gate) ─► Mul ─► down_proj ─► out
                                    └─ up ────────────────────────────┘
    """
    gu, recs = lin(g, x, [f"{p}.gate", f"{p}.up"], src, opts, f"{p}.mlp.gate_up_proj", "gate_up_proj")
    records.update(recs)
    gate, up = g.op("Split", [gu], "split", n_out=2, axis=-1, num_outputs=2)
    silu = g.op1("Mul", [gate, g.op1("Sigmoid", [gate], "sigmoid")], "silu")
    act = g.op1("Mul", [silu, up], "swiglu")
    out, recs = lin(g, act, [f"{p}.down"], src, opts, f"{p}.mlp.down_proj", "down_proj")
    records.update(recs)
    return out


def head(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, io: GraphIO, h: str,
         records: dict[str, TensorRecord]) -> str:
    """LM head on the final-normed hidden states (the last block applied `norm`); logits [T, V].
    A float tied head reuses the embedding table through Gemm(transB).

        x [1, T, D] ─► Squeeze ─► lm_head ─► logits [T, V]
    """
    axes = g.const("head.squeeze_axes", np.array([0], np.int64))
    x = g.op1("Squeeze", [h, axes], "squeeze")
    name = "embed" if cfg.tied_embeddings else "lm_head"
    if opts.fmt in (WeightFormat.FP32, WeightFormat.FP16) and cfg.tied_embeddings:
        table = "embed.weight" if opts.fmt is WeightFormat.FP32 else g.op1("Cast", ["embed.weight"], "lm_head/cast",
                                                                            to=1)
        g.op("Gemm", [x, table], "lm_head", outputs=[io.logits], transB=1)
    else:
        y, recs = linear(g, x, [name], src, opts, "lm_head", "lm_head")
        records["lm_head"] = recs[name]  # tied: the embedding table, stored a second time in the head's format
        g.op("Identity", [y], "logits", outputs=[io.logits])
    g.output(io.logits, np.float32, ["T", cfg.vocab_size])
    return io.logits
