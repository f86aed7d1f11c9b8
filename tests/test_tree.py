"""Tree drafts and tree / block verification: hand-made trees, chi-square checks that the tree rules reproduce the
target (first-order Markov "models", as in test_verify.py), and block verification checked exact by enumeration."""
from itertools import product

import numpy as np
import pytest

from specedge.runtime.sampling import logits_to_probs, sample
from specedge.runtime.tree import TreeDraft
from specedge.runtime.types import Draft, NextKind
from specedge.runtime.verify import BlockVerifier, verify_tree
from specedge.runtime.verify.block import block_residual, block_weights
from test_verify import N_OUT, P_TABLE, Q_TABLE, SETTINGS, START, V, FixedRng, assert_same_distribution, exact_joint

#            root(0)
#           /   |   \
#        1(7)  2(3)  3(9)        tokens [7, 3, 9, 1, 2, 5], parents [0, 0, 0, 1, 1, 2]
#        /  \    \
#     4(1) 5(2)  6(5)
HAND = TreeDraft(np.array([7, 3, 9, 1, 2, 5]), np.array([0, 0, 0, 1, 1, 2]))


def test_mask_depths_and_paths_of_a_hand_made_tree():
    m = HAND.mask()
    expected = np.eye(7, dtype=bool)
    for node, ancestors in {1: [0], 2: [0], 3: [0], 4: [0, 1], 5: [0, 1], 6: [0, 2]}.items():
        expected[node, ancestors] = True
    assert (m == expected).all()
    assert HAND.depths().tolist() == [0, 1, 1, 1, 2, 2, 2]
    assert HAND.path_to(5) == (1, 5) and HAND.path_to(6) == (2, 6) and HAND.path_to(3) == (3,)
    assert HAND.path_to(0) == ()
    assert HAND.children(1).tolist() == [4, 5] and HAND.children(3).tolist() == []


@pytest.mark.parametrize("tokens,parents,msg", [
    ([1, 2], [0, 2], "BFS order"),  # a parent after its child
    ([1, 2, 3], [0, 1, 0], "depths must not decrease"),
    ([1, 1], [0, 0], "repeated children"),
    ([1, 2], [0], "one parent per node"),
])
def test_invalid_trees_name_the_problem(tokens, parents, msg):
    with pytest.raises(ValueError, match=msg):
        TreeDraft(np.array(tokens), np.array(parents))


def one_hot(ids, V=10):
    p = np.zeros((len(ids), V))
    p[np.arange(len(ids)), ids] = 1.0
    return p


def test_greedy_tree_verification_by_hand():
    # argmax at root = 3 -> node 2; at node 2 argmax = 5 -> node 6 (a leaf) -> bonus argmax p[6] = 8
    p = one_hot([3, 0, 5, 0, 0, 0, 8])
    v = verify_tree(HAND, p, None, greedy=True)
    assert (v.path, v.next_token, v.kind) == ((2, 6), 8, NextKind.BONUS)
    # at node 1 argmax = 4: neither child (1, 2) -> recovered 4 after path (1,)
    v = verify_tree(HAND, one_hot([7, 4, 0, 0, 0, 0, 0]), None, greedy=True)
    assert (v.path, v.next_token, v.kind) == ((1,), 4, NextKind.RECOVERED)
    # the root's argmax is no child: nothing accepted
    v = verify_tree(HAND, one_hot([6, 0, 0, 0, 0, 0, 0]), None, greedy=True)
    assert (v.path, v.next_token, v.kind) == ((), 6, NextKind.RECOVERED)


def test_recursive_rejection_by_hand():
    # root children x1 = 1, x2 = 0 drawn without replacement from q = [.25, .75, 0]; p = [.5, .3, .2]
    tree = TreeDraft(np.array([1, 0]), np.array([0, 0]), q=np.array([[.25, .75, 0.]] * 3))
    p = np.array([[.5, .3, .2], [1 / 3] * 3, [1 / 3] * 3])
    # x1 accepted iff U < .3/.75 = .4; rejected: p2 = norm((p - q)+) = [.25, 0, .2]/.45, q2 = [1, 0, 0]
    # x2 = 0 accepted iff U < p2(0)/q2(0) = .556; else y ~ norm((p2 - q2)+) = [0, 0, 1] -> 2
    assert verify_tree(tree, p, FixedRng(.39, .9), greedy=False).path == (1,)
    assert verify_tree(tree, p, FixedRng(.4, .55, .9), greedy=False).path == (2,)
    v = verify_tree(tree, p, FixedRng(.4, .56, .3), greedy=False)
    assert (v.path, v.next_token, v.kind) == ((), 2, NextKind.RECOVERED)


def draw_children(q_row, m, rng, with_replacement):
    if with_replacement:
        return [sample(q_row, rng) for _ in range(m)]
    g = np.log(np.maximum(q_row, 1e-300)) - np.log(-np.log(rng.random(len(q_row))))  # Gumbel-top-k
    g[q_row == 0] = -np.inf
    return list(np.argsort(-g)[:m][np.isfinite(np.sort(-g)[:m])])


def random_tree(qt, last, rng, *, with_replacement, use_q, branching=(2, 2)):
    """A depth-2 tree drawn from the Markov drafter qt under `last`: every node at depth d gets branching[d] kids."""
    tokens, parents, frontier = [], [], [(0, last)]
    for b in branching:
        nxt = []
        for node, tok in frontier:
            for c in draw_children(qt[tok], b, rng, with_replacement):
                tokens.append(int(c))
                parents.append(node)
                nxt.append((len(tokens), int(c)))
        frontier = nxt
    q = qt[np.array([last] + tokens)] if use_q else None
    return TreeDraft(np.array(tokens, np.int32), np.array(parents), q=q, with_replacement=with_replacement)


def tree_counts(pt, qt, n_trials, seed, **kw):
    rng, counts = np.random.default_rng(seed), np.zeros((V,) * N_OUT, dtype=np.int64)
    for _ in range(n_trials):
        out, last = [], START
        while len(out) < N_OUT:
            tree = random_tree(qt, last, rng, **kw)
            p = pt[np.concatenate([[last], tree.tokens]).astype(np.int64)]  # Markov: row = p(. | node token)
            v = verify_tree(tree, p, rng, greedy=False)
            out += [int(tree.tokens[j - 1]) for j in v.path] + [v.next_token]
            last = out[-1]
        counts[tuple(out[:N_OUT])] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("name", ["t1.0", "t0.7-top_p0.8", "top_k3"])
@pytest.mark.parametrize("rule", ["rsd", "specinfer", "deterministic"])
def test_tree_verification_preserves_target(name, rule):
    params = SETTINGS[name]
    pt, qt = logits_to_probs(P_TABLE, params), logits_to_probs(Q_TABLE, params)
    counts = tree_counts(pt, qt, 20_000, seed=21, with_replacement=rule == "specinfer",
                         use_q=rule != "deterministic")
    assert_same_distribution(counts, exact_joint(pt))


def test_identical_drafter_tree_accepts_a_full_path():
    pt = logits_to_probs(P_TABLE, SETTINGS["t1.0"])
    rng = np.random.default_rng(3)
    for _ in range(300):
        tree = random_tree(pt, START, rng, with_replacement=False, use_q=True)
        p = pt[np.concatenate([[START], tree.tokens]).astype(np.int64)]
        v = verify_tree(tree, p, rng, greedy=False)
        assert v.n_accepted == 2 and v.kind is NextKind.BONUS


def block_exact(pt, qt, k):
    """The exact joint of the first k+1 tokens after one block-verified round (completed by the target)."""
    joint = np.zeros((V,) * (k + 1))
    for x in product(range(V), repeat=k):
        rows = np.array([START, *x])
        pq = np.prod(qt[rows[:-1], x])
        if pq == 0:
            continue
        p, q = pt[rows], qt[rows[:-1]]
        pk, h = block_weights(p, q, np.array(x))
        for tau in range(k + 1):
            p_tau = (h[tau] if tau else 1.0) * np.prod(1 - h[tau + 1:])
            y = p[k] if tau == k else block_residual(pk[tau], p[tau], q[tau])
            y = y / y.sum()
            for yy in range(V):
                add_completed(joint, (*x[:tau], yy), pq * p_tau * y[yy], pt)
    return joint


def add_completed(joint, prefix, mass, pt):
    """joint[prefix, ...] += mass * P(the rest | prefix) under the Markov target."""
    rest = joint.ndim - len(prefix)
    dist = np.ones(())
    if rest:
        dist = pt[prefix[-1]]  # [V]
        for _ in range(rest - 1):
            dist = np.einsum("...a,ab->...ab", dist, pt)  # append one more Markov step
    joint[prefix] += mass * dist


@pytest.mark.parametrize("name", ["t1.0", "t0.7-top_p0.8", "min_p0.1"])
def test_block_verification_is_exact_by_enumeration(name):
    params, k = SETTINGS[name], 3
    pt, qt = logits_to_probs(P_TABLE, params), logits_to_probs(Q_TABLE, params)
    joint = block_exact(pt, qt, k)
    a = pt[START]
    target = a[:, None, None, None] * pt[:, :, None, None] * pt[None, :, :, None] * pt[None, None, :, :]
    assert np.allclose(joint, target, atol=1e-12)


def test_block_never_accepts_less_than_chain_in_expectation():
    params, k = SETTINGS["t1.0"], 3
    pt, qt = logits_to_probs(P_TABLE, params), logits_to_probs(Q_TABLE, params)
    e_block = e_chain = 0.0
    for x in product(range(V), repeat=k):
        rows = np.array([START, *x])
        pq = np.prod(qt[rows[:-1], x])
        pk, h = block_weights(pt[rows], qt[rows[:-1]], np.array(x))
        p_tau = [(h[t] if t else 1.0) * np.prod(1 - h[t + 1:]) for t in range(k + 1)]
        e_block += pq * np.dot(np.arange(k + 1), p_tau)
        e_chain += pq * np.cumprod(np.minimum(1, pt[rows[:-1], x] / qt[rows[:-1], x])).sum()
    assert e_block >= e_chain - 1e-12
    assert e_block > e_chain + 1e-3  # strictly better on this pair of tables


def test_block_verifier_by_hand_and_greedy_prefix():
    p = np.array([[.5, .3, .2], [.1, .1, .8]])
    q = np.array([[.25, .75, 0.]])
    # k = 1: h_1 = p_1 = min(1, .3/.75) = .4, the same rule as the chain
    assert BlockVerifier().verify(Draft(np.array([1], np.int32), q), p, FixedRng(.39, .5)).n_accepted == 1
    v = BlockVerifier().verify(Draft(np.array([1], np.int32), q), p, FixedRng(.41, .5))
    assert (v.n_accepted, v.next_token) == (0, 0)  # residual [.25, 0, .2]: u = .5 -> id 0
