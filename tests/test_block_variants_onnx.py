"""Block variants (models/block.py) in every ONNX profile against the NumPy reference on tiny seeded models: the
dynamic and layered profiles (GroupQueryAttention plumbing) and the static one (standard ops), through verify steps
with rollbacks, trees and layer plans; the variants a profile refuses, by name."""
import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specedge.export.onnx_export import LAYERED, ExportProfile, FloatSource, StaticShape, export_onnx  # noqa: E402
from specedge.export.onnx_linear import ExportOptions, WeightFormat  # noqa: E402
from specedge.models.block import UnsupportedVariant  # noqa: E402
from specedge.runtime.backends import open_onnx  # noqa: E402
from specedge.runtime.backends.base import LayerPlan  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from block_variants import GEMMA_LIKE, PARTIAL, PHI_LIKE, SPECS, TOL, tokens, variant_weights  # noqa: E402
from verify_walk import walk_verify_steps  # noqa: E402  (tests/ is on the path)


def _export(tmp_path, weights, profile: ExportProfile = ExportProfile()):
    out = tmp_path / "onnx"
    export_onnx(FloatSource(weights), out, ExportOptions(WeightFormat.FP32), profile=profile)
    return open_onnx(out, threads=1)


@pytest.mark.parametrize("name", SPECS)
def test_dynamic_profile_matches_numpy(tmp_path, name):
    w = variant_weights(SPECS[name], seed=3)
    got, ref = _export(tmp_path, w), NumpyBackend(w)
    walk_verify_steps(got, ref, capacity=64, prefill=9, steps=14, max_width=5, tol=TOL)
    cg, cr = got.new_cache(32), ref.new_cache(32)
    got.forward(tokens(7), cg)
    ref.forward(tokens(7), cr)
    tree = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], bool)
    nodes = np.array([3, 5, 8, 13], np.int32)
    np.testing.assert_allclose(got.forward(nodes, cg, tree_mask=tree), ref.forward(nodes, cr, tree_mask=tree),
                               atol=TOL)


def test_layered_profile_matches_numpy_with_plans(tmp_path):
    w = variant_weights(GEMMA_LIKE, seed=4)
    got, ref = _export(tmp_path, w, LAYERED), NumpyBackend(w)
    walk_verify_steps(got, ref, capacity=64, prefill=9, steps=8, max_width=5, tol=TOL)
    for plan in (LayerPlan(layers=(0, 2, 3)), LayerPlan(exit_layer=2)):
        cg, cr = got.new_cache(32), ref.new_cache(32)
        np.testing.assert_allclose(got.forward(tokens(11), cg, plan=plan), ref.forward(tokens(11), cr, plan=plan),
                                   atol=TOL)


@pytest.mark.parametrize("spec", [GEMMA_LIKE, PHI_LIKE, PARTIAL], ids=["gemma-like", "phi-like", "partial"])
def test_static_profile_matches_numpy(tmp_path, spec):
    w = variant_weights(spec, seed=5)
    got, ref = _export(tmp_path, w, ExportProfile.static(StaticShape(4, 48))), NumpyBackend(w)
    walk_verify_steps(got, ref, capacity=48, prefill=9, steps=10, max_width=4, tol=TOL)


@pytest.mark.parametrize("profile", [ExportProfile(), LAYERED], ids=["dynamic", "layered"])
def test_dynamic_profiles_refuse_partial_rotary_by_name(tmp_path, profile):
    with pytest.raises(UnsupportedVariant, match="rotary_fraction=0.5"):
        export_onnx(FloatSource(variant_weights(PARTIAL)), tmp_path / "x", ExportOptions(WeightFormat.FP32),
                    profile=profile)
