"""Tokenizer for the runtime: HF `tokenizers` encode/decode, streaming detokenization, sandboxed chat templates.

Built from a models.tokenizer_spec.TokenizerSpec (from GGUF today, from an artifact's tokenizer.json later).
Encoding parses special tokens in the text (llama.cpp parse_special=True) and adds no BOS unless asked.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Iterable, Sequence

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


class Tokenizer:
    """Text <-> int32 token ids for one model; immutable after construction."""

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
            vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
            merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
            blob = json.dumps({"vocab": vocab, "merges": merges}, ensure_ascii=False, separators=(",", ":"))
            self._fingerprint = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        return self._fingerprint

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role", "content"}]) with the model's template in a jinja2 sandbox."""
        from jinja2.exceptions import TemplateError
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        try:
            return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         bos_token=self.spec.bos_token or "", eos_token=self.spec.eos_token or "",
                                         range=_budget_range())  # a fresh loop budget per render
        except (TemplateError, ArithmeticError, RecursionError, TypeError, ValueError, LookupError,
                AttributeError) as e:  # whatever a broken or hostile template makes jinja2 raise
            raise ValueError(f"chat template failed: {type(e).__name__}: {e}; the model's template is broken or "
                             "unsafe: pass --raw to skip it, or re-download the model") from None


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

    def __init__(self, tokenizer: Tokenizer) -> None:
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
