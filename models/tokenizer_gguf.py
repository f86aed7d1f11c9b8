"""Build a Hugging Face `tokenizers.Tokenizer` from a GGUF vocabulary (byte-level BPE, "gpt2" model).

Reference behaviour: llama.cpp `llama_tokenize(text, add_special=False, parse_special=True)`:
CONTROL and USER_DEFINED tokens in the text encode to their ids, the rest goes through the
pre-tokenizer named by `tokenizer.ggml.pre` and then BPE merges.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from .errors import UnsupportedModelError
from .family_base import special_ids
from .tokenizer_spec import TokenizerSpec

TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4

# Same split as llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 and Qwen2's own tokenizer.json.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_smollm() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


def _pre_qwen2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _pre_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": _pre_smollm, "qwen2": _pre_qwen2, "gpt2": _pre_gpt2, "default": _pre_gpt2,
}


def _merge_pairs(merges: Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for m in merges:
        parts = m.split(" ")
        if len(parts) != 2:  # byte-level symbols never contain a raw space
            raise ValueError(f"malformed BPE merge {m!r} in tokenizer.ggml.merges")
        pairs.append((parts[0], parts[1]))
    return pairs


def build_hf_tokenizer(tokens: Sequence[str], token_types: Sequence[int] | None, merges: Sequence[str],
                       pre: str) -> Tokenizer:
    """Byte-level BPE tokenizer: vocab = tokens (id = index), merges "a b", pre-tokenizer by name."""
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(f"unsupported tokenizer pre-tokenizer {pre!r} (tokenizer.ggml.pre); "
                         f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
    vocab = {t: i for i, t in enumerate(tokens)}  # a duplicated string keeps its last id, as in llama.cpp
    try:
        bpe = models.BPE(vocab=vocab, merges=_merge_pairs(merges), byte_fallback=False, ignore_merges=False,
                         fuse_unk=False)
    except Exception as e:  # tokenizers raises a bare Exception ("Token `x` out of vocabulary") on a bad merge
        if isinstance(e, ValueError):
            raise
        raise ValueError(f"tokenizer.ggml.merges does not fit tokenizer.ggml.tokens ({e})") from None
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    types = list(token_types) if token_types is not None else []
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, ty in enumerate(types) if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and tokens[i]]
    tok.add_special_tokens(special)
    return tok


def _token_text(tokens: Sequence[str], i: int | None) -> str | None:
    return tokens[i] if i is not None and 0 <= i < len(tokens) else None


def _list_of(fields: Mapping[str, Any], key: str, kind: type, *, required: bool = True) -> list | None:
    """fields[key] as a list whose items are all `kind`; ValueError naming the key otherwise."""
    value = fields.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{key} must be an array of {kind.__name__}, not {type(value).__name__}")
    return value


def _checked_ids(fields: Mapping[str, Any], n_tokens: int) -> tuple[int | None, tuple[int, ...]]:
    """special_ids() with every id an integer inside the vocabulary."""
    for key in ("bos", "eos", "eot", "eom"):
        v = fields.get(f"tokenizer.ggml.{key}_token_id")
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n_tokens):
            raise ValueError(f"tokenizer.ggml.{key}_token_id = {v!r} is not a token id (the vocabulary has "
                             f"{n_tokens} tokens)")
    return special_ids(fields)


def tokenizer_spec_from_gguf(fields: Mapping[str, Any]) -> TokenizerSpec:
    """TokenizerSpec from GGUF `tokenizer.*` fields (tokens, token_type and merges as full lists).

    requires: values as read from the file (any types: a damaged file is refused with a ValueError naming the key).
    """
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedModelError(f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); only byte-level BPE "
                         "('gpt2') is supported, not SentencePiece ('llama') or others")
    if not fields.get("tokenizer.ggml.tokens") or fields.get("tokenizer.ggml.merges") is None:
        raise ValueError("the file's tokenizer lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    tokens = _list_of(fields, "tokenizer.ggml.tokens", str)
    merges = _list_of(fields, "tokenizer.ggml.merges", str)
    types = _list_of(fields, "tokenizer.ggml.token_type", int, required=False)
    if types is not None and len(types) != len(tokens):
        raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    template = fields.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"tokenizer.chat_template must be a string, not {type(template).__name__}")
    pre = str(fields.get("tokenizer.ggml.pre", "default"))
    tok = build_hf_tokenizer(tokens, types, merges, pre)
    bos, eos = _checked_ids(fields, len(tokens))
    return TokenizerSpec(
        hf_json=tok.to_str(),
        bos_id=bos,
        eos_ids=eos,
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=template,
        bos_token=_token_text(tokens, bos),
        eos_token=_token_text(tokens, eos[0] if eos else None),
    )
