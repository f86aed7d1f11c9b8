"""Constrained decoding: what a call's output must match (a JSON schema, a regex, a grammar) and the `Constraint`
seam the steppers use to keep speculation lossless under it.

    Grammar spec (JsonSchema | JsonObject | Regex | Lark | Gbnf)  --GrammarCompiler.compile-->  Constraint
    each round:  masks, n = constraint.allowed(draft)   # rows for positions 0..n; the draft ends at n
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

    def allowed(self, draft: Tokens) -> tuple[np.ndarray, int]:
        """(masks, n): n = how many leading draft tokens the constraint accepts; masks bool [n + 1, V], row j the
        tokens allowed after the committed tokens and draft[:j]. The state is unchanged (the draft is consumed
        tentatively and rolled back)."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance over tokens the decode committed (each was allowed by the previous row)."""
        ...
