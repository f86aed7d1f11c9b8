"""Constrained decoding: what a call's output must match (a JSON schema, a regex, a grammar) and the `Constraint`
seam the steppers use to keep speculation lossless under it.

    Grammar spec (JsonSchema | JsonObject | Regex | Lark | Gbnf)  --GrammarCompiler.compile-->  Constraint
    each round:  masks, n, forced = constraint.allowed(draft, k)  # the draft ends at n, + tokens the grammar forces
                 p rows = logits_to_probs(logits masked by the rows)   # the target's p, constrained
                 ... verify ...; constraint.commit(emitted)             # the matcher advances on committed tokens

Lossless statement (docs/algorithms.md 1.6): the constrained target distribution at a position is
logits_to_probs(logits with the disallowed tokens at -inf). A draft token the constraint forbids ends the draft
there (it is never verified: its p would be 0); a model drafter's q rows are masked and renormalised the same way,
so a kept draft token is distributed as the masked q (the forbidden tokens are exactly the truncated case). Greedy
constrained speculative output then equals greedy constrained plain output token for token, and sampled output
follows the constrained target distribution. The matcher never holds a token that was not committed: `allowed`
consumes the draft tentatively and rolls it back before returning.

Compiled with llguidance (the matcher llama.cpp and vLLM use) against the model's own tokenizer JSON.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, Union

import numpy as np

from .types import Tokens


# ---- what a call asks for -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class JsonSchema:
    """Output is one JSON value valid under `schema` (a JSON Schema object). strict=True refuses schema keywords
    the matcher cannot enforce (an error names them); strict=False ignores them (the output still parses as JSON
    and follows every keyword that is enforced). `name` is a label (OpenAI's json_schema.name)."""
    schema: Mapping
    strict: bool = True
    name: str | None = None


@dataclass(frozen=True)
class JsonObject:
    """Output is one JSON object (OpenAI's response_format {"type": "json_object"})."""


@dataclass(frozen=True)
class Regex:
    """Output matches `pattern` (whole output; Rust regex syntax, as llguidance reads it)."""
    pattern: str


@dataclass(frozen=True)
class Lark:
    """Output is derived from `grammar`'s `start` rule: a context-free grammar in llguidance's Lark syntax (rules,
    "literals", /regex/ tokens, %json {schema} embedding; docs: llguidance docs/syntax.md)."""
    grammar: str


@dataclass(frozen=True)
class Gbnf:
    """Output is derived from `grammar`'s `root` rule: llama.cpp's GBNF (converted to Lark by llguidance)."""
    grammar: str


Grammar = Union[JsonSchema, JsonObject, Regex, Lark, Gbnf]
GRAMMAR_TYPES = (JsonSchema, JsonObject, Regex, Lark, Gbnf)


# ---- the seam the steppers use ------------------------------------------------------------------------------------

class Constraint(Protocol):
    """One call's constraint state over committed tokens."""

    def allowed(self, draft: Tokens, room: int = 0) -> tuple[np.ndarray, int, Tokens]:
        """(masks, n, forced): n = how many leading draft tokens the constraint accepts; forced = the tokens the
        grammar forces after draft[:n] (fast-forward tokens, at most room - n), proposed as more draft; masks bool
        [n + len(forced) + 1, V], row j the tokens allowed after the committed tokens and the first j of
        draft[:n] + forced. The state is unchanged (consumed tentatively and rolled back)."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance over tokens the decode committed (each was allowed by the previous row)."""
        ...


# ---- llguidance ---------------------------------------------------------------------------------------------------

# JSON whitespace between tokens, bounded as llama.cpp's json-schema-to-grammar bounds it (`space ::= | " " |
# "\n"{1,2} [ \t]{0,20}`): a small model cannot loop on newlines forever inside a constrained value.
JSON_WHITESPACE = r"( |\n{1,2}[ \t]{0,20})?"


class GrammarCompiler:
    """Compiles grammar specs against one model's vocabulary; the llguidance tokenizer (built once, ~0.4 s for a
    49k vocabulary) is shared by every call. Thread-safe.

    tokenizer_json: the model's `tokenizers` JSON (runtime/tokenizer.py Tokenizer.spec.hf_json); n_vocab: the
    width of the target's logits (>= the tokenizer's size); eos_ids: the end-of-generation ids a finished grammar
    allows (every one of them: the model ends its turn with any)."""

    def __init__(self, tokenizer_json: str, n_vocab: int, eos_ids: Sequence[int]) -> None:
        if not eos_ids:
            raise ValueError("constrained decoding needs an end-of-generation token: the model's tokenizer has none")
        self._json, self.n_vocab, self.eos_ids = tokenizer_json, int(n_vocab), tuple(int(e) for e in eos_ids)
        self._lltok = None
        self._lock = threading.Lock()

    def _tokenizer(self):
        with self._lock:
            if self._lltok is None:
                llguidance = _llguidance()
                self._lltok = llguidance.LLTokenizer(self._json, n_vocab=self.n_vocab, eos_token=list(self.eos_ids))
            return self._lltok

    def grammar_text(self, spec: Grammar) -> str:
        """The llguidance grammar (its JSON form) for a spec; ValueError on a spec it cannot read."""
        llguidance = _llguidance()
        M = llguidance.LLMatcher
        if isinstance(spec, JsonSchema):
            if not isinstance(spec.schema, Mapping):
                raise ValueError(f"the JSON schema must be an object, got {type(spec.schema).__name__}")
            try:
                return M.grammar_from_json_schema(json.dumps(spec.schema), defaults={
                    "whitespace_pattern": JSON_WHITESPACE, "lenient": not spec.strict})
            except (ValueError, TypeError) as e:
                raise ValueError(f"the JSON schema does not compile: {e}") from None
        if isinstance(spec, JsonObject):
            return M.grammar_from_json_schema('{"type": "object"}', defaults={"whitespace_pattern": JSON_WHITESPACE})
        if isinstance(spec, Regex):
            return M.grammar_from_regex(spec.pattern)
        if isinstance(spec, Lark):
            return M.grammar_from_lark(spec.grammar)
        if isinstance(spec, Gbnf):
            try:
                return M.grammar_from_lark(llguidance.gbnf_to_lark.gbnf_to_lark(spec.grammar))
            except Exception as e:  # the converter raises its own parse errors
                raise ValueError(f"the GBNF grammar does not parse: {type(e).__name__}: {e}") from None
        raise ValueError(f"not a grammar spec: {type(spec).__name__} (use JsonSchema, JsonObject, Regex, Lark or "
                         "Gbnf)")

    def compile(self, spec: Grammar) -> "GrammarConstraint":
        """A fresh Constraint for one call; ValueError naming the problem for a grammar llguidance refuses (a bad
        regex, an unknown rule, a schema keyword it cannot enforce with strict=True)."""
        llguidance = _llguidance()
        matcher = llguidance.LLMatcher(self._tokenizer(), self.grammar_text(spec), log_level=0)
        if matcher.is_error():
            kind = type(spec).__name__
            raise ValueError(f"the {kind} grammar is not usable: {matcher.get_error()}" + (
                "; pass strict=False (json_schema.strict false) to ignore keywords that cannot be enforced"
                if isinstance(spec, JsonSchema) and spec.strict else ""))
        return GrammarConstraint(matcher, self.n_vocab, self.eos_ids)


class GrammarConstraint:
    """llguidance's matcher over committed tokens (the Constraint protocol)."""

    def __init__(self, matcher, n_vocab: int, eos_ids: Sequence[int]) -> None:
        self.m, self.V = matcher, int(n_vocab)
        self.words = (self.V + 31) // 32
        self.eos_ids = np.asarray(eos_ids, dtype=np.int64)
        self.n_masks, self.mask_s = 0, 0.0  # masks computed and the time in `allowed` (perf/constrained.py)

    def allowed(self, draft: Tokens, room: int = 0) -> tuple[np.ndarray, int, Tokens]:
        t0 = time.perf_counter()
        m = self.m
        toks = [int(t) for t in draft]
        n = m.validate_tokens(toks) if toks else 0
        for t in toks[:n]:
            if not m.consume_token(t):
                raise RuntimeError(f"the grammar matcher refused a token it had validated: {m.get_error()}")
        forced = [int(t) for t in m.compute_ff_tokens()[:room - n]] if room > n and not m.is_stopped() else []
        forced = forced[:m.validate_tokens(forced)] if forced else []
        if n and not m.rollback(n):
            raise RuntimeError(f"the grammar matcher could not roll back {n} tokens: {m.get_error()}")
        path = toks[:n] + forced
        bits = np.zeros((len(path) + 1, self.words), dtype=np.int32)
        self._fill(bits[0])
        for j, t in enumerate(path):
            if not m.consume_token(t):
                raise RuntimeError(f"the grammar matcher refused a token it had validated: {m.get_error()}")
            self._fill(bits[j + 1])
        if path and not m.rollback(len(path)):
            raise RuntimeError(f"the grammar matcher could not roll back {len(path)} tokens: {m.get_error()}")
        self.n_masks += len(path) + 1
        masks = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :self.V].astype(bool)
        if masks[:, self.eos_ids].any():  # a finished grammar may end with any end-of-generation token
            rows = masks[:, self.eos_ids].any(axis=1)
            masks[np.ix_(rows, self.eos_ids)] = True
        self.mask_s += time.perf_counter() - t0
        return masks, n, np.asarray(forced, dtype=np.int32)

    def commit(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            if self.m.is_stopped():  # the grammar ended (its EOS committed): nothing follows
                return
            if not self.m.consume_token(int(t)):
                raise RuntimeError(f"the grammar matcher refused a committed token {int(t)}: {self.m.get_error()}")

    def _fill(self, row: np.ndarray) -> None:
        self.m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self.m.is_error():
            raise RuntimeError(f"the grammar matcher failed: {self.m.get_error()}")


def mask_logits(logits: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """A copy of logits [T, V] with the tokens each row's mask forbids at -inf."""
    return np.where(masks, logits, np.float32(-np.inf)).astype(logits.dtype, copy=False)


def mask_q(q: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Draft rows q [k, V] restricted to the allowed tokens and renormalised (a row with no allowed mass stays
    zero: its draft token is forbidden, so the draft ended before it)."""
    out = np.where(masks, q, 0.0)
    s = out.sum(axis=1, keepdims=True)
    return np.divide(out, s, out=np.zeros_like(out), where=s > 0)


def _llguidance():
    try:
        import llguidance
        import llguidance.gbnf_to_lark  # noqa: F401  (the GBNF converter is a submodule)
    except ImportError as e:
        raise ImportError(f"{e}: constrained decoding needs llguidance: pip install llguidance "
                          "(a dependency of specedge: reinstall it)") from None
    return llguidance
