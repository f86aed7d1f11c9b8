"""The Constraint seam (runtime/constraint.py) inside the speculative loop: constrained greedy speculative output
equals constrained plain output for every drafter, the constrained sampling distribution is preserved
(chi-square), the matcher holds exactly the committed tokens after every round (rollback), a forbidden draft
token ends the draft, logprobs are the target's, and bad grammars are clear errors."""
from collections import Counter
from itertools import product

import numpy as np
import pytest

from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.constraint import (GrammarCompiler, Gbnf, JsonObject, JsonSchema, Lark, Regex, mask_q)
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.base import Drafter
from specedge.runtime.drafters.dytree import DynamicTreeDrafter
from specedge.runtime.drafters.early_exit import DelDrafter, EarlyExitDrafter
from specedge.runtime.drafters.layerskip import LayerSkipDrafter, SwiftDrafter
from specedge.runtime.drafters.lookup import LookupModelDrafter
from specedge.runtime.drafters.model import ModelDrafter
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.drafters.recycle import RecycleDrafter
from specedge.runtime.sampling import logits_to_probs
from specedge.runtime.stats import DecodeStats
from specedge.runtime.tokenizer import Tokenizer
from specedge.runtime.types import Draft, SamplingParams
from specedge.runtime.verify import VerifierKind

from test_decode import RandomDrafter, assert_counts_match

GREEDY = SamplingParams()
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}
GRAMMARS = {"json_schema": JsonSchema(SCHEMA), "json_object": JsonObject(), "regex": Regex(r"(the|cat|sat)( [a-z]+){2,6}\."),
            "lark": Lark('start: item ("," item)*\nitem: "cat" | "mat" | /[0-9]{1,3}/'),
            "gbnf": Gbnf('root ::= "the " ("cat" | "mat") " " [a-z]+')}


class CycleDrafter(Drafter):
    """Proposes the given tokens in turn: allowed by the test grammar, often not the target's choice."""
    name = "cycle"

    def __init__(self, tokens):
        self.tokens, self.i = tokens, 0

    def propose(self, context, k, params, rng):
        self.i += 1
        return Draft(tokens=np.array([self.tokens[(self.i + j) % len(self.tokens)] for j in range(k)], np.int32))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tinyc")
    target = open_gguf(write_tiny_gguf(d / "t.gguf", seed=0, n_layers=4))
    other = open_gguf(write_tiny_gguf(d / "d.gguf", seed=1, n_layers=1))
    tgt = NumpyBackend(target.load_weights(), np.float64)
    tok = Tokenizer(target.tokenizer_spec())
    return tgt, NumpyBackend(other.load_weights(), np.float64), tok, GrammarCompiler(
        tok.spec.hf_json, tgt.config.vocab_size, tok.eos_ids)


def drafters(target, other):
    V = target.config.vocab_size
    return {"ngram": lambda: NgramDrafter(), "random": lambda: RandomDrafter(V),
            "model-self": lambda: ModelDrafter(target), "model-other": lambda: ModelDrafter(other),
            "lookup": lambda: LookupModelDrafter(ModelDrafter(other), 1),
            "dytree": lambda: DynamicTreeDrafter(ModelDrafter(target), 8, wave=2, branch=2),
            "recycle": lambda: RecycleDrafter(V, 8),
            "skip:1.5": lambda: LayerSkipDrafter(1.5), "exit:2": lambda: EarlyExitDrafter(2),
            "swift": lambda: SwiftDrafter(window=8, surrogate_every=3), "del": lambda: DelDrafter()}


def run(target, tok, grammars, spec, prompt, drafter=None, params=GREEDY, n=40, seed=0, stats=None, k=4):
    c = grammars.compile(spec)
    return [e.token for e in decode(target, tok.encode(prompt), Speculation(drafter, k=k),
                                    Request(params, max_tokens=n, eos_ids=tok.eos_ids, seed=seed, constraint=c),
                                    stats=stats)]


def matches(tok, spec, tokens) -> bool:
    """The text of tokens (EOS stripped) is a complete sentence of the grammar."""
    import re
    text = tok.decode([t for t in tokens if t not in tok.eos_ids])
    if isinstance(spec, Regex):
        return re.fullmatch(spec.pattern, text) is not None
    return True


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
def test_constrained_plain_output_follows_the_grammar(tiny, grammar):
    target, _, tok, grammars = tiny
    spec = GRAMMARS[grammar]
    out = run(target, tok, grammars, spec, "the cat sat on the mat", n=80)
    text = tok.decode([t for t in out if t not in tok.eos_ids])
    if out[-1] in tok.eos_ids:  # the grammar completed: the whole text is a sentence of it
        m = grammars.compile(spec).m
        assert m.consume_tokens([int(t) for t in out]) and m.is_stopped()
    if grammar == "regex":
        assert matches(tok, spec, out) or out[-1] not in tok.eos_ids
    if grammar == "json_schema" and out[-1] in tok.eos_ids:
        import json

        import jsonschema
        jsonschema.validate(json.loads(text), SCHEMA)
    assert text  # the grammar forced at least some output


@pytest.mark.parametrize("grammar", sorted(GRAMMARS))
@pytest.mark.parametrize("which", ["ngram", "random", "model-self", "model-other", "lookup", "dytree", "recycle",
                                   "skip:1.5", "exit:2", "swift", "del"])
def test_greedy_constrained_speculation_equals_constrained_plain(tiny, grammar, which):
    target, other, tok, grammars = tiny
    spec = GRAMMARS[grammar]
    for prompt in ("the cat sat on the mat and the cat", "1, 2, 3"):
        plain = run(target, tok, grammars, spec, prompt)
        st = DecodeStats()
        spec_out = run(target, tok, grammars, spec, prompt, drafters(target, other)[which](), stats=st)
        assert spec_out == plain, (which, grammar, prompt)


def test_free_text_is_not_the_constrained_text(tiny):
    """The constraint really acts: the unconstrained greedy output breaks the regex the constrained one follows."""
    target, _, tok, grammars = tiny
    spec = GRAMMARS["regex"]
    free = [e.token for e in decode(target, tok.encode("the cat sat on the mat"), PLAIN,
                                    Request(GREEDY, max_tokens=40, eos_ids=tok.eos_ids))]
    constrained = run(target, tok, grammars, spec, "the cat sat on the mat", n=40)
    assert free != constrained
    assert tok.decode(constrained[:1]).strip() in ("the", "cat", "sat", "t", "c", "s", "th", "ca", "sa")


def test_matcher_holds_exactly_the_committed_tokens_after_every_round(tiny):
    """Rollback: after rounds whose drafts were cut or rejected, the matcher's state equals that of a matcher fed
    only the committed tokens (a bounded grammar ends at EOS, which always ends its round)."""
    target, _, tok, grammars = tiny
    spec = Regex("(ab|cd|the|cat){1,6}")
    words = [int(tok.encode(w)[0]) for w in ("ab", "cd", "the", "cat")]
    for drafter in (RandomDrafter(target.config.vocab_size), CycleDrafter(words)):
        c, st, out, checked = grammars.compile(spec), DecodeStats(), [], 0
        for ev in decode(target, tok.encode("ab cd the cat"), Speculation(drafter, k=4),
                         Request(GREEDY, max_tokens=100, eos_ids=tok.eos_ids, constraint=c), stats=st):
            out.append(ev.token)
            if len(out) == st.n_emitted and ev.finish_reason is None:  # the last token of its round
                fresh = grammars.compile(spec)
                fresh.commit(out)
                empty = np.zeros(0, np.int32)
                assert np.array_equal(c.allowed(empty)[0], fresh.allowed(empty)[0])
                checked += 1
        assert out[-1] in tok.eos_ids and checked >= 2 and c.m.is_stopped()
        if isinstance(drafter, CycleDrafter):  # allowed drafts the target rejected: rolled back
            assert st.n_drafted > st.n_accepted


def test_a_forbidden_draft_token_ends_the_draft_before_verification(tiny):
    target, _, tok, grammars = tiny
    c = grammars.compile(Regex("abc"))
    a, b = tok.encode("a")[0], tok.encode("b")[0]
    masks, n, _ = c.allowed(np.array([a, a, b], dtype=np.int32))
    assert n == 1 and masks.shape == (2, target.config.vocab_size)
    assert masks[0, a] and not masks[0, b] and masks[1, b] and not masks[1, a]
    masks2, n2, _ = c.allowed(np.array([a], dtype=np.int32))  # the tentative tokens were rolled back
    assert n2 == 1 and np.array_equal(masks2, masks)


def test_mask_q_renormalises_over_allowed_tokens():
    q = np.array([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]])
    m = np.array([[False, True, True], [False, True, True]])
    out = mask_q(q, m)
    assert np.allclose(out[0], [0, 0.5, 0.5]) and np.allclose(out[1], 0)


class DfaConstraint:
    """A constraint on a 5-token Markov vocabulary, written by hand: token 4 never follows token 3, token 0 is
    forbidden at even positions, and token 2 forces token 1 next (a fast-forward token the stepper drafts).
    Exercises the seam with exactly known masks."""

    def __init__(self, V=5):
        self.V, self.hist = V, []

    def _mask(self, hist):
        m = np.ones(self.V, dtype=bool)
        if hist and hist[-1] == 3:
            m[4] = False
        if len(hist) % 2 == 0:
            m[0] = False
        if hist and hist[-1] == 2:
            m[:] = False
            m[1] = True
        return m

    def allowed(self, draft, room=0):
        rows, h = [self._mask(self.hist)], list(self.hist)
        n = 0
        for t in draft:
            if not rows[-1][int(t)]:
                break
            h.append(int(t))
            rows.append(self._mask(h))
            n += 1
        forced = []
        while len(forced) < room - n and h and h[-1] == 2:
            forced.append(1)
            h.append(1)
            rows.append(self._mask(h))
        return np.array(rows), n, np.array(forced, np.int32)

    def commit(self, tokens):
        self.hist.extend(int(t) for t in tokens)


def exact_constrained(P, start, params, n, V=5):
    """Exact joint of n tokens under the DFA constraint: each step masks the logits then processes them."""
    out = {}
    for seq in product(range(V), repeat=n):
        prob, prev, hist = 1.0, start, []
        for x in seq:
            logits = P[prev].copy()
            logits[~DfaConstraint()._mask(hist)] = -np.inf
            prob *= logits_to_probs(logits, params)[0, x]
            prev = x
            hist.append(x)
        out[seq] = prob
    return out


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=3)],
                         ids=["t1", "t0.8k3"])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_constrained_sampling_preserves_the_constrained_distribution(params, drafter_kind):
    """Chi-square: sampled speculative decoding under a constraint follows the masked target distribution (a model
    drafter's q rows masked and renormalised, the draft ending at its first forbidden token)."""
    V, n, trials = 5, 3, 12000
    P, Q = random_markov_table(V, seed=3, scale=1.0), random_markov_table(V, seed=4, scale=1.0)
    target = MarkovBackend(P)
    prompt = np.array([0, 1, 0, 3, 2], dtype=np.int32)  # ends at 2: the first token is forced
    rng, counts = np.random.default_rng(321), Counter()
    for _ in range(trials):
        drafter = ModelDrafter(MarkovBackend(Q)) if drafter_kind == "model" else NgramDrafter()
        seq = tuple(e.token for e in decode(target, prompt, Speculation(drafter, k=2),
                                            Request(params, max_tokens=n, seed=int(rng.integers(1 << 62)), constraint=DfaConstraint())))
        counts[seq] += 1
    assert_counts_match(counts, exact_constrained(P, int(prompt[-1]), params, n), trials)


def test_logprobs_are_the_targets_log_softmax_under_speculation(tiny):
    target, _, tok, _ = tiny
    prompt = tok.encode("the cat sat on the mat and the cat")
    plain = list(decode(target, prompt, PLAIN, Request(GREEDY, max_tokens=20, logprobs=3)))
    spec = list(decode(target, prompt, Speculation(NgramDrafter(), k=4), Request(GREEDY, max_tokens=20, logprobs=3)))
    assert [e.token for e in spec] == [e.token for e in plain]
    for a, b in zip(plain, spec):
        assert a.logprob.token == a.token and len(a.logprob.top) == 3
        assert a.logprob.top[0][0] == a.token  # greedy: the chosen token is the most likely
        assert abs(a.logprob.logprob - b.logprob.logprob) < 1e-5
        assert [t for t, _ in a.logprob.top] == [t for t, _ in b.logprob.top]
    # the value is the model's log-softmax at that position
    ids = np.concatenate([prompt, [e.token for e in plain[:2]]]).astype(np.int32)
    logits = target.forward(ids, target.new_cache(len(ids) + 1))[-1].astype(np.float64)
    ref = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    assert plain[2].logprob.logprob == pytest.approx(float(ref[plain[2].token]), abs=1e-9)


def test_bad_grammars_are_clear_errors(tiny):
    _, _, _, grammars = tiny
    with pytest.raises(ValueError, match="Lark grammar is not usable"):
        grammars.compile(Lark("start: missing_rule"))
    with pytest.raises(ValueError, match="Regex grammar is not usable"):
        grammars.compile(Regex("(unclosed"))
    with pytest.raises(ValueError, match="GBNF"):
        grammars.compile(Gbnf("root ::= ("))
    with pytest.raises(ValueError, match="strict=False"):
        grammars.compile(JsonSchema({"type": "string", "format": "no-such-format-xyz"}))


def test_block_verifier_and_lossy_modes_refuse_a_constraint(tiny):
    target, _, tok, grammars = tiny
    with pytest.raises(ValueError, match="block verification"):
        next(iter(decode(target, tok.encode("a b"), Speculation(NgramDrafter(), verifier=VerifierKind.BLOCK),
                         Request(SamplingParams(temperature=1.0), constraint=grammars.compile(Regex("a+")), max_tokens=128))))


def test_cli_generate_constrains_output_and_matches_plain(tmp_path):
    import json
    import re

    from click.testing import CliRunner

    from specedge.apps.cli import cli
    path = write_tiny_gguf(tmp_path / "t.gguf", seed=0, n_layers=2)
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer", "maximum": 999}},
                                  "required": ["a"], "additionalProperties": False}))
    base = ["generate", str(path), "the cat", "--backend", "numpy", "--drafter", "ngram", "--temperature", "0",
            "--max-tokens", "60", "--json", "--baseline"]
    r = CliRunner().invoke(cli, base + ["--regex", "(cat|mat)( [a-z]{1,5}){1,3}", "--logprobs", "1"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["stats"]["identical_to_baseline"] and len(out["logprobs"]) == len(out["tokens"])
    assert re.fullmatch("(cat|mat)( [a-z]{1,5}){1,3}", out["text"]) or out["finish_reason"] == "length"
    r = CliRunner().invoke(cli, base + ["--json-schema", str(schema)])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.exit_code == 0 and out["stats"]["identical_to_baseline"]
    if out["finish_reason"] == "eos":
        assert set(json.loads(out["text"])) == {"a"}
    r = CliRunner().invoke(cli, base + ["--regex", "("])
    assert r.exit_code == 2 and "Regex grammar is not usable" in r.output
    r = CliRunner().invoke(cli, base + ["--regex", "a", "--json-schema", "{}"])
    assert r.exit_code == 2 and "give one output constraint" in r.output
