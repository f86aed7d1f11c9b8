"""Read a Hugging Face checkpoint directory: config.json -> ModelConfig, *.safetensors -> canonical float32 Weights,
tokenizer.json + tokenizer_config.json -> TokenizerSpec.

    DIR/config.json                       model_type picks the family (models/families.py family_for_hf)
    DIR/model.safetensors                 one file, or shards listed in model.safetensors.index.json
    DIR/tokenizer.json, tokenizer_config.json, generation_config.json, chat_template.jinja

Hugging Face weights are already in the canonical layout ([out, in], Q/K rows in rotate_half order, which is what
transformers' own LlamaAttention applies RoPE to), so unlike GGUF nothing is un-permuted: only names change
(family_base.HF_*_NAMES). F32 and F16 tensors are read with the `safetensors` package's NumPy API; BF16, which NumPy
has no dtype for, is read as raw uint16 from the file (its header gives the offsets) and widened exactly to float32.
"""
from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .config import ModelConfig, Weights
from .errors import ModelFileError
from .families import HF_MODEL_TYPES, family_for_hf, unsupported_variant
from .family_base import HF_IGNORED
from .tokenizer_spec import TokenizerSpec
from .tokenizer_hf import tokenizer_spec_from_hf

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
_NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def is_hf_dir(path: str | Path) -> bool:
    """A directory with a config.json: what `specedge export` treats as a Hugging Face checkpoint."""
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def via_optimum_hint(path: Path) -> str:
    return f"export it with `specedge export {path} --format onnx --weights fp32 --via optimum`"


def read_config(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / CONFIG).read_text("utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path} has no {CONFIG}: not a Hugging Face checkpoint directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{path / CONFIG} is not valid JSON ({e})") from None


def _header(file: Path) -> tuple[dict[str, Any], int]:
    """(safetensors header, byte offset of the data section): 8-byte little-endian length, then JSON."""
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelFileError(f"{file} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict):
        raise ModelFileError(f"{file} is not a safetensors file (its header is not a JSON object)")
    return header, 8 + n


def read_bf16(file: Path, name: str) -> np.ndarray:
    """One BF16 tensor widened to float32: bf16 is the top half of a float32, so `u16 << 16` is exact."""
    header, data_start = _header(file)
    meta = header[name]
    begin, end = meta["data_offsets"]
    raw = np.fromfile(file, dtype="<u2", count=(end - begin) // 2, offset=data_start + begin)
    if raw.size * 2 != end - begin:
        raise ModelFileError(f"{file} is truncated: tensor {name!r} needs bytes {begin}..{end} of its data")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(meta["shape"])


class HFModel:
    """One Hugging Face checkpoint directory: `.path`, `.hf_config` (config.json), `.config`; weights on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.hf_config = read_config(path)
        model_type = str(self.hf_config.get("model_type"))
        if (why := unsupported_variant(model_type)) is not None:
            raise ModelFileError(f"{path}: {why}; {via_optimum_hint(path)}")
        if model_type not in HF_MODEL_TYPES:
            raise ModelFileError(f"{path}: model_type {model_type!r} is not built by specedge's exporter (it builds "
                                 f"{', '.join(HF_MODEL_TYPES)}); {via_optimum_hint(path)}")
        self.family: ModuleType = family_for_hf(model_type)
        try:
            config = self.family.config_from_hf(self.hf_config)
        except (ValueError, KeyError, TypeError) as e:
            raise ModelFileError(f"{path}/{CONFIG}: {e}; {via_optimum_hint(path)}") from None
        self.config: ModelConfig = dataclasses.replace(config, name=path.name)
        self._files = self._tensor_files()
        self._dtypes: dict[str, str] = {}
        for file in sorted(set(self._files.values())):
            self._dtypes.update({n: str(m["dtype"]) for n, m in _header(file)[0].items() if n != "__metadata__"})
        unknown = [n for n in self._files if self.family.NAMES.hf_to_canonical(n) is None and not HF_IGNORED.match(n)]
        if unknown:
            raise ModelFileError(f"{path}: tensors the {model_type} builder does not know: {unknown[:5]}; "
                                 f"{via_optimum_hint(path)}")
        hf_names = self.family.NAMES
        self._names = {c: n for n in self._files if (c := hf_names.hf_to_canonical(n)) is not None}  # canonical -> HF

    def _tensor_files(self) -> dict[str, Path]:
        """Tensor name -> the safetensors file holding it (shards by the index; else every *.safetensors)."""
        index = self.path / INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text("utf-8")).get("weight_map", {})
            files = {name: self.path / file for name, file in weight_map.items()}
        else:
            files = {}
            for file in sorted(self.path.glob("*.safetensors")):
                files.update({name: file for name in _header(file)[0] if name != "__metadata__"})
        if not files:
            raise ModelFileError(f"{self.path} has no *.safetensors weights (PyTorch .bin checkpoints are not read: "
                                 "re-save with save_pretrained(dir, safe_serialization=True))")
        missing = sorted({str(f.name) for f in files.values() if not f.is_file()})
        if missing:
            raise ModelFileError(f"{self.path}: weight shards listed in {INDEX} are missing: {missing}")
        return files

    def tensor_types(self) -> dict[str, str]:
        """Canonical tensor name -> safetensors dtype ('F32', 'F16', 'BF16'), recorded per tensor in the manifest."""
        return {c: self._dtypes[n] for c, n in self._names.items()}

    def load_tensor(self, canonical: str) -> np.ndarray:
        """One canonical tensor as contiguous float32 (F16 and BF16 widen exactly)."""
        name = self._names.get(canonical)
        if name is None:
            raise ModelFileError(f"{self.path}: the checkpoint has no tensor for {canonical!r}")
        file, dtype = self._files[name], self._dtypes[name]
        if dtype == "BF16":
            return read_bf16(file, name)
        if dtype not in _NUMPY_DTYPES:
            raise ModelFileError(f"{file}: tensor {name!r} has dtype {dtype}; float32, float16 and bfloat16 are read")
        from safetensors import safe_open
        with safe_open(file, framework="numpy") as f:
            return np.ascontiguousarray(f.get_tensor(name), dtype=np.float32)

    def load_weights(self) -> Weights:
        """Every tensor the config needs (a tied head ignores a stored lm_head.weight), shape-checked."""
        try:
            return Weights(self.config, {n: self.load_tensor(n) for n in self.config.tensor_names()})
        except ValueError as e:
            if isinstance(e, ModelFileError):
                raise
            raise ModelFileError(f"{self.path}: {e}") from None

    def weight_files(self) -> list[Path]:
        return sorted(set(self._files.values()))

    def tokenizer_spec(self) -> TokenizerSpec:
        try:
            return tokenizer_spec_from_hf(self.path, self.hf_config)
        except ValueError as e:
            raise ModelFileError(f"{self.path}: {e}") from None

    def __repr__(self) -> str:
        return f"HFModel({str(self.path)!r}, arch={self.config.arch!r}, layers={self.config.n_layers})"


def open_hf(path: str | Path) -> HFModel:
    """Open a Hugging Face checkpoint directory of a family we build; ModelFileError names what is unsupported."""
    try:
        import safetensors  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("reading Hugging Face checkpoints needs safetensors: pip install 'specedge[hf]'") from e
    return HFModel(Path(path))
