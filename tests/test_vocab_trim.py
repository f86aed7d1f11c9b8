"""VocabTrim (docs/algorithms.md 2.2): calibration -> top-N ids, trimmed drafter / head graphs, lossless drafting."""
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from specedge.assembly.load import DrafterSpec, LoadedModel, load_onnx, make_drafter  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.export.onnx_export import GGUFSource, export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import ExportOptions, WeightFormat  # noqa: E402
from specedge.export.vocab_trim import calibrate, top_ids, write_drafter_vocab  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.manifest import read_manifest  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import BackendKind  # noqa: E402
from specedge.runtime.backends.fake import MarkovBackend, random_markov_table  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnxrt import OnnxBackend  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.model import ModelDrafter  # noqa: E402
from specedge.runtime.stats import DecodeStats  # noqa: E402
from specedge.runtime.tokenizer import Tokenizer  # noqa: E402
from specedge.runtime.types import SamplingParams  # noqa: E402
from specedge.runtime.vocab_trim import TrimmedHead, drafter_manifest, expand_logits, read_drafter_vocab  # noqa: E402

from test_decode import assert_counts_match, exact_joint  # noqa: E402

PROMPT = np.array([5, 9, 3, 7, 5, 9, 3, 2], np.int32)


def test_top_ids_counts_ties_and_kept_ids():
    counts = np.array([5, 0, 3, 3, 9, 0])
    assert top_ids(counts, 3).tolist() == [0, 2, 4]  # tie 2/3 goes to the lower id
    assert top_ids(counts, 3, keep=[5]).tolist() == [0, 4, 5]  # special ids always kept
    assert top_ids(counts, 6).tolist() == list(range(6))
    with pytest.raises(ValueError, match="between 2"):
        top_ids(counts, 1, keep=[1, 5])


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory):
    """A tiny Q4_1 model, its int4 artifact (float activations: exact), and a VocabTrim head over ids that keep
    some of the target's greedy tokens and drop others."""
    d = tmp_path_factory.mktemp("vocab-trim")
    gguf = open_gguf(write_tiny_gguf(d / "tiny.gguf", dtype="q4_1", seed=7))
    art = d / "int4"
    export_gguf_to_onnx(gguf, art, WeightFormat.INT4, accuracy_level=0, gate=False)
    tok = Tokenizer(gguf.tokenizer_spec())
    counts, n = calibrate(NumpyBackend(gguf.load_weights()), tok, ["the cat sat", "a dog and the man"], max_tokens=12)
    assert counts.sum() == n > 0
    plain = [e.token for e in decode(OnnxBackend(art, threads=1), PROMPT, PLAIN, Request(max_tokens=24))]
    counts[plain[::2]] += 1000  # on the list: every other greedy token; the rest only if calibration put them there
    counts[plain[1::2]] = -1
    V = gguf.config.vocab_size
    ids = top_ids(counts, 48, keep=tok.eos_ids)
    assert set(plain) - set(ids.tolist()), "the test needs greedy tokens off the list"
    write_drafter_vocab(art, GGUFSource(gguf), gguf.config, ExportOptions(WeightFormat.INT4, accuracy_level=0), ids,
                        None)
    return gguf, art, ids, plain, V


def test_manifest_round_trips_the_ids(trimmed):
    gguf, art, ids, _, V = trimmed
    m = read_manifest(art, verify=True)  # the id file and both graphs are hashed in `files`
    assert {"drafter_vocab.json", "drafter.onnx", "head.onnx"} <= set(m.raw["files"])
    vocab = read_drafter_vocab(m)
    assert np.array_equal(vocab.ids, ids) and vocab.n == 48 and vocab.vocab_size == V
    full = expand_logits(np.arange(2 * 48, dtype=np.float32).reshape(2, 48), vocab.ids, V)
    assert full.shape == (2, V) and np.array_equal(full[:, ids], np.arange(96).reshape(2, 48))
    assert np.isneginf(np.delete(full, ids, axis=1)).all()
    original = (art / "drafter_vocab.json").read_bytes()
    try:
        (art / "drafter_vocab.json").write_text('{"ids": [1, 2]}\n')
        with pytest.raises(ModelFileError, match="does not match the SHA-256"):
            read_manifest(art, verify=True)
    finally:
        (art / "drafter_vocab.json").write_bytes(original)


def test_trimmed_logits_equal_the_full_logits_at_those_rows(trimmed):
    gguf, art, ids, _, V = trimmed
    m = read_manifest(art)
    full, trim = OnnxBackend(m, threads=1), OnnxBackend(drafter_manifest(m, read_drafter_vocab(m)), threads=1)
    toks = np.random.default_rng(1).integers(0, V, 20).astype(np.int32)
    a, b = full.forward(toks, full.new_cache(32)), trim.forward(toks, trim.new_cache(32))
    assert b.shape == (20, 48)
    np.testing.assert_allclose(b, a[:, ids], atol=1e-5)
    ref = NumpyBackend(gguf.load_weights())
    h, _ = ref.hidden(toks, ref.new_cache(32), plan=None, tree_mask=None, taps=())
    head = TrimmedHead(m, read_drafter_vocab(m)).logits(h)
    np.testing.assert_allclose(head, ref.logits_from_hidden(h, rows=ids), atol=1e-4)


def test_greedy_with_a_trimmed_drafter_equals_plain(trimmed):
    gguf, art, ids, plain, V = trimmed
    target = load_onnx(str(art), device="cpu", threads=1)
    drafter = make_drafter(DrafterSpec.parse(f"model:{art}"), target, device="cpu", threads=1)
    assert np.array_equal(drafter.vocab_ids, ids) and "vocab 48" in drafter.name
    stats = DecodeStats()
    spec = [e.token for e in decode(target.backend, PROMPT, Speculation(drafter, k=3), Request(max_tokens=24),
                                    stats=stats)]
    assert spec == plain
    assert 0 < stats.n_accepted < stats.n_drafted  # on-list tokens accepted, off-list ones recovered from p
    assert isinstance(target, LoadedModel) and target.kind is BackendKind.ONNX and target.vocab_ids is None


class TrimmedMarkov(MarkovBackend):
    """A Markov draft model whose head keeps the columns `ids`: logits [T, N], config.vocab_size stays V."""

    def __init__(self, table, ids):
        super().__init__(table)
        self.ids = ids

    def forward(self, tokens, cache, **kw):
        return super().forward(tokens, cache, **kw)[:, self.ids]


@pytest.mark.slow
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.9)],
                         ids=["t1", "t0.8p0.9"])
def test_sampling_with_a_trimmed_q_reproduces_the_target_distribution(params):
    """q is zero off the list (ids 1 and 4 are never drafted), yet decode() emits the target's joint distribution."""
    V, n, trials = 5, 3, 12000
    P, Q = random_markov_table(V, seed=3, scale=1.0), random_markov_table(V, seed=4, scale=1.0)
    ids = np.array([0, 2, 3])
    target, rng, counts = MarkovBackend(P), np.random.default_rng(7), Counter()
    prompt = np.array([0, 1, 0], np.int32)
    drafted = set()
    for _ in range(trials):
        drafter = ModelDrafter(TrimmedMarkov(Q, ids), vocab_ids=ids)
        d = drafter.propose(prompt, 2, params, rng)
        drafted.update(d.tokens.tolist())
        assert np.all(d.q[:, [1, 4]] == 0) and np.allclose(d.q.sum(1), 1)
        counts[tuple(e.token for e in decode(target, prompt, Speculation(drafter, k=2),
                                             Request(params, max_tokens=n, seed=int(rng.integers(1 << 62)))))] += 1
    assert drafted <= {0, 2, 3}
    assert sum(c for s, c in counts.items() if {1, 4} & set(s)) > 0.02 * trials  # off-list tokens emitted
    assert_counts_match(counts, exact_joint(P, Q, int(prompt[-1]), params, n), trials)


def test_cli_export_drafter_vocab_then_generate_is_lossless(tmp_path):
    """`specedge export --drafter-vocab` calibrates on the target's completions (llama.cpp when installed) and the
    trimmed drafter found in the manifest gives the target's greedy output."""
    import json
    from click.testing import CliRunner
    from specedge.apps.cli import cli

    def run(*args):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    target, draft = write_tiny_gguf(tmp_path / "t.gguf", seed=0), write_tiny_gguf(tmp_path / "d.gguf", seed=1,
                                                                                  n_layers=1)
    for src, out, extra in ((target, "t-onnx", ()), (draft, "d-onnx", ("--drafter-vocab", 64, "--calib-target",
                                                                     target, "--calib-limit", 2, "--calib-tokens", 8))):
        r = run("export", src, "--format", "onnx", "--weights", "fp32", "--out", tmp_path / out, "--threads", 1, *extra)
        assert r.exit_code == 0, r.output
    assert "drafter vocabulary: 64 of" in r.stderr
    section = json.loads((tmp_path / "d-onnx" / "manifest.json").read_text())["drafter_vocab"]
    assert section["n"] == 64 and section["calibration"]["prompts"] == 2 and section["calibration"]["generated"] > 0
    r = run("generate", tmp_path / "t-onnx", "hello world", "--backend", "onnx", "--device", "cpu", "--threads", 1,
            "--drafter", f"model:{tmp_path / 'd-onnx'}", "--max-tokens", 20, "--json", "--baseline",
            "--temperature", "0")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["identical_to_baseline"] is True  # make_drafter picks the trimmed graph: test_greedy_with_...
