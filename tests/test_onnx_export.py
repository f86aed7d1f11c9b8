"""ONNX export: exact GGUF block transcoding, quantized formats against the NumPy reference, the graph's shape,
and the manifest (contents, tokenizer, hashes)."""
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
import onnx  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import FloatSource, GGUFSource, export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat, block_quant  # noqa: E402
from specedge.export.quant import from_gguf_blocks, pack_nbits, quantize_blocks, quantize_per_channel_int8  # noqa
from specedge.models.config import Weights  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.manifest import read_manifest, sha256_file  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnxrt import OnnxBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from specedge.runtime.tokenizer import Tokenizer  # noqa: E402

Q = GGMLQuantizationType


def _q4_k_blocks(rng, rows, k):
    """Random valid Q4_K super-blocks (gguf-py has no Q4_K quantizer): f16 d/dmin, random 6-bit scales and nibbles."""
    n = rows * (k // 256)
    d = (rng.random((n, 2)) * 0.01).astype(np.float16).view(np.uint8)
    rest = rng.integers(0, 256, (n, 140), dtype=np.uint8)
    return np.concatenate([d, rest], axis=1).reshape(rows, -1)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K])
def test_gguf_blocks_transcode_bit_exactly(qtype):
    rng = np.random.default_rng(0)
    rows, k = 6, 256
    if qtype == Q.Q4_K:
        raw = _q4_k_blocks(rng, rows, k)
    else:
        raw = quantize(rng.standard_normal((rows, k)).astype(np.float32), qtype)
    want = dequantize(raw, qtype).reshape(rows, k)
    bq = from_gguf_blocks(qtype.name, raw, k)
    assert np.array_equal(bq.dequantize(), want)
    assert np.array_equal(bq.with_bits(8).dequantize(), want)


def test_pack_nbits_layout():
    """4-bit: element 2i in the low nibble of byte i of its block; zero points packed the same way along blocks."""
    w = np.random.default_rng(1).standard_normal((3, 96)).astype(np.float32)
    bq = quantize_blocks(w, 4)
    b, scales, zp = pack_nbits(bq)
    assert b.shape == (3, 3, 16) and scales.shape == (3, 3) and zp.shape == (3, 2)
    q = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(3, 3, 32)
    assert np.array_equal(q, bq.q)
    assert np.array_equal(np.stack([zp & 0x0F, zp >> 4], -1).reshape(3, 4)[:, :3], bq.zp)
    assert np.abs(bq.dequantize() - w).max() <= scales.max() / 2 + 1e-6


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx-export")


def _parity(d, gguf, n=24, ref_weights=None):
    toks = np.random.default_rng(2).integers(0, gguf.config.vocab_size, n).astype(np.int32)
    ref = NumpyBackend(ref_weights or gguf.load_weights())
    got = OnnxBackend(d, threads=1)
    a, b = got.forward(toks, got.new_cache(n)), ref.forward(toks, ref.new_cache(n))
    return np.abs(a - b).max() / np.abs(b).max(), (a.argmax(1) == b.argmax(1)).mean(), a, b


@pytest.mark.parametrize("dtype,fmt,storage", [("q4_0", WeightFormat.INT4, "nbits4-zp"),
                                               ("q4_1", WeightFormat.INT4, "nbits4-zp-min"),
                                               ("q8_0", WeightFormat.INT8, "nbits8-zp"),
                                               ("q4_1", WeightFormat.INT8, "nbits8-zp-min")])
def test_transcoded_exports_are_exact(tiny_dir, dtype, fmt, storage):
    """Every tensor of a Q4_0/Q4_1/Q8_0 GGUF is stored exactly; float activations (accuracy 0) match to 1e-4."""
    gguf = open_gguf(write_tiny_gguf(tiny_dir / f"{dtype}.gguf", dtype=dtype, seed=5))
    d = tiny_dir / f"{dtype}-{fmt.value}"
    m = json.loads(export_gguf_to_onnx(gguf, d, fmt, accuracy_level=0, gate=False).read_text())
    assert m["exact_tensors"] == m["n_tensors"]
    assert all(t["exact"] and t["max_abs_err"] == 0 for t in m["tensors"].values())
    assert m["tensors"]["layers.0.q"]["storage"] == storage
    assert m["tensors"]["layers.0.q"]["source_type"] == dtype.upper()
    _, _, a, b = _parity(d, gguf)
    np.testing.assert_allclose(a, b, atol=1e-4)


def _dequantized_equivalent(gguf, fmt, src=None, exact_mins=True):
    """The canonical weights with every projection replaced by what the export stores (the NumPy twin)."""
    w = gguf.load_weights()
    src = src or FloatSource(w)
    t = dict(w.tensors)
    for name in t:
        if t[name].ndim == 2 and name != "embed":
            if fmt is WeightFormat.INT8_DYNAMIC:
                q, scale = quantize_per_channel_int8(t[name])
                t[name] = (q.T.astype(np.float32) * scale[:, None])
            else:
                t[name] = block_quant(src, name, fmt.nbits, exact_mins).dequantize()
    return Weights(w.config, t)


@pytest.mark.parametrize("fmt", [WeightFormat.INT8, WeightFormat.INT4])
def test_requantized_block_formats_equal_their_dequantized_twin(tiny_dir, fmt):
    """From float32 weights: MatMulNBits with float activations equals NumPy on the dequantized weights."""
    gguf = open_gguf(write_tiny_gguf(tiny_dir / "f32-untied.gguf", seed=5, tied=False))
    d = tiny_dir / f"f32-{fmt.value}-acc0"
    m = json.loads(export_gguf_to_onnx(gguf, d, fmt, accuracy_level=0, gate=False).read_text())
    assert m["tensors"]["layers.1.down"]["exact"] is False and m["tensors"]["embed"]["exact"] is True
    _, _, a, b = _parity(d, gguf, ref_weights=_dequantized_equivalent(gguf, fmt))
    np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("fmt,rel", [(WeightFormat.FP16, 0.01), (WeightFormat.INT8_DYNAMIC, 0.1),
                                     (WeightFormat.INT8, 0.05), (WeightFormat.INT4, 0.05)])
def test_quantized_formats_at_default_accuracy_are_close(tiny_dir, fmt, rel):
    """Default accuracy level (int8 activations for MatMulNBits, dynamic int8 for int8) vs the dequantized twin."""
    gguf = open_gguf(write_tiny_gguf(tiny_dir / "f32-untied.gguf", seed=5, tied=False))
    d = tiny_dir / f"f32-{fmt.value}"
    export_gguf_to_onnx(gguf, d, fmt, gate=False)
    twin = gguf.load_weights() if fmt is WeightFormat.FP16 else _dequantized_equivalent(gguf, fmt)
    err, top1, _, _ = _parity(d, gguf, ref_weights=twin)
    assert err < rel and top1 >= 0.9, (err, top1)


def test_dynamic_int8_matmul_is_exact_integer_arithmetic():
    """DynamicQuantizeMatMul on the exported weights equals exact integer arithmetic on its quantized activations.
    Fails with int8 weights on x86 CPUs without VNNI (U8S8 kernel: int16 saturation, max |error| ~31 here)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from specedge.export.onnx_linear import dynamic_int8_weights
    from specedge.runtime.backends.ort_threads import session_options
    rng = np.random.default_rng(0)
    k, n = 576, 256
    q, scale = quantize_per_channel_int8(rng.standard_normal((n, k)).astype(np.float32))
    qu, zp = dynamic_int8_weights(q)
    assert np.array_equal(qu.astype(np.int16) - zp.astype(np.int16), q)
    inits = [numpy_helper.from_array(a, name) for a, name in ((qu, "B"), (scale, "s"), (zp, "zp"))]
    node = helper.make_node("DynamicQuantizeMatMul", ["A", "B", "s", "zp"], ["Y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                  helper.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), session_options(ort, 1)[0],
                                providers=["CPUExecutionProvider"])
    a = (3 * rng.standard_normal((4, k))).astype(np.float32)
    lo, hi = min(0.0, float(a.min())), max(0.0, float(a.max()))  # DynamicQuantizeLinear: uint8 per tensor
    sa = (hi - lo) / 255
    za = np.clip(np.round(-lo / sa), 0, 255)
    aq = np.clip(np.round(a / sa) + za, 0, 255)
    want = ((aq - za) @ q.astype(np.float64)) * sa * scale
    np.testing.assert_allclose(sess.run(None, {"A": a})[0], want, rtol=0, atol=1e-3 * np.abs(want).max())


def test_int4_speculative_equals_plain(tiny_dir):
    gguf = open_gguf(write_tiny_gguf(tiny_dir / "q4_1-spec.gguf", dtype="q4_1", seed=7))
    export_gguf_to_onnx(gguf, tiny_dir / "spec-int4", WeightFormat.INT4, gate=False)
    b = OnnxBackend(tiny_dir / "spec-int4", threads=1)
    prompt = np.array([3, 4, 5, 3, 4, 5, 3, 4], np.int32)
    plain = [e.token for e in decode(b, prompt, PLAIN, Request(max_tokens=32))]
    spec = [e.token for e in decode(b, prompt, Speculation(NgramDrafter(), k=4), Request(max_tokens=32))]
    assert spec == plain


def test_graph_is_path_named_and_loadable(tiny_dir):
    gguf = open_gguf(write_tiny_gguf(tiny_dir / "qwen.gguf", arch="qwen2", seed=1))
    d = tiny_dir / "qwen-int4"
    export_gguf_to_onnx(gguf, d, WeightFormat.INT4, gate=False)
    model = onnx.load(str(d / "model.onnx"), load_external_data=False)
    names = {n.name for n in model.graph.node}
    assert all(n.startswith("/") for n in names)
    assert {"/layers.1/attn/qkv_proj", "/layers.1/attn/gqa", "/layers.1/attn/qkv_bias", "/layers.0/mlp/down_proj",
            "/lm_head"} <= names
    assert {o.version for o in model.opset_import} == {21, 1}
    assert all(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer if i.name.endswith(
        "qweight"))


def test_manifest_contents_tokenizer_and_hashes(tiny_dir):
    path = write_tiny_gguf(tiny_dir / "man.gguf", dtype="q8_0", seed=2)
    gguf = open_gguf(path)
    d = tiny_dir / "man"
    export_gguf_to_onnx(gguf, d, WeightFormat.INT8_DYNAMIC, gate=False)
    m = read_manifest(d)
    assert m.raw["format"] == "specedge-onnx" and m.raw["format_version"] == 4 and m.io["kv_pad_rows"] == 1
    assert m.config == gguf.config and m.weight_format == "int8-dynamic"
    assert m.io["past_key"] == "past_key.{i}" and m.io["logits"] == "logits"
    assert m.raw["provenance"]["source_sha256"] == sha256_file(path)
    assert set(m.raw["files"]) == {"model.onnx", "model.onnx.data", "tokenizer.json", "chat_template.jinja"}
    assert m.tensors["layers.0.gate"]["storage"] == "int8-channel"
    assert m.tensors["layers.0.gate"]["source_type"] == "Q8_0"
    spec = m.tokenizer_spec()
    assert spec == gguf.tokenizer_spec()
    assert Tokenizer(spec).fingerprint() == Tokenizer(gguf.tokenizer_spec()).fingerprint()

    bad = tiny_dir / "man-bad"
    shutil.copytree(d, bad)
    with open(bad / "model.onnx.data", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ModelFileError, match="SHA-256"):
        OnnxBackend(bad)
    raw = json.loads((bad / "manifest.json").read_text())
    raw["format_version"] = 99
    (bad / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ModelFileError, match="format version 99"):
        read_manifest(bad, verify=False)
    with pytest.raises(ModelFileError, match="no manifest.json"):
        read_manifest(tiny_dir)


def test_requantized_mins_trade_exactness_for_fewer_nodes(tiny_dir):
    """exact_mins=False stores Q4_1 blocks with integer zero points: no min-term nodes, recorded as not exact."""
    gguf = open_gguf(write_tiny_gguf(tiny_dir / "q4_1-zp.gguf", dtype="q4_1", seed=5, tied=False))
    d = tiny_dir / "q4_1-zp"
    m = json.loads(export_gguf_to_onnx(gguf, d, WeightFormat.INT4, exact_mins=False, accuracy_level=0,
                                      gate=False).read_text())
    assert m["tensors"]["layers.0.q"]["storage"] == "nbits4-zp" and not m["tensors"]["layers.0.q"]["exact"]
    ops = {n.op_type for n in onnx.load(str(d / "model.onnx"), load_external_data=False).graph.node}
    assert "ReduceSum" not in ops
    twin = _dequantized_equivalent(gguf, WeightFormat.INT4, GGUFSource(gguf), exact_mins=False)
    _, _, a, b = _parity(d, gguf, ref_weights=twin)
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_int4_keeps_finer_gguf_types_at_8_bits():
    """A Q4_K_M file's Q6_K tensors have no exact block-32 form: an int4 export stores them at 8 bits (near
    lossless) instead of re-quantizing them to 4 bits; a float source is quantized to the 4 bits asked for."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)

    class Src:
        def __init__(self, blocks):
            self._blocks = blocks

        def float(self, name):
            return w

        def blocks(self, name):
            return self._blocks

        def source_type(self, name):
            return "Q6_K" if self._blocks else "F32"

    fine = block_quant(Src(("Q6_K", np.zeros((8, 210), np.uint8))), "t", 4)
    assert fine.bits == 8
    assert np.abs(fine.dequantize() - w).max() < np.abs(w).max() / 100
    assert block_quant(Src(None), "t", 4).bits == 4


def test_dynamic_onnx_refuses_a_head_size_group_query_attention_cannot_run(tmp_path):
    """onnxruntime's GroupQueryAttention (CPU) runs head sizes in multiples of 16: a head of 8 is refused at export
    with the reason, not at the first run."""
    pytest.importorskip("onnx")
    from specedge.export.onnx_export import FloatSource, export_onnx
    from specedge.export.onnx_linear import ExportOptions, WeightFormat
    from specedge.models.block import UnsupportedVariant
    from specedge.models.tiny import tiny_config, tiny_weights
    from specedge.models.config import Weights
    cfg = tiny_config(d_model=32, n_heads=4, n_kv_heads=2)  # head size 8
    with pytest.raises(UnsupportedVariant, match="head size 8 .* multiple of 16"):
        export_onnx(FloatSource(Weights(cfg, tiny_weights(cfg))), tmp_path / "x", ExportOptions(WeightFormat.FP32))
