"""specedge.Engine on the tiny model: thread safety, cancellation, per-call sampling, prefix reuse, clean errors."""
import threading

import numpy as np
import pytest

import specedge
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request
from specedge.runtime.types import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    path = tiny_gguf  # tests/conftest.py, shared (read-only)
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=256)


def plain(engine, ids, params, max_tokens, seed=0):
    backend: NumpyBackend = engine.model.backend
    return [e.token for e in decode(backend, ids, PLAIN, Request(params, max_tokens=max_tokens, seed=seed))]


def test_generate_equals_plain_decoding_and_reports_stats(engine):
    ids = engine.encode("hello world")
    c = engine.generate(ids, max_tokens=20, temperature=0)
    want = plain(engine, ids, SamplingParams(), 20)
    assert c.tokens == (want[:-1] if c.finish_reason == "eos" else want)
    assert c.prompt_tokens == len(ids) and c.stats.decode.n_generated == len(want)
    assert c.stats.drafter == "ngram" and c.stats.ttft_s > 0


def test_concurrent_calls_equal_sequential_ones(engine):
    prompts = [engine.encode(t) for t in ("a b c", "hello", "the cat sat", "xyz xyz", "0 1 2 3")]
    settings = [dict(max_tokens=15), dict(max_tokens=12, temperature=0.8, seed=3),
                dict(max_tokens=10, temperature=1.0, top_k=5, seed=4), dict(max_tokens=16, top_p=0.5, temperature=1.2),
                dict(max_tokens=9)]
    sequential = [engine.generate(p, **s).tokens for p, s in zip(prompts, settings)]
    results = [None] * len(prompts)

    def work(i):
        for _ in range(3):
            out = engine.generate(prompts[i], **settings[i]).tokens
            results[i] = out if results[i] in (None, out) else "differs"

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == sequential


def test_per_call_sampling_follows_the_seed(engine):
    ids = engine.encode("sample me")
    a = engine.generate(ids, max_tokens=12, temperature=1.0, seed=7).tokens
    assert a == engine.generate(ids, max_tokens=12, temperature=1.0, seed=7).tokens
    assert a != engine.generate(ids, max_tokens=12, temperature=1.0, seed=8).tokens


def test_cancel_stops_between_tokens_and_the_next_call_is_exact(engine):
    ids = engine.encode("count with me")
    cancel = threading.Event()
    chunks = []
    for c in engine.stream(ids, max_tokens=60, cancel=cancel):
        chunks.append(c)
        if len(chunks) == 3:
            cancel.set()
    assert chunks[-1].finish_reason == "cancelled" and len(chunks) == 4
    assert engine.generate(ids, max_tokens=20).tokens == engine.generate(ids, max_tokens=20).tokens


def test_chat_turns_reuse_the_cached_prefix(engine):
    messages = [{"role": "user", "content": "hi there"}]
    first = engine.chat(messages, max_tokens=8)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}]
    second = engine.chat(messages, max_tokens=8)
    assert second.stats.reused_prompt_tokens > first.prompt_tokens // 2
    assert second.stats.decode.n_prefilled == second.prompt_tokens - 1 - second.stats.reused_prompt_tokens
    engine.reset()
    again = engine.chat(messages, max_tokens=8)
    assert again.stats.reused_prompt_tokens == 0 and again.tokens == second.tokens


@pytest.mark.parametrize("bad, match", [(dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"),
                                        (dict(top_p=1.5), "top_p"), (dict(max_tokens=0), "max_tokens"),
                                        (dict(temperature=float("nan")), "temperature")])
def test_invalid_settings_fail_before_anything_runs(engine, bad, match):
    with pytest.raises(ValueError, match=match):
        engine.stream("hello", **bad)


def test_a_prompt_longer_than_the_context_names_the_fix(engine):
    with pytest.raises(ValueError, match="context holds 256.*ctx"):
        engine.generate(list(range(3, 300)) * 1, max_tokens=4)
    with pytest.raises(TypeError):
        engine.generate("x", max_token=4)  # a misspelt option is not silently ignored


def test_set_drafter_switches_live_and_a_bad_spec_keeps_the_old_one(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", seed=0, n_layers=2)
    eng = specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=256)
    ids = eng.encode("the cat sat on the mat")
    want = eng.generate(ids, max_tokens=16, temperature=0).tokens
    for bad, match in [("magic", "unknown drafter"), (f"model:{tmp_path / 'missing.gguf'}", "missing.gguf")]:
        with pytest.raises((ValueError, FileNotFoundError), match=match):
            eng.set_drafter(bad)
        assert eng.drafter_name == "ngram" and type(eng.drafter).__name__ == "NgramDrafter"
    for spec in (f"model:{path}", "recycle:8", "exit:1", "none"):
        eng.set_drafter(spec)
        c = eng.generate(ids, max_tokens=16, temperature=0)
        assert c.tokens == want and c.stats.drafter == spec  # lossless whichever drafter runs
    assert eng.drafter is None
    other = write_tiny_gguf(tmp_path / "o.gguf", seed=1, n_layers=1)
    eng.set_drafter(f"model:{other}")  # same tiny vocabulary: accepted; the target's output is unchanged
    assert eng.generate(ids, max_tokens=16, temperature=0).tokens == want


def test_engine_lookup_hybrid_drafts_from_the_calls_sampled_q(tmp_path):
    """Issue 17: `model:<int4>+lookup` through the Engine at temperature 0.8 drafts from the tempered q of the call,
    not greedily (the Engine used to hand sampling params only to drafters that had a `params` attribute, and the
    lookup hybrid had none, so its model part drafted one-hot greedy rows)."""
    pytest.importorskip("onnxruntime")
    from specedge.export.onnx_export import export_gguf_to_onnx
    from specedge.export.onnx_linear import WeightFormat
    from specedge.models.gguf_in import open_gguf

    art = tmp_path / "t-int4"
    export_gguf_to_onnx(open_gguf(write_tiny_gguf(tmp_path / "t.gguf", seed=4, dtype="q4_1")), art,
                        WeightFormat.INT4, gate=False)
    eng = specedge.Engine.open(str(art), backend="onnx", drafter=f"model:{art}+lookup", ctx=128, threads=1)
    model, seen = eng.drafter.model, []
    propose = model.propose

    def spy(context, k, params, rng, **kw):
        draft = propose(context, k, params, rng, **kw)
        seen.append((params.temperature, draft.q))
        return draft

    model.propose = spy
    eng.generate("the cat sat on", max_tokens=24, temperature=0.8, seed=2)
    assert seen, "the model part never drafted"
    assert all(t == 0.8 for t, _ in seen)
    rows = np.concatenate([q for _, q in seen if q is not None and len(q)])
    assert (rows.max(axis=1) < 0.999).any(), "every draft row is one-hot: the model part drafted greedily"


@pytest.mark.slow
def test_the_next_chat_turn_keeps_a_sampled_answers_ids(tmp_path):
    """A sampled answer that re-tokenizes to other ids (random tokens of a tiny model) keeps its generated ids in
    the next turn's prompt, so the whole previous conversation is reused from the cache; a raw prompt is always
    encoded whole (the server's requests do not depend on what came before)."""
    from specedge.models.tiny import tiny_config, tiny_weights, write_tiny_gguf
    shape = dict(n_layers=2, d_model=64, context=1024, tied=False)
    cfg = tiny_config(**shape)
    w = tiny_weights(cfg, seed=0)
    w["lm_head"][cfg.eos_ids[0]] = 0.0
    engine = specedge.Engine.open(str(write_tiny_gguf(tmp_path / "t.gguf", weights=w, **shape)), backend="numpy",
                                  drafter="none", ctx=1024)
    msgs, eos = [{"role": "user", "content": "hi"}], {cfg.eos_ids[0]: 6.0}  # the bias ends answers early
    checked = 0
    for seed in range(40):
        engine.reset()
        a = engine.chat(msgs, temperature=1.0, seed=seed, max_tokens=60, logit_bias=eos)
        said = engine.encode(engine.render_chat(msgs)) + list(a.tokens)
        history = msgs + [{"role": "assistant", "content": a.text}]
        if a.finish_reason != "eos" or engine.encode(engine.render_chat(history))[:len(said)] == said:
            continue  # not a case where re-tokenizing loses the ids
        nxt = engine.render_chat(history + [{"role": "user", "content": "more"}])
        b = engine.chat(history + [{"role": "user", "content": "more"}], temperature=1.0, seed=seed, max_tokens=4)
        assert b.stats.reused_prompt_tokens == len(said)  # everything the model saw and said, from the cache
        engine.reset()
        engine.chat(msgs, temperature=1.0, seed=seed, max_tokens=60, logit_bias=eos)  # the same answer again
        raw = engine.generate(nxt, max_tokens=1)  # a raw prompt: encoded whole, whatever came before
        assert raw.stats.prompt_tokens == len(engine.encode(nxt)) and raw.stats.reused_prompt_tokens < len(said)
        checked += 1
        if checked == 2:
            return
    pytest.fail("no sampled answer re-tokenized differently: the test checked nothing")
