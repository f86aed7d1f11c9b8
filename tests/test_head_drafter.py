"""The head drafter (runtime/drafters/head.py): its math against a plain re-implementation written here, its KV
rollback, lossless speculation on the NumPy reference and the native engine (greedy token for token, sampled by a
chi-square), session reuse, and the files it refuses."""
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from chi_square import pooled_pvalue
from test_numpy_backend import random_weights

import specedge
from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.decode import decode
from specedge.runtime.drafters import (DrafterInputs, HeadSpec, LoadedHead, build_drafter, check_target,
                                       parse_drafter)
from specedge.runtime.drafters.head import HeadDrafter, Precision
from specedge.runtime.drafters.head_model import HeadModel, TargetEmbedding, random_head, save_head
from specedge.runtime.request import Request, Speculation
from specedge.runtime.session import Session
from specedge.runtime.stats import DecodeStats
from specedge.runtime.types import SamplingParams

GREEDY = SamplingParams()
TAPS = (1, 2, 4)


@pytest.fixture(scope="module")
def weights():
    return random_weights(seed=3, n_layers=4)


@pytest.fixture(scope="module")
def target(weights):
    return NumpyBackend(weights, dtype=np.float64)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, weights):
    cfg, arrays = random_head(weights.config, TAPS, n_heads=4, n_kv_heads=2, head_dim=8, ffn=48, vocab_draft=60,
                              seed=5)
    return save_head(tmp_path_factory.mktemp("head"), cfg, arrays)


def new_head(head_dir, weights) -> HeadDrafter:
    return HeadDrafter(HeadModel.load(head_dir), TargetEmbedding.from_array(weights.tensors["embed"]))


def run(target, prompt, drafter=None, n=30, params=GREEDY, k=4, stats=None, seed=0, session=None):
    return [e.token for e in decode(target, prompt, Speculation(drafter, k=k, adaptive_k=False),
                                    Request(params, max_tokens=n, seed=seed), stats=stats, session=session)]


def prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 97, n).astype(np.int32) for n in (1, 2, 9, 40)] + [np.array([5, 6, 7] * 6, np.int32)]


# -- the math, against a plain re-implementation ------------------------------------------------------------------
def ref_head(raw: dict, cfg, embed: np.ndarray, gs: list, es: list, positions: list) -> list:
    """float64, head by head, loops: the layer of docs/drafters.md over entries (g, e token, RoPE position); each
    entry attends to itself and every earlier entry. Returns the draft logits [Vd] of each entry."""
    def rms(x, w):
        return x / np.sqrt(np.mean(x * x) + cfg.rms_eps) * w

    def rope(x, p):  # rotate-half over head_dim
        half = cfg.head_dim // 2
        inv = cfg.rope_theta ** (-np.arange(half) * 2.0 / cfg.head_dim)
        c, s = np.cos(p * inv), np.sin(p * inv)
        return np.concatenate([x[:half] * c - x[half:] * s, x[half:] * c + x[:half] * s])

    a = {n: np.asarray(v, np.float64) for n, v in raw.items()}
    hd, group = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    keys, values, out = [], [], []
    for g, tok, p in zip(gs, es, positions):
        u = np.concatenate([rms(embed[tok], a["input_norm"]), rms(g, a["hidden_norm"])])
        q, k, v = a["wq"] @ u, a["wk"] @ u, a["wv"] @ u
        keys.append([rope(k[j * hd:(j + 1) * hd], p) for j in range(cfg.n_kv_heads)])
        values.append([v[j * hd:(j + 1) * hd] for j in range(cfg.n_kv_heads)])
        attn = []
        for h in range(cfg.n_heads):
            qh, j = rope(q[h * hd:(h + 1) * hd], p), h // group
            s = np.array([kk[j] @ qh for kk in keys]) / np.sqrt(hd)
            w = np.exp(s - s.max())
            attn.append(sum(wi * vv[j] for wi, vv in zip(w / w.sum(), values)))
        r = g + a["wo"] @ np.concatenate(attn)
        x = rms(r, a["post_norm"])
        gate = a["w_gate"] @ x
        o = r + a["w_down"] @ (gate / (1 + np.exp(-gate)) * (a["w_up"] @ x))
        out.append((a["lm_head"] @ rms(o, a["norm"]), o))
    return out


def softmax_on(logits, d2t, vocab):
    p = np.zeros(vocab)
    e = np.exp(logits - logits.max())
    p[d2t] = e / e.sum()
    return p


def test_forward_matches_a_plain_reimplementation_over_prompt_and_two_chained_steps(target, weights, head_dir):
    """Entries 1..T-1 from the prompt's taps, then two draft steps (the second over the first's output and token):
    the q rows (softmax over the draft vocabulary, placed at d2t) equal the re-implementation's."""
    prompt = prompts()[2]
    raw = dict(np.load(head_dir / "head.npz"))
    head = new_head(head_dir, weights)
    cfg = head.head.config
    cache = target.new_cache(64)
    _, taps = target.hidden(prompt[:-1], cache, taps=TAPS)
    head.begin(prompt)
    head.observe_prompt(taps, prompt, 0)
    draft = head.propose(prompt, 2, SamplingParams(temperature=1.0), np.random.default_rng(0))
    assert draft.k == 2
    fc = raw["fc"].astype(np.float64)
    gs = [fc @ np.concatenate([taps[n][t] for n in TAPS]) for t in range(len(prompt) - 1)]
    es, positions = list(prompt[1:]), list(range(1, len(prompt)))
    embed = weights.tensors["embed"].astype(np.float64)
    ref = ref_head(raw, cfg, embed, gs, es, positions)
    first_logits, o_last = ref[-1]
    step2 = ref_head(raw, cfg, embed, gs + [o_last], es + [int(draft.tokens[0])], positions + [len(prompt)])
    d2t = raw["d2t"]
    np.testing.assert_allclose(draft.q[0], softmax_on(first_logits, d2t, cfg.vocab), atol=2e-5)
    np.testing.assert_allclose(draft.q[1], softmax_on(step2[-1][0], d2t, cfg.vocab), atol=2e-5)
    assert set(np.flatnonzero(draft.q[0])) <= set(d2t.tolist()) and draft.tokens[0] in d2t
    greedy = head.propose(prompt, 2, GREEDY, np.random.default_rng(0))
    assert greedy.q is None and greedy.tokens[0] == d2t[np.argmax(first_logits)]


def test_rollback_after_partial_acceptance_equals_a_fresh_head(target, weights, head_dir):
    """Propose 4, the target keeps 2 and emits its own token; the next proposal equals that of a head fed the
    committed sequence as its prompt (the draft's rows were dropped, the verify's taps wrote the true ones)."""
    prompt = prompts()[3]
    head = new_head(head_dir, weights)
    cache = target.new_cache(128)
    _, taps = target.hidden(prompt[:-1], cache, taps=TAPS)
    head.observe_prompt(taps, prompt, 0)
    draft = head.propose(prompt, 4, GREEDY, np.random.default_rng(0))
    assert draft.k == 4
    _, vtaps = target.hidden(np.concatenate([prompt[-1:], draft.tokens]), cache, taps=TAPS)
    emitted = np.array([*draft.tokens[:2], (int(draft.tokens[2]) + 1) % 97], np.int32)
    head.observe_verify(vtaps, emitted)
    committed = np.concatenate([prompt, emitted])
    fresh = new_head(head_dir, weights)
    _, ftaps = target.hidden(committed[:-1], target.new_cache(128), taps=TAPS)
    fresh.observe_prompt(ftaps, committed, 0)
    params = SamplingParams(temperature=1.0)
    a = head.propose(committed, 4, params, np.random.default_rng(1))
    b = fresh.propose(committed, 4, params, np.random.default_rng(1))
    assert list(a.tokens) == list(b.tokens)
    np.testing.assert_allclose(a.q, b.q, atol=1e-5)
    np.testing.assert_array_equal(head.cache.pos[:head.cache.n], np.arange(1, len(committed)))


def test_the_cache_after_a_decode_equals_a_fresh_head_s(target, weights, head_dir):
    """Many rounds of rejected drafts later, the head holds one entry per committed position, as if fed at once."""
    prompt = prompts()[2]
    head = new_head(head_dir, weights)
    out = run(target, prompt, head, n=20)
    committed = np.concatenate([prompt, out]).astype(np.int32)
    fresh = new_head(head_dir, weights)
    _, taps = target.hidden(committed[:-1], target.new_cache(64), taps=TAPS)
    fresh.observe_prompt(taps, committed, 0)
    n = fresh.cache.n
    assert head.cache.n == n == len(committed) - 1
    np.testing.assert_array_equal(head.cache.pos[:n], fresh.cache.pos[:n])
    np.testing.assert_allclose(head.cache.o[:n], fresh.cache.o[:n], atol=1e-4)
    np.testing.assert_allclose(head.cache.k[:, :n], fresh.cache.k[:, :n], atol=1e-4)


def test_q8_0_matrices_draft_what_float32_drafts_within_quantization(target, weights, head_dir):
    """The native kernels' packed Q8_0 matmuls (Precision.Q8_0, what the registry picks where they are built): q
    rows within 2% of the float32 head's, the greedy draft the same here, and a quarter of the bytes."""
    from specedge.runtime.backends import native_lib as nl
    if nl.available() is not None:
        pytest.skip(f"native engine not built: {nl.available()}")
    prompt = prompts()[3]
    cache = target.new_cache(64)
    _, taps = target.hidden(prompt[:-1], cache, taps=TAPS)
    heads = [HeadDrafter(HeadModel.load(head_dir), TargetEmbedding.from_array(weights.tensors["embed"]),
                         precision=p) for p in (Precision.FP32, Precision.Q8_0)]
    drafts = []
    for h in heads:
        h.observe_prompt(taps, prompt, 0)
        drafts.append((h.propose(prompt, 3, GREEDY, None), h.propose(prompt, 1, SamplingParams(temperature=1.0),
                                                                     np.random.default_rng(0))))
    assert list(drafts[0][0].tokens) == list(drafts[1][0].tokens)
    np.testing.assert_allclose(drafts[0][1].q, drafts[1][1].q, atol=0.02)
    assert heads[1].weight_bytes_per_token < 0.5 * heads[0].weight_bytes_per_token


# -- lossless ------------------------------------------------------------------------------------------------------
def test_greedy_speculation_equals_plain_greedy_on_the_numpy_reference(target, weights, head_dir):
    for prompt in prompts():
        stats = DecodeStats()
        assert run(target, prompt, new_head(head_dir, weights), stats=stats) == run(target, prompt), prompt
        assert stats.n_drafted > 0


def test_greedy_drafts_that_are_accepted_keep_the_output(tmp_path, target, weights):
    """A head whose draft vocabulary is the (one or) two tokens plain greedy emits most: its drafts are accepted
    (wholly and in part), the output stays plain greedy's, and the head's cache keeps one entry per position through them."""
    stats = DecodeStats()
    for i, prompt in enumerate(prompts()):
        plain = run(target, prompt, n=40)
        top = sorted(t for t, _ in Counter(plain).most_common(2))
        cfg, arrays = random_head(weights.config, TAPS, head_dim=8, vocab_draft=len(top), seed=6)
        arrays["d2t"] = np.array(top, np.int64)
        head = HeadDrafter(HeadModel.load(save_head(tmp_path / str(i), cfg, arrays)),
                           TargetEmbedding.from_array(weights.tensors["embed"]))
        assert run(target, prompt, head, n=40, stats=stats) == plain, prompt
        np.testing.assert_array_equal(head.cache.pos[:head.cache.n], np.arange(1, head.cache.n + 1))
    assert 0 < stats.n_accepted < stats.n_drafted
    assert 0 < stats.accepted_hist[0] and 0 < stats.accepted_hist[1:-1].sum()  # rejected, and partly accepted


def test_a_session_reusing_a_prefix_the_head_never_saw_stays_lossless(target, weights, head_dir):
    """Call 1 without the head fills the session; call 2 (the conversation continued) prefills only the new tokens:
    the head has entries from there on (a hole below) and the output is still plain greedy's."""
    session = Session(target, 128)
    first = prompts()[3][:20]
    out1 = run(target, first, None, n=10, session=session)
    second = np.concatenate([first, out1, prompts()[2]]).astype(np.int32)
    head = new_head(head_dir, weights)
    stats = DecodeStats()
    got = run(target, second, head, n=20, session=session, stats=stats)
    assert session.reused > 0 and stats.n_drafted > 0
    assert got == run(target, second, n=20)
    assert head.cache.pos[0] == session.reused + 1  # the first entry the head saw: after the reused prefix


def test_head_plus_suffix_memory_is_lossless(target, weights, head_dir):
    head = HeadModel.load(head_dir)
    inputs = DrafterInputs(target, head=LoadedHead(head, TargetEmbedding.from_array(weights.tensors["embed"])))
    drafter = build_drafter(parse_drafter(f"head:{head_dir}+suffix"), inputs)
    assert drafter.caps.reads_taps and drafter.verify_taps == TAPS
    for prompt in prompts()[3:]:
        assert run(target, prompt, drafter) == run(target, prompt)


def exact_two(target, prompt, params):
    """{(x1, x2): p} of plain sampling: the target's p after the prompt, then after each x1."""
    from specedge.runtime.sampling import logits_to_probs
    p1 = logits_to_probs(target.forward(prompt, target.new_cache(32))[-1:], params, history=prompt)[0]
    out = {}
    for x1 in np.flatnonzero(p1 > 0):
        seq = np.append(prompt, x1).astype(np.int32)
        p2 = logits_to_probs(target.forward(seq, target.new_cache(32))[-1:], params, history=seq)[0]
        out.update({(int(x1), int(x2)): p1[x1] * p2[x2] for x2 in np.flatnonzero(p2 > 0)})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(temperature=2.0), SamplingParams(temperature=1.5, top_k=5)],
                         ids=["t2", "t1.5k5"])
def test_sampled_speculation_follows_the_target(target, weights, head_dir, params):
    """Two tokens per call, 2000 calls: the joint distribution is the target's (chi-square), with drafts both
    accepted and rejected, and tokens off the draft vocabulary emitted."""
    prompt = np.array([3, 14, 15, 92, 65], np.int32)
    counts, stats, rng = Counter(), DecodeStats(), np.random.default_rng(11)
    drafter = new_head(head_dir, weights)
    trials = 2000
    for _ in range(trials):
        counts[tuple(run(target, prompt, drafter, n=2, params=params, k=2, stats=stats,
                         seed=int(rng.integers(1 << 62))))] += 1
    exact = exact_two(target, prompt, params)
    assert all(exact.get(s, 0) > 0 for s in counts), "emitted a sequence the target cannot produce"
    d2t = set(drafter.head.d2t.tolist())
    assert any(s[0] not in d2t for s in counts)
    assert 0 < stats.n_accepted < stats.n_drafted
    p_value, cells = pooled_pvalue(counts, exact, trials)
    assert cells > 10 and p_value > 1e-3, (p_value, cells)


# -- real files: GGUF embedding, native engine, CLI-level loading -----------------------------------------------
@pytest.fixture(scope="module")
def q8_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("q8") / "tiny-q8.gguf", dtype="q8_0", seed=0, n_layers=3)


def gguf_head(tmp_path, gguf_path, **kw):
    cfg, arrays = random_head(open_gguf(gguf_path).config, (1, 2, 3), seed=2, **kw)
    return save_head(tmp_path / "head", cfg, arrays)


@pytest.mark.parametrize("backend", ["numpy", "native"])
def test_engine_with_head_equals_plain_greedy(tmp_path, q8_gguf, backend):
    if backend == "native":
        from specedge.runtime.backends import native_lib as nl
        if nl.available() is not None:
            pytest.skip(f"native engine not built: {nl.available()}")
    from specedge.models.catalog import file_sha256
    head = gguf_head(tmp_path, q8_gguf, vocab_draft=200, gguf_sha256=file_sha256(q8_gguf))
    common = dict(backend=backend, threads=2, ctx=256, cache_dir=tmp_path)
    spec = specedge.Engine.open(str(q8_gguf), drafter=f"head:{head}", **common)
    plain = specedge.Engine.open(str(q8_gguf), drafter="none", **common)
    assert isinstance(spec.drafter, HeadDrafter)
    for text in ("the cat sat on the mat and the cat", "one two three one two three"):
        want = plain.generate(text, temperature=0, max_tokens=30).tokens
        assert spec.generate(text, temperature=0, max_tokens=30).tokens == want, text


def test_embedding_rows_are_the_gguf_s_dequantized_rows_times_the_family_scale(tmp_path, q8_gguf):
    for path in (q8_gguf, write_tiny_gguf(tmp_path / "g.gguf", arch="gemma3", n_layers=2)):
        gguf = open_gguf(path)
        emb = TargetEmbedding.from_gguf(gguf)
        ids = np.array([5, 1, 5, 77])
        want = gguf.load_tensor("embed")[ids] * np.float32(gguf.config.block.embed_scale)
        np.testing.assert_array_equal(emb.rows(ids), want)
    assert gguf.config.block.embed_scale == pytest.approx(np.sqrt(gguf.config.d_model))


# -- what it refuses -----------------------------------------------------------------------------------------------
def broken(head_dir, tmp_path, **changes):
    """A copy of the head with arrays replaced (None: removed)."""
    arrays = dict(np.load(head_dir / "head.npz"))
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v
    out = tmp_path / "bad"
    out.mkdir()
    (out / "head.json").write_text((head_dir / "head.json").read_text())
    np.savez(out / "head.npz", **arrays)
    return out


def test_bad_files_are_refused_naming_the_file_and_the_fix(tmp_path, head_dir):
    cases = [
        (dict(wq=np.zeros((3, 3), np.float16)), "array 'wq' has shape (3, 3)"),
        (dict(w_up=None), "arrays missing ['w_up']"),
        (dict(d2t=np.zeros(60, np.int64)), "distinct target id"),
        (dict(fc=np.full((32, 96), np.nan, np.float16)), "non-finite"),
        (dict(norm=np.array([object()] * 32, dtype=object)), "without pickle"),
    ]
    for i, (change, words) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        with pytest.raises(ValueError) as e:
            HeadModel.load(broken(head_dir, d, **change))
        assert words in str(e.value) and "bad/head.npz" in str(e.value) and "train-drafter" in str(e.value)
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "head.json").write_text((head_dir / "head.json").read_text())
    with pytest.raises(FileNotFoundError, match="head.npz is missing"):
        HeadModel.load(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no draft head directory"):
        HeadModel.load(tmp_path / "nowhere")
    later = tmp_path / "0" / "bad"
    (later / "head.json").write_text('{"format": "specedge-draft-head", "version": 9}')
    with pytest.raises(ValueError, match="version 9; this runtime reads version 1"):
        HeadModel.load(later)
    (later / "head.json").write_text('{"format": "specedge-draft-head", "version": 1, "target": {}}')
    with pytest.raises(ValueError, match='"taps" must be a non-empty list'):
        HeadModel.load(later)


def test_a_head_for_another_model_or_file_is_refused(tmp_path, q8_gguf, target):
    other = random_weights(seed=1, n_layers=4).config
    cfg, arrays = random_head(other, TAPS, head_dim=8, vocab_draft=20)
    head = HeadModel.load(save_head(tmp_path / "a", cfg, arrays))
    head.check_target(target.config)  # same shape: taken
    wide = HeadModel.load(save_head(tmp_path / "b", *random_head(replace(other, d_model=48), TAPS, head_dim=12,
                                                                  vocab_draft=20)))
    with pytest.raises(ValueError, match="hidden size 48 .the target's: 32."):
        wide.check_target(target.config)
    with pytest.raises(ValueError, match="hidden size 48"):
        HeadDrafter(wide, TargetEmbedding.from_array(np.zeros((97, 48), np.float32))).check(target)
    sha = random_head(open_gguf(q8_gguf).config, (1, 2, 3), gguf_sha256="0" * 64)
    path = save_head(tmp_path / "c", *sha)
    with pytest.raises(ValueError, match="another file of tiny.*GGUF sha256 000000000000"):
        specedge.Engine.open(str(q8_gguf), drafter=f"head:{path}", backend="numpy", ctx=256, cache_dir=tmp_path)


def test_a_target_without_taps_is_refused_at_start_up(head_dir, weights):
    markov = MarkovBackend(random_markov_table(97, seed=1))
    with pytest.raises(ValueError, match="hidden states .taps.*--backend native"):
        check_target(HeadSpec(str(head_dir)), markov)  # what the assembly layer runs before loading anything
    loaded = LoadedHead(HeadModel.load(head_dir), TargetEmbedding.from_array(weights.tensors["embed"]))
    with pytest.raises(ValueError, match="hidden states .taps.*--backend native"):
        build_drafter(HeadSpec(str(head_dir)), DrafterInputs(markov, head=loaded))
    assert str(parse_drafter(f"head:{head_dir}+suffix:1024")) == f"head:{head_dir}+suffix:1024"
    with pytest.raises(ValueError, match="takes no draft stop"):
        parse_drafter("head:x+conf")


def test_the_cost_script_prints_one_line_per_precision(capsys):
    import json
    from specedge.perf import head_cost
    head_cost.main(["--precision", "fp32", "--reps", "2", "--context", "16", "--k", "2", "--vocab-draft", "512"])
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "fp32" and out["k"] == 2 and out["context"] == 16
    assert out["per_drafted_token_ms"] == pytest.approx((out["propose_ms"] + out["ingest_ms"]) / 2, abs=2e-3)
