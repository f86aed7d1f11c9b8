"""Tokenizers for the runtime: the TextTokenizer seam, our HF `tokenizers` implementation, streaming
detokenization and sandboxed chat templates.

TextTokenizer is what the runtime and the apps use. `Tokenizer` implements it from a
models.tokenizer_spec.TokenizerSpec (a GGUF's vocabulary or an artifact's tokenizer.json);
runtime/backends/llamacpp_tokenizer.py implements it with llama.cpp's own tokenizer, for GGUF files whose
architecture or tokenizer our code does not build. Encoding parses special tokens in the text (llama.cpp
parse_special=True) and adds no BOS unless asked; both render chat templates through `render_chat`'s sandbox.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from ..models.tokenizer_spec import TokenizerSpec
from .types import Tokens

# Used when a model ships no chat template (same layout as Qwen / SmolLM instruct models).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_REPLACEMENT = "\ufffd"


@runtime_checkable
class TextTokenizer(Protocol):
    """Text <-> int32 token ids for one model, with its special tokens and chat template; immutable."""

    bos_id: int | None
    eos_ids: tuple[int, ...]  # every end-of-generation id: eos first, then end-of-turn ids
    chat_template: str  # the model's template, or CHATML_TEMPLATE when it ships none

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, *, add_bos: bool | None = None) -> Tokens:
        """Token ids of `text`; special tokens in the text map to their ids. add_bos=None: the model's default."""
        ...

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of `ids`, special tokens included; invalid UTF-8 becomes U+FFFD. Concatenating the decodes of
        consecutive spans equals decoding them together (StreamDecoder relies on it)."""
        ...

    def fingerprint(self) -> str:
        """Equal fingerprints mean identical tokenization (a draft model must share its target's)."""
        ...

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
                            variables: Mapping[str, object] | None = None) -> str:
        """`variables`: extra template variables (e.g. `tools`, OpenAI-shaped function specs) for templates that
        read them; a template that does not ignores them."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (a piece of a multi-byte character stays partial; special tokens: their
        text)."""
        ...

    def chat_ids(self, text: str) -> Tokens:
        """The ids of one user message in the chat template, generation prompt included: what a one-turn chat
        feeds the model (the CLI, benchmarks, calibration, the parity gate)."""
        return self.encode(self.apply_chat_template([{"role": "user", "content": text}]))


RESERVED_TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "bos_token", "eos_token", "range")


def vocab_fingerprint(vocab: Mapping[str, int], merges: Sequence[str]) -> str:
    """sha256 over the vocabulary (token text -> id) and the BPE merges ("a b"): one formula for every
    TextTokenizer, so a file tokenized by llama.cpp and one tokenized by us compare equal when they should."""
    pairs = sorted(vocab.items(), key=lambda kv: kv[1])
    blob = json.dumps({"vocab": pairs, "merges": list(merges)}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def render_chat(template: str, compiled, messages: Sequence[dict], add_generation_prompt: bool, *,
                bos_token: str, eos_token: str, variables: Mapping[str, object] | None = None):
    """Render `messages` with `template` (compiled: a cached _compile_template result, or None) in the jinja2
    sandbox; returns (text, compiled). `variables`: extra template variables (`tools`, ...), which may not shadow
    the ones set here (RESERVED_TEMPLATE_VARIABLES). ValueError naming the fix on a broken or hostile template."""
    from jinja2.exceptions import TemplateError
    extra = dict(variables or {})
    clash = sorted(set(extra) & set(RESERVED_TEMPLATE_VARIABLES))
    if clash:
        raise ValueError(f"template variables {clash} are set by the renderer and cannot be passed")
    if compiled is None:
        compiled = _compile_template(template)
    try:
        return compiled.render(**extra, messages=list(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token,
                               range=_budget_range()), compiled  # a fresh loop budget per render
    except (TemplateError, ArithmeticError, RecursionError, TypeError, ValueError, LookupError,
            AttributeError) as e:  # whatever a broken or hostile template makes jinja2 raise
        raise ValueError(f"chat template failed: {type(e).__name__}: {e}; the model's template is broken or "
                         "unsafe: pass --raw to skip it, or re-download the model") from None


class Tokenizer(TextTokenizer):
    """Text <-> int32 token ids for one model from a TokenizerSpec (HF `tokenizers`); immutable after construction."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        try:
            self._hf = HFTokenizer.from_str(spec.hf_json)
        except Exception as e:  # tokenizers raises a bare Exception on JSON it cannot use
            raise ValueError(f"the tokenizer JSON does not load ({str(e)[:200]}); re-export or re-download the "
                             "model") from None
        self.bos_id = spec.bos_id
        self.eos_ids: tuple[int, ...] = tuple(spec.eos_ids)
        self.chat_template = spec.chat_template or CHATML_TEMPLATE
        self._template = None  # compiled lazily: jinja2 is only needed by chat apps
        self._fingerprint: str | None = None
        self._byte_level: bool | None = None  # the decoder maps GPT-2's byte alphabet back to bytes (lazily read)

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_bos: bool | None = None) -> Tokens:
        """Token ids of `text`; special tokens in the text map to their ids. add_bos=None: the model's default."""
        ids = self._hf.encode(text, add_special_tokens=False).ids
        if (self.spec.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Text of `ids`, special tokens included; invalid UTF-8 becomes U+FFFD."""
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def id_to_token(self, token: int) -> str | None:
        return self._hf.id_to_token(int(token))

    def fingerprint(self) -> str:
        """sha256 over vocab and merges: equal fingerprints mean identical tokenization."""
        if self._fingerprint is None:
            model = json.loads(self.spec.hf_json)["model"]
            merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
            self._fingerprint = vocab_fingerprint(model["vocab"], merges)
        return self._fingerprint

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, *,
                            variables: Mapping[str, object] | None = None) -> str:
        """Render `messages` ([{"role", "content"}]) with the model's template in a jinja2 sandbox; `variables`:
        extra template variables (`tools`)."""
        text, self._template = render_chat(self.chat_template, self._template, messages, add_generation_prompt,
                                           bos_token=self.spec.bos_token or "", eos_token=self.spec.eos_token or "",
                                           variables=variables)
        return text

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token: byte-level BPE pieces mapped back through GPT-2's byte alphabet, SentencePiece
        byte-fallback pieces (<0xNN>) as their byte, anything else (special tokens, '▁' pieces) as its decoded
        text."""
        piece = self._hf.id_to_token(int(token))
        if piece is None:
            raise ValueError(f"token id {token} is outside the vocabulary of {self.vocab_size}")
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        if self._byte_level is None:
            decoder = json.loads(self.spec.hf_json).get("decoder") or {}
            kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", []) or []]
            self._byte_level = "ByteLevel" in kinds
        table = _byte_decoder()
        if self._byte_level and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        return self.decode([token]).encode("utf-8")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable character -> the byte it stands for."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(bs, cs)}
    return _BYTE_DECODER


_BYTE_DECODER: dict[str, int] | None = None
MAX_TEMPLATE_RANGE = 1_000_000  # range() items one render may loop over, summed over every range() it calls
MAX_TEMPLATE_ITEMS = 1_000_000  # characters / items a `*` may build; `**` exponents are capped too


def _budget_range():
    """A jinja `range` that shares one budget across a render: nested loops cannot multiply into hours."""
    left = [MAX_TEMPLATE_RANGE]

    def budget_range(*args):
        from jinja2.exceptions import SecurityError
        r = range(*args)
        left[0] -= len(r)
        if left[0] < 0:
            raise SecurityError(f"the template loops over more than {MAX_TEMPLATE_RANGE} range() items")
        return r
    return budget_range


def _compile_template(source: str):
    """Compile a chat template in an immutable sandbox that refuses (not just hides) unsafe attributes and bounds
    what a render may build (range() items, `*` repetitions, `**` exponents)."""
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Strict(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def unsafe_undefined(self, obj, attribute):
            # The stock sandbox returns an Undefined that renders as ""; a probing template should fail loudly.
            raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} is not allowed")

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise SecurityError(f"exponent {right} is too large for a chat template")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_TEMPLATE_ITEMS:
                        raise SecurityError(f"`*` would build {len(seq) * n} items (at most {MAX_TEMPLATE_ITEMS})")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message: str):
        raise TemplateError(message)

    env = _Strict(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except (TemplateError, RecursionError, ValueError, TypeError) as e:
        raise ValueError(f"chat template does not compile: {type(e).__name__}: {e}; the model's template is broken: "
                         "pass --raw to skip it, or re-download the model") from None


class StreamDecoder:
    """Incremental detokenization: `push(token)` returns the newly printable text.

    Bytes of an unfinished UTF-8 character are held back until a later token completes it.
    The tokens since the last complete character are decoded together and only the stable
    new text is emitted, so concatenating every push (and `flush`) equals decoding all tokens.
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tok = tokenizer
        self._pending: list[int] = []  # tokens since the last point where the text was complete
        self._emitted = 0  # characters of decode(_pending) already returned

    def push(self, token: int) -> str:
        """Add one token; return the text it makes printable ("" while a character is incomplete)."""
        self._pending.append(int(token))
        text = self._tok.decode(self._pending)
        if text.endswith(_REPLACEMENT):
            # Trailing U+FFFD may be an unfinished character: emit only the stable text before it.
            stable = text.rstrip(_REPLACEMENT)
            out, self._emitted = stable[self._emitted:], max(self._emitted, len(stable))
            return out
        out = text[self._emitted:]
        self._pending, self._emitted = [], 0  # complete: start a fresh span so work stays O(span)
        return out

    def flush(self) -> str:
        """Emit whatever is held back (an incomplete character becomes U+FFFD) and reset."""
        text = self._tok.decode(self._pending)[self._emitted:] if self._pending else ""
        self._pending, self._emitted = [], 0
        return text
