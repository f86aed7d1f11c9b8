"""Tree decoding end to end: token recycling is lossless (greedy: identical output; sampled: the target's
distribution), tree KV compaction equals a chain forward of the accepted path, and capability errors at start-up."""
from collections import Counter

import numpy as np
import pytest

from specedge.assembly.load import DrafterSpec
from specedge.runtime.drafters.spec import RecycleSpec
from specedge.runtime.backends.base import BackendCaps
from specedge.runtime.backends.fake import FakeCache, MarkovBackend, random_markov_table
from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.recycle import RecycleDrafter, tree_template
from specedge.runtime.sampling import top_rows
from specedge.runtime.stats import DecodeStats
from specedge.runtime.tree import TreeDraft
from specedge.runtime.types import SamplingParams
from specedge.runtime.verify import VerifierKind
from test_decode import assert_counts_match, exact_joint

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def tiny(tiny_backends):
    return tiny_backends[0], tiny_backends[2]  # tests/conftest.py: (target float64, tokenizer), shared


def run(backend, prompt, drafter=None, n=40, params=GREEDY, seed=0, stats=None):
    return [e.token for e in decode(backend, prompt, Speculation(drafter), Request(params, max_tokens=n, seed=seed),
                                    stats=stats)]


PROMPTS = ["the cat sat on the mat and the cat", "hello world", "a", "one two one two one two"]


@pytest.mark.parametrize("nodes", [1, 8, 16, pytest.param(80, marks=pytest.mark.slow)])
def test_greedy_token_recycling_equals_plain_greedy(tiny, nodes):
    target, tok = tiny
    drafter, st = RecycleDrafter(target.config.vocab_size, nodes), DecodeStats()  # adj carries over prompts
    for text in PROMPTS * 2:
        prompt = tok.encode(text)
        assert run(target, prompt, drafter, stats=st) == run(target, prompt), (nodes, text)
    assert st.n_accepted > 0  # the trees were used, not just empty


def test_tree_forward_then_compaction_equals_a_chain_forward(tiny):
    target, tok = tiny
    prompt = np.array(tok.encode("the cat sat on"), dtype=np.int32)
    tree = TreeDraft(np.array([5, 9, 11, 7, 3, 8]), np.array([0, 0, 0, 1, 1, 2]))  # root = prompt[-1]
    path = (2, 6)  # 9 -> 8, the second root child and its only child
    tree_cache, chain_cache = target.new_cache(32), target.new_cache(32)
    for c in (tree_cache, chain_cache):
        target.forward(prompt[:-1], c)
    base = tree_cache.length
    tree_logits = target.forward(np.concatenate([prompt[-1:], tree.tokens]), tree_cache, tree_mask=tree.mask())
    tree_cache.compact(base + np.array((0, *path)), base)
    chain_tokens = np.concatenate([prompt[-1:], tree.tokens[np.array(path) - 1]])
    chain_logits = target.forward(chain_tokens, chain_cache)
    assert tree_cache.length == chain_cache.length == base + 3
    n = chain_cache.length
    np.testing.assert_allclose(tree_cache.k[:, :, :n], chain_cache.k[:, :, :n], atol=1e-10)
    np.testing.assert_allclose(tree_cache.v[:, :, :n], chain_cache.v[:, :, :n], atol=1e-10)
    np.testing.assert_allclose(tree_logits[[0, *path]], chain_logits, atol=1e-9)
    nxt = np.array([4], np.int32)  # and decoding continues identically from the compacted cache
    np.testing.assert_allclose(target.forward(nxt, tree_cache), target.forward(nxt, chain_cache), atol=1e-9)


class TreeCache(FakeCache):
    def compact(self, src, dst_start):
        src = np.asarray(src)
        self.tokens_buf[dst_start:dst_start + len(src)] = self.tokens_buf[src]
        self._length = dst_start + len(src)


class TreeMarkovBackend(MarkovBackend):
    """A Markov target whose rows depend only on each node's own token, so a tree forward is trivially exact."""
    caps = BackendCaps(tree_mask=True)

    def new_cache(self, max_len):
        return TreeCache(max_len)

    def forward(self, tokens, cache, *, tree_mask=None, plan=None):
        return super().forward(tokens, cache)


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.9)],
                         ids=["t1", "t0.8p0.9"])
def test_sampled_tree_decode_preserves_the_target_distribution(params):
    V, n, trials = 5, 3, 8000
    P = random_markov_table(V, seed=3, scale=1.0)
    target = TreeMarkovBackend(P)
    prompt = np.array([0, 1, 0, 1, 0], dtype=np.int32)
    drafter, rng, counts = RecycleDrafter(V, 8), np.random.default_rng(7), Counter()
    for _ in range(trials):  # one drafter: its adj fills up and the trees get real
        counts[tuple(e.token for e in decode(target, prompt, Speculation(drafter),
                                             Request(params, max_tokens=n, seed=int(rng.integers(1 << 62)))))] += 1
    assert_matches_target(counts, P, prompt, params, n, trials)


@pytest.mark.slow
def test_sampled_decode_with_block_verification_preserves_the_target_distribution():
    params = SamplingParams(temperature=1.0)
    P, Q = random_markov_table(5, seed=3, scale=1.0), random_markov_table(5, seed=4, scale=1.0)
    prompt = np.array([0, 1, 0], dtype=np.int32)
    counts = sampled_counts(MarkovBackend(P), prompt, params, lambda: ModelDrafter(MarkovBackend(Q)),
                            trials=8000, seed=8, k=2, verifier=VerifierKind.BLOCK)
    assert_matches_target(counts, P, prompt, params, 3, 8000)


def sampled_counts(target, prompt, params, new_drafter, *, trials, seed, n=3, k=4,
                   verifier=VerifierKind.CHAIN) -> Counter:
    """Counts of the first n tokens over `trials` decodes, a fresh drafter each time (seeds drawn from `seed`)."""
    rng, counts = np.random.default_rng(seed), Counter()
    for _ in range(trials):
        spec = Speculation(new_drafter(), k=k, verifier=verifier)
        counts[tuple(e.token for e in decode(target, prompt, spec,
                                             Request(params, max_tokens=n, seed=int(rng.integers(1 << 62)))))] += 1
    return counts


def assert_matches_target(counts, P, prompt, params, n, trials):
    assert_counts_match(counts, exact_joint(P, None, int(prompt[-1]), params, n), trials)


def test_tree_drafter_on_a_chain_backend_fails_at_start_up():
    target = MarkovBackend(random_markov_table(5, seed=0))
    with pytest.raises(ValueError, match="markov backend cannot verify token trees.*numpy"):
        next(iter(decode(target, [0, 1], Speculation(RecycleDrafter(5, 8)), Request(GREEDY, max_tokens=3))))


def test_recycle_fills_the_template_from_adj_and_learns_from_every_node():
    d = RecycleDrafter(vocab_size=10, nodes=8)
    parents, ranks = tree_template(8)
    assert d.propose_tree(np.array([3]), 8, GREEDY, None).n == 0  # nothing seen yet: an empty tree
    logits = np.tile(np.arange(10, dtype=np.float32), (2, 1))  # both rows rank 9, 8, 7, ...
    logits[1] = logits[1][::-1]  # the second row ranks 0, 1, 2, ...
    d.observe(np.array([3, 9]), logits)
    assert d.adj[3].tolist() == [9, 8, 7, 6, 5, 4, 3, 2] and d.adj[9].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    tree = d.propose_tree(np.array([1, 3]), 8, GREEDY, None)
    # root 3's children are adj[3][rank]; only token 9 (rank 0) and 3 (rank 6) have successors of their own
    kids = tree.tokens[tree.children(0) - 1].tolist()
    assert kids == [9, 8, 7, 6][:len(kids)] and len(kids) == int((parents == 0).sum())
    for node in range(1, tree.n + 1):
        parent = int(tree.parents[node - 1])
        parent_tok = 3 if parent == 0 else int(tree.tokens[parent - 1])
        assert tree.tokens[node - 1] in d.adj[parent_tok]
    assert d.propose_tree(np.array([3]), 2, GREEDY, None).n == 2  # the room bound truncates the BFS order


@pytest.mark.parametrize("V", [5, 8, 9, 511, 512, 513, 4096 + 37])
def test_recycles_top_rows_are_each_rows_largest_values_best_first(V):
    """top_rows ranks only the columns of the groups with the largest maxima: it must still find every row's m
    largest values (ties included: small integers), in order, each column once."""
    rng = np.random.default_rng(V)
    for x in (rng.standard_normal((5, V)), rng.integers(0, 4, (5, V)), np.full((1, V), -np.inf)):
        x = x.astype(np.float32)
        m = min(8, V)
        top = top_rows(x, m)
        assert top.shape == (len(x), m) and all(len(set(row)) == m for row in top.tolist())
        assert np.array_equal(np.take_along_axis(x, top, axis=1), -np.sort(-x, axis=1)[:, :m])


def test_recycle_drafter_spec_and_block_verifier_kind():
    assert DrafterSpec.parse("recycle") == RecycleSpec(16)
    assert DrafterSpec.parse("recycle:32").nodes == 32
    with pytest.raises(ValueError, match="node count"):
        DrafterSpec.parse("recycle:big")
    assert VerifierKind("block") is VerifierKind.BLOCK


@pytest.mark.parametrize("params", [SamplingParams(repeat_penalty=1.3, repeat_last_n=8),
                                    SamplingParams(presence_penalty=0.5, frequency_penalty=0.4, repeat_last_n=8,
                                                   logit_bias={3: 1.0})], ids=["repeat", "presence-frequency-bias"])
def test_greedy_recycling_with_penalties_equals_plain(tiny, params):
    """Each tree node is penalised by its own root path's history, as a one-token step there would be."""
    target, tok = tiny
    drafter = RecycleDrafter(target.config.vocab_size, 16)
    for text in PROMPTS[:2] * 2:
        prompt = tok.encode(text)
        assert run(target, prompt, drafter, params=params) == run(target, prompt, params=params), text
