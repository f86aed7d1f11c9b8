"""A small ONNX graph builder: path-named nodes, named initializers, and the model envelope onnxruntime 1.31 loads.

Nodes are named by a scope path, like the PyTorch exporter does (`/layers.3/attn/qkv_proj`), so a profile or a
Netron view maps straight back to the builder function that made the node. Each node's outputs are named
`<node path>/out<i>` unless the caller names them (graph outputs are named explicitly).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS_DOMAIN = "com.microsoft"
OPSET = 21  # ai.onnx opset: onnxruntime 1.31 implements it fully
MS_OPSET = 1
IR_VERSION = 10  # onnx 1.16+ writes it; onnxruntime >= 1.18 reads it

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
         np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
         np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


def elem_type(dtype) -> int:
    return _ELEM[np.dtype(dtype)]


class GraphBuilder:
    """Collects nodes, initializers and graph I/O; `model()` wraps them in a ModelProto."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._scope: list[str] = []
        self._names: set[str] = set()
        self._init_names: set[str] = set()

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Nodes made inside are named /<outer>/<name>/<node>."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def path(self, name: str) -> str:
        return "/" + "/".join([*self._scope, name])

    def op(self, op_type: str, inputs: Sequence[str], name: str, *, n_out: int = 1, outputs: Sequence[str] = (),
           domain: str = "", **attrs) -> list[str]:
        """Add one node named by the current scope; returns its output names."""
        path = self.path(name)
        if path in self._names:
            raise ValueError(f"node name {path!r} used twice")
        self._names.add(path)
        outs = list(outputs) or [f"{path}/out{i}" for i in range(n_out)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=path, domain=domain or None, **attrs))
        return outs

    def op1(self, op_type: str, inputs: Sequence[str], name: str, **kw) -> str:
        """`op` for single-output nodes."""
        return self.op(op_type, inputs, name, **kw)[0]

    def const(self, name: str, array: np.ndarray) -> str:
        """A named initializer (weights go to external data when the model is saved)."""
        if name in self._init_names:
            raise ValueError(f"initializer {name!r} added twice")
        self._init_names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const_once(self, name: str, array: np.ndarray) -> str:
        """A shared initializer: added on first use, reused by name afterwards."""
        return name if name in self._init_names else self.const(name, array)

    def has_const(self, name: str) -> bool:
        return name in self._init_names

    def input(self, name: str, dtype, shape: Sequence[int | str | None]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type(dtype), list(shape)))
        return name

    def output(self, name: str, dtype, shape: Sequence[int | str | None]) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type(dtype), list(shape)))
        return name

    def model(self, *, producer: str, doc: str = "") -> onnx.ModelProto:
        """The ModelProto; com.microsoft is imported only when a node uses it (a standard-ops graph declares none)."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers, doc_string=doc)
        opsets = [helper.make_opsetid("", OPSET)]
        if any(n.domain == MS_DOMAIN for n in self.nodes):
            opsets.append(helper.make_opsetid(MS_DOMAIN, MS_OPSET))
        model = helper.make_model(graph, producer_name=producer, opset_imports=opsets)
        model.ir_version = IR_VERSION
        return model
