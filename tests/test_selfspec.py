"""Self-speculative drafters (layer skip, SWIFT, early exit, DEL) and the draft-stop policies on a tiny NumPy model."""
import numpy as np
import pytest
from test_numpy_backend import random_weights

from specedge.assembly.load import DrafterKind, DrafterSpec
from specedge.runtime.draft_stop import StopKind, StopSpec
from specedge.runtime.drafters.spec import ExitSpec, ModelSpec, SkipSpec
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.draft_stop import (ConfidenceStop, LogisticStop, fit_logistic, fit_threshold, parse_stop,
                                         stop_features)
from specedge.runtime.drafters.early_exit import DelDrafter, EarlyExitDrafter, best_exit, tokens_per_layer
from specedge.runtime.drafters.layerskip import LayerSkipDrafter, SwiftDrafter, balanced_layers
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.selfspec import require_layered
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import SamplingParams

GREEDY = SamplingParams()
L = 6


@pytest.fixture(scope="module")
def target():
    return NumpyBackend(random_weights(seed=3, n_layers=L), dtype=np.float64)


def prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 97, n).astype(np.int32) for n in (1, 5, 12)] + [np.array([5, 6, 7] * 4, np.int32)]


def run(target, prompt, drafter=None, k=4, n=36, stats=None, params=GREEDY):
    return [e.token for e in decode(target, prompt, Speculation(drafter, k=k, adaptive_k=False),
                                    Request(params, max_tokens=n, seed=0), stats=stats)]


DRAFTERS = {
    "skip:1.5": lambda: LayerSkipDrafter(1.5),
    "skip:2": lambda: LayerSkipDrafter(2.0),
    "swift": lambda: SwiftDrafter(window=8, surrogate_every=3),
    "exit:2": lambda: EarlyExitDrafter(2),
    "exit:2+conf": lambda: EarlyExitDrafter(2, ConfidenceStop(min_samples=4)),
    "del": lambda: DelDrafter(),
    "del+logistic": lambda: DelDrafter(LogisticStop(min_samples=4)),
    "skip:2+logistic": lambda: LayerSkipDrafter(2.0, LogisticStop(0.3, min_samples=4)),
}


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_greedy_output_equals_plain_greedy(target, name):
    for prompt in prompts():
        assert run(target, prompt, DRAFTERS[name]()) == run(target, prompt), (name, prompt)


def test_model_drafter_with_stop_policies_is_lossless(target):
    small = NumpyBackend(random_weights(seed=4, n_layers=1), dtype=np.float64)
    for stop in (ConfidenceStop(min_samples=4), LogisticStop(min_samples=4)):
        for prompt in prompts()[1:3]:
            d = ModelDrafter(small, stop=stop)
            assert run(target, prompt, d, k=5) == run(target, prompt)


def test_sampled_decoding_runs_with_selfspec_q(target):
    params = SamplingParams(temperature=0.8)
    for name in ("skip:2", "del"):
        toks = run(target, prompts()[2], DRAFTERS[name](), params=params)
        assert len(toks) == 36 and all(0 <= t < 97 for t in toks)


def test_full_depth_drafters_are_always_accepted(target):
    for d in (EarlyExitDrafter(L), LayerSkipDrafter(1.0)):
        stats = DecodeStats()
        run(target, prompts()[2], d, k=3, n=24, stats=stats)
        assert stats.n_accepted == stats.n_drafted > 0


@pytest.mark.parametrize("name", ["skip:2", "swift", "exit:3", "del"])
def test_propose_leaves_the_cache_length_and_committed_rows_alone(target, name):
    drafter = SwiftDrafter(window=8) if name == "swift" else {
        "skip:2": lambda: LayerSkipDrafter(2.0), "exit:3": lambda: EarlyExitDrafter(3),
        "del": lambda: DelDrafter()}[name]()
    ctx = prompts()[2]
    cache = target.new_cache(40)
    target.forward(ctx[:-1], cache)
    k_before, v_before = cache.k[:, :, :cache.length].copy(), cache.v[:, :, :cache.length].copy()
    drafter.bind(target, cache)
    drafter.begin(ctx)
    draft = drafter.propose(ctx, 4, GREEDY, np.random.default_rng(0))
    assert cache.length == len(ctx) - 1 and 1 <= draft.k <= 4
    if name == "swift":  # a search step rewrites the window's rows with the full model: they must come back equal
        target.forward(ctx[-1:], cache)  # the verify forward committed the last token (nothing accepted)
        drafter.learn(0, int(draft.tokens[0]))
        assert drafter.iters == 1 and cache.length == len(ctx) and 0 <= drafter.best_score <= 1
    n = len(ctx) - 1
    np.testing.assert_allclose(cache.k[:, :, :n], k_before, atol=1e-12)
    np.testing.assert_allclose(cache.v[:, :, :n], v_before, atol=1e-12)


def test_drafters_hold_no_weights(target):
    weights = list(target._w.values())
    for name, make in DRAFTERS.items():
        d = make()
        run(target, prompts()[2], d, n=12)
        held = [v for v in vars(d).values() if isinstance(v, np.ndarray)]
        assert not any(np.shares_memory(a, w) for a in held for w in weights), name
        assert sum(a.nbytes for a in held) < min(w.nbytes for w in weights if w.ndim == 2), name


def test_skip_sets_keep_first_and_last_layers(target):
    for n in (2, 3, 6, 24, 30):
        for r in (1.0, 1.5, 2.0, 3.0, 100.0):
            kept = balanced_layers(n, r)
            assert kept[0] == 0 and kept[-1] == n - 1 and list(kept) == sorted(set(kept))
            assert len(kept) == int(np.clip(round(n / r), 2, n))
    assert balanced_layers(30, 2.0) == (0, 2, 4, 6, 8, 10, 12, 15, 17, 19, 21, 23, 25, 27, 29)
    d = SwiftDrafter(window=8, surrogate_every=3)
    run(target, prompts()[2], d, n=40)
    assert d.iters > 0
    for skip, _ in d.history + [(d.best_skip, 0)]:
        assert 0 not in skip and L - 1 not in skip and len(skip) == len(d.best_skip)
    with pytest.raises(ValueError, match="R must be >= 1"):
        LayerSkipDrafter(0.5)


def test_del_choice_maximises_tokens_per_layer():
    assert best_exit({2: 0.5, 4: 0.9}, 8, 4) == (4, 3)
    assert tokens_per_layer(0.9, 4, 3, 8) == pytest.approx((1 - 0.9 ** 4) / 0.1 / 20)
    assert tokens_per_layer(1.0, 4, 3, 8) == pytest.approx(4 / 20)
    rng = np.random.default_rng(0)
    for _ in range(20):
        acc = {int(l): float(a) for l, a in zip(rng.choice(np.arange(1, 30), 5, replace=False), rng.uniform(0, 1, 5))}
        l, d = best_exit(acc, 30, 8)
        best = max(tokens_per_layer(a, ll, dd, 30) for ll, a in acc.items() for dd in range(1, 9))
        assert tokens_per_layer(acc[l], l, d, 30) == pytest.approx(best)


def test_del_learns_from_shadow_tokens(target):
    d = DelDrafter(n_candidates=3)
    run(target, prompts()[2], d, n=30)
    acc = d.acceptance()
    assert set(acc) == set(d.verify_taps) and all(sum(d._seen[l]) > 0 for l in d.verify_taps)
    assert acc[L - 1] >= min(acc.values())  # the deepest candidate agrees with the target most often (or ties)
    assert d.choice[0] in d.verify_taps and d.choice[1] >= 1


def test_logistic_predictor_fits_a_separable_case():
    rng = np.random.default_rng(0)
    c = rng.uniform(0, 1, 400)
    h = rng.uniform(0, 3, 400)  # entropy carries no signal here
    y = (c > 0.5).astype(float)
    w = fit_logistic(np.stack([c, h], 1), y, np.array([4.0, 0.0, -2.0]), l2=1e-3)
    stop = LogisticStop(min_samples=4)
    stop.w = w
    p = stop.predict(np.stack([c, h], 1))
    assert ((p > 0.5) == (y > 0.5)).mean() > 0.97
    assert np.isfinite(w).all() and w[0] > 5 and abs(w[1]) < 1
    # on-line: the stop learns the same rule from draft verdicts (accepted while c > 0.5)
    online = LogisticStop(min_samples=8)
    for _ in range(60):
        feats = np.stack([rng.uniform(0, 1, 4), rng.uniform(0, 3, 4)], 1)
        bad = np.flatnonzero(feats[:, 0] <= 0.5)
        online.observe(feats, int(bad[0]) if len(bad) else 4)
    assert online.predict(np.array([[0.9, 1.0]]))[0] > 0.8 and online.predict(np.array([[0.1, 1.0]]))[0] < 0.2
    assert online.stop(np.array([[0.9, 1.0], [0.1, 1.0]])) and not online.stop(np.array([[0.95, 1.0]]))


def test_confidence_threshold_refit():
    c = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.9])
    y = np.array([0, 0, 0, 1, 1, 1.0])
    assert fit_threshold(c, y, 0.4) == 0.6
    assert fit_threshold(c, np.ones(6), 0.4) == 0.4  # one class only: keep the current threshold
    s = ConfidenceStop(0.9, min_samples=4)
    for _ in range(10):
        s.observe(np.array([[0.7, 0.0], [0.6, 0.0], [0.2, 0.0]]), 2)
    assert s.threshold == 0.6 and ConfidenceStop(0.3, refit=False).name == "conf:0.3"
    assert stop_features(np.array([0.0, 0.0]), 1) == pytest.approx((0.5, np.log(2)))


def test_specs_and_capability_errors():
    assert DrafterSpec.parse("skip:1.5") == SkipSpec(1.5)
    assert DrafterSpec.parse("exit:10+logistic:0.6") == ExitSpec(10, StopSpec(StopKind.LOGISTIC, 0.6))
    assert DrafterSpec.parse("model:a+b.gguf") == ModelSpec("a+b.gguf")
    assert DrafterSpec.parse("swift").kind is DrafterKind.SWIFT and str(DrafterSpec.parse("del+conf").stop) == "conf"
    for bad in ("skip", "swift:3", "exit:x", "ngram+conf", "del+conf:abc"):
        with pytest.raises(ValueError):
            DrafterSpec.parse(bad)
    with pytest.raises(ValueError, match="unknown draft stop"):
        parse_stop("foo")
    markov = MarkovBackend(random_markov_table(16, seed=0))
    with pytest.raises(ValueError, match="caps.layer_plan"):
        require_layered(markov, "skip:2")
    with pytest.raises(ValueError, match="caps.layer_plan"):
        LayerSkipDrafter(2.0).bind(markov, markov.new_cache(8))
