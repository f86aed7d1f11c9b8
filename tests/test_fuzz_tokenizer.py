"""Fuzz tokenizer loading from GGUF metadata and GGUF metadata types, and probe the chat-template sandbox.

1. tokenizer_spec_from_gguf on the tiny model's `tokenizer.*` fields with corrupted vocab / merges / token types /
   special ids (items replaced, dropped, duplicated, retyped): a TokenizerSpec whose tokenizer encodes, or a
   ValueError naming the key. 2. The tiny GGUF re-written by gguf.GGUFWriter with metadata values of the wrong GGUF
   type (string for a count, float for an id, arrays for scalars, zero and 2**32-1 sizes) or deleted: open_gguf +
   tokenizer + weights load, or ModelFileError naming the file and the fix. 3. Chat templates that reach for
   `__class__` / `__globals__`, loop or allocate without bound: a ValueError, quickly.
CI: 1000 + 400 cases; SPECEDGE_FUZZ_EXAMPLES=N for a long run.
"""
import time

import numpy as np
import pytest
from gguf import GGUFValueType, GGUFWriter
from hypothesis import given, strategies as st

from fuzz_util import fuzz_settings, time_limit
from specedge.models.gguf_in import open_gguf
from specedge.models.tokenizer_gguf import tokenizer_spec_from_gguf
from specedge.models.errors import ModelFileError
from specedge.models.tiny import write_tiny_gguf
from specedge.models.tokenizer_spec import TokenizerSpec
from specedge.runtime.tokenizer import Tokenizer


class Base(tuple):
    def __repr__(self):
        return "Base(<tiny gguf>)"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_tok")
    path = write_tiny_gguf(d / "tiny.gguf", n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64)
    m = open_gguf(path)
    return Base((m, m.fields("tokenizer."), d / "case.gguf"))


_items = st.one_of(st.text(max_size=6), st.integers(-2**40, 2**40), st.none(), st.floats(), st.binary(max_size=4),
                   st.sampled_from(["a b", "a  b", " ", "Ġ t", "<|im_end|>", "x y z", ""]))


@st.composite
def corrupted_fields(draw, fields):
    f = {k: (list(v) if isinstance(v, list) else v) for k, v in fields.items()}
    keys = sorted(f)
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(keys))
        value = f.get(key)
        op = draw(st.sampled_from(["item", "item", "drop", "dup", "truncate", "retype", "delete"]))
        if isinstance(value, list) and value and op in ("item", "drop", "dup", "truncate"):
            i = draw(st.integers(0, len(value) - 1))
            if op == "item":
                value[i] = draw(_items)
            elif op == "drop":
                del value[i]
            elif op == "dup":
                value.insert(i, value[draw(st.integers(0, len(value) - 1))])
            else:
                del value[i:]
        elif op == "delete":
            f.pop(key, None)
        else:
            f[key] = draw(st.one_of(_items, st.lists(_items, max_size=3), st.sampled_from([-1, 0, 10**6, 2**32])))
    return f


@pytest.mark.slow
@fuzz_settings(ci=1000)
@given(data=st.data())
def test_corrupted_gguf_tokenizer_fields_are_a_clean_error(base, data):
    fields = data.draw(corrupted_fields(base[1]))
    try:
        with time_limit():
            tok = Tokenizer(tokenizer_spec_from_gguf(fields))
            tok.decode(tok.encode("hello <|im_start|> the world"))
    except ValueError as e:
        assert "tokenizer" in str(e), str(e)


# ---- GGUF metadata of the wrong type, through a real file ----------------------------------------------------------

_TYPED = st.one_of(
    st.tuples(st.just(GGUFValueType.STRING), st.text(max_size=8)),
    st.tuples(st.just(GGUFValueType.UINT32), st.sampled_from([0, 1, 2, 3, 7, 64, 2**31, 2**32 - 1])),
    st.tuples(st.just(GGUFValueType.INT32), st.integers(-2**31, 2**31 - 1)),
    st.tuples(st.just(GGUFValueType.UINT64), st.sampled_from([0, 2**63, 2**64 - 1])),
    st.tuples(st.just(GGUFValueType.FLOAT32), st.floats(width=32)),
    st.tuples(st.just(GGUFValueType.BOOL), st.booleans()),
    st.tuples(st.just(GGUFValueType.ARRAY), st.lists(st.integers(0, 1000), min_size=1, max_size=3)),
)


def _write_with(base_model, path, edits: dict) -> None:
    """The base file's tensors and metadata, with `edits` (key -> (type, value) or None = delete) applied."""
    wr = GGUFWriter(str(path), base_model.config.arch)
    for key, v in base_model.typed_fields().items():
        if key == "general.architecture":
            continue
        if key in edits:
            if edits[key] is None:
                continue
            vtype, value = edits[key]
            sub = GGUFValueType.INT32 if vtype == GGUFValueType.ARRAY else None
            wr.add_key_value(key, value, vtype, sub)
        else:
            wr.add_key_value(key, v.value, v.type, v.sub_type)
    for name in base_model.config.tensor_names():
        from specedge.models.family_base import canonical_to_gguf
        qtype, raw = base_model.stored_tensor(name)
        wr.add_tensor(canonical_to_gguf(name), raw, raw_dtype=qtype)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


@pytest.mark.slow
@fuzz_settings(ci=400)
@given(data=st.data())
def test_wrong_typed_gguf_metadata_is_a_clean_error(base, data):
    model, _, path = base
    keys = sorted(k for k in model.typed_fields() if k != "general.architecture")
    edits = data.draw(st.dictionaries(st.sampled_from(keys), st.none() | _TYPED, min_size=1, max_size=3))
    _write_with(model, path, edits)
    try:
        with time_limit():
            m = open_gguf(path)
            Tokenizer(m.tokenizer_spec()).encode("hi there")
            m.load_weights()
    except ModelFileError as e:
        assert str(path) in str(e) and ("re-download" in str(e) or "supported" in str(e)), str(e)


@pytest.mark.parametrize("key, value, match", [
    ("llama.attention.head_count", (GGUFValueType.UINT32, 0), "head_count is 0"),
    ("llama.attention.head_count_kv", (GGUFValueType.UINT32, 0), "positive integers"),
    ("llama.block_count", (GGUFValueType.UINT32, 2**32 - 1), "block_count is 4294967295"),
    ("llama.embedding_length", (GGUFValueType.STRING, "wide"), "bad model metadata"),
    ("tokenizer.ggml.eos_token_id", (GGUFValueType.UINT32, 10**6), "eos_token_id = 1000000 is not a token id"),
    ("tokenizer.ggml.tokens", (GGUFValueType.ARRAY, [1, 2, 3]), "tokenizer.ggml.tokens must be an array of str"),
])
def test_wrong_metadata_errors_name_key_and_fix(base, key, value, match):
    model, _, path = base
    _write_with(model, path, {key: value})
    with pytest.raises(ModelFileError, match=match) as e:
        with time_limit():
            m = open_gguf(path)
            m.tokenizer_spec()
    assert "re-download" in str(e.value)


# ---- chat templates ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("template, match", [
    ("{{ ''.__class__.__mro__ }}", "__class__"),
    ("{{ raise_exception.__globals__ }}", "__globals__"),
    ("{{ cycler.__init__.__globals__['os'] }}", "__init__"),
    ("{{ messages.append(1) }}", "append"),
    ("{% for i in range(10**9) %}{% endfor %}", "range"),
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "range"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ 'x' * 10**10 }}", "items"),
    ("{{ [0] * 10**9 }}", "items"),
    ("{{ 7 ** 100000000 }}", "exponent"),
    ("{% for m in messages %}{{ m.content ", "does not compile"),
])
def test_hostile_chat_template_is_a_clean_error(base, template, match):
    spec = base[0].tokenizer_spec()
    tok = Tokenizer(TokenizerSpec(hf_json=spec.hf_json, bos_id=spec.bos_id, eos_ids=spec.eos_ids,
                                  chat_template=template))
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match) as e:
        with time_limit(10):
            tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "--raw" in str(e.value) and time.perf_counter() - start < 5


def test_sandbox_still_renders_real_templates(base):
    tok = Tokenizer(base[0].tokenizer_spec())
    out = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    loop = Tokenizer(TokenizerSpec(hf_json=tok.spec.hf_json, bos_id=None, eos_ids=(),
                                   chat_template="{% for i in range(3) %}{{ i * 2 }}{% endfor %}{{ 'ab' * 2 }}"))
    assert loop.apply_chat_template([]) == "024abab"
    assert np.array_equal(tok.encode("hi"), tok.encode("hi"))
