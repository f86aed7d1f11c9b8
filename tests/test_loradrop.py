"""LoRA-Drop (docs/algorithms.md 2.5) on a tiny seeded model: the closed-form fit, the drop-step plan, storage, the
lossless drafter and the labelled lossy mode; entropy-adaptive switching (section 4)."""
import copy

import numpy as np
import pytest

from specedge.runtime.backends.base import LayerPlan, LowRankReuse
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.loradrop import LoRADropDrafter
from specedge.runtime.loradrop import (Corrections, LoRADropFit, Schedule, droppable_layers, drop_pairs, fit,
                                       low_rank, pure_reuse, residual_streams, solve_w)
from specedge.runtime.lossy import EntropySwitch, LoRADropLossy
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import SamplingParams
from test_numpy_backend import random_weights

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def model():
    return NumpyBackend(random_weights(0, n_layers=6), dtype=np.float64)


@pytest.fixture(scope="module")
def corrections(model):
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, 97, 40).astype(np.int32) for _ in range(4)]
    return fit(model, seqs, LoRADropFit(rank=4, cycle=3))


def test_droppable_rule_and_spec_parse():
    assert droppable_layers(10) == (1, 2, 3, 5, 6, 7, 9)
    assert LoRADropFit.parse("rank=8,cycle=4,ridge=0.001") == LoRADropFit(8, 4, 1e-3)
    with pytest.raises(ValueError, match="key=value"):
        LoRADropFit.parse("r=8")
    with pytest.raises(ValueError, match="cycle >= 2"):
        LoRADropFit.parse("cycle=1")


def test_closed_form_matches_least_squares():
    rng = np.random.default_rng(0)
    x, d = rng.standard_normal((6, 50)), rng.standard_normal((5, 50))
    w0 = solve_w(x, d, 0.0)
    np.testing.assert_allclose(w0, np.linalg.lstsq(x.T, d.T, rcond=None)[0].T, atol=1e-10)
    # ridge: the same as least squares on the augmented system [X^T; sqrt(lam) I]
    ridge = 0.1
    lam = ridge * np.trace(x @ x.T) / 6
    aug_x, aug_d = np.vstack([x.T, np.sqrt(lam) * np.eye(6)]), np.vstack([d.T, np.zeros((6, 5))])
    np.testing.assert_allclose(solve_w(x, d, ridge), np.linalg.lstsq(aug_x, aug_d, rcond=None)[0].T, atol=1e-10)


def test_low_rank_reproduces_w_at_its_rank_and_is_best_below():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 2)) @ rng.standard_normal((2, 8))  # rank 2
    x = rng.standard_normal((8, 100))
    for r in (2, 3, 8):
        a, b = low_rank(w, x, r)
        np.testing.assert_allclose(b @ a, w, atol=1e-10)
    a, b = low_rank(w, x, 1)
    u, s, _ = np.linalg.svd(w @ x)
    np.testing.assert_allclose(np.linalg.norm((b @ a - w) @ x), s[1], rtol=1e-9)  # Eckart-Young on W X


def test_fit_pairs_follow_the_refresh_positions(model):
    toks = np.random.default_rng(2).integers(0, 97, 10).astype(np.int32)
    s = residual_streams(model, toks)
    x, d = drop_pairs(s, 2, 4)
    assert x.shape == (32, 7)  # positions 1,2,3,5,6,7,9 are drop steps
    out = s[3] - s[2]
    np.testing.assert_allclose(d[:, 3], out[5] - out[4])  # position 5's anchor is the refresh at 4
    np.testing.assert_allclose(x[:, 3], s[2][5])


def test_drop_plan_adds_anchor_plus_low_rank_and_writes_no_kv(model):
    toks = np.arange(5, dtype=np.int32)
    d = model.config.d_model
    rng = np.random.default_rng(4)
    r = LowRankReuse(2, rng.standard_normal(d), rng.standard_normal((3, d)), rng.standard_normal((d, 3)), 2.0)
    cache = model.new_cache(16)
    h, taps = model.hidden(toks, cache, plan=LayerPlan(reuse=(r,)), taps=(2, 3))
    expect = taps[2] + r.anchor + 2.0 * taps[2] @ r.a.T @ r.b.T
    np.testing.assert_allclose(taps[3], expect)
    assert cache.absent[2, :5].all() and not cache.absent[1, :5].any()
    garbled = copy.deepcopy(cache)
    garbled.k[2, :, :5] = 1e3  # a later full step at layer 2 must not attend to the missing rows
    expect = model.forward(toks[:1], copy.deepcopy(cache))
    np.testing.assert_allclose(model.forward(toks[:1], garbled), expect)
    assert not garbled.absent[2, 5]
    garbled = copy.deepcopy(cache)
    garbled.k[1, :, :5] = 1e3  # ...but it does attend to the rows the other layers wrote
    assert not np.allclose(model.forward(toks[:1], garbled), expect)


def test_schedule_without_droppable_layers_is_the_full_model(model):
    """Refresh and drop steps share the cache: with nothing to drop, the cycle is token-by-token full decoding."""
    corr = Corrections(2, (), (), ())  # no droppable layers: drop steps are full steps
    toks = np.random.default_rng(5).integers(0, 97, 8).astype(np.int32)
    sched, cache = Schedule(model, corr), model.new_cache(16)
    rows = [sched.step(toks[i:i + 1], cache, i)[0] for i in range(8)]
    np.testing.assert_allclose(np.stack(rows), model.forward(toks, model.new_cache(16)), atol=1e-9)


def test_storage_round_trip_and_hash_check(tmp_path, corrections):
    corrections.save(tmp_path)
    back = Corrections.load(tmp_path)
    assert (back.rank, back.cycle, back.layers) == (4, 3, corrections.layers)
    for a, b in zip(back.a, corrections.a):
        np.testing.assert_array_equal(a, b)
    assert back.provenance["n_sequences"] == 4
    (tmp_path / "lora_drop.npz").write_bytes((tmp_path / "lora_drop.npz").read_bytes()[:-1] + b"x")
    with pytest.raises(ValueError, match="SHA-256"):
        Corrections.load(tmp_path)


def test_fitted_beats_pure_reuse_on_calibration(model, corrections):
    """The fit lowers the drop-step residual error vs. A = B = 0 on the data it was fitted on."""
    toks = np.random.default_rng(3).integers(0, 97, 40).astype(np.int32)
    s = residual_streams(model, toks)
    for i, l in enumerate(corrections.layers):
        x, d = drop_pairs(s, l, 3)
        fitted = np.linalg.norm(d - corrections.b[i] @ corrections.a[i] @ x)
        assert fitted < np.linalg.norm(d)


@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("rank", [0, 4])
def test_drafter_is_lossless(model, corrections, k, rank):
    corr = corrections.truncated(rank) if rank else pure_reuse(model.config.d_model, corrections.layers, 3)
    prompt = np.array([1, 5, 9, 2], dtype=np.int32)
    plain = [e.token for e in decode(model, prompt, PLAIN, Request(GREEDY, max_tokens=30))]
    stats = DecodeStats()
    drafted = [e.token for e in decode(model, prompt, Speculation(LoRADropDrafter(corr), k=k),
                                       Request(GREEDY, max_tokens=30), stats=stats)]
    assert drafted == plain
    assert stats.n_drafted > 0 and stats.n_accepted > 0  # the first draft token is the full model's: accepted


def test_drafter_sampling_keeps_q_and_cache_length(model, corrections):
    params = SamplingParams(temperature=0.8)
    d = LoRADropDrafter(corrections)
    cache = model.new_cache(32)
    ctx = np.array([3, 4, 5], dtype=np.int32)
    model.forward(ctx[:-1], cache)
    d.bind(model, cache)
    d.begin(ctx)
    draft = d.propose(ctx, 4, params, np.random.default_rng(0))
    assert cache.length == 2 and draft.k == 4
    np.testing.assert_allclose(draft.q.sum(axis=1), 1.0)


def test_lossy_mode_is_labelled_and_differs_from_full_only_through_drops(model, corrections):
    prompt = np.array([1, 5, 9, 2], dtype=np.int32)
    lossy = LoRADropLossy(corrections)
    assert "lossy" in lossy.label
    out = [e.token for e in decode(model, prompt, Speculation(lossy=lossy), Request(GREEDY, max_tokens=20))]
    assert len(out) == 20
    # cycle 1 would be all refresh steps: a cycle longer than the output with no droppable layers is the full model
    full = [e.token for e in decode(model, prompt, PLAIN, Request(GREEDY, max_tokens=20))]
    same = LoRADropLossy(Corrections(3, (), (), ()))
    assert [e.token for e in decode(model, prompt, Speculation(lossy=same), Request(GREEDY, max_tokens=20))] == full
    assert out[0] == full[0]  # step 0 is a refresh: the full model


def test_entropy_switch_threshold_zero_is_plain_large(model):
    small = NumpyBackend(random_weights(7, n_layers=1), dtype=np.float64)
    prompt = np.array([1, 5, 9, 2], dtype=np.int32)
    plain = [e.token for e in decode(model, prompt, PLAIN, Request(GREEDY, max_tokens=25))]
    sw = EntropySwitch(small, threshold=0.0)
    assert [e.token for e in decode(model, prompt, Speculation(lossy=sw), Request(GREEDY, max_tokens=25))] == plain
    assert sw.switches == 0 and sw.large_tokens == 25


def test_entropy_switch_switches_and_catches_up(model):
    small = NumpyBackend(random_weights(7, n_layers=1), dtype=np.float64)
    prompt = np.array([1, 5, 9, 2], dtype=np.int32)
    high = EntropySwitch(small, threshold=1e9, min_dwell=1)  # never uncertain enough: the small model after 1 token
    out = [e.token for e in decode(model, prompt, Speculation(lossy=high), Request(GREEDY, max_tokens=25))]
    assert high.trace == ["L"] + ["S"] * 24 and high.switches == 1
    assert out[0] == [e.token for e in decode(model, prompt, PLAIN, Request(GREEDY, max_tokens=1))][0]
    # the small model prefilled the prompt and the large model's token it missed: its continuation is its own
    cont = [e.token for e in decode(small, np.concatenate([prompt, out[:1]]).astype(np.int32), PLAIN,
                                    Request(GREEDY, max_tokens=24))]
    assert out[1:] == cont
    other = NumpyBackend(random_weights(1, n_layers=2), dtype=np.float64)
    sw = EntropySwitch(other, threshold=0.5, min_dwell=2)
    list(decode(model, prompt, Speculation(lossy=sw), Request(GREEDY, max_tokens=30)))
    runs = "".join(sw.trace).replace("LS", "L S").replace("SL", "S L").split()
    assert sw.switches >= 2 and len(runs) == sw.switches + 1, sw.trace  # back and forth
    assert all(len(r) >= 2 for r in runs[1:-1])  # the minimum dwell holds between switches


def test_ppl_script_schedule_without_drops_is_the_full_model(model, corrections):
    from specedge.perf.loradrop_ppl import score_full, score_schedule
    seqs = [np.random.default_rng(9).integers(0, 97, 20).astype(np.int32)]
    full = score_full(model, seqs, 4)
    assert np.isclose(score_schedule(model, Corrections(3, (), (), ()), seqs, 4), full)
    assert score_schedule(model, corrections, seqs, 4) != full


def test_lossy_specs_are_a_typed_union_that_round_trips():
    from specedge.runtime.lossy import EntropySwitchSpec, LoRADropLossySpec, parse_lossy
    for text in ("loradrop", "loradrop:/tmp/corr", "entropy-switch:smollm2-135m,0.5", "entropy-switch:m.gguf,1.25,6"):
        spec = parse_lossy(text)
        assert str(spec) == text and parse_lossy(str(spec)) == spec
    assert parse_lossy("loradrop") == LoRADropLossySpec(None)
    assert parse_lossy("entropy-switch:small,0.5") == EntropySwitchSpec("small", 0.5, 4)
    for bad in ("sometimes", "entropy-switch:", "entropy-switch:small", "entropy-switch:small,x",
                "entropy-switch:small,0.5,0"):
        with pytest.raises(ValueError, match="lossy|entropy-switch"):
            parse_lossy(bad)
