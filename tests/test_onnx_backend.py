"""The ONNX Runtime backend on tiny exported models: parity with the NumPy reference through prefill, verify steps
of width 1..5 and rollbacks to any length; the in-place KV design; lossless speculative decoding; providers."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf  # noqa: E402
from specedge.runtime.backends.base import LayerPlan  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnx_providers import Device, select_providers  # noqa: E402
from specedge.runtime.backends.onnxrt import OnnxBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402
from verify_walk import walk_verify_steps  # noqa: E402  (tests/ is on the path)

TOL = 1e-4


@pytest.fixture(scope="module", params=TINY_ARCHS)
def pair(request, onnx3):
    """(ONNX fp32 backend, NumPy float32 backend) over the same tiny GGUF; llama with 3 layers, untied qwen2."""
    gguf, artifact = onnx3(request.param)  # tests/conftest.py, shared (read-only)
    return OnnxBackend(artifact, threads=1), NumpyBackend(gguf.load_weights())


def test_prompt_then_verify_steps_with_rollbacks_match_numpy(pair):
    onnx_b, ref = pair
    walk_verify_steps(onnx_b, ref, capacity=96, prefill=9, steps=14, max_width=5, tol=TOL)  # verify widths 1..5


def test_kv_rows_are_written_in_place(pair):
    """The shared past/present buffers hold the rotated keys of exactly the committed positions; the pad row's
    scratch K/V (kv_pad_rows rows at the cursor) is the only other write."""
    onnx_b, ref = pair
    toks = np.arange(20, 32, dtype=np.int32)
    co, cr = onnx_b.new_cache(16), ref.new_cache(16)
    onnx_b.forward(toks[:5], co)
    ref.forward(toks[:5], cr)
    onnx_b.forward(toks[5:8], co)
    ref.forward(toks[5:8], cr)
    key0 = co._buffers[0].numpy()[0]  # layer 0 key buffer [n_kv, capacity, hd]
    np.testing.assert_allclose(key0[:, :8], cr.k[0, :, :8], atol=1e-5)
    assert not key0[:, 8 + onnx_b.io["kv_pad_rows"]:].any()


def test_speculative_greedy_equals_plain_greedy(pair):
    onnx_b, _ = pair
    params = SamplingParams()
    prompt = np.array([5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 5, 9], dtype=np.int32)
    plain = [e.token for e in decode(onnx_b, prompt, PLAIN, Request(params, max_tokens=40))]
    for k in (1, 3, 5):
        spec = [e.token for e in decode(onnx_b, prompt, Speculation(NgramDrafter(), k=k),
                                        Request(params, max_tokens=40))]
        assert spec == plain


def test_errors_are_clear(pair):
    onnx_b, _ = pair
    cache = onnx_b.new_cache(4)
    with pytest.raises(ValueError, match="context full"):
        onnx_b.forward(np.arange(5, dtype=np.int32), cache)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        onnx_b.new_cache(onnx_b.config.context_length + 1)
    with pytest.raises(ValueError, match="BFS order"):  # a node before its ancestor
        onnx_b.forward(np.arange(2, dtype=np.int32), cache, tree_mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="layer plans"):
        onnx_b.forward(np.arange(2, dtype=np.int32), cache, plan=LayerPlan(exit_layer=1))


def test_provider_selection():
    cpu_only = ["CPUExecutionProvider"]
    assert select_providers("cpu", cpu_only).providers == [("CPUExecutionProvider", {})]
    auto = select_providers(Device.AUTO, cpu_only)
    assert auto.device is Device.CPU and "cuda" in auto.note and "chose cpu" in auto.note
    gpu = select_providers("auto", ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert gpu.device is Device.CUDA and [p for p, _ in gpu.providers] == ["CUDAExecutionProvider",
                                                                           "CPUExecutionProvider"]
    with pytest.raises(ValueError, match="onnxruntime-gpu"):
        select_providers("cuda", cpu_only)
    with pytest.raises(ValueError, match="QNNExecutionProvider"):
        select_providers("qnn", cpu_only)
    with pytest.raises(ValueError):
        select_providers("tpu", cpu_only)
    xnnpack = select_providers("xnnpack", ["XnnpackExecutionProvider", "CPUExecutionProvider"], threads=2,
                               static_shapes=True)  # an NPU / mobile provider: static-shape artifacts only
    assert xnnpack.providers[0] == ("XnnpackExecutionProvider", {"intra_op_num_threads": "2"})


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8", "int4"])
def test_verify_batch_logits_equal_one_token_logits_bit_for_bit(tmp_path, fmt):
    """Lossless speculation on ONNX rests on this: T positions in one call give exactly the logits of T one-token
    calls, at any cache length and after rollbacks (export/onnx_graph.attention: the pad row keeps onnxruntime's
    attention on one GEMM path). Without the pad row this fails in every format (GEMV vs GEMM rounding)."""
    gguf = open_gguf(write_tiny_gguf(tmp_path / "m.gguf", arch="llama", n_layers=2, dtype="q4_1", seed=5))
    export_gguf_to_onnx(gguf, tmp_path / "onnx", WeightFormat(fmt), gate=False)
    be = OnnxBackend(tmp_path / "onnx", threads=2)
    rng = np.random.default_rng(1)
    for past in (1, 7, 40):
        toks = rng.integers(0, be.config.vocab_size, past + 6).astype(np.int32)
        batched, single = be.new_cache(64), be.new_cache(64)
        be.forward(toks[:past], batched)
        be.forward(toks[:past], single)
        be.forward(toks[past:past + 3], batched)  # a verify step that is then rolled back
        batched.rollback(past)
        got = be.forward(toks[past:], batched)
        want = np.concatenate([be.forward(toks[j:j + 1], single) for j in range(past, past + 6)])
        assert np.array_equal(got, want), f"{fmt} past={past}: max |d| {np.abs(got - want).max():.3g}"
