"""No runaway answers (issue 44): an answer that repeats itself stops with finish reason `repetition`, at the first
committed token after which it holds, so its text is a prefix of the answer without the stop, with or without
speculation; the CLI and the Engine bound every answer by default (max_tokens 1024), the server does not."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import specedge
from specedge.apps.chat_state import parse_option
from specedge.apps.cli import cli
from specedge.assembly.decoder import DEFAULT_MAX_TOKENS, CallSettings
from specedge.models.tiny import tiny_config, tiny_weights, write_tiny_gguf
from specedge.runtime.backends.fake import MarkovBackend
from specedge.runtime.decode import decode
from specedge.runtime.drafters.ngram import NgramDrafter
from specedge.runtime.repetition import REPETITION_STOP, RepetitionStop
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.types import FinishReason

SMALL = RepetitionStop(max_span=6, min_copies=3, min_tokens=12)


def first_stop(tokens, rule: RepetitionStop) -> int | None:
    """Brute force: the 1-based length of the shortest prefix that ends in `copies` back-to-back copies of one span
    of L <= max_span tokens, copies >= max(min_copies, ceil(min_tokens / L)); None if no prefix does."""
    for n in range(1, len(tokens) + 1):
        for L in range(1, rule.max_span + 1):
            copies = max(rule.min_copies, -(-rule.min_tokens // L))
            tail = tokens[max(0, n - copies * L):n]
            if len(tail) == copies * L and all(tail[i] == tail[i % L] for i in range(len(tail))):
                return n
    return None


def watched(tokens, rule: RepetitionStop) -> int | None:
    w = rule.watch()
    return next((i + 1 for i, t in enumerate(tokens) if w.push(int(t))), None)


def test_the_docstring_examples():
    rule = RepetitionStop(max_span=2, min_copies=3, min_tokens=6)
    a, b, c = 1, 2, 3
    assert watched([a, b, c, b, c, b, c], rule) == 7
    assert watched([a, b, b, b, b, b], rule) is None
    assert watched([a, b, b, b, b, b, b], rule) == 7  # span 1 needs 6 copies


@pytest.mark.parametrize("seed", range(40))
def test_the_watch_stops_where_brute_force_says(seed):
    rng = np.random.default_rng(seed)
    head = rng.integers(0, 3 + seed % 4, size=int(rng.integers(0, 30))).tolist()  # few symbols: near-repeats
    span = rng.integers(0, 5, size=int(rng.integers(1, 8))).tolist()
    tokens = head + span * int(rng.integers(1, 8)) + rng.integers(0, 5, size=10).tolist()
    assert watched(tokens, SMALL) == first_stop(tokens, SMALL)


def test_lists_and_short_repeats_go_on():
    numbered = [t for i in range(100) for t in (1000 + i, 5, 6, 7)]  # "N. an apple" x 100: the numbers differ
    assert watched(numbered, REPETITION_STOP) is None
    row = [40, 41] * 8 + [42]  # "[0, 0, ..., 0],\n": 17 tokens a row
    assert watched(row * 8, REPETITION_STOP) is None  # an 8 x 8 table (136 tokens)
    assert watched(row * 12, REPETITION_STOP) == 204  # at the end of twelve identical rows: a loop
    assert watched([7] * 199, REPETITION_STOP) is None and watched([7] * 200, REPETITION_STOP) == 200


def markov_loop(V=12) -> np.ndarray:
    """Greedy goes 0 -> 1 -> ... -> 5 once, then cycles 6 -> 7 -> 8 -> 6; the other rows are random."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((V, V)).astype(np.float32)
    for a, b in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 6)]:
        table[a, b] = 10.0
    return table


@pytest.mark.parametrize("k", [1, 4, 7])
def test_speculative_steps_stop_at_the_same_token_as_plain(k):
    target, prompt = MarkovBackend(markov_loop()), np.array([0], np.int32)
    plain_all = [e.token for e in decode(target, prompt, PLAIN, Request(max_tokens=300))]
    req = Request(max_tokens=300, repetition=SMALL)
    plain = list(decode(target, prompt, PLAIN, req))
    spec = Speculation(NgramDrafter(), k=k)
    specd = list(decode(target, prompt, spec, req))
    n = first_stop(plain_all, SMALL)
    assert n is not None and plain[-1].finish_reason is FinishReason.REPETITION and len(plain) == n
    assert [e.token for e in plain] == plain_all[:n]  # a prefix of the answer without the stop
    assert [e.token for e in specd] == [e.token for e in plain] and specd[-1].finish_reason is FinishReason.REPETITION
    if k > 1:
        assert any(e.from_draft for e in specd)  # steps committed several tokens: the stop cut one short


@pytest.fixture(scope="module")
def looping(tmp_path_factory):
    """A tiny seeded llama whose greedy answer wanders for about 80 tokens, then loops: its LM head maps each
    token's embedding to a successor in a 3-cycle, and its attention and MLP outputs are scaled down so the
    layers perturb that for a while."""
    cfg = tiny_config(tied=False, context=512)
    w = tiny_weights(cfg, seed=0)
    emb, V = w["embed"], w["embed"].shape[0]
    head = np.zeros_like(w["lm_head"])
    for t in range(V):
        succ = 3 * (t // 3) + (t + 1) % 3 if 3 * (t // 3) + 2 < V else t
        head[succ] += emb[t] / np.linalg.norm(emb[t])
    head[cfg.eos_ids[0]] = 0.0
    w["lm_head"] = 4 * head
    for name in w:
        if name.endswith((".o", ".down")):
            w[name] = 0.45 * w[name]
    return write_tiny_gguf(tmp_path_factory.mktemp("loop") / "loop.gguf", weights=w, tied=False, context=512)


def test_a_looping_model_stops_with_finish_repetition(looping):
    engine = specedge.Engine.open(str(looping), backend="numpy", drafter="none", ctx=512)
    ids = engine.encode("the cat sat on the mat")
    free = engine.generate(ids, temperature=0, max_tokens=None, repetition_stop=False)
    assert free.finish_reason == "length" and len(free.tokens) == 512 - len(ids)
    r = engine.generate(ids, temperature=0)
    assert r.finish_reason == "repetition" and r.stats.finish_reason is FinishReason.REPETITION
    assert r.tokens == free.tokens[:len(r.tokens)] and 200 <= len(r.tokens) < len(free.tokens)
    assert r.tokens == free.tokens[:first_stop(free.tokens, REPETITION_STOP)]
    assert r.text == engine.tokenizer.decode(r.tokens)


@pytest.mark.parametrize("drafter", ["ngram", "recycle:8", "model:{model}"])
def test_speculation_equals_plain_with_the_stop(looping, drafter):
    plain = specedge.Engine.open(str(looping), backend="numpy", drafter="none", ctx=512)
    ids = plain.encode("the cat sat on the mat")
    want = plain.generate(ids, temperature=0)
    # a fixed k: the adaptive policy weighs measured call times, and a machine busy with other work can make it
    # verify nothing for a while (lossless either way, but then this test would see no speculation)
    spec = specedge.Engine.open(str(looping), backend="numpy", drafter=drafter.format(model=looping), ctx=512,
                                adaptive_k=False)
    got = spec.generate(ids, temperature=0)
    assert got.tokens == want.tokens and got.finish_reason == "repetition"
    assert got.stats.decode.mean_accepted_length > 1.0  # speculation committed several tokens per step


def test_the_cli_says_why_it_stopped(looping):
    r = CliRunner().invoke(cli, ["generate", str(looping), "the cat sat on the mat", "--backend", "numpy", "--drafter", "ngram",
                                 "--temperature", "0", "--raw", "--stats", "--ctx", "512"])
    assert r.exit_code == 0, r.output
    assert "(stopped: the answer was repeating itself; --no-repetition-stop" in r.stderr
    assert "finish repetition" in r.stderr
    r = CliRunner().invoke(cli, ["generate", str(looping), "the cat sat on the mat", "--backend", "numpy", "--temperature", "0",
                                 "--raw", "--no-repetition-stop", "--max-tokens", "300", "--ctx", "512", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 300
    assert "(stopped at --max-tokens 300" in r.stderr


def test_every_call_is_bounded_by_default(looping):
    assert CallSettings().max_tokens == DEFAULT_MAX_TOKENS and CallSettings().repetition_stop is True
    assert CallSettings(max_tokens=None).max_tokens is None  # the server's "to the end", asked for explicitly
    with pytest.raises(ValueError, match="repetition_stop must be True or False"):
        CallSettings(repetition_stop="no")
    engine = specedge.Engine.open(str(looping), backend="numpy", drafter="none", ctx=512)
    assert engine.decoder.request(CallSettings()).max_tokens == DEFAULT_MAX_TOKENS
    assert engine.decoder.request(CallSettings()).repetition == REPETITION_STOP
    assert engine.decoder.request(CallSettings(repetition_stop=False)).repetition is None


def test_chat_set_switches_the_stop_and_the_limit():
    opts = parse_option("repetition_stop", "off", {})
    assert opts == {"repetition_stop": False} and parse_option("repetition_stop", "on", opts)["repetition_stop"]
    with pytest.raises(ValueError, match="repetition_stop takes on or off"):
        parse_option("repetition_stop", "maybe", {})
    assert parse_option("max_tokens", "none", {})["max_tokens"] is None  # no limit
    assert parse_option("max_tokens", "default", {"max_tokens": 5})["max_tokens"] == DEFAULT_MAX_TOKENS


def test_the_server_runs_to_the_end_of_the_turn_with_the_stop(looping):
    """No max_tokens on the server: OpenAI's "to the end", not the Engine's 1024; the repetition stop still ends a
    loop, as finish_reason "stop" for OpenAI clients and "repetition" in the specedge statistics."""
    from starlette.testclient import TestClient

    from specedge.apps.server import ServerConfig, create_app
    engine = specedge.Engine.open(str(looping), backend="numpy", drafter="ngram", ctx=512)
    want = engine.generate("the cat sat on the mat", temperature=0, max_tokens=None)
    assert want.finish_reason == "repetition"
    with TestClient(create_app(engine, ServerConfig("tiny")), base_url="http://127.0.0.1") as client:
        r = client.post("/v1/completions", json={"prompt": "the cat sat on the mat", "temperature": 0})
        assert r.status_code == 200, r.text
        out = r.json()
    assert out["choices"][0]["finish_reason"] == "stop" and out["specedge"]["finish_reason"] == "repetition"
    assert out["usage"]["completion_tokens"] == len(want.tokens) and out["choices"][0]["text"] == want.text
