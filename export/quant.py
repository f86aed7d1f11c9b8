"""Weight encodings for the ONNX graph: block-32 n-bit weights (MatMulNBits) and per-channel int8 (dynamic int8).

One block form covers every GGUF type we transcode (K split into blocks of 32; n = output row, b = block,
j = index in block):

    w[n, 32b+j] = (q[n,b,j] - zp[n,b]) * d[n,b]  (+ m[n,b])
    Q4_0: zp = 8; Q8_0: zp = 128; no m.
    Q4_1 (d*q + min), Q4_K (d*q - dmin*mn): centered, zp = round(-min/d) and residual m = min + zp*d, |m| <= d/2.

Evaluated in float32 in that order, the result is bit-identical to gguf-py's dequantizers ("exact" below) whenever
the residual m is exact in float32; blocks where it is not keep zp = 0 and m = min (also exact).
Why centered: MatMulNBits (accuracy_level 4) quantizes the activations x per block of 32 to int8 and multiplies
them by (q - zp) * d, while the graph adds the residual term m * blocksum(x) from float x (onnx_linear.py). The
activation rounding error e then meets (q - zp) * d, not the whole weight: with zp = 0 it meets d*q (all >= 0, up
to 15 d), which cost 7 points of top-1 agreement on SmolLM2 (docs/onnx.md); centered, it is w - m, as small as the
weight itself (llama.cpp's Q8_1 dot product has the same error).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 32


@dataclass(frozen=True)
class BlockQuant:
    """Block-32 quantized [N, K] matrix in canonical [out, in] layout: w = (q - zp) * d (+ m)."""

    bits: int
    q: np.ndarray  # uint8 [N, nb, 32], values in [0, 2**bits)
    d: np.ndarray  # float32 [N, nb]
    zp: np.ndarray  # uint8 [N, nb]
    m: np.ndarray | None = None  # float32 [N, nb]: residual block offset (min forms), added outside MatMulNBits

    def __post_init__(self) -> None:
        if int(self.q.max(initial=0)) >= 1 << self.bits or int(self.zp.max(initial=0)) >= 1 << self.bits:
            raise ValueError(f"quantized values or zero points exceed {self.bits} bits")

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.q.shape[0]), int(self.q.shape[1] * BLOCK)

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]: (q - zp) * d, then + m (exact products, one rounding in the sum)."""
        w = (self.q.astype(np.float32) - self.zp[..., None].astype(np.float32)) * self.d[..., None]
        if self.m is not None:
            w = w + self.m[..., None]
        return w.reshape(self.shape)

    def with_bits(self, bits: int) -> "BlockQuant":
        """The same values stored with more bits (exact: q and zp just fit in a wider field)."""
        if bits < self.bits:
            raise ValueError("cannot narrow a BlockQuant")
        return BlockQuant(bits, self.q, self.d, self.zp, self.m)


def centered(bits: int, q: np.ndarray, d: np.ndarray, mins: np.ndarray) -> BlockQuant:
    """w = d*q + min rewritten as (q - zp) * d + m with zp = round(-min/d) clipped to the q range, m = min + zp*d.
    Blocks where m is not exact in float32 keep zp = 0, m = min."""
    qmax = (1 << bits) - 1
    safe = np.where(d == 0, np.float32(1.0), d)
    zp = np.clip(np.round(-mins / safe), 0, qmax).astype(np.uint8)
    zp = np.where(d == 0, 0, zp).astype(np.uint8)
    m = (mins + zp.astype(np.float32) * d).astype(np.float32)
    exact = m.astype(np.float64) == mins.astype(np.float64) + zp.astype(np.float64) * d.astype(np.float64)
    return BlockQuant(bits, q, d, np.where(exact, zp, 0).astype(np.uint8), np.where(exact, m, mins).astype(np.float32))


def concat_rows(parts: list[BlockQuant]) -> BlockQuant:
    """Stack along N (fused q|k|v or gate|up); widths are unified, a missing m becomes zeros."""
    bits = max(p.bits for p in parts)
    parts = [p.with_bits(bits) for p in parts]
    m = None
    if any(p.m is not None for p in parts):
        m = np.concatenate([p.m if p.m is not None else np.zeros_like(p.d) for p in parts])
    return BlockQuant(bits, np.concatenate([p.q for p in parts]), np.concatenate([p.d for p in parts]),
                      np.concatenate([p.zp for p in parts]), m)


# ---- from float weights (re-quantization: lossy) ----

def quantize_blocks(w: np.ndarray, bits: int) -> BlockQuant:
    """Asymmetric block-32 quantization with integer zero points (the layout MatMulNBits runs fastest)."""
    n, k = w.shape
    if k % BLOCK:
        raise ValueError(f"in-features {k} is not a multiple of the block size {BLOCK}")
    blocks = w.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    qmax = (1 << bits) - 1
    lo = np.minimum(blocks.min(axis=-1), 0.0)
    hi = np.maximum(blocks.max(axis=-1), 0.0)
    d = ((hi - lo) / qmax).astype(np.float32)
    d = np.where(d == 0, np.float32(1.0), d)
    zp = np.clip(np.round(-lo / d), 0, qmax).astype(np.uint8)
    q = np.clip(np.round(blocks / d[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    return BlockQuant(bits, q, d, zp)


def quantize_per_channel_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output row: (q int8 [K, N] (transposed for DynamicQuantizeMatMul), scale float32 [N])."""
    absmax = np.abs(w).max(axis=1).astype(np.float32)
    scale = np.where(absmax == 0, np.float32(1.0), absmax / np.float32(127.0)).astype(np.float32)
    q = np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8)
    return np.ascontiguousarray(q.T), scale


# ---- from GGUF blocks (transcoding: exact) ----

def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


def _nibbles_split(qs: np.ndarray) -> np.ndarray:
    """GGUF 32-element nibble block: byte j holds elements j (low) and j+16 (high) -> [.., 32] values."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(blocks: np.ndarray) -> BlockQuant:
    d, qs = _f16(blocks[..., 0:2]), blocks[..., 2:18]
    return BlockQuant(4, _nibbles_split(qs), d, np.full(d.shape, 8, np.uint8))


def _q4_1(blocks: np.ndarray) -> BlockQuant:
    d, m, qs = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4]), blocks[..., 4:20]
    return centered(4, _nibbles_split(qs), d, m)


def _q8_0(blocks: np.ndarray) -> BlockQuant:
    d, qs = _f16(blocks[..., 0:2]), blocks[..., 2:34].view(np.int8)
    return BlockQuant(8, (qs.astype(np.int16) + 128).astype(np.uint8), d, np.full(d.shape, 128, np.uint8))


def _q4_k(blocks: np.ndarray) -> BlockQuant:
    """256-element super-blocks of 8 sub-blocks of 32 with 6-bit scales and mins: w = d*sc*q - dmin*mn."""
    from gguf.quants import Q4_K
    n, nsb = blocks.shape[:2]
    flat = blocks.reshape(n * nsb, 144)
    d, dmin = _f16(flat[:, 0:2])[:, None], _f16(flat[:, 2:4])[:, None]
    sc, mn = Q4_K.get_scale_min(flat[:, 4:16])
    scale = d * sc.astype(np.float32)  # [n*nsb, 8]; exact: an 11-bit mantissa times a 6-bit integer
    dm = dmin * mn.astype(np.float32)
    qs = flat[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 64 elements: low nibbles first 32, high nibbles next 32
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(n, nsb * 8, BLOCK)
    return centered(4, q, scale.reshape(n, nsb * 8), (-dm).reshape(n, nsb * 8))


# GGUF type name -> (bytes per block, elements per block, decoder)
GGUF_BLOCKS = {"Q4_0": (18, 32, _q4_0), "Q4_1": (20, 32, _q4_1), "Q8_0": (34, 32, _q8_0), "Q4_K": (144, 256, _q4_k)}


def from_gguf_blocks(qtype: str, raw: np.ndarray, k: int) -> BlockQuant | None:
    """raw: uint8 [N, row_bytes] (canonical row order); None when the type has no exact block-32 form."""
    if qtype not in GGUF_BLOCKS:
        return None
    nbytes, per, decode = GGUF_BLOCKS[qtype]
    if k % per:
        return None
    return decode(np.asarray(raw, dtype=np.uint8).reshape(raw.shape[0], k // per, nbytes))


# ---- MatMulNBits packing ----

def pack_nbits(bq: BlockQuant) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B uint8 [N, nb, 32*bits/8], scales float32 [N, nb], packed zero points) for MatMulNBits.

    4-bit values pack two per byte, element 2i in the low nibble; zero points pack the same way along nb.
    """
    n, nb, _ = bq.q.shape
    zp = bq.zp
    if bq.bits == 8:
        return np.ascontiguousarray(bq.q), bq.d.astype(np.float32), np.ascontiguousarray(zp)
    if bq.bits != 4:
        raise ValueError(f"MatMulNBits packing for {bq.bits} bits is not implemented")
    b = (bq.q[..., 0::2] | (bq.q[..., 1::2] << 4)).astype(np.uint8)
    zpad = np.concatenate([zp, np.zeros((n, nb % 2), np.uint8)], axis=1)
    zpacked = (zpad[:, 0::2] | (zpad[:, 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(b), bq.d.astype(np.float32), np.ascontiguousarray(zpacked)
