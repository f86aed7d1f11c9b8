"""Prompt lookup first, a draft model otherwise (runtime/drafters/lookup.py): lossless (greedy: identical output;
sampled: the target's distribution) while both parts draft, the `+lookup` syntax and its start-up errors."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.assembly.load import DrafterSpec
from specedge.runtime.draft_stop import StopKind, StopSpec
from specedge.runtime.drafters.spec import ModelSpec
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.drafters.lookup import LookupModelDrafter
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import SamplingParams
from test_tree_decode import assert_matches_target, sampled_counts

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def models(tiny_gguf, draft_gguf, tiny_backends):
    return tiny_gguf, draft_gguf, *tiny_backends[:2]  # tests/conftest.py, shared


def run(target, prompt, drafter=None, n=48, params=GREEDY, stats=None, seed=0):
    return [e.token for e in decode(target, np.asarray(prompt, np.int32), Speculation(drafter),
                                    Request(params, max_tokens=n, seed=seed), stats=stats)]


@pytest.mark.parametrize("min_n", [1, 2])
def test_greedy_output_equals_plain_greedy_with_both_parts_drafting(models, min_n):
    _, _, target, draft = models
    both = {"lookup": 0, "model": 0}
    for prompt in ([1, 5, 9, 2, 1, 5, 9], [7, 7, 7, 3, 7, 7], [3, 4]):
        st = DecodeStats()
        drafter = LookupModelDrafter(ModelDrafter(draft), min_n)
        assert run(target, prompt, drafter, stats=st) == run(target, prompt)
        assert st.n_drafted > 0
        for part in both:
            both[part] += drafter.rounds[part]
    assert both["lookup"] > 0 and both["model"] > 0  # the test exercises the switch, not just one part


def test_the_draft_models_cache_catches_up_after_lookup_rounds(models):
    """Rounds drafted by lookup never feed the draft model; its next draft must still continue the whole committed
    context (a stale cache would draft from the wrong prefix: still lossless, but the self-drafting target below
    would then stop proposing its own greedy continuation)."""
    _, _, target, _ = models
    st = DecodeStats()
    drafter = LookupModelDrafter(ModelDrafter(target), 1, extend=False)
    prompt = [2, 6, 2, 6, 2]
    out = run(target, prompt, drafter, n=40, stats=st)
    assert out == run(target, prompt, n=40) and drafter.rounds["lookup"] > 0 and drafter.rounds["model"] > 0
    model_rounds = drafter.rounds["model"]
    # the self-drafting model's rounds are accepted in full: tokens from model rounds = k + 1 each
    assert st.n_accepted >= 4 * model_rounds


@pytest.mark.slow
def test_sampled_hybrid_preserves_the_target_distribution():
    params = SamplingParams(temperature=1.0)
    P, Q = random_markov_table(5, seed=3, scale=1.0), random_markov_table(5, seed=4, scale=1.0)
    prompt = np.array([0, 1, 0, 2, 0], dtype=np.int32)
    seen = {"lookup": 0, "model": 0}

    def new():
        d = LookupModelDrafter(ModelDrafter(MarkovBackend(Q)), 1)
        drafters.append(d)
        return d

    drafters: list[LookupModelDrafter] = []
    counts = sampled_counts(MarkovBackend(P), prompt, params, new, trials=6000, seed=11, n=3, k=2)
    for d in drafters:
        for part in seen:
            seen[part] += d.rounds[part]
    assert seen["lookup"] > 1000 and seen["model"] > 1000
    assert_matches_target(counts, P, prompt, params, 3, 6000)


def test_lookup_suffix_parses_and_bad_combinations_fail_at_start_up(models):
    assert DrafterSpec.parse("model:x+lookup") == ModelSpec("x", lookup=2)
    assert DrafterSpec.parse("model:x+conf+lookup:3") == ModelSpec("x", stop=StopSpec(StopKind.CONF), lookup=3)
    for bad, msg in (("ngram+lookup", "chain model drafter"), ("model:x+tree:4+lookup", "chain model drafter"),
                     ("model:x+lookup:4", "1, 2 or 3"), ("model:x+lookup:two", "1, 2 or 3")):
        with pytest.raises(ValueError, match=msg):
            DrafterSpec.parse(bad)
    target, draft, _, _ = models
    r = CliRunner().invoke(cli, ["generate", str(target), "the cat sat on the mat, the cat", "--backend", "numpy",
                                 "--drafter", f"model:{draft}+lookup", "--max-tokens", "16", "--json", "--baseline",
                                 "--temperature", "0"])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["identical_to_baseline"] is True and "+lookup" in stats["drafter"]  # the canonical spec: +lookup:2


@pytest.mark.slow
def test_a_lookup_match_can_complete_a_model_draft_and_stays_lossless(models):
    """Once the model's draft so far ends in a 3-token match, the match's continuation ends the draft (point-mass q
    rows). Greedy: identical to plain greedy; sampled: the target's distribution. min_n=3 keeps round-start lookups
    rare, so model drafts (and their extensions) do the work."""
    _, _, target, draft = models
    extended = 0
    for prompt in ([1, 5, 9, 2, 1, 5, 9, 2, 1], [7, 3, 7, 3, 7, 3]):
        for model in (draft, target):  # the tiny models repeat tokens; the target drafting itself runs into matches
            drafter = LookupModelDrafter(ModelDrafter(model), 3)
            assert run(target, prompt, drafter) == run(target, prompt)
            extended += drafter.extended
    assert extended > 0
    params = SamplingParams(temperature=1.0)
    P, Q = random_markov_table(5, seed=3, scale=1.0), random_markov_table(5, seed=4, scale=1.0)
    prompt = np.array([0, 1, 2, 0, 1], dtype=np.int32)  # a model draft starting with 2 matches [0, 1, 2]
    drafters: list[LookupModelDrafter] = []

    def new():
        drafters.append(LookupModelDrafter(ModelDrafter(MarkovBackend(Q)), 3))
        return drafters[-1]

    counts = sampled_counts(MarkovBackend(P), prompt, params, new, trials=6000, seed=12, n=3, k=3)
    assert sum(d.extended for d in drafters) > 500
    assert_matches_target(counts, P, prompt, params, 3, 6000)


class FakeClock:
    """Seconds advance only when a test says so: round times are what the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_match_length_slower_than_the_model_is_passed_over_and_retried():
    """Rates decide: lookup rounds that emit 1 token in 20 ms lose to model rounds that emit 5 in 50 ms, so the
    lookup draft is skipped (the model drafts although a match exists) except for a retry every `explore` rounds;
    once lookup rounds emit 4 tokens in 20 ms, two retries move its rate (a moving average) past the model's and it
    drafts every round again."""
    table = random_markov_table(5, seed=0)
    clock = FakeClock()
    d = LookupModelDrafter(ModelDrafter(MarkovBackend(table)), 1, explore=4, clock=clock)
    context = np.array([1, 2, 1, 2, 1], np.int32)  # every round finds a match
    d.begin(context)
    rng = np.random.default_rng(0)

    def round_(lookup_tokens, model_tokens):
        draft = d.propose(context, 4, GREEDY, rng)
        lookup = d.source == 0
        clock.now += 0.02 if lookup else 0.05
        d.accept((lookup_tokens if lookup else model_tokens) - 1, 0)
        return lookup

    sources = [round_(1, 5) for _ in range(14)]
    # first the lookup (no rate yet), then the model once, then the model wins except every 4th pass-over
    assert sources[:2] == [True, False]
    assert sources[2:] == [False, False, False, True] * 3
    sources = [round_(4, 5) for _ in range(16)]  # lookup improves: 200 tok/s against the model's 100
    assert sources[:8] == [False, False, False, True] * 2 and all(sources[8:])
    d.begin(context)  # a new sequence: its rates start afresh, so the match is tried at once
    assert not d.rates and round_(1, 5) and not round_(1, 5)
    assert len(d.rates) == 2 and all(r.rounds == 1 for r in d.rates.values())


def test_the_adaptive_budget_of_a_hybrid_is_the_model_kind_not_the_last_rounds():
    """After a lookup round whose 1-token matches are always rejected, the model must still be asked for the long
    draft its own acceptance pays for (the decode loop passes `caps.budget_kind`; the last kind seen would be the match's)."""
    from specedge.runtime.draft_length import AdaptiveDraftLength
    policy = AdaptiveDraftLength(k_max=8)
    for _ in range(50):
        policy.observe(0, 8, 8, 9, 0.0235)  # model drafts: all 8 accepted; target calls 10 ms + 1.5 ms per position
        policy.observe(1, 4, 0, 5, 0.0175)  # 1-token matches: never accepted (the last kind seen)
    assert policy.budget(8) == 1 and policy.budget(8, 0) == 8
    table = random_markov_table(5, seed=0)
    assert LookupModelDrafter(ModelDrafter(MarkovBackend(table)), 1).caps.budget_kind == 0


def _spy_model_drafts(model_drafter, calls):
    """Record (context, the draft model's logits after it, Draft) of every draft the model part makes (the lookup
    hybrid's fallback); the logits are the ones the drafter itself computed (`_sync`: its cache caught up on the
    context), so the check below does not depend on how a fresh forward would round them."""
    propose, sync = model_drafter.propose, model_drafter._sync
    seen: list = []

    def spy_sync(context):
        seen.append(logits := sync(context))
        return logits

    def spy(context, *args, **kw):
        seen.clear()
        draft = propose(context, *args, **kw)
        if seen:
            calls.append((np.array(context, dtype=np.int32), seen[0], draft))
        return draft

    model_drafter._sync, model_drafter.propose = spy_sync, spy


def _assert_tempered_first_rows(calls, params):
    """Each model draft's first q row is logits_to_probs(the draft model's logits after the context, params): not
    greedy one-hot rows (the row of a model that drafts greedily at T > 0)."""
    from specedge.runtime.sampling import logits_to_probs
    assert calls, "the model part never drafted"
    for context, logits, draft in calls:
        want = logits_to_probs(logits, params, history=context)[0]
        assert draft.q is not None and draft.q[0].max() < 1.0
        np.testing.assert_allclose(draft.q[0], want, atol=1e-6)


def test_the_hybrid_drafts_from_the_calls_tempered_q(models):
    """Runtime level: the decode call's SamplingParams reach the model part of `model:X+lookup` (a drafter holds no
    params of its own), so at temperature 0.8 its q rows are the tempered draft distribution."""
    _, _, target, draft = models
    params = SamplingParams(temperature=0.8)
    drafter = LookupModelDrafter(ModelDrafter(draft), 2)
    calls: list = []
    _spy_model_drafts(drafter.model, calls)
    list(decode(target, np.array([1, 5, 9, 2], np.int32), Speculation(drafter),
                Request(params, max_tokens=24, seed=0)))
    _assert_tempered_first_rows(calls, params)


def test_engine_passes_each_calls_params_to_a_lookup_hybrid(models):
    """Through the Engine (chat, serve, the Python API), which builds its drafter once with default params and
    passes sampling settings per call: `model:X+lookup` drafted greedily at temperature 0.8 before drafters took
    params in `propose` (issue 17)."""
    from specedge.apps.api import Engine
    target_path, draft_path, _, _ = models
    engine = Engine.open(str(target_path), backend="numpy", drafter=f"model:{draft_path}+lookup:2", ctx=256)
    calls: list = []
    _spy_model_drafts(engine.drafter.model, calls)
    engine.generate([1, 5, 9, 2], temperature=0.8, top_p=1.0, repeat_penalty=1.0, max_tokens=24, seed=0)
    _assert_tempered_first_rows(calls, SamplingParams(temperature=0.8))
