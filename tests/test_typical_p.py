"""typical_p end to end (issue 27's proof of the option path): one CallSettings field reaches the one
logits_to_probs from every edge (CLI flag, chat /set, Engine keyword, OpenAI body field), changes sampled output
like the rule says, and speculation under it stays lossless while it samples: seed for seed with the n-gram
drafter (rule 1.2), in distribution with a model drafter (chi-square against the exact joint here, and
tests/test_decode.py's t1typ0.9 case on Markov tables)."""
import json
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import specedge
from specedge.apps.chat_state import parse_option
from specedge.apps.cli import cli
from specedge.apps.server import ServerConfig, create_app
from specedge.assembly.decoder import CallSettings
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.sampling import logits_to_probs
from chi_square import pooled_pvalue


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return tiny_gguf  # tests/conftest.py, shared (read-only)


@pytest.fixture(scope="module")
def engine(tiny):
    return specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=256)


PROMPT = "the cat sat on the mat and the cat"


def test_every_edge_carries_typical_p_to_the_sampler(tiny, engine):
    by_engine = engine.generate(PROMPT, temperature=0.8, typical_p=0.4, max_tokens=12, seed=3)
    assert by_engine.stats.sampling.typical_p == 0.4 and by_engine.stats.sampling_dict()["typical_p"] == 0.4
    r = CliRunner().invoke(cli, ["generate", str(tiny), PROMPT, "--backend", "numpy", "--drafter", "ngram", "--ctx",
                                 "256", "--raw", "--temperature", "0.8", "--typical-p", "0.4", "--max-tokens", "12",
                                 "--seed", "3", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    by_cli = json.loads(r.stdout.strip().splitlines()[-1])
    assert by_cli["stats"]["sampling"]["typical_p"] == 0.4 and by_cli["tokens"] == by_engine.tokens
    with TestClient(create_app(engine, ServerConfig("tiny")), base_url="http://127.0.0.1") as client:
        body = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0.8,
                                                    "typical_p": 0.4, "seed": 3}).json()
        assert body["specedge"]["sampling"]["typical_p"] == 0.4
        assert body["choices"][0]["text"] == by_engine.text
        bad = client.post("/v1/completions", json={"prompt": PROMPT, "typical_p": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "typical_p"
    assert parse_option("typical_p", "0.5", {}) == {"typical_p": 0.5}
    with pytest.raises(ValueError, match="typical_p"):
        parse_option("typical_p", "2", {})
    with pytest.raises(ValueError, match="typical_p"):
        CallSettings(typical_p=0.0)


def test_typical_p_is_off_at_one_and_narrows_sampling_below(engine):
    """Off (1) leaves the default sampling unchanged; a small typical_p keeps few tokens per row, so the sampled
    answers of many seeds take fewer distinct first tokens."""
    ids = engine.encode(PROMPT)
    off = [engine.generate(ids, temperature=1.0, max_tokens=4, seed=s).tokens for s in range(6)]
    same = [engine.generate(ids, temperature=1.0, typical_p=1.0, max_tokens=4, seed=s).tokens for s in range(6)]
    assert off == same
    narrow = {engine.generate(ids, temperature=1.5, typical_p=0.05, max_tokens=1, seed=s).tokens[0]
              for s in range(24)}
    wide = {engine.generate(ids, temperature=1.5, max_tokens=1, seed=s).tokens[0] for s in range(24)}
    assert len(narrow) < len(wide)
    logits = engine.model.backend.forward(np.asarray(ids, np.int32), engine.model.backend.new_cache(64))[-1:]
    p = logits_to_probs(logits, engine.decoder.request(CallSettings(temperature=1.5, typical_p=0.05)).params)
    assert narrow <= set(np.flatnonzero(p[0] > 0).tolist())  # every sampled token is in the typical set


def _exact_joint(engine, ids, settings: CallSettings, n: int) -> dict[tuple[int, ...], float]:
    """The exact distribution of the first n sampled tokens after ids: every path through the target's processed
    rows (the call's own params, each row penalised by its own history, as the decode loop does)."""
    backend, params = engine.model.backend, engine.decoder.request(settings).params
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        longer = {}
        for seq, mass in joint.items():
            ctx = np.asarray([*ids, *seq], np.int32)
            row = logits_to_probs(backend.forward(ctx, backend.new_cache(len(ctx)))[-1:], params, ctx)[0]
            longer.update({(*seq, int(t)): mass * row[t] for t in np.flatnonzero(row > 0)})
        joint = longer
    return joint


def test_sampled_speculation_under_typical_p_is_plain_sampling_seed_for_seed_with_a_deterministic_drafter(tiny):
    """Rule 1.2 (docs/algorithms.md): the n-gram drafter has no q, so every emitted token, accepted or not, is one
    draw y ~ p_i from the call's RNG, as plain decoding draws it: with the same seed, sampled speculative output
    under typical_p is plain's token for token (the float64 NumPy rows of a verify batch equal one-token rows)."""
    spec = specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=256)
    plain = specedge.Engine.open(str(tiny), backend="numpy", drafter="none", ctx=256)
    accepted = 0
    for text in (PROMPT, "one two one two one two", "hello world"):
        for seed in range(4):
            want = plain.generate(text, temperature=1.5, typical_p=0.5, max_tokens=24, seed=seed)
            got = spec.generate(text, temperature=1.5, typical_p=0.5, max_tokens=24, seed=seed)
            assert got.tokens == want.tokens, (text, seed)
            assert got.stats.sampling.typical_p == 0.5
            accepted += got.stats.decode.n_accepted
    assert accepted > 0  # some drafts were verified by sampling and kept, not only rejected


@pytest.mark.slow
def test_sampled_speculation_under_typical_p_follows_the_plain_distribution_with_a_model_drafter(tmp_path, tiny):
    """Rule 1.1: a model drafter's acceptance draws consume the RNG, so only the distribution is guaranteed:
    chi-square of the first 2 sampled tokens over 1200 seeds against the exact joint of the typical_p-truncated
    target (the draft, the target's first layer, is accepted about 1 time in 10: both accept and residual paths).
    A sequence outside the typical set fails at once."""
    draft = write_tiny_gguf(tmp_path / "d.gguf", seed=0, n_layers=1)
    spec = specedge.Engine.open(str(tiny), backend="numpy", drafter=f"model:{draft}", ctx=256)
    ids, settings, trials = spec.encode(PROMPT), CallSettings(temperature=1.0, typical_p=0.3), 1200
    exact = _exact_joint(spec, ids, settings, 2)
    assert len(exact) >= 8  # typical_p keeps several tokens per row: a test with room to fail
    counts, accepted = Counter(), 0
    for seed in range(trials):
        r = spec.generate(ids, temperature=1.0, typical_p=0.3, max_tokens=2, seed=seed)
        counts[tuple(r.tokens)] += 1
        accepted += r.stats.decode.n_accepted
    assert accepted > 0 and set(counts) <= set(exact), "emitted a pair typical_p excludes"
    assert pooled_pvalue(counts, exact, trials)[0] > 1e-3
