"""The NumPy reference transformer and its KV cache on small random seeded weights."""
import numpy as np
import pytest

from specedge.models.config import ModelConfig, Weights
from specedge.runtime.backends.base import LayerPlan
from specedge.runtime.backends.numpy_ref import NumpyBackend, linear


def random_weights(seed=0, *, qkv_bias=False, tied=True, n_layers=3, vocab=97) -> Weights:
    cfg = ModelConfig(arch="qwen2" if qkv_bias else "llama", n_layers=n_layers, d_model=32, n_heads=4, n_kv_heads=2,
                      head_dim=8, d_ff=48, vocab_size=vocab, rms_eps=1e-5, rope_theta=10000.0, context_length=128,
                      tied_embeddings=tied, qkv_bias=qkv_bias)
    rng = np.random.default_rng(seed)
    t = {n: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32) for n, s in cfg.tensor_names().items()}
    for n in t:
        if n.endswith("norm"):
            t[n] = (1 + 0.1 * rng.standard_normal(t[n].shape)).astype(np.float32)
    t["embed"] *= 4
    return Weights(cfg, t)


@pytest.fixture(params=[dict(), dict(qkv_bias=True, tied=False)], ids=["llama", "qwen2-like"])
def backend(request):
    return NumpyBackend(random_weights(**request.param), dtype=np.float64)


def test_batched_equals_incremental(backend):
    toks = np.random.default_rng(1).integers(0, 97, 12).astype(np.int32)
    full = backend.forward(toks, backend.new_cache(32))
    cache = backend.new_cache(32)
    rows = [backend.forward(toks[i:i + 1], cache)[0] for i in range(len(toks))]
    np.testing.assert_allclose(full, np.stack(rows), atol=1e-9)
    assert cache.length == len(toks)


def test_rollback_overwrites_rejected_positions(backend):
    toks = np.arange(10, dtype=np.int32)
    cache = backend.new_cache(32)
    backend.forward(toks[:6], cache)
    backend.forward(np.array([50, 51, 52], np.int32), cache)  # a rejected draft
    cache.rollback(6)
    after = backend.forward(toks[6:], cache)
    np.testing.assert_allclose(after, backend.forward(toks, backend.new_cache(32))[6:], atol=1e-9)
    with pytest.raises(ValueError, match="roll back"):
        cache.rollback(11)


def test_context_full_is_a_clear_error(backend):
    cache = backend.new_cache(4)
    with pytest.raises(ValueError, match="context full"):
        backend.forward(np.arange(5, dtype=np.int32), cache)


def test_chain_tree_mask_equals_causal(backend):
    toks = np.arange(3, 9, dtype=np.int32)
    tree = np.tril(np.ones((6, 6), dtype=bool))
    np.testing.assert_allclose(backend.forward(toks, backend.new_cache(16), tree_mask=tree),
                               backend.forward(toks, backend.new_cache(16)), atol=1e-12)


def test_tree_branches_match_their_own_chains(backend):
    """Root 0 with two children (1, 2): each child's logits equal those of the chain [root, child]."""
    cache = backend.new_cache(16)
    backend.forward(np.array([5, 6], np.int32), cache)
    mask = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=bool)
    out = backend.forward(np.array([7, 8, 9], np.int32), cache, tree_mask=mask)  # positions 2, 3, 3
    for child, row in ((8, 1), (9, 2)):
        ref = backend.forward(np.array([5, 6, 7, child], np.int32), backend.new_cache(16))[-1]
        np.testing.assert_allclose(out[row], ref, atol=1e-9)


def test_layer_plan_subsets_and_early_exit(backend):
    toks = np.arange(4, dtype=np.int32)
    full = backend.forward(toks, backend.new_cache(8))
    all_layers = backend.forward(toks, backend.new_cache(8), plan=LayerPlan(layers=(0, 1, 2)))
    np.testing.assert_allclose(full, all_layers, atol=1e-12)
    early = backend.forward(toks, backend.new_cache(8), plan=LayerPlan(exit_layer=1))
    skip = backend.forward(toks, backend.new_cache(8), plan=LayerPlan(layers=(0,)))
    np.testing.assert_allclose(early, skip, atol=1e-12)
    assert np.abs(early - full).max() > 1e-3
    assert backend.weight_bytes(LayerPlan(exit_layer=1)) < backend.weight_bytes()
    with pytest.raises(ValueError, match="ascending"):
        LayerPlan(layers=(2, 1)).resolve(3)


def test_float32_close_to_float64():
    w = random_weights()
    toks = np.arange(20, dtype=np.int32)
    a = NumpyBackend(w, np.float32).forward(toks, NumpyBackend(w).new_cache(32))
    b = NumpyBackend(w, np.float64).forward(toks, NumpyBackend(w, np.float64).new_cache(32))
    assert np.abs(a - b).max() < 1e-3
    assert a.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_computes_x_times_w_transposed(dtype):
    """`linear` is (w @ x.T).T for speed (BLAS packs the weights as its left operand): the same products, summed in
    BLAS's order (on this project's machines x @ w.T's float32 bits at 1-300 rows; numpy_ref.linear)."""
    rng = np.random.default_rng(2)
    tol = 1e-5 if dtype == np.float32 else 1e-13
    for out, inner in [(1536, 576), (576, 1536), (4099, 64), (192, 576)]:
        w = rng.standard_normal((out, inner)).astype(dtype)
        for t in (1, 2, 5, 9, 16, 64, 300):
            x = rng.standard_normal((t, inner)).astype(dtype)
            got = linear(x, w)
            assert got.shape == (t, out) and got.dtype == dtype
            np.testing.assert_allclose(got, x.astype(np.float64) @ w.T.astype(np.float64), rtol=0, atol=tol * inner)


def test_every_core_gives_blas_every_core_and_then_what_the_engines_left():
    """Inside `every_core()` BLAS runs with a thread a core (as many as the library takes: `most`); after it, as
    before, or on one thread if an engine was opened (quiet_blas) meanwhile. In a fresh process: the limit is
    process-wide."""
    import os
    import subprocess
    import sys
    script = """
import os
from threadpoolctl import threadpool_info, threadpool_limits
from specedge.runtime.backends import blas
n = lambda: sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
with threadpool_limits(os.cpu_count(), user_api="blas"):
    print(n())
threadpool_limits(1, user_api="blas")
with blas.every_core():
    print(n())
print(n())
threadpool_limits(2, user_api="blas")
with blas.every_core():
    blas.quiet_blas()
print(n())
with blas.every_core():
    print(n())
print(n())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    most, *rest = out.stdout.split("\n")[:6]
    assert rest == [most, "[1]", "[1]", most, "[1]"]
