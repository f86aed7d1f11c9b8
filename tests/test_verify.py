"""Verifiers: hand-made cases, and chi-square checks that speculative sampling reproduces the target.

The statistical tests use first-order Markov "models" (next-token logits = table[current token]), so the
exact joint distribution of the first 3 emitted tokens is a product of rows of p.
"""
import numpy as np
import pytest
from scipy.stats import chisquare

from specedge.runtime.backends.fake import random_markov_table
from specedge.runtime.sampling import ProbRows, logits_to_probs, sample
from specedge.runtime.types import Draft, NextKind, SamplingParams, Verdict
from specedge.runtime.verify import ChainSpeculativeVerifier, GreedyVerifier, VerifierKind, make_verifier

V, START, N_OUT = 6, 0, 3
P_TABLE = random_markov_table(V, seed=1, scale=1.5)  # [V, V] target logits
Q_TABLE = (0.5 * P_TABLE + random_markov_table(V, seed=2, scale=1.2)).astype(np.float32)  # a different drafter

SETTINGS = {
    "t1.0": SamplingParams(temperature=1.0),
    "t0.7-top_p0.8": SamplingParams(temperature=0.7, top_p=0.8),
    "top_k3": SamplingParams(temperature=1.0, top_k=3),
    "min_p0.1": SamplingParams(temperature=1.0, min_p=0.1),
}


class FixedRng:
    """Stands in for np.random.Generator: returns the given uniforms in order."""

    def __init__(self, *us):
        self.us = list(us)

    def random(self):
        return self.us.pop(0)


def one_hot_rows(*ids, V=5):
    p = np.zeros((len(ids), V))
    p[np.arange(len(ids)), ids] = 1.0
    return p


def run_first_tokens(pt, qt, k, rng, *, use_q=True, draft_fn=None):
    """Draft k tokens (from q, or draft_fn), verify against p, emit; repeat until N_OUT tokens."""
    verifier, out, last = ChainSpeculativeVerifier(), [], START
    while len(out) < N_OUT:
        if draft_fn is None:
            x, cur = np.empty(k, np.int32), last
            for i in range(k):
                cur = x[i] = sample(qt[cur], rng)
        else:
            x = draft_fn(last)
        inputs = np.concatenate([[last], x]).astype(np.int32)
        p = pt[inputs]  # [k+1, V]: row i is conditioned on [last, x_1..x_i] (Markov: only on inputs[i])
        v = verifier.verify(Draft(tokens=x, q=qt[inputs[:k]] if use_q else None), p, rng)
        out += [int(t) for t in x[:v.n_accepted]] + [v.next_token]
        last = out[-1]
    return tuple(out[:N_OUT])


def joint_counts(pt, qt, k, n_trials, seed, **kw):
    rng = np.random.default_rng(seed)
    counts = np.zeros((V,) * N_OUT, dtype=np.int64)
    for _ in range(n_trials):
        counts[run_first_tokens(pt, qt, k, rng, **kw)] += 1
    return counts


def exact_joint(pt):
    a = pt[START]
    return a[:, None, None] * pt[:, :, None] * pt[None, :, :]  # P(a) P(b|a) P(c|b)


def assert_same_distribution(counts, exact):
    n = counts.sum()
    obs, exp = counts.ravel(), exact.ravel() * n
    assert obs[exp == 0].sum() == 0, "emitted a sequence the target gives probability 0"
    big = exp >= 5  # pool sparse cells so the chi-square approximation holds
    f_obs = np.append(obs[big], obs[~big].sum())
    f_exp = np.append(exp[big], exp[~big].sum())
    keep = f_exp > 0
    stat, pvalue = chisquare(f_obs[keep], f_exp[keep] * f_obs[keep].sum() / f_exp[keep].sum())
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2e} (stat {stat:.1f}, {keep.sum()} bins)"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETTINGS))
def test_chain_with_q_preserves_target(name):
    params = SETTINGS[name]
    pt, qt = logits_to_probs(P_TABLE, params), logits_to_probs(Q_TABLE, params)
    counts = joint_counts(pt, qt, k=3, n_trials=40_000, seed=11)
    assert_same_distribution(counts, exact_joint(pt))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETTINGS))
def test_deterministic_drafter_rule_preserves_target(name):
    params = SETTINGS[name]
    pt, qt = logits_to_probs(P_TABLE, params), logits_to_probs(Q_TABLE, params)
    counts = joint_counts(pt, qt, k=2, n_trials=40_000, seed=12, use_q=False)  # drafts ~ q, verified without q
    assert_same_distribution(counts, exact_joint(pt))


@pytest.mark.slow
def test_deterministic_drafter_rule_with_fixed_drafts():
    pt = logits_to_probs(P_TABLE, SETTINGS["t1.0"])
    greedy_q = np.argmax(Q_TABLE, axis=1)

    def draft_fn(last):  # a deterministic chain: the drafter's argmax path
        x = [greedy_q[last]]
        x.append(greedy_q[x[-1]])
        return np.array(x, dtype=np.int32)

    counts = joint_counts(pt, None, k=2, n_trials=40_000, seed=13, use_q=False, draft_fn=draft_fn)
    assert_same_distribution(counts, exact_joint(pt))


def test_drafter_equal_to_target_accepts_everything():
    params = SETTINGS["t0.7-top_p0.8"]
    pt = logits_to_probs(P_TABLE, params)
    rng, verifier = np.random.default_rng(5), ChainSpeculativeVerifier()
    drafted = accepted = 0
    for _ in range(2000):
        x, cur = np.empty(4, np.int32), START
        for i in range(4):
            cur = x[i] = sample(pt[cur], rng)
        inputs = np.concatenate([[START], x])
        v = verifier.verify(Draft(x, pt[inputs[:4]]), pt[inputs], rng)
        drafted, accepted = drafted + 4, accepted + v.n_accepted
        assert v.kind is NextKind.BONUS
    assert accepted == drafted


def test_chain_accept_reject_and_residual_by_hand():
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = np.array([[0.25, 0.75, 0.0]])
    verifier, draft = ChainSpeculativeVerifier(), Draft(np.array([1], np.int32), q)
    # accept iff U < 0.3 / 0.75 = 0.4; then the bonus comes from p[1] (u=0.5 -> id 2)
    assert verifier.verify(draft, p, FixedRng(0.39, 0.5)) == Verdict(1, 2, NextKind.BONUS)
    # reject at U = 0.4; residual (p - q)+ = [0.25, 0, 0.2]: u = 0.5 -> 0.225 < 0.25 -> id 0; u = 0.6 -> id 2
    assert verifier.verify(draft, p, FixedRng(0.4, 0.5)) == Verdict(0, 0, NextKind.RECOVERED)
    assert verifier.verify(draft, p, FixedRng(0.4, 0.6)) == Verdict(0, 2, NextKind.RECOVERED)


def test_chain_residual_falls_back_to_p():
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    q = np.array([[0.5 + 1e-15, 0.5 - 1e-15]])  # p/q just below 1; the residual is float noise
    v = ChainSpeculativeVerifier().verify(Draft(np.array([0], np.int32), q), p, FixedRng(1 - 2 ** -53, 0.75))
    assert v == Verdict(0, 1, NextKind.RECOVERED)  # sampled from p with u = 0.75


def test_chain_deterministic_rule_by_hand():
    p = np.array([[0.5, 0.5, 0.0], [0.0, 0.2, 0.8], [1.0, 0.0, 0.0]])
    draft = Draft(np.array([1, 2], np.int32))
    v = ChainSpeculativeVerifier()
    assert v.verify(draft, p, FixedRng(0.6, 0.5, 0.1)) == Verdict(2, 0, NextKind.BONUS)
    assert v.verify(draft, p, FixedRng(0.6, 0.1)) == Verdict(1, 1, NextKind.RECOVERED)
    assert v.verify(draft, p, FixedRng(0.2)) == Verdict(0, 0, NextKind.RECOVERED)


@pytest.mark.parametrize("kind", ["chain", "block"])
@pytest.mark.parametrize("use_q", [False, True])
def test_sampled_verify_forms_rows_only_up_to_the_first_rejection(kind, use_q):
    """The chain rules read p row by row: a draft rejected at token i forms rows 0..i of the stepper's ProbRows, and
    the verdict is the one the whole array gives (the same uniforms). Block verification with q reads every row."""
    params = SamplingParams(temperature=1.0, top_p=0.9)
    logits = P_TABLE[[0, 1, 2, 3]]  # [4, V]: rows for [last, x1, x2, x3]
    p = logits_to_probs(logits, params)
    x = np.array([int(np.argmin(p[0])), 2, 3], np.int32)  # the first draft token is the target's least likely
    q = logits_to_probs(Q_TABLE[[0, 1, 2]], params) if use_q else None
    if use_q:
        q[0] = 0.0
        q[0, x[0]] = 1.0  # the drafter was sure of it: p/q is small, so U rejects it
    verifier = make_verifier(params, VerifierKind(kind))
    rows = ProbRows(logits, params)
    got = verifier.verify(Draft(x, q), rows, FixedRng(0.99, 0.5, 0.5, 0.5, 0.5))
    assert got == verifier.verify(Draft(x, q), p, FixedRng(0.99, 0.5, 0.5, 0.5, 0.5))
    assert got.n_accepted == 0
    assert sorted(rows._rows) == ([0, 1, 2, 3] if kind == "block" and use_q else [0])


@pytest.mark.parametrize("verifier", [GreedyVerifier(), ChainSpeculativeVerifier()], ids=["greedy", "chain"])
def test_empty_draft_emits_bonus(verifier):
    p = one_hot_rows(3)
    for q in (None, np.zeros((0, 5))):
        v = verifier.verify(Draft(np.zeros(0, np.int32), q), p, np.random.default_rng(0))
        assert v == Verdict(0, 3, NextKind.BONUS)


def test_greedy_prefix_match_and_bonus():
    g, rng = GreedyVerifier(), np.random.default_rng(0)
    p = one_hot_rows(0, 2, 4, 1)
    assert g.verify(Draft(np.array([0, 2, 4], np.int32)), p, rng) == Verdict(3, 1, NextKind.BONUS)
    assert g.verify(Draft(np.array([0, 3, 4], np.int32)), p, rng) == Verdict(1, 2, NextKind.RECOVERED)
    assert g.verify(Draft(np.array([1, 2, 4], np.int32)), p, rng) == Verdict(0, 0, NextKind.RECOVERED)
    soft = np.array([[0.1, 0.45, 0.45], [0.6, 0.3, 0.1]])  # not one-hot: argmax, ties -> lowest id
    assert g.verify(Draft(np.array([1], np.int32)), soft, rng) == Verdict(1, 0, NextKind.BONUS)
    # the steppers' path: the greedy choices themselves (no one-hot rows), the same verdicts
    for tokens in ([0, 2, 4], [0, 3, 4], [1, 2, 4], []):
        draft = Draft(np.array(tokens, np.int32))
        assert g.verify_ids(draft, np.array([0, 2, 4, 1][:len(tokens) + 1])) == g.verify(draft, p[:len(tokens) + 1],
                                                                                          rng)
    with pytest.raises(ValueError, match="k\\+1 = 3 greedy choices"):
        g.verify_ids(Draft(np.array([0, 2], np.int32)), np.array([0, 2]))


def test_greedy_chain_agree_on_one_hot_p():
    p = one_hot_rows(1, 2, 3)
    draft = Draft(np.array([1, 4], np.int32))
    want = Verdict(1, 2, NextKind.RECOVERED)
    assert GreedyVerifier().verify(draft, p, np.random.default_rng(0)) == want
    assert ChainSpeculativeVerifier().verify(draft, p, np.random.default_rng(0)) == want


def test_wrong_number_of_rows_raises():
    with pytest.raises(ValueError, match="k\\+1"):
        ChainSpeculativeVerifier().verify(Draft(np.array([1, 2], np.int32)), one_hot_rows(1, 2), FixedRng())


def test_make_verifier():
    assert isinstance(make_verifier(SamplingParams()), GreedyVerifier)
    assert isinstance(make_verifier(SamplingParams(temperature=0.8)), ChainSpeculativeVerifier)
