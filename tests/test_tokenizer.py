"""Runtime tokenizer on the tiny GGUF vocabulary: round trips, special tokens, streaming, chat templates."""
import dataclasses

import numpy as np
import pytest

from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import TINY_ARCHS, tiny_vocab, write_tiny_gguf
from specedge.models.tokenizer_gguf import build_hf_tokenizer
from specedge.runtime.tokenizer import CHATML_TEMPLATE, StreamDecoder, Tokenizer

TEXTS = [
    "the cat is in the hat, and it's 12345 things",
    "Hello\n\nworld   with  spaces\ttabs\r\n",
    "emoji 😀🎉 and CJK 中文字符 and accents café naïve",
    "<|im_start|>user\nhi there<|im_end|>\n",
]


@pytest.fixture(scope="module", params=TINY_ARCHS)
def tok(request, tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("t") / "m.gguf", arch=request.param)
    return Tokenizer(open_gguf(path).tokenizer_spec())


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert tok.decode(ids) == text


def test_special_tokens_encode_to_their_ids(tok):
    tokens, _, _ = tiny_vocab()
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>").tolist()
    assert ids[0] == start and ids[-1] == end
    assert tok.eos_ids == (end,) and tok.bos_id == tokens.index("<|endoftext|>")


def test_merges_apply(tok):
    ids = tok.encode(" the").tolist()
    assert len(ids) == 1 and tok.id_to_token(ids[0]) == "Ġthe"


def test_add_bos(tok):
    assert tok.encode("hi", add_bos=True)[0] == tok.bos_id
    assert tok.encode("hi")[0] != tok.bos_id  # the tiny model says add_bos_token = False


def test_smollm_pre_splits_digits_individually(tmp_path):
    tok = Tokenizer(open_gguf(write_tiny_gguf(tmp_path / "m.gguf", arch="llama")).tokenizer_spec())
    assert [tok.decode([i]) for i in tok.encode("x 123")] == ["x", " ", "1", "2", "3"]


@pytest.mark.parametrize("text", TEXTS + ["😀" * 5 + "中" * 3 + "a😀b"])
def test_stream_decoder_concatenates_to_full_decode(tok, text):
    ids = tok.encode(text)
    dec = StreamDecoder(tok)
    pieces = [dec.push(int(i)) for i in ids]
    pieces.append(dec.flush())
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stream_decoder_holds_back_partial_utf8(tok):
    ids = tok.encode("😀").tolist()  # four byte-level tokens, one per UTF-8 byte
    assert len(ids) == 4
    dec = StreamDecoder(tok)
    assert [dec.push(i) for i in ids] == ["", "", "", "😀"]


def test_stream_decoder_flush_emits_incomplete_as_replacement(tok):
    ids = tok.encode("a😀").tolist()
    dec = StreamDecoder(tok)
    out = "".join(dec.push(i) for i in ids[:-1])
    assert out == "a"
    assert dec.flush() == "\ufffd"
    assert dec.flush() == ""


def test_chat_template_renders_chatml(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(msgs)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    ids = tok.encode(text).tolist()
    assert ids.count(tok.encode("<|im_start|>")[0]) == 3


def _with_template(tok, template):
    return Tokenizer(dataclasses.replace(tok.spec, chat_template=template))


def test_missing_template_falls_back_to_chatml(tok):
    t = _with_template(tok, None)
    assert t.chat_template == CHATML_TEMPLATE
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == tok.apply_chat_template(
        [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("evil", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set x = messages.append(1) %}{{ x }}",  # immutable sandbox: no mutating the input
])
def test_malicious_template_is_refused(tok, evil):
    with pytest.raises(ValueError, match="chat template"):
        _with_template(tok, evil).apply_chat_template([{"role": "user", "content": "x"}])


def test_template_helpers_and_errors(tok):
    t = _with_template(tok, "{{ bos_token }}|{{ eos_token }}|{% if messages|length > 1 %}"
                            "{{ raise_exception('only one message please') }}{% endif %}")
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "<|endoftext|>|<|im_end|>|"
    with pytest.raises(ValueError, match="only one message please"):
        t.apply_chat_template([{"role": "user", "content": "x"}] * 2)
    with pytest.raises(ValueError, match="does not compile"):
        _with_template(tok, "{% for %}").apply_chat_template([])


def test_fingerprint(tmp_path):
    a = Tokenizer(open_gguf(write_tiny_gguf(tmp_path / "a.gguf", seed=1)).tokenizer_spec())
    b = Tokenizer(open_gguf(write_tiny_gguf(tmp_path / "b.gguf", seed=2, n_layers=1)).tokenizer_spec())
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 64
    tokens, types, merges = tiny_vocab()
    other = build_hf_tokenizer(tokens, types, merges[:-1], "smollm")
    c = Tokenizer(dataclasses.replace(a.spec, hf_json=other.to_str()))
    assert c.fingerprint() != a.fingerprint()


def test_runtime_tokenizer_imports_stay_light():
    import subprocess
    import sys
    code = ("import sys, specedge.runtime.tokenizer; "
            "bad = [m for m in ('gguf', 'jinja2', 'torch', 'transformers') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
