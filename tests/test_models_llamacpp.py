"""The tiny GGUF is a real llama.cpp model: it loads, tokenizes like ours, and gives the same logits."""
import numpy as np
import pytest

from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import TINY_ARCHS, write_tiny_gguf
from specedge.runtime.tokenizer import Tokenizer

pytestmark = pytest.mark.llamacpp
llama_cpp = pytest.importorskip("llama_cpp")

TEXT = "<|im_start|>user\nThe cat is in the hat, and it's 12345 things 中文 😀!<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_matches_llama_cpp(tmp_path, arch):
    from specedge.runtime.backends.numpy_ref import NumpyBackend
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch, tied=arch == "llama")
    model = open_gguf(path)
    ref = llama_cpp.Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False)
    ids = Tokenizer(model.tokenizer_spec()).encode(TEXT).tolist()
    assert ids == ref.tokenize(TEXT.encode(), add_bos=False, special=True)
    backend = NumpyBackend(model.load_weights(), dtype=np.float64)
    ours = backend.forward(np.asarray(ids, np.int32), backend.new_cache(128))
    ref.eval(ids)
    theirs = np.asarray(ref.scores[:len(ids)])
    # llama.cpp keeps the KV cache in f16: agreement to ~1e-2 on logits of scale ~4 proves the Q/K un-permute.
    np.testing.assert_allclose(ours, theirs, atol=5e-2)
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() > 0.95


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_tokenizer_matches_llama_cpp_on_devset(tmp_path, arch):
    """Both pre-tokenizers (smollm, qwen2) on real prompts; the tiny merges make splits visible."""
    import json
    from specedge.assembly.devset import default_devset
    dev = default_devset()
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch)
    ours = Tokenizer(open_gguf(path).tokenizer_spec())
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    turns = [t for line in dev.read_text(encoding="utf-8").splitlines() if line for t in json.loads(line)["turns"]]
    bad = [t[:60] for t in turns if ours.encode(t).tolist() != ref.tokenize(t.encode(), add_bos=False, special=True)]
    assert not bad, f"{len(bad)}/{len(turns)} differ, e.g. {bad[:3]}"


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_feed_appends_what_forward_appends_without_the_logits(tmp_path, arch):
    """The prompt is fed with the LM head on its last row only; the cache is the one a forward leaves."""
    from specedge.runtime.backends.base import FeedingBackend
    from specedge.runtime.backends.llamacpp import LlamaCppBackend
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch)
    backend = LlamaCppBackend(path, open_gguf(path).config, n_ctx=256, n_threads=1)
    ids, nxt = np.arange(3, 90, dtype=np.int32), np.array([7, 8, 9], np.int32)
    cache = backend.new_cache(128)
    backend.forward(ids, cache)
    want = backend.forward(nxt, cache)
    cache = backend.new_cache(128)
    assert backend.feed(ids, cache) is None and cache.length == len(ids)
    assert np.array_equal(backend.forward(nxt, cache), want) and isinstance(backend, FeedingBackend)
