"""`specedge train-drafter` (export/train_head/): the prompt recipe, the data step's taps against the backend's own,
the draft vocabulary, the torch head against a step-by-step NumPy reading of docs/train_drafter.md, training
lowering the loss, the written head's arrays, resuming, and the error without torch. All on the tiny seeded model
(conftest)."""
import builtins
import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specedge.export.train_head import data as data_mod  # noqa: E402
from specedge.export.train_head.artifact import output_rows, target_embedding  # noqa: E402
from specedge.export.train_head.data import DataSettings, Sequences, make_data, sequence_taps  # noqa: E402
from specedge.export.train_head.model import HeadConfig, build_head, require_torch  # noqa: E402
from specedge.export.train_head.pipeline import Job, run  # noqa: E402
from specedge.export.train_head.prompts import PASSAGE, PATTERN, recipe, recipe_size  # noqa: E402
from specedge.export.train_head.train import Target, TrainSettings, loss_on, new_head, train_head  # noqa: E402
from specedge.export.train_head.vocab import draft_vocab, target_to_draft  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import Request  # noqa: E402
from specedge.runtime.tokenizer import Tokenizer  # noqa: E402
from specedge.runtime.types import as_tokens  # noqa: E402

TAPS = (1, 1, 2)  # choose_taps(2): the tiny model's two layers


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    g = open_gguf(tiny_gguf)
    return g, NumpyBackend(g.load_weights()), Tokenizer(g.tokenizer_spec())


@pytest.fixture(scope="module")
def tiny_data(tiny, tmp_path_factory):
    g, backend, tok = tiny
    out = tmp_path_factory.mktemp("head-data")
    return out, make_data(backend, tok, out, DataSettings(prompts=10, max_tokens=12, taps=TAPS, shard_size=8),
                          target_sha256="t")


def tiny_target(g) -> Target:
    embed = target_embedding(g)
    return Target("tiny", "t", g.config, embed, output_rows(g, embed))


def test_recipe_is_fixed_distinct_and_bounded():
    a = recipe(600)
    assert a == recipe(600) and recipe(10) == a[:10]
    assert len({(p.text, p.source) for p in a}) == 600  # no prompt twice (a passage prompt: with its source)
    assert [p.kind for p in a[:len(PATTERN)]] == list(PATTERN)
    for i, p in enumerate(a):  # a passage comes from an earlier topic prompt's answer, each answer used once
        assert (PASSAGE in p.text) == (p.source is not None) == (p.kind in ("summarize", "rag"))
        assert p.source is None or (p.source < i and a[p.source].kind == "topic")
    sources = [p.source for p in a if p.source is not None]
    assert len(sources) == len(set(sources)) == 120
    assert sum(p.kind == "translate" and p.text.startswith("Translate") for p in a) == 120
    with pytest.raises(ValueError, match="ask for 1"):
        recipe(recipe_size() + 1)


def test_data_taps_equal_the_backends_hidden_taps(tiny, tiny_data):
    g, backend, tok = tiny
    out, seqs = tiny_data
    assert len(seqs) == 10 and seqs.taps.dtype == np.float16 and seqs.taps.shape[1:] == (3, g.config.d_model)
    prompts = recipe(10)
    # two passage prompts: 6 reads an answer made earlier in its own shard (8 prompts), 9 one of the first shard
    assert [p.source for p in prompts if p.source is not None] == [0, 3]
    for i, p in enumerate(prompts):
        seq = seqs.tokens[seqs.offsets[i]:seqs.offsets[i + 1]]
        text = p.text
        if p.source is not None:  # the source's answer, decoded without its end of turn, is the passage
            src = seqs.tokens[seqs.offsets[p.source] + seqs.prompt_lens[p.source]:seqs.offsets[p.source + 1]]
            passage = tok.decode([t for t in src.tolist() if t not in g.config.eos_ids]).strip()
            text = text.replace(PASSAGE, passage)
            assert passage and PASSAGE not in text
        prompt = tok.chat_ids(text)
        assert seqs.prompt_lens[i] == len(prompt) and np.array_equal(seq[:len(prompt)], prompt)
        answer = seq[len(prompt):]
        assert np.array_equal(answer, plain_greedy(backend, prompt, 12, g.config.eos_ids))  # DataSettings(max_tokens=12)
        # the answer is the target's own greedy continuation, ending at an end-of-turn id or at max_tokens
        logits = backend.forward(seq, backend.new_cache(len(seq)))
        assert np.array_equal(logits[len(prompt) - 1:-1].argmax(1), answer)
        assert len(answer) == 12 or int(answer[-1]) in g.config.eos_ids
        # the answer's own forwards' taps: a teacher-forced pass's within float16 rounding on the NumPy reference
        _, tapped = backend.hidden(seq, backend.new_cache(len(seq)), taps=(1, 2))
        got = seqs.taps[seqs.offsets[i]:seqs.offsets[i + 1]]
        for j, n in enumerate(TAPS):
            np.testing.assert_allclose(got[:, j].astype(np.float32), tapped[n], rtol=2e-3, atol=1e-4)


def test_data_taps_on_the_native_engine_are_a_teacher_forced_pass_s_bit_for_bit(tiny_gguf):
    """One pass (the prompt's forward, then each answer token's): on the batch-invariant native engine the answer is
    plain greedy decoding's and the taps are sequence_taps' teacher-forced pass's, bit for bit."""
    from specedge.runtime.backends import native_lib as nl
    if nl.available() is not None:
        pytest.skip(f"native engine not built: {nl.available()}")
    from specedge.runtime.backends.native import NativeBackend
    g = open_gguf(tiny_gguf)
    backend, tok = NativeBackend(g, n_threads=2), Tokenizer(g.tokenizer_spec())
    for text in recipe_prompts_texts(3):
        prompt = tok.chat_ids(text)
        reply, taps = data_mod.answer_with_taps(backend, prompt, 12, g.config.eos_ids, TAPS)
        np.testing.assert_array_equal(reply, plain_greedy(backend, prompt, 12, g.config.eos_ids))
        np.testing.assert_array_equal(taps, sequence_taps(backend, np.concatenate([prompt, reply]), TAPS))


def plain_greedy(backend, prompt, max_tokens: int, eos_ids) -> np.ndarray:
    """The runtime's plain greedy decoding of prompt: what the data step's answer must be."""
    req = Request(max_tokens=max_tokens, eos_ids=tuple(eos_ids))
    return np.array([e.token for e in decode(backend, as_tokens(prompt), req=req)], dtype=np.int32)


def recipe_prompts_texts(n: int) -> list[str]:
    return [p.text for p in recipe(n) if p.source is None]


def test_data_resumes_without_running_the_target_again(tiny, tiny_data, monkeypatch, tmp_path):
    g, backend, tok = tiny
    out, seqs = tiny_data
    copy = tmp_path / "data"
    shutil.copytree(out, copy)
    (copy / "shard-00001.npz").unlink()  # the second shard (prompts 8, 9) is missing: only it is remade, its
    # passage prompt 9 reading prompt 3's answer back from the first shard
    calls = []
    real = data_mod.answer_with_taps
    monkeypatch.setattr(data_mod, "answer_with_taps", lambda *a: calls.append(1) or real(*a))
    again = make_data(backend, tok, copy, DataSettings(prompts=10, max_tokens=12, taps=TAPS, shard_size=8),
                      target_sha256="t")
    assert len(calls) == 2 and again.sha256 == seqs.sha256
    with pytest.raises(ValueError, match="other settings .*max_tokens"):
        make_data(backend, tok, copy, DataSettings(prompts=10, max_tokens=5, taps=TAPS, shard_size=8),
                  target_sha256="t")


def test_the_user_s_prompts_are_answered_first_and_change_the_data_s_settings(tiny, tiny_data, tmp_path):
    """--extra-prompts: the user's prompts come before the recipe's (each passage prompt then reads its own source's
    answer, moved past them), the index records their count and hash, and other prompts are refused in the folder."""
    g, backend, tok = tiny
    _, plain = tiny_data
    own = ("Say hello.", "Name a colour.")
    settings = DataSettings(prompts=10, max_tokens=12, taps=TAPS, shard_size=8, extra=own)
    seqs = make_data(backend, tok, tmp_path, settings, target_sha256="t")
    assert len(seqs) == 12
    for i, text in enumerate(own):
        prompt = tok.chat_ids(text)
        seq = seqs.tokens[seqs.offsets[i]:seqs.offsets[i + 1]]
        assert np.array_equal(seq, np.concatenate([prompt, plain_greedy(backend, prompt, 12, g.config.eos_ids)]))
    for i in range(10):  # the recipe's sequences, passages included, are those made without the user's prompts
        j = i + len(own)
        np.testing.assert_array_equal(seqs.tokens[seqs.offsets[j]:seqs.offsets[j + 1]],
                                      plain.tokens[plain.offsets[i]:plain.offsets[i + 1]])
    index = json.loads((tmp_path / data_mod.INDEX).read_text())
    assert index["extra"] == data_mod.extra_digest(own) and index["extra"]["count"] == 2
    with pytest.raises(ValueError, match="other settings .*extra"):
        make_data(backend, tok, tmp_path, replace(settings, extra=own[:1]), target_sha256="t")


def test_extra_prompts_from_the_command_line_are_read_skipped_and_checked(tmp_path):
    from specedge.apps.train_cmd import _extra
    from specedge.perf.bench import read_prompts
    dev = _extra("dev", 30)
    assert dev == tuple(p.text for p in read_prompts(None)[30:])
    assert not set(dev) & {p.text for p in read_prompts(None, limit=30)}  # what bench --skip 12 --limit 18 reads
    lines = tmp_path / "mine.txt"
    lines.write_text("first prompt\n\nsecond prompt\n")
    assert _extra(str(lines), 0) == ("first prompt", "second prompt") and _extra(None, 0) == ()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no turns"}\n')
    for args, words in (((str(bad), 0), "needs question_id, category and turns"),
                        ((str(tmp_path / "nope.txt"), 0), "no such file"), ((str(lines), 2), "leaves no prompt"),
                        ((None, 3), "give the file too")):
        with pytest.raises(ValueError, match=words):
            _extra(*args)


def test_an_epoch_s_batches_take_every_sequence_once_with_like_lengths_together():
    from specedge.export.train_head.train import epoch_batches
    rng = np.random.default_rng(0)
    lengths = np.where(rng.random(203) < 0.15, rng.integers(800, 2000, 203), rng.integers(60, 200, 203))
    ids = np.arange(200)  # 3 held out
    batches = epoch_batches(ids, lengths, 8, seed=5)
    assert len(batches) == 200 // 8 and all(len(b) == 8 for b in batches)
    flat = np.concatenate(batches)
    assert len(set(flat.tolist())) == len(flat) and set(flat.tolist()) <= set(ids.tolist())
    assert all(np.array_equal(a, b) for a, b in zip(batches, epoch_batches(ids, lengths, 8, seed=5)))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, epoch_batches(ids, lengths, 8, seed=6)))
    # padding: each batch is padded to its longest sequence; sorted runs pad far less than a plain shuffle
    padded = sum(len(b) * lengths[b].max() for b in batches)
    shuffled = rng.permutation(ids)[:len(flat)].reshape(-1, 8)
    assert padded < 0.6 * sum(len(b) * lengths[b].max() for b in shuffled)
    assert [len(b) for b in epoch_batches(np.arange(3), lengths, 8, seed=0)] == [3]  # fewer than a batch


def test_draft_vocabulary_is_the_most_frequent_answer_tokens():
    answers = np.array([7] * 5 + [3] * 4 + [9] * 3 + [1] * 2 + [4], np.int64)
    d2t = draft_vocab(answers, 20, 3)
    assert d2t.tolist() == [3, 7, 9] and d2t.dtype == np.int64
    assert draft_vocab(answers, 20, 3, always=(19,)).tolist() == [3, 7, 19]
    assert len(draft_vocab(answers, 20, 100)) == 20  # at most the target's vocabulary
    t2d = target_to_draft(d2t, 20)
    assert t2d[7] == 1 and t2d[4] == -1


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):
    hd = x.shape[-1]
    ang = pos * theta ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(np.r_[ang, ang]), np.sin(np.r_[ang, ang])
    return x * cos + np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin


def reference_chain(w, c: HeadConfig, embed, taps, tokens, root: int, steps: int) -> list[np.ndarray]:
    """docs/train_drafter.md read literally, one position at a time with the head's own KV cache: the verified positions
    before `root` enter the cache through fc(taps), then a chain of `steps` drafts from root (teacher tokens)."""
    keys, values = [], []

    def layer(g, token, pos):
        u = np.concatenate([_rms(embed[token], w["input_norm"], c.rms_eps), _rms(g, w["hidden_norm"], c.rms_eps)])
        q = _rope((w["wq"] @ u).reshape(c.n_heads, c.head_dim), pos, c.rope_theta)
        keys.append(_rope((w["wk"] @ u).reshape(c.n_kv_heads, c.head_dim), pos, c.rope_theta))
        values.append((w["wv"] @ u).reshape(c.n_kv_heads, c.head_dim))
        ks, vs, group = np.stack(keys), np.stack(values), c.n_heads // c.n_kv_heads
        heads = []
        for h in range(c.n_heads):
            s = ks[:, h // group] @ q[h] / np.sqrt(c.head_dim)
            p = np.exp(s - s.max())
            heads.append((p / p.sum()) @ vs[:, h // group])
        r = g + w["wo"] @ np.concatenate(heads)
        x = _rms(r, w["post_norm"], c.rms_eps)
        gate = w["w_gate"] @ x
        o = r + w["w_down"] @ (gate / (1 + np.exp(-gate)) * (w["w_up"] @ x))
        return w["lm_head"] @ _rms(o, w["norm"], c.rms_eps), o

    for t in range(root):
        layer(w["fc"] @ taps[t].reshape(-1), tokens[t + 1], t + 1)
    g, out = w["fc"] @ taps[root].reshape(-1), []
    for j in range(steps):
        logits, g = layer(g, tokens[root + j + 1], root + j + 1)
        out.append(logits)
    return out


def test_torch_head_is_the_documented_math(tiny):
    g = tiny[0]
    c = HeadConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn=48, vocab_draft=11, rope_theta=500.0,
                   rms_eps=1e-5)
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((40, 32)).astype(np.float32)
    torch.manual_seed(0)
    head = build_head(c, embed).double()
    with torch.no_grad():
        for name in ("input_norm", "hidden_norm", "post_norm", "norm", "wo", "w_down"):  # not the init's values
            p = getattr(head, name)
            p.copy_(torch.as_tensor(rng.uniform(0.5, 1.5, p.shape) if p.dim() == 1 else rng.standard_normal(p.shape)
                                    / np.sqrt(p.shape[1])))
    w = {n: p.detach().numpy() for n, p in head.named_parameters()}
    taps = rng.standard_normal((1, 12, 3, 32))
    tokens = rng.integers(0, 40, (1, 12))
    outs = head(torch.as_tensor(taps), torch.as_tensor(tokens), 4)
    for root in (0, 3, 7):
        ref = reference_chain(w, c, embed.astype(np.float64), taps[0], tokens[0], root, 4)
        for j in range(4):
            np.testing.assert_allclose(head.logits(outs[j][0, root + j]).detach().numpy(), ref[j], rtol=1e-9,
                                       atol=1e-9)


def repetitive_corpus(backend, n: int = 6, length: int = 40) -> Sequences:
    """Sequences cycling through a few tokens (a 3-token prompt, the rest the 'answer'), their real taps."""
    seqs = [np.array([(5 + 3 * (i + t)) % 11 + 10 for t in range(length)], np.int32) for i in range(n)]
    taps = [sequence_taps(backend, s, TAPS) for s in seqs]
    offsets = np.concatenate([[0], np.cumsum([length] * n)])
    return Sequences(np.concatenate(seqs), np.concatenate(taps), offsets, np.full(n, 3, np.int32), "corpus")


@pytest.mark.slow
def test_training_lowers_the_loss_on_a_repetitive_corpus(tiny, tmp_path):
    g, backend, _ = tiny
    seqs = repetitive_corpus(backend)
    d2t = draft_vocab(seqs.answer_tokens(), g.config.vocab_size, 32)
    target = tiny_target(g)
    ids = np.arange(len(seqs) - 1)
    before = loss_on(new_head(target, d2t), seqs, ids, d2t, g.config.vocab_size, 3)
    settings = TrainSettings(steps=40, minutes=None, batch=2, lr=3e-3, warmup=5)
    trained = train_head(seqs, target, d2t, tmp_path, settings)
    after = loss_on(trained.head, seqs, ids, d2t, g.config.vocab_size, 3)
    assert trained.steps == 40 and after < 0.5 * before, (before, after)
    assert trained.tau_eval > 1.5  # a cycle of period 11 is learnt: chains are accepted


def _job(out, **kw) -> Job:
    return Job("tiny", "t", out, DataSettings(prompts=10, max_tokens=12, taps=TAPS, shard_size=8),
               TrainSettings(steps=3, minutes=None, batch=2), vocab_draft=64, command="specedge train-drafter tiny",
               **kw)


def test_written_head_has_the_documented_arrays(tiny, tiny_data, tmp_path):
    g, backend, tok = tiny
    shutil.copytree(tiny_data[0], tmp_path / "data")
    path, meta = run(_job(tmp_path), backend, tok, g)
    c = HeadConfig(meta["target"]["hidden"], meta["n_heads"], meta["n_kv_heads"], meta["head_dim"], meta["ffn"],
                   meta["vocab_draft"], meta["rope_theta"], meta["rms_eps"])
    assert (c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab_draft) == (64, 4, 2, 16, 128, 64)
    assert json.loads((path / "head.json").read_text()) == meta
    assert meta["format"] == "specedge-draft-head" and meta["taps"] == list(TAPS)
    assert meta["training"]["data_sha256"] == tiny_data[1].sha256 and meta["training"]["steps"] == 3
    # the shards' own times (a tiny data set can take under 0.05 s: the recorded value rounds to 0.0 there)
    assert meta["training"]["data_seconds"] == round(tiny_data[1].seconds, 1) and tiny_data[1].seconds > 0
    with np.load(path / "head.npz", allow_pickle=False) as z:
        arrays = dict(z)
    assert set(arrays) == set(c.shapes()) | {"d2t"}
    for name, shape in c.shapes().items():
        assert arrays[name].shape == shape and arrays[name].dtype == np.float16, name
    assert arrays["d2t"].dtype == np.int64 and arrays["d2t"].shape == (64,)
    assert np.all(np.diff(arrays["d2t"]) > 0) and set(tok.eos_ids) <= set(arrays["d2t"].tolist())


def test_resume_continues_the_step_count(tiny, tiny_data, tmp_path):
    g, backend, tok = tiny
    shutil.copytree(tiny_data[0], tmp_path / "data")
    run(_job(tmp_path), backend, tok, g)
    with pytest.raises(ValueError, match="--resume continues it"):
        run(_job(tmp_path), backend, tok, g)
    job = _job(tmp_path, resume=True)
    with pytest.raises(ValueError, match="resume with --vocab-draft 64"):
        run(replace(job, vocab_draft=32), backend, tok, g)
    _, meta = run(replace(job, train=replace(job.train, steps=5)), backend, tok, g)
    assert meta["training"]["steps"] == 5


def test_missing_torch_names_the_extra(monkeypatch):
    real = builtins.__import__

    def no_torch(name, *a, **kw):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(ImportError, match=r"install the train extra: pip install 'specedge\[train\]'"):
        require_torch()
    from click.testing import CliRunner
    from specedge.apps.cli import cli
    result = CliRunner().invoke(cli, ["train-drafter", "smollm2-135m"])
    assert result.exit_code == 1 and "install the train extra" in result.output


def test_cli_writes_the_head_into_the_cache_and_refuses_to_overwrite_a_training(tiny_gguf, tmp_path):
    from click.testing import CliRunner
    from specedge.apps.cli import cli
    model = shutil.copy(tiny_gguf, tmp_path / "tiny-target.gguf")
    args = ["train-drafter", str(model), "--prompts", "4", "--max-tokens", "6", "--steps", "2", "--minutes", "0.5",
            "--batch", "2", "--backend", "numpy", "--cache-dir", str(tmp_path / "cache")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    head = tmp_path / "cache" / "heads" / "tiny-target"
    meta = json.loads((head / "head.json").read_text())
    assert meta["target"]["model"] == "tiny-target" and meta["training"]["steps"] == 2
    assert meta["training"]["prompts"] == 4
    assert meta["training"]["command"] == "specedge train-drafter " + " ".join(args[1:])
    assert f"{head}: head of " in result.output and "tau_eval" in result.output
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 1 and "--resume continues it" in again.output


def test_the_runtime_drafter_runs_what_the_trainer_trained(tiny, tmp_path):
    """The trainer's torch head, written as head.npz/head.json, and the runtime's HeadRunner (float32 NumPy) over the
    same taps and tokens: step 0 from the fused taps and a chained step from its own output give the same logits
    (the file format and both readings of the math agree end to end)."""
    from specedge.export.train_head.artifact import head_arrays, manifest, write_head
    from specedge.runtime.drafters.head import HeadCache, HeadRunner
    from specedge.runtime.drafters.head_model import HeadModel, TargetEmbedding
    g, backend, _ = tiny
    cfg = HeadConfig.for_target(g.config, vocab_draft=17)
    embed = target_embedding(g)
    rng = np.random.default_rng(3)
    torch.manual_seed(3)
    head = build_head(cfg, embed).double()
    with torch.no_grad():  # float16-exact weights (what head.npz stores), norms away from 1
        for name, p in head.named_parameters():
            v = rng.uniform(0.5, 1.5, p.shape) if p.dim() == 1 else rng.standard_normal(p.shape) / np.sqrt(p.shape[1])
            p.copy_(torch.as_tensor(v.astype(np.float16).astype(np.float64)))
    d2t = np.sort(rng.choice(g.config.vocab_size, 17, replace=False))
    meta = manifest(cfg, model="tiny", gguf_sha256="t", config=g.config, taps=TAPS, training={})
    write_head(tmp_path / "head", head_arrays(head, d2t), meta)
    tokens = rng.integers(0, g.config.vocab_size, 10)
    taps = sequence_taps(backend, tokens.astype(np.int32), TAPS).astype(np.float64)  # [T, 3, D] (stored float16)
    outs = head(torch.as_tensor(taps[None]), torch.as_tensor(tokens[None]), 2)
    runner, loaded = HeadRunner(HeadModel.load(tmp_path / "head")), TargetEmbedding.from_array(embed)
    cache = HeadCache(cfg.n_kv_heads, cfg.head_dim, cfg.d_model)
    p = 6  # entries at positions 1..p + 1 from taps 0..p and tokens 1..p + 1; the last drafts x[p + 2]
    o = runner.step(cache, runner.fuse([taps[:p + 1, i] for i in range(3)]), loaded.rows(tokens[1:p + 2]),
                    np.arange(1, p + 2))[-1:]
    want0 = head.logits(outs[0][0, p]).detach().numpy()
    np.testing.assert_allclose(runner.logits(o)[0], want0, rtol=1e-4, atol=1e-4 * np.abs(want0).max())
    o = runner.step(cache, o, loaded.rows(tokens[p + 2:p + 3]), np.array([p + 2]))
    want1 = head.logits(outs[1][0, p + 1]).detach().numpy()
    np.testing.assert_allclose(runner.logits(o)[0], want1, rtol=1e-4, atol=1e-4 * np.abs(want1).max())
