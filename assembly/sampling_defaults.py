"""The model's own sampling defaults: what a call that leaves temperature / top_p / top_k / min_p unset samples with.

One resolution for the CLI (generate, chat), the Engine (apps/api.py) and the server, in this order:

    1. a GGUF file's metadata   general.sampling.temp, .top_p, .top_k, .min_p   (the keys llama.cpp reads)
    2. an ONNX artifact's manifest `generation` {temperature, top_p, top_k, min_p}, recorded at export from the
       source (the GGUF keys above, or a checkpoint's generation_config.json; models/generation.py)
    3. CHAT_DEFAULTS: temperature 0.7, top_p 0.9 (top_k and min_p off), repeat_penalty 1.1 over the last 64 tokens

Each field falls back on its own: a model that states only its temperature gets top_p 0.9. An explicit value,
temperature 0 (greedy) included, always wins (CallSettings.sampling). The repeat penalty applies to sampled calls
only: a greedy call (temperature 0) is exactly greedy unless it sets repeat_penalty itself. Why 1.1: with 0.7 / 0.9
alone, 6 of 20 SmolLM2-135M chat answers on the dev prompts looped (a 16-token span 3 times) and one ran to the
context limit; with repeat_penalty 1.1 over 64 tokens (Ollama's default) 1 of 20 did (perf/loop_rate.py,
docs/algorithms.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from ..models.generation import from_gguf_metadata, stated

if TYPE_CHECKING:
    from .load import LoadedModel


@dataclass(frozen=True)
class SamplingDefaults:
    """The values a call samples with when it leaves them unset; `source` says where they came from."""
    temperature: float
    top_p: float
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    source: str = "chat default"
    repeat_penalty: float = 1.0  # 1 = off; for sampled calls only (a greedy call stays exactly greedy)
    dry_multiplier: float = 0.0  # 0 = off; DRY for sampled calls only, likewise
    stated: frozenset[str] = field(default=frozenset(), compare=False)  # the fields the model stated (`source`);
    #                                                                     the others are CHAT_DEFAULTS'


# A chat default close to what instruct models ship (Llama 3, Qwen 2.5: 0.6-0.7, top_p 0.8-0.9): varied but on topic.
# Greedy (temperature 0) stays one option away and is honoured exactly.
CHAT_DEFAULTS = SamplingDefaults(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, repeat_penalty=1.1,
                                 dry_multiplier=0.8, source="chat default")


def resolve(values: Mapping[str, Any], source: str) -> SamplingDefaults:
    """CHAT_DEFAULTS with the valid stated values over them; `source` names where they came from when any did."""
    got = stated(values)
    if not got:
        return CHAT_DEFAULTS
    return SamplingDefaults(**{**asdict(CHAT_DEFAULTS), **got, "source": source, "stated": frozenset(got)})


def gguf_sampling(metadata: Mapping[str, Any]) -> SamplingDefaults:
    """The sampling defaults a GGUF file's metadata states (general.sampling.*), over CHAT_DEFAULTS."""
    return resolve(from_gguf_metadata(metadata), "gguf general.sampling")


def model_sampling(model: "LoadedModel") -> SamplingDefaults:
    """The sampling defaults of a loaded model: its GGUF metadata, else its manifest's `generation`, else
    CHAT_DEFAULTS."""
    if model.gguf is not None:
        return gguf_sampling(model.gguf.metadata)
    manifest = model.manifest
    if manifest is not None and isinstance(manifest.raw.get("generation"), dict):
        return resolve(manifest.raw["generation"], "manifest generation")
    return CHAT_DEFAULTS
