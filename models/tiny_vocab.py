"""Tiny seeded vocabularies written as vocabulary-only GGUF files llama.cpp loads (`vocab_only=True`).

`tiny_spm_fields`: a few hundred SentencePiece pieces (scores, byte-fallback `<0xXX>` tokens, control and
user-defined tokens) for `tokenizer.ggml.model == "llama"`. `tiny_bpe_fields`: models/tiny.py's byte-level BPE
vocabulary under any `tokenizer.ggml.pre` name. `write_vocab_gguf` writes either with the llama hyperparameters
llama.cpp reads before the vocabulary, and no tensors.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from gguf import GGUFWriter

from .tiny import tiny_vocab, write_vocab_fields

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
# Characters every tiny SentencePiece vocabulary has as single pieces; anything else falls back to bytes.
_CHARS = SPACE + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"()-_/<>\u00e9\u4e2d"
_CORPUS = ("the quick brown fox jumps over the lazy dog while the other dogs sleep in the warm sun. "
           "compose an engaging travel blog post about a recent trip, highlighting cultural experiences "
           "and must-see attractions; write a persuasive essay on the importance of physical education. "
           "there is a theory that the answer to the question is in the reading of the introduction.")
SPM_SPECIAL = (("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("<start_of_turn>", CONTROL),
               ("<end_of_turn>", CONTROL), ("<b>", USER_DEFINED), ("\n\n", USER_DEFINED), ("  ", USER_DEFINED))


def tiny_spm_fields(seed: int = 0, *, n_pieces: int = 300, add_space_prefix: bool = True) -> dict[str, Any]:
    """`tokenizer.*` fields of a seeded SentencePiece vocabulary: specials, 256 byte tokens, single characters,
    then the corpus's most frequent in-word substrings (2-6 characters, "▁" marking a word start), scored by
    frequency with seeded jitter so merge order is not just length order."""
    rng = np.random.default_rng(seed)
    counts: Counter[str] = Counter()
    for word in _CORPUS.split(" "):
        w = SPACE + word
        for n in range(2, 7):
            counts.update(w[i:i + n] for i in range(len(w) - n + 1))
    tokens = [t for t, _ in SPM_SPECIAL] + [f"<0x{b:02X}>" for b in range(256)] + list(_CHARS)
    types = [ty for _, ty in SPM_SPECIAL] + [BYTE] * 256 + [NORMAL] * len(_CHARS)
    scores = [0.0] * (len(SPM_SPECIAL) + 256) + [-1000.0 - i for i in range(len(_CHARS))]
    known = set(tokens)
    for piece, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(tokens) >= len(SPM_SPECIAL) + 256 + len(_CHARS) + n_pieces:
            break
        if piece not in known and c > 1:
            tokens.append(piece)
            types.append(NORMAL)
            scores.append(float(np.float32(np.log(c) * 10.0 - len(piece) + rng.normal())))
            known.add(piece)
    return {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


# Merges across the places where pre-tokenizers split differently (digit runs, contractions, whitespace runs,
# camel case, punctuation before newlines), so a wrong split changes the ids.
SPLIT_MERGES = ("1 2", "12 3", "0 0", "00 0", "Ġ 1", "' s", "' t", "' re", "Ġ Ġ", "ĠĠ Ġ", "Ġ Ċ", "Ċ Ġ", ". Ċ",
                "/ Ċ", "o W", "d W", "W o", "Ġ (", "( x", "Ġ '", "? Ċ", ": Ċ", "Ġ 2", "Ġ -", "T h")


def tiny_bpe_fields(pre: str) -> dict[str, Any]:
    """`tokenizer.*` fields of models/tiny.py's byte-level BPE vocabulary plus SPLIT_MERGES, pre-tokenizer `pre`."""
    tokens, types, merges = tiny_vocab()
    n_special = sum(1 for t in types if t == CONTROL)
    specials, tokens, types = tokens[-n_special:], tokens[:-n_special], types[:-n_special]
    merges = list(merges)
    for m in SPLIT_MERGES:
        a, b = m.split(" ")
        merges.append(m)
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(NORMAL)
    tokens, types = tokens + specials, types + [CONTROL] * n_special
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"), "tokenizer.ggml.add_bos_token": False}


def write_vocab_gguf(path: str | Path, fields: Mapping[str, Any], *, name: str = "tiny-vocab") -> Path:
    """A llama-architecture GGUF holding only hyperparameters and `fields` (llama.cpp: vocab_only=True)."""
    path = Path(path)
    wr = GGUFWriter(str(path), "llama")
    wr.add_string("general.name", name)
    for key, value in {"block_count": 1, "context_length": 256, "embedding_length": 64, "feed_forward_length": 128,
                       "attention.head_count": 4, "attention.head_count_kv": 4, "rope.dimension_count": 16,
                       "vocab_size": len(fields["tokenizer.ggml.tokens"])}.items():
        wr.add_uint32(f"llama.{key}", value)
    wr.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    write_vocab_fields(wr, fields)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def vocab_texts(fields: Mapping[str, Any]) -> Iterable[str]:
    """The vocabulary's special-token texts (for tests that glue them into prose)."""
    return [t for t, ty in zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"])
            if ty in (CONTROL, USER_DEFINED)]
