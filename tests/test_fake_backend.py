"""The Markov test double satisfies the Backend seam, and drives the decode loop losslessly."""
import numpy as np
import pytest

from specedge.runtime.backends.base import Backend, Cache
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.stats import DecodeStats
def test_protocols_and_forward():
    table = random_markov_table(7, seed=3)
    b = MarkovBackend(table)
    cache = b.new_cache(8)
    assert isinstance(b, Backend) and isinstance(cache, Cache)
    assert b.config.vocab_size == 7 and b.weight_bytes() == table.nbytes
    out = b.forward(np.array([2, 5], np.int32), cache)
    np.testing.assert_array_equal(out, table[[2, 5]])
    assert out.dtype == np.float32 and cache.length == 2
    cache.rollback(1)
    b.forward(np.array([4], np.int32), cache)
    assert cache.tokens.tolist() == [2, 4]
    with pytest.raises(ValueError, match="context full"):
        b.forward(np.zeros(7, np.int32), cache)
    with pytest.raises(ValueError):
        cache.rollback(5)


def test_greedy_with_ngram_drafter_equals_plain_greedy():
    # a peaked chain that falls into cycles, so prompt lookup finds matches
    b = MarkovBackend(random_markov_table(11, seed=4, scale=4.0))
    prompt = np.array([1, 2, 3, 1, 2], np.int32)
    plain = [e.token for e in decode(b, prompt, PLAIN, Request(max_tokens=40))]
    stats = DecodeStats()
    spec = [e.token for e in decode(b, prompt, Speculation(NgramDrafter(), k=4), Request(max_tokens=40), stats=stats)]
    assert spec == plain
    assert stats.n_accepted > 0 and stats.n_target_forwards < 40
