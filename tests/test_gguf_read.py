"""models/gguf_read.py against gguf-py's GGUFReader: the same fields (types, values and their Python types) and
the same tensors (type, shape, offsets, data views with their dtype and shape) on tiny GGUFs of every kind we
write, plus a hand-made file with every value type, BF16 data, a custom alignment and big-endian byte order."""
import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

from specedge.models.gguf_in import SUPPORTED_TYPES, open_gguf
from specedge.models.gguf_read import read_gguf
from specedge.models.gguf_scan import scan_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.models.tiny_vocab import tiny_bpe_fields, tiny_spm_fields, write_vocab_gguf


def _items(value):
    return value if isinstance(value, list) else [value]


def assert_same_as_gguf_py(path):
    ours, theirs = read_gguf(path), GGUFReader(path, "r")
    assert list(ours.fields) == list(theirs.fields)
    for key, f in theirs.fields.items():
        mine = ours.fields[key]
        assert list(mine.types) == f.types, key
        want, got = f.contents(), mine.contents()
        assert got == want, key
        assert [type(v) for v in _items(got)] == [type(v) for v in _items(want)], key
        assert mine.count == len(f.data), key
    assert ours.layout.data_start == theirs.data_offset
    assert len(ours.tensors) == len(theirs.tensors)
    for mine, t in zip(ours.tensors, theirs.tensors):
        assert (mine.name, mine.tensor_type, mine.n_elements, mine.n_bytes, mine.data_offset) == (
            t.name, t.tensor_type, t.n_elements, t.n_bytes, t.data_offset)
        assert list(mine.shape) == t.shape.tolist()
        assert (mine.data.dtype, mine.data.shape) == (t.data.dtype, t.data.shape), t.name
        assert mine.data.tobytes() == t.data.tobytes(), t.name
        assert not mine.data.flags.writeable
        if mine.tensor_type in SUPPORTED_TYPES:
            np.testing.assert_array_equal(dequantize(mine.data, mine.tensor_type), dequantize(t.data, t.tensor_type))
    return ours


@pytest.mark.parametrize("arch,dtype", [("llama", "q4_0"), ("qwen2", "q8_0"), ("llama", "f16"), ("qwen2", "f32")])
def test_tiny_models_read_as_gguf_py_reads_them(tmp_path, arch, dtype):
    path = write_tiny_gguf(tmp_path / "m.gguf", arch=arch, n_layers=1, dtype=dtype)
    ours = assert_same_as_gguf_py(path)
    assert ours.layout == scan_gguf(path)
    m = open_gguf(path)  # typed_fields: gguf-py's stored values and types, bit for bit
    theirs = GGUFReader(path, "r").fields
    for key, v in m.typed_fields().items():
        f = theirs[key]
        assert (v.value, v.type, v.sub_type) == (f.contents(), f.types[0], f.types[-1] if len(f.types) > 1 else None)


@pytest.mark.parametrize("fields", [tiny_spm_fields(0), tiny_spm_fields(1, add_space_prefix=False),
                                    tiny_bpe_fields("qwen2")], ids=["spm", "spm-no-prefix", "bpe"])
def test_vocabulary_files_read_as_gguf_py_reads_them(tmp_path, fields):
    assert_same_as_gguf_py(write_vocab_gguf(tmp_path / "v.gguf", fields))


@pytest.mark.parametrize("endian", [GGUFEndian.LITTLE, GGUFEndian.BIG])
def test_every_value_type_and_tensor_kind(tmp_path, endian):
    path = tmp_path / "all.gguf"
    wr = GGUFWriter(str(path), "llama", endianess=endian)
    wr.add_custom_alignment(64)
    scalars = {GGUFValueType.UINT8: 200, GGUFValueType.INT8: -100, GGUFValueType.UINT16: 60000,
               GGUFValueType.INT16: -30000, GGUFValueType.UINT32: 4_000_000_000, GGUFValueType.INT32: -2_000_000_000,
               GGUFValueType.FLOAT32: 1e-5, GGUFValueType.UINT64: 2**63 + 5, GGUFValueType.INT64: -2**62,
               GGUFValueType.FLOAT64: 0.1, GGUFValueType.BOOL: True}
    for vtype, value in scalars.items():
        wr.add_key_value(f"s.{vtype.name}", value, vtype)
        wr.add_key_value(f"a.{vtype.name}", [value, value, value], GGUFValueType.ARRAY, vtype)
    wr.add_key_value("a.BOOL2", [True, False], GGUFValueType.ARRAY, GGUFValueType.BOOL)
    wr.add_string("s.utf8", "héllo ▁ 世界")
    wr.add_array("a.strings", ["", "a", "▁b", "<0x0A>", "世界"] * 30)  # 150 items: a long array
    rng = np.random.default_rng(0)
    wr.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    wr.add_tensor("f16", rng.standard_normal((2, 4)).astype(np.float16))
    wr.add_tensor("i32", np.arange(7, dtype=np.int32))
    bf16 = (rng.standard_normal((2, 8)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    wr.add_tensor("bf16", bf16.view(np.uint8), raw_shape=(2, 8), raw_dtype=GGMLQuantizationType.BF16)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    ours = assert_same_as_gguf_py(path)
    assert ours.layout.alignment == 64 and ours.fields["s.utf8"].contents() == "héllo ▁ 世界"
    assert ours.fields["a.strings"].count == 150


def test_an_empty_array_keeps_its_item_type(tmp_path):
    """gguf-py types an empty array as [ARRAY] (it reads the item type from the first item); we keep the stated one."""
    key = b"empty"
    data = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT32, 0))
    path = tmp_path / "empty.gguf"
    path.write_bytes(data)
    f = read_gguf(path).fields["empty"]
    assert f.types == (GGUFValueType.ARRAY, GGUFValueType.UINT32) and f.contents() == [] and f.count == 0
