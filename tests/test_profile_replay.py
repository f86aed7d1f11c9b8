"""A drafter whose drafts depend on the committed tokens alone is measured by replaying its greedy rounds over plain
decoding's answers (assembly/profile_measure.py replay_rounds): the rounds must be exactly those a real speculative
decode runs, and the budget they free goes to longer answers."""
from dataclasses import replace

import numpy as np
import pytest

from specedge.assembly import plan_run
from specedge.assembly.profile_measure import (RoundLog, acceptance, estimate_s, fit_budget, replay_rounds,
                                               replayable)
from specedge.runtime.decode import decode
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.drafters.suffix import SuffixDrafter
from specedge.runtime.request import Request, Speculation
from specedge.runtime.types import SamplingParams


def prompts(vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    # repeated phrases give the n-gram drafter matches; one prompt has none to speak of
    phrase = rng.integers(3, vocab, 6)
    return [np.concatenate([phrase, rng.integers(3, vocab, 4), phrase, phrase[:3]]).astype(np.int32),
            rng.integers(3, vocab, 12).astype(np.int32),
            np.tile(rng.integers(3, vocab, 3), 5).astype(np.int32)]


@pytest.mark.parametrize("make", [NgramDrafter, SuffixDrafter], ids=["ngram", "suffix"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_replayed_rounds_are_the_rounds_a_real_speculative_decode_runs(tiny_backends, make, k):
    target, _, _ = tiny_backends
    req = Request(SamplingParams(), max_tokens=40, seed=0)
    answers, real = [], RoundLog()
    live = make()  # one drafter over the prompts in turn, as the plan's measuring run has (a memory carries over)
    for ids in prompts(target.config.vocab_size):
        plain = [ev.token for ev in decode(target, ids, Speculation(None), req)]
        spec = [ev.token for ev in decode(target, ids, Speculation(live, k=k), req, stats=real)]
        assert spec == plain  # lossless: what makes the replay exact
        answers.append((ids, plain))
    replayed = replay_rounds(make(), answers, k)
    assert [(r.k, r.n_accepted) for r in replayed.rounds] == [(r.k, r.n_accepted) for r in real.rounds]
    assert sum(r.n_accepted for r in real.rounds) > 0  # the prompts do give the drafter matches
    assert acceptance(replayed.rounds, k) == acceptance(real.rounds, k)
    assert replayed.n_generated == sum(len(a) for _, a in answers)
    assert all(r.draft_s > 0 for r in replayed.rounds) and all(r.verify_s == 0 for r in replayed.rounds)


def test_only_drafters_that_read_the_committed_tokens_alone_are_replayed(tiny_backends):
    target, draft, _ = tiny_backends
    assert replayable(NgramDrafter()) and replayable(SuffixDrafter())
    assert not replayable(ModelDrafter(draft))  # reads its own weights per token: decoded, timed


def test_a_replayed_drafter_leaves_a_slow_model_s_budget_to_longer_answers():
    settings = plan_run.PLAN_MEASURE
    budget = 25.0
    decoded = fit_budget(replace(settings, budget_s=budget), 0.033, 1.0)
    replayed = fit_budget(replace(settings, budget_s=budget), 0.033, 0.0, n_replayed=1)
    assert estimate_s(replayed, 0.033, 0.0, 1) <= budget and estimate_s(decoded, 0.033, 1.0) <= budget
    assert replayed.max_tokens * replayed.prompts > decoded.max_tokens * decoded.prompts
    assert not replayed.adaptive  # the adaptive run goes before the answers shorten
