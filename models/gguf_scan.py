"""A bounded walk of a GGUF header that also decodes it: the metadata values and the tensor infos.

gguf-py's GGUFReader trusts every count in the header (a kv or array count of 2**64 makes it loop for ever, a huge
string length or tensor dimension makes it build views past the end of the file) and builds a numpy view per array
item (22 s for a 262k-token vocabulary). This walk reads the header (spec: ggml docs/gguf.md) with `struct` over a
read-only mmap, checks every count against the bytes that are left BEFORE anything is allocated from it, and
decodes as it goes: arrays of fixed-size items with one np.frombuffer, strings in a tight loop.
models/gguf_read.py maps the tensor data on top of it.

    magic "GGUF" | version u32 (2, 3) | n_tensors u64 | n_kv u64
    n_kv x        key: string | value type u32 | value
                  string = len u64 + UTF-8 bytes; array = item type u32 + count u64 + items
    n_tensors x   name: string | n_dims u32 (1..4) | dims u64[n_dims] | ggml type u32 | offset u64
    padding to `general.alignment` (default 32) | tensor data (each tensor at data_start + offset)

Every check failure raises ModelFileError naming the file, the damaged field and the fix (re-download).
`slots` (record=True) lists where each count / length / type / offset field sits, for fuzz tests to aim at.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .catalog import repair_hint
from .errors import ModelFileError

SUPPORTED_VERSIONS = (2, 3)  # what gguf-py's reader reads (version 1 used 32-bit counts)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_ITEMS = 1 << 21  # 2M: far above any vocabulary (256k); each item becomes a Python object
MAX_NESTING = 3  # arrays of arrays; deeper nesting is refused rather than recursed into
MAX_ELEMENTS = 1 << 62  # llama.cpp's bound (INT64_MAX / type size) on a tensor's element count

# GGUF value type -> (struct code, size); 8 = string and 9 = array are handled apart.
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4), 7: ("?", 1),
            10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_STRING, _ARRAY = 8, 9
_UINT32, _UINT64 = GGUFValueType.UINT32, GGUFValueType.UINT64
_MIN_VALUE = 1  # the smallest value (u8 / i8 / bool)
_MIN_KV = 8 + 4 + _MIN_VALUE  # empty key + value type + smallest value
_MIN_TENSOR_INFO = 8 + 4 + 8 + 4 + 8  # empty name + n_dims + one dim + type + offset


@dataclass(frozen=True)
class Slot:
    """Where one structural field of the header sits: byte offset, width, and what it counts or names."""

    offset: int
    size: int
    kind: str  # count | length | type | dims | offset


@dataclass(frozen=True)
class GGUFLayout:
    """What the scan learned: version, counts, alignment, where tensor data starts and the file size."""

    version: int
    n_tensors: int
    n_kv: int
    alignment: int
    data_start: int
    file_size: int
    slots: tuple[Slot, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class GGUFField:
    """One metadata key and its decoded value, typed as gguf-py's ReaderField types it.

    types: (vtype,) for a scalar or string; (ARRAY, item type) for an array, (ARRAY, ARRAY, ..., leaf type) for
    nested arrays (the first item's chain). value: a Python int / float / bool / str, or for arrays a tuple of the
    items (nested arrays flattened to their leaves, as ReaderField.contents() gives them).
    """

    name: str
    types: tuple[GGUFValueType, ...]
    value: Any = field(repr=False)

    def contents(self) -> Any:
        """The value as ReaderField.contents() gives it: arrays as a fresh list."""
        return list(self.value) if isinstance(self.value, tuple) else self.value

    @property
    def count(self) -> int:
        """Items in an array (leaves, for nested arrays); 1 for a scalar or string."""
        return len(self.value) if isinstance(self.value, tuple) else 1


@dataclass(frozen=True)
class TensorInfo:
    """One tensor info entry: `dims` in GGUF order (innermost first), `offset` relative to the data section."""

    name: str
    dims: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    offset: int
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    """A walked header: the layout, every metadata field (GGUF.* pseudo-keys first) and the tensor infos."""

    layout: GGUFLayout
    fields: dict[str, GGUFField]
    tensors: tuple[TensorInfo, ...]
    byte_order: str  # struct / numpy prefix of the file's numbers: "<" (every file llama.cpp writes) or ">"


class _Cursor:
    """Reads little- (or big-) endian values from a buffer; every read is bounds-checked first."""

    def __init__(self, path: Path, buf, order: str, record: bool) -> None:
        self.path, self.buf, self.order, self.pos, self.size = path, buf, order, 0, len(buf)
        self.slots: list[Slot] | None = [] if record else None

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(f"{self.path} is truncated or corrupt: {what} (at byte {self.pos}); "
                              f"{repair_hint(self.path)}")

    def left(self) -> int:
        return self.size - self.pos

    def read(self, code: str, size: int, kind: str | None = None, what: str = "a header field"):
        if self.left() < size:
            raise self.fail(f"{what} runs past the end of the file ({self.size} bytes)")
        if kind is not None and self.slots is not None:
            self.slots.append(Slot(self.pos, size, kind))
        value = struct.unpack_from(self.order + code, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.read("Q", 8, "length", f"the length of {what}")
        if n > self.left():
            raise self.fail(f"{what} claims {n} bytes but only {self.left()} are left")
        raw = bytes(self.buf[self.pos:self.pos + n])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None
        self.pos += n
        return text


def _value(c: _Cursor, vtype: int, key: str, depth: int = 0) -> tuple[Any, tuple[GGUFValueType, ...]]:
    """Read one value of type `vtype`: (the decoded value, its types as GGUFField holds them)."""
    if vtype in _SCALARS:
        code, size = _SCALARS[vtype]
        return c.read(code, size, what=f"the value of {key!r}"), (GGUFValueType(vtype),)
    if vtype == _STRING:
        return c.string(f"the string value of {key!r}"), (GGUFValueType.STRING,)
    if vtype != _ARRAY:
        raise c.fail(f"{key!r} has unknown value type {vtype}")
    if depth >= MAX_NESTING:
        raise c.fail(f"{key!r} nests arrays more than {MAX_NESTING} deep")
    itype = c.read("I", 4, "type", f"the item type of {key!r}")
    n = c.read("Q", 8, "count", f"the item count of {key!r}")
    if itype in _SCALARS:
        item = _SCALARS[itype][1]
    elif itype in (_STRING, _ARRAY):
        item = 8 if itype == _STRING else 12  # an empty string / empty array
    else:
        raise c.fail(f"{key!r} is an array of unknown value type {itype}")
    if n > MAX_ARRAY_ITEMS:
        raise c.fail(f"{key!r} claims {n} items (more than the {MAX_ARRAY_ITEMS} this reader allows)")
    if n * item > c.left():
        raise c.fail(f"{key!r} claims {n} items of at least {item} bytes but only {c.left()} bytes are left")
    if itype in _SCALARS:  # fixed-size items: checked as one block, decoded in one go
        items = np.frombuffer(c.buf, np.dtype(c.order + _SCALARS[itype][0]), count=n, offset=c.pos).tolist()
        c.pos += n * item
        return tuple(items), (GGUFValueType.ARRAY, GGUFValueType(itype))
    if itype == _STRING and c.slots is None:
        return _strings(c, n, key), (GGUFValueType.ARRAY, GGUFValueType.STRING)
    values: list[Any] = []
    types: tuple[GGUFValueType, ...] = (GGUFValueType(itype),)  # an empty array keeps its stated item type
    for i in range(n):
        value, item_types = _value(c, itype, key, depth + 1)
        if i == 0:
            types = item_types
        if itype == _ARRAY:
            values.extend(value)  # nested arrays: flattened to their leaves, as gguf-py's contents() gives them
        else:
            values.append(value)
    return tuple(values), (GGUFValueType.ARRAY, *types)


def _strings(c: _Cursor, n: int, key: str) -> tuple[str, ...]:
    """`n` strings of an array (a vocabulary: 262k in Gemma 3), with _Cursor.string's checks in one tight loop."""
    buf, pos, size, what = c.buf, c.pos, c.size, f"the string value of {key!r}"
    unpack = struct.Struct(c.order + "Q").unpack_from
    out: list[str] = []
    append = out.append
    try:
        for _ in range(n):
            if size - pos < 8:
                raise c.fail(f"the length of {what} runs past the end of the file ({size} bytes)")
            length = unpack(buf, pos)[0]
            pos += 8
            if length > size - pos:
                raise c.fail(f"{what} claims {length} bytes but only {size - pos} are left")
            append(buf[pos:pos + length].decode("utf-8"))
            pos += length
    except UnicodeDecodeError:
        raise c.fail(f"{what} is not valid UTF-8") from None
    finally:
        c.pos = pos  # reported by fail() ("at byte ..."), and where the walk goes on
    return tuple(out)


def _kvs(c: _Cursor, n_kv: int, fields: dict[str, GGUFField]) -> int:
    """Walk the key/value section into `fields`; returns the alignment (general.alignment or the default)."""
    alignment = DEFAULT_ALIGNMENT
    for i in range(n_kv):
        key = c.string(f"key #{i}")
        if key in fields:
            raise c.fail(f"metadata key {key!r} appears twice")
        vtype = c.read("I", 4, "type", f"the value type of {key!r}")
        value, types = _value(c, vtype, key)
        fields[key] = GGUFField(key, types, value)
        if key == "general.alignment":
            if vtype != 4 or not value or value & (value - 1):
                raise c.fail(f"general.alignment must be a u32 power of two, not {value!r}")
            alignment = int(value)
    return alignment


def _tensor_infos(c: _Cursor, n_tensors: int) -> list[TensorInfo]:
    """Walk the tensor infos, every dimension checked."""
    out, names = [], set()
    for i in range(n_tensors):
        name = c.string(f"the name of tensor #{i}")
        if name in names:
            raise c.fail(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = c.read("I", 4, "dims", f"the dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
        dims = [c.read("Q", 8, "dims", f"a dimension of {name!r}") for _ in range(n_dims)]
        n_elements = 1
        for d in dims:
            n_elements *= d  # Python ints: no wrap-around; checked against the bound below
        if n_elements > MAX_ELEMENTS:
            raise c.fail(f"tensor {name!r} has dimensions {dims} ({n_elements} elements, too many)")
        raw_type = c.read("I", 4, "type", f"the type of {name!r}")
        try:
            ggml_type = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[ggml_type]
        except (ValueError, KeyError):
            raise c.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
        if dims[0] % block:
            raise c.fail(f"tensor {name!r} rows of {dims[0]} are not a multiple of its block size {block}")
        offset = c.read("Q", 8, "offset", f"the data offset of {name!r}")
        out.append(TensorInfo(name, tuple(dims), ggml_type, offset, n_elements, n_elements // block * type_size))
    return out


def open_map(path: str | Path) -> mmap.mmap:
    """The file mapped read-only, after the checks an mmap needs (exists, not shorter than a header)."""
    path = Path(path)
    size = path.stat().st_size
    if size < 24:
        raise ModelFileError(f"{path} is truncated: {size} bytes is shorter than a GGUF header (24); "
                             f"{repair_hint(path)}")
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def walk_gguf(path: str | Path, buf, *, record: bool = False) -> GGUFHeader:
    """Check and decode the GGUF header in `buf` (the file at `path`, mapped by open_map).

    returns: the layout (record=True: with the slots of every structural field), the metadata fields (gguf-py's
    GGUF.version / GGUF.tensor_count / GGUF.kv_count pseudo-keys first) and the tensor infos;
    raises ModelFileError naming the file, the damaged field and the fix.
    """
    path, size = Path(path), len(buf)
    if buf[:4] != b"GGUF":
        raise ModelFileError(f"{path} is not a GGUF file (starts with {bytes(buf[:4])!r}, expected b'GGUF'); "
                             f"pass a .gguf model file, or, if it should be one, {repair_hint(path)}")
    version = struct.unpack_from("<I", buf, 4)[0]
    order = "<" if version & 0xFFFF else ">"  # a byte-swapped file reads as 0x0N000000 (as gguf-py detects it)
    c = _Cursor(path, buf, order, record)
    c.pos = 4
    version = c.read("I", 4, "type", "the version")
    if version not in SUPPORTED_VERSIONS:
        raise ModelFileError(f"{path}: GGUF version {version} is not supported (this reader reads "
                             f"{', '.join(map(str, SUPPORTED_VERSIONS))}); re-convert the model with a current "
                             "llama.cpp, or, if the file is damaged, " + repair_hint(path))
    n_tensors = c.read("Q", 8, "count", "the tensor count")
    n_kv = c.read("Q", 8, "count", "the metadata key count")
    if n_kv * _MIN_KV + n_tensors * _MIN_TENSOR_INFO > c.left():
        raise c.fail(f"the header claims {n_kv} metadata keys and {n_tensors} tensors, more than "
                     f"{size} bytes can hold")
    pseudo = (("GGUF.version", _UINT32, version), ("GGUF.tensor_count", _UINT64, n_tensors),
              ("GGUF.kv_count", _UINT64, n_kv))  # as GGUFReader lists them, before the file's own keys
    fields = {name: GGUFField(name, (vtype,), value) for name, vtype, value in pseudo}
    alignment = _kvs(c, n_kv, fields)
    infos = _tensor_infos(c, n_tensors)
    data_start = -(-c.pos // alignment) * alignment
    for t in infos:
        if t.offset % alignment:
            raise c.fail(f"tensor {t.name!r} data offset {t.offset} is not a multiple of the alignment {alignment}")
        if data_start + t.offset + t.n_bytes > size:
            raise ModelFileError(f"{path} is truncated: tensor {t.name!r} ends at byte "
                                 f"{data_start + t.offset + t.n_bytes} but the file has {size}; {repair_hint(path)}")
    layout = GGUFLayout(version, n_tensors, n_kv, alignment, data_start, size, tuple(c.slots or ()))
    return GGUFHeader(layout, fields, tuple(infos), order)


def scan_gguf(path: str | Path, *, record: bool = False) -> GGUFLayout:
    """Check a GGUF header against the file's size (models/gguf_read.py read_gguf also decodes and maps it).

    requires: `path` exists; returns: the layout (record=True: also the slots of every structural field);
    raises ModelFileError naming the file, the damaged field and the fix.
    """
    with open_map(path) as buf:
        return walk_gguf(path, buf, record=record).layout
