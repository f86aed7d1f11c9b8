"""Device profiles and the auto-tuner (perf/profile.py, perf/profile_measure.py): choose() on synthetic profiles
with hand-computed answers, the cost model's pieces, and the JSON cache (round trip, schema, stale and corrupt)."""
import json

import pytest

from specedge.assembly.profile import (PLAIN, DeviceProfile, DrafterProfile, choose, load_profile, predict,
                                   predict_adaptive, profile_key, save_profile)
from specedge.assembly.profile_measure import acceptance, draft_cost, fit_line
from specedge.runtime.types import StepStats


def drafter(spec, accept, dist=None, fixed=0.0, per_token=0.0, measured=0.0, adaptive=0.0, tau=0.0):
    k = len(accept)
    return DrafterProfile(spec, k, list(accept), dist or [0.0] * k + [1.0], fixed, per_token, rounds=100,
                          tok_s_measured=measured, tok_s_adaptive=adaptive, tau_adaptive=tau)


def profile(verify_ms, drafters, overhead=(0.0, 0.0)):
    return DeviceProfile(key="k", target="numpy", backend="numpy", model="m.gguf", fingerprint="f", threads=1,
                         device="cpu", ctx=128, verify_s=[t / 1e3 for t in verify_ms], overhead_s=list(overhead),
                         drafters={d.spec: d for d in drafters})


def test_a_larger_k_wins_on_a_flat_verify_curve():
    # the module docstring's example: 1.8 / 11.5 ms, 2.44 / 13 ms, 2.952 / 15 ms
    p = profile([10, 11.5, 13, 15], [drafter("ngram", [0.8] * 3)])
    c = choose(p)
    assert (c.drafter, c.k) == ("ngram", 3)
    assert c.predicted_tok_s == pytest.approx(2.952 / 0.015) and c.plain_tok_s == pytest.approx(100)
    rates = {x.k: x.tok_s for x in c.candidates if x.drafter == "ngram"}
    assert rates[1] == pytest.approx(1.8 / 0.0115) and rates[2] == pytest.approx(2.44 / 0.013)


def test_plain_wins_when_verification_costs_linear_time():
    p = profile([10, 20, 30, 40], [drafter("ngram", [0.3] * 3)])
    c = choose(p)
    assert (c.drafter, c.k) == (PLAIN, 0) and c.predicted_tok_s == pytest.approx(100)
    assert predict(p, "ngram", 1).tok_s == pytest.approx(1.3 / 0.02)  # 65 tok/s


def test_short_drafts_and_drafting_cost_enter_the_round_time():
    # n-gram: no match half the time (a 1-wide verify), else a full draft of 4 at alpha 0.5 (0 when not drafted is
    # already inside alpha). Model drafter: 1 ms per round + 2 ms per token, alpha 0.9.
    ngram = drafter("ngram", [0.5] * 4, dist=[0.5, 0, 0, 0, 0.5])
    model = drafter("model:x", [0.9] * 4, fixed=1e-3, per_token=2e-3)
    p = profile([10, 10.5, 11, 11.5, 12], [ngram, model])
    two = predict(p, "ngram", 2)  # L = 0 or 2: 0.5 T(1) + 0.5 T(3) = 10.5 ms; 1 + 0.5 + 0.25 tokens
    assert two.round_s == pytest.approx(0.0105) and two.tokens_per_round == pytest.approx(1.75)
    four = predict(p, "model:x", 4)  # 4.0951 tokens / (12 + 1 + 8 ms)
    assert four.tok_s == pytest.approx(4.0951 / 0.021)
    c = choose(p)
    assert (c.drafter, c.k) == ("model:x", 4)
    c = choose(p, ["ngram"])  # only the n-gram drafter: 1.9375 tokens / 11 ms at k = 4
    assert (c.drafter, c.k) == ("ngram", 4) and c.predicted_tok_s == pytest.approx(1.9375 / 0.011)
    with pytest.raises(ValueError, match="no measurements"):
        choose(p, ["model:y"])


def test_overhead_counts_for_plain_too_and_k_is_bounded_by_the_curve():
    p = profile([10, 10, 10], [drafter("ngram", [1.0] * 8)], overhead=(1e-3, 5e-4))
    c = choose(p)
    assert c.plain_tok_s == pytest.approx(1 / 0.0115)
    assert (c.drafter, c.k) == ("ngram", 2)  # T(n) measured for n <= 3 only
    assert c.predicted_tok_s == pytest.approx(3 / 0.0125)


def test_the_adaptive_length_is_a_measured_candidate_on_the_predicted_scale():
    """Fixed k: model:x at alpha 0.9, 5 ms per drafted token on T(n) = 10 ms + 0.5 ms per extra position; k = 3
    predicts 3.439 / 26.5 ms = 129.8 tok/s (k = 2: 129.0). Adaptive runs are scaled by predicted / measured at
    k = k_max (plain: 100 tok/s)."""
    model = drafter("model:x", [0.9] * 3, per_token=5e-3, measured=70.0, adaptive=84.0, tau=3.2)
    p = profile([10, 10.5, 11, 11.5], [model])
    at3 = predict(p, "model:x", 3)
    assert at3.tok_s == pytest.approx(3.439 / 0.0265)
    ad = predict_adaptive(p, "model:x")
    assert ad.adaptive and ad.k == 3 and ad.tokens_per_round == pytest.approx(3.2)
    assert ad.tok_s == pytest.approx(84.0 * at3.tok_s / 70.0)  # 1.2x the fixed k = 3 prediction
    c = choose(p)
    assert (c.drafter, c.k, c.adaptive) == ("model:x", 3, True)
    assert c.predicted_tok_s == pytest.approx(ad.tok_s) and "k<=3" in c.describe()
    slower = drafter("model:x", [0.9] * 3, per_token=5e-3, measured=70.0, adaptive=60.0, tau=3.2)
    c = choose(profile([10, 10.5, 11, 11.5], [slower]))  # adaptive measured slower than fixed: a fixed k wins
    assert (c.drafter, c.k, c.adaptive) == ("model:x", 3, False) and "k=3" in c.describe()
    unmeasured = drafter("model:x", [0.9] * 3, per_token=5e-3, measured=70.0)  # no adaptive run: no candidate
    assert predict_adaptive(profile([10, 10.5, 11, 11.5], [unmeasured]), "model:x") is None
    assert not any(x.adaptive for x in choose(p, k_max=2).candidates)  # measured up to 3 > k_max: not offered


def test_acceptance_by_position_and_length_distribution():
    rounds = [StepStats(k=3, n_accepted=2), StepStats(k=3, n_accepted=0), StepStats(k=1, n_accepted=1)]
    alpha, dist = acceptance(rounds, 3)
    assert alpha == pytest.approx([0.6, 0.5, 1 / 3])  # the docstring's example
    assert dist == pytest.approx([0, 1 / 3, 0, 2 / 3])


def test_fit_line():
    assert fit_line([0, 2, 4], [1, 2, 3]) == pytest.approx((1.0, 0.5))
    assert fit_line([3, 3], [2, 4]) == pytest.approx((3.0, 0.0))
    assert fit_line([1, 2], [3, 1]) == pytest.approx((2.0, 0.0))  # a negative slope is noise: the mean
    assert fit_line([], []) == (0.0, 0.0)


def test_draft_cost_at_one_k_is_per_token_for_paying_drafters():
    """Profiles measure at k = k_max only: a draft model's cost must scale with k, or the choice over k is wrong."""
    rounds = [StepStats(k=8, n_accepted=3, draft_s=0.080), StepStats(k=8, n_accepted=8, draft_s=0.084)]
    assert draft_cost(rounds, True) == pytest.approx((0.0, 0.01025))
    assert draft_cost(rounds, False) == pytest.approx((0.082, 0.0))  # n-gram: the lookup is per round
    mixed = rounds + [StepStats(k=4, n_accepted=1, draft_s=0.041)]  # two k: the fit separates them itself
    fixed, per_token = draft_cost(mixed, True)
    assert per_token > 0.009 and fixed < 0.003


def test_profile_json_round_trip_and_schema(tmp_path):
    p = profile([10, 11, 12], [drafter("ngram", [0.5, 0.4], fixed=1e-4)])
    path = save_profile(p, tmp_path / "profiles" / "k.json")
    back, why = load_profile(path, "k")
    assert why == "" and back == p and choose(back) == choose(p)
    assert load_profile(path, "other")[0] is None and "another model" in load_profile(path, "other")[1]
    obj = json.loads(path.read_text())
    path.write_text(json.dumps({**obj, "schema_version": 99}))
    back, why = load_profile(path, "k")
    assert back is None and "another version (schema_version 99" in why  # re-measured, never misread
    del obj["verify_s"]
    path.write_text(json.dumps(obj))
    back, why = load_profile(path, "k")
    assert back is None and "missing 'verify_s'" in why
    path.write_text("{not json")
    assert load_profile(path, "k")[0] is None and "unreadable" in load_profile(path, "k")[1]
    assert "no device profile" in load_profile(tmp_path / "none.json", "k")[1]


def test_profile_key_changes_with_what_changes_costs():
    base = profile_key("f", "onnx", 2, "cpu", "1.31")
    assert len(base) == 16 and base == profile_key("f", "onnx", 2, "cpu", "1.31")
    others = {profile_key("g", "onnx", 2, "cpu", "1.31"), profile_key("f", "llamacpp", 2, "cpu", "1.31"),
              profile_key("f", "onnx", 1, "cpu", "1.31"), profile_key("f", "onnx", 2, "cuda", "1.31"),
              profile_key("f", "onnx", 2, "cpu", "1.32")}
    assert base not in others and len(others) == 5
