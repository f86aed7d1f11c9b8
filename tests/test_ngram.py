"""Prompt-lookup drafter: hand-made contexts and an incremental index checked against brute force."""
import numpy as np
import pytest

from specedge.runtime.drafters.base import Drafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.types import SamplingParams

RNG = np.random.default_rng(0)


def brute_force(context, k, max_n=3, min_n=1):
    """Reference: scan every earlier end position, latest first."""
    L = len(context)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = list(context[L - n:])
        for end in range(L - 1, n - 1, -1):
            if list(context[end - n:end]) == suffix:
                return list(context[end:end + k])
    return []


def propose(context, k=3, **kw):
    d = NgramDrafter(**kw)
    ctx = np.array(context, dtype=np.int32)
    d.begin(ctx)
    draft = d.propose(ctx, k, SamplingParams(), RNG)
    assert draft.q is None and draft.tokens.dtype == np.int32
    return draft.tokens.tolist()


def test_protocol():
    d = NgramDrafter()
    assert isinstance(d, Drafter) and d.name == "ngram" and d.weight_bytes_per_token == 0


def test_docstring_example_latest_occurrence():
    assert propose([1, 2, 3, 4, 1, 2, 3, 9, 2, 3], k=3) == [9, 2, 3]


def test_latest_occurrence_wins():
    #           0  1  2  3  4  5  6  7  8
    context = [7, 8, 1, 7, 8, 2, 5, 7, 8]
    assert propose(context, k=2) == [2, 5]  # [7, 8] at 0..1 and 3..4: the latest is followed by [2, 5]


def test_longer_n_preferred_then_fallback():
    # [4, 5, 6] occurs once earlier (followed by 1); [5, 6] occurs later (followed by 2): n=3 wins
    assert propose([4, 5, 6, 1, 5, 6, 2, 4, 5, 6], k=1) == [1]
    # with max_n=2 the later [5, 6] wins
    assert propose([4, 5, 6, 1, 5, 6, 2, 4, 5, 6], k=1, max_n=2) == [2]
    # only the last token repeats: fallback to n = 1
    assert propose([3, 9, 4, 1, 3], k=2) == [9, 4]


def test_no_match_gives_empty_draft():
    assert propose([1, 2, 3, 4]) == []
    assert propose([5]) == []
    assert propose([]) == []
    assert propose([1, 2, 1], k=0) == []
    assert propose([3, 9, 4, 1, 3], k=2, min_n=2) == []


def test_fewer_than_k_near_the_end():
    assert propose([5, 6, 5], k=4) == [6, 5]
    assert propose([5, 5], k=4) == [5]


def test_invalid_sizes():
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(max_n=1, min_n=2)
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(min_n=0)


@pytest.mark.parametrize("max_n, min_n, vocab", [(3, 1, 4), (4, 2, 3), (2, 1, 12), (5, 1, 2)])
def test_incremental_index_matches_brute_force(max_n, min_n, vocab):
    rng = np.random.default_rng(max_n * 100 + vocab)
    for trial in range(5):
        seq = rng.integers(0, vocab, 400).astype(np.int32)
        d = NgramDrafter(max_n=max_n, min_n=min_n)
        n = int(rng.integers(1, 20))
        d.begin(seq[:n])
        while n < len(seq):
            k = int(rng.integers(0, 6))
            got = d.propose(seq[:n], k, SamplingParams(), rng).tokens.tolist()
            assert got == brute_force(seq[:n], k, max_n, min_n), (trial, n, k)
            d.accept(len(got), int(seq[n]))
            n += int(rng.integers(1, 6))  # the context only grows, by 1..k+1 tokens


def test_new_sequence_resets_index():
    d = NgramDrafter()
    d.begin(np.array([1, 2, 3, 1], np.int32))
    assert d.propose(np.array([1, 2, 3, 1], np.int32), 2, SamplingParams(), RNG).tokens.tolist() == [2, 3]
    d.begin(np.array([9, 8, 1], np.int32))  # nothing of the old sequence may leak
    assert d.propose(np.array([9, 8, 1], np.int32), 2, SamplingParams(), RNG).tokens.tolist() == []
    # a context that is not an extension (no begin) is re-indexed rather than trusted
    assert d.propose(np.array([4, 1, 7, 4], np.int32), 2, SamplingParams(), RNG).tokens.tolist() == [1, 7]


def test_long_context_is_fast():
    import time
    seq = np.random.default_rng(1).integers(0, 1000, 8192).astype(np.int32)
    d = NgramDrafter()
    t0 = time.perf_counter()
    d.begin(seq[:8000])
    n = 8000
    while n < len(seq):
        d.propose(seq[:n], 4, SamplingParams(), RNG)
        n += 3
    assert time.perf_counter() - t0 < 2.0  # ~30 ms begin + ~65 steps at well under 1 ms each
