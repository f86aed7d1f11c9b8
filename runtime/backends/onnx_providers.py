"""--device -> ONNX Runtime execution providers, with the provider options we use.

    device     provider                     options
    cpu        CPUExecutionProvider         (threads via SessionOptions)
    cuda       CUDAExecutionProvider        device_id=0
    directml   DmlExecutionProvider         device_id=0
    qnn        QNNExecutionProvider         backend_path=QnnHtp (the Hexagon NPU)
    coreml     CoreMLExecutionProvider      ModelFormat=MLProgram
    xnnpack    XnnpackExecutionProvider     intra_op_num_threads=<threads>
    auto       the first available of cuda, directml, then cpu

The CPU provider is always appended as the fallback for nodes another provider does not take. The NPU / mobile
providers (qnn, coreml, xnnpack) compile a graph for fixed shapes and take standard ONNX ops only: they require an
artifact of the static-shape profile (`specedge export ... --profile static`, docs/onnx.md), and asking for them
with a dynamic artifact is an error. `auto` never picks them (nothing here could test them); ask explicitly.
"""
from __future__ import annotations

import enum
import sys
from dataclasses import dataclass


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    QNN = "qnn"
    COREML = "coreml"
    DIRECTML = "directml"
    XNNPACK = "xnnpack"
    AUTO = "auto"


_PROVIDER = {Device.CPU: "CPUExecutionProvider", Device.CUDA: "CUDAExecutionProvider",
             Device.QNN: "QNNExecutionProvider", Device.COREML: "CoreMLExecutionProvider",
             Device.DIRECTML: "DmlExecutionProvider", Device.XNNPACK: "XnnpackExecutionProvider"}
_INSTALL = {Device.CUDA: "pip install onnxruntime-gpu (and a matching CUDA/cuDNN)",
            Device.QNN: "pip install onnxruntime-qnn (Windows on Snapdragon) or an Android build with QNN",
            Device.COREML: "the standard onnxruntime wheel on macOS",
            Device.DIRECTML: "pip install onnxruntime-directml (Windows)",
            Device.XNNPACK: "an onnxruntime build with --use_xnnpack (Android/iOS packages include it)"}
AUTO_ORDER = (Device.CUDA, Device.DIRECTML, Device.CPU)
NEEDS_STATIC = frozenset({Device.QNN, Device.COREML, Device.XNNPACK})  # providers that need the static profile


@dataclass(frozen=True)
class ProviderChoice:
    device: Device
    providers: list[tuple[str, dict[str, str]]]  # (provider name, options), CPU last
    note: str  # what was chosen and why (printed by the apps under --device auto)


def _options(device: Device, threads: int | None) -> dict[str, str]:
    if device in (Device.CUDA, Device.DIRECTML):
        return {"device_id": "0"}
    if device is Device.QNN:
        return {"backend_path": "QnnHtp.dll" if sys.platform == "win32" else "libQnnHtp.so"}
    if device is Device.COREML:
        return {"ModelFormat": "MLProgram"}
    if device is Device.XNNPACK and threads:
        return {"intra_op_num_threads": str(threads)}
    return {}


def select_providers(device: Device | str, available: list[str], *, threads: int | None = None,
                     static_shapes: bool = False) -> ProviderChoice:
    """Providers for `device` given onnxruntime.get_available_providers() and whether the artifact has the static-shape
    profile; a missing explicit provider, or an NPU provider with a dynamic artifact, is an error naming the fix."""
    device = Device(device)
    cpu = (_PROVIDER[Device.CPU], {})
    if device is Device.AUTO:
        for d in AUTO_ORDER:
            if _PROVIDER[d] in available:
                chosen = [(_PROVIDER[d], _options(d, threads))] + ([cpu] if d is not Device.CPU else [])
                skipped = [x.value for x in AUTO_ORDER[:AUTO_ORDER.index(d)]]
                why = f" ({', '.join(skipped)} not available)" if skipped else ""
                return ProviderChoice(d, chosen, f"--device auto chose {d.value}{why}")
        raise RuntimeError(f"onnxruntime offers none of {[p for p in available]}; reinstall onnxruntime")
    name = _PROVIDER[device]
    problems = []
    if device in NEEDS_STATIC and not static_shapes:
        problems.append(f"--device {device.value} compiles the graph for fixed shapes and needs a static-shape "
                        "artifact, but this one has the dynamic profile: re-export with `specedge export MODEL "
                        "--format onnx --profile static` (fp32, fp16 or int8 weights; docs/onnx.md)")
    if name not in available:
        problems.append(f"--device {device.value} needs ONNX Runtime's {name}, which this onnxruntime does not "
                        f"provide (available: {', '.join(available)}); install: {_INSTALL[device]}, "
                        "or use --device cpu / auto")
    if problems:
        raise ValueError(". Also: ".join(problems))
    chosen = [(name, _options(device, threads))] + ([cpu] if device is not Device.CPU else [])
    return ProviderChoice(device, chosen, f"--device {device.value}: {name}")
