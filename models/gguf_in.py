"""Read a GGUF file: metadata -> ModelConfig, tensors -> canonical float32 Weights, vocab -> TokenizerSpec.

The file stays memory-mapped (models/gguf_read.py); tensors are dequantized (gguf-py) only by `load_weights`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.gguf_writer import GGUFValue
from gguf.quants import dequantize

from .catalog import repair_hint
from .config import ModelConfig, Weights
from .errors import ModelFileError, UnsupportedModelError
from .families import family
from .gguf_read import GGUFFile, read_gguf
from .gguf_scan import GGUFField
from .tokenizer_gguf import tokenizer_spec_from_gguf
from .tokenizer_spec import TokenizerSpec

GGUF_MAGIC = b"GGUF"
MAX_META_ARRAY = 64  # longer arrays (vocab, merges) stay out of `.metadata`; read them on demand
_Q = GGMLQuantizationType
SUPPORTED_TYPES = frozenset({_Q.F32, _Q.F16, _Q.BF16, _Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1, _Q.Q8_0,
                             _Q.Q2_K, _Q.Q3_K, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K})
LLAMACPP_RUNS_IT = "use the llama.cpp backend (--backend llamacpp), which runs any GGUF llama.cpp can load"


def _field_value(field: GGUFField) -> Any:
    value = field.contents()
    if field.types == (GGUFValueType.FLOAT32,):
        # The shortest decimal that round-trips through float32 recovers the written value (1e-5, not 9.99e-6).
        return float(str(np.float32(value)))
    return value


def _is_long_array(field: GGUFField) -> bool:
    return field.types[0] == GGUFValueType.ARRAY and field.count > MAX_META_ARRAY


def _check_magic(path: Path) -> None:
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file (starts with {head!r}, expected {GGUF_MAGIC!r}); "
                              f"pass a .gguf model file, or, if it should be one, {repair_hint(path)}")


def _open_reader(path: Path) -> GGUFFile:
    _check_magic(path)
    try:
        reader = read_gguf(path)  # bounded header walk: every count checked against the file size before use
    except (KeyboardInterrupt, MemoryError, ModelFileError):
        raise
    except Exception as e:  # a check the walk lacks: still a clean error, never a traceback
        raise ModelFileError(f"{path} is truncated or corrupt ({type(e).__name__}: {e}); {repair_hint(path)}") from e
    size = path.stat().st_size
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or t.data.nbytes != int(t.n_bytes):
            raise ModelFileError(f"{path} is truncated: tensor {t.name!r} ends at byte {end} but the file has "
                                 f"{size}; {repair_hint(path)}")
    return reader


class GGUFModel:
    """One opened GGUF file: `.path`, `.metadata`, `.config`, `.chat_template`; weights loaded on demand."""

    def __init__(self, path: Path, reader: GGUFFile, cache_dir: Path | None = None) -> None:
        self.path = path
        self.cache_dir = cache_dir  # the model cache (--cache-dir) whose tokenizers/ folder tokenizer_spec uses
        self._reader = reader
        self._spec: TokenizerSpec | None = None
        self.metadata: dict[str, Any] = {k: _field_value(f) for k, f in reader.fields.items()
                                         if not k.startswith("GGUF.") and not _is_long_array(f)}
        arch = self.metadata.get("general.architecture")
        try:
            self.family: ModuleType = family(str(arch))
        except ValueError as e:
            raise UnsupportedModelError(f"{path}: {e}; {LLAMACPP_RUNS_IT}") from None
        self._tensors = {t.name: t for t in reader.tensors}
        for t in reader.tensors:
            if t.tensor_type not in SUPPORTED_TYPES:
                names = ", ".join(sorted(q.name for q in SUPPORTED_TYPES))
                raise ModelFileError(f"{path}: tensor {t.name!r} has unsupported type {t.tensor_type.name}; "
                                     f"supported: {names}")
        shapes = {name: self._shape(t) for name, t in self._tensors.items()}
        meta = dict(self.metadata)
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if tokens is not None and f"{arch}.vocab_size" not in meta:
            meta[f"{arch}.vocab_size"] = tokens.count
        try:
            self.config: ModelConfig = self.family.config_from_gguf(meta, shapes, self._config_tensor)
        except (ValueError, TypeError, ArithmeticError) as e:  # metadata of the wrong type or zero head counts
            raise ModelFileError(f"{path}: bad model metadata ({e}); {repair_hint(path)}") from None
        names = self.family.NAMES
        unknown = [n for n in self._tensors
                   if names.gguf_to_canonical(n) is None and n not in names.gguf_config]
        if unknown:
            raise ModelFileError(f"{path}: unexpected tensors for a {arch} model: {unknown[:5]}; {repair_hint(path)}")
        if self.config.n_layers > len(self._tensors):  # every layer has tensors; also bounds tensor_names() loops
            raise ModelFileError(f"{path}: {arch}.block_count is {self.config.n_layers} but the file holds only "
                                 f"{len(self._tensors)} tensors; {repair_hint(path)}")

    def _config_tensor(self, name: str) -> np.ndarray:
        """A GGUF tensor that carries configuration (Names.gguf_config: llama3's rope_freqs), float32 as stored."""
        if name not in self.family.NAMES.gguf_config:
            raise KeyError(f"{name!r} is not a configuration tensor of the {self.family.ARCH} family")
        t = self._tensors[name]
        try:
            return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(self._shape(t))
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as e:
            raise ModelFileError(f"{self.path}: cannot decode tensor {t.name!r} ({e}); "
                                 f"{repair_hint(self.path)}") from e

    def config_tensors(self) -> dict[str, tuple[Any, np.ndarray]]:
        """GGUF name -> (GGMLQuantizationType, data as stored) of the file's configuration tensors, for writers."""
        return {n: (t.tensor_type, np.asarray(t.data)) for n, t in self._tensors.items()
                if n in self.family.NAMES.gguf_config}

    @staticmethod
    def _shape(t) -> tuple[int, ...]:
        # GGUF lists dims innermost first (ne = [in, out]); numpy row-major is the reverse.
        return tuple(reversed(t.shape))

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return str(value) if value else None

    def tensor_types(self) -> dict[str, str]:
        """Canonical tensor name -> GGUF storage type name (e.g. 'Q4_1', 'F32')."""
        names = self.family.NAMES
        return {c: t.tensor_type.name for n, t in self._tensors.items()
                if (c := names.gguf_to_canonical(n)) is not None}

    def load_tensor(self, canonical: str, dtype=np.float32) -> np.ndarray:
        """One canonical tensor dequantized into the canonical layout (family quirks undone)."""
        t = self._tensors[self.family.NAMES.canonical_to_gguf(canonical)]
        try:
            w = dequantize(t.data, t.tensor_type).reshape(self._shape(t))
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as e:
            raise ModelFileError(f"{self.path}: cannot decode tensor {t.name!r} ({e}); "
                                 f"{repair_hint(self.path)}") from e
        w = self.family.from_gguf_layout(canonical, w, self.config)
        return np.ascontiguousarray(w, dtype=dtype)

    def raw_blocks(self, canonical: str) -> tuple[str, np.ndarray]:
        """(GGUF type name, uint8 [rows, row_bytes]) in canonical row order: the stored blocks, for exact transcoding."""
        t = self._tensors[self.family.NAMES.canonical_to_gguf(canonical)]
        shape = self._shape(t)
        raw = np.asarray(t.data).view(np.uint8).reshape(shape[0] if len(shape) > 1 else 1, -1)
        return t.tensor_type.name, self.family.from_gguf_layout(canonical, raw, self.config)

    def stored_tensor(self, canonical: str) -> tuple[Any, np.ndarray]:
        """(GGMLQuantizationType, data exactly as stored: GGUF layout, quantized blocks as uint8 rows) of a tensor,
        for copying it bit for bit into another GGUF."""
        t = self._tensors[self.family.NAMES.canonical_to_gguf(canonical)]
        return t.tensor_type, np.asarray(t.data)

    def load_weights(self, dtype=np.float32) -> Weights:
        """All tensors dequantized to `dtype`, canonical names and layouts, shape-checked against the config."""
        table = self.family.NAMES
        names = [c for n in self._tensors if (c := table.gguf_to_canonical(n)) is not None]
        try:
            return Weights(self.config, {n: self.load_tensor(n, dtype) for n in names})
        except ValueError as e:
            if isinstance(e, ModelFileError):
                raise
            raise ModelFileError(f"{self.path}: {e}; {repair_hint(self.path)}") from None

    def fields(self, prefix: str) -> dict[str, Any]:
        """Every metadata field under `prefix`, long arrays included (e.g. 'tokenizer.')."""
        return {k: _field_value(f) for k, f in self._reader.fields.items() if k.startswith(prefix)}

    def typed_fields(self) -> dict[str, GGUFValue]:
        """Every real metadata key (GGUF.* pseudo-keys excluded) -> raw value with its GGUF type and array item type.

        Values are exactly as stored (no float rounding), so a writer can copy them bit for bit.
        """
        out: dict[str, GGUFValue] = {}
        for key, f in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue
            vtype, sub = f.types[0], (f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
            if sub == GGUFValueType.ARRAY or len(f.types) > 2:
                raise ModelFileError(f"{self.path}: metadata {key!r} is a nested array; not supported")
            out[key] = GGUFValue(f.contents(), vtype, sub)
        return out

    def tokenizer_spec(self) -> TokenizerSpec:
        """The file's tokenizer as a TokenizerSpec (HF tokenizers JSON + special ids + chat template)."""
        if self._spec is None:
            # general.name too: llama.cpp strips spaces after special tokens for a model named Phi-3
            fields = {**self.fields("tokenizer."), "general.name": self.metadata.get("general.name")}
            try:
                self._spec = _family_defaults(tokenizer_spec_from_gguf(fields, self.cache_dir), self.family, fields)
            except UnsupportedModelError as e:
                raise UnsupportedModelError(f"{self.path}: {e}; {LLAMACPP_RUNS_IT} with llama.cpp's own "
                                            "tokenizer") from None
            except ValueError as e:
                raise ModelFileError(f"{self.path}: {e}; {repair_hint(self.path)}") from None
        return self._spec

    def __repr__(self) -> str:
        return f"GGUFModel({str(self.path)!r}, arch={self.config.arch!r}, layers={self.config.n_layers})"


def _family_defaults(spec: TokenizerSpec, fam: ModuleType, fields: dict[str, Any]) -> TokenizerSpec:
    """The family's chat template where the file has none (gemma3: Gemma's turn format), and its end-of-turn token
    among the stop ids where the file names no eot id (llama.cpp finds gemma's <end_of_turn> by its text)."""
    template = spec.chat_template or fam.DEFAULT_CHAT_TEMPLATE
    eot = fam.END_OF_TURN
    tokens = fields.get("tokenizer.ggml.tokens") or []
    eos = spec.eos_ids
    if eot is not None and "tokenizer.ggml.eot_token_id" not in fields and eot in tokens:
        eos = (*eos, tokens.index(eot)) if tokens.index(eot) not in eos else eos
    return dataclasses.replace(spec, chat_template=template, eos_ids=eos)


def open_gguf(path: str | Path, cache_dir: Path | None = None) -> GGUFModel:
    """Open (memory-map) and validate a GGUF model file; ModelFileError names the problem. `cache_dir`: the model
    cache (--cache-dir) where its tokenizer is cached, if built from a large SentencePiece vocabulary."""
    path = Path(path)
    return GGUFModel(path, _open_reader(path), cache_dir)
