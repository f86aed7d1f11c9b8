"""Tree verification on the ONNX Runtime backend (format 4 artifacts, docs/algorithms.md 1.4 "Tree attention"): each
node's logits equal the chain forward of its root path, the NumPy reference agrees on the whole tree, and after
`OnnxCache.compact` the next forward equals a fresh chain; version 2 artifacts report no tree support."""
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specedge.models.manifest import MANIFEST  # noqa: E402
from specedge.models.tiny import TINY_ARCHS  # noqa: E402
from specedge.runtime.backends.base import require_tree  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnxrt import OnnxBackend  # noqa: E402

TOL = 1e-4
# parent of each node, BFS order, node 0 the root (the last committed token): depth 0..3, fan-out up to 3
PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4, 4, 6]
PREFILL = 9


def ancestor_mask(parents: list[int]) -> np.ndarray:
    """mask[i, j] = j is i or an ancestor of i (base.py's tree_mask)."""
    mask = np.zeros((len(parents), len(parents)), bool)
    for i in range(len(parents)):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


@pytest.fixture(scope="module", params=TINY_ARCHS)
def pair(request, onnx3):
    """(ONNX fp32 backend, NumPy float32 backend, artifact dir: read-only, copy to change it) over one tiny GGUF;
    untied qwen2 has q/k/v biases."""
    gguf, artifact = onnx3(request.param)  # tests/conftest.py, shared
    return OnnxBackend(artifact, threads=1), NumpyBackend(gguf.load_weights()), artifact


def _tokens(backend, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, backend.config.vocab_size, n).astype(np.int32)


def test_each_node_equals_the_chain_of_its_root_path(pair):
    onnx_b, ref, _ = pair
    assert onnx_b.caps.tree_mask
    mask = ancestor_mask(PARENTS)
    prompt, nodes = _tokens(onnx_b, PREFILL, 1), _tokens(onnx_b, len(PARENTS), 2)
    cache, rcache = onnx_b.new_cache(64), ref.new_cache(64)
    onnx_b.forward(prompt, cache)
    ref.forward(prompt, rcache)
    tree = onnx_b.forward(nodes, cache, tree_mask=mask)
    assert tree.shape == (len(PARENTS), onnx_b.config.vocab_size) and cache.length == PREFILL + len(PARENTS)
    np.testing.assert_allclose(tree, ref.forward(nodes, rcache, tree_mask=mask), atol=TOL)
    for i in range(len(PARENTS)):
        path = np.flatnonzero(mask[i])
        cache.rollback(PREFILL)
        chain = onnx_b.forward(nodes[path], cache)[-1]
        if list(path) == list(range(len(path))):
            # the node sits in the slot its chain would use: the pad row keeps GroupQueryAttention on one GEMM path,
            # and a zero bias adds exactly nothing, so the logits are bit-identical
            np.testing.assert_array_equal(tree[i], chain)
        else:  # same terms, summed at other slots of the reduction: float rounding only
            np.testing.assert_allclose(tree[i], chain, atol=TOL)


@pytest.mark.parametrize("accepted", [[0, 1, 4, 7], [0, 2, 6, 9], [0, 3], [0]])
def test_next_forward_after_compaction_equals_a_fresh_chain(pair, accepted):
    onnx_b, _, _ = pair
    mask = ancestor_mask(PARENTS)
    prompt, nodes, nxt = _tokens(onnx_b, PREFILL, 3), _tokens(onnx_b, len(PARENTS), 4), _tokens(onnx_b, 3, 5)
    cache = onnx_b.new_cache(48)
    onnx_b.forward(prompt, cache)
    onnx_b.forward(nodes, cache, tree_mask=mask)
    cache.compact(PREFILL + np.array(accepted), PREFILL)
    assert cache.length == PREFILL + len(accepted)
    after = onnx_b.forward(nxt, cache)
    fresh_cache = onnx_b.new_cache(48)
    fresh = onnx_b.forward(np.concatenate([prompt, nodes[accepted], nxt]), fresh_cache)[-len(nxt):]
    if accepted == list(range(len(accepted))):  # the first path's rows never moved: bit-identical
        np.testing.assert_array_equal(after, fresh)
    else:
        np.testing.assert_allclose(after, fresh, atol=TOL)
    n = cache.length
    for a, b in zip(cache._arrays, fresh_cache._arrays):  # the compacted K/V rows are the chain's rows
        np.testing.assert_allclose(a[:, :, :n], b[:, :, :n], atol=1e-5)


def test_chain_calls_are_unchanged_by_the_tree_inputs(pair):
    """A chain forward with tree_mask=None equals the same chain passed as a lower-triangular tree mask."""
    onnx_b, _, _ = pair
    prompt, toks = _tokens(onnx_b, PREFILL, 6), _tokens(onnx_b, 5, 7)
    cache = onnx_b.new_cache(32)
    onnx_b.forward(prompt, cache)
    chain = onnx_b.forward(toks, cache)
    cache.rollback(PREFILL)
    as_tree = onnx_b.forward(toks, cache, tree_mask=np.tril(np.ones((5, 5), bool)))
    np.testing.assert_array_equal(chain, as_tree)


def test_bad_masks_and_compactions_are_refused(pair):
    onnx_b, _, _ = pair
    cache = onnx_b.new_cache(16)
    onnx_b.forward(_tokens(onnx_b, 4, 8), cache)
    bad = ancestor_mask([-1, 0, 0])
    bad[2, 0] = False  # a node that does not see the root
    with pytest.raises(ValueError, match="BFS order"):
        onnx_b.forward(_tokens(onnx_b, 3, 9), cache, tree_mask=bad)
    with pytest.raises(ValueError, match=r"\[3, 3\]"):
        onnx_b.forward(_tokens(onnx_b, 3, 9), cache, tree_mask=ancestor_mask([-1, 0]))
    assert cache.length == 4
    with pytest.raises(ValueError, match="must ascend"):
        cache.compact(np.array([3, 2]), 1)
    with pytest.raises(ValueError, match="must ascend"):
        cache.compact(np.array([0, 1]), 1)  # a row would move away from the start
    with pytest.raises(ValueError, match="must ascend"):
        cache.compact(np.array([4]), 2)  # beyond the cached length


def test_version_2_artifacts_load_without_tree_support(pair, tmp_path):
    """A manifest of format version 2 (exported before the tree inputs) reads as chains only."""
    _, _, artifact = pair
    old = tmp_path / "v2"
    shutil.copytree(artifact, old)
    raw = json.loads((old / MANIFEST).read_text("utf-8"))
    raw["format_version"] = 2
    for name in ("position_ids", "tree_bias"):
        del raw["io"][name]
    (old / MANIFEST).write_text(json.dumps(raw), "utf-8")
    backend = OnnxBackend(old, threads=1)
    assert not backend.caps.tree_mask
    require_tree(pair[0])  # the format 4 artifact passes the start-up check
    with pytest.raises(ValueError, match="re-export"):  # what a tree drafter's start-up check says
        require_tree(backend)
    with pytest.raises(ValueError, match="re-export"):
        backend.forward(np.arange(3, dtype=np.int32), backend.new_cache(8), tree_mask=ancestor_mask([-1, 0, 0]))


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_int8_activation_artifacts_refuse_lossless_trees_but_still_run_them(pair, tmp_path, fmt):
    """8-bit activations amplify tree-vs-chain rounding into different greedy tokens (int4 SmolLM2: 12 of 18 dev
    prompts diverged with token recycling), so tree drafters are refused at start-up on such artifacts; the forward
    itself still takes a tree mask (perf/tree_parity.py measures it)."""
    _, _, artifact = pair
    other = tmp_path / fmt
    shutil.copytree(artifact, other)
    raw = json.loads((other / MANIFEST).read_text("utf-8"))
    raw["weight_format"] = fmt  # the refusal reads the manifest's format; the graph stays the fp32 one
    (other / MANIFEST).write_text(json.dumps(raw), "utf-8")
    backend = OnnxBackend(other, threads=1)
    assert not backend.caps.tree_mask
    with pytest.raises(ValueError, match="8 bits.*fp32"):
        require_tree(backend)
    out = backend.forward(np.arange(3, dtype=np.int32), backend.new_cache(8), tree_mask=ancestor_mask([-1, 0, 0]))
    assert out.shape == (3, backend.config.vocab_size)
