"""Open any GGUF llama.cpp may run: a family model (models/gguf_in.GGUFModel) when models/families.py knows its
architecture, else a metadata-only model (MetadataGGUF) that describes the file without canonical weights.

The llama.cpp backend runs both (assembly/load.py); what needs our own weights (the NumPy backend, ONNX export,
self-speculative drafters) gets the family message ("unsupported model architecture 'gpt2'; supported: ...;
use the llama.cpp backend") from whatever asks a MetadataGGUF for weights, tensors or a tokenizer spec.
"""
from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, NoReturn

from .config import ModelConfig
from .errors import ModelFileError, UnsupportedModelError
from .catalog import repair_hint
from .gguf_in import GGUFModel, _field_value, _is_long_array, _open_reader
from .gguf_read import GGUFFile


class MetadataGGUF:
    """A GGUF whose architecture has no family module: `.path`, `.metadata`, `.config` (a description from the
    metadata: sizes the file states, 0 where it states none), `.chat_template`, `.fields(prefix)`; `.unsupported`
    is the family message, raised (UnsupportedModelError) by everything that needs canonical weights."""

    def __init__(self, path: Path, reader: GGUFFile, unsupported: str) -> None:
        self.path = path
        self._reader = reader
        self.unsupported = unsupported
        self.metadata: dict[str, Any] = {k: _field_value(f) for k, f in reader.fields.items()
                                         if not k.startswith("GGUF.") and not _is_long_array(f)}
        try:
            self.config = describe_config(self.metadata, self._n_tokens())
        except (ValueError, TypeError, ArithmeticError) as e:
            raise ModelFileError(f"{path}: bad model metadata ({e}); {repair_hint(path)}") from None

    def _n_tokens(self) -> int | None:
        tokens = self._reader.fields.get("tokenizer.ggml.tokens")
        return None if tokens is None else tokens.count

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return str(value) if value else None

    def fields(self, prefix: str) -> dict[str, Any]:
        """Every metadata field under `prefix`, long arrays included (e.g. 'tokenizer.')."""
        return {k: _field_value(f) for k, f in self._reader.fields.items() if k.startswith(prefix)}

    def _refuse(self, *_: Any, **__: Any) -> NoReturn:
        raise UnsupportedModelError(self.unsupported)

    # What needs canonical weights or our tokenizer: the family message (GGUFModel has the same methods).
    load_weights = load_tensor = raw_blocks = stored_tensor = tensor_types = config_tensors = _refuse
    tokenizer_spec = typed_fields = _refuse

    def __repr__(self) -> str:
        return f"MetadataGGUF({str(self.path)!r}, arch={self.config.arch!r}, layers={self.config.n_layers})"


def _int(meta: dict[str, Any], key: str, default: int) -> int:
    """An integer metadata value; a per-layer array (some architectures list head counts per layer) gives its max."""
    value = meta.get(key, default)
    if isinstance(value, (list, tuple)):
        value = max(value) if value else default
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{key} must be an integer, not {value!r}")
    return int(value)


def describe_config(meta: dict[str, Any], n_tokens: int | None) -> ModelConfig:
    """A ModelConfig describing a file no family reads: what llama.cpp's metadata states (layers, width, heads,
    vocabulary, training context), 0 for norm epsilon / RoPE base / feed-forward width it does not (as optimum
    artifacts do, export/optimum_export.py). It is a description: no block, no canonical tensor names."""
    arch = str(meta.get("general.architecture"))
    p = f"{arch}."
    vocab = _int(meta, p + "vocab_size", n_tokens or 0)
    if vocab < 1:
        raise ValueError("the file states no vocabulary (tokenizer.ggml.tokens or vocab_size)")
    d_model = _int(meta, p + "embedding_length", 0)
    heads = max(_int(meta, p + "attention.head_count", 1), 1)
    kv = max(_int(meta, p + "attention.head_count_kv", heads), 1)
    if heads % kv:
        kv = heads  # a per-layer pattern this description cannot hold; llama.cpp reads the real one
    head_dim = _int(meta, p + "attention.key_length", d_model // heads if d_model >= heads else 1)
    eps = meta.get(p + "attention.layer_norm_rms_epsilon", meta.get(p + "attention.layer_norm_epsilon", 0.0))
    return ModelConfig(arch=arch, n_layers=_int(meta, p + "block_count", 1), d_model=d_model, n_heads=heads,
                       n_kv_heads=kv, head_dim=max(head_dim, 1), d_ff=_int(meta, p + "feed_forward_length", 0),
                       vocab_size=vocab, rms_eps=float(eps), rope_theta=float(meta.get(p + "rope.freq_base", 0.0)),
                       context_length=_int(meta, p + "context_length", 2048), tied_embeddings=False,
                       name=str(meta.get("general.name", "")))


def open_any_gguf(path: str | Path, cache_dir: Path | None = None) -> GGUFModel | MetadataGGUF:
    """The file as a family model, or as a MetadataGGUF when no family module covers its architecture (only
    that: a damaged file still raises ModelFileError naming the problem)."""
    path = Path(path)
    reader = _open_reader(path)
    try:
        return GGUFModel(path, reader, cache_dir)
    except UnsupportedModelError as e:
        return MetadataGGUF(path, reader, str(e))
