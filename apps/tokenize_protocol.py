"""llama-server's POST /tokenize and POST /detokenize bodies for `specedge serve`: pure parsing, no I/O.

    /tokenize   {"content": str, "add_special": bool = false, "model"?: str} -> {"tokens": [int]}
    /detokenize {"tokens": [int], "model"?: str}                             -> {"content": str}

add_special true adds the model's BOS token where the model asks for one (what Engine.encode, and so the
completion routes, do with a text prompt); false adds none. Unknown fields get a 400 naming them.
"""
from __future__ import annotations

from .openai_errors import invalid


def _only(body: dict, allowed: tuple[str, ...], route: str) -> None:
    extra = [k for k in body if k not in allowed]
    if extra:
        raise invalid(f"unknown field {extra[0]!r} in POST {route}: the fields are {', '.join(allowed)}", extra[0])


def _model(body: dict) -> str | None:
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise invalid(f"model must be a string, got {m!r}", "model")
    return m


def parse_tokenize(body: dict) -> tuple[str, bool]:
    """(content, add_special) of a /tokenize body."""
    _only(body, ("content", "add_special", "model"), "/tokenize")
    _model(body)
    content = body.get("content")
    if not isinstance(content, str):
        raise invalid(f"content must be a string, got {content!r}", "content")
    add_special = body.get("add_special", False)
    if not isinstance(add_special, bool):
        raise invalid(f"add_special must be true or false, got {add_special!r}", "add_special")
    return content, add_special


def parse_detokenize(body: dict, vocab_size: int) -> list[int]:
    """The token ids of a /detokenize body, each checked to lie in [0, vocab_size)."""
    _only(body, ("tokens", "model"), "/detokenize")
    _model(body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in tokens):
        raise invalid(f"tokens must be a list of integer token ids, got {tokens!r:.80}", "tokens")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise invalid(f"token id {bad[0]} is out of range: the model's ids are 0..{vocab_size - 1}", "tokens")
    return tokens
