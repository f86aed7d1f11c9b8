"""The CUDA execution provider on tiny seeded models (skipped where onnxruntime has no CUDAExecutionProvider, as in
CI): the GPU graph (float16 attention and KV cache, chains only) against the NumPy reference through verify steps and
rollbacks, the cache resident in GPU memory, lossless speculative decoding, the CLI. Run on a GPU machine with
onnxruntime-gpu: `python -m pytest -q -m cuda tests/test_cuda.py`."""
import gc
import json

import numpy as np
import pytest
from click.testing import CliRunner

ort = pytest.importorskip("onnxruntime")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                 reason="onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu on a GPU)")]

from specedge.apps.cli import cli  # noqa: E402
from specedge.export.onnx_export import GPU, export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.models.manifest import CHAIN_FORMAT_VERSION, PAD_ROW_NONE, read_manifest  # noqa: E402
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import open_onnx  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnx_providers import Device, select_providers  # noqa: E402
from specedge.runtime.backends.onnxrt import GPU_VERIFY_WIDTH, MAX_CUDA_GRAPHS, OnnxBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402
from verify_walk import one_token_and_verify_rows, walk_verify_steps  # noqa: E402  (tests/ is on the path)

TOL = 5e-2  # float16 attention and cache against the float32 reference (logits of the tiny models are O(1))


@pytest.fixture(scope="module", params=TINY_ARCHS)
def gpu_pair(request, tmp_path_factory):
    """(the GPU graph on CUDA, NumPy float32 reference) over one tiny GGUF (qwen2: q/k/v biases, untied head)."""
    d = tmp_path_factory.mktemp(f"cuda-{request.param}")
    gguf = open_gguf(write_tiny_gguf(d / "m.gguf", arch=request.param, n_layers=3, tied=request.param == "llama",
                                     seed=3))
    export_gguf_to_onnx(gguf, d / "gpu", WeightFormat.FP16, profile=GPU, threads=1)
    return open_onnx(d / "gpu", device="cuda"), NumpyBackend(gguf.load_weights()), d


def test_gpu_graph_runs_on_cuda_and_matches_numpy(gpu_pair):
    be, ref, d = gpu_pair
    m = read_manifest(d / "gpu")
    assert m.io["kv_dtype"] == "float16" and m.raw["format_version"] == CHAIN_FORMAT_VERSION
    assert m.pad_row == PAD_ROW_NONE and m.io["kv_pad_rows"] == 0
    assert be.session.get_providers()[0] == "CUDAExecutionProvider" and be.choice.device is Device.CUDA
    walk_verify_steps(be, ref, capacity=96, prefill=13, steps=24, max_width=9, tol=TOL)


def test_kv_cache_stays_in_gpu_memory(gpu_pair):
    be, _, _ = gpu_pair
    cache = be.new_cache(32)
    assert be.kv_device == "cuda"
    assert all(b.device_name().lower() == "cuda" for b in cache._buffers)
    # float16 rows, none for a pad row (the GPU graph has none), 16 scratch rows (fixed width); a graph cache's
    # buffers hold the power of two at or above its capacity, from 256 (onnxrt.py "CUDA graphs")
    c = be.config
    rows = (256 if cache.graph is not None else 32) + GPU_VERIFY_WIDTH
    assert cache.nbytes == 2 * c.n_layers * c.n_kv_heads * rows * c.head_dim * 2
    logits = be.forward(np.arange(5, dtype=np.int32), cache)  # only the logits come back
    assert isinstance(logits, np.ndarray) and logits.shape == (5, be.config.vocab_size)


def test_fixed_width_gives_a_token_the_same_logits_at_any_verify_width_on_cuda(gpu_pair):
    """Every call runs at GPU_VERIFY_WIDTH rows (onnxrt.py), so CUDA's kernels (chosen by row count) give a token the
    same logits in a verify call as in a one-token call, bit for bit; run at each call's own width they differ
    (docs/accelerators.md "Lossless on CUDA")."""
    be, _, d = gpu_pair
    assert be.fixed_width == GPU_VERIFY_WIDTH
    toks = np.random.default_rng(5).integers(0, be.config.vocab_size, 60).astype(np.int32)
    for width in (2, 3, 5, 9, 16, 17, 40):
        one, many = one_token_and_verify_rows(be, toks, 11, width)
        np.testing.assert_array_equal(one, many, err_msg=f"width {width}")


def teacher_forced(be, toks, cache, widths):
    """Logits of toks in calls of the given widths (cycled) into `cache`."""
    out, i, j = [], 0, 0
    while i < len(toks):
        w = widths[j % len(widths)]
        out.append(be.forward(toks[i:i + w], cache))
        i, j = i + w, j + 1
    return np.concatenate(out)


def test_cuda_graphs_replay_the_same_logits(gpu_pair):
    """Each cache's runs are captured once and replayed (onnxrt.py "CUDA graphs"): the logits are bit for bit those
    of the same backend without graphs, through prefill chunks, verify calls and rollbacks; a released cache's
    buffers and graph serve the next cache of that capacity; past MAX_CUDA_GRAPHS caches run without one."""
    _, _, d = gpu_pair
    be = OnnxBackend(read_manifest(d / "gpu"), device="cuda")  # its own graphs (the fixture's are used by others)
    plain = OnnxBackend(read_manifest(d / "gpu"), device="cuda", cuda_graph=False)
    assert be.cuda_graph and not plain.cuda_graph
    toks = np.random.default_rng(9).integers(0, be.config.vocab_size, 90).astype(np.int32)
    want = teacher_forced(plain, toks, plain.new_cache(96), [37, 1, 3, 1, 9, 2])
    cache = be.new_cache(96)
    assert cache.graph is not None
    np.testing.assert_array_equal(teacher_forced(be, toks, cache, [37, 1, 3, 1, 9, 2]), want)
    cache.rollback(40)  # rolled back, then on again
    np.testing.assert_array_equal(teacher_forced(be, toks[40:], cache, [5, 1]), want[40:])
    graph_id = cache.graph.graph_id
    del cache
    gc.collect()
    again = be.new_cache(120)  # the pooled buffers (256 rows; stale ones are past its length) and their graph
    assert again.graph is not None and again.graph.graph_id == graph_id and again.capacity == 120
    np.testing.assert_array_equal(teacher_forced(be, toks, again, [1, 4]), want)
    many = [be.new_cache(32) for _ in range(MAX_CUDA_GRAPHS)]
    assert [c.graph is None for c in many] == [False] * (MAX_CUDA_GRAPHS - 1) + [True]  # `again` holds one
    for c in many[-2:]:
        np.testing.assert_array_equal(teacher_forced(be, toks[:30], c, [3]), want[:30])


def test_a_graph_cache_narrows_at_the_context_end_and_replays_after(gpu_pair):
    """Near the model's context end a call runs narrower than the fixed width, outside the graph; after a rollback
    the graph replays with its own bindings intact."""
    _, _, d = gpu_pair
    be = OnnxBackend(read_manifest(d / "gpu"), device="cuda")
    plain = OnnxBackend(read_manifest(d / "gpu"), device="cuda", cuda_graph=False)
    n = be.config.context_length
    toks = np.random.default_rng(4).integers(0, be.config.vocab_size, n).astype(np.int32)
    want = teacher_forced(plain, toks, plain.new_cache(n), [1])
    cache = be.new_cache(n)
    assert cache.graph is not None
    got = teacher_forced(be, toks, cache, [1])  # the last 15 calls narrow
    np.testing.assert_array_equal(got, want)
    cache.rollback(n // 2)
    np.testing.assert_array_equal(teacher_forced(be, toks[n // 2:n // 2 + 8], cache, [1]), want[n // 2:n // 2 + 8])


def test_speculative_greedy_equals_plain_greedy_on_cuda(gpu_pair):
    """Guaranteed by the fixed width (the test above), on any model; here on the tiny ones."""
    be, _, _ = gpu_pair
    params = SamplingParams()
    prompt = np.array([5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 5, 9], dtype=np.int32)
    plain = [e.token for e in decode(be, prompt, PLAIN, Request(params, max_tokens=60))]
    for k in (1, 4, 8, 16, 20):
        spec = [e.token for e in decode(be, prompt, Speculation(NgramDrafter(), k=k), Request(params, max_tokens=60))]
        assert spec == plain, f"k={k}"


def test_int4_and_fp32_weights_run_on_cuda(gpu_pair, tmp_path):
    """MatMulNBits (int4) and fp32 weights with the float16 attention on CUDA. fp32 against the NumPy reference; int4
    (exported with float activations, accuracy_level 0, as CUDA's MatMulNBits computes) against the same graph on
    the CPU provider, so the comparison is of the kernels, not of the quantization."""
    _, ref, d = gpu_pair
    gguf = open_gguf(d / "m.gguf")
    for fmt in (WeightFormat.FP32, WeightFormat.INT4):
        export_gguf_to_onnx(gguf, tmp_path / fmt.value, fmt, profile=GPU, gate=False, accuracy_level=0)
        be = open_onnx(tmp_path / fmt.value, device="cuda")
        assert be.kv_device == "cuda"
        want_be = ref if fmt is WeightFormat.FP32 else open_onnx(tmp_path / fmt.value, device="cpu")
        toks = np.random.default_rng(1).integers(0, be.config.vocab_size, 24).astype(np.int32)
        got, want = be.forward(toks, be.new_cache(32)), want_be.forward(toks, want_be.new_cache(32))
        np.testing.assert_allclose(got, want, atol=TOL, err_msg=fmt.value)


def test_auto_picks_cuda():
    assert select_providers("auto", ort.get_available_providers()).device is Device.CUDA


def test_cli_generate_on_cuda(gpu_pair, tmp_path):
    _, _, d = gpu_pair
    gated = tmp_path / "gated"  # the CLI loads only artifacts whose parity gate passed
    r = CliRunner().invoke(cli, ["export", str(d / "m.gguf"), "--gpu", "--out", str(gated), "--threads", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for device in ("cuda", "auto"):
        r = CliRunner().invoke(cli, ["generate", str(gated), "hello world", "--backend", "onnx", "--device", device,
                                     "--max-tokens", "24", "--json", "--baseline", "--temperature", "0"],
                                    catch_exceptions=False)
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
        assert stats["identical_to_baseline"] is True
