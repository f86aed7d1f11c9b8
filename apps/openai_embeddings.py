"""OpenAI's /v1/embeddings for `specedge serve`: request bodies -> texts, vectors -> the response JSON.

Request: `model`, `input` (a string or a list of strings; token-id input is refused: send text), `encoding_format`
("float", default, or "base64": the little-endian float32 bytes, as OpenAI's client decodes), `dimensions` (only
the model's own), `user`. Every other field is refused with a 400 naming it. Response: {"object": "list", "data":
[{"object": "embedding", "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}.
"""
from __future__ import annotations

import base64

import numpy as np

from .openai_errors import invalid

FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
MAX_INPUTS = 2048  # OpenAI's limit per request


def parse(body: dict) -> tuple[list[str], bool]:
    """(texts, base64?) of a request body."""
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r} for /v1/embeddings (it takes {', '.join(sorted(FIELDS))})",
                      unknown[0])
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        hint = " (token-id input is not supported: send the text)" if isinstance(texts, list) and texts and \
            all(isinstance(t, (int, list)) for t in texts) else ""
        raise invalid(f"input must be a non-empty string or list of strings{hint}", "input")
    if len(texts) > MAX_INPUTS:
        raise invalid(f"input holds {len(texts)} texts; at most {MAX_INPUTS} per request", "input")
    if any(not t for t in texts):
        raise invalid(f"input[{next(i for i, t in enumerate(texts) if not t)}] is empty: every text needs "
                      "at least one character", "input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise invalid(f'encoding_format must be "float" or "base64", got {fmt!r}', "encoding_format")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise invalid(f"user must be a string, got {body['user']!r}", "user")
    return texts, fmt == "base64"


def check_dimensions(body: dict, dim: int) -> None:
    """`dimensions` may only name the model's own (no truncated vectors: this model was not trained for them)."""
    d = body.get("dimensions")
    if d is not None and d != dim:
        raise invalid(f"dimensions must be this model's own ({dim}) or left out; got {d!r}", "dimensions")


def response(model_id: str, vectors: np.ndarray, prompt_tokens: int, b64: bool) -> dict:
    def enc(v: np.ndarray):
        return base64.b64encode(v.astype("<f4").tobytes()).decode() if b64 else [float(x) for x in v]
    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": i, "embedding": enc(v)} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
