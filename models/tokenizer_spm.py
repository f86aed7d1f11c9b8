"""SentencePiece GGUF vocabularies (`tokenizer.ggml.model == "llama"`) as a Hugging Face `tokenizers.Tokenizer`.

Reference behaviour: llama.cpp's llm_tokenizer_spm with `llama_tokenize(text, add_special=False,
parse_special=True)`, read from src/llama-vocab.cpp:

1. CONTROL, USER_DEFINED and UNKNOWN tokens found in the raw text become their ids (Gemma's runs of spaces,
   tabs and newlines, `<start_of_turn>`, HTML tags); the text between them is a fragment.
2. Each fragment gets a leading " " when `add_space_prefix` (every fragment follows the start or a special
   token), then " " -> "▁".
3. Fragment = UTF-8 characters; repeatedly merge the adjacent pair whose concatenation is a vocabulary token
   (any type) with the highest score, leftmost on ties; characters that are no token become `<0xXX>` tokens.

(3) is a BPE whose merges are every split `a + b` of every token (a, b themselves tokens), ranked by the
score of `a + b`: the same construction as transformers' SpmConverter. Decoding follows llama.cpp's
detokenize: "▁" -> " ", byte tokens -> bytes, and the first token loses one leading space when
`add_space_prefix`.

Building for a 262k vocabulary (Gemma 3) takes ~7 s, so vocabularies of CACHE_MIN_TOKENS or more are cached
as tokenizer JSON keyed by a hash of the vocabulary and options (spm_tokenizer_json), in the model cache's
tokenizers/ folder (tokenizer_cache_dir: --cache-dir's, like the plans and gates).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Mapping, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from .catalog import model_cache_dir

TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_BYTE = 2, 3, 4, 6
SPACE = "\u2581"  # "▁", SentencePiece's visible space
SPECIAL_TYPES = (TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED)  # llama.cpp's cache_special_tokens
# Token texts llama.cpp itself marks CONTROL when the file names no eot/eom/fim id (load(): "auto-detect
# special tokens by text"): they are then partitioned out of the text like control tokens.
AUTO_EOT = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                      "<|end_of_text|>", "<EOT>", "_<EOT>"))
AUTO_EOM = frozenset(("<|eom_id|>",))
PHI3_NO_RSTRIP = frozenset(("<unk>", "<s>", "<|endoftext|>"))  # llama.cpp keeps these unstripped for Phi-3


def spm_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every split (a, b) of every token t = a + b with a and b tokens, best score of t first.

    llama.cpp merges the adjacent pair whose concatenation scores highest; BPE merges the lowest-ranked pair,
    so rank = position in this list. Ties between different tokens of equal score are ordered by id (llama.cpp
    picks the leftmost pair instead; SentencePiece scores are distinct, so real vocabularies have no such ties).
    """
    ids = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for t, i in ids.items():  # a duplicated text keeps its last id, as the vocab dict below does
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in ids and b in ids:
                ranked.append((-float(scores[i]), i, k, a, b))
    ranked.sort()
    return [(a, b) for _, _, _, a, b in ranked]


def build_spm_tokenizer(tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int] | None, *,
                        add_space_prefix: bool, unk_id: int | None, auto_control: frozenset[str] = frozenset(),
                        rstrip_special: bool = False) -> Tokenizer:
    """SentencePiece vocabulary -> tokenizers.Tokenizer that tokenizes as llama.cpp does (see module doc).

    auto_control: token texts partitioned out like control tokens whatever their type (llama.cpp's eot/eom
    detection by text); rstrip_special: llama.cpp strips the whitespace after special tokens for Phi-3 files.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    bpe = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores), unk_token=unk, byte_fallback=True,
                     fuse_unk=False, ignore_merges=False)
    tok = Tokenizer(bpe)
    steps = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix:
        steps.append(normalizers.Prepend(SPACE))
    tok.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    types = list(token_types) if token_types is not None else [1] * len(tokens)
    special = [AddedToken(t, special=True, normalized=False, rstrip=rstrip_special and t not in PHI3_NO_RSTRIP)
               for t, ty in zip(tokens, types) if t and (ty in SPECIAL_TYPES or t in auto_control)]
    tok.add_special_tokens(special)
    return tok


def spm_options(fields: Mapping[str, object]) -> dict:
    """build_spm_tokenizer's keyword options from GGUF fields, with llama.cpp's defaults for SPM vocabularies."""
    prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
    if not isinstance(prefix, bool):
        raise ValueError(f"tokenizer.ggml.add_space_prefix must be a bool, not {type(prefix).__name__}")
    unk = fields.get("tokenizer.ggml.unknown_token_id", 0)  # llama.cpp's SPM default unk id is 0
    if not isinstance(unk, int) or isinstance(unk, bool):
        raise ValueError(f"tokenizer.ggml.unknown_token_id must be an integer, not {type(unk).__name__}")
    name = fields.get("general.name")
    phi3 = isinstance(name, str) and any(s in name.lower() for s in ("phi-3", "phi3"))
    auto = (AUTO_EOT if fields.get("tokenizer.ggml.eot_token_id") is None else frozenset()) | \
        (AUTO_EOM if fields.get("tokenizer.ggml.eom_token_id") is None else frozenset())
    return {"add_space_prefix": prefix, "unk_id": unk, "auto_control": auto, "rstrip_special": phi3}


CACHE_MIN_TOKENS = 32768  # smaller vocabularies build in well under a second: not cached
_BUILD_VERSION = "spm-1"  # bump when build_spm_tokenizer's output changes, so stale cache entries are not used


def tokenizer_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """The tokenizers/ folder of the model cache `cache_dir` (--cache-dir); without one, $SPECEDGE_TOKENIZER_CACHE
    if set, else the default model cache's ($SPECEDGE_CACHE or the user cache dir + /models) tokenizers/."""
    if cache_dir is None and os.environ.get("SPECEDGE_TOKENIZER_CACHE"):
        return Path(os.environ["SPECEDGE_TOKENIZER_CACHE"])
    return model_cache_dir(cache_dir) / "tokenizers"


def vocab_key(tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int] | None,
              options: Mapping[str, object]) -> str:
    """sha256 over everything build_spm_tokenizer reads: equal keys give identical tokenizers."""
    h = hashlib.sha256(_BUILD_VERSION.encode())
    opts = {k: sorted(v) if isinstance(v, frozenset) else v for k, v in sorted(options.items())}
    for part in (list(tokens), [float(s) for s in scores[:len(tokens)]], list(token_types or []), opts):
        h.update(json.dumps(part, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def spm_tokenizer_json(tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int] | None,
                       options: Mapping[str, object], cache_dir: str | Path | None = None) -> str:
    """build_spm_tokenizer(...).to_str(), from tokenizer_cache_dir(cache_dir) for large vocabularies (written on
    first build)."""
    if len(tokens) < CACHE_MIN_TOKENS:
        return build_spm_tokenizer(tokens, scores, token_types, **options).to_str()
    path = tokenizer_cache_dir(cache_dir) / f"spm-{vocab_key(tokens, scores, token_types, options)}.json"
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    text = build_spm_tokenizer(tokens, scores, token_types, **options).to_str()
    try:  # best effort: a read-only cache only costs the rebuild next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
    return text
