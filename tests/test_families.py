"""Every model family through the shared runner (tests/family_runner.py): family x check, on tiny seeded models
built once per session as a Hugging Face checkpoint and as an F32 GGUF of the same weights.

Checks: NumPy vs llama.cpp on the GGUF (top-1 100%, max |dlogit| recorded), NumPy vs transformers on the checkpoint
(and the GGUF's config against the checkpoint's), each ONNX profile vs NumPy through verify batches and rollbacks,
tokenization vs llama.cpp's on the dev prompts and edge cases, greedy speculative == plain (n-gram and early-exit
drafters), and the chat template of a multi-turn conversation with a system prompt. Run with -s for the table;
SPECEDGE_FAMILY_REPORT=<path> writes it as JSON.
"""
import ctypes
import dataclasses
import json

import numpy as np
import pytest

from family_runner import CASE_IDS, CASES, Report, build  # (tests/ is on the path)
from verify_walk import walk_verify_steps
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.tokenizer import Tokenizer

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another, and why?"}]
EDGE = ["", " ", "  leading", "trailing  ", "a\n\nb\r\n\tc", "   \n  ", "naïve café", "中文 and 日本語",
        "emoji 😀👍🏽!", "x" * 40, "12345 678", "it's they're", "<|im_start|>user\nhi<|im_end|>", "\u00a0nbsp",
        "a  b   c    d"]
_REPORT = Report()
_BUILT: dict[str, object] = {}


@pytest.fixture(scope="session", autouse=True)
def family_report():
    yield _REPORT
    _REPORT.finish()


@pytest.fixture(scope="session")
def built_root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@pytest.fixture(params=CASES, ids=CASE_IDS)
def built(request, built_root):
    case = request.param
    if case.name not in _BUILT:
        _BUILT[case.name] = build(case, built_root)
    return _BUILT[case.name]


def _prompt_ids(b) -> np.ndarray:
    tok = Tokenizer(b.gguf.tokenizer_spec())
    text = tok.apply_chat_template(CHAT) + "The cat is in the hat, and it's 12345 things 中文 😀!"
    return tok.encode(text)[-64:]  # a SentencePiece vocabulary of a few hundred pieces spells much of it in bytes


def _needs_hf(b):
    if b.hf is None:
        pytest.skip("torch / transformers are not installed (the hf extra)")


@pytest.mark.llamacpp
def test_numpy_matches_llama_cpp(built):
    pytest.importorskip("llama_cpp")
    from specedge.runtime.backends.llamacpp import LlamaCppBackend
    ids = _prompt_ids(built)
    ref = NumpyBackend(built.gguf.load_weights(), dtype=np.float64)
    want = ref.forward(ids, ref.new_cache(128))
    llm = LlamaCppBackend(built.gguf_path, built.gguf.config, n_ctx=128, n_threads=2, f32_kv=True, flash_attn=False)
    got = llm.forward(ids, llm.new_cache(128))
    delta = float(np.abs(got - want).max())
    _REPORT.record(built.case.name, "llama.cpp", delta)
    assert (got.argmax(-1) == want.argmax(-1)).all(), f"top-1 differs; max |dlogit| {delta}"
    np.testing.assert_allclose(got, want, atol=2e-3 * max(1.0, float(np.abs(want).max())))


def test_numpy_matches_transformers(built):
    _needs_hf(built)
    import torch
    ids = _prompt_ids(built)
    with torch.no_grad():
        want = built.torch_model(torch.tensor(ids[None].astype(np.int64))).logits[0].double().numpy()
    ref = NumpyBackend(built.hf.load_weights(), dtype=np.float64)
    got = ref.forward(ids, ref.new_cache(128))
    delta = float(np.abs(got - want).max())
    _REPORT.record(built.case.name, "transformers", delta)
    np.testing.assert_allclose(got, want, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    # The GGUF of the same weights reads back as the same model (llama3: divisors for the rule, to float32 rounding).
    g, h = built.gguf.config, built.hf.config
    assert dataclasses.replace(g, name="", rope_scaling=h.rope_scaling) == dataclasses.replace(h, name="")
    gg = NumpyBackend(built.gguf.load_weights(), dtype=np.float64)
    np.testing.assert_allclose(gg.forward(ids, gg.new_cache(128)), got, atol=1e-4)


@pytest.mark.parametrize("profile", ["dynamic", "layered", "static"])
def test_onnx_profile_matches_numpy(built, profile, tmp_path):
    pytest.importorskip("onnxruntime")
    from specedge.export.onnx_export import LAYERED, ExportProfile, FloatSource, StaticShape, export_onnx
    from specedge.export.onnx_linear import ExportOptions, WeightFormat
    from specedge.runtime.backends import open_onnx
    weights = built.gguf.load_weights()
    profiles = {"dynamic": ExportProfile(), "layered": LAYERED, "static": ExportProfile.static(StaticShape(4, 48))}
    out = tmp_path / profile
    export_onnx(FloatSource(weights), out, ExportOptions(WeightFormat.FP32), profile=profiles[profile])
    got, ref = open_onnx(out, threads=1), NumpyBackend(weights)
    tol = 2e-3 * max(1.0, float(np.abs(ref.forward(np.arange(8, dtype=np.int32), ref.new_cache(8))).max()))
    walk_verify_steps(got, ref, capacity=48, prefill=9, steps=10, max_width=4, tol=tol)
    ids = _prompt_ids(built)[:40]
    delta = float(np.abs(got.forward(ids, got.new_cache(48)) - ref.forward(ids, ref.new_cache(48))).max())
    _REPORT.record(built.case.name, f"onnx-{profile}", delta)


def _dev_texts() -> list[str]:
    from specedge.assembly.devset import default_devset
    lines = default_devset().read_text(encoding="utf-8").splitlines()
    return [t for line in lines if line for t in json.loads(line)["turns"]]


@pytest.mark.llamacpp
def test_tokenizer_matches_llama_cpp(built):
    llama_cpp = pytest.importorskip("llama_cpp")
    ours = Tokenizer(built.gguf.tokenizer_spec())
    ref = llama_cpp.Llama(model_path=str(built.gguf_path), vocab_only=True, verbose=False)
    texts = _dev_texts() + EDGE
    bad = [t[:60] for t in texts
           if ours.encode(t, add_bos=False).tolist() != ref.tokenize(t.encode(), add_bos=False, special=True)]
    _REPORT.record(built.case.name, "tokenize", f"{len(texts) - len(bad)}/{len(texts)}")
    assert not bad, f"{len(bad)}/{len(texts)} differ, e.g. {bad[:3]}"
    from tokenizer_parity import ref_detokenize  # tests/tokenizer_parity.py: llama_detokenize, special tokens kept
    for t in EDGE:  # and back, as llama.cpp decodes (SentencePiece puts a space after a user-defined "\n\n")
        ids = ours.encode(t, add_bos=False).tolist()
        assert ours.decode(ids) == ref_detokenize(ref, ids).decode("utf-8", "replace"), repr(t)
        if built.case.vocab == "bpe":  # byte-level BPE decodes what it encoded
            assert ours.decode(ids) == t


def test_greedy_speculative_equals_plain(built):
    from specedge.runtime.decode import decode
    from specedge.runtime.request import Request, Speculation
    from specedge.runtime.drafters.early_exit import EarlyExitDrafter
    from specedge.runtime.drafters.ngram import NgramDrafter
    from specedge.runtime.stats import DecodeStats
    target = NumpyBackend(built.gguf.load_weights(), dtype=np.float64)
    prompt = np.concatenate([_prompt_ids(built)[:20], np.tile(_prompt_ids(built)[5:11], 3)]).astype(np.int32)

    def run(drafter, stats=None):
        return [e.token for e in decode(target, prompt, Speculation(drafter, k=4), Request(max_tokens=32, seed=0),
                                        stats=stats)]
    plain = run(None)
    drafted = []
    # exit:1 drafts with the first layer only (a layer skip keeps at least 2 layers: all of a 2-layer model)
    for name, drafter in (("ngram", NgramDrafter()), ("exit:1", EarlyExitDrafter(1))):
        stats = DecodeStats()
        assert run(drafter, stats) == plain, name
        assert stats.n_drafted > 0, name
        drafted.append(f"{name} {stats.n_accepted}/{stats.n_drafted}")
    _REPORT.record(built.case.name, "spec==plain", "; ".join(drafted))


def _llama_cpp_chat(template: str, messages: list[dict]) -> str:
    """llama.cpp's own rendering (llama_chat_apply_template: its built-in template, detected from the source)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_chat_apply_template(template.encode(), arr, len(messages), True, buf, len(buf))
    assert 0 < n <= len(buf), f"llama.cpp does not render this template ({n})"
    return buf.raw[:n].decode()


def test_chat_template_renders_a_multi_turn_conversation(built):
    tok = Tokenizer(built.gguf.tokenizer_spec())
    assert tok.chat_template == built.case.chat_template
    text = tok.apply_chat_template(CHAT)
    assert text == _llama_cpp_chat(built.case.chat_template, CHAT)
    pos = [text.index(m["content"]) for m in CHAT]
    assert pos == sorted(pos)
    _REPORT.record(built.case.name, "chat", "ok")
