"""The static-shape ONNX profile (export/onnx_static.py, runtime/backends/onnx_static.py) on tiny models, on the CPU
execution provider: parity with the NumPy reference through chunked prompts, verify widths 1..W and rollbacks;
lossless speculative decoding; every shape static and every op standard; the CLI; the errors. No NPU here: what the
NPU providers would do with these graphs is untested (docs/onnx.md)."""
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from specedge.apps.cli import cli  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import ExportProfile, StaticShape, export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.manifest import Profile, read_manifest  # noqa: E402
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnx_providers import select_providers  # noqa: E402
from specedge.runtime.backends.onnx_static import StaticOnnxBackend  # noqa: E402
from specedge.runtime.backends import open_onnx  # noqa: E402
from specedge.runtime.backends.onnxrt import OnnxBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402
from verify_walk import walk_verify_steps  # noqa: E402  (tests/ is on the path)

TOL = 1e-4
W, C = 5, 96


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module", params=TINY_ARCHS)
def pair(request, tmp_path_factory, onnx3):
    """(static fp32 backend, NumPy float32 backend) over one tiny GGUF; llama with 3 layers and a tied head, qwen2
    with q/k/v biases and an untied head."""
    d = tmp_path_factory.mktemp(f"static-{request.param}")
    gguf, _ = onnx3(request.param)  # tests/conftest.py: the shared 3-layer GGUF
    export_gguf_to_onnx(gguf, d / "onnx", WeightFormat.FP32, gate=False, profile=ExportProfile.static(StaticShape(W, C)))
    return open_onnx(d / "onnx", threads=1), NumpyBackend(gguf.load_weights())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("static-formats")
    return d, open_gguf(write_tiny_gguf(d / "m.gguf", arch="llama", n_layers=2, dtype="q4_1", seed=5))


def _export(tiny, fmt: str, shape=StaticShape(W, 64)):
    d, gguf = tiny
    out = d / f"static-{fmt}-{shape.verify_width}-{shape.max_context}"
    if not (out / "manifest.json").is_file():
        export_gguf_to_onnx(gguf, out, WeightFormat(fmt), gate=False, profile=ExportProfile.static(shape))
    return out


def test_prompt_then_verify_steps_with_rollbacks_match_numpy(pair):
    static, ref = pair
    assert isinstance(static, StaticOnnxBackend) and static.caps.max_context == C
    # a 13-token prefill runs as 5 + 5 + 3; widths 1..W, and W+1, W+2 (a verify call longer than W: two pieces)
    walk_verify_steps(static, ref, capacity=C, prefill=13, steps=16, max_width=W + 2, tol=TOL)


def test_kv_rows_land_at_their_positions(pair):
    """The runtime copies exactly the real rows into slots [L, L + t); padded rows write nothing."""
    static, ref = pair
    toks = np.arange(20, 32, dtype=np.int32)
    cs, cr = static.new_cache(16), ref.new_cache(16)
    for a, b in ((0, 7), (7, 9)):  # a padded prompt piece, then a 2-token verify call (3 padded rows)
        static.forward(toks[a:b], cs)
        ref.forward(toks[a:b], cr)
    np.testing.assert_allclose(cs.k[0][0, :, :9], cr.k[0, :, :9], atol=1e-5)
    np.testing.assert_allclose(cs.v[2][0, :, :9], cr.v[2, :, :9], atol=1e-5)
    assert not cs.k[0][0, :, 9:].any() and not cs.v[2][0, :, 9:].any()


def test_speculative_greedy_equals_plain_greedy(pair):
    static, _ = pair
    params = SamplingParams()
    prompt = np.array([5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 5, 9], dtype=np.int32)
    plain = [e.token for e in decode(static, prompt, PLAIN, Request(params, max_tokens=40))]
    for k in (1, 4, 6):  # k = 6 verifies 7 positions: more than W, in two pieces
        spec = [e.token for e in decode(static, prompt, Speculation(NgramDrafter(), k=k),
                                        Request(params, max_tokens=40))]
        assert spec == plain


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8"])
def test_verify_batch_logits_equal_one_token_logits_bit_for_bit(tiny, fmt):
    """Slot = position and masked slots get probability 0, so a token's logits do not depend on how its call was
    batched or padded: lossless greedy speculation in every static format (int8 included)."""
    be = open_onnx(_export(tiny, fmt), threads=2)
    rng = np.random.default_rng(1)
    for past in (1, 7, 40):
        toks = rng.integers(0, be.config.vocab_size, past + 6).astype(np.int32)
        batched, single = be.new_cache(64), be.new_cache(64)
        be.forward(toks[:past], batched)
        be.forward(toks[:past], single)
        be.forward(toks[past:past + 3], batched)  # a verify step that is then rolled back
        batched.rollback(past)
        got = be.forward(toks[past:], batched)  # 6 tokens: 5 + 1 padded
        want = np.concatenate([be.forward(toks[j:j + 1], single) for j in range(past, past + 6)])
        assert np.array_equal(got, want), f"{fmt} past={past}: max |d| {np.abs(got - want).max():.3g}"


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8"])
def test_every_shape_is_static_and_every_op_standard(tiny, fmt):
    out = _export(tiny, fmt)
    model = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)  # also: every op is registered in the standard domain
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 21)]
    assert {n.domain for n in model.graph.node} == {""}
    assert not {"MatMulNBits", "GroupQueryAttention", "SimplifiedLayerNormalization"} & {
        n.op_type for n in model.graph.node}
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True).graph
    values = {v.name: v for v in [*inferred.input, *inferred.output, *inferred.value_info]}
    produced = [o for n in inferred.node for o in n.output if o]
    assert set(produced) <= set(values), "shape inference left values untyped"
    for v in values.values():
        dims = v.type.tensor_type.shape.dim
        assert v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims), v.name
    m = read_manifest(out)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*inferred.input,
                                                                                   *inferred.output]}
    c = m.config
    assert shapes["input_ids"] == shapes["position_ids"] == [1, W]
    assert shapes["attention_bias"] == [1, 1, W, 64] and shapes["logits"] == [1, W, c.vocab_size]
    assert shapes["past_key.1"] == [1, c.n_kv_heads, 64, c.head_dim]
    assert shapes["new_value.1"] == [1, c.n_kv_heads, W, c.head_dim]
    if fmt == "int8":  # block-32 DequantizeLinear: the Q4_1 source blocks transcoded exactly (centered + offsets)
        assert {r["storage"] for n, r in m.tensors.items() if n != "embed"} == {"dq8-block32-zp-min"}
        assert all(r["exact"] for r in m.tensors.values())


def test_manifest_records_the_profile(tiny, tmp_path):
    m = read_manifest(_export(tiny, "fp32"))
    assert m.profile is Profile.STATIC and m.raw["format_version"] == 3
    assert m.io["verify_width"] == W and m.io["max_context"] == 64 and m.io["mask_value"] < -1e3
    assert m.io["new_key"] == "new_key.{i}" and m.io["attention_bias"] == "attention_bias"
    raw = dict(m.raw, format_version=2)  # a static graph claiming the version older readers accept
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ModelFileError, match="does not match format version"):
        read_manifest(tmp_path, verify=False)


def test_errors_are_clear(tiny):
    out = _export(tiny, "fp32")
    be = open_onnx(out, threads=1)
    with pytest.raises(ValueError, match="--max-context 64"):
        be.new_cache(65)
    cache = be.new_cache(64)
    be.forward(np.arange(60, dtype=np.int32), cache)
    with pytest.raises(ValueError, match="context full.*--max-context"):
        be.forward(np.arange(5, dtype=np.int32), cache)
    prompt = np.arange(40, dtype=np.int32)
    with pytest.raises(ValueError, match="re-export with a larger --max-context"):
        list(decode(be, prompt, PLAIN, Request(max_tokens=30)))  # 40 + 30 + k + 1 > 64
    with pytest.raises(ValueError, match="tree masks"):
        be.forward(np.arange(2, dtype=np.int32), be.new_cache(8), tree_mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="open_onnx"):
        OnnxBackend(out)


def test_npu_providers_require_a_static_artifact():
    qnn = ["QNNExecutionProvider", "CPUExecutionProvider"]
    for device, provider in (("qnn", "QNNExecutionProvider"), ("coreml", "CoreMLExecutionProvider"),
                             ("xnnpack", "XnnpackExecutionProvider")):
        with pytest.raises(ValueError, match="needs a static-shape artifact.*--profile static"):
            select_providers(device, [provider, "CPUExecutionProvider"])
        chosen = select_providers(device, [provider, "CPUExecutionProvider"], static_shapes=True)
        assert [p for p, _ in chosen.providers] == [provider, "CPUExecutionProvider"]
    with pytest.raises(ValueError, match="static-shape artifact.*Also: .*QNNExecutionProvider.*install"):
        select_providers("qnn", ["CPUExecutionProvider"])  # both problems named at once
    assert select_providers("cuda", ["CUDAExecutionProvider", *qnn]).device.value == "cuda"  # dynamic is fine there


def test_cli_export_static_then_generate(tiny, tmp_path):
    d, _ = tiny
    out = tmp_path / "static"
    r = run("export", d / "m.gguf", "--weights", "fp32", "--profile", "static", "--verify-width", 4,
            "--max-context", 80, "--out", out, "--threads", 1)
    assert r.exit_code == 0, r.output
    assert "static W=4 C=80" in r.stderr and "parity gate PASS" in r.stderr
    m = read_manifest(out)
    assert m.profile is Profile.STATIC and m.raw["parity"]["passed"] and m.io["verify_width"] == 4
    for drafter in ("ngram", f"model:{out}"):  # a static drafter's cache defaults to its max context (80)
        r = run("generate", out, "hello world", "--backend", "onnx", "--device", "cpu", "--threads", 1,
                "--drafter", drafter, "--max-tokens", 20, "--json", "--baseline", "--temperature", "0")
        assert r.exit_code == 0, r.output
        stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
        assert stats["identical_to_baseline"] is True and stats["backend"] == "onnx"
    r = run("generate", out, "hello world", "--backend", "onnx", "--device", "cpu", "--max-tokens", 200)
    assert r.exit_code != 0 and "--max-context 80" in r.output
    r = run("generate", out, "hi", "--backend", "onnx", "--device", "qnn")
    assert r.exit_code != 0 and "static-shape" not in r.output and "QNNExecutionProvider" in r.output


def test_cli_dynamic_artifact_on_an_npu_device_and_bad_options(tiny, tmp_path):
    d, gguf = tiny
    dynamic = tmp_path / "dynamic"
    export_gguf_to_onnx(gguf, dynamic, WeightFormat.FP32, gate=False)
    r = run("generate", dynamic, "hi", "--backend", "onnx", "--device", "coreml")
    assert r.exit_code != 0 and "needs a static-shape artifact" in r.output and "--profile static" in r.output
    for args, message in ((("--weights", "int4", "--profile", "static"), "fp32, fp16 or int8"),
                          (("--profile", "static", "--max-context", 9999), "exceeds the model's context"),
                          (("--profile", "static", "--verify-width", 99, "--max-context", 64), "--verify-width 99"),
                          (("--verify-width", 4), "apply to --profile static")):
        r = run("export", d / "m.gguf", "--out", tmp_path / "x", *args)
        assert r.exit_code != 0 and message in r.output, r.output
