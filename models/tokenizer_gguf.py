"""Build a Hugging Face `tokenizers.Tokenizer` from a GGUF vocabulary: byte-level BPE ("gpt2") here,
SentencePiece ("llama") in tokenizer_spm.

Reference behaviour: llama.cpp `llama_tokenize(text, add_special=False, parse_special=True)`:
CONTROL, USER_DEFINED and UNKNOWN tokens in the text encode to their ids, the rest goes through the
pre-tokenizer named by `tokenizer.ggml.pre` and then BPE merges.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from .errors import UnsupportedModelError
from .family_base import special_ids
from .tokenizer_spec import TokenizerSpec
from .tokenizer_spm import spm_options, spm_tokenizer_json

TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4

# llama.cpp's regexes (src/llama-vocab.cpp, llm_tokenizer_bpe) in the form it runs them: the contractions spelled
# out case by case instead of (?i:...), and GPT-4o's letter classes written as lookaheads without \p{M}.
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
QWEN2_PATTERN = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                 r"|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+")
GPT4O_PATTERN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
                 r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
                 r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_smollm() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


def _split_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def make() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return make


# llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT (a BPE file whose pre is "default" or absent): four regexes, each
# splitting the pieces of the one before (unicode_regex_split keeps unmatched spans as pieces of their own).
DEFAULT_PATTERNS = (r"[\p{P}\$\+<=>\^~\|]+",
                    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                    r"\p{N}+", r"[0-9][0-9][0-9]")


def _pre_default() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), behavior="isolated") for p in DEFAULT_PATTERNS]
                                   + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _pre_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp pre-tokenizes for one `tokenizer.ggml.pre` name."""

    make: Callable[[], pre_tokenizers.PreTokenizer]
    ignore_merges: bool = False  # a pre-token that is itself a vocabulary token is emitted whole (llama3 family)


_LLAMA3 = PreTokenizer(_split_then_bytes(LLAMA3_PATTERN), ignore_merges=True)
_QWEN2 = PreTokenizer(_split_then_bytes(QWEN2_PATTERN))
_GPT4O = PreTokenizer(_split_then_bytes(GPT4O_PATTERN))
_GPT2 = PreTokenizer(_pre_gpt2)
# Names as llama.cpp's llama_vocab::impl::load spells them (Llama 3.x and SmolLM3 files say "llama-bpe", Qwen3's
# "qwen2", Phi-4-mini's "gpt-4o"); "gpt2" is GPT-2's byte-level split, "default" llama.cpp's default sequence.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "llama-v3": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
    "gpt-4o": _GPT4O, "llama4": _GPT4O,
    "smollm": PreTokenizer(_pre_smollm), "gpt2": _GPT2, "default": PreTokenizer(_pre_default),
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
        bpe = models.BPE(vocab=vocab, merges=_merge_pairs(merges), byte_fallback=False,
                         ignore_merges=PRE_TOKENIZERS[pre].ignore_merges, fuse_unk=False)
    except Exception as e:  # tokenizers raises a bare Exception ("Token `x` out of vocabulary") on a bad merge
        if isinstance(e, ValueError):
            raise
        raise ValueError(f"tokenizer.ggml.merges does not fit tokenizer.ggml.tokens ({e})") from None
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = PRE_TOKENIZERS[pre].make()
    tok.decoder = decoders.ByteLevel()
    types = list(token_types) if token_types is not None else []
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, ty in enumerate(types) if ty in (TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED) and tokens[i]]
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


def _spm_json(fields: Mapping[str, Any], tokens: list[str], types: list[int] | None, cache_dir: Path | None) -> str:
    """The SentencePiece vocabulary's tokenizer JSON (tokenizer_spm.build_spm_tokenizer)."""
    scores = fields.get("tokenizer.ggml.scores")
    if scores is None:
        scores = [0.0] * len(tokens)  # llama.cpp scores every token 0 when the file has none
    if not isinstance(scores, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               for v in scores):
        raise ValueError(f"tokenizer.ggml.scores must be an array of numbers, not {type(scores).__name__}")
    if len(scores) < len(tokens):
        raise ValueError(f"tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
    return spm_tokenizer_json(tokens, scores, types, spm_options(fields), cache_dir)


def tokenizer_spec_from_gguf(fields: Mapping[str, Any], cache_dir: Path | None = None) -> TokenizerSpec:
    """TokenizerSpec from GGUF `tokenizer.*` fields (tokens, token_type and merges as full lists); a large
    SentencePiece vocabulary's build is cached under the model cache `cache_dir` (tokenizer_spm.tokenizer_cache_dir).

    requires: values as read from the file (any types: a damaged file is refused with a ValueError naming the key).
    """
    model = fields.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise UnsupportedModelError(f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); supported: "
                                    "byte-level BPE ('gpt2') and SentencePiece ('llama')")
    if not fields.get("tokenizer.ggml.tokens"):
        raise ValueError("the file's tokenizer lacks tokenizer.ggml.tokens")
    tokens = _list_of(fields, "tokenizer.ggml.tokens", str)
    types = _list_of(fields, "tokenizer.ggml.token_type", int, required=False)
    if types is not None and len(types) != len(tokens):
        raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    template = fields.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"tokenizer.chat_template must be a string, not {type(template).__name__}")
    bos, eos = _checked_ids(fields, len(tokens))
    if model == "llama":
        tok_json = _spm_json(fields, tokens, types, cache_dir)
    else:
        if fields.get("tokenizer.ggml.merges") is None:
            raise ValueError("the file's tokenizer lacks tokenizer.ggml.merges")
        merges = _list_of(fields, "tokenizer.ggml.merges", str)
        pre = str(fields.get("tokenizer.ggml.pre", "default"))
        tok_json = build_hf_tokenizer(tokens, types, merges, pre).to_str()
    return TokenizerSpec(
        hf_json=tok_json,
        bos_id=bos,
        eos_ids=eos,
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=template,
        bos_token=_token_text(tokens, bos),
        eos_token=_token_text(tokens, eos[0] if eos else None),
    )
