"""Linear layers y = x @ W^T in each weight format, and the per-tensor record of how each weight was stored.

Formats (the measured reasons are in docs/onnx.md):
  fp32        MatMul with W^T float32
  fp16        W^T stored float16, Cast to float32 (onnxruntime folds the Cast at load: smaller files, fp32 speed)
  int8        MatMulNBits bits=8, block 32: GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K transcoded exactly, others re-quantized
  int8-dynamic  DynamicQuantizeMatMul: int8 per-output-channel weights, activations quantized per tensor per call
              (re-quantized; the flattest verify cost, but per-tensor activation scales fail the parity gate on
              models with outlier channels such as SmolLM2: docs/onnx.md); the weights are stored as uint8 with
              zero point 128 (dynamic_int8_weights)
  int4        MatMulNBits bits=4, block 32: GGUF Q4_0 / Q4_1 / Q4_K exact; Q8_0 sources stay 8-bit (exact), and
              other finer quantized sources (Q5_x, Q6_K) are re-quantized to 8 bits, not 4
The static profile (export/onnx_static.py) allows standard ai.onnx ops only: `standard_linear` keeps fp32 and fp16 as
above and makes int8 a block-32 DequantizeLinear (GGUF blocks transcoded exactly, as for MatMulNBits) feeding a MatMul.
Several canonical tensors may be fused into one linear (q|k|v, gate|up): their rows are stacked.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .onnx_ir import MS_DOMAIN, GraphBuilder
from .quant import BLOCK, BlockQuant, concat_rows, from_gguf_blocks, pack_nbits, quantize_blocks, \
    quantize_per_channel_int8


class WeightFormat(enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    INT8_DYNAMIC = "int8-dynamic"
    INT4 = "int4"

    @property
    def nbits(self) -> int | None:
        return {WeightFormat.INT4: 4, WeightFormat.INT8: 8}.get(self)


class KVDtype(enum.Enum):
    """The dynamic graph's attention and KV cache precision. CUDA's GroupQueryAttention takes float16 (or bfloat16)
    only: a float32 graph runs its attention on the CPU provider, the cache crossing to the host every call."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"


@dataclass(frozen=True)
class ExportOptions:
    fmt: WeightFormat = WeightFormat.FP32
    accuracy_level: int = 4  # MatMulNBits: 4 = int8 activations (fast), 0 = float activations (slow)
    exact_mins: bool = True  # keep GGUF block minimums exactly (extra min-term nodes) or re-quantize to zero points
    kv_dtype: KVDtype = KVDtype.FLOAT32  # dynamic profile: GroupQueryAttention's q/k/v, cos/sin, bias and cache
    trees: bool = True  # dynamic profile: position_ids/tree_bias inputs (False: a chain-only graph, format 2)
    pad_row: bool = True  # dynamic profile: the batch-invariance pad row through the network (onnx_graph.pad_rows)


class WeightSource(Protocol):
    """Canonical weights, plus the raw GGUF blocks where the model came from a quantized GGUF."""

    def float(self, name: str) -> np.ndarray: ...  # float32 canonical [out, in] (or 1-D)

    def blocks(self, name: str) -> tuple[str, np.ndarray] | None: ...  # (GGUF type name, uint8 [rows, row_bytes])

    def source_type(self, name: str) -> str: ...  # e.g. "F32", "Q4_1"


@dataclass(frozen=True)
class TensorRecord:
    """How one canonical tensor is stored in the graph (written to the manifest)."""

    linear: str  # the node path using it
    storage: str  # fp32 | fp16 | int8-channel | nbits{4,8}-zp | nbits{4,8}-zp-min (residual block offsets m)
    source_type: str
    exact: bool  # the graph's weight equals the canonical float32 weight bit for bit
    max_abs_err: float


def max_abs_diff(approx: np.ndarray, ref: np.ndarray) -> float:
    """max |approx - ref| over float32, in slices of 4096 rows (gemma3-270m's embedding table is 671 MB: whole-table
    temporaries of that size took 9 s of its export); 0.0 for the same array, nan where either holds a nan."""
    if approx is ref or ref.size == 0:
        return 0.0
    return float(np.max([np.abs(approx[i:i + 4096].astype(np.float32) - ref[i:i + 4096]).max()
                         for i in range(0, len(ref), 4096)]))


def _record(path: str, storage: str, src: WeightSource, name: str, approx: np.ndarray) -> TensorRecord:
    err = max_abs_diff(approx, src.float(name))
    return TensorRecord(path, storage, src.source_type(name), err == 0.0, err)


def block_quant(src: WeightSource, name: str, bits: int, exact_mins: bool = True) -> BlockQuant:
    """GGUF blocks transcoded when they fit in `bits` (exact), else re-quantized from float.
    exact_mins=False re-quantizes min-form blocks (Q4_1, Q4_K) to zero points: lossy, but no min-term nodes.
    In an int4 export, a Q8_0 tensor stays exact at 8 bits, and a finer GGUF type with no exact block-32 form
    (Q5_x, Q6_K: what a Q4_K_M file keeps for attn_v and ffn_down) is re-quantized to 8 bits, not 4: 4 bits would
    undo the mix the file chose (Qwen2.5-Coder-0.5B Q4_K_M all at 4 bits failed the parity gate at 84% top-1)."""
    raw = src.blocks(name)
    w = src.float(name)
    if raw is None:
        return quantize_blocks(w, bits)
    bq = from_gguf_blocks(raw[0], raw[1], w.shape[1])
    if bq is None:
        return quantize_blocks(w, max(bits, 8))
    if bq.m is not None and not exact_mins:
        return quantize_blocks(w, bits)
    return bq.with_bits(bits) if bq.bits <= bits else bq


def linear(g: GraphBuilder, x: str, parts: Sequence[str], src: WeightSource, opts: ExportOptions, prefix: str,
           name: str) -> tuple[str, dict[str, TensorRecord]]:
    """y = x @ concat(parts)^T; returns (y, records). `prefix` names the initializers, `name` the node."""
    path, fmt = g.path(name), opts.fmt
    if fmt in (WeightFormat.FP32, WeightFormat.FP16):
        dtype = np.float32 if fmt is WeightFormat.FP32 else np.float16
        ws = [src.float(p) for p in parts]
        w = g.const(prefix + ".weight", np.concatenate(ws).T.astype(dtype))
        if fmt is WeightFormat.FP16:
            w = g.op1("Cast", [w], name + "/cast", to=1)
        recs = {p: _record(path, fmt.value, src, p, wp.astype(dtype).astype(np.float32)) for p, wp in zip(parts, ws)}
        return g.op1("MatMul", [x, w], name), recs
    if fmt is WeightFormat.INT8_DYNAMIC:
        ws = [src.float(p) for p in parts]
        q, scale = quantize_per_channel_int8(np.concatenate(ws))
        qu, zp = dynamic_int8_weights(q)
        y = g.op1("DynamicQuantizeMatMul", [x, g.const(prefix + ".qweight", qu), g.const(prefix + ".scales", scale),
                                            g.const(prefix + ".zero_points", zp)], name, domain=MS_DOMAIN)
        deq = (q.T.astype(np.float32) * scale[:, None])
        rows = np.cumsum([0] + [w.shape[0] for w in ws])
        return y, {p: _record(path, "int8-channel", src, p, deq[rows[i]:rows[i + 1]]) for i, p in enumerate(parts)}
    bqs = [block_quant(src, p, fmt.nbits, opts.exact_mins) for p in parts]
    bq = concat_rows(bqs)
    y = nbits_matmul(g, x, bq, prefix, name, accuracy_level=opts.accuracy_level)
    storage = f"nbits{bq.bits}-{'zp-min' if bq.m is not None else 'zp'}"
    deq = bq.dequantize()
    rows = np.cumsum([0] + [b.shape[0] for b in bqs])
    return y, {p: _record(path, storage, src, p, deq[rows[i]:rows[i + 1]]) for i, p in enumerate(parts)}


def dynamic_int8_weights(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights q [K, N] as (uint8 q + 128, zero points uint8 [N] = 128): the same values.

    onnxruntime picks DynamicQuantizeMatMul's kernel by the weight type. With int8 weights (U8S8) on x86 CPUs without
    VNNI (AVX2, AVX-512 without VNNI) MLAS sums pairs of uint8 x int8 products in int16 (vpmaddubsw), which
    saturates: measured on an AVX2 EPYC, max |error| 31 against exact integer arithmetic on one 576 x 1536 node,
    and 62% top-1 on a tiny model. The U8U8 kernel widens to int16 first and is exact on every CPU (and as fast
    here: /tmp/padrow/dqmm.py, docs/onnx.md)."""
    return (q.astype(np.int16) + 128).astype(np.uint8), np.full(q.shape[1], 128, np.uint8)


def nbits_matmul(g: GraphBuilder, x: str, bq: BlockQuant, prefix: str, name: str, *, accuracy_level: int) -> str:
    """MatMulNBits, plus the residual block-offset term when the blocks carry one (centered Q4_1 / Q4_K).

        x [.., K] ──► MatMulNBits(q, d, zp) ────────────────────────────────► Add ──► y [.., N]
          └──► Reshape [-1, nb, 32] ──► ReduceSum(axis -1) ──► MatMul(mᵀ [nb, N]) ──┘
    (sum_j x_j ((q_j - zp) d + m) = d sum_j x_j (q_j - zp) + m sum_j x_j, per block)
    """
    n, k = bq.shape
    b, scales, zp = pack_nbits(bq)
    inputs = [x, g.const(prefix + ".qweight", b), g.const(prefix + ".scales", scales),
              g.const(prefix + ".zero_points", zp)]
    y = g.op1("MatMulNBits", inputs, name, domain=MS_DOMAIN, K=k, N=n, bits=bq.bits, block_size=BLOCK,
              accuracy_level=accuracy_level)
    return y if bq.m is None else add_block_offsets(g, x, y, bq, prefix, name)


def add_block_offsets(g: GraphBuilder, x: str, y: str, bq: BlockQuant, prefix: str, name: str) -> str:
    """y + blocksum(x) @ mᵀ: the residual block offsets of centered min-form blocks, in standard ops.

        x [.., K] ──► Reshape [-1, nb, 32] ──► ReduceSum(axis -1) ──► MatMul(mᵀ [nb, N]) ──► Add(y)
    """
    nb = bq.shape[1] // BLOCK
    shape = g.const(prefix + ".block_shape", np.array([-1, nb, BLOCK], np.int64))
    blocks = g.op1("Reshape", [x, shape], name + "/blocks")
    sums = g.op1("ReduceSum", [blocks, g.const(prefix + ".sum_axis", np.array([-1], np.int64))], name + "/block_sum",
                 keepdims=0)
    mins = g.op1("MatMul", [sums, g.const(prefix + ".mins", np.ascontiguousarray(bq.m.T))], name + "/min_term")
    return g.op1("Add", [y, mins], name + "/add_min")


STANDARD_FORMATS = (WeightFormat.FP32, WeightFormat.FP16, WeightFormat.INT8)


def standard_linear(g: GraphBuilder, x: str, parts: Sequence[str], src: WeightSource, opts: ExportOptions,
                    prefix: str, name: str) -> tuple[str, dict[str, TensorRecord]]:
    """`linear` in standard ai.onnx ops only (no MatMulNBits): fp32, fp16 as `linear`; int8 as block-32 weights

        q uint8 [K, N] ──► DequantizeLinear(d, zp [K/32, N], axis 0, block_size 32) ──► MatMul(x, ·) ──► y
        (+ the residual block-offset term of centered Q4_1 / Q4_K blocks, add_block_offsets)
    GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K blocks are transcoded exactly (same BlockQuant as MatMulNBits int8), other
    sources re-quantized per block. onnxruntime's CPU provider fuses DequantizeLinear + MatMul into MatMulNBits.
    Per-output-channel int8 was measured and rejected: 95.5% top-1 on SmolLM2 vs 99.2% (docs/onnx.md).
    """
    if opts.fmt is not WeightFormat.INT8:
        if opts.fmt not in STANDARD_FORMATS:
            raise ValueError(f"weight format {opts.fmt.value} uses com.microsoft ops; standard-op formats: "
                             f"{', '.join(f.value for f in STANDARD_FORMATS)}")
        return linear(g, x, parts, src, opts, prefix, name)
    path = g.path(name)
    bqs = [block_quant(src, p, 8, opts.exact_mins).with_bits(8) for p in parts]
    bq = concat_rows(bqs)
    n, k = bq.shape
    q = g.const(prefix + ".qweight", np.ascontiguousarray(bq.q.reshape(n, k).T))
    d = g.const(prefix + ".scales", np.ascontiguousarray(bq.d.T.astype(np.float32)))
    zp = g.const(prefix + ".zero_points", np.ascontiguousarray(bq.zp.T))
    w = g.op1("DequantizeLinear", [q, d, zp], name + "/dequantize", axis=0, block_size=BLOCK)
    y = g.op1("MatMul", [x, w], name)
    if bq.m is not None:
        y = add_block_offsets(g, x, y, bq, prefix, name)
    storage = f"dq8-block{BLOCK}-{'zp-min' if bq.m is not None else 'zp'}"
    deq = bq.dequantize()
    rows = np.cumsum([0] + [b.shape[0] for b in bqs])
    return y, {p: _record(path, storage, src, p, deq[rows[i]:rows[i + 1]]) for i, p in enumerate(parts)}
