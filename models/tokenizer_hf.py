"""Read a Hugging Face checkpoint's tokenizer: tokenizer.json (the `tokenizers` JSON) + tokenizer_config.json.

Produces the same TokenizerSpec as the GGUF reader (export/tokenizer_gguf.py), so the manifest writer and the
runtime tokenizer do not care where a model came from. The chat template is kept as text; the runtime renders it
in its jinja2 sandbox (runtime/tokenizer.py), never with transformers.

    special ids   bos: tokenizer_config's bos_token, else config.json bos_token_id
                  eos: tokenizer_config's eos_token first, then config.json and generation_config.json eos ids
    add_bos       tokenizer_config's add_bos_token, else whether tokenizer.json's post-processor prepends bos
    template      tokenizer_config's chat_template (a string, or the "default" of a named list), else
                  chat_template.jinja, else chat_template.json
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from tokenizers import Tokenizer

from .tokenizer_spec import TokenizerSpec


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path.name} is not valid JSON ({e})") from None


def _text(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict with "content"."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def chat_template(root: Path, tok_config: Mapping[str, Any]) -> str | None:
    """The checkpoint's chat template text, from wherever this transformers version saved it."""
    value = tok_config.get("chat_template")
    if isinstance(value, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default") or next(iter(named.values()), None)
    if value:
        return str(value)
    if (root / "chat_template.jinja").is_file():
        return (root / "chat_template.jinja").read_text("utf-8")
    value = _json(root / "chat_template.json").get("chat_template")
    return str(value) if value else None


def _prepends_bos(tok: Tokenizer, bos: int | None) -> bool:
    """Whether tokenizer.json's post-processor adds bos in front (Llama 2/3 tokenizers do; Qwen2's does not)."""
    if bos is None:
        return False
    with_special = tok.encode("a", add_special_tokens=True).ids
    return bool(with_special) and with_special[0] == bos and tok.encode("a", add_special_tokens=False).ids[:1] != [bos]


def tokenizer_spec_from_hf(root: str | Path, config: Mapping[str, Any]) -> TokenizerSpec:
    """TokenizerSpec of the checkpoint directory `root`; `config` is its parsed config.json."""
    root = Path(root)
    if not (root / "tokenizer.json").is_file():
        raise ValueError(f"{root} has no tokenizer.json; only fast (`tokenizers` JSON) tokenizers are read: save one "
                         "with transformers' AutoTokenizer.from_pretrained(dir).save_pretrained(dir)")
    try:
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as e:  # tokenizers raises a plain Exception on malformed JSON
        raise ValueError(f"{root}/tokenizer.json cannot be loaded ({e})") from None
    tok_config = _json(root / "tokenizer_config.json")
    gen_config = _json(root / "generation_config.json")

    def token_id(key: str) -> int | None:
        text = _text(tok_config.get(key))
        return None if text is None else tok.token_to_id(text)

    bos = token_id("bos_token")
    if bos is None and config.get("bos_token_id") is not None:
        bos = int(config["bos_token_id"])
    eos: list[int] = []
    for i in [token_id("eos_token"), *_ids(config.get("eos_token_id")), *_ids(gen_config.get("eos_token_id"))]:
        if i is not None and i not in eos:
            eos.append(i)
    add_bos = tok_config.get("add_bos_token")
    return TokenizerSpec(
        hf_json=tok.to_str(),
        bos_id=bos,
        eos_ids=tuple(eos),
        add_bos=bool(add_bos) if add_bos is not None else _prepends_bos(tok, bos),
        chat_template=chat_template(root, tok_config),
        bos_token=None if bos is None else tok.id_to_token(bos),
        eos_token=tok.id_to_token(eos[0]) if eos else None,
    )
