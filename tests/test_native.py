"""The native engine (csrc/native, runtime/backends/native.py): every kernel against the portable C bit for bit, the
packed weights equal to the GGUF's dequantized values, whole forwards close to the NumPy reference, and its rows
bitwise batch-invariant (widths 1..16, 1 and 2 threads, tree masks), so speculation on it equals its plain greedy.
The real files are in the `real` tier; a sanitizer build runs the kernels and a damaged-file fuzz (`slow`)."""
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from specedge.runtime.backends import native_lib as nl

if nl.available() is not None:
    pytest.skip(f"native engine not built: {nl.available()}", allow_module_level=True)

import specedge  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.models.tiny import TINY_ARCHS, write_model_gguf, write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import BackendKind, info  # noqa: E402
from specedge.runtime.backends.base import LayerPlan  # noqa: E402
from specedge.runtime.backends.blas import every_core  # noqa: E402
from specedge.runtime.backends.base import probe_batch_invariance as batch_invariant  # noqa: E402
from specedge.runtime.backends.native import NativeBackend, NativeUnsupported  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402

import cbuild  # noqa: E402  (tests/ is on sys.path)

LIB = nl.load()
ISAS = nl.cpu_isas(LIB)  # portable first; every SIMD path this CPU runs
FORMATS = list(nl.PACKED)
FLOATS = ("F32", "F16", "BF16")  # matrices multiplied with the float activations (mm_f.c)
PROMPTS = ["the cat sat on the mat and the cat sat on the", "one two three one two three one two",
           "hello world, hello world", "a b c d e f g a b c"]


def random_kquant_blocks(fmt: str, n: int, k: int, rng) -> np.ndarray:
    """Random Q4_K / Q5_K / Q6_K rows built byte by byte (gguf-py cannot quantize K-quants): every bit of the scales, mins
    and quants random, the fp16 super-scales finite and of either sign."""
    nsb = k // 256

    def f16(scale):
        return (rng.standard_normal((n, nsb, 1)) * scale).astype(np.float16).view(np.uint8)

    def rand(width):
        return rng.integers(0, 256, (n, nsb, width), dtype=np.uint8)

    if fmt == "Q4_K":  # d, dmin, 12 bytes of 6-bit scales and mins, qs[128]
        blocks = np.concatenate([f16(0.01), f16(0.01), rand(12), rand(128)], axis=-1)
    elif fmt == "Q5_K":  # Q4_K's fields with qh[32] (bit 4) before qs
        blocks = np.concatenate([f16(0.01), f16(0.01), rand(12), rand(32), rand(128)], axis=-1)
    else:  # Q6_K: ql[128], qh[64], int8 scales[16], d
        blocks = np.concatenate([rand(128), rand(64), rand(16), f16(0.002)], axis=-1)
    return blocks.reshape(n, -1)


def random_matrix(fmt: str, n: int, k: int, seed: int = 0):
    """(GGUF rows uint8 [n, row_bytes], their exact values by gguf-py's dequantize [n, k])."""
    rng = np.random.default_rng(seed)
    if fmt in ("Q4_K", "Q5_K", "Q6_K"):
        raw = random_kquant_blocks(fmt, n, k, rng)
    elif fmt in FLOATS:  # as stored: F32 and F16 elements, BF16 by gguf-py (round to nearest even)
        raw = quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType[fmt]).view(np.uint8)
    else:
        raw = quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType[fmt]).view(np.uint8)
    raw = raw.reshape(n, -1)
    return raw, dequantize(raw, GGMLQuantizationType[fmt]).reshape(n, k)


def width(fmt: str, k: int) -> int:
    """k, or the 256-multiple a K-quant needs (two superblocks at least)."""
    return max(512, k // 256 * 256) if nl.BLOCKS[fmt][1] == 256 else k


@pytest.mark.parametrize("fmt", FORMATS)
def test_packing_keeps_every_weight_s_value(fmt):
    raw, deq = random_matrix(fmt, 37, width(fmt, 96))  # 37 rows: a last group of 5 (padding lanes)
    m = nl.PackedMatrix(fmt, raw)
    assert np.isfinite(deq).all() and np.abs(deq).max() > 0
    assert all(np.array_equal(m.row(i), deq[i]) for i in range(37))
    assert m.nbytes <= raw.nbytes * 1.03 * 48 / 37  # 48: the rows of 3 whole groups; K-quants' 6-bit ints as bytes


# where each format's integer quants sit in its GGUF block, and the byte that makes every one the largest the
# kernels multiply (Q8_0: -128, stored + 128 as 0; the 4-, 5- and 6-bit ones all bits set)
QUANT_BYTES = {"Q4_0": (2, 18, 0xFF), "Q4_1": (4, 20, 0xFF), "Q5_0": (2, 22, 0xFF), "Q8_0": (2, 34, 0x80),
               "Q4_K": (16, 144, 0xFF), "Q5_K": (16, 176, 0xFF), "Q6_K": (0, 192, 0xFF)}


@pytest.mark.parametrize("fmt", list(QUANT_BYTES))
def test_every_isa_agrees_where_the_integer_sums_are_largest(fmt):
    """Every quant at its extreme against activations of +-127 of one sign a row: the largest pair and block sums
    the kernels form (AVX2 keeps a block's 4-bit products in int16 before widening: 8 x 2 x 15 x 127 must fit)."""
    k = width(fmt, 128)
    raw, _ = random_matrix(fmt, 40, k, seed=3)
    nbytes, per = nl.BLOCKS[fmt][0], raw.shape[1] // nl.BLOCKS[fmt][0]
    blocks = raw.reshape(40, per, nbytes)
    lo, hi, byte = QUANT_BYTES[fmt]
    blocks[:, :, lo:hi] = byte
    m = nl.PackedMatrix(fmt, blocks.reshape(40, -1))
    x = np.where(np.arange(16)[:, None] % 2 == 0, 3.0, -3.0) * np.ones((16, k))
    x[5, ::7] = 0.0  # a row whose blocks are not all alike
    x = x.astype(np.float32)
    for span in (0, 1) if m.kquant else (0,):
        want = m.matmul(x, isa=0, span=span)
        assert np.isfinite(want).all() and np.abs(want).max() > 0
        for isa in ISAS:
            for n in (1, 2, 3, 4, 5, 9, 16):
                assert np.array_equal(m.matmul(x[:n], isa=isa, span=span), want[:n]), (nl.isa_name(isa), n, span)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_isa_computes_the_portable_c_bit_for_bit_at_every_width(fmt):
    k = width(fmt, 128)
    raw, deq = random_matrix(fmt, 45, k, seed=1)  # groups of 16, 16, 13: the last one's second 8-lane half part-full
    m = nl.PackedMatrix(fmt, raw)
    x = np.random.default_rng(2).standard_normal((16, k)).astype(np.float32) * 3
    for span in (0, 1) if m.kquant else (0,):  # K-quants: activations per 256 (the default), and per 32 (gemma3's)
        want = m.matmul(x, isa=0, span=span)
        for isa in ISAS:
            assert np.array_equal(m.matmul(x, isa=isa, span=span), want), (nl.isa_name(isa), span)
            for n in range(1, 17):  # a row's result never depends on how many rows share the call
                assert np.array_equal(m.matmul(x[:n], isa=isa, span=span), want[:n]), (nl.isa_name(isa), n, span)
            assert np.array_equal(m.matmul(x[9:10], isa=isa, span=span)[0], want[9])
        if m.kquant:  # the per-32 activations' product, checked below as the default's
            q, d, *_ = quantized(x, 1)
            xq = (q.reshape(16, k // 32, 32).astype(np.float64) * d[:, :, None]).reshape(16, k)
            exact = xq @ deq.T.astype(np.float64)
            assert np.abs(m.matmul(x, span=1) - exact).max() <= 1e-5 * np.abs(exact).max()
    want = m.matmul(x, isa=0)
    # and it is the product of the exact weights with int8-per-32 activations (llama.cpp's q8 scheme), or with the
    # float activations for float weights
    q, d, s, h, _ = quantized(x, 8 if nl.BLOCKS[fmt][1] == 256 else 1)
    xq = (q.reshape(16, k // 32, 32).astype(np.float64) * d[:, :, None]).reshape(16, k)
    if fmt in FLOATS:
        xq = x.astype(np.float64)
    exact = xq @ deq.T.astype(np.float64)
    assert np.abs(want - exact).max() <= 1e-5 * np.abs(exact).max()
    assert np.abs(want - x @ deq.T).max() <= 0.02 * np.abs(x @ deq.T).max()  # activation rounding only


@pytest.mark.parametrize("fmt, rms", [("Q4_K", 0.1), ("Q5_K", 0.05), ("Q6_K", 0.025)])
def test_the_test_models_k_quant_encoders_round_trip_through_gguf_py(fmt, rms):
    from specedge.models.kquants import ENCODERS
    w = np.random.default_rng(4).standard_normal((8, 512)).astype(np.float32)
    back = dequantize(ENCODERS[fmt](w), GGMLQuantizationType[fmt]).reshape(8, 512)
    assert np.sqrt(np.mean((back - w) ** 2)) < rms  # 4- and 6-bit rounding of N(0, 1), nothing worse


def quantized(x: np.ndarray, span: int = 1):
    """The engine's int8-per-32 activations of x: (q, d, s, h, m), one scale per `span` blocks (8: what K-quant
    matrices read)."""
    rows, k = x.shape
    q, d = np.empty((rows, k), np.int8), np.empty((rows, k // 32), np.float32)
    s, h = np.empty((rows, k // 32), np.int32), np.empty((rows, k // 32), np.int32)
    m = np.empty((rows, k // 32), np.float32)
    LIB.se_quantize(nl.fptr(np.ascontiguousarray(x)), rows, k, span, q.ctypes.data, d.ctypes.data, s.ctypes.data,
                    h.ctypes.data, m.ctypes.data)
    return q, d, s, h, m


def test_activation_blocks_round_half_to_even_with_exact_sums():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 0.5 * 127 / 127, -1.5, 2.5]  # scale 1: 0.5 -> 0, -1.5 -> -2, 2.5 -> 2
    x[0, 16:18] = [-7.0, 3.0]
    q, d, s, h, m = quantized(x)
    assert d[0, 0] == 1.0 and list(q[0, :4]) == [127, 0, -2, 2] and s[0, 0] == 123 and h[0, 0] == 127
    assert m[0, 0] == np.float32(d[0, 0]) * np.float32(s[0, 0])  # the min term's factor, formed once per block


def test_float_primitives_agree_across_isas_and_with_numpy():
    rng = np.random.default_rng(3)
    k = rng.standard_normal(256).astype(np.float16)
    x = np.concatenate([np.linspace(-100, 5, 203), [-87.5, -86.9, 0.0]]).astype(np.float32)
    outs = []
    for isa in ISAS:
        y = x.copy()
        LIB.se_vec_exp(nl.fptr(y), len(y), isa)
        outs.append(y)
    assert all(np.array_equal(o, outs[0]) for o in outs)
    ref = np.exp(x.astype(np.float64))
    ok = x >= -87.0
    assert np.all(np.abs(outs[0][ok] - ref[ok]) <= 2e-7 * ref[ok] + 1e-37) and np.all(outs[0][~ok] == 0)
    ys = []
    for isa in ISAS:
        y = np.ones(256, np.float32)
        LIB.se_vec_axpy(nl.fptr(y), 0.75, k.ctypes.data, 256, isa)
        ys.append(y)
    assert all(np.array_equal(y, ys[0]) for y in ys)


@pytest.mark.parametrize("n", [7, 64, 576, 1000])
def test_row_steps_agree_across_isas_bit_for_bit_and_with_numpy(n):
    """Norms' sums of squares, the softmax's max, exp and sum (16 lanes, a fixed tree; any tail), SiLU(g) * u and
    the activations' quantization: every ISA computes the portable C's bits."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    for op, want in ((0, x.astype(np.float64).sum()), (1, (x.astype(np.float64) ** 2).sum()), (2, x.max())):
        got = [LIB.se_vec_reduce(nl.fptr(x), n, op, isa) for isa in ISAS]
        assert len(set(got)) == 1, (op, got)
        assert abs(got[0] - want) <= 1e-5 * max(1.0, abs(want)) * np.sqrt(n), (op, got[0], want)
    sums, es = [], []  # the softmax's exp(x - max) and its sum (AVX-512: one pass; the others: three steps)
    for isa in ISAS:
        e = x.copy()
        sums.append(LIB.se_vec_exp_sum(nl.fptr(e), n, float(x.max()), isa))
        es.append(e)
    steps = (x - x.max()).astype(np.float32)
    LIB.se_vec_exp(nl.fptr(steps), n, 0)
    assert all(np.array_equal(e, steps) for e in es) and len(set(sums)) == 1
    assert sums[0] == LIB.se_vec_reduce(nl.fptr(steps), n, 0, 0)
    assert np.allclose(es[0], np.exp(x.astype(np.float64) - x.max()), rtol=2e-6, atol=1e-30)
    g, u = x, rng.standard_normal(n).astype(np.float32)
    ys = []
    for isa in ISAS:
        y = np.empty(n, np.float32)
        LIB.se_vec_silu_mul(nl.fptr(g), nl.fptr(u), nl.fptr(y), n, isa)
        ys.append(y)
    assert all(np.array_equal(y, ys[0]) for y in ys)
    g64 = g.astype(np.float64)
    assert np.allclose(ys[0], g64 / (1 + np.exp(-g64)) * u, rtol=1e-5, atol=1e-6)
    k = n // 32 * 32
    for span in sorted({1, k // 32} | ({8} if k // 32 % 8 == 0 else set())) if k else ():
        want = quantized(x[None, :k], span)
        runs = np.abs(x[:k]).reshape(-1, span * 32).max(axis=1) / np.float32(127)  # one scale a run of span blocks
        assert np.array_equal(want[1][0], np.repeat(runs, span).astype(np.float32))
        for isa in ISAS:
            q, d = np.empty(k, np.int8), np.empty(k // 32, np.float32)
            s, h = np.empty(k // 32, np.int32), np.empty(k // 32, np.int32)
            m = np.empty(k // 32, np.float32)
            LIB.se_vec_quantize(nl.fptr(x), k // 32, span, q.ctypes.data, d.ctypes.data, s.ctypes.data,
                                h.ctypes.data, m.ctypes.data, isa)
            assert all(np.array_equal(a, b[0]) for a, b in zip((q, d, s, h, m), want)), (nl.isa_name(isa), span)


def blocked_keys(K: np.ndarray) -> np.ndarray:
    """[keys, hd] (keys a multiple of 16) as the K cache stores them: blocks of 16 keys, dims-major."""
    return np.ascontiguousarray(K.reshape(-1, 16, K.shape[1]).transpose(0, 2, 1))


def chained_dot(q: np.ndarray, k: np.ndarray) -> np.float32:
    """q . k as one fused chain over d from 0 (float64 holds each exact product and sum before the one rounding)."""
    acc = np.float32(0)
    for a, b in zip(q.astype(np.float64), k.astype(np.float64)):
        acc = np.float32(a * b + np.float64(acc))
    return acc


@pytest.mark.parametrize("hd", [64, 80, 256])
def test_attention_scores_and_weighted_sums_in_batches_equal_key_by_key(hd):
    """Scores of 1-16 queries over blocks of 16 keys (1-3 in groups of 4 blocks on AVX-512, 2 on AVX2; more in
    chunks of queries): every ISA equals the portable C, each score is its key's fused chain over d times the scale
    whatever the batch, and weighted sums of V rows add in key order."""
    rng = np.random.default_rng(6)
    q = rng.standard_normal((16, hd)).astype(np.float32)
    K = rng.standard_normal((7 * 16, hd)).astype(np.float16)
    Kb = blocked_keys(K)
    idx = rng.permutation(50)[:37].astype(np.int32)
    w = rng.random(37).astype(np.float32)
    for nq in (1, 2, 3, 5, 8, 11, 16):
        got = []
        for isa in ISAS:
            out = np.empty((nq, 6 * 16), np.float32)
            LIB.se_vec_scores(nl.fptr(q), nq, Kb.ctypes.data, 1, 6, hd, 0.125, nl.fptr(out), isa)
            got.append(out)
            one = np.empty((1, 16), np.float32)  # one block, one query: the same bits as in any batch
            LIB.se_vec_scores(nl.fptr(q[nq - 1:]), 1, Kb.ctypes.data, 5, 1, hd, 0.125, nl.fptr(one), isa)
            assert np.array_equal(one[0], out[nq - 1, 64:80]), nl.isa_name(isa)
        assert all(np.array_equal(g, got[0]) for g in got)
    want = [chained_dot(q[2], K[16 + i]) * np.float32(0.125) for i in (0, 17, 95)]
    assert [got[0][2, i] for i in (0, 17, 95)] == want
    sums = []
    for isa in ISAS:
        acc = np.empty(hd, np.float32)
        LIB.se_vec_wsum(nl.fptr(w), K.ctypes.data, nl.iptr(idx), 37, hd, nl.fptr(acc), isa)
        sums.append(acc)
    assert all(np.array_equal(s, sums[0]) for s in sums)
    assert np.allclose(sums[0], w @ K[idx].astype(np.float32), rtol=1e-5, atol=1e-5)
    ws = rng.random((16, 37)).astype(np.float32)  # many queries in one call (a V row converted once for all):
    for nq in (1, 2, 3, 4, 5, 7, 8, 13, 16):  # each query's sums are its own call's, bit for bit, on every ISA
        for isa in ISAS:
            outs = np.empty((nq, hd), np.float32)
            LIB.se_vec_wsum_q(nl.fptr(ws), nq, K.ctypes.data, nl.iptr(idx), 37, hd, nl.fptr(outs), isa)
            for j in range(nq):
                one = np.empty(hd, np.float32)
                LIB.se_vec_wsum(nl.fptr(np.ascontiguousarray(ws[j])), K.ctypes.data, nl.iptr(idx), 37, hd,
                                nl.fptr(one), 0)
                assert np.array_equal(outs[j], one), (nl.isa_name(isa), nq, j)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("native")
    # K-quants need rows of whole 256-superblocks: wider models, so every matrix (embedding included) is one
    wide = {f: {"d_model": 256, "d_ff": 512} for f in ("Q4_K", "Q5_K", "Q6_K")}
    return {(arch, fmt): write_tiny_gguf(d / f"{arch}-{fmt}.gguf", arch=arch, dtype=fmt.lower(), seed=0, n_layers=2,
                                         **wide.get(fmt, {}))
            for arch in TINY_ARCHS for fmt in FORMATS}


def test_attention_over_hundreds_of_keys_and_a_sliding_window_computes_what_numpy_computes(tmp_path):
    """300 tokens, and a 200-token sliding window that starts inside a K-cache block, F32 weights so attention is what
    differs: the logits of every position are the NumPy reference's up to the fp16 KV cache's rounding (measured
    5e-4 and 2.5e-3 of the largest logit)."""
    from dataclasses import replace

    from specedge.models.block import LayerSpec
    from specedge.models.tiny import tiny_config
    cfg = tiny_config(arch="gemma3", n_layers=6, context=512)  # gemma3's pattern: five sliding layers, one global
    layers = tuple(LayerSpec(window=200, rope_theta=10000.0) if i < 5 else LayerSpec() for i in range(6))
    windowed = replace(cfg, block=replace(cfg.block, layers=layers))
    for path in (write_tiny_gguf(tmp_path / "long.gguf", arch="qwen2", dtype="f32", seed=3, context=512),
                 write_tiny_gguf(tmp_path / "win.gguf", arch="gemma3", config=windowed, dtype="f32", seed=3)):
        gguf = open_gguf(path)
        native, ref = NativeBackend(gguf, n_threads=2), NumpyBackend(gguf.load_weights())
        toks = np.random.default_rng(5).integers(0, gguf.config.vocab_size, 300)
        got = native.forward(toks, native.new_cache(300))
        want = ref.forward(toks, ref.new_cache(300))
        assert np.abs(got - want).max() <= 0.005 * np.abs(want).max()
        assert np.array_equal(got.argmax(1), want.argmax(1))


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_tiny_model_computes_what_the_numpy_reference_computes(tiny_files, arch, fmt):
    gguf = open_gguf(tiny_files[arch, fmt])
    assert set(gguf.tensor_types().values()) == {"F32", fmt}  # every matrix in the format under test
    native, ref = NativeBackend(gguf, n_threads=2), NumpyBackend(gguf.load_weights())
    toks = np.random.default_rng(0).integers(0, gguf.config.vocab_size, 40)
    got = native.forward(toks, native.new_cache(64))
    want = ref.forward(toks, ref.new_cache(64))
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("case", ["plain", "partial"])
def test_phi3_s_fused_tensors_run_as_their_row_ranges(tmp_path, case):
    """phi3's attn_qkv (q|k|v rows) and ffn_up (gate|up rows) are packed as the separate matrices their row ranges
    are; LongRoPE and partial rotary (Phi-4-mini-like "partial") come from the RoPE tables the reference builds."""
    pytest.importorskip("transformers")  # phi3_models builds its cases from transformers' Phi3Config
    from phi3_models import canonical_weights, hf_config
    weights = canonical_weights(hf_config(case).to_dict())
    path = write_model_gguf(tmp_path / f"phi3-{case}.gguf", weights.config, dict(weights.tensors), dtype="q8_0")
    gguf = open_gguf(path)
    assert {"layers.0.qkv", "layers.0.gate_up"} <= set(gguf.tensor_types())
    native, ref = NativeBackend(gguf, n_threads=2), NumpyBackend(gguf.load_weights())
    toks = np.random.default_rng(2).integers(0, gguf.config.vocab_size, 40)
    got, want = native.forward(toks, native.new_cache(64)), ref.forward(toks, ref.new_cache(64))
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fmt", ["Q4_1", "Q6_K"])
def test_rows_are_bitwise_invariant_across_widths_threads_and_chunks(tiny_files, threads, fmt):
    gguf = open_gguf(tiny_files["llama", fmt])
    one = NativeBackend(gguf, n_threads=1)
    backend = NativeBackend(gguf, n_threads=threads)
    assert backend.caps.batch_invariant and batch_invariant(backend, range(1, 17), (0, 5, 70))
    toks = np.random.default_rng(1).integers(0, gguf.config.vocab_size, 150)  # > MAX_ROWS: split into calls
    all_at_once = backend.forward(toks, backend.new_cache(160))
    cache = one.new_cache(160)
    by_one = np.concatenate([one.forward(toks[i:i + 1], cache) for i in range(150)])
    assert np.array_equal(all_at_once, by_one)


def test_rows_sharing_an_attention_item_keep_their_own_window_bit_for_bit(tmp_path):
    """A sliding window of 24 keys over 70 cached: one call's rows start their windows at different keys, and an
    attention item of several rows runs over the union of their keys, one outside a row's window weighing +0. Each
    row's logits are still bitwise the row's alone, at widths 1..16 and 1 and 2 threads."""
    from dataclasses import replace

    from specedge.models.block import LayerSpec
    from specedge.models.tiny import tiny_config
    cfg = tiny_config(arch="gemma3", n_layers=6, context=256)  # gemma3's pattern: five sliding layers, one global
    layers = tuple(LayerSpec(window=24, rope_theta=10000.0) if i < 5 else LayerSpec() for i in range(6))
    path = write_tiny_gguf(tmp_path / "win.gguf", arch="gemma3", dtype="q8_0", seed=4,
                           config=replace(cfg, block=replace(cfg.block, layers=layers)))
    gguf = open_gguf(path)
    for threads in (1, 2):
        assert batch_invariant(NativeBackend(gguf, n_threads=threads), range(1, 17), (0, 5, 70))


@pytest.mark.parametrize("heads", [None, "long", (6, 2, 96), (6, 1, 96), (8, 2, 128), (7, 1, 224), (4, 1, 192),
                                   (3, 1, 96)])
def test_a_whole_forward_is_bitwise_the_same_under_every_isa(tiny_files, tmp_path, heads):
    """Matmuls, attention (GQA groups of 2, 3, 4, 6 and 7 query heads, taken 3 at a time with a shorter rest;
    head_dim 16, 32 and 48: every width of the weighted sums' last chunk; 250 tokens: 16 K-cache blocks), exp,
    the fp16 KV writes: the portable C and each SIMD path give identical logits."""
    path = tiny_files["qwen2", "Q4_0"] if heads in (None, "long") else write_tiny_gguf(
        tmp_path / "gqa.gguf", arch="qwen2", dtype="q4_0", d_model=heads[2], n_heads=heads[0], n_kv_heads=heads[1])
    gguf = open_gguf(path)
    toks = np.random.default_rng(4).integers(0, gguf.config.vocab_size, 250 if heads == "long" else 30)
    best, outs = LIB.se_isa(), []
    try:
        for isa in ISAS:
            LIB.se_set_isa(isa)
            b = NativeBackend(gguf, n_threads=2)
            outs.append(b.forward(toks, b.new_cache(len(toks))))
    finally:
        LIB.se_set_isa(best)
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_the_pool_computes_the_same_rows_call_after_call(tiny_files):
    """Hundreds of short phases in a row (the pool's hand-off from one phase to the next is where a race would
    show): 2-thread forwards of every width equal the 1-thread ones, every time."""
    gguf = open_gguf(tiny_files["llama", "Q8_0"])
    one, two = NativeBackend(gguf, n_threads=1), NativeBackend(gguf, n_threads=2)
    toks = np.random.default_rng(5).integers(0, gguf.config.vocab_size, 12)
    want = one.forward(toks, one.new_cache(16))
    for rep in range(40):
        w = 1 + rep % 12
        cache = two.new_cache(16)
        got = np.concatenate([two.forward(toks[s:s + w], cache) for s in range(0, 12, w)])
        assert np.array_equal(got, want), rep


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K"])
def test_a_drafter_s_matrix_on_the_engine_s_pool_equals_one_thread_s(tiny_files, fmt):
    """NativeBackend.matmul (a draft head's packed matrix on the engine's thread pool, between forwards): the bits
    of PackedMatrix.matmul on one thread, at 1 and 2 threads and widths 1..16, and forwards before and after it
    unchanged (it uses none of the model's own buffers)."""
    gguf = open_gguf(tiny_files["llama", "Q8_0"])
    one = NativeBackend(gguf, n_threads=1)
    toks = np.random.default_rng(6).integers(0, gguf.config.vocab_size, 9)
    want = one.forward(toks, one.new_cache(16))
    k = 512
    m = nl.PackedMatrix(fmt, random_matrix(fmt, 96, k, seed=3)[0])
    rng = np.random.default_rng(7)
    for threads in (1, 2):
        b = NativeBackend(gguf, n_threads=threads)
        cache = b.new_cache(16)
        first = b.forward(toks[:4], cache)
        for rows in (1, 2, 5, 16):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            assert np.array_equal(b.matmul(m, x), m.matmul(x)), (threads, rows)
        assert np.array_equal(np.concatenate([first, b.forward(toks[4:], cache)]), want)
    with pytest.raises(ValueError, match=r"x must be \[rows, 512\]"):
        b.matmul(m, np.zeros((2, 256), np.float32))


def test_a_large_kv_cache_sits_on_one_2mb_aligned_buffer_and_a_small_one_does_not():
    from specedge.runtime.backends.native import _huge_pair
    k, v = _huge_pair((30, 3, 17, 64, 16), (30, 3, 272, 64))  # SmolLM2's at 272 slots: 6.3 MB
    assert k.ctypes.data % (1 << 21) == 0 and v.ctypes.data == k.ctypes.data + k.nbytes
    assert not k.any() and not v.any()
    k[...] = 1
    assert not v.any() and k.flags.writeable and v.flags.c_contiguous
    small_k, small_v = _huge_pair((2, 2, 1, 16, 16), (2, 2, 16, 16))
    assert small_k.nbytes + small_v.nbytes < 1 << 21 and not small_k.any() and small_k.base is None is small_v.base


@pytest.mark.parametrize("cached", [4, 14, 126])
def test_a_tree_verifies_each_path_as_its_chain_would(tiny_files, cached):
    """Root, two children, a grandchild under the first child: each node's logits equal the chain's along its path;
    compacting the accepted path leaves the cache a chain would have built (within one 16-key block of the K
    cache, and across two, after 4, 14 and 126 cached positions)."""
    gguf = open_gguf(tiny_files["qwen2", "Q8_0"])
    b = NativeBackend(gguf, n_threads=2)
    prefix, tree = np.arange(5, 5 + cached, dtype=np.int32) % 60, np.array([20, 21, 22, 23], np.int32)
    mask = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], bool)
    cache = b.new_cache(cached + 8)
    b.feed(prefix, cache)
    got = b.forward(tree, cache, tree_mask=mask)
    for path in ([0, 1, 3], [0, 2]):
        c = b.new_cache(cached + 8)
        b.feed(prefix, c)
        assert np.array_equal(b.forward(tree[path], c), got[path])
    cache.compact(np.array([cached, cached + 1, cached + 3]), cached)
    nxt = b.forward(np.array([30], np.int32), cache)
    c = b.new_cache(cached + 8)
    b.feed(np.concatenate([prefix, tree[[0, 1, 3]]]), c)
    assert np.array_equal(b.forward(np.array([30], np.int32), c), nxt)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_K"])
def test_layer_plans_taps_and_a_trimmed_head(tiny_files, fmt):
    gguf = open_gguf(tiny_files["llama", fmt])
    b = NativeBackend(gguf, n_threads=2)
    toks = np.array([4, 8, 15, 16, 23, 42], np.int32)
    h, taps = b.hidden(toks, b.new_cache(16), taps=(0, 1, 2))
    assert set(taps) == {0, 1, 2} and np.array_equal(taps[2], h)
    assert np.array_equal(b.logits_from_hidden(h), b.forward(toks, b.new_cache(16)))
    rows = np.array([3, 77, 150, 299])
    assert np.array_equal(b.logits_from_hidden(h, rows), b.logits_from_hidden(h)[:, rows])
    first, _ = b.hidden(toks, b.new_cache(16), plan=LayerPlan(exit_layer=1))
    assert np.array_equal(first, taps[1])
    skip, _ = b.hidden(toks, b.new_cache(16), plan=LayerPlan(layers=(1,)))
    assert skip.shape == h.shape and not np.array_equal(skip, h)


def test_files_it_cannot_run_are_refused_naming_the_tensor(tmp_path):
    path = write_tiny_gguf(tmp_path / "q5_1.gguf", dtype="q5_1")
    with pytest.raises(NativeUnsupported, match=r"tensor '.*' is Q5_1; the native engine packs Q4_0, Q4_1, Q5_0, Q8_0, "
                                                r"Q4_K, Q5_K, Q6_K, F16, BF16, F32 .*"
                                                r"--backend ik"):
        NativeBackend(open_gguf(path))
    with pytest.raises(ValueError, match="native engine packs"):
        specedge.Engine.open(str(path), backend="native", drafter="none", cache_dir=tmp_path)


def test_registered_as_a_planned_gated_engine():
    engine = info("native")
    assert engine.kind is BackendKind.NATIVE and engine.installed() and engine.planned and engine.gated
    assert engine.many_caches and engine.draft_models


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram", "model:{path}+lookup", "recycle", "skip:1", "exit:1"])
def test_speculation_on_native_equals_its_plain_decoding(tiny_files, tmp_path, drafter):
    path = tiny_files["llama", "Q4_1"]
    common = dict(backend="native", threads=2, ctx=256, cache_dir=tmp_path)
    spec = specedge.Engine.open(str(path), drafter=drafter.format(path=path), **common)
    plain = specedge.Engine.open(str(path), drafter="none", **common)
    assert spec.model.backend.caps.batch_invariant
    for text in PROMPTS:
        want = plain.generate(text, temperature=0, max_tokens=40).tokens
        assert spec.generate(text, temperature=0, max_tokens=40).tokens == want, (drafter, text)


STORY = ("The quick brown fox jumps over the lazy dog. In the beginning, the town was small and quiet; the river ran "
         "past the mill, and every morning the baker opened his shop before sunrise. Children walked to school along "
         "the old stone bridge, and their teacher, a patient woman with grey hair, taught them to read and to count.")


@pytest.mark.real
@pytest.mark.slow
def test_gemma3_270m_s_q5_0_q4_k_q6_k_file_predicts_what_the_numpy_reference_predicts():
    """The catalogue's gemma3 (Q5_0 q/k/v/gate/up, Q4_K and Q6_K o/down, Q8_0 embedding; qk norms, post norms,
    gelu, sliding layers, embedding scale), teacher-forced over 64 tokens of text."""
    from specedge.models.catalog import model_cache_dir
    from specedge.runtime.tokenizer import Tokenizer
    path = model_cache_dir(None) / "gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip("gemma3-270m is not pulled: run `specedge pull gemma3-270m`")
    gguf = open_gguf(path)
    assert {"Q5_0", "Q4_K", "Q6_K"} <= set(gguf.tensor_types().values())
    ids = np.array(Tokenizer(gguf.tokenizer_spec()).encode(STORY)[:64], np.int32)
    assert len(ids) == 64
    native = NativeBackend(gguf, n_threads=2)
    got = native.forward(ids, native.new_cache(64))
    ref = NumpyBackend(gguf.load_weights())
    with every_core():
        want = ref.forward(ids, ref.new_cache(64))
    top = np.sort(want, axis=1)
    differ = got.argmax(1) != want.argmax(1)
    assert differ.mean() <= 0.05 and np.all(top[differ, -1] - top[differ, -2] < 0.5)  # only near ties differ
    assert batch_invariant(native, (1, 3), (0, 17))


SANITIZED = r"""
import numpy as np, sys
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from specedge.runtime.backends import native_lib as nl
from specedge.models.gguf_in import open_gguf
from specedge.runtime.backends.native import NativeBackend
lib = nl.load()
from specedge.models.kquants import ENCODERS
for fmt in nl.PACKED:
    k = 512 if fmt in ENCODERS else 96
    w = np.random.default_rng(0).standard_normal((40, k)).astype(np.float32)
    raw = ENCODERS[fmt](w) if fmt in ENCODERS else quantize(w, Q[fmt]).view(np.uint8).reshape(40, -1)
    m = nl.PackedMatrix(fmt, raw)
    x = np.random.default_rng(1).standard_normal((16, k)).astype(np.float32)
    for n in (1, 2, 5, 16):  # every pass shape: both 8-lane halves at 1-2 rows on AVX2, passes of 5, of 4 and 3
        outs = [m.matmul(x[:n], isa) for isa in nl.cpu_isas(lib)]
        assert all(np.array_equal(o, outs[0]) for o in outs)
    rows = np.stack([m.row(i) for i in range(40)])
    bad = lib.se_mat_new(nl.GGML_TYPES[fmt], x.ctypes.data, 7, 40, k)  # a row length that is not the format's
    assert not bad
assert not lib.se_mat_new(nl.GGML_TYPES["Q4_K"], x.ctypes.data, 144, 40, 96)  # k not whole superblocks
for path in sys.argv[1:]:
    b = NativeBackend(open_gguf(path), n_threads=2)
    c = b.new_cache(80)
    assert np.array_equal(b.matmul(m, x[:3]), m.matmul(x[:3]))  # a drafter's matrix on the model's pool
    b.feed(np.arange(60, dtype=np.int32), c)
    b.forward(np.array([1, 2, 3], np.int32), c, tree_mask=np.tril(np.ones((3, 3), bool)))
    for bad in (np.array([10**6], np.int32), np.array([-1], np.int32)):
        try:
            b.forward(bad, c)
        except ValueError:
            pass
        else:
            raise SystemExit("a token id out of range was accepted")
print("sanitized ok")
"""


@pytest.mark.slow
def test_kernels_and_a_forward_under_address_and_undefined_behaviour_sanitizers(tiny_files, tmp_path):
    sources = sorted((Path(__file__).resolve().parents[1] / "csrc" / "native").glob("*.c"))  # the checkout's
    assert sources, "csrc/native/*.c not found beside tests/"
    lib = tmp_path / "libse_asan.so"
    flags = ["-shared", "-fPIC", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
             "-ffp-contract=off", "-pthread", f"-I{sysconfig.get_paths()['include']}"]
    failed = cbuild.build("cc", flags, sources, lib, link=["-lm"], timeout=600)
    assert not failed, failed
    asan = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "SPECEDGE_NATIVE_LIB": str(lib), "LD_PRELOAD": asan,
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    files = [str(tiny_files["llama", fmt]) for fmt in ("Q4_1", "Q6_K", "Q4_K")]
    r = subprocess.run([sys.executable, "-c", SANITIZED, *files], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "sanitized ok" in r.stdout, r.stderr[-3000:]


def test_a_rebuilt_native_library_re_keys_plans_profiles_and_gates(tmp_path, monkeypatch):
    """The engine's version (the key of cached plans, profiles and gates) is specedge's plus the library's digest:
    a rebuild within one specedge version re-measures instead of trusting numbers taken with other kernels."""
    builds = [tmp_path / "a.so", tmp_path / "b.so"]
    builds[0].write_bytes(b"one build of the kernels")
    builds[1].write_bytes(b"another build of the kernels")
    versions = []
    for lib in (*builds, builds[0]):
        monkeypatch.setenv("SPECEDGE_NATIVE_LIB", str(lib))
        versions.append(info(BackendKind.NATIVE).version())
    base = importlib.metadata.version("specedge")
    assert versions[0] != versions[1] and versions[0] == versions[2]
    assert all(v.startswith(base + "+") and len(v) == len(base) + 13 for v in versions)
