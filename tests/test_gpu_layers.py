"""--gpu-layers (issue 31, part 0): llama.cpp's n_gpu_layers reaches the engine from the CLI, the Engine and the plan;
its default is all layers where the installed build offloads (llama_supports_gpu_offload) and 0 elsewhere, so a CPU
build runs exactly as before; a request that cannot be honoured is refused with the fix.

The CI machines have CPU builds only: an offloading build is stood in for by declaring the engine's probe true (the
real llama.cpp then receives n_gpu_layers -1 and, finding no GPU device, runs on the CPU)."""
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.assembly import plan as planmod
from specedge.assembly import plan_run
from specedge.assembly.decoder import ModelSettings
from specedge.assembly.load import batch_invariance_warning, load_model
from specedge.assembly.open import settings_from, wants_plan
from specedge.assembly.decoder import DecodeSettings
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.backends import ALL_LAYERS, BackendKind, describe_gpu_layers, info, parse_gpu_layers
from specedge.runtime.backends import registry

llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gpu") / "tiny.gguf", seed=0, n_layers=2, dtype="q4_1")


@pytest.fixture
def offloading_build(monkeypatch):
    """The llama.cpp engine as a GPU build declares itself (Metal, CUDA, Vulkan)."""
    engine = replace(registry.REGISTRY[BackendKind.LLAMACPP], gpu_offload=lambda: True)
    monkeypatch.setitem(registry.REGISTRY, BackendKind.LLAMACPP, engine)
    return engine


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_parse_gpu_layers_takes_a_count_or_all():
    assert parse_gpu_layers("all") == parse_gpu_layers("ALL") == parse_gpu_layers("-1") == ALL_LAYERS
    assert parse_gpu_layers("0") == 0 and parse_gpu_layers(" 12 ") == 12 and parse_gpu_layers(7) == 7
    for bad in ("-2", "x", "1.5", -3):
        with pytest.raises(ValueError, match="number of layers .* or 'all'"):
            parse_gpu_layers(bad)
    with pytest.raises(ValueError, match="or 'all'"):
        ModelSettings("m", gpu_layers=-5)
    assert describe_gpu_layers(0) == "on the CPU"
    assert describe_gpu_layers(ALL_LAYERS, 30) == describe_gpu_layers(30, 30) == "all layers on the GPU"
    assert describe_gpu_layers(12, 30) == "12 of 30 layers on the GPU"


def test_the_default_follows_the_build_and_a_cpu_build_is_unchanged(tiny):
    engine = info(BackendKind.LLAMACPP)
    assert engine.offloads() == bool(llama_cpp.llama_supports_gpu_offload())
    if engine.offloads():
        pytest.skip("this llama-cpp-python build offloads: the CPU-build default is not testable here")
    assert engine.gpu_layers(None) == 0 and engine.gpu_layers(0) == 0
    said = []
    loaded = load_model(str(tiny), BackendKind.LLAMACPP, ctx=64, threads=1, log=said.append)
    assert loaded.backend.gpu_layers == 0 and loaded.backend._llm.model_params.n_gpu_layers == 0
    assert loaded.backend.caps.batch_invariant  # 1 thread, flash attention: as before this option existed
    assert not any("GPU" in m for m in said)
    explicit = load_model(str(tiny), BackendKind.LLAMACPP, ctx=64, threads=1, gpu_layers=0)
    ids = np.arange(1, 9, dtype=np.int32)
    np.testing.assert_array_equal(loaded.backend.forward(ids, loaded.backend.new_cache(16)),
                                  explicit.backend.forward(ids, explicit.backend.new_cache(16)))


def test_a_request_a_cpu_build_cannot_honour_is_refused_with_the_fix(tiny):
    if info(BackendKind.LLAMACPP).offloads():
        pytest.skip("this llama-cpp-python build offloads")
    for layers in (ALL_LAYERS, 4):
        with pytest.raises(ValueError, match=r"no GPU offload .*--gpu-layers 0"):
            load_model(str(tiny), BackendKind.LLAMACPP, ctx=64, threads=1, gpu_layers=layers)
    r = run("generate", tiny, "Hi", "--backend", "llamacpp", "--gpu-layers", "all", "--max-tokens", 4)
    assert r.exit_code != 0 and "has no GPU offload" in r.output and "--gpu-layers 0" in r.output
    r = run("generate", tiny, "Hi", "--backend", "llamacpp", "--gpu-layers", "lots", "--max-tokens", 4)
    assert r.exit_code == 2 and "or 'all'" in r.output


def test_engines_without_layers_to_offload_refuse_the_option(tiny):
    with pytest.raises(ValueError, match=r"the numpy backend has no layers to put on a GPU \(its build runs on"):
        load_model(str(tiny), BackendKind.NUMPY, gpu_layers=2)
    with pytest.raises(ValueError, match=r"the onnx backend has no layers to put on a GPU \(it takes --device"):
        info(BackendKind.ONNX).gpu_layers(ALL_LAYERS)
    with pytest.raises(ValueError, match="the ik_llama.cpp backend has no layers"):  # its pinned wheel: a CPU build
        info(BackendKind.IK).gpu_layers(4)
    assert info(BackendKind.NUMPY).gpu_layers(None) == info(BackendKind.ONNX).gpu_layers(0) == 0
    assert info(BackendKind.IK).gpu_layers(None) == 0


def test_on_an_offloading_build_all_layers_reach_llama_cpp_by_default(tiny, offloading_build):
    said = []
    loaded = load_model(str(tiny), BackendKind.LLAMACPP, ctx=64, threads=1, log=said.append)
    assert loaded.backend.gpu_layers == ALL_LAYERS
    # what llama_model_load_from_file got: all (llama-cpp-python passes -1 as INT32_MAX)
    assert loaded.backend._llm.model_params.n_gpu_layers in (ALL_LAYERS, 2**31 - 1)
    assert not loaded.backend.caps.batch_invariant  # GPU kernels are chosen by batch width: no lossless claim
    assert "llama.cpp: all layers on the GPU (--gpu-layers 0 keeps them on the CPU)" in said
    assert "runs on the GPU" in batch_invariance_warning(loaded)  # what an explicit drafter is told
    some = load_model(str(tiny), BackendKind.LLAMACPP, ctx=64, threads=1, gpu_layers=1, log=said.append)
    assert some.backend._llm.model_params.n_gpu_layers == 1 and said[-1].startswith("llama.cpp: 1 of 2 layers")
    cpu = load_model(str(tiny), BackendKind.LLAMACPP, ctx=64, threads=1, gpu_layers=0)
    assert cpu.backend._llm.model_params.n_gpu_layers == 0 and cpu.backend.caps.batch_invariant


def test_the_cli_and_the_engine_pass_gpu_layers_as_a_typed_setting(tiny, offloading_build, monkeypatch):
    model_s, decode_s = settings_from(str(tiny), gpu_layers="all")
    assert model_s.gpu_layers == ALL_LAYERS and not wants_plan(model_s, decode_s)  # says where it runs: no plan
    assert wants_plan(ModelSettings(str(tiny)), DecodeSettings())
    seen = []
    real = registry._open_llamacpp

    def spy(gguf, how):
        seen.append(how.gpu_layers)
        return real(gguf, how)
    monkeypatch.setitem(registry.REGISTRY, BackendKind.LLAMACPP, replace(offloading_build, open=spy))
    r = run("generate", tiny, "Hi", "--backend", "llamacpp", "--drafter", "none", "--gpu-layers", "1",
            "--max-tokens", 4, "--threads", 1, "--temperature", 0)
    assert r.exit_code == 0, r.output
    from specedge import Engine
    Engine.open(str(tiny), backend="llamacpp", drafter="none", gpu_layers="all", threads=1, ctx=64)
    assert seen == [1, ALL_LAYERS]


def test_the_plan_says_where_the_layers_run_and_keys_on_it(tiny, offloading_build):
    cpu = {k: v for k, v in planmod.device_fingerprint().items() if k != "gpu_offload"}
    assert planmod.device_fingerprint()["gpu_offload"][0] == "llamacpp"
    assert planmod.plan_key("f", 2, ()) != planmod.plan_key("f", 2, (), cpu)  # a GPU build re-plans
    targets = plan_run.discover_targets(str(tiny), plan_run.PlanSettings(weights=(), export=False))
    llama = next(t for t in targets if t.engine == "llamacpp")
    assert llama.label == "llama.cpp q4_1 GPU"
