"""TokenizerSpec: everything the runtime tokenizer needs, as plain serializable values."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenizerSpec:
    """A Hugging Face `tokenizers` JSON plus the special-token facts that JSON does not carry."""

    hf_json: str  # tokenizers.Tokenizer.to_str(): written into artifacts as tokenizer.json
    bos_id: int | None
    eos_ids: tuple[int, ...]  # eos first, then end-of-turn / end-of-message ids
    add_bos: bool = False  # prepend bos when encoding a prompt (tokenizer.ggml.add_bos_token)
    chat_template: str | None = None
    bos_token: str | None = None  # text of bos_id, exposed to chat templates as `bos_token`
    eos_token: str | None = None  # text of eos_ids[0], exposed as `eos_token`
