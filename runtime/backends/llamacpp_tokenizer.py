"""llama.cpp's own tokenizer as a runtime TextTokenizer: for GGUF files whose architecture has no family module
or whose tokenizer models/tokenizer_gguf.py cannot build (assembly/load.py falls back to it on the llama.cpp
backend only; the NumPy backend and ONNX export refuse such files).

The same tokenizer serves mainline llama.cpp and the ik_llama.cpp fork, each through a `Vocab` of its library's
functions. Special tokens come from llama.cpp's vocabulary (llama_vocab_bos / eos / eot / is_eog / get_add_bos), text from
llama_token_to_piece per token with no leading-space strip: decoding is additive over spans, as llama.cpp's own
streaming (common_token_to_piece) is, so StreamDecoder works unchanged.
"""
from __future__ import annotations

import ctypes
from typing import Iterable, Mapping, Protocol, Sequence

import numpy as np

from ..tokenizer import CHATML_TEMPLATE, TextTokenizer, render_chat, vocab_fingerprint
from ..types import Tokens


class Vocab(Protocol):
    """The few vocabulary functions of a llama.cpp library the tokenizer needs (mainline through llama-cpp-python,
    runtime/backends/llamacpp.py; the ik_llama.cpp fork through its own ctypes binding, runtime/backends/ik_lib.py)."""

    def n_tokens(self) -> int: ...
    def bos(self) -> int: ...
    def specials(self) -> list[int]: ...  # eos, eot (ids outside the vocabulary are skipped)
    def is_eog(self, token: int) -> bool: ...
    def add_bos(self) -> bool: ...
    def text(self, token: int) -> bytes: ...  # the vocabulary entry as stored
    def piece(self, token: int, buf, size: int) -> int: ...  # llama_token_to_piece, special tokens rendered
    def tokenize(self, text: bytes) -> list[int]: ...  # parse_special=True, no BOS


class LlamaCppTokenizer(TextTokenizer):
    """TextTokenizer over a loaded llama.cpp model's vocabulary (it lives as long as the model)."""

    def __init__(self, vocab: Vocab, chat_template: str | None, merges: Sequence[str] = ()) -> None:
        """vocab: the library's vocabulary functions (holding the model alive); chat_template: the file's
        tokenizer.chat_template (None: ChatML); merges: the file's tokenizer.ggml.merges, part of the fingerprint
        (llama.cpp does not expose them)."""
        self._v = vocab
        self._n = int(vocab.n_tokens())
        bos = int(vocab.bos())
        self.bos_id: int | None = bos if 0 <= bos < self._n else None
        self._add_bos = bool(vocab.add_bos())
        eog = [i for i in range(self._n) if vocab.is_eog(i)]
        ordered = [i for i in vocab.specials() if 0 <= i < self._n] + eog
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(ordered))  # eos, eot, then every other end-of-generation
        self.chat_template = chat_template or CHATML_TEMPLATE
        self._merges = tuple(merges)
        self._pieces: dict[int, bytes] = {}
        self._template = None
        self._fingerprint: str | None = None

    @property
    def vocab_size(self) -> int:
        return self._n

    def _text(self, token: int) -> str:
        """The token's vocabulary entry as stored (e.g. 'Ġthe', '<|im_end|>')."""
        return self._v.text(token).decode("utf-8", errors="replace")

    def encode(self, text: str, *, add_bos: bool | None = None) -> Tokens:
        """llama.cpp's tokenization (parse_special=True, no BOS added by llama.cpp; ours per add_bos)."""
        ids = self._v.tokenize(text.encode("utf-8")) if text else []
        if (self._add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return np.asarray(ids, dtype=np.int32)

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            size = 64
            while True:
                buf = ctypes.create_string_buffer(size)
                n = self._v.piece(token, buf, size)
                if n >= 0:
                    break
                size = -n  # too small: llama.cpp says how many bytes it needs
            piece = self._pieces[token] = buf.raw[:n]
        return piece

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of `ids`, special tokens rendered; invalid UTF-8 becomes U+FFFD."""
        toks = [int(i) for i in ids]
        bad = [t for t in toks if not 0 <= t < self._n]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary of {self._n}")
        return b"".join(self._piece(t) for t in toks).decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        """runtime.tokenizer.vocab_fingerprint over llama.cpp's vocabulary and the file's merges: equal to our
        Tokenizer's for the same byte-level BPE vocabulary."""
        if self._fingerprint is None:
            vocab = {self._text(i): i for i in range(self._n)}  # a repeated string keeps its last id, as HF's does
            self._fingerprint = vocab_fingerprint(vocab, self._merges)
        return self._fingerprint

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (llama_token_to_piece, special tokens rendered)."""
        if not 0 <= int(token) < self._n:
            raise ValueError(f"token id {token} is outside the vocabulary of {self._n}")
        return self._piece(int(token))

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
                            variables: Mapping[str, object] | None = None) -> str:
        """The file's chat template (or ChatML) in our jinja2 sandbox, bos/eos texts from llama.cpp; `variables`:
        extra template variables (`tools`)."""
        eos = self._text(self.eos_ids[0]) if self.eos_ids else ""
        bos = "" if self.bos_id is None else self._text(self.bos_id)
        text, self._template = render_chat(self.chat_template, self._template, messages, add_generation_prompt,
                                           bos_token=bos, eos_token=eos, variables=variables)
        return text
