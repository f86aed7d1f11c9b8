"""Adaptive draft length (runtime/draft_length.py): the choice rule, the online cost and acceptance estimates, and
that it changes speed only, never the output."""
import numpy as np
import pytest

from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.draft_length import AcceptanceModel, AdaptiveDraftLength, VerifyCost, best_prefix
from specedge.runtime.drafters.base import DrafterCaps
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.stats import DecodeStats

from test_decode import GREEDY, PROMPTS, RandomDrafter, tiny, tokens_of  # noqa: F401  (fixture)

CURVE = [1.0, 1.15, 1.30, 1.50]  # T(w)/T(1), w = 1..4


def test_best_prefix_worked_examples():
    assert best_prefix(np.full(3, 0.8), CURVE) == 3  # 1, 1.57, 1.88, 1.97
    assert best_prefix(np.full(3, 0.3), CURVE) == 1  # 1, 1.13, 1.07, 0.95
    assert best_prefix(np.full(3, 0.1), CURVE) == 0  # 1, 0.96, ...
    steep = [1.0, 1.35, 1.67, 2.02]  # llama.cpp Q4 on this CPU
    assert best_prefix(np.full(3, 0.3), steep) == 0


def test_verify_cost_learns_ratios_interpolates_and_clips():
    c = VerifyCost(prior_slope=0.2)
    assert c.relative(3) == pytest.approx(1.4)  # prior before any observation
    c.observe(1, 0.010)
    c.observe(5, 0.020)
    assert c.relative(5) == pytest.approx(2.0)
    assert c.relative(3) == pytest.approx(1.5)  # between the observed widths
    assert c.relative(7) == pytest.approx(2.5)  # beyond: the observed slope, 2.5 ms per position
    c.observe(5, 10.0)  # a preempted call moves the estimate by at most weight * 2 * old
    assert c.relative(5) < 2.5
    noisy = VerifyCost()
    noisy.observe(1, 0.010)
    noisy.observe(2, 0.009)  # a wider call measured faster than a narrower one
    assert np.allclose(noisy.curve(3)[:2], 1.0) and noisy.curve(3)[2] >= 1.0


def test_verify_cost_without_one_wide_calls_fits_t1_from_the_wider_ones():
    """A drafter that always drafts never runs T(1): the curve comes from the observed widths' line taken back to
    w = 1 (here T(w) = 20 ms + 1 ms per position), not from the prior slope."""
    c = VerifyCost(prior_slope=0.15)
    for w in (3, 5, 9):
        c.observe(w, 0.020 + 0.001 * w)
    assert c.relative(5) == pytest.approx(0.025 / 0.021)
    assert c.relative(2) == pytest.approx(1 + (0.023 / 0.021 - 1) / 2)  # between T(1) and the first observed width
    assert c.relative(12) == pytest.approx(0.032 / 0.021)  # beyond the widest: the fitted 1 ms per position
    one = VerifyCost(prior_slope=0.15)
    one.observe(5, 0.016)  # one width: the prior slope gives T(1) = 16 / 1.6 ms
    assert one.relative(5) == pytest.approx(1.6)
    steep = VerifyCost()
    steep.observe(2, 0.001)
    steep.observe(3, 0.030)  # a line through these crosses zero before w = 1: T(1) stays >= T(2) / 2
    assert steep.relative(2) == pytest.approx(2.0)


def test_acceptance_model_converges_and_forgets():
    m = AcceptanceModel(k_max=3, decay=1.0)
    assert np.allclose(m.probs(1, 3), 0.5)
    rng = np.random.default_rng(0)
    for _ in range(2000):  # position i accepted with prob 0.9 given the previous were
        n = 0
        while n < 3 and rng.random() < 0.9:
            n += 1
        m.observe(1, 3, n)
    assert np.allclose(m.probs(1, 3), 0.9, atol=0.03)
    assert np.allclose(m.probs(2, 3), 0.5)  # kinds are separate
    forget = AcceptanceModel(k_max=2, decay=0.9)
    forget.observe(1, 2, 0)
    for _ in range(100):
        forget.observe(2, 2, 2)
    assert forget.probs(1, 1)[0] == pytest.approx(0.5, abs=0.01)  # back at the prior: it gets tried again


def test_unreached_positions_inherit_the_deepest_estimate_so_good_drafts_get_verified_deeper():
    """A drafter accepted at ~0.97 whose drafts were only verified 3 deep: positions 4..8 take position 3's
    estimate, and on a flat verify curve the policy then verifies all 8 (with the 0.5 prior it stopped at 4)."""
    m = AcceptanceModel(k_max=8, decay=1.0)
    for _ in range(200):
        m.observe(1, 3, 3)
    p = m.probs(1, 8)
    assert np.all(p[3:] == p[2]) and p[2] > 0.95
    flat = 1.0 + 0.02 * np.arange(9)
    assert best_prefix(p, flat) == 8
    m.observe(2, 2, 0)  # a kind rejected at once: deeper positions inherit the low estimate, not 0.5
    assert m.probs(2, 4)[1:].max() < 0.5


@pytest.mark.parametrize("which", ["ngram", "random", "self"])
def test_adaptive_length_never_changes_greedy_output(tiny, which):  # noqa: F811
    target, _, tok = tiny
    for text in PROMPTS:
        prompt = tok.encode(text)
        drafter = {"ngram": NgramDrafter(), "random": RandomDrafter(target.config.vocab_size),
                   "self": ModelDrafter(target)}[which]
        got = [e.token for e in decode(target, prompt, Speculation(drafter, k=4, adaptive_k=True),
                                       Request(GREEDY, max_tokens=40))]
        assert got == tokens_of(target, prompt), (which, text)


def test_adaptive_length_stops_verifying_a_drafter_that_is_always_wrong(tiny, monkeypatch):  # noqa: F811
    # The tiny model's real verify curve is nearly flat and noisy; pin a curve like ONNX int4's so the test
    # checks the policy, not the machine's timing.
    monkeypatch.setattr(VerifyCost, "relative", lambda self, w: 1.0 + 0.15 * (w - 1))
    target, _, tok = tiny
    prompt = tok.encode(PROMPTS[0])
    fixed, adaptive = DecodeStats(), DecodeStats()
    for stats, flag in ((fixed, False), (adaptive, True)):
        for _ in decode(target, prompt, Speculation(RandomDrafter(target.config.vocab_size), k=4, adaptive_k=flag),
                        Request(GREEDY, max_tokens=60), stats=stats):
            pass
    assert fixed.n_drafted == 4 * fixed.n_target_forwards
    assert adaptive.n_drafted < 0.3 * fixed.n_drafted


def test_policy_keeps_full_drafts_that_are_always_accepted():
    p = AdaptiveDraftLength(k_max=4)
    for w, t in enumerate(CURVE, start=1):
        p.cost.observe(w, t)
    p.cost.observe(5, 1.62)
    for _ in range(50):
        p.observe(kind=3, verified=4, n_accepted=4, width=5, seconds=1.62)
    assert p.choose(3, 4) == 4
    assert p.choose(3, 0) == 0


class AskedDrafter(RandomDrafter):
    """RandomDrafter that records the k it is asked for; caps.pays_per_token marks it as paying per token."""

    def __init__(self, vocab, paid):
        super().__init__(vocab)
        self.caps = DrafterCaps(pays_per_token=paid)
        self.weight_bytes_per_token, self.asked = int(paid), []

    def propose(self, context, k, params, rng):
        self.asked.append(k)
        return super().propose(context, k, params, rng)


def test_a_drafter_that_pays_per_token_drafts_only_what_would_be_verified(tiny, monkeypatch):  # noqa: F811
    """Always-wrong drafts: a paid drafter is soon asked for 1 token per round (it used to draft k and see most of it
    cut); a free one (n-gram-like) is still asked for k, the policy cutting after the fact. Output unchanged."""
    monkeypatch.setattr(VerifyCost, "relative", lambda self, w: 1.0 + 0.15 * (w - 1))
    target, _, tok = tiny
    prompt = tok.encode(PROMPTS[0])
    plain = tokens_of(target, prompt, n=60)
    for paid in (True, False):
        d = AskedDrafter(target.config.vocab_size, paid)
        got = [e.token for e in decode(target, prompt, Speculation(d, k=6, adaptive_k=True),
                                       Request(GREEDY, max_tokens=60))]
        assert got == plain
        later = d.asked[10:]
        assert (max(later) == 1) if paid else (min(later) == 6), (paid, d.asked)
