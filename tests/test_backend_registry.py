"""What the backend registry and the backends declare instead of being probed (issue 40): each backend states in
caps.variance whether its verify batches equal one-token calls, why not and the fix; GGUF engines are opened from
one typed OpenSettings (the kernels as one enum, a gated engine's GateTuning) checked against the engine's traits;
one default thread count."""
import inspect
import os

import pytest

from specedge.assembly.auto import profile_device
from specedge.assembly.decoder import ModelSettings
from specedge.assembly.load import LoadedModel, batch_invariance_warning, load_model
from specedge.assembly.open import settings_from
from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.backends import (REGISTRY, BackendKind, GateTuning, Kernels, OpenSettings, info,
                                       open_backend)
from specedge.runtime.backends.base import BackendCaps, Variance, gate_variance, gpu_variance
from specedge.runtime.cores import MAX_DEFAULT_THREADS, default_threads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("registry") / "tiny.gguf", arch="llama", seed=0, n_layers=2,
                           dtype="q4_1")  # a format every GGUF engine runs
    return path, open_gguf(path)


def test_every_opener_takes_the_gguf_and_one_typed_settings_value_only():
    for engine in REGISTRY.values():
        if engine.open is None:
            continue
        params = inspect.signature(engine.open).parameters.values()
        assert [p.name for p in params] == ["gguf", "how"], engine.name  # no **kwargs tail swallowing keywords
        assert all(p.kind is not p.VAR_KEYWORD for p in params)


def test_kernels_are_fast_only_for_plain_decoding_on_an_engine_that_has_them():
    assert info("llamacpp").kernels(plain=True) is Kernels.FAST_PLAIN_ONLY
    assert info("ik").kernels(plain=True) is Kernels.FAST_PLAIN_ONLY
    assert info("llamacpp").kernels(plain=False) is Kernels.EXACT
    for name in ("numpy", "native", "onnx"):
        assert info(name).fast_kernels is None and info(name).kernels(plain=True) is Kernels.EXACT


def test_open_settings_an_engine_cannot_honour_are_refused_naming_the_fix(tiny):
    _, gguf = tiny
    with pytest.raises(ValueError, match="numpy backend has no faster plain-decoding kernels"):
        open_backend(BackendKind.NUMPY, gguf, OpenSettings(kernels=Kernels.FAST_PLAIN_ONLY))
    with pytest.raises(ValueError, match="no per-file gate"):
        open_backend(BackendKind.NUMPY, gguf, OpenSettings(tuning=GateTuning(max_call=8)))
    with pytest.raises(ValueError, match="runs exported artifacts"):
        open_backend(BackendKind.ONNX, gguf, OpenSettings())
    with pytest.raises(ValueError, match="max_call must be >= 1"):
        GateTuning(max_call=0)
    assert open_backend(BackendKind.NUMPY, gguf).caps.batch_invariant  # the defaults open anything


def test_load_model_refuses_fast_kernels_on_an_engine_without_them(tiny):
    path, _ = tiny
    with pytest.raises(ValueError, match="numpy backend has no faster plain-decoding kernels"):
        load_model(str(path), BackendKind.NUMPY, kernels=Kernels.FAST_PLAIN_ONLY)
    exact = load_model(str(path), BackendKind.NUMPY)
    assert exact.kernels is Kernels.EXACT and batch_invariance_warning(exact) is None


def test_settings_carry_the_kernels_as_the_enum():
    model, _ = settings_from("m", kernels="fast-plain-only")
    assert model.kernels is Kernels.FAST_PLAIN_ONLY
    assert ModelSettings("m").kernels is Kernels.EXACT
    with pytest.raises(ValueError, match="kernels must be one of Kernels.EXACT, Kernels.FAST_PLAIN_ONLY"):
        ModelSettings("m", kernels=False)  # the old boolean (exact_batches) is not taken for a kernel choice


def test_profile_keys_name_the_kernels_and_never_reuse_the_old_plain_kernels_key():
    assert profile_device(Kernels.EXACT) == "cpu"  # unchanged: exact-kernel profiles stay valid
    assert profile_device(Kernels.FAST_PLAIN_ONLY) == "cpu:fast-plain-only"
    assert profile_device(Kernels.FAST_PLAIN_ONLY) != "cpu:plain-kernels"  # old fast profiles: re-measured


def test_the_warning_is_what_the_backend_declares(tiny):
    path, _ = tiny
    base = load_model(str(path), BackendKind.NUMPY)
    why = Variance("is a made-up engine that rounds its batches its own way", "use another one")
    base.backend.caps = BackendCaps(variance=why)
    declared = LoadedModel(base.path, base.gguf, base.tokenizer, base.backend, base.kind)
    assert not declared.backend.caps.batch_invariant
    assert batch_invariance_warning(declared) == (
        "tiny.gguf is a made-up engine that rounds its batches its own way, so greedy speculative output may differ "
        "from plain greedy; use another one")
    assert "--gpu-layers 0" in gpu_variance("llama.cpp").warning("m.gguf")
    assert "at 2 threads" in gate_variance("ik_llama.cpp", 2).why and "--threads 1" in gate_variance("ik", 2).fix


def test_a_native_file_whose_gate_probe_failed_is_declared_not_batch_invariant(tiny):
    from specedge.runtime.backends import native_lib
    if native_lib.available() is not None:
        pytest.skip(native_lib.available())
    _, gguf = tiny
    exact = open_backend(BackendKind.NATIVE, gguf, OpenSettings(n_threads=1))
    assert exact.caps.variance is None
    failed = open_backend(BackendKind.NATIVE, gguf, OpenSettings(n_threads=1, tuning=GateTuning(batch_invariant=False)))
    assert failed.caps.variance == gate_variance("native", 1)


def test_an_ik_file_whose_gate_probe_failed_names_ik_not_llama_cpp(tiny):
    pytest.importorskip("ik_llama_cpp")
    _, gguf = tiny
    failed = open_backend(BackendKind.IK, gguf, OpenSettings(64, 2, tuning=GateTuning(max_call=4,
                                                                                    batch_invariant=False)))
    assert failed.max_call == 4 and failed.caps.variance == gate_variance("ik_llama.cpp", 2)
    assert "--backend ik is batch-invariant" not in failed.caps.variance.warning("tiny.gguf")


def test_llamacpp_declares_why_it_is_not_batch_invariant_for_how_it_was_opened(tiny):
    pytest.importorskip("llama_cpp")
    _, gguf = tiny
    one = open_backend(BackendKind.LLAMACPP, gguf, OpenSettings(64, 1))
    assert one.caps.variance is None
    two = open_backend(BackendKind.LLAMACPP, gguf, OpenSettings(64, 2))
    assert "thread count" in two.caps.variance.why and "--threads 1" in two.caps.variance.fix
    fast = open_backend(BackendKind.LLAMACPP, gguf, OpenSettings(64, 1, Kernels.FAST_PLAIN_ONLY))
    assert "without flash attention" in fast.caps.variance.why and "--drafter" in fast.caps.variance.fix


def test_one_default_thread_count():
    assert default_threads(3) == 3
    assert default_threads() == default_threads(None) == min(os.cpu_count() or 1, MAX_DEFAULT_THREADS)


def test_the_serve_thread_probe_is_keyed_by_the_kernels(tiny, tmp_path):
    from specedge.apps.serve_threads import probe_key
    from specedge.assembly.decoder import DecodeSettings, Decoder
    path, _ = tiny
    loaded = load_model(str(path), BackendKind.NUMPY)
    drafterless = settings_from(str(path), drafter="none")[1]
    exact = Decoder(loaded, ModelSettings(str(path), BackendKind.NUMPY), drafterless)
    fast = Decoder(loaded, ModelSettings(str(path), BackendKind.NUMPY, kernels=Kernels.FAST_PLAIN_ONLY),
                   DecodeSettings(drafter=drafterless.drafter))
    assert probe_key(exact) != probe_key(fast)


def test_an_engine_on_its_own_threads_sets_numpy_s_blas_to_one_thread(tiny):
    """OpenBLAS's workers spin after each call on the cores an engine's threads need (runtime/backends/blas.py):
    opening the native engine, or any but the NumPy reference, sets BLAS to one thread for the process; the
    reference alone keeps BLAS's threads. In a fresh process (the limit is process-wide)."""
    import subprocess
    import sys
    from specedge.runtime.backends import native_lib
    if native_lib.available() is not None:
        pytest.skip(f"native engine not built: {native_lib.available()}")
    script = f"""
import os
from threadpoolctl import threadpool_info, threadpool_limits
threadpool_limits(2, user_api="blas")  # as OpenBLAS starts on 2 cores, whatever this machine has
from specedge.models.gguf_in import open_gguf
from specedge.runtime.backends import BackendKind, OpenSettings, info
blas = lambda: sorted({{p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}})
g = open_gguf({str(tiny[0])!r})
info(BackendKind.NUMPY).open_gguf(g, OpenSettings(n_threads=2))
print(blas())
info(BackendKind.NATIVE).open_gguf(g, OpenSettings(n_threads=2))
print(blas())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[2]", "[1]"]
