"""--device -> ONNX Runtime execution providers, with the provider options we use.

    device     provider                     options
    cpu        CPUExecutionProvider         (threads via SessionOptions)
    cuda       CUDAExecutionProvider        device_id=0
    directml   DmlExecutionProvider         device_id=0
    qnn        QNNExecutionProvider         backend_path=QnnHtp (the Hexagon NPU)
    coreml     CoreMLExecutionProvider      ModelFormat=MLProgram
    xnnpack    XnnpackExecutionProvider     intra_op_num_threads=<threads>
    openvino[:CPU|GPU|NPU]  OpenVINOExecutionProvider  the OpenVINO device (CPU when none is named)
    auto       the first available of cuda, directml, then cpu

The CPU provider is always appended as the fallback for nodes another provider does not take. The NPU / mobile
providers (qnn, coreml, xnnpack) compile a graph for fixed shapes and take standard ONNX ops only: they require an
artifact of the static-shape profile (`specedge export ... --profile static`, docs/onnx.md), and asking for them
with a dynamic artifact is an error. `auto` never picks them (nothing here could test them); ask explicitly.

OpenVINO comes in two packagings, both used here (openvino_choice): the plugin EP `onnxruntime-ep-openvino` (extra
`openvino`; onnxruntime >= 1.23 loads it with register_execution_provider_library and a session takes one of the
OrtEpDevices it offers: it offers Intel hardware only, so on an AMD CPU it lists no device at all), and the
`onnxruntime-openvino` build of onnxruntime itself (it replaces the onnxruntime wheel; its provider is named in the
providers list with device_type, on any x86 CPU). The NPU device compiles for fixed shapes: static profile only.
"""
from __future__ import annotations

import enum
import json
import sys
from dataclasses import dataclass


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    QNN = "qnn"
    COREML = "coreml"
    DIRECTML = "directml"
    XNNPACK = "xnnpack"
    OPENVINO = "openvino"
    AUTO = "auto"

    @classmethod
    def _missing_(cls, value):  # "openvino:GPU" is the OpenVINO device (parse_device keeps the target)
        if isinstance(value, str) and ":" in value:
            return cls(value.split(":", 1)[0])
        return None


OPENVINO_TARGETS = ("CPU", "GPU", "NPU")
DEVICE_CHOICES = tuple([d.value for d in Device] + [f"openvino:{t}" for t in OPENVINO_TARGETS])  # the CLI's --device


def parse_device(device: "Device | str") -> tuple[Device, str | None]:
    """("openvino:GPU" -> (OPENVINO, "GPU")); the OpenVINO target defaults to CPU; other devices have none."""
    if isinstance(device, Device):
        return device, ("CPU" if device is Device.OPENVINO else None)
    name, _, target = device.partition(":")
    d = Device(name)
    if d is not Device.OPENVINO:
        if target:
            raise ValueError(f"--device {device}: only openvino takes a target (openvino:CPU|GPU|NPU)")
        return d, None
    target = (target or "CPU").upper()
    if target not in OPENVINO_TARGETS:
        raise ValueError(f"--device {device}: the OpenVINO target must be one of {', '.join(OPENVINO_TARGETS)}")
    return d, target


_PROVIDER = {Device.CPU: "CPUExecutionProvider", Device.CUDA: "CUDAExecutionProvider",
             Device.QNN: "QNNExecutionProvider", Device.COREML: "CoreMLExecutionProvider",
             Device.DIRECTML: "DmlExecutionProvider", Device.XNNPACK: "XnnpackExecutionProvider",
             Device.OPENVINO: "OpenVINOExecutionProvider"}
_INSTALL = {Device.CUDA: "pip install onnxruntime-gpu (and a matching CUDA/cuDNN)",
            Device.QNN: "pip install onnxruntime-qnn (Windows on Snapdragon) or an Android build with QNN",
            Device.COREML: "the standard onnxruntime wheel on macOS",
            Device.DIRECTML: "pip install onnxruntime-directml (Windows)",
            Device.XNNPACK: "an onnxruntime build with --use_xnnpack (Android/iOS packages include it)",
            Device.OPENVINO: "pip install 'specedge[openvino]' (the onnxruntime-ep-openvino plugin, Intel devices) "
                             "or the onnxruntime-openvino build of onnxruntime (it replaces onnxruntime)"}
AUTO_ORDER = (Device.CUDA, Device.DIRECTML, Device.CPU)
NEEDS_STATIC = frozenset({Device.QNN, Device.COREML, Device.XNNPACK})  # providers that need the static profile


@dataclass(frozen=True)
class ProviderChoice:
    device: Device
    providers: list[tuple[str, dict[str, str]]]  # (provider name, options), CPU last
    note: str  # what was chosen and why (printed by the apps under --device auto)
    ep_devices: tuple = ()  # plugin EPs: the OrtEpDevices to add (providers then names them, for the record)

    @property
    def on_gpu(self) -> bool:
        """The first provider keeps its tensors in CUDA memory (the KV buffers can live there)."""
        return self.device is Device.CUDA


def _options(device: Device, threads: int | None, target: str | None = None) -> dict[str, str]:
    if device is Device.OPENVINO:
        return {"device_type": target or "CPU", **openvino_precision(target or "CPU")}
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
    device, target = parse_device(device)
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
    label = device.value + (f":{target}" if target else "")
    if (device in NEEDS_STATIC or target == "NPU") and not static_shapes:
        problems.append(f"--device {label} compiles the graph for fixed shapes and needs a static-shape "
                        "artifact, but this one has the dynamic profile: re-export with `specedge export MODEL "
                        "--format onnx --profile static` (fp32, fp16 or int8 weights; docs/onnx.md)")
    if name not in available:
        problems.append(f"--device {label} needs ONNX Runtime's {name}, which this onnxruntime does not "
                        f"provide (available: {', '.join(available)}); install: {_INSTALL[device]}, "
                        "or use --device cpu / auto")
    if problems:
        raise ValueError(". Also: ".join(problems))
    chosen = [(name, _options(device, threads, target))] + ([cpu] if device is not Device.CPU else [])
    return ProviderChoice(device, chosen, f"--device {label}: {name}")


def openvino_precision(target: str) -> dict[str, str]:
    """OpenVINO's CPU device computes in bfloat16 by default where the CPU has AMX or AVX512-BF16 (measured on a Xeon:
    logits 0.17 off the float32 reference); float32 inference precision keeps the graph's own. The plugin ignores the
    old `precision` option and takes this load_config. Other devices: their default."""
    return {"load_config": json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": "f32"}})} if target == "CPU" else {}


_registered: dict[str, str] = {}  # plugin EP libraries registered in this process (registration name -> path)


def openvino_choice(ort, target: str, *, static_shapes: bool) -> ProviderChoice | None:
    """The OpenVINO plugin EP's device for `target` (registering the plugin library once per process), or None when
    the plugin is not installed (select_providers then looks for the onnxruntime-openvino build's provider). A plugin
    that offers no such device is an error naming the devices it does offer and the CPU's vendor."""
    try:
        import onnxruntime_ep_openvino as plugin
    except ImportError:
        return None
    if not hasattr(ort, "register_execution_provider_library"):
        raise ValueError(f"the OpenVINO plugin EP needs onnxruntime >= 1.23 (this is {ort.__version__})")
    if target == "NPU" and not static_shapes:
        select_providers("openvino:NPU", [_PROVIDER[Device.OPENVINO]])  # raises the static-profile error
    name = plugin.get_ep_name()
    if name not in _registered:
        ort.register_execution_provider_library(name, plugin.get_library_path())
        _registered[name] = plugin.get_library_path()
    devices = ort.get_ep_devices()
    offered = [d for d in devices if d.ep_name == name]
    match = [d for d in offered if d.ep_metadata.get("ov_device", "").split(".")[0] == target]
    if not match:
        vendors = sorted({d.device.vendor for d in devices if d.device.type == ort.OrtHardwareDeviceType.CPU})
        raise ValueError(
            f"--device openvino:{target}: the OpenVINO plugin offers "
            f"{[d.ep_metadata.get('ov_device') for d in offered] or 'no device'} here. It offers Intel hardware only "
            f"(CPU vendor here: {', '.join(vendors) or 'unknown'}); on other CPUs install the onnxruntime-openvino "
            "build of onnxruntime instead (it replaces onnxruntime), or use --device cpu")
    return ProviderChoice(Device.OPENVINO, [(name, openvino_precision(target)), (_PROVIDER[Device.CPU], {})],
                          f"--device openvino:{target}: {name} plugin on {match[0].ep_metadata['ov_device']}",
                          ep_devices=(match[0],))
