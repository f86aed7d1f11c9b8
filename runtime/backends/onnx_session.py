"""Opening an exported artifact's ONNX Runtime session: the execution providers for --device (onnx_providers.py),
the process's thread pool (ort_threads.py), CUDA graphs where the session can take them, and the bytes of weights
a one-token forward reads. Every ONNX backend (onnxrt.py, onnx_static.py, onnx_optimum.py; onnx_layered.py for its
provider choice) opens its sessions here.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...models.manifest import Manifest, Profile
from ..cores import default_threads
from .onnx_providers import Device, ProviderChoice, openvino_choice, parse_device, select_providers
from .ort_threads import session_options, threads_note


def import_ort():
    try:
        import onnxruntime
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("the ONNX backend needs onnxruntime: pip install 'specedge[onnx]'") from e
    return onnxruntime


def read_bytes_per_token(model_path: Path) -> int:
    """Bytes of initializers a one-token forward reads: all of them, except that a table consumed only by Gather
    (the token embedding, unless a tied float head reads it too) costs one row."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    model = onnx.load(str(model_path), load_external_data=False)
    users: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            users.setdefault(name, set()).add(node.op_type)
    total = 0
    for t in model.graph.initializer:
        n = ExternalDataInfo(t).length if uses_external_data(t) else len(t.raw_data)
        if users.get(t.name) == {"Gather"} and len(t.dims) == 2 and t.dims[0] > 0:
            n //= t.dims[0]
        total += int(n)
    return total


def open_session(manifest: Manifest, device: Device | str, threads: int | None, log=None, *, cuda_graph: bool = False
                 ) -> tuple[Any, Any, ProviderChoice, int]:
    """(onnxruntime module, InferenceSession, provider choice, threads) for an artifact on `device`; cuda_graph: the
    CUDA provider with enable_cuda_graph (a session whose runs may be captured and replayed; other providers ignore
    it)."""
    ort = import_ort()
    threads = default_threads(threads)
    choice = choose_providers(ort, device, threads, manifest.profile is Profile.STATIC)
    plain_choice = choice
    if cuda_graph and choice.device is Device.CUDA:
        (name, options), *rest = choice.providers
        choice = dataclasses.replace(choice, providers=[(name, {**options, "enable_cuda_graph": "1"}), *rest])
    if log is not None and parse_device(device)[0] is Device.AUTO:
        log(choice.note)
    opts, actual = session_options(ort, threads)
    if log is not None and (note := threads_note(threads, actual)):
        log(note)
    threads = actual
    if choice.ep_devices:  # a plugin EP: the session takes its devices; onnxruntime appends the CPU fallback itself
        opts.add_provider_for_devices(list(choice.ep_devices), choice.providers[0][1])
        session = ort.InferenceSession(str(manifest.model_path), sess_options=opts)
    else:
        try:
            session = ort.InferenceSession(str(manifest.model_path), sess_options=opts,
                                           providers=[p for p, _ in choice.providers],
                                           provider_options=[o for _, o in choice.providers])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own Fail/RuntimeException types
            if choice is plain_choice:
                raise
            # CUDA graphs need every node on the CUDA provider; a graph with some on the CPU runs without them
            if log is not None:
                log(f"CUDA graphs off for {manifest.root.name}: {str(e).splitlines()[0][:200]}")
            choice = plain_choice
            session = ort.InferenceSession(str(manifest.model_path), sess_options=opts,
                                           providers=[p for p, _ in choice.providers],
                                           provider_options=[o for _, o in choice.providers])
    return ort, session, choice, threads


def choose_providers(ort, device: Device | str, threads: int, static_shapes: bool) -> ProviderChoice:
    """select_providers over this onnxruntime's providers; --device openvino takes the plugin EP's device where the
    plugin is installed (onnx_providers.openvino_choice), else the onnxruntime-openvino build's own provider. (Once
    registered, a plugin's name is listed among the available providers too, but naming it there runs nothing on it.)"""
    kind, target = parse_device(device)
    if kind is Device.OPENVINO:
        plugin = openvino_choice(ort, target, static_shapes=static_shapes)
        if plugin is not None:
            return plugin
    return select_providers(device, ort.get_available_providers(), threads=threads, static_shapes=static_shapes)
