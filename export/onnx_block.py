"""The transformer block every ONNX profile emits, read from the model's declaration (models/block.py).

A profile (dynamic: onnx_graph.py, layered: onnx_layered.py, static: onnx_static.py) supplies a `BlockEmitter`: how
it makes a linear, a norm, a residual add fused with the next norm, and its attention plumbing (KV buffers, RoPE,
masks). Everything else is here, once:

    x = norm(h) ─► attention(i, x) ─(post_attn_norm)─► add_norm(+h, ffn_norm) ─► mlp ─(post_ffn_norm)─► (h', delta)
    attention(i, x):  qkv_projection (fused or not, + biases) ─► [profile: q/k norm, RoPE, KV, mask] ─► out_projection

`block` returns (h', delta) unadded: the dynamic profile fuses the add with the next layer's norm, the layered one
hands the pair to the next segment, the static one adds then norms in primitive ops.
A variant a profile cannot emit is refused when the graph is built (UnsupportedVariant, e.g. onnx_graph.check_dynamic).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..models.block import Activation
from ..models.config import ModelConfig
from .onnx_ir import GraphBuilder
from .onnx_linear import ExportOptions, TensorRecord, WeightFormat, WeightSource, max_abs_diff


def norm_weight(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, tensor: str) -> str:
    """The initializer `<tensor>.weight` holding the multiplier the declared norm applies ((1 + w) for gemma)."""
    return g.const(tensor + ".weight", cfg.block.norm_scale(src.float(tensor)))


@dataclass
class BlockEmitter:
    """What a profile provides to `block`; the subclass implements norm, add_norm and attention."""

    g: GraphBuilder
    cfg: ModelConfig
    src: WeightSource
    opts: ExportOptions
    records: dict[str, TensorRecord] = field(default_factory=dict)

    def linear(self, x: str, parts: list[str], prefix: str, name: str) -> str:
        """y = x @ concat(parts)^T (records kept)."""
        raise NotImplementedError

    def norm(self, x: str, tensor: str, name: str) -> str:
        """The declared norm of x over its last axis with canonical weight `tensor`."""
        raise NotImplementedError

    def add_norm(self, delta: str, h: str, tensor: str, name: str) -> tuple[str, str]:
        """(norm(h + delta), h + delta)."""
        raise NotImplementedError

    def attention(self, i: int, x: str) -> str:
        """Layer i's attention on the normed x: qkv_projection, the profile's plumbing, out_projection."""
        raise NotImplementedError


def block(em: BlockEmitter, i: int, x: str, h: str) -> tuple[str, str]:
    """Layer i on (x = attn_norm(h), h); returns (h after the attention residual, the MLP's output delta)."""
    spec, p, g = em.cfg.block, f"layers.{i}", em.g
    with g.scope("attn"):
        a = em.attention(i, x)
        if spec.post_norms:
            a = em.norm(a, f"{p}.post_attn_norm", "post_norm")
    x, h = em.add_norm(a, h, f"{p}.ffn_norm", "ffn_norm")
    with g.scope("mlp"):
        m = mlp(em, p, x)
        if spec.post_norms:
            m = em.norm(m, f"{p}.post_ffn_norm", "post_norm")
    return h, m


def qkv_projection(em: BlockEmitter, i: int, x: str) -> str:
    """The packed q|k|v rows [.., (H + 2 KV) hd] of layer i, biases added."""
    spec, p, g = em.cfg.block, f"layers.{i}", em.g
    qkv = em.linear(x, spec.qkv_parts(p), f"{p}.attn.qkv_proj", "qkv_proj")
    if spec.qkv_bias:
        bias = np.concatenate([em.src.float(n) for n in spec.qkv_bias_parts(p)])
        qkv = g.op1("Add", [qkv, g.const(f"{p}.attn.qkv_proj.bias", bias)], "qkv_bias")
    return qkv


def out_projection(em: BlockEmitter, i: int, ctx: str) -> str:
    """o_proj of the attention context [.., H hd] (+ o bias)."""
    p, g = f"layers.{i}", em.g
    out = em.linear(ctx, [f"{p}.o"], f"{p}.attn.o_proj", "o_proj")
    if em.cfg.block.o_bias:
        out = g.op1("Add", [out, g.const(f"{p}.attn.o_proj.bias", em.src.float(f"{p}.o_bias"))], "o_bias")
    return out


def qkv_sizes(em: BlockEmitter) -> str:
    """int64 [3]: the widths of q, k and v in the packed projection (a Split's sizes input)."""
    c = em.cfg
    return em.g.const_once("attn.qkv_sizes", np.array([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                                       c.n_kv_heads * c.head_dim], np.int64))


def mlp(em: BlockEmitter, p: str, x: str) -> str:
    """Gated MLP with a fused gate|up projection and the declared activation.

        x ─► gate_up_proj ─► Split ─┬─ gate ─► act ─► Mul ─► down_proj ─► out
                                    └─ up ──────────┘
        act: silu = Mul(gate, Sigmoid(gate)); gelu_tanh = Gelu(approximate="tanh")
    """
    g, spec = em.g, em.cfg.block
    gu = em.linear(x, spec.gate_up_parts(p), f"{p}.mlp.gate_up_proj", "gate_up_proj")
    gate, up = g.op("Split", [gu], "split", n_out=2, axis=-1, num_outputs=2)
    if spec.activation is Activation.SILU:
        act = g.op1("Mul", [gate, g.op1("Sigmoid", [gate], "sigmoid")], "silu")
        glu = g.op1("Mul", [act, up], "swiglu")
    else:
        act = g.op1("Gelu", [gate], "gelu", approximate="tanh")
        glu = g.op1("Mul", [act, up], "geglu")
    return em.linear(glu, [f"{p}.down"], f"{p}.mlp.down_proj", "down_proj")


def embed(g: GraphBuilder, cfg: ModelConfig, src: WeightSource, opts: ExportOptions, ids: str,
          records: dict[str, TensorRecord]) -> str:
    """Token embedding rows [1, T, D] (times the declared scale); float16 tables (fp16 format) are cast after the
    gather (one row per token)."""
    table = src.float("embed")
    if opts.fmt is WeightFormat.FP16:
        rows = g.op1("Gather", [g.const("embed.weight", table.astype(np.float16)), ids], "embed")
        records["embed"] = _float_record(g.path("embed"), "fp16", src, table.astype(np.float16))
        h = g.op1("Cast", [rows], "embed/cast", to=1)
    else:
        records["embed"] = _float_record(g.path("embed"), "fp32", src, table)
        h = g.op1("Gather", [g.const("embed.weight", table), ids], "embed")
    if cfg.block.embed_scale != 1.0:
        h = g.op1("Mul", [h, g.const("embed.scale", np.array(cfg.block.embed_scale, np.float32))], "embed_scale")
    return h


def _float_record(path: str, storage: str, src: WeightSource, stored: np.ndarray) -> TensorRecord:
    err = max_abs_diff(stored, src.float("embed"))
    return TensorRecord(path, storage, src.source_type("embed"), err == 0.0, err)
