"""Format 6 layered artifacts on tiny exported models: token trees (tree mask, RoPE by depth, compaction) and
LoRA-Drop drop steps (low-rank delta, no K/V write, absent slots masked for later queries) equal the NumPy
reference; the LoRA-Drop drafter is lossless on ONNX Runtime; the CLI runs it and the labelled lossy mode."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")

from specedge.apps.cli import cli  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import LAYERED, export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import LayerPlan, open_onnx  # noqa: E402
from specedge.runtime.backends.base import LowRankReuse  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.loradrop import LoRADropDrafter  # noqa: E402
from specedge.runtime.loradrop import Corrections, LoRADropFit, Schedule, fit  # noqa: E402
from specedge.runtime.stats import DecodeStats  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402

TOL = 1e-4
GREEDY = SamplingParams()
# BFS order, node 0 the root: 0 -> {1, 2}, 1 -> {3, 4}, 2 -> {5}
PARENT = [-1, 0, 0, 1, 1, 2]


def tree_mask(parent):
    m = np.eye(len(parent), dtype=bool)
    for i, p in enumerate(parent):
        while p >= 0:
            m[i, p] = True
            p = parent[p]
    return m


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(layered fp32 ONNX, NumPy float32) over one tiny llama GGUF with 6 layers (droppable: 1, 2, 3, 5)."""
    d = tmp_path_factory.mktemp("layered-reuse")
    gguf = open_gguf(write_tiny_gguf(d / "m.gguf", n_layers=6, seed=11))
    export_gguf_to_onnx(gguf, d / "layered", WeightFormat.FP32, gate=False, profile=LAYERED)
    return open_onnx(d / "layered", threads=1), NumpyBackend(gguf.load_weights())


def test_format_6_artifacts_take_trees_and_drop_steps(pair):
    lay, _ = pair
    assert lay.manifest.raw["format_version"] == 6 and lay.caps.tree_mask and lay.caps.layer_reuse
    names = {i.name for i in lay.layers[0].get_inputs()}
    assert {"position_ids", "attn_bias"} <= names


def test_tree_forward_and_compaction_equal_the_numpy_reference(pair):
    lay, ref = pair
    rng = np.random.default_rng(0)
    ctx = rng.integers(0, lay.config.vocab_size, 7).astype(np.int32)
    nodes = rng.integers(0, lay.config.vocab_size, len(PARENT)).astype(np.int32)
    mask = tree_mask(PARENT)
    cl, cr = lay.new_cache(32), ref.new_cache(32)
    lay.forward(ctx, cl)
    ref.forward(ctx, cr)
    got, want = lay.forward(nodes, cl, tree_mask=mask), ref.forward(nodes, cr, tree_mask=mask)
    np.testing.assert_allclose(got, want, atol=TOL)
    path = [0, 1, 4]  # root, its first child, that child's second child
    chain = ref.forward(nodes[path], _prefilled(ref, ctx))
    np.testing.assert_allclose(got[path], chain, atol=TOL)  # a tree row equals the chain of its path
    cl.compact(len(ctx) + np.array(path), len(ctx))
    nxt = np.array([3, 8], np.int32)
    fresh = _prefilled(ref, np.concatenate([ctx, nodes[path]]))
    np.testing.assert_allclose(lay.forward(nxt, cl), ref.forward(nxt, fresh), atol=TOL)


def _prefilled(backend, tokens):
    cache = backend.new_cache(32)
    backend.forward(tokens, cache)
    return cache


def _reuse(cfg, layer, seed):
    rng = np.random.default_rng(seed)
    d = cfg.d_model
    return LowRankReuse(layer, rng.standard_normal(d).astype(np.float32) * 0.1,
                        rng.standard_normal((3, d)).astype(np.float32) * 0.1,
                        rng.standard_normal((d, 3)).astype(np.float32) * 0.1, 2.0)


def test_drop_steps_equal_the_numpy_reference_and_mask_their_slots(pair):
    lay, ref = pair
    plan = LayerPlan(reuse=(_reuse(lay.config, 2, 1), _reuse(lay.config, 3, 2)))
    toks = np.random.default_rng(4).integers(0, lay.config.vocab_size, 12).astype(np.int32)
    cl, cr = _prefilled(lay, toks[:6]), _prefilled(ref, toks[:6])
    h, taps = lay.hidden(toks[6:9], cl, plan=plan, taps=(3, 4))
    h_ref, taps_ref = ref.hidden(toks[6:9], cr, plan=plan, taps=(3, 4))
    np.testing.assert_allclose(h, h_ref, atol=TOL)
    np.testing.assert_allclose(taps[4], taps_ref[4], atol=TOL)
    assert cl.absent[2, 6:9].all() and cl.absent[3, 6:9].all() and not cl.absent[1, 6:9].any()
    # a later full step: layers 2 and 3 must not attend to the slots they never wrote (garbage on purpose)
    for layer in (2, 3):
        k, _ = cl.kv(layer)
        k[:, :, 6:9] = 1e3
    got, want = lay.forward(toks[9:11], cl), ref.forward(toks[9:11], cr)
    np.testing.assert_allclose(got, want, atol=TOL)
    assert not cl.absent[2, 9:11].any()
    k, _ = cl.kv(1)  # ...while a layer that wrote its rows attends to them: garbling those changes the output
    k[:, :, 6:9] = 1e3
    cl.rollback(9)
    assert not np.allclose(lay.forward(toks[9:11], cl), want, atol=TOL)


def test_weight_bytes_count_the_low_rank_factors_instead_of_the_dropped_layers(pair):
    lay, _ = pair
    r = _reuse(lay.config, 2, 1)
    assert lay.weight_bytes(LayerPlan(reuse=(r,))) == (lay.weight_bytes(LayerPlan(layers=(0, 1, 3, 4, 5)))
                                                       + r.a.nbytes + r.b.nbytes)


@pytest.fixture(scope="module")
def corrections(pair):
    lay, _ = pair
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, lay.config.vocab_size, 30).astype(np.int32) for _ in range(3)]
    return fit(lay, seqs, LoRADropFit(rank=4, cycle=3))  # fitted through the layered backend's taps


def test_schedule_steps_equal_the_numpy_reference(pair, corrections):
    lay, ref = pair
    toks = np.random.default_rng(6).integers(0, lay.config.vocab_size, 10).astype(np.int32)
    rows = []
    for backend in (lay, ref):
        sched, cache = Schedule(backend, corrections), _prefilled(backend, toks[:3])
        rows.append(np.stack([sched.step(toks[i:i + 1], cache, i - 3)[0] for i in range(3, 10)]))
    np.testing.assert_allclose(rows[0], rows[1], atol=TOL)


@pytest.mark.parametrize("k", [2, 5])
def test_loradrop_drafter_is_lossless_on_onnx_runtime(pair, corrections, k):
    lay, _ = pair
    prompt = np.array([1, 5, 9, 2], dtype=np.int32)
    plain = [e.token for e in decode(lay, prompt, PLAIN, Request(GREEDY, max_tokens=30))]
    stats = DecodeStats()
    drafted = [e.token for e in decode(lay, prompt, Speculation(LoRADropDrafter(corrections), k=k),
                                       Request(GREEDY, max_tokens=30), stats=stats)]
    assert drafted == plain and stats.n_accepted > 0


def test_corrections_for_another_shape_are_refused(pair, corrections):
    lay, _ = pair
    wrong = Corrections(3, (1, 40), corrections.a[:2], corrections.b[:2])
    with pytest.raises(ValueError, match="do not fit"):
        Schedule(lay, wrong)


def test_int4_layered_runs_drop_steps_but_refuses_lossless_trees(tmp_path):
    gguf = open_gguf(write_tiny_gguf(tmp_path / "m.gguf", n_layers=4, seed=2))
    export_gguf_to_onnx(gguf, tmp_path / "l4", WeightFormat.INT4, gate=False, profile=LAYERED)
    lay = open_onnx(tmp_path / "l4", threads=1)
    assert lay.caps.layer_reuse and not lay.caps.tree_mask and "8 bits" in lay.tree_hint


@pytest.mark.slow
def test_cli_loradrop_on_a_layered_onnx_artifact(pair, tmp_path):
    lay, _ = pair
    art = lay.manifest.root

    def run(*args):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    r = run("export", art.parent / "m.gguf", "--lora-drop", "rank=4,cycle=3", "--out", tmp_path / "ld")
    assert r.exit_code == 0, r.output
    r = run("generate", art, "the cat sat", "--backend", "onnx", "--drafter", f"loradrop:{tmp_path / 'ld'}", "--k", 4,
            "--max-tokens", 16, "--json", "--baseline", "--temperature", "0")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["identical_to_baseline"] is True and "lossy" not in stats
    r = run("generate", art, "the cat sat", "--backend", "onnx", "--lossy", "loradrop", "--max-tokens", 12, "--json")
    assert r.exit_code == 0, r.output
    assert "warning: lossy" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["stats"]["lossy"].startswith("lossy loradrop")
