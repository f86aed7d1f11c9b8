"""Write canonical weights back to a llama.cpp-loadable GGUF: a dequantized F32/F16 copy, or a layer-skip variant
(early exit at layer l = layers 0..l-1), either dequantized or with the source's stored blocks copied bit for bit
(dtype "keep": a Q4_1 drafter stays Q4_1, as fast per layer as its target).

Metadata (tokenizer, chat template, hyperparameters) is copied key by key from the source file with its
stored value types; only `general.file_type` and, for a layer subset, `{arch}.block_count` change.
Tensors go through the family's `to_gguf_layout` (llama Q/K row permutation) and `canonical_to_gguf`.

A layer subset renumbers the kept layers 0..n-1, so llama.cpp runs exactly LayerPlan(layers=subset):

    source  blk.0  blk.1  blk.2  blk.3        layers=(0, 2)
    output  blk.0         blk.1
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType

from ..models.config import ModelConfig, Weights
from ..models.gguf_in import GGUFModel

_DTYPES = {"f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
           "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16)}
# Keys the writer owns: the architecture is written by GGUFWriter itself, the alignment via add_custom_alignment.
_WRITER_KEYS = frozenset({"general.architecture", "general.alignment", "general.file_type"})


def _check_layers(layers: Sequence[int] | None, n_layers: int) -> tuple[int, ...]:
    """The kept source layers, ascending and unique; all of them when `layers` is None."""
    if layers is None:
        return tuple(range(n_layers))
    kept = tuple(int(i) for i in layers)
    if not kept or list(kept) != sorted(set(kept)) or not all(0 <= i < n_layers for i in kept):
        raise ValueError(f"layers {tuple(layers)} must be a non-empty ascending list of unique indices in "
                         f"[0, {n_layers})")
    return kept


def _source_name(name: str, kept: tuple[int, ...]) -> str:
    """Output canonical name -> the source canonical name it is copied from ('layers.1.q' -> 'layers.2.q')."""
    if not name.startswith("layers."):
        return name
    _, j, rest = name.split(".", 2)
    return f"layers.{kept[int(j)]}.{rest}"


def _copy_metadata(wr: GGUFWriter, source: GGUFModel, out_cfg: ModelConfig, file_type: LlamaFileType) -> None:
    """Every source key with its stored type; file type and block count set for the new file."""
    block_count = f"{out_cfg.arch}.block_count"
    for key, v in source.typed_fields().items():
        if key in _WRITER_KEYS:
            continue
        if key == block_count:
            v = dataclasses.replace(v, value=out_cfg.n_layers)  # keep the stored integer type
        if v.type == GGUFValueType.ARRAY and len(v.value) == 0:
            continue  # the gguf writer cannot encode an empty array; llama.cpp treats absent and empty alike
        wr.add_key_value(key, v.value, v.type, v.sub_type)
    alignment = source.metadata.get("general.alignment")
    if alignment is not None:
        wr.add_custom_alignment(int(alignment))
    wr.add_file_type(int(file_type))


def _source_file_type(source: GGUFModel) -> LlamaFileType:
    ft = source.metadata.get("general.file_type")
    return LlamaFileType(int(ft)) if ft is not None else LlamaFileType.GUESSED


def _stored(w: np.ndarray, qtype: GGMLQuantizationType) -> tuple[np.ndarray, GGMLQuantizationType]:
    """1-D tensors (norms, biases) stay F32, as llama.cpp's converter keeps them."""
    if w.ndim == 1 or qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(w, dtype=np.float32), GGMLQuantizationType.F32
    return np.ascontiguousarray(w, dtype=np.float16), qtype


def _add_tensors(wr: GGUFWriter, source: GGUFModel, weights: Weights | None, out_cfg: ModelConfig,
                 kept: tuple[int, ...], qtype: GGMLQuantizationType | None) -> None:
    for name in out_cfg.tensor_names():
        if qtype is None:  # "keep": the stored bytes, already in GGUF layout
            stored, raw = source.stored_tensor(_source_name(name, kept))
            wr.add_tensor(source.family.NAMES.canonical_to_gguf(name), raw, raw_dtype=stored)
            continue
        w = weights[_source_name(name, kept)]
        data, stored = _stored(source.family.to_gguf_layout(name, w, out_cfg), qtype)
        wr.add_tensor(source.family.NAMES.canonical_to_gguf(name), data, raw_dtype=stored)
    for name, (stored, raw) in source.config_tensors().items():  # llama3's rope_freqs: configuration, as stored
        wr.add_tensor(name, raw, raw_dtype=stored)


def write_gguf(path: str | Path, source: GGUFModel, weights: Weights | None, *, dtype: str = "f32",
               layers: Sequence[int] | None = None) -> Path:
    """Write `weights` (canonical, same config as `source`) as a GGUF with `source`'s metadata; returns the path.

    dtype: "f32" (exact), "f16" (matrices only), or "keep" (the source's stored tensors copied bit for bit;
    `weights` is then unused and may be None). layers: keep only these source layers, renumbered 0..n-1.
    The file appears atomically: it is written under a temporary name in the same folder, then renamed.
    """
    if dtype not in _DTYPES and dtype != "keep":
        raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPES) + ['keep']}")
    if dtype != "keep" and (weights is None or weights.config != source.config):
        raise ValueError(f"the weights' config does not match {source.path.name}'s; pass the weights loaded from "
                         "that file (or an unmodified-config copy of them)")
    kept = _check_layers(layers, source.config.n_layers)
    if source.config.block.layers and len(kept) != source.config.n_layers:
        # per-layer declarations (gemma3's sliding layers, smollm3's NoPE layers) come back from a GGUF by llama.cpp's
        # index rules (every 6th layer global, every 4th without RoPE): renumbered layers would run other attention
        raise ValueError(f"a layer subset of this {source.config.arch} model cannot be written as a GGUF: llama.cpp "
                         "derives its per-layer attention (sliding window / RoPE) from the layer index, so the kept "
                         "layers would run differently; use a self-speculative drafter (skip, exit) on the NumPy or "
                         "layered ONNX backend instead")
    out_cfg = dataclasses.replace(source.config, n_layers=len(kept))
    qtype, file_type = _DTYPES[dtype] if dtype != "keep" else (None, _source_file_type(source))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    wr = GGUFWriter(None, source.config.arch)
    try:
        _copy_metadata(wr, source, out_cfg, file_type)
        _add_tensors(wr, source, weights, out_cfg, kept, qtype)
        wr.write_header_to_file(tmp)
        wr.write_kv_data_to_file()
        wr.write_tensors_to_file()
        wr.close()
        os.replace(tmp, path)
    except BaseException:
        wr.close()
        tmp.unlink(missing_ok=True)
        raise
    return path
