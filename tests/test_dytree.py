"""Dynamic draft trees from a draft model (runtime/drafters/dytree.py): lossless (greedy: identical output;
sampled: the target's distribution), best-first shape within the budget, the draft cache left holding the context,
the `+tree` drafter syntax and its start-up errors, and the ONNX path (a tree forward on the draft artifact)."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.assembly.load import DrafterSpec
from specedge.runtime.drafters.spec import ModelSpec
from specedge.models.gguf_in import open_gguf
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.drafters.dytree import DynamicTreeDrafter
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import SamplingParams
from test_tree_decode import TreeMarkovBackend, assert_matches_target, sampled_counts

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def models(tiny_gguf, draft_gguf, tiny_backends):
    return tiny_gguf.parent, tiny_gguf, draft_gguf, *tiny_backends[:2]  # tests/conftest.py, shared (read-only)


def run(target, prompt, drafter=None, n=40, params=GREEDY, stats=None, seed=0):
    return [e.token for e in decode(target, prompt, Speculation(drafter), Request(params, max_tokens=n, seed=seed),
                                    stats=stats)]


@pytest.mark.parametrize("nodes", [1, 5, 16])
def test_greedy_dynamic_trees_equal_plain_greedy(models, nodes):
    _, _, _, target, draft = models
    for prompt in ([1, 5, 9, 2], [7, 7, 7], [3]):
        st = DecodeStats()
        drafter = DynamicTreeDrafter(ModelDrafter(draft), nodes, wave=2)
        assert run(target, np.array(prompt, np.int32), drafter, stats=st) == run(target, np.array(prompt, np.int32))
        assert st.n_drafted > 0


def test_self_drafted_tree_holds_the_greedy_chain_and_respects_the_budget(models):
    """The target as its own draft model: the best path is its argmax chain, so every round accepts the tree's
    deepest first-choice path; the tree never exceeds its budget and is breadth-first numbered."""
    _, _, _, target, _ = models
    drafter = DynamicTreeDrafter(ModelDrafter(target), 12, wave=3, branch=2)
    prompt = np.array([1, 5, 9, 2], np.int32)
    drafter.begin(prompt)
    tree = drafter.propose_tree(prompt, 12, GREEDY, np.random.default_rng(0))
    # waves of <= 3 nodes: the root's 2 continuations (branch=2), then 3, 3, 3 and the last 1, which needs no
    # forward of its own: the root's forward plus 4 tree forwards
    assert tree.n == 12 and drafter.waves == 5
    assert (np.diff(tree.depths()) >= 0).all()
    chain, node = [], 0
    plain = run(target, prompt, n=12)
    while len(kids := tree.children(node)):  # follow the first child (the draft's best continuation)
        node = int(kids[0])
        chain.append(int(tree.tokens[node - 1]))
    assert chain == plain[:len(chain)] and len(chain) >= 3
    assert drafter.model._cache.length == len(prompt)  # the draft cache holds the context again
    st = DecodeStats()
    out = run(target, prompt, DynamicTreeDrafter(ModelDrafter(target), 12, wave=3, branch=2), stats=st)
    assert out == run(target, prompt) and st.n_accepted / st.n_target_forwards >= 2  # rounds only (no prefill)


@pytest.mark.slow
def test_sampled_dynamic_trees_preserve_the_target_distribution():
    params = SamplingParams(temperature=1.0)
    P, Q = random_markov_table(5, seed=3, scale=1.0), random_markov_table(5, seed=4, scale=1.0)
    prompt = np.array([0, 1, 0], dtype=np.int32)
    counts = sampled_counts(TreeMarkovBackend(P), prompt, params, lambda: DynamicTreeDrafter(
        ModelDrafter(TreeMarkovBackend(Q)), 4, wave=2, branch=2), trials=6000, seed=9)
    assert_matches_target(counts, P, prompt, params, 3, 6000)


def test_tree_suffix_parses_and_bad_combinations_fail_at_start_up(models):
    assert DrafterSpec.parse("model:x+tree:8") == ModelSpec("x", tree=8)
    assert DrafterSpec.parse("model:a/b.gguf+tree").tree == 16
    for bad, msg in (("ngram+tree", "follows a model drafter"), ("model:x+conf+tree", "without a draft stop"),
                     ("model:x+tree:0", "1..256"), ("model:x+tree:many", "node count")):
        with pytest.raises(ValueError, match=msg):
            DrafterSpec.parse(bad)
    with pytest.raises(ValueError, match="cannot run tree masks"):
        DynamicTreeDrafter(ModelDrafter(MarkovBackend(random_markov_table(5, seed=0))))
    d, target, draft, _, _ = models
    r = CliRunner().invoke(cli, ["generate", str(target), "hi", "--backend", "numpy", "--drafter",
                                 f"model:{draft}+tree:8", "--max-tokens", "16", "--json", "--baseline",
                                 "--temperature", "0"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["identical_to_baseline"] is True and stats["drafter"].endswith("+tree:8")


def test_onnx_draft_artifact_drafts_trees_for_an_fp32_target(models, tmp_path):
    """A tree forward on an int4 draft artifact (allowed for drafting: only verification must be exact) and an fp32
    target that verifies the tree: identical to plain greedy."""
    pytest.importorskip("onnxruntime")
    from specedge.export.onnx_export import export_gguf_to_onnx
    from specedge.export.onnx_linear import WeightFormat
    d, target, draft, _, _ = models
    export_gguf_to_onnx(open_gguf(target), tmp_path / "t-fp32", WeightFormat.FP32, gate=False)
    export_gguf_to_onnx(open_gguf(target), tmp_path / "t-int4", WeightFormat.INT4, gate=False)
    r = CliRunner().invoke(cli, ["generate", str(tmp_path / "t-fp32"), "the cat sat", "--backend", "onnx",
                                 "--drafter", f"model:{tmp_path / 't-int4'}+tree:6", "--max-tokens", "24", "--json",
                                 "--baseline", "--temperature", "0", "--threads", "1"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["identical_to_baseline"] is True and stats["n_accepted"] > 0
