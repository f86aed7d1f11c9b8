"""DecodeStats bookkeeping and the closed-form metrics of docs/algorithms.md 1.1 and 5."""
import json

import numpy as np
import pytest

from specedge.runtime.stats import DecodeStats, expected_speedup, expected_tokens_per_step, mbsu
from specedge.runtime.types import StepStats


def test_docstring_example():
    s = DecodeStats()
    for k, n in [(4, 4), (4, 1), (2, 0)]:
        s.record(StepStats(k=k, n_accepted=n, draft_s=0.1, verify_s=0.2))
    assert (s.n_target_forwards, s.n_emitted, s.n_drafted, s.n_accepted) == (3, 8, 10, 5)
    assert s.mean_accepted_length == pytest.approx(8 / 3)
    assert s.acceptance_rate == pytest.approx(0.5)
    np.testing.assert_array_equal(s.accepted_hist, [1, 1, 0, 0, 1])
    np.testing.assert_allclose(s.acceptance_by_position, [2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert s.draft_s == pytest.approx(0.3) and s.verify_s == pytest.approx(0.6)


def test_histogram_grows_with_k():
    s = DecodeStats()
    s.record(StepStats(k=1, n_accepted=1))
    s.record(StepStats(k=6, n_accepted=5))
    s.record(StepStats(k=3, n_accepted=0))
    np.testing.assert_array_equal(s.accepted_hist, [1, 1, 0, 0, 0, 1, 0])
    np.testing.assert_allclose(s.acceptance_by_position, [2 / 3, 1 / 2, 1 / 2, 1, 1, 0])


def test_plain_decoding_tau_is_one():
    s = DecodeStats()
    for _ in range(7):
        s.record(StepStats(k=0, n_accepted=0))
    assert s.mean_accepted_length == 1.0 and s.acceptance_rate == 0.0
    assert s.acceptance_by_position.shape == (0,)
    np.testing.assert_array_equal(s.accepted_hist, [7])


def test_rates_and_json():
    s = DecodeStats(prefill_s=0.5, decode_s=2.0)
    s.record(StepStats(k=3, n_accepted=2))
    s.record(StepStats(k=3, n_accepted=3))
    assert s.tokens_per_s == pytest.approx(7 / 2.0)  # prefill excluded
    s.n_generated = 6  # the loop stopped mid-round (eos): only 6 reached the caller
    assert s.tokens_per_s == pytest.approx(3.0)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["n_emitted"] == 7 and d["accepted_hist"] == [0, 0, 1, 1] and d["mean_accepted_length"] == 3.5
    line = s.summary()
    assert "\n" not in line and "tau 3.50" in line and "accepted 5" in line


def test_empty_stats_are_safe():
    s = DecodeStats()
    assert s.mean_accepted_length == 0.0 and s.tokens_per_s == 0.0
    json.dumps(s.to_dict())
    assert "0 tokens" in s.summary()


def test_record_rejects_impossible_rounds():
    with pytest.raises(ValueError):
        DecodeStats().record(StepStats(k=2, n_accepted=3))


def test_mbsu():
    assert mbsu(3.0, 0, 1000) == 3.0  # n-gram: no draft bytes
    assert mbsu(3.0, 4 * 100, 1000) == pytest.approx(3.0 / 1.4)
    assert mbsu(1.0, 1000, 1000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mbsu(2.0, 1, 0)


def test_expected_tokens_per_step_and_speedup():
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert expected_tokens_per_step(0.5, 0) == 1.0
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    with pytest.raises(ValueError):
        expected_tokens_per_step(1.2, 3)


def test_merge_equals_recording_everything_in_one():
    a, b, both = DecodeStats(), DecodeStats(), DecodeStats()
    for s, steps in ((a, [(4, 4), (2, 0)]), (b, [(6, 3), (1, 1), (0, 0)])):
        for k, n in steps:
            step = StepStats(k=k, n_accepted=n, draft_s=0.5, verify_s=1.0, forward_s=0.75)
            s.record(step)
            both.record(step)
        s.decode_s, s.n_generated = 2.0, 7
    merged = DecodeStats()
    merged.merge(a)
    merged.merge(b)
    assert merged.n_target_forwards == both.n_target_forwards == 5
    assert merged.mean_accepted_length == both.mean_accepted_length
    np.testing.assert_array_equal(merged.accepted_hist, both.accepted_hist)
    np.testing.assert_array_equal(merged.acceptance_by_position, both.acceptance_by_position)
    assert merged.forward_s == both.forward_s and merged.decode_s == 4.0 and merged.n_generated == 14


def test_end_to_end_measures():
    """Prompt tok/s = prompt tokens prefilled / prefill seconds; first-token time per call, the prompt included;
    end-to-end tok/s counts the prompt's processing too (a token timed inside prefill_s, as llama.cpp baselines
    time their first, counts as answered)."""
    s = DecodeStats(n_prefilled=300, prefill_s=0.5, decode_s=1.5, n_generated=20, n_calls=2, first_token_s=1.2)
    assert s.prompt_tokens_per_s == pytest.approx(600.0) and s.mean_first_token_s == pytest.approx(0.6)
    assert s.end_to_end_tokens_per_s == pytest.approx(10.0) and s.tokens_per_s == pytest.approx(20 / 1.5)
    baseline = DecodeStats(n_prefilled=300, prefill_s=0.5, decode_s=1.5, n_generated=19, first_in_prefill=1)
    assert baseline.end_to_end_tokens_per_s == pytest.approx(10.0)
    both = DecodeStats()
    both.merge(s)
    both.merge(s)
    assert both.n_calls == 4 and both.mean_first_token_s == pytest.approx(0.6)
    d = s.to_dict()
    assert d["prompt_tokens_per_s"] == pytest.approx(600.0) and d["end_to_end_tokens_per_s"] == pytest.approx(10.0)
    assert "prefill 300 tokens in 0.50 s (600.0 t/s)" in s.summary()
    empty = DecodeStats()
    assert empty.prompt_tokens_per_s == empty.mean_first_token_s == empty.end_to_end_tokens_per_s == 0.0


def test_the_decode_loop_times_the_first_token_and_counts_calls(tmp_path):
    from specedge.models.gguf_in import open_gguf
    from specedge.models.tiny import write_tiny_gguf
    from specedge.runtime.backends.numpy_ref import NumpyBackend
    from specedge.runtime.decode import decode
    from specedge.runtime.request import PLAIN, Request
    backend = NumpyBackend(open_gguf(write_tiny_gguf(tmp_path / "t.gguf", seed=0)).load_weights())
    s = DecodeStats()
    for _ in range(2):
        list(decode(backend, np.arange(1, 40, dtype=np.int32), PLAIN, Request(max_tokens=5), stats=s))
    assert s.n_calls == 2 and s.n_prefilled == 2 * 38 and s.prompt_tokens_per_s > 0
    assert 0 < s.first_token_s <= s.prefill_s + s.decode_s and s.end_to_end_tokens_per_s < s.tokens_per_s
