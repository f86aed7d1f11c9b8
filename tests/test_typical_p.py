"""typical_p end to end (issue 27's proof of the option path): one CallSettings field reaches the one
logits_to_probs from every edge (CLI flag, chat /set, Engine keyword, OpenAI body field), changes sampled output
like the rule says, and speculation under it stays lossless (greedy equality here; the chi-square test is
tests/test_decode.py's t1typ0.9 case)."""
import json

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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("typ") / "t.gguf", seed=0, n_layers=2)


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


@pytest.mark.parametrize("drafter", ["ngram", "model:{tiny}"])
def test_speculation_under_typical_p_equals_plain_with_the_same_seed_greedy(tiny, drafter):
    """Greedy ignores typical_p (p is one-hot at the argmax): speculative == plain token for token with it set."""
    spec = specedge.Engine.open(str(tiny), backend="numpy", drafter=drafter.format(tiny=tiny), ctx=256)
    plain = specedge.Engine.open(str(tiny), backend="numpy", drafter="none", ctx=256)
    for text in (PROMPT, "one two one two one two", "hello world"):
        want = plain.generate(text, temperature=0, typical_p=0.3, max_tokens=24).tokens
        assert spec.generate(text, temperature=0, typical_p=0.3, max_tokens=24).tokens == want
