"""logits_to_probs and sample against hand-computed values."""
import numpy as np
import pytest

from specedge.runtime.sampling import ProbRows, _typical_mask, greedy_ids, logits_to_probs, sample, top_ids
from specedge.runtime.types import SamplingParams


def softmax(x):
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


def row(*xs):
    return np.array([xs], dtype=np.float32)


def test_plain_softmax_and_temperature():
    p = logits_to_probs(row(1, 2, 3), SamplingParams(temperature=1.0))
    np.testing.assert_allclose(p[0], softmax([1, 2, 3]), rtol=1e-12)
    assert p.dtype == np.float64 and p.shape == (1, 3)
    p = logits_to_probs(row(1, 2, 3), SamplingParams(temperature=0.5))
    np.testing.assert_allclose(p[0], softmax([2, 4, 6]), rtol=1e-12)


def test_stable_for_large_logits():
    p = logits_to_probs(row(1000, 999, -1000), SamplingParams(temperature=1.0))
    np.testing.assert_allclose(p[0], [1 / (1 + np.exp(-1)), np.exp(-1) / (1 + np.exp(-1)), 0], atol=1e-12)


def test_greedy_one_hot_ties_lowest_id():
    p = logits_to_probs(np.array([[0, 5, 5, 1], [9, 0, 0, 9]], np.float32), SamplingParams())
    np.testing.assert_array_equal(p, [[0, 1, 0, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("n", [0, 1, 5, 20, 999, 1000, 1200])
def test_top_ids_are_the_largest_best_first_ties_lowest_id_even_at_the_boundary(n):
    """The logprobs' top list: a sort by (-value, id), whatever the candidate groups top_rows looks at first."""
    rng = np.random.default_rng(n)
    for x in (rng.integers(0, 3, 1000).astype(np.float32), rng.standard_normal(1000), np.zeros(1000)):
        want = sorted(range(1000), key=lambda j: (-x[j], j))[:n]
        assert top_ids(x, n).tolist() == want


def test_top_k():
    p = logits_to_probs(row(1, 3, 2, 0), SamplingParams(temperature=1.0, top_k=2))
    e3, e2 = np.exp(3.0), np.exp(2.0)
    np.testing.assert_allclose(p[0], [0, e3 / (e3 + e2), e2 / (e3 + e2), 0], rtol=1e-12)
    # a tie at the boundary keeps the lowest id, and exactly k tokens
    p = logits_to_probs(row(1, 2, 2, 2), SamplingParams(temperature=1.0, top_k=2))
    np.testing.assert_allclose(p[0], [0, 0.5, 0.5, 0], rtol=1e-12)
    # top_k >= V is off
    p = logits_to_probs(row(1, 2), SamplingParams(temperature=1.0, top_k=5))
    np.testing.assert_allclose(p[0], softmax([1, 2]), rtol=1e-12)


@pytest.mark.parametrize("top_p, kept", [(0.5, 1), (0.8, 2), (0.81, 3), (0.95, 3), (0.951, 4), (0.01, 1)])
def test_top_p(top_p, kept):
    probs = np.array([0.15, 0.5, 0.05, 0.3])  # sorted: 0.5 (id 1), 0.3 (id 3), 0.15 (id 0), 0.05 (id 2)
    p = logits_to_probs(np.log(probs)[None], SamplingParams(temperature=1.0, top_p=top_p))
    order = [1, 3, 0, 2]
    want = np.zeros(4)
    want[order[:kept]] = probs[order[:kept]] / probs[order[:kept]].sum()
    np.testing.assert_allclose(p[0], want, rtol=1e-12, atol=1e-15)


def test_min_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    p = logits_to_probs(np.log(probs)[None], SamplingParams(temperature=1.0, min_p=0.2))  # threshold 0.1
    np.testing.assert_allclose(p[0], [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], rtol=1e-12)
    p = logits_to_probs(np.log(probs)[None], SamplingParams(temperature=1.0, min_p=0.59))  # threshold 0.295
    np.testing.assert_allclose(p[0], [0.625, 0.375, 0, 0], rtol=1e-12)


@pytest.mark.parametrize("typical_p, kept", [(0.2, [1]), (0.3, [1, 0]), (0.6, [1, 0]), (0.8, [1, 0, 2]),
                                             (1.0, [0, 1, 2])])
def test_typical_p_keeps_the_tokens_closest_to_the_entropy(typical_p, kept):
    """The worked example of docs/algorithms.md: p = [0.5, 0.3, 0.2], H = 1.03 nats, |-log p - H| =
    [0.34, 0.17, 0.58] -> order 1, 0, 2 with cumulative mass 0.3, 0.8, 1.0; keep until the mass first exceeds
    typical_p (llama.cpp's `cum > p`); 1 is off."""
    probs = np.array([0.5, 0.3, 0.2])
    h = -(probs * np.log(probs)).sum()
    assert np.argsort(np.abs(-np.log(probs) - h)).tolist() == [1, 0, 2]
    p = logits_to_probs(np.log(probs)[None], SamplingParams(temperature=1.0, typical_p=typical_p))
    want = np.zeros(3)
    want[kept] = probs[kept] / probs[kept].sum()
    np.testing.assert_allclose(p[0], want, rtol=1e-12, atol=1e-15)


def test_typical_p_after_top_k_and_before_top_p():
    """top-k first (the typical set is taken on what top-k kept), then typical-p, then top-p on its result."""
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1]]))
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=3, typical_p=0.5))
    q = np.array([0.4, 0.3, 0.2]) / 0.9  # top-k's renormalised three; H over them
    h = -(q * np.log(q)).sum()
    order = np.argsort(np.abs(-np.log(q) - h), kind="stable")
    n = int((np.cumsum(q[order]) <= 0.5).sum()) + 1
    want = np.zeros(4)
    want[order[:n]] = q[order[:n]] / q[order[:n]].sum()
    np.testing.assert_allclose(p[0], want, rtol=1e-12)
    both = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=3, typical_p=0.5, top_p=0.01))
    assert (both[0] > 0).sum() == 1 and both[0].argmax() == np.argmax(np.where(want > 0, want, -1))


def test_typical_p_ties_go_to_the_lowest_id():
    p = logits_to_probs(np.zeros((1, 4)), SamplingParams(temperature=1.0, typical_p=0.3))  # uniform: all equal
    np.testing.assert_allclose(p[0], [0.5, 0.5, 0, 0], rtol=1e-12)  # 0.25, 0.5 > 0.3 -> ids 0 and 1


def test_order_temperature_topk_topp_minp():
    # T=0.5 doubles the logits; top_k=3 drops id 3; top_p over the renormalised 3; min_p on what remains.
    logits = row(2.0, 1.0, 0.0, -5.0)
    p = logits_to_probs(logits, SamplingParams(temperature=0.5, top_k=3, top_p=0.9))
    s = softmax([4.0, 2.0, 0.0])  # [0.867, 0.117, 0.016]: 0.867 < 0.9 <= 0.984 -> keep 2
    np.testing.assert_allclose(p[0], [s[0] / (s[0] + s[1]), s[1] / (s[0] + s[1]), 0, 0], rtol=1e-12)
    p = logits_to_probs(logits, SamplingParams(temperature=0.5, top_k=3, min_p=0.1))  # 0.117/0.867 >= 0.1
    np.testing.assert_allclose(p[0], [s[0] / (s[0] + s[1]), s[1] / (s[0] + s[1]), 0, 0], rtol=1e-12)


def test_repeat_penalty_ctrl_style():
    params = SamplingParams(temperature=1.0, repeat_penalty=2.0)
    p = logits_to_probs(row(2.0, -1.0, 0.5, 1.0), params, history=np.array([0, 1, 1]))
    np.testing.assert_allclose(p[0], softmax([1.0, -2.0, 0.5, 1.0]), rtol=1e-12)  # each id penalised once
    # greedy sees the penalty too: id 0 (2.0 -> 1.0) now loses to id 3 (1.5)
    g = logits_to_probs(row(2.0, -1.0, 0.5, 1.5), SamplingParams(repeat_penalty=2.0), history=np.array([0]))
    np.testing.assert_array_equal(g[0], [0, 0, 0, 1])


def test_repeat_penalty_window_per_row():
    # history = [.., 3, 0, 2]: rows are the inputs [3, 0, 2]; row i sees history up to its own input token.
    params = SamplingParams(temperature=1.0, repeat_penalty=2.0, repeat_last_n=2)
    logits = np.tile(np.array([1.0, 1.0, 1.0, 1.0], np.float32), (3, 1))
    p = logits_to_probs(logits, params, history=np.array([1, 3, 0, 2]))
    np.testing.assert_allclose(p[0], softmax([1, 0.5, 1, 0.5]), rtol=1e-12)  # window [1, 3]
    np.testing.assert_allclose(p[1], softmax([0.5, 1, 1, 0.5]), rtol=1e-12)  # window [3, 0]
    np.testing.assert_allclose(p[2], softmax([0.5, 1, 0.5, 1]), rtol=1e-12)  # window [0, 2]
    # a history shorter than the rows: early rows see nothing
    p = logits_to_probs(logits, params, history=np.array([2]))
    np.testing.assert_allclose(p[:2], np.full((2, 4), 0.25), rtol=1e-12)
    np.testing.assert_allclose(p[2], softmax([1, 1, 0.5, 1]), rtol=1e-12)


def test_frequency_and_presence_penalties_as_llama_cpp():
    # window [0, 1, 1, 0, 1]: id 0 twice, id 1 three times. llama.cpp: repetition once, then - c*freq - presence.
    params = SamplingParams(temperature=1.0, repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    p = logits_to_probs(row(2.0, -1.0, 0.5, 1.0), params, history=np.array([0, 1, 1, 0, 1]))
    np.testing.assert_allclose(p[0], softmax([1.0 - 1.0 - 0.25, -2.0 - 1.5 - 0.25, 0.5, 1.0]), rtol=1e-12)
    # a negative presence penalty encourages seen tokens; greedy sees it (id 2 0.5 + 1 beats id 3 1.2)
    g = logits_to_probs(row(1.0, -1.0, 0.5, 1.2), SamplingParams(presence_penalty=-1.0, repeat_last_n=1),
                        history=np.array([0, 2]))
    np.testing.assert_array_equal(g[0], [0, 0, 1, 0])
    # per row windows, as the repetition penalty: row i sees history up to its own input token
    rows = logits_to_probs(np.zeros((2, 3), np.float32), SamplingParams(temperature=1.0, frequency_penalty=1.0),
                           history=np.array([2, 2, 1]))
    np.testing.assert_allclose(rows[0], softmax([0, 0, -2]), rtol=1e-12)
    np.testing.assert_allclose(rows[1], softmax([0, -1, -2]), rtol=1e-12)


def test_logit_bias_added_first_and_bans():
    params = SamplingParams(temperature=1.0, logit_bias={1: 1.5, 3: -np.inf})
    p = logits_to_probs(row(2.0, 1.0, 0.5, 3.0), params)
    np.testing.assert_allclose(p[0], softmax([2.0, 2.5, 0.5, -np.inf]), rtol=1e-12)
    assert p[0, 3] == 0.0
    g = logits_to_probs(row(2.0, 1.0, 0.5, 3.0), SamplingParams(logit_bias={1: 1.5, 3: -np.inf}))
    np.testing.assert_array_equal(g[0], [0, 1, 0, 0])  # greedy argmax after the bias
    # the bias comes before the repetition penalty (llama.cpp's chain): 1 + 1.5 = 2.5 -> / 2 = 1.25 < 2
    g = logits_to_probs(row(2.0, 1.0), SamplingParams(logit_bias={1: 1.5}, repeat_penalty=2.0),
                        history=np.array([1]))
    np.testing.assert_array_equal(g[0], [1, 0])
    # ids past the row's width (a drafter's smaller vocabulary) do not exist there
    np.testing.assert_allclose(logits_to_probs(row(0.0, 0.0), SamplingParams(temperature=1.0, logit_bias={5: 9.0}))[0],
                               [0.5, 0.5], rtol=1e-12)


def test_dry_penalises_extending_a_repeat_as_llama_cpp():
    """DRY (llama.cpp's sampler): a token that would extend a repeat of n >= allowed_length earlier tokens loses
    multiplier * base ** (n - allowed_length); the longest repeat per token counts; breakers end repeats and are
    never penalised; each verify row sees the history up to its own input."""
    dry = SamplingParams(temperature=1.0, dry_multiplier=0.8)  # base 1.75, allowed length 2
    zeros = np.zeros((1, 8), np.float32)
    # "1 2 3 4 1 2": the suffix "1 2" occurred before, followed by 3 -> 3 loses 0.8
    p = logits_to_probs(zeros, dry, history=np.array([1, 2, 3, 4, 1, 2]))
    np.testing.assert_allclose(p[0], softmax([0, 0, 0, -0.8, 0, 0, 0, 0]), rtol=1e-12)
    # one token longer: "1 2 3" repeated, followed by 4 -> 0.8 * 1.75
    p = logits_to_probs(zeros, dry, history=np.array([1, 2, 3, 4, 1, 2, 3]))
    np.testing.assert_allclose(p[0], softmax([0, 0, 0, 0, -1.4, 0, 0, 0]), rtol=1e-12)
    # a repeat of one token (shorter than allowed) goes free; allowed_length 1 penalises it
    p = logits_to_probs(zeros, dry, history=np.array([5, 6, 0, 5]))
    np.testing.assert_allclose(p[0], np.full(8, 1 / 8), rtol=1e-12)
    one = SamplingParams(temperature=1.0, dry_multiplier=0.8, dry_allowed_length=1)
    np.testing.assert_allclose(logits_to_probs(zeros, one, history=np.array([5, 6, 0, 5]))[0],
                               softmax([0, 0, 0, 0, 0, 0, -0.8, 0]), rtol=1e-12)
    # the longest earlier match per token: 7 followed "1 2" (n 2) and "3 1 2" (n 3) -> 0.8 * 1.75
    p = logits_to_probs(zeros, dry, history=np.array([1, 2, 7, 3, 1, 2, 7, 0, 3, 1, 2]))
    assert p[0, 7] == pytest.approx(softmax([0, 0, 0, 0, 0, 0, 0, -1.4])[7], rel=1e-12)
    # "6 4 2 3" repeated, followed by 5: n 4 (0.8 * 1.75 ** 2), but with 4 a breaker the repeat counts from after
    # it: "2 3", n 2 ...
    h = np.array([6, 4, 2, 3, 5, 6, 4, 2, 3])
    np.testing.assert_allclose(logits_to_probs(zeros, dry, history=h)[0],
                               softmax([0, 0, 0, 0, 0, -0.8 * 1.75 ** 2, 0, 0]), rtol=1e-12)
    br = SamplingParams(temperature=1.0, dry_multiplier=0.8, dry_breakers={4})
    np.testing.assert_allclose(logits_to_probs(zeros, br, history=h)[0], softmax([0, 0, 0, 0, 0, -0.8, 0, 0]),
                               rtol=1e-12)
    # ... and a breaker is never penalised (a repeat of "1 2 3" followed by the breaker 4)
    p = logits_to_probs(zeros, br, history=np.array([1, 2, 3, 4, 1, 2, 3]))
    np.testing.assert_allclose(p[0], np.full(8, 1 / 8), rtol=1e-12)
    # rows: verify rows over [.., 1, 2] see the history up to their own input
    rows = logits_to_probs(np.zeros((2, 8), np.float32), dry, history=np.array([1, 2, 3, 4, 1, 2]))
    np.testing.assert_allclose(rows[0], np.full(8, 1 / 8), rtol=1e-12)  # history [.., 4, 1]: n 1
    np.testing.assert_allclose(rows[1], softmax([0, 0, 0, -0.8, 0, 0, 0, 0]), rtol=1e-12)
    # dry_last_n bounds the history; ids past the row's width (a drafter's smaller vocabulary) do not exist there
    short = SamplingParams(temperature=1.0, dry_multiplier=0.8, dry_last_n=3)
    np.testing.assert_allclose(logits_to_probs(zeros, short, history=np.array([1, 2, 3, 4, 1, 2]))[0],
                               np.full(8, 1 / 8), rtol=1e-12)
    np.testing.assert_allclose(logits_to_probs(np.zeros((1, 3), np.float32), dry,
                                               history=np.array([1, 2, 5, 4, 1, 2]))[0], np.full(3, 1 / 3))
    # greedy sees it; bad values are refused by name
    g = logits_to_probs(row(0, 0, 0, 1.0), SamplingParams(dry_multiplier=2.0), history=np.array([1, 2, 3, 0, 1, 2]))
    np.testing.assert_array_equal(g[0], [1, 0, 0, 0])
    for bad in ({"dry_multiplier": -1}, {"dry_base": 1.0}, {"dry_allowed_length": 0}, {"dry_last_n": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_penalty_without_history_is_off():
    params = SamplingParams(temperature=1.0, repeat_penalty=3.0)
    np.testing.assert_allclose(logits_to_probs(row(1, 2), params)[0], softmax([1, 2]), rtol=1e-12)


def test_input_not_modified_and_rows_normalised():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((5, 300)).astype(np.float32)
    before = logits.copy()
    p = logits_to_probs(logits, SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05,
                                               repeat_penalty=1.3), history=rng.integers(0, 300, 40))
    np.testing.assert_array_equal(logits, before)
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    assert ((p > 0).sum(axis=1) >= 1).all() and ((p > 0).sum(axis=1) <= 50).all()


@pytest.mark.parametrize("kwargs, word", [
    (dict(temperature=-0.1), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(min_p=1.0), "min_p"), (dict(min_p=-0.1), "min_p"),
    (dict(typical_p=0.0), "typical_p"), (dict(typical_p=1.2), "typical_p"),
    (dict(repeat_penalty=0.0), "repeat_penalty"), (dict(repeat_last_n=-1), "repeat_last_n"),
    (dict(temperature=float("nan")), "temperature"), (dict(presence_penalty=float("inf")), "presence_penalty"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty"), (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={3: float("inf")}), "logit_bias"),
])
def test_invalid_params_raise(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kwargs)


def test_sample_inverse_cdf_and_determinism():
    probs = np.array([0.2, 0.0, 0.5, 0.3])

    class FixedU:
        def __init__(self, u):
            self.u = u

        def random(self):
            return self.u

    assert [sample(probs, FixedU(u)) for u in (0.0, 0.1, 0.2, 0.69, 0.7, 0.95)] == [0, 0, 2, 2, 3, 3]
    assert sample(np.array([0.0, 0.0, 3.0, 0.0]), FixedU(1 - 2 ** -53)) == 2  # unnormalised, zero tail
    a = [sample(probs, r) for r in [np.random.default_rng(7)] for _ in range(200)]
    b = [sample(probs, r) for r in [np.random.default_rng(7)] for _ in range(200)]
    assert a == b and 1 not in a
    with pytest.raises(ValueError, match="mass"):
        sample(np.zeros(3), np.random.default_rng(0))


def test_sample_frequencies():
    probs = np.array([0.1, 0.6, 0.3])
    rng = np.random.default_rng(123)
    counts = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=3)
    np.testing.assert_allclose(counts / 20000, probs, atol=0.015)


def test_large_vocab_top_p_matches_full_sort():
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((4, 49152)) * 4).astype(np.float32)
    p = logits_to_probs(logits, SamplingParams(temperature=0.9, top_p=0.9))
    full = logits_to_probs(logits, SamplingParams(temperature=0.9))
    for t in range(4):
        order = np.argsort(-full[t], kind="stable")
        n = int(np.searchsorted(np.cumsum(full[t][order]), 0.9)) + 1
        want = np.zeros_like(full[t])
        want[order[:n]] = full[t][order[:n]] / full[t][order[:n]].sum()
        np.testing.assert_allclose(p[t], want, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(repeat_penalty=1.5, repeat_last_n=8),
                                    SamplingParams(logit_bias=((3, 4.0), (90, -2.0))),
                                    SamplingParams(frequency_penalty=0.7, presence_penalty=0.3, repeat_last_n=16)])
def test_greedy_ids_are_the_one_hot_rows_argmax(params):
    """What the greedy verify reads instead of one-hot rows: the same token for every row, ties included (rows with
    repeated maxima), with and without penalties and logit bias."""
    rng = np.random.default_rng(3)
    logits = rng.integers(-3, 4, (6, 97)).astype(np.float32)  # small integers: many tied maxima
    history = rng.integers(0, 97, 20)
    for hist in (None, history):
        want = logits_to_probs(logits, params, history=hist).argmax(axis=1)
        np.testing.assert_array_equal(greedy_ids(logits, params, history=hist), want)


def test_sample_equals_the_full_rows_inverse_cdf():
    """sample() runs its cdf over the columns with mass only (a sparse row) or over the whole row (a dense one); the
    draw is the full row's inverse cdf, token for token (a running sum adds +0 to nothing), including rows whose tiny
    entries do not move the sum."""
    rng = np.random.default_rng(11)
    for trial in range(800):
        V = int(rng.integers(1, 200))
        probs = rng.random(V) * (rng.random(V) < (0.3, 0.9)[trial % 2]) * 10.0 ** rng.integers(-20, 1, V)
        if not probs.sum() > 0:
            continue
        u = rng.random()
        cdf = np.cumsum(probs)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        want = i if i < V else int(np.flatnonzero(probs > 0)[-1])

        class FixedU:
            def random(self):
                return u

        assert sample(probs, FixedU()) == want


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_p=0.9, repeat_penalty=1.1, dry_multiplier=0.8, dry_base=1.75,
                   dry_allowed_length=2),
    SamplingParams(temperature=1.0, top_k=20, min_p=0.05, frequency_penalty=0.5, repeat_last_n=8),
    SamplingParams(temperature=0.5, typical_p=0.9, top_p=0.5),
    SamplingParams(temperature=1.3, min_p=0.1),
    SamplingParams(temperature=0.8, top_p=0.95, logit_bias=((3, 2.0),)),
])
def test_prob_rows_form_each_row_as_the_whole_call_does(params):
    """ProbRows (what a sampled chain verify reads) gives logits_to_probs's rows bit for bit, each with the history
    before it, and forms a row only when it is read."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((5, 3000)) * 3).astype(np.float32)
    logits[:, 7:11] = logits[:, :1]  # ties at the top
    history = rng.integers(0, 40, 30)  # repeats: the penalties and DRY bite
    want = logits_to_probs(logits, params, history=history)
    rows = ProbRows(logits, params, history=history)
    assert rows.shape == want.shape and len(rows) == 5
    np.testing.assert_array_equal(rows[2], want[2])
    assert sorted(rows._rows) == [2]  # only the row read was formed
    assert rows[4, 9] == want[4, 9] and rows[-1][3] == want[4, 3]
    np.testing.assert_array_equal(np.asarray(rows), want)


def test_in_place_work_leaves_the_callers_logits_alone_and_top_p_ties_lowest_ids():
    """The weights and the top-p/min-p renormalisation are worked in place on the private float64 copy (a fresh
    array of a large vocabulary costs about 1 ms of page faults on these VMs): the caller's logits stay as they were,
    and a tie that straddles top-p's boundary (300 tied maxima, 187 kept) keeps the lowest ids."""
    logits = np.zeros((1, 500), dtype=np.float32)
    logits[0, 200:] = 1.0  # 300 tied maxima, each 1 / (300 + 200 / e) of the mass: top-p 0.5 keeps 187 of them
    before = logits.copy()
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    np.testing.assert_array_equal(logits, before)
    kept = np.flatnonzero(p[0])
    np.testing.assert_array_equal(kept, np.arange(200, 200 + len(kept)))
    assert abs(p[0].sum() - 1.0) < 1e-12 and len(kept) == int(np.ceil(0.5 * (300 + 200 / np.e)))


def _reference(row: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The warpers as docs/algorithms.md states them, over the whole normalised row with full sorts."""
    x = row.astype(np.float64) / params.temperature
    if params.top_k:
        x[np.argsort(-x, kind="stable")[params.top_k:]] = -np.inf
    p = np.exp(x - x.max())
    p /= p.sum()
    if params.typical_p < 1.0:
        p[~_typical_mask(p[None, :], params.typical_p)[0]] = 0.0
        p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        n = int(np.searchsorted(np.cumsum(p[order]), params.top_p - 1e-9)) + 1
        p[order[n:]] = 0.0
        p /= p.sum()
    if params.min_p > 0.0:
        p[p < params.min_p * p.max()] = 0.0
    return p / p.sum()


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3),
                                    SamplingParams(temperature=0.8, top_k=40, min_p=0.05),
                                    SamplingParams(temperature=1.0, top_p=0.95, min_p=0.02, typical_p=0.9),
                                    SamplingParams(temperature=0.5, min_p=0.1)])
@pytest.mark.parametrize("flat", [False, True])
def test_warpers_match_the_whole_row_reference(params, flat):
    """Top-p and min-p work on unnormalised weights and rank only candidates above a cutoff (sampling._warp_row,
    _top_p_keep): the same tokens as the whole-row reference, the same probabilities to rounding. `flat`: one
    token far ahead and thousands just under the first cutoff (1e-3 of its weight), so the cutoff must be lowered
    until the candidates hold top_p of the mass; ties among them keep the lowest ids."""
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((3, 4096)) * 3).astype(np.float32)
    if flat:
        logits[:] = np.round(logits * 0.01) * 0.7 + 2.0  # (almost) all 2.0: ties at every boundary
        logits[:, 17] = 2.0 + 0.7 * np.log(2000.0)  # at temperature 0.7: weight 1 against ~4,000 of about 1/2000
    got = logits_to_probs(logits, params)
    for t in range(3):
        want = _reference(logits[t], params)
        np.testing.assert_array_equal(np.flatnonzero(got[t]), np.flatnonzero(want))
        np.testing.assert_allclose(got[t], want, rtol=1e-9, atol=0)
