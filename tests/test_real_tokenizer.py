"""Our tokenizer vs llama.cpp's on the real default model, over every Spec-Bench dev prompt.

Reference: llama.cpp llama_tokenize(text, add_special=False, parse_special=True).
"""
import json

import pytest

from specedge.models.catalog import resolve_model
from specedge.models.gguf_in import open_gguf
from specedge.assembly.devset import default_devset
from specedge.runtime.tokenizer import Tokenizer

pytestmark = [pytest.mark.real, pytest.mark.llamacpp]
llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def pair():
    path = resolve_model("smollm2-135m")
    ours = Tokenizer(open_gguf(path).tokenizer_spec())
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return ours, ref


@pytest.fixture(scope="module")
def prompts() -> list[list[str]]:
    path = default_devset()
    return [json.loads(line)["turns"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _mismatches(ours, ref, texts):
    bad = []
    for text in texts:
        a = ours.encode(text).tolist()
        b = ref.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if a != b:
            bad.append(text[:80])
    return bad


def test_user_turns_match_llama_cpp(pair, prompts):
    turns = [t for p in prompts for t in p]
    bad = _mismatches(*pair, turns)
    print(f"user turns matching llama.cpp: {len(turns) - len(bad)}/{len(turns)}")
    assert not bad, f"{len(bad)}/{len(turns)} turns differ, e.g. {bad[:3]}"


def test_chat_rendered_prompts_match_llama_cpp(pair, prompts):
    ours, _ = pair
    texts = [ours.apply_chat_template([{"role": "user", "content": p[0]}]) for p in prompts]
    assert all(t.startswith("<|im_start|>") for t in texts)
    bad = _mismatches(*pair, texts)
    print(f"chat prompts matching llama.cpp: {len(texts) - len(bad)}/{len(texts)}")
    assert not bad, f"{len(bad)}/{len(texts)} chat prompts differ, e.g. {bad[:3]}"


def test_decode_round_trips(pair, prompts):
    ours, _ = pair
    for p in prompts:
        for t in p:
            assert ours.decode(ours.encode(t)) == t
