"""The ik_llama.cpp engine (runtime/backends/ik.py): its binding checks the ABI it relies on, it computes what the
NumPy reference computes on tiny models, its verify batches equal one-token calls (so speculation on it is
token-identical to its plain decoding at any thread count), and its per-file gate (assembly/engine_gate.py)
admits files and bounds their call size. Real-model checks are marked `real` (SmolLM2's Q4_1 file: calls of 32+
rows are wrong, the gate keeps them at 16; gemma3-270m is admitted)."""
import ctypes
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ik_llama_cpp")

import specedge  # noqa: E402
from specedge.assembly import engine_gate  # noqa: E402
from specedge.models.catalog import resolve_model  # noqa: E402
from specedge.models.errors import ModelFileError  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import BackendKind, GateTuning, Kernels, OpenSettings, backend_names, info  # noqa: E402
from specedge.runtime.backends import ik, ik_lib  # noqa: E402
from specedge.runtime.backends.base import FeedingBackend  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402

PROMPTS = ["the cat sat on the mat and the cat sat on the", "one two three one two three one two",
           "hello world, hello world", "a b c d e f g a b c"]


@pytest.fixture(scope="module", params=TINY_ARCHS)
def tiny(request, tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("ik") / f"{request.param}.gguf", arch=request.param, seed=0,
                           n_layers=2)
    return path, open_gguf(path)


def test_the_library_loads_with_its_abi_checked():
    lib = ik_lib.load_library()
    assert "AVX2 = 1" in ik_lib.system_info()
    ik_lib.check_abi(lib, Path("libllama.so"))  # passes on the pinned wheel


def test_a_struct_layout_that_is_not_the_library_s_is_refused():
    """A ctypes struct missing a field: the library writes past its end, and the probe refuses it."""
    lib = ik_lib.load_library()

    class Short(ctypes.Structure):
        _fields_ = ik_lib.ContextParams._fields_[:-1]

    assert ik_lib._sret_extent(lib, "llama_context_default_params") > ctypes.sizeof(Short)
    saved = dict(ik_lib.SIZES)
    try:
        ik_lib.SIZES[ik_lib.ContextParams] = ctypes.sizeof(ik_lib.ContextParams) + 8
        with pytest.raises(ImportError, match="ik-llama-cpp-python==0.1.5"):
            ik_lib.check_abi(lib, Path("libllama.so"))
    finally:
        ik_lib.SIZES.clear()
        ik_lib.SIZES.update(saved)


def test_registered_as_one_backend():
    engine = info("ik")
    assert engine.kind is BackendKind.IK and engine.gated and engine.planned and engine.installed()
    assert "ik" in backend_names()


def test_logits_match_the_numpy_reference_on_tiny_models(tiny):
    path, gguf = tiny
    backend = ik.IkBackend(path, gguf.config, n_ctx=256, n_threads=2)
    ref = NumpyBackend(gguf.load_weights())
    ids = np.arange(3, 60, dtype=np.int32)
    got, want = backend.forward(ids, backend.new_cache(64)), ref.forward(ids, ref.new_cache(64))
    assert np.abs(got - want).max() < 0.05 and (got.argmax(1) == want.argmax(1)).all()


@pytest.mark.parametrize("threads", [1, 2])
def test_verify_batches_equal_one_token_calls_at_every_width(tiny, threads):
    path, gguf = tiny
    backend = ik.IkBackend(path, gguf.config, n_ctx=256, n_threads=threads)
    assert ik.batch_invariant(backend, range(2, 10), (8, 60))


def test_rollback_then_the_same_tokens_give_the_same_logits(tiny):
    path, gguf = tiny
    backend = ik.IkBackend(path, gguf.config, n_ctx=256, n_threads=2)
    cache = backend.new_cache(64)
    backend.forward(np.arange(3, 20, dtype=np.int32), cache)
    first = backend.forward(np.array([7, 8, 9], np.int32), cache)
    cache.rollback(17)
    assert np.array_equal(backend.forward(np.array([7, 8, 9], np.int32), cache), first) and cache.length == 20


def test_feed_appends_what_forward_appends_without_the_logits(tiny):
    """A prompt fed (FeedingBackend: one logits row per call) leaves the cache a forward would: the next tokens'
    logits are equal bit for bit, and decoding goes through it (runtime/steppers.prefill)."""
    path, gguf = tiny
    backend = ik.IkBackend(path, gguf.config, n_ctx=256, n_threads=2)
    ids, nxt = np.arange(3, 90, dtype=np.int32), np.array([7, 8, 9], np.int32)
    cache = backend.new_cache(128)
    backend.forward(ids, cache)
    want = backend.forward(nxt, cache)
    cache = backend.new_cache(128)
    assert backend.feed(ids, cache) is None and cache.length == len(ids)
    assert np.array_equal(backend.forward(nxt, cache), want) and cache.length == len(ids) + 3
    assert isinstance(backend, FeedingBackend)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram", "model:{path}", "model:{path}+lookup"])
def test_speculation_on_ik_equals_its_plain_decoding(tiny, tmp_path, drafter):
    path, _ = tiny
    common = dict(backend="ik", threads=2, ctx=256, cache_dir=tmp_path)
    spec = specedge.Engine.open(str(path), drafter=drafter.format(path=path), **common)
    plain = specedge.Engine.open(str(path), drafter="none", **common)
    assert spec.model.backend.caps.batch_invariant  # the gate's probe found it so
    for text in PROMPTS:
        want = plain.generate(text, temperature=0, max_tokens=40).tokens
        got = spec.generate(text, temperature=0, max_tokens=40)
        assert got.tokens == want, (drafter, text)


@pytest.mark.slow
def test_the_gate_is_cached_per_file_and_threads(tiny, tmp_path):
    path, _ = tiny
    first = engine_gate.engine_gate(path, info("ik"), threads=2, cache_dir=tmp_path)
    assert first.passed and first.invariant and first.reference == "numpy"
    again = engine_gate.engine_gate(path, info("ik"), threads=2, cache_dir=tmp_path)
    assert again == first  # read back, not re-measured
    assert len(list((tmp_path / "gates").glob("*.json"))) == 1
    engine_gate.engine_gate(path, info("ik"), threads=1, cache_dir=tmp_path)
    assert len(list((tmp_path / "gates").glob("*.json"))) == 2


def test_a_file_no_call_size_computes_faithfully_is_refused_with_its_figures(tiny, tmp_path, monkeypatch):
    """As if ik computed every call size wrongly (its argmax off by one id): the load names the engine, the file,
    the figures and the fix."""
    path, _ = tiny
    real = engine_gate._argmax

    def wrong_on_ik(backend, sequences, call=None):
        got = real(backend, sequences, call)
        return [(g + 1) % backend.config.vocab_size for g in got] if isinstance(backend, ik.IkBackend) else got

    monkeypatch.setattr(engine_gate, "_argmax", wrong_on_ik)
    key = engine_gate.gate_key(path, info("ik"), 2)
    gate = engine_gate.measure_gate(path, info("ik"), 2, key)  # in this process (the patch does not reach a child)
    assert not gate.passed and gate.agreement == {"256": 0.0, "16": 0.0}
    engine_gate.save_gate(gate, tmp_path)  # as if cached
    with pytest.raises(ModelFileError, match="refuses .*0.0% at 16-token calls.*--backend llamacpp"):
        specedge.Engine.open(str(path), backend="ik", drafter="none", threads=2, cache_dir=tmp_path)


def test_an_engine_that_dies_on_a_file_fails_its_gate_not_the_caller(tiny, tmp_path, monkeypatch):
    """The gate measures in a child process: an abort there (as ik's on a GGUF it mishandles) is a refused file."""
    path, _ = tiny
    monkeypatch.setattr(engine_gate, "_child_command",
                        lambda *a: [engine_gate.sys.executable, "-c", "import os, sys; sys.stderr.write('GGML_ASSERT"
                                    "(eps > 0.0f) failed'); sys.stderr.flush(); os.abort()"])
    gate = engine_gate.engine_gate(path, info("ik"), threads=2, cache_dir=tmp_path)
    assert not gate.passed and gate.crashed.startswith("signal 6") and "GGML_ASSERT" in gate.summary()
    assert engine_gate.engine_gate(path, info("ik"), threads=2, cache_dir=tmp_path) == gate  # cached: refused


def test_a_dropped_backend_frees_its_model_at_once(tiny):
    """ik's ggml holds at most 64 contexts, a few per loaded model: a backend must not wait for Python's cycle
    collector (a cache referring back to it) or twenty-odd loads later the next one fails."""
    import gc
    path, gguf = tiny
    gc.disable()
    try:
        for _ in range(40):
            backend = ik.IkBackend(path, gguf.config, n_ctx=64, n_threads=1)
            cache = backend.new_cache(8)
            backend.forward(np.array([3, 4], np.int32), cache)
            del backend, cache
    finally:
        gc.enable()


def test_repacked_weights_are_plain_decoding_kernels_only(tmp_path):
    """ik's run-time repacking (the registry's plain kernels for ik): on a Q4_0 file every weight matrix but the
    embedding changes layout (Q4_0 -> Q4_0_R8), the backend declares itself not batch-invariant and the probe agrees
    (its interleaved kernels take one-row shortcuts), and its logits stay those of the same model. A file with
    nothing to repack (F32) stays exact."""
    q4 = write_tiny_gguf(tmp_path / "q4_0.gguf", arch="llama", seed=0, n_layers=2, dtype="q4_0")
    gguf = open_gguf(q4)
    exact = ik.IkBackend(q4, gguf.config, n_ctx=256, n_threads=2)
    packed = ik.IkBackend(q4, gguf.config, n_ctx=256, n_threads=2, repack=True)
    assert exact.repacked == 0 and exact.caps.batch_invariant
    assert packed.repacked == 2 * 7 and not packed.caps.batch_invariant  # q, k, v, o, gate, up, down per layer
    assert not ik.batch_invariant(packed, range(2, 10), (8, 60))
    ids = np.arange(3, 60, dtype=np.int32)
    got, want = packed.forward(ids, packed.new_cache(64)), exact.forward(ids, exact.new_cache(64))
    assert np.abs(got - want).max() < 0.5 and (got.argmax(1) == want.argmax(1)).mean() > 0.9
    f32 = write_tiny_gguf(tmp_path / "f32.gguf", arch="llama", seed=0, n_layers=2, dtype="f32")
    same = ik.IkBackend(f32, open_gguf(f32).config, n_ctx=256, n_threads=2, repack=True)
    assert same.repacked == 0 and same.caps.batch_invariant


@pytest.mark.slow
def test_the_gate_admits_plain_kernels_only_where_they_are_faithful(tmp_path, monkeypatch):
    """The gate measures the repacked weights as it measures call sizes; a load for plain decoding
    (Kernels.FAST_PLAIN_ONLY, as a plan's plain ik choice) repacks only where they passed, and a file with nothing to
    repack records none."""
    from specedge.assembly.load import batch_invariance_warning, load_model
    q4 = write_tiny_gguf(tmp_path / "q4_0.gguf", arch="llama", seed=0, n_layers=2, dtype="q4_0")
    gate = engine_gate.engine_gate(q4, info("ik"), threads=2, cache_dir=tmp_path)
    assert gate.plain is not None and gate.plain_faithful and "plain-decoding kernels" in gate.summary()
    fast = load_model(str(q4), BackendKind.IK, threads=2, ctx=64, cache_dir=tmp_path, kernels=Kernels.FAST_PLAIN_ONLY)
    assert fast.backend.repacked > 0 and not fast.backend.caps.batch_invariant
    assert "(ik_llama.cpp repacked)" in batch_invariance_warning(fast)  # what a drafter on it is told
    exact = load_model(str(q4), BackendKind.IK, threads=2, ctx=64, cache_dir=tmp_path)
    assert exact.backend.repacked == 0 and exact.backend.caps.batch_invariant
    f32 = write_tiny_gguf(tmp_path / "f32.gguf", arch="llama", seed=0, n_layers=2, dtype="f32")
    assert engine_gate.engine_gate(f32, info("ik"), threads=2, cache_dir=tmp_path).plain is None
    # as if the repacked weights computed this file wrongly: plain decoding keeps the exact kernels
    monkeypatch.setattr(engine_gate, "_plain_agreement", lambda *a: 0.0)
    key = engine_gate.gate_key(q4, info("ik"), 2)
    bad = engine_gate.measure_gate(q4, info("ik"), 2, key)
    assert bad.passed and not bad.plain_faithful
    engine_gate.save_gate(bad, tmp_path)
    kept = load_model(str(q4), BackendKind.IK, threads=2, ctx=64, cache_dir=tmp_path, kernels=Kernels.FAST_PLAIN_ONLY)
    assert kept.backend.repacked == 0 and kept.backend.caps.batch_invariant


# ---- the real models ----------------------------------------------------------------------------------------------

@pytest.mark.real
@pytest.mark.slow
def test_the_gate_limits_smollm2_q4_1_to_16_token_calls_and_admits_gemma3(tmp_path):
    """SmolLM2's Q4_1 file: ik's GEMM for 32+ rows drops the tail blocks of its 576-wide rows, so a 32-token call
    already agrees with the reference at about a third of the positions; the gate keeps its calls at 16 (as
    faithful as mainline). Gemma 3 270M (Q4_K_M, 640-wide) is faithful at 256-token calls."""
    engine = info("ik")
    smol = engine_gate.engine_gate(resolve_model("smollm2-135m"), engine, threads=2, cache_dir=tmp_path)
    assert smol.max_call == 16 and smol.invariant, smol.summary()
    assert smol.agreement["256"] < 0.6 and smol.agreement["16"] >= smol.baseline - engine_gate.GATE_MARGIN
    gguf = open_gguf(resolve_model("smollm2-135m"))
    seqs = engine_gate._sequences(gguf, engine, 2)
    ref, _ = engine_gate._reference(gguf.path, gguf, seqs, engine, 2)
    at32 = engine.open_gguf(gguf, OpenSettings(engine_gate._ctx(seqs), 2, tuning=GateTuning(max_call=32)))
    assert engine_gate._agreement(engine_gate._argmax(at32, seqs), ref) < engine_gate.GATE_FLOOR  # would fail
    gemma = engine_gate.engine_gate(resolve_model("gemma3-270m"), engine, threads=2, cache_dir=tmp_path)
    assert gemma.passed and gemma.invariant and gemma.max_call >= 16, gemma.summary()
    assert max(gemma.prefixes) > 512  # probed past the sliding window, where ik's flash attention is not exact
    assert gemma.plain is not None  # its Q4_K/Q6_K layers repack: the gate measured the plain kernels too
    assert smol.plain is None  # Q4_1: nothing to repack


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
@pytest.mark.parametrize("threads", [1, 2])
def test_real_models_are_batch_invariant_on_ik(model, threads, tmp_path):
    gguf = open_gguf(resolve_model(model))
    backend = ik.IkBackend(gguf.path, gguf.config, n_ctx=1024, n_threads=threads)
    window = max(gguf.config.block.windows(), default=0)
    assert ik.batch_invariant(backend, range(2, 10), (40, 200) + ((window + 24,) if window else ()))


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("model,drafter", [("smollm2-135m", "ngram"), ("smollm2-135m", "model:smollm2-135m+lookup"),
                                           ("gemma3-270m", "ngram")])
def test_real_speculation_on_ik_equals_plain_on_dev_prompts(model, drafter):
    """At 2 threads (where mainline llama.cpp's speculation is not exact): 4 dev prompts x 40 tokens, greedy."""
    from specedge.assembly.devset import load_prompts
    common = dict(backend="ik", threads=2, ctx=1024)
    plain = specedge.Engine.open(model, drafter="none", **common)
    spec = specedge.Engine.open(model, drafter=drafter, **common)
    for p in load_prompts(limit=4, by="task"):
        ids = plain.tokenizer.chat_ids(p.text)
        want = plain.generate(ids, temperature=0, max_tokens=40).tokens
        assert spec.generate(ids, temperature=0, max_tokens=40).tokens == want, (model, drafter, p.qid)
