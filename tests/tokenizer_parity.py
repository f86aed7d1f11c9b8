"""Shared by the tokenizer-vs-llama.cpp tests: texts to compare on and llama.cpp's own tokenize / detokenize.

Reference: llama.cpp llama_tokenize(text, add_special=False, parse_special=True) and
llama_detokenize(ids, remove_special=False, unparse_special=True).
"""
from __future__ import annotations

import ctypes
import json

from specedge.assembly.devset import default_devset

# Unicode and whitespace cases where SentencePiece and byte-level BPE implementations tend to differ.
EDGE_CASES = (
    "", " ", "  ", "   leading spaces", "trailing spaces   ", "multiple   inner    spaces", "\t", "tab\tseparated\t",
    "\n", "\n\n\n", "lines\n\nand\n\n\nruns\n\n\n\n\n", " \n \n ", "\r\n windows\r\nline", "mixed \t\n \t\n",
    "emoji 😀👍🏽 and 👨‍👩‍👧", "CJK 中文字符 日本語のテキスト 한국어", "combining e\u0301 a\u0308 n\u0303",
    "\u00e9 precomposed", "Arabic مرحبا Hebrew שלום", "math ∑∫√∞ ≠ ≤", "zero\u200bwidth\u200djoiner",
    "nbsp\u00a0here", "ideographic\u3000space", "\x00\x01 control \x7f bytes", "\U0001f9ea\U0001fae0 rare emoji",
    "don't I'll we've they're it's", "DON'T SHOUT'S", "numbers 1234567 3.14159 1,000,000", "a" * 300,
    "    def f(x):\n        return x  # code\n", "<b>bold</b> and <table><tr><td>cell</td></tr></table>",
    "tokens <start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos>inline bos", "x<eos>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhello<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<unk> literal",
    "special<s>tokens</s>glued", "HelloWorld camelCase dWord XMLHttpRequest", "a path/\nnext line/\n", "▁already▁escaped", "<0x41> byte text",
)


def dev_texts() -> list[str]:
    """Every user turn of the Spec-Bench dev prompts."""
    lines = default_devset().read_text(encoding="utf-8").splitlines()
    return [t for line in lines if line.strip() for t in json.loads(line)["turns"]]


def ref_tokenize(llm, text: str) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def ref_detokenize(llm, ids: list[int]) -> bytes:
    """llama_detokenize with special tokens rendered (llama-cpp-python's own detokenize is per piece)."""
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, True)
    assert n >= 0, n
    return buf.raw[:n]


def mismatches(ours, llm, texts) -> list[tuple[str, list[int], list[int]]]:
    """(text, ours, llama.cpp's) for every text whose ids differ."""
    bad = []
    for text in texts:
        a = ours.encode(text, add_bos=False).tolist()
        b = ref_tokenize(llm, text)
        if a != b:
            bad.append((text, a, b))
    return bad
