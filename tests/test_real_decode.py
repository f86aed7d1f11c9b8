"""Lossless speculative decoding on the real default model (SmolLM2-135M-Instruct Q4_1), both backends.

NumPy: greedy speculative output must equal plain greedy output exactly.
llama.cpp: with flash attention (the backend's setting) a verify batch gives the same logits as one-token
decoding, but after a rollback new K/V may land in other cache cells and the attention sums in another order,
which can flip an exact near-tie. So a divergence is allowed only where the target's top-2 logit margin, on
the plain-decoding path, is below 0.1; each one is reported.
"""
import numpy as np
import pytest

from specedge.assembly.load import DrafterSpec, load_model, make_drafter
from specedge.assembly.devset import load_prompts
from specedge.runtime.backends import BackendKind
from specedge.runtime.decode import decode
from specedge.runtime.request import Request, Speculation
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import SamplingParams

pytestmark = [pytest.mark.real, pytest.mark.slow]
GREEDY = SamplingParams()
N_TOKENS, CTX = 64, 1024
# 6 of the first 20 dev prompts (load_prompts(limit=20), round-robin over the categories): three short ones (writing,
# math, coding: 53-65 tokens), a medium one (extraction, 210) and the two longest (summarization 769 and rag 660,
# cut at 400), so prefill, short and long caches (up to ~470 positions) are all there as with all 20, at 3/10 of the
# cost (issue 40: the NumPy reference decoding 20 prompts was ~5 of the suite's 25 minutes). Each speculative test
# also asserts that drafts were accepted, and rejected where the drafter can be wrong (not the target drafting for
# itself, whose greedy drafts are the target's own tokens), so the shorter run still exercises rollback.
PROMPTS = (0, 3, 4, 5, 9, 12)
# llama.cpp at 1 thread: measured 2026-11-21 (Intel) and 2026-11-23 (AMD EPYC, AVX2), a verify batch then gives the
# one-token logits bit for bit; at 2 threads its CPU flash attention splits a one-token query's work across threads
# differently from a batch's once the cache is long (L >= ~300), so the reduction order changes: on the AMD EPYC
# box n-gram diverged on prompt 18 at position 48 where the top-2 margin is 0.26 (and the self-drafting model on the
# same prompt on the Intel one). Nothing in llama-cpp-python's API selects the split; docs/drafters.md says so.
LLAMACPP_THREADS = 1


_PLAIN: dict = {}  # (target label, prompt) -> plain greedy output, shared by the drafter parametrizations


def greedy(model, prompt, drafter=None, stats=None):
    if drafter is None:
        key = (str(model.path), model.kind, tuple(int(t) for t in prompt))
        if key not in _PLAIN:
            _PLAIN[key] = [e.token for e in decode(model.backend, prompt, Speculation(k=4),
                                                   Request(GREEDY, max_tokens=N_TOKENS, eos_ids=(), max_context=CTX))]
        return _PLAIN[key]
    return [e.token for e in decode(model.backend, prompt, Speculation(drafter, k=4),
                                    Request(GREEDY, max_tokens=N_TOKENS, eos_ids=(), max_context=CTX), stats=stats)]


def prompts_for(model):
    tok = model.tokenizer
    dev = load_prompts(limit=20)
    return [tok.chat_ids(dev[i].text)[:400] for i in PROMPTS]


def assert_accepted_and_rejected(stats: DecodeStats, drafter: str = "") -> None:
    """The run verified drafts both ways: some tokens accepted and, unless `drafter` is the target itself
    ("model:smollm2-135m", or "model" for an ONNX artifact drafting for itself), some rejected (rolled back)."""
    assert stats.n_accepted > 0, stats.summary()
    if drafter not in ("model:smollm2-135m", "model"):
        assert stats.n_accepted < stats.n_drafted, stats.summary()


def plain_path_margin(model, prompt, plain, at):
    """The target's top-2 margin where plain decoding chose plain[at], replaying plain decoding's own calls
    (prefill of prompt[:-1], then one token per forward) so the logits are the ones plain decoding saw."""
    backend = model.backend
    cache = backend.new_cache(len(prompt) + at + 1)
    backend.forward(np.asarray(prompt[:-1], np.int32), cache)
    for t in [prompt[-1], *plain[:at]]:
        logits = backend.forward(np.asarray([t], np.int32), cache)[-1]
    assert int(logits.argmax()) == plain[at]
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


@pytest.fixture(scope="module")
def numpy_model():
    """The NumPy target, loaded once for the module's six NumPy tests (dequantizing its weights takes seconds); a
    drafter never changes it (the self-drafting ones run its layers in caches of their own)."""
    return load_model("smollm2-135m", BackendKind.NUMPY, ctx=CTX)


@pytest.mark.usefixtures("blas_on_every_core")
@pytest.mark.parametrize("drafter", ["ngram", "model:smollm2-135m"])
def test_numpy_speculative_equals_plain(numpy_model, drafter):
    model = numpy_model
    spec = make_drafter(DrafterSpec.parse(drafter), model, ctx=CTX)
    stats = DecodeStats()
    for prompt in prompts_for(model):
        assert greedy(model, prompt, spec, stats) == greedy(model, prompt)
    assert stats.mean_accepted_length > 1.0
    assert_accepted_and_rejected(stats, drafter)
    print(f"\nnumpy {drafter}: {stats.summary()}")


@pytest.mark.usefixtures("blas_on_every_core")
@pytest.mark.parametrize("drafter", ["recycle:8", "exit:20+logistic", "skip:1.5", "del"])
def test_numpy_trees_and_self_speculative_drafters_equal_plain(numpy_model, drafter):
    """Issue 4's drafters on the real model: token-recycling trees (tree mask, compaction) and drafters that run the
    target's own layers in its own KV cache; 3 of the prompts, the plain outputs shared with the test above."""
    model = numpy_model
    spec = make_drafter(DrafterSpec.parse(drafter), model, ctx=CTX)
    stats = DecodeStats()
    for prompt in prompts_for(model)[:3]:
        assert greedy(model, prompt, spec, stats) == greedy(model, prompt)
    assert stats.n_drafted > 0
    if drafter != "del":  # DEL may settle on its deepest exit with one-token drafts
        assert_accepted_and_rejected(stats)
    print(f"\nnumpy {drafter}: {stats.summary()}")


@pytest.mark.parametrize("drafter", ["ngram", "model:smollm2-135m"])
def test_llamacpp_speculative_equals_plain_up_to_near_ties(drafter):
    pytest.importorskip("llama_cpp")
    model = load_model("smollm2-135m", BackendKind.LLAMACPP, ctx=CTX, threads=LLAMACPP_THREADS)
    spec = make_drafter(DrafterSpec.parse(drafter), model, ctx=CTX, threads=LLAMACPP_THREADS)
    divergences, stats = [], DecodeStats()
    for i, prompt in enumerate(prompts_for(model)):
        plain, fast = greedy(model, prompt), greedy(model, prompt, spec, stats)
        if plain != fast:
            at = next(j for j, (a, b) in enumerate(zip(plain, fast)) if a != b)
            margin = plain_path_margin(model, prompt, plain, at)
            divergences.append((i, at, margin))
    print(f"\nllamacpp {drafter}: {stats.summary()}; divergences (prompt, position, top-2 margin): {divergences}")
    assert all(m < 0.1 for _, _, m in divergences), divergences
    assert stats.mean_accepted_length > 1.0
    assert_accepted_and_rejected(stats, drafter)
