"""Session: the target KV cache kept across decode calls gives the same tokens as fresh calls and prefills only
what is new."""
import numpy as np
import pytest

from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.drafters.early_exit import EarlyExitDrafter
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.drafters.recycle import RecycleDrafter
from specedge.runtime.session import Session, common_prefix
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import SamplingParams

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def backends(tiny_backends):
    return tiny_backends[:2]  # tests/conftest.py: (target float64, 1-layer drafter float64), shared


def run(target, prompt, params=GREEDY, *, seed=0, session=None, drafter=None, max_tokens=12, stats=None):
    events = decode(target, prompt, Speculation(drafter, k=3), Request(params, max_tokens=max_tokens, seed=seed),
                    session=session, stats=stats)
    return [e.token for e in events]


def test_common_prefix():
    a = np.array([1, 2, 3, 4], np.int32)
    assert common_prefix(a, np.array([1, 2, 9], np.int32)) == 2
    assert common_prefix(a, a[:2]) == 2
    assert common_prefix(a, np.zeros(0, np.int32)) == 0
    assert common_prefix(a, np.array([7], np.int32)) == 0


def make_drafter(name, backends):
    target, other = backends
    return {"none": lambda: None, "ngram": NgramDrafter,
            "model": lambda: ModelDrafter(other, max_len=256),
            "recycle": lambda: RecycleDrafter(target.config.vocab_size, 6),
            "exit": lambda: EarlyExitDrafter(1)}[name]()


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "recycle", "exit"])
def test_chat_turns_equal_fresh_decoding_and_prefill_only_new_tokens(backends, drafter):
    """Turn t's prompt = turn t-1's prompt + its answer + a new user message (as a chat template renders them)."""
    target = backends[0]
    session = Session(target, 256)
    rng = np.random.default_rng(5)
    prompt = list(rng.integers(3, 60, 9))
    for turn in range(4):
        stats = DecodeStats()
        got = run(target, prompt, session=session, drafter=make_drafter(drafter, backends), stats=stats)
        want = run(target, prompt, drafter=make_drafter(drafter, backends))
        assert got == want
        if turn:  # only the previous answer's last token and the new message are run through the target
            assert stats.n_prefilled == len(prompt) - 1 - session.reused
            assert session.reused >= len(prompt) - len(new) - 1
        assert session.cache.length == len(session.tokens)
        new = list(rng.integers(3, 60, 5))
        prompt = prompt + got + new


def test_sampled_turns_equal_fresh_decoding(backends):
    target = backends[0]
    params = SamplingParams(temperature=0.9, top_p=0.95)
    session = Session(target, 256)
    prompt = [5, 9, 2, 7, 11]
    for seed in range(3):
        got = run(target, prompt, params, seed=seed, session=session, drafter=NgramDrafter())
        assert got == run(target, prompt, params, seed=seed, drafter=NgramDrafter())
        prompt = prompt + got + [4, 4]


def test_diverging_and_shorter_prompts_roll_back(backends):
    target = backends[0]
    session = Session(target, 128)
    long = [3, 8, 13, 21, 34, 5, 8, 13]
    run(target, long, session=session)
    for prompt in ([3, 8, 13, 99, 1], [3, 8], [50], long):
        stats = DecodeStats()
        assert run(target, prompt, session=session, stats=stats) == run(target, prompt)
        assert stats.n_prefilled == len(prompt) - 1 - session.reused


def test_an_abandoned_generation_leaves_the_session_consistent(backends):
    """Stopping mid-answer (Ctrl-C, a client that disconnects) keeps what was committed; the next call is exact."""
    target = backends[0]
    session = Session(target, 128)
    events = decode(target, [4, 6, 8, 10], Speculation(NgramDrafter(), k=3), Request(GREEDY, max_tokens=40),
                    session=session)
    taken = [next(events).token for _ in range(5)]
    events.close()
    assert session.cache.length == len(session.tokens) and len(session.tokens) >= 4
    prompt = [4, 6, 8, 10, *taken, 12]
    assert run(target, prompt, session=session) == run(target, prompt)
    assert session.reused >= 4


class RaisingAfterForward:
    """The target, but its n-th forward raises after writing its K/V (an interrupt between forward and rollback)."""

    def __init__(self, target, n):
        self.target, self.n, self.calls = target, n, 0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward(self, tokens, cache, **kw):
        out = self.target.forward(tokens, cache, **kw)
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return out


@pytest.mark.parametrize("at", [1, 2, 4])  # 1: during the prefill, later: mid-decoding with draft rows cached
def test_an_interrupted_forward_keeps_the_cache_consistent(backends, at):
    target = backends[0]
    session = Session(target, 128)
    run(target, [1, 2, 3, 4, 5, 6], session=session)
    with pytest.raises(KeyboardInterrupt):
        run(RaisingAfterForward(target, at), [1, 2, 3, 4, 5, 6, 7, 9, 11], session=session, drafter=NgramDrafter(),
            max_tokens=30)
    assert session.cache.length == len(session.tokens)
    prompt = [1, 2, 3, 4, 5, 6, 7, 9, 11, 8]
    assert run(target, prompt, session=session) == run(target, prompt)


def test_capacity_is_the_context_limit(backends):
    target = backends[0]
    session = Session(target, 32)
    got = run(target, list(range(3, 28)), session=session, max_tokens=50)
    assert len(got) <= 32 - 25
    with pytest.raises(ValueError, match="context"):
        run(target, list(range(3, 40)), session=session)
    with pytest.raises(ValueError, match="--ctx"):
        Session(target, target.config.context_length + 1)
