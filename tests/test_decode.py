"""The decode loop end to end: losslessness of every drafter, the draft-model lifecycle, stopping."""
from collections import Counter
from itertools import product

import numpy as np
import pytest
from scipy import stats as sps

from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.base import Drafter
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.generate import collect, held_back, stream
from specedge.runtime.sampling import logits_to_probs
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import Draft, FinishReason, SamplingParams
from chi_square import pooled_pvalue

GREEDY = SamplingParams()


class RandomDrafter(Drafter):
    """Proposes uniformly random tokens: almost always rejected, must never change the output."""
    name = "random"

    def __init__(self, vocab):
        self.vocab = vocab

    def propose(self, context, k, params, rng):
        return Draft(tokens=rng.integers(0, self.vocab, k).astype(np.int32))


@pytest.fixture(scope="module")
def tiny(tiny_backends):
    return tiny_backends  # tests/conftest.py: (target float64, 1-layer drafter float64, tokenizer), shared


def tokens_of(backend, prompt, drafter=None, k=4, n=40, params=GREEDY, seed=0, stats=None):
    return [e.token for e in decode(backend, prompt, Speculation(drafter, k=k),
                                    Request(params, max_tokens=n, seed=seed), stats=stats)]


PROMPTS = ["the cat sat on the mat and the cat", "hello world", "a"]


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("which", ["ngram", "random", "self", "other"])
def test_greedy_speculative_equals_plain(tiny, which, k):
    target, other, tok = tiny
    for text in PROMPTS:
        prompt = tok.encode(text)
        drafter = {"ngram": NgramDrafter(), "random": RandomDrafter(target.config.vocab_size),
                   "self": ModelDrafter(target), "other": ModelDrafter(other)}[which]
        assert tokens_of(target, prompt, drafter, k=k) == tokens_of(target, prompt), (which, k, text)


PENALISED = SamplingParams(presence_penalty=0.6, frequency_penalty=0.3, repeat_penalty=1.2, repeat_last_n=16,
                           logit_bias={5: 2.0, 7: -np.inf}, dry_multiplier=0.8, dry_breakers={3})


@pytest.mark.parametrize("which", ["ngram", "random", "self", "other"])
def test_greedy_speculative_equals_plain_with_penalties_and_logit_bias(tiny, which):
    """Each verified row is penalised by the history up to its own input (draft tokens included), so speculation
    returns what one-token steps under the same penalties and bias return."""
    target, other, tok = tiny
    for text in PROMPTS:
        prompt = tok.encode(text)
        drafter = {"ngram": NgramDrafter(), "random": RandomDrafter(target.config.vocab_size),
                   "self": ModelDrafter(target), "other": ModelDrafter(other)}[which]
        plain = tokens_of(target, prompt, params=PENALISED)
        assert tokens_of(target, prompt, drafter, k=4, params=PENALISED) == plain, (which, text)
        assert 7 not in plain and plain != tokens_of(target, prompt), text  # the bias and penalties act


def test_identical_drafter_reaches_full_acceptance(tiny):
    target, _, tok = tiny
    st = DecodeStats()
    tokens_of(target, tok.encode("hello world"), ModelDrafter(target), k=4, n=41, stats=st)
    assert st.acceptance_rate == 1.0
    assert st.mean_accepted_length == pytest.approx(5.0, abs=0.5)  # the last round is cut by max_tokens
    assert list(st.accepted_hist[:4]) == [0, 0, 0, 0]


def test_random_drafter_is_mostly_rejected_but_costs_nothing_in_output(tiny):
    target, _, tok = tiny
    st = DecodeStats()
    tokens_of(target, tok.encode("hello"), RandomDrafter(target.config.vocab_size), k=3, stats=st)
    assert st.acceptance_rate < 0.2 and st.n_drafted > 0


def exact_joint(P, Q_unused, start, params, n):
    """Exact distribution of the first n tokens of a Markov target after logits processing."""
    V = P.shape[0]
    rows = logits_to_probs(P, params)  # row x = p(. | x); no penalty in these settings
    out = {}
    for seq in product(range(V), repeat=n):
        prob, prev = 1.0, start
        for x in seq:
            prob *= rows[prev, x]
            prev = x
        out[seq] = prob
    return out


def exact_joint_with_history(P, prompt, params, n):
    """Exact joint of n tokens when p depends on the history (penalties): each step processes P[prev] with the
    prompt and the tokens so far as its history."""
    V, out = P.shape[0], {}
    for seq in product(range(V), repeat=n):
        prob, hist = 1.0, list(prompt)
        for x in seq:
            prob *= logits_to_probs(P[hist[-1]][None], params, history=np.array(hist))[0, x]
            hist.append(x)
        out[seq] = prob
    return out


def assert_counts_match(counts, exact, trials, alpha=1e-3):
    """Chi-square test of observed sequence counts against the exact joint distribution (cells with an expected
    count below 5 pooled); a sequence the target cannot produce fails outright."""
    assert all(exact[s] > 0 for s in counts), "emitted a sequence the target cannot produce"
    cells = sorted(exact, key=exact.get, reverse=True)
    exp = np.array([exact[c] * trials for c in cells])
    obs = np.array([counts.get(c, 0) for c in cells], dtype=float)
    big = exp >= 5
    exp_p, obs_p = np.append(exp[big], exp[~big].sum()), np.append(obs[big], obs[~big].sum())
    keep = exp_p > 0
    p_value = sps.chisquare(obs_p[keep], exp_p[keep] * obs_p[keep].sum() / exp_p[keep].sum()).pvalue
    assert p_value > alpha, p_value


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.8, top_p=0.9),
                                    SamplingParams(temperature=1.2, top_k=3),
                                    SamplingParams(temperature=1.0, typical_p=0.9)],
                         ids=["t1", "t0.8p0.9", "t1.2k3", "t1typ0.9"])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_sampled_decode_loop_preserves_the_target_distribution(params, drafter_kind):
    """Through decode(): draft model with its own cache (lifecycle, rollback) or a deterministic drafter."""
    V, n, trials = 5, 3, 12000
    P, Q = random_markov_table(V, seed=3, scale=1.0), random_markov_table(V, seed=4, scale=1.0)
    target = MarkovBackend(P)
    prompt = np.array([0, 1, 0, 1, 0], dtype=np.int32)  # n-gram lookup finds continuations here
    rng = np.random.default_rng(123)
    counts = Counter()
    for _ in range(trials):
        drafter = ModelDrafter(MarkovBackend(Q)) if drafter_kind == "model" else NgramDrafter()
        seq = tuple(e.token for e in decode(target, prompt, Speculation(drafter, k=2),
                                            Request(params, max_tokens=n, seed=int(rng.integers(1 << 62)))))
        counts[seq] += 1
    exact = exact_joint(P, Q, int(prompt[-1]), params, n)
    assert all(exact[s] > 0 for s in counts), "emitted a sequence the target cannot produce"
    p_value, cells = pooled_pvalue(counts, exact, trials)
    assert cells >= 5, "too few cells for a meaningful test"
    assert p_value > 1e-3, p_value


@pytest.mark.slow
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_sampled_speculation_under_penalties_and_bias_follows_the_target(drafter_kind):
    """Chi-square: with presence, frequency and repetition penalties over a short window, DRY and a logit bias, sampled
    speculative decoding follows the penalised target's joint distribution (each verify row and each q row
    penalised by its own history)."""
    V, n, trials = 5, 3, 12000
    P, Q = random_markov_table(V, seed=3, scale=1.0), random_markov_table(V, seed=4, scale=1.0)
    params = SamplingParams(temperature=1.0, presence_penalty=0.7, frequency_penalty=0.4, repeat_penalty=1.3,
                            repeat_last_n=3, logit_bias={2: 0.8, 4: -1.5}, dry_multiplier=0.9, dry_allowed_length=1)
    target, prompt = MarkovBackend(P), np.array([0, 1, 0, 1, 0], dtype=np.int32)
    rng, counts = np.random.default_rng(77), Counter()
    for _ in range(trials):
        drafter = ModelDrafter(MarkovBackend(Q)) if drafter_kind == "model" else NgramDrafter()
        counts[tuple(e.token for e in decode(target, prompt, Speculation(drafter, k=2),
                                             Request(params, max_tokens=n, seed=int(rng.integers(1 << 62)))))] += 1
    exact = exact_joint_with_history(P, prompt, params, n)
    assert exact != exact_joint(P, None, int(prompt[-1]), SamplingParams(temperature=1.0), n)
    assert_counts_match(counts, exact, trials)


def test_stop_strings_and_finish_reasons(tiny):
    target, _, tok = tiny
    prompt = tok.encode("the cat sat")
    full = collect(stream(target, tok, prompt, PLAIN, Request(GREEDY, max_tokens=30)))
    assert full.finish_reason in (FinishReason.LENGTH, FinishReason.EOS)
    assert full.text == tok.decode(full.tokens)
    stop = full.text[5:8]
    assert stop
    cut = collect(stream(target, tok, prompt, Speculation(NgramDrafter()), Request(GREEDY, max_tokens=30, stop=(stop,))))
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text == full.text[:full.text.find(stop)]
    short = collect(stream(target, tok, prompt, PLAIN, Request(GREEDY, max_tokens=3)))
    assert short.finish_reason in (FinishReason.LENGTH, FinishReason.EOS)


def test_eos_ends_generation_and_is_not_emitted(tiny):
    target, _, tok = tiny
    prompt = tok.encode("the cat")
    first = tokens_of(target, prompt, n=1)[0]
    r = collect(stream(target, tok, prompt, PLAIN, Request(GREEDY, max_tokens=10, eos_ids=(first,))))
    assert r.finish_reason is FinishReason.EOS and r.tokens == [] and r.text == ""


def test_held_back_prefixes():
    assert held_back("hello wor", ["world"]) == 3
    assert held_back("hello", ["xyz"]) == 0
    assert held_back("ab", ["abc", "bcd"]) == 2


def test_prompt_longer_than_context_is_a_clear_error(tiny):
    target, _, tok = tiny
    with pytest.raises(ValueError, match="shorten the prompt"):
        list(decode(target, np.zeros(300, np.int32), PLAIN, Request(GREEDY, max_tokens=4)))
    with pytest.raises(ValueError, match="empty"):
        list(decode(target, np.zeros(0, np.int32), PLAIN, Request(GREEDY, max_tokens=128)))


def test_generation_near_the_context_end_stops_at_length(tiny):
    target, _, tok = tiny
    ctx = target.config.context_length
    ev = list(decode(target, np.ones(ctx - 3, np.int32), Speculation(NgramDrafter(), k=8),
                     Request(GREEDY, max_tokens=50)))
    assert len(ev) == 3 and ev[-1].finish_reason is FinishReason.LENGTH


class CountingBackend:
    """Wraps a backend and records how many tokens each forward feeds."""

    def __init__(self, inner):
        self.inner, self.fed = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, tokens, cache, **kw):
        self.fed.append(len(tokens))
        return self.inner.forward(tokens, cache, **kw)


def test_draft_model_prefills_in_the_prefill_phase_and_keeps_a_shared_prefix(tiny):
    """begin feeds prompt[:-1] (so the first draft feeds one token and prefill time holds the drafter's prefill);
    the next sequence that extends it (a chat's next turn) feeds only the new part, and output stays exact."""
    target, other, tok = tiny
    counting = CountingBackend(other)
    drafter = ModelDrafter(counting, max_len=256)
    prompt = tok.encode("the cat sat on the mat and the cat")
    drafter.begin(prompt)
    assert counting.fed == [len(prompt) - 1]
    drafter.propose(prompt, 3, GREEDY, np.random.default_rng(0))
    assert counting.fed[1] == 1  # only the last prompt token: its logits give the first draft
    out = tokens_of(target, prompt, drafter, k=3, n=12)
    assert out == tokens_of(target, prompt, k=3, n=12)
    counting.fed.clear()
    turn2 = np.concatenate([prompt, out, tok.encode(" and then")]).astype(np.int32)
    drafter.begin(turn2)
    assert sum(counting.fed) <= len(turn2) - len(prompt)  # the first turn's rows stay in the draft cache
    assert tokens_of(target, turn2, drafter, k=3, n=12) == tokens_of(target, turn2, k=3, n=12)
    counting.fed.clear()
    drafter.begin(prompt[:4])  # a shorter, diverging sequence rolls back instead of appending
    assert sum(counting.fed) == 0
    assert tokens_of(target, prompt[:4], drafter, k=3, n=12) == tokens_of(target, prompt[:4], k=3, n=12)
