"""The layered ONNX profile on tiny exported models: all layers equal the monolithic graph; layer subsets, early
exit and taps equal the NumPy reference's same plan; drafting with a plan on the shared KV cache, rolled back, leaves
the verify forward exactly as if no draft had run; every tensor stored once."""
import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import LAYERED, export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.manifest import read_manifest  # noqa: E402
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import LayerPlan, open_onnx  # noqa: E402
from specedge.runtime.backends.base import LayeredBackend  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnx_layered import OnnxLayeredBackend  # noqa: E402
from verify_walk import walk_verify_steps  # noqa: E402  (tests/ is on the path)

TOL = 1e-4
PLANS = [LayerPlan(layers=(0, 2, 3)), LayerPlan(exit_layer=2), LayerPlan(layers=(0, 1, 3), exit_layer=3),
         LayerPlan(layers=(3,))]


@pytest.fixture(scope="module", params=TINY_ARCHS)
def trio(request, tmp_path_factory):
    """(layered fp32, monolithic fp32, NumPy float32) over one tiny GGUF: llama 4 layers tied, qwen2 untied."""
    d = tmp_path_factory.mktemp(f"layered-{request.param}")
    tied = request.param == "llama"
    gguf = open_gguf(write_tiny_gguf(d / "m.gguf", arch=request.param, n_layers=4, tied=tied, seed=7))
    export_gguf_to_onnx(gguf, d / "layered", WeightFormat.FP32, gate=False, profile=LAYERED)
    export_gguf_to_onnx(gguf, d / "mono", WeightFormat.FP32, gate=False)
    return open_onnx(d / "layered", threads=1), open_onnx(d / "mono", threads=1), NumpyBackend(gguf.load_weights())


def test_open_onnx_picks_the_layered_backend(trio):
    lay, mono, _ = trio
    assert isinstance(lay, OnnxLayeredBackend) and isinstance(lay, LayeredBackend) and lay.caps.layer_plan
    assert not isinstance(mono, OnnxLayeredBackend)
    seg = lay.manifest.raw["segments"]
    assert len(seg["layers"]) == lay.config.n_layers and {"rope.cos", "rope.sin"} <= set(seg["shared"])


def test_all_layers_equal_the_monolithic_graph_through_verify_steps(trio):
    lay, mono, ref = trio
    walk_verify_steps(lay, mono, capacity=96, prefill=9, steps=12, max_width=5, tol=0.0)  # bit for bit
    walk_verify_steps(lay, ref, capacity=96, prefill=9, steps=6, max_width=5, tol=TOL)


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_layer_plans_and_taps_equal_the_numpy_reference(trio, plan):
    lay, _, ref = trio
    toks = np.random.default_rng(2).integers(0, lay.config.vocab_size, 14).astype(np.int32)
    cl, cr = lay.new_cache(32), ref.new_cache(32)
    lay.forward(toks[:8], cl)  # committed full-model context
    ref.forward(toks[:8], cr)
    taps = (0, 1, 2, 4)
    h, tapped = lay.hidden(toks[8:], cl, plan=plan, taps=taps)
    h_ref, tapped_ref = ref.hidden(toks[8:], cr, plan=plan, taps=taps)
    assert cl.length == cr.length == 14 and h.shape == (6, lay.config.d_model)
    np.testing.assert_allclose(h, h_ref, atol=TOL)
    assert sorted(tapped) == sorted(tapped_ref)  # a tap the plan does not reach is absent in both
    for n in tapped:
        np.testing.assert_allclose(tapped[n], tapped_ref[n], atol=TOL)
    np.testing.assert_allclose(lay.logits_from_hidden(h), ref.logits_from_hidden(h_ref), atol=TOL)
    cl.rollback(8)
    np.testing.assert_allclose(lay.forward(toks[8:], cl, plan=plan), ref.logits_from_hidden(h_ref), atol=TOL)


def test_drafting_on_the_shared_cache_then_verify_equals_never_drafting(trio):
    """Self-speculative KV sharing (docs/algorithms.md 2.3, 2.4): plan forwards write rows of the planned layers only;
    after a rollback the verify forward (all layers) overwrites them, so its logits equal those without a draft."""
    lay, _, _ = trio
    toks = np.random.default_rng(3).integers(0, lay.config.vocab_size, 20).astype(np.int32)
    drafted, clean = lay.new_cache(40), lay.new_cache(40)
    for c in (drafted, clean):
        lay.forward(toks[:10], c)
    k_before = drafted.kv(1)[0].copy()
    for j in range(4):  # four one-token drafts through layers 0 and 2 only
        lay.forward(toks[10 + j:11 + j], drafted, plan=LayerPlan(layers=(0, 2)))
    assert np.array_equal(drafted.kv(1)[0], k_before)  # a skipped layer wrote nothing
    assert not np.array_equal(drafted.kv(0)[0], clean.kv(0)[0])  # a planned one wrote its rows
    drafted.rollback(10)
    got, want = lay.forward(toks[10:15], drafted), lay.forward(toks[10:15], clean)
    assert np.array_equal(got, want)


def test_rows_without_a_trimmed_head_and_bad_trees_are_clear_errors(trio):
    lay, _, _ = trio
    cache = lay.new_cache(8)
    h, _ = lay.hidden(np.arange(2, dtype=np.int32), cache)
    with pytest.raises(ValueError, match="no trimmed LM head"):
        lay.logits_from_hidden(h, rows=np.arange(5))
    with pytest.raises(ValueError, match="lower triangular"):  # not an ancestor mask (a node would see its child)
        lay.forward(np.arange(2, dtype=np.int32), cache, tree_mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="ascending unique"):
        lay.forward(np.arange(2, dtype=np.int32), cache, plan=LayerPlan(layers=(2, 1)))
    with pytest.raises(ValueError, match="context full"):
        lay.forward(np.arange(9, dtype=np.int32), cache)


def test_each_tensor_is_stored_once(tmp_path):
    """int4 layered artifact: the shared data file holds each distinct initializer once (the same bytes as the
    monolithic artifact's data, give or take alignment), reading a plan's weights counts only its layers, and all
    layers give the monolithic logits bit for bit (int8 activation rounding would amplify any difference)."""
    gguf = open_gguf(write_tiny_gguf(tmp_path / "m.gguf", n_layers=3, dtype="q4_1", seed=5))
    export_gguf_to_onnx(gguf, tmp_path / "layered", WeightFormat.INT4, gate=False, profile=LAYERED)
    export_gguf_to_onnx(gguf, tmp_path / "mono", WeightFormat.INT4, gate=False)
    files = {d: json.loads((tmp_path / d / "manifest.json").read_text())["files"] for d in ("layered", "mono")}
    lay_bytes, mono_bytes = files["layered"]["weights.onnx.data"]["bytes"], files["mono"]["model.onnx.data"]["bytes"]
    assert abs(lay_bytes - mono_bytes) < 64 * 64, (lay_bytes, mono_bytes)  # alignment padding only
    assert read_manifest(tmp_path / "layered").profile.value == "layered"
    lay = open_onnx(tmp_path / "layered", threads=1)
    full, early = lay.weight_bytes(), lay.weight_bytes(LayerPlan(exit_layer=1))
    assert early < full and full - early == sum(lay._layer_bytes[1:])
    mono, toks = open_onnx(tmp_path / "mono", threads=1), np.arange(3, 12, dtype=np.int32)
    assert np.array_equal(lay.forward(toks, lay.new_cache(16)), mono.forward(toks, mono.new_cache(16)))  # int4 too


def test_layered_verify_batches_equal_one_token_steps_bit_for_bit(tmp_path):
    """Lossless greedy speculation rests on this (onnx_graph.attention's pad row): the layered graphs keep it, for
    all layers and for a plan."""
    gguf = open_gguf(write_tiny_gguf(tmp_path / "m.gguf", n_layers=3, dtype="q4_1", seed=5))
    export_gguf_to_onnx(gguf, tmp_path / "layered", WeightFormat.INT4, gate=False, profile=LAYERED)
    lay = open_onnx(tmp_path / "layered", threads=2)
    toks = np.random.default_rng(1).integers(0, lay.config.vocab_size, 13).astype(np.int32)
    for plan in (None, LayerPlan(layers=(0, 2))):
        batched, single = lay.new_cache(32), lay.new_cache(32)
        lay.forward(toks[:7], batched)
        lay.forward(toks[:7], single)
        got = lay.forward(toks[7:], batched, plan=plan)
        want = np.concatenate([lay.forward(toks[j:j + 1], single, plan=plan) for j in range(7, 13)])
        assert np.array_equal(got, want), f"{plan}: max |d| {np.abs(got - want).max():.3g}"
