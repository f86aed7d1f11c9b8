"""--device openvino[:CPU|GPU|NPU] (runtime/backends/onnx_providers.py): the device parsing, the provider choice and
its errors everywhere; on a machine with an OpenVINO execution provider that has a CPU device (the
onnxruntime-ep-openvino plugin on an Intel CPU, or the onnxruntime-openvino build of onnxruntime on any x86 CPU),
the static and dynamic profiles on OpenVINO's CPU device against the NumPy reference, lossless speculative
decoding there, and the CLI."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

ort = pytest.importorskip("onnxruntime")

from specedge.apps.cli import cli  # noqa: E402
from specedge.export.onnx_export import ExportProfile, StaticShape, export_gguf_to_onnx  # noqa: E402
from specedge.export.onnx_linear import WeightFormat  # noqa: E402
from specedge.models.gguf_in import open_gguf  # noqa: E402
from specedge.models.tiny import write_tiny_gguf  # noqa: E402
from specedge.runtime.backends import open_onnx  # noqa: E402
from specedge.runtime.backends.numpy_ref import NumpyBackend  # noqa: E402
from specedge.runtime.backends.onnx_providers import Device, parse_device, select_providers  # noqa: E402
from specedge.runtime.backends.onnx_session import choose_providers  # noqa: E402
from specedge.runtime.decode import decode  # noqa: E402
from specedge.runtime.request import PLAIN, Request, Speculation
from specedge.runtime.drafters.ngram import NgramDrafter  # noqa: E402
from verify_walk import walk_verify_steps  # noqa: E402  (tests/ is on the path)

OV = "OpenVINOExecutionProvider"


def _openvino_cpu() -> str | None:
    """None when an OpenVINO CPU device is usable here, else why not."""
    try:
        choose_providers(ort, "openvino:CPU", 1, True)
    except (ValueError, RuntimeError) as e:
        return str(e)
    return None


WHY_NOT = _openvino_cpu()
needs_openvino = pytest.mark.skipif(WHY_NOT is not None, reason=f"no OpenVINO CPU device: {WHY_NOT}")


def test_device_strings_parse():
    assert parse_device("openvino") == (Device.OPENVINO, "CPU")
    assert parse_device("openvino:gpu") == (Device.OPENVINO, "GPU")
    assert parse_device("cuda") == (Device.CUDA, None) and parse_device(Device.OPENVINO) == (Device.OPENVINO, "CPU")
    assert Device("openvino:NPU") is Device.OPENVINO
    with pytest.raises(ValueError, match="CPU, GPU, NPU"):
        parse_device("openvino:TPU")
    with pytest.raises(ValueError, match="only openvino takes a target"):
        parse_device("cuda:1")


def test_provider_choice_for_the_builtin_openvino_provider():
    """The onnxruntime-openvino build lists the provider by name; it takes device_type; the NPU needs static shapes."""
    avail = [OV, "CPUExecutionProvider"]
    c = select_providers("openvino:GPU", avail, static_shapes=False)
    assert c.providers == [(OV, {"device_type": "GPU"}), ("CPUExecutionProvider", {})] and not c.on_gpu
    cpu = select_providers("openvino:CPU", avail).providers[0][1]  # float32 precision, not bfloat16 on AMX CPUs
    assert cpu["device_type"] == "CPU" and json.loads(cpu["load_config"]) == {"CPU": {"INFERENCE_PRECISION_HINT": "f32"}}
    assert select_providers("openvino", avail).providers[0][1]["device_type"] == "CPU"
    with pytest.raises(ValueError, match="openvino:NPU compiles the graph for fixed shapes.*--profile static"):
        select_providers("openvino:NPU", avail)
    assert select_providers("openvino:NPU", avail, static_shapes=True).providers[0][1] == {"device_type": "NPU"}
    with pytest.raises(ValueError, match="OpenVINOExecutionProvider.*specedge\\[openvino\\]"):
        select_providers("openvino:CPU", ["CPUExecutionProvider"])
    assert select_providers("auto", avail).device is Device.CPU  # auto never picks OpenVINO


def test_no_openvino_device_is_a_clear_error():
    if WHY_NOT is None:
        pytest.skip("an OpenVINO CPU device is usable here: the error path is not reachable")
    assert "openvino" in WHY_NOT.lower() and ("Intel" in WHY_NOT or "install" in WHY_NOT)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    d = tmp_path_factory.mktemp("openvino")
    gguf = open_gguf(write_tiny_gguf(d / "m.gguf", arch="qwen2", n_layers=3, tied=False, seed=7))
    export_gguf_to_onnx(gguf, d / "static", WeightFormat.FP32, gate=False, profile=ExportProfile.static(StaticShape(5, 96)))
    export_gguf_to_onnx(gguf, d / "dynamic", WeightFormat.FP32, gate=False)
    return d, NumpyBackend(gguf.load_weights())


@needs_openvino
@pytest.mark.openvino
@pytest.mark.parametrize("profile", ["static", "dynamic"])
def test_openvino_cpu_matches_numpy_through_verify_steps(artifacts, profile):
    d, ref = artifacts
    be = open_onnx(d / profile, device="openvino:CPU", threads=1)
    assert be.choice.device is Device.OPENVINO and be.session.get_providers()[0] == OV
    walk_verify_steps(be, ref, capacity=90, prefill=13, steps=18, max_width=7, tol=1e-3)


@needs_openvino
@pytest.mark.openvino
@pytest.mark.parametrize("profile", ["static", "dynamic"])
def test_openvino_speculative_greedy_equals_plain_greedy(artifacts, profile):
    d, _ = artifacts
    be = open_onnx(d / profile, device="openvino:CPU", threads=1)
    prompt = np.array([5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 5, 9], dtype=np.int32)
    plain = [e.token for e in decode(be, prompt, PLAIN, Request(max_tokens=40))]
    for k in (1, 4, 6):  # static W=5: k = 6 verifies in two pieces
        spec = [e.token for e in decode(be, prompt, Speculation(NgramDrafter(), k=k), Request(max_tokens=40))]
        assert spec == plain, f"k={k}"


@needs_openvino
@pytest.mark.openvino
def test_cli_generate_static_on_openvino_cpu(artifacts, tmp_path):
    d, _ = artifacts
    out = tmp_path / "static"
    r = CliRunner().invoke(cli, ["export", str(d / "m.gguf"), "--weights", "fp16", "--profile", "static",
                                 "--verify-width", "4", "--max-context", "80", "--out", str(out), "--threads", "1"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["generate", str(out), "hi", "--backend", "onnx", "--device", "openvino:CPU",
                                 "--threads", "1", "--max-tokens", "20", "--json", "--baseline", "--temperature", "0"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout.strip().splitlines()[-1])["stats"]
    assert stats["identical_to_baseline"] is True
