"""The sampling values a model states for itself, as read from its files (no defaults applied here).

    GGUF metadata               general.sampling.temp, .top_p, .top_k, .min_p (the keys llama.cpp reads)
    generation_config.json      temperature, top_p, top_k, min_p (do_sample false: greedy, temperature 0)

Export records them in an artifact's manifest as `generation` (models/manifest.py); assembly/sampling_defaults.py
resolves a loaded model's defaults from them.
"""
from __future__ import annotations

import json
import math
import numbers
from pathlib import Path
from typing import Any, Mapping

NAMES = ("temperature", "top_p", "top_k", "min_p")  # CallSettings / generation_config.json / manifest names
GGUF_KEYS = {"temperature": "general.sampling.temp", "top_p": "general.sampling.top_p",
             "top_k": "general.sampling.top_k", "min_p": "general.sampling.min_p"}


def _valid(name: str, value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):  # numpy too
        return False
    if name == "temperature":
        return value >= 0
    if name == "top_p":
        return 0 < value <= 1
    if name == "top_k":
        return int(value) == value and value >= 0
    return 0 <= value < 1  # min_p


def stated(values: Mapping[str, Any]) -> dict:
    """The valid values among NAMES; others (absent, null, out of range, of the wrong type) are left out so that
    the caller's fallback applies to them."""
    out = {}
    for name in NAMES:
        v = values.get(name)
        if v is not None and _valid(name, v):
            out[name] = int(v) if name == "top_k" else float(v)
    return out


def from_gguf_metadata(metadata: Mapping[str, Any]) -> dict:
    """The general.sampling.* values a GGUF file states, by NAMES (float32 there: 0.7 reads back as 0.7, not
    0.699999988)."""
    values = stated({name: metadata.get(key) for name, key in GGUF_KEYS.items()})
    return {k: v if isinstance(v, int) else float(f"{v:.7g}") for k, v in values.items()}


def from_generation_config(checkpoint: str | Path) -> dict:
    """The values a Hugging Face checkpoint's generation_config.json states ({} without a readable one). With
    do_sample false transformers decodes greedily whatever the warpers say: that is temperature 0."""
    try:
        raw = json.loads((Path(checkpoint) / "generation_config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    values = stated(raw)
    if raw.get("do_sample") is False and values:
        values = {"temperature": 0.0}
    return values
