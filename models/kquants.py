"""Q4_K, Q5_K and Q6_K encoders for test models (gguf-py dequantizes K-quants but cannot write them).

Simple round-to-nearest in ggml's block layouts (gguf-py quants.py, ggml's get_scale_min_k4), not llama.cpp's
searched scales: enough for seeded tiny models whose kernels are checked against the file's own dequantized values.
Rows whose length is not a multiple of 256 cannot be K-quants; `fallback` names what llama.cpp writes instead.
"""
from __future__ import annotations

import numpy as np

QK_K = 256
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # llama.cpp's type for rows that are not whole superblocks


def _f16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fp16 bytes, the fp32 value they hold)."""
    h = x.astype(np.float16)
    return h.view(np.uint8).reshape(*x.shape[:-1], 2), h.astype(np.float32)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b != 0)


def quantize_q4_k(w: np.ndarray, bits: int = 4) -> np.ndarray:
    """float32 [rows, k] (k % 256 == 0) -> uint8 [rows, k / 256 * 144]; bits 5: Q5_K's [rows, k / 256 * 176]
    (qh[32] before qs: bit 4 of sub-block j's weight e is qh[e] >> j & 1)."""
    rows, k = w.shape
    top = (1 << bits) - 1
    x = w.astype(np.float32).reshape(-1, 8, 32)
    lo, hi = np.minimum(x.min(-1), 0), np.maximum(x.max(-1), 0)
    scale, minv = (hi - lo) / top, -lo
    d_bytes, d = _f16(scale.max(-1, keepdims=True) / 63)
    m_bytes, dmin = _f16(minv.max(-1, keepdims=True) / 63)
    sc = np.clip(np.rint(_div(scale, d)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_div(minv, dmin)), 0, 63).astype(np.uint8)
    eff, off = d * sc, dmin * mn
    q = np.clip(np.rint(_div(x + off[..., None], eff[..., None])), 0, top).astype(np.uint8)
    s = np.empty((len(x), 12), np.uint8)
    s[:, 0:4] = sc[:, :4] | (sc[:, 4:] >> 4) << 6
    s[:, 4:8] = mn[:, :4] | (mn[:, 4:] >> 4) << 6
    s[:, 8:12] = (sc[:, 4:] & 15) | (mn[:, 4:] & 15) << 4
    low = q & 15
    qs = (low[:, 0::2] | low[:, 1::2] << 4).reshape(len(x), 128)  # chunk c: sub-block 2c low nibbles, 2c + 1 high
    if bits == 4:
        return np.concatenate([d_bytes, m_bytes, s, qs], axis=-1).reshape(rows, k // QK_K * 144)
    qh = ((q >> 4).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1).astype(np.uint8)
    return np.concatenate([d_bytes, m_bytes, s, qh, qs], axis=-1).reshape(rows, k // QK_K * 176)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """float32 [rows, k] (k % 256 == 0) -> uint8 [rows, k / 256 * 210]."""
    rows, k = w.shape
    x = w.astype(np.float32).reshape(-1, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d_bytes, d = _f16(scale.max(-1, keepdims=True) / 127)
    sc = np.clip(np.rint(_div(scale, d)), -128, 127).astype(np.int8)
    eff = (d * sc.astype(np.float32))[..., None]
    u = (np.clip(np.rint(_div(x, eff)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # halves of 128
    ql = (u[:, :, :64] & 15) | (u[:, :, 64:] & 15) << 4                                     # [n, 2, 64]
    hi = (u >> 4).reshape(-1, 2, 4, 32)
    qh = hi[:, :, 0] | hi[:, :, 1] << 2 | hi[:, :, 2] << 4 | hi[:, :, 3] << 6                # [n, 2, 32]
    blocks = [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d_bytes]
    return np.concatenate(blocks, axis=-1).reshape(rows, k // QK_K * 210)


ENCODERS = {"Q4_K": quantize_q4_k, "Q5_K": lambda w: quantize_q4_k(w, bits=5), "Q6_K": quantize_q6_k}
