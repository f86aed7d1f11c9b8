"""Open a GGUF file: the checked, decoded header (models/gguf_scan.py) and the tensor data as read-only numpy
views of one mmap. It stands in for gguf-py's GGUFReader(path, "r"), which builds a numpy view object per array
item (22 s to open Gemma 3's 262k-token vocabulary, against 0.3 s here); gguf-py still dequantizes and writes.

What it gives matches GGUFReader's: `fields` (key -> GGUFField: types and contents() as ReaderField has them, the
GGUF.* pseudo-keys included) and `tensors` (GGUFTensor: ReaderTensor's name, tensor_type, shape, n_elements,
n_bytes, data_offset and data), checked against gguf-py in tests/test_gguf_read.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from .gguf_scan import GGUFField, GGUFLayout, TensorInfo, open_map, walk_gguf

_Q = GGMLQuantizationType
# Types whose data GGUFReader views as typed elements; every other (quantized, BF16) is uint8 [..., row bytes].
_ELEMENT_TYPES = {_Q.F32: np.float32, _Q.F16: np.float16, _Q.F64: np.float64, _Q.I8: np.int8, _Q.I16: np.int16,
                  _Q.I32: np.int32, _Q.I64: np.int64}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of an opened file; `data` is a read-only view of the file's mmap (no copy)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order, innermost first: ne = (row length, rows, ...)
    n_elements: int
    n_bytes: int
    data_offset: int  # absolute byte offset in the file
    data: np.ndarray = field(repr=False)  # numpy order (reversed shape); quantized: uint8 [..., row bytes]


@dataclass(frozen=True)
class GGUFFile:
    """An opened GGUF: `layout`, `fields` (in file order, GGUF.* pseudo-keys first) and `tensors` (in file order)."""

    path: Path
    layout: GGUFLayout
    fields: dict[str, GGUFField]
    tensors: tuple[GGUFTensor, ...]


def _tensor(buf, order: str, data_start: int, t: TensorInfo) -> GGUFTensor:
    np_shape = tuple(reversed(t.dims))
    element = _ELEMENT_TYPES.get(t.ggml_type)
    if element is None:  # quantized blocks: bytes, the last axis a row's blocks (as dequantize() takes them)
        dtype, count, np_shape = np.dtype(np.uint8), t.n_bytes, quant_shape_to_byte_shape(np_shape, t.ggml_type)
    else:
        dtype, count = np.dtype(element).newbyteorder(order), t.n_elements
    start = data_start + t.offset
    data = np.frombuffer(buf, dtype=dtype, count=count, offset=start).reshape(np_shape)
    return GGUFTensor(t.name, t.ggml_type, t.dims, t.n_elements, t.n_bytes, start, data)


def read_gguf(path: str | Path) -> GGUFFile:
    """Map and decode a GGUF file; every count is checked against the file size before it is used.

    requires: `path` exists; returns: the opened file (the mmap stays open while any tensor view lives);
    raises ModelFileError naming the file, the damaged field and the fix.
    """
    path = Path(path)
    buf = open_map(path)
    try:
        header = walk_gguf(path, buf)
    except BaseException:
        buf.close()
        raise
    tensors = tuple(_tensor(buf, header.byte_order, header.layout.data_start, t) for t in header.tensors)
    return GGUFFile(path, header.layout, header.fields, tensors)
