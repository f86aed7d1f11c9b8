"""The dynamic profile's GPU graph (export/onnx_graph.py, ExportProfile(gpu=True), `specedge export --gpu`) on the CPU
provider: float16 GroupQueryAttention and KV cache, chain-only (format 2), no pad row. onnxruntime 1.32's CPU
provider runs float16 GroupQueryAttention, so the graph is checked here against the NumPy reference and the CPU
graph; tests/test_cuda.py runs it on CUDA where there is one."""
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from specedge.apps.cli import cli  # noqa: E402
from specedge.assembly.load import LoadedModel, artifact_name, batch_invariance_warning, load_onnx  # noqa: E402
from specedge.export.onnx_export import GPU, ExportOptions, ExportProfile, FloatSource, export_gguf_to_onnx, \
    export_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.export.parity_gate import Tolerance  # noqa: E402
from specedge.models.block import UnsupportedVariant  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.models.manifest import CHAIN_FORMAT_VERSION, PAD_ROW_NETWORK, PAD_ROW_NONE, Profile, \
    read_manifest  # noqa: E402
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import BackendKind, open_onnx  # noqa: E402
from specedge.runtime.backends.base import require_tree  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnxrt import GPU_VERIFY_WIDTH, OnnxBackend, artifact_variance  # noqa: E402
from specedge.runtime.cores import cpu_info  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.drafters import check_target, parse_drafter  # noqa: E402
from specedge.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402
from block_variants import GEMMA_LIKE, variant_weights  # noqa: E402  (tests/ is on the path)
from verify_walk import one_token_and_verify_rows, walk_verify_steps  # noqa: E402

TOL = 5e-2  # float16 attention and cache against the float32 reference (logits of the tiny models are O(1))
AVX2 = ("avx2", "fma")  # a CPU without AVX-512


@pytest.fixture(scope="module", params=TINY_ARCHS)
def gpu_pair(request, tmp_path_factory):
    """(the GPU graph fp16 on the CPU provider, NumPy float32 reference, directory) over one tiny GGUF (qwen2: q/k/v
    biases, untied head); the CPU fp32 graph of the same GGUF is exported into directory/cpu."""
    d = tmp_path_factory.mktemp(f"gpu-graph-{request.param}")
    gguf = open_gguf(write_tiny_gguf(d / "m.gguf", arch=request.param, n_layers=3, tied=request.param == "llama",
                                     seed=3))
    export_gguf_to_onnx(gguf, d / "gpu", WeightFormat.FP16, gate=False, profile=GPU)
    export_gguf_to_onnx(gguf, d / "cpu", WeightFormat.FP32, gate=False)
    return open_onnx(d / "gpu", threads=1), NumpyBackend(gguf.load_weights()), d


def test_graph_is_float16_attention_chain_only_without_pad_row(gpu_pair):
    be, _, d = gpu_pair
    m = read_manifest(d / "gpu")
    assert m.raw["format_version"] == CHAIN_FORMAT_VERSION and m.profile is Profile.DYNAMIC
    assert m.io["kv_dtype"] == "float16" and m.io["kv_pad_rows"] == 0 and m.io["pad_row"] == PAD_ROW_NONE
    assert m.pad_row == PAD_ROW_NONE and read_manifest(d / "cpu").pad_row == PAD_ROW_NETWORK
    assert "position_ids" not in m.io and "tree_bias" not in m.io
    g = onnx.load(str(m.model_path), load_external_data=False).graph
    inputs = {i.name: i.type.tensor_type.elem_type for i in g.input}
    outputs = {o.name: o.type.tensor_type.elem_type for o in g.output}
    assert set(inputs) == {"input_ids", "seqlens_k", "total_sequence_length",
                           *(f"past_{kv}.{i}" for kv in ("key", "value") for i in range(be.config.n_layers))}
    assert all(t == onnx.TensorProto.FLOAT16 for n, t in inputs.items() if n.startswith("past_"))
    assert outputs.pop("logits") == onnx.TensorProto.FLOAT
    assert set(outputs.values()) == {onnx.TensorProto.FLOAT16}  # present_key.i / present_value.i
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == be.config.n_layers
    for node in gqa:
        # CUDA's kernel needs its lengths straight from the graph inputs (docs/accelerators.md), and no bias
        assert list(node.input[5:]) == ["seqlens_k", "total_sequence_length", "rope.cos", "rope.sin"]
    consts = {t.name: t.data_type for t in g.initializer}
    assert consts["rope.cos"] == consts["rope.sin"] == onnx.TensorProto.FLOAT16
    assert not [n.name for n in g.node if "pad_row" in n.name or "attn_pad" in n.name]
    casts = {n.name.rsplit("/", 1)[-1]: [a.i for a in n.attribute] for n in g.node if n.op_type == "Cast"
             and n.name.endswith(("/attn/qkv_cast", "/attn/out_cast"))}  # q|k|v to float16, the output back
    assert casts == {"qkv_cast": [onnx.TensorProto.FLOAT16], "out_cast": [onnx.TensorProto.FLOAT]}
    assert sum(n.op_type == "Cast" and n.name.endswith("/attn/qkv_cast") for n in g.node) == be.config.n_layers


def test_logits_match_numpy_through_verify_steps_and_rollbacks(gpu_pair):
    be, ref, _ = gpu_pair
    # float16 rows, none for a pad row, 16 scratch rows for a padded call (fixed width)
    assert be.kv_device == "cpu" and be.new_cache(8).nbytes == 2 * be.config.n_layers * be.config.n_kv_heads \
        * (8 + GPU_VERIFY_WIDTH) * be.config.head_dim * 2
    walk_verify_steps(be, ref, capacity=96, prefill=13, steps=24, max_width=9, tol=TOL)


def test_greedy_continuation_agrees_with_the_cpu_graph(gpu_pair):
    """Greedy decoding of the fp32 CPU graph, then the GPU graph teacher-forced on the same tokens, one token per
    call: top-1 equal on nearly every position (float16 attention only moves near-ties)."""
    gpu, _, d = gpu_pair
    cpu = open_onnx(d / "cpu", threads=1)
    seq = list(np.random.default_rng(7).integers(0, cpu.config.vocab_size, 8))
    cache = cpu.new_cache(80)
    logits = cpu.forward(np.array(seq, np.int32), cache)
    for _ in range(48):
        seq.append(int(logits[-1].argmax()))
        logits = cpu.forward(np.array(seq[-1:], np.int32), cache)
    gc = gpu.new_cache(80)
    got = [int(gpu.forward(np.array([t], np.int32), gc)[-1].argmax()) for t in seq[:-1]]
    agree = np.mean(np.array(got[7:]) == np.array(seq[8:]))
    assert agree >= 0.95, agree


def test_tree_drafters_are_refused_with_the_reason(gpu_pair):
    be, _, d = gpu_pair
    assert not be.caps.tree_mask and not be.caps.tree_inputs
    assert "GPU graph" in be.caps.tree_hint and "--gpu" in be.caps.tree_hint
    with pytest.raises(ValueError, match="GPU graph"):
        require_tree(be)
    with pytest.raises(ValueError, match="GPU graph"):
        check_target(parse_drafter("recycle"), be)
    with pytest.raises(ValueError, match="chain drafter"):
        be.forward(np.arange(3, dtype=np.int32), be.new_cache(8), tree_mask=np.tril(np.ones((3, 3), bool)))
    check_target(parse_drafter("ngram"), be)  # chain drafters are fine


def test_batch_invariance_warning_names_the_gpu_graph_run_at_each_calls_width(gpu_pair):
    be, _, d = gpu_pair
    m = read_manifest(d / "gpu")
    own_width = LoadedModel(d / "gpu", None, None, OnnxBackend(m, threads=1, fixed_width=0), BackendKind.ONNX,
                            manifest=m)
    fixed = LoadedModel(d / "gpu", None, None, be, BackendKind.ONNX, manifest=m)
    note = batch_invariance_warning(own_width)
    assert note is not None and "GPU graph" in note and "without --gpu" in note and "fixed width" in note
    assert batch_invariance_warning(fixed) is None  # the default: every call padded to 16 rows
    assert fixed.backend.caps.batch_invariant and not own_width.backend.caps.batch_invariant
    cpu = open_onnx(d / "cpu", threads=1)
    assert cpu.caps.batch_invariant
    for flags in (AVX2, ("avx2", "avx512f")):  # whatever the CPU: the GPU graph's variance is its call width
        assert artifact_variance(m, 0, flags) == own_width.backend.caps.variance
        assert artifact_variance(m, GPU_VERIFY_WIDTH, flags) is None
        assert artifact_variance(read_manifest(d / "cpu"), 0, flags) is None


def test_fixed_width_gives_a_token_the_same_logits_at_any_verify_width(gpu_pair):
    """The GPU graph runs every call at GPU_VERIFY_WIDTH rows (onnxrt.py), so a verify call's rows equal one-token
    calls' bit for bit: here on the CPU provider, whose one-row kernels differ otherwise (tests/test_cuda.py: CUDA)."""
    be, ref, d = gpu_pair
    assert be.fixed_width == GPU_VERIFY_WIDTH == 16
    assert open_onnx(d / "cpu", threads=1).fixed_width == 0  # the CPU graph has its pad row instead
    toks = np.random.default_rng(5).integers(0, be.config.vocab_size, 60).astype(np.int32)
    for width in (2, 3, 5, 9, 16, 17, 40):  # 17 and 40: calls longer than the fixed width run in chunks of it
        one, many = one_token_and_verify_rows(be, toks, 11, width)
        np.testing.assert_array_equal(one, many, err_msg=f"width {width}")
    np.testing.assert_allclose(one, ref.forward(toks, ref.new_cache(64))[11:], atol=TOL)
    # the cache holds scratch rows for a padded call past its capacity: a full cache still takes its last token
    c = be.new_cache(20)
    be.forward(toks[:19], c)
    np.testing.assert_allclose(be.forward(toks[19:20], c)[0], ref.forward(toks[:20], ref.new_cache(20))[-1], atol=TOL)
    with pytest.raises(ValueError, match="context full"):
        be.forward(toks[:1], c)


def test_fixed_width_narrows_where_the_models_context_ends(gpu_pair):
    """The RoPE tables end at the model's context: the last calls there run narrower (and still match)."""
    be, ref, _ = gpu_pair
    n = be.config.context_length
    toks = np.random.default_rng(2).integers(0, be.config.vocab_size, n).astype(np.int32)
    c = be.new_cache(n)
    be.forward(toks[:n - 3], c)
    got = np.stack([be.forward(toks[i:i + 1], c)[0] for i in range(n - 3, n)])
    np.testing.assert_allclose(got, ref.forward(toks, ref.new_cache(n))[n - 3:], atol=TOL)


def test_speculative_greedy_equals_plain_greedy_on_the_gpu_graph(gpu_pair):
    be, _, _ = gpu_pair
    params = SamplingParams()
    prompt = np.array([5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 5, 9], dtype=np.int32)
    plain = [e.token for e in decode(be, prompt, PLAIN, Request(params, max_tokens=60))]
    for k in (1, 4, 8, 16, 20):
        spec = [e.token for e in decode(be, prompt, Speculation(NgramDrafter(), k=k), Request(params, max_tokens=60))]
        assert spec == plain, f"k={k}"


def test_batch_invariance_warning_for_attention_only_pad_rows_is_unchanged(gpu_pair, tmp_path):
    """An int4 artifact written before io.pad_row: warned on CPUs without AVX-512 only."""
    be, _, d = gpu_pair
    export_gguf_to_onnx(open_gguf(d / "m.gguf"), tmp_path / "old", WeightFormat.INT4, gate=False)
    path = tmp_path / "old" / "manifest.json"
    m = json.loads(path.read_text())
    del m["io"]["pad_row"]
    path.write_text(json.dumps(m))
    manifest = read_manifest(tmp_path / "old", verify=False)
    assert "before the pad row" in artifact_variance(manifest, 0, AVX2).warning("old")
    assert artifact_variance(manifest, 0, ("avx2", "avx512f")) is None
    # the backend declares it for the CPU it runs on (runtime.cores.cpu_info), and the warning reads it
    loaded = LoadedModel(tmp_path / "old", None, None, OnnxBackend(manifest, threads=1, verify=False),
                         BackendKind.ONNX, manifest=manifest)
    want = artifact_variance(manifest, 0, cpu_info()[1])
    assert loaded.backend.caps.variance == want
    assert batch_invariance_warning(loaded) == (None if want is None else want.warning("old"))


def test_fp32_and_int4_weights(gpu_pair, tmp_path):
    """fp32 weights with float16 attention pass the fp16 gate tolerance; int4 (MatMulNBits) runs too and agrees
    with the CPU int4 graph on most top-1s."""
    _, ref, d = gpu_pair
    gguf = open_gguf(d / "m.gguf")
    assert Tolerance.for_format("fp32", "float16") == Tolerance.for_format("fp16")
    assert Tolerance.for_format("fp32") != Tolerance.for_format("fp16")
    export_gguf_to_onnx(gguf, tmp_path / "fp32", WeightFormat.FP32, gate=False, profile=GPU)
    walk_verify_steps(open_onnx(tmp_path / "fp32", threads=1), ref, capacity=64, prefill=9, steps=8, max_width=5,
                      tol=TOL)
    export_gguf_to_onnx(gguf, tmp_path / "int4", WeightFormat.INT4, gate=False, profile=GPU)
    export_gguf_to_onnx(gguf, tmp_path / "int4-cpu", WeightFormat.INT4, gate=False)
    toks = np.random.default_rng(2).integers(0, ref.config.vocab_size, 40).astype(np.int32)
    a, b = (open_onnx(tmp_path / n, threads=1) for n in ("int4", "int4-cpu"))
    la, lb = a.forward(toks, a.new_cache(40)), b.forward(toks, b.new_cache(40))
    assert np.mean(la.argmax(-1) == lb.argmax(-1)) >= 0.9 and np.abs(la - lb).max() < 0.5


def test_profile_and_variant_refusals(tmp_path):
    with pytest.raises(ValueError, match="dynamic-profile"):
        ExportProfile(Profile.LAYERED, gpu=True)
    with pytest.raises(UnsupportedVariant, match="sliding window"):  # no bias to carry the window mask
        export_onnx(FloatSource(variant_weights(GEMMA_LIKE)), tmp_path / "x", ExportOptions(WeightFormat.FP32),
                    profile=GPU)
    assert artifact_name("smollm2-135m", "fp16", gpu=True) == "smollm2-135m-onnx-gpu-fp16"
    assert artifact_name("smollm2-135m", "fp16") == "smollm2-135m-onnx-fp16"


def test_cli_export_gpu_gates_and_loads(gpu_pair, tmp_path):
    _, _, d = gpu_pair
    out = tmp_path / "gated"
    r = CliRunner().invoke(cli, ["export", str(d / "m.gguf"), "--gpu", "--out", str(out), "--threads", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["weight_format"] == "fp16" and m["io"]["pad_row"] == PAD_ROW_NONE and m["parity"]["passed"]
    loaded = load_onnx(str(out), device="cpu", threads=1)
    assert loaded.backend.io["kv_dtype"] == "float16"
    for bad, hint in ((["--profile", "static"], "--gpu"), (["--weights", "int8-dynamic"], "CPU provider only"),
                      (["--drafter-vocab", "16"], "--drafter-vocab"), (["--format", "gguf"], "--gpu")):
        r = CliRunner().invoke(cli, ["export", str(d / "m.gguf"), "--gpu", "--out", str(tmp_path / "bad"), *bad])
        assert r.exit_code == 2 and hint in r.output, r.output
