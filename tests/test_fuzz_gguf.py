"""Fuzz the GGUF reader (export/gguf_in.py open_gguf + export/gguf_scan.py) with damaged copies of a tiny model.

Mutations of a valid tiny GGUF: truncation at any byte, random byte overwrites (mostly in the header), and
structure-aware overwrites of the header's counts, lengths, types, dimensions and offsets (located by the
scanner's slots) with edge values (0, 2**31, 2**64 - 1, ...). Every case must either load (a flipped weight byte
is still a model) or raise ModelFileError naming the file and a fix: never another exception, never MemoryError,
never a hang (each case runs under a time limit). CI: 1500 cases; SPECEDGE_FUZZ_EXAMPLES=N for a long run.
"""
import struct

import pytest
import re

from hypothesis import currently_in_test_context, event, given, strategies as st

from fuzz_util import EDGE_INTS, fuzz_settings, time_limit
from specedge.models.gguf_in import open_gguf
from specedge.models.gguf_scan import MAX_ARRAY_ITEMS, scan_gguf
from specedge.models.errors import ModelFileError
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.tokenizer import Tokenizer

FIXES = ("re-pull", "re-download", "re-convert", "supported")  # every message says what to do


class Base(tuple):
    def __repr__(self):  # hypothesis prints the arguments of a failing case: keep the 40 KB file out of it
        return "Base(<tiny q4_0 gguf>)"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(valid file bytes, header slots, a scratch path) for a 1-layer q4_0 tiny model (~40 KB)."""
    d = tmp_path_factory.mktemp("fuzz_gguf")
    src = write_tiny_gguf(d / "base.gguf", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, dtype="q4_0")
    layout = scan_gguf(src, record=True)
    assert layout.slots and layout.version == 3
    return Base((src.read_bytes(), layout.slots, d / "case.gguf"))


def _load_everything(path):
    m = open_gguf(path)
    spec = m.tokenizer_spec()
    Tokenizer(spec).encode("hello <|im_start|> world")
    m.load_weights()


def _check(path, data: bytes) -> str:
    """Write `data`, load it; return "ok" or "error" (ModelFileError with the path and a fix in the message)."""
    path.write_bytes(data)
    try:
        with time_limit():
            _load_everything(path)
    except ModelFileError as e:
        msg = str(e)
        assert str(path) in msg, msg
        assert any(f in msg for f in FIXES), msg
        _event(re.sub(r"[0-9]+|'[^']*'", "#", msg.replace(str(path), ""))[:60])
        return "error"
    _event("loaded")
    return "ok"


def _event(text: str) -> None:
    if currently_in_test_context():  # pytest --hypothesis-show-statistics lists how the cases ended
        event(text)


def _put(data: bytearray, offset: int, size: int, value: int) -> None:
    data[offset:offset + size] = (value % (1 << (8 * size))).to_bytes(size, "little")


class Blob(bytes):
    def __repr__(self):  # a failing case prints its draw: the size, not 40 KB of bytes (re-run it under a debugger)
        return f"Blob({len(self)} bytes)"


@st.composite
def mutated(draw, base):
    raw, slots, _ = base
    data = bytearray(raw)
    header_end = max(s.offset + s.size for s in slots) + 64
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "bytes", "text", "text", "slot", "slot", "slot", "type"]))
        if op == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif op == "bytes":  # anywhere past the magic; half the time inside the header
            end = header_end if draw(st.booleans()) else len(data)
            at = draw(st.integers(4, max(4, min(end, len(data)) - 1)))
            data[at:at + 8] = draw(st.binary(min_size=1, max_size=8))
        elif op == "text":  # one printable byte inside a key, value or token string: changes meaning, not layout
            s = draw(st.sampled_from([s for s in slots if s.kind == "length"]))
            n = int.from_bytes(raw[s.offset:s.offset + 8], "little")
            if n and s.offset + 8 + n <= len(data):
                data[s.offset + 8 + draw(st.integers(0, n - 1))] = draw(st.integers(0x20, 0x7E))
        else:
            kinds = ("type",) if op == "type" else ("count", "length", "type", "dims", "offset")
            s = draw(st.sampled_from([s for s in slots if s.kind in kinds]))
            if s.offset + s.size > len(data):
                continue
            old = int.from_bytes(data[s.offset:s.offset + s.size], "little")
            value = draw(st.one_of(st.sampled_from(EDGE_INTS), st.integers(0, 2**64 - 1), st.integers(0, 40),
                                   st.sampled_from([old + 1, old - 1, old * 2, len(data), len(data) - s.offset]),
                                   st.integers(-4, 4).map(lambda d: -d - 1)))
            _put(data, s.offset, s.size, value)
    return Blob(data)


@pytest.mark.slow
@fuzz_settings(ci=1500)
@given(data=st.data())
def test_damaged_gguf_is_a_clean_error(base, data):
    _check(base[2], data.draw(mutated(base)))


def test_the_base_file_loads(base):
    raw, _, path = base
    assert _check(path, raw) == "ok"


# ---- the regressions the fuzzer found, each pinned (see docs/robustness.md) ----------------------------------------

def _slot(base, kind, nth=0):
    return [s for s in base[1] if s.kind == kind][nth]


def test_huge_array_count_is_refused_before_the_reader_loops(base):
    """gguf-py loops `for idx in range(count)` reading past the end: an array count of 2**64-1 hung for ever."""
    raw, slots, path = base
    arr = [s for s in slots if s.kind == "count" and s.offset > 24][1]  # tokenizer.ggml.token_type's item count
    data = bytearray(raw)
    _put(data, arr.offset - 4, 4, 0)  # items of u8: gguf-py reads one byte per item, then empty views for ever
    _put(data, arr.offset, 8, 2**64 - 1)
    with pytest.raises(ModelFileError, match=f"claims {2**64 - 1} items.*re-download"):
        with time_limit():
            open_gguf(_write(path, data))
    _put(data, arr.offset, 8, MAX_ARRAY_ITEMS + 1)
    with pytest.raises(ModelFileError, match="more than the"):
        open_gguf(_write(path, data))


@pytest.mark.parametrize("field,value,match", [
    (0, 2**64 - 1, "more than .* bytes can hold"),  # tensor count
    (1, 2**40, "more than .* bytes can hold"),  # kv count
])
def test_header_counts_checked_against_file_size(base, field, value, match):
    raw, _, path = base
    data = bytearray(raw)
    _put(data, 8 + 8 * field, 8, value)
    with pytest.raises(ModelFileError, match=match):
        open_gguf(_write(path, data))


def test_string_length_past_the_end(base):
    raw, _, path = base
    data = bytearray(raw)
    _put(data, _slot(base, "length").offset, 8, 2**63)
    with pytest.raises(ModelFileError, match="claims 9223372036854775808 bytes"):
        open_gguf(_write(path, data))


def test_tensor_dims_overflow_and_offsets(base):
    raw, _, path = base
    dims = [s for s in base[1] if s.kind == "dims" and s.size == 8]
    data = bytearray(raw)
    _put(data, dims[0].offset, 8, 2**63)
    _put(data, dims[1].offset, 8, 2**63) if dims[1].offset == dims[0].offset + 8 else None
    with pytest.raises(ModelFileError, match="too many|not a multiple|ends at byte"):
        open_gguf(_write(path, data))
    data = bytearray(raw)
    _put(data, _slot(base, "offset").offset, 8, 2**40)
    with pytest.raises(ModelFileError, match="ends at byte"):
        open_gguf(_write(path, data))


def test_unknown_version_names_the_fix(base):
    raw, _, path = base
    data = bytearray(raw)
    _put(data, 4, 4, 1)
    with pytest.raises(ModelFileError, match="GGUF version 1 is not supported.*re-convert"):
        open_gguf(_write(path, data))


def _write(path, data):
    path.write_bytes(bytes(data))
    return path
