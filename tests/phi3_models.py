"""Tiny seeded phi3 models for tests: a transformers Phi3Config per case, the same canonical weights saved as a
Hugging Face checkpoint (save_pretrained, safetensors) and written as an F32 GGUF. Reusable by a shared family runner:
`hf_config(case)`, `canonical_weights(config_json)`, `save_hf(dir, hf_config, weights)`, `write_gguf(path, weights)`.

Cases (d_model 64, 2 layers, the tiny byte-level vocabulary of models/tiny.py):
  plain          no rope scaling, sliding_window 8 (transformers applies it; a GGUF runs without, as llama.cpp does)
  longrope       LongRoPE, original context 16 < context 64: long factors, attention factor sqrt(1 + ln 4 / ln 16)
  longrope-short LongRoPE, original context == context (256): the short factors
  partial        Phi-4-mini-like: partial_rotary_factor 0.75 of head dim 64 (rot 48), LongRoPE, tied embeddings
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.models.config import Weights
from specedge.models.families import family
from specedge.models.tiny import tiny_config, tiny_weights, write_model_gguf

CASES = ("plain", "longrope", "longrope-short", "partial")


def _factors(n: int, seed: int, lo: float, hi: float) -> list[float]:
    return [float(v) for v in np.random.default_rng(seed).uniform(lo, hi, n)]


def hf_config(case: str):
    """transformers.Phi3Config of one tiny case (module docstring)."""
    from transformers import Phi3Config
    base = tiny_config()  # the tiny vocabulary's size and special ids
    kw = dict(vocab_size=base.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              original_max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None,
              bos_token_id=base.bos_id, eos_token_id=base.eos_ids[0], pad_token_id=base.bos_id,
              tie_word_embeddings=False, attn_implementation="eager")
    half = 8  # head dim 16
    if case == "plain":
        kw.update(sliding_window=8)
    elif case in ("longrope", "longrope-short"):
        # llama.cpp rounds its context up to a multiple of 256 before choosing the factors (models/rope.py): the
        # short case's context is one, so 256 positions stay "not beyond the original 256" there too.
        kw.update(original_max_position_embeddings=16 if case == "longrope" else 256,
                  max_position_embeddings=64 if case == "longrope" else 256,
                  rope_scaling={"type": "longrope", "long_factor": _factors(half, 1, 1.0, 8.0),
                                "short_factor": _factors(half, 2, 0.5, 2.0)})
    elif case == "partial":
        half = 24  # rot 48 of head dim 64
        kw.update(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, partial_rotary_factor=0.75,
                  original_max_position_embeddings=16, tie_word_embeddings=True,
                  rope_scaling={"type": "longrope", "long_factor": _factors(half, 3, 1.0, 8.0),
                                "short_factor": _factors(half, 4, 0.5, 2.0)})
    else:
        raise ValueError(f"unknown phi3 case {case!r}; cases: {CASES}")
    return Phi3Config(**kw)


def canonical_weights(config_json: dict, seed: int = 0) -> Weights:
    """Seeded canonical weights (models/tiny.tiny_weights: peaked logits) for the config our reader makes of it."""
    cfg = family("phi3").config_from_hf(config_json)
    return Weights(cfg, tiny_weights(cfg, seed))


def save_hf(directory: Path, config, weights: Weights):
    """Phi3ForCausalLM holding `weights`, saved with save_pretrained (safetensors); returns the torch model (eval)."""
    import torch
    from transformers import Phi3ForCausalLM
    torch.manual_seed(0)
    model = Phi3ForCausalLM(config).eval()
    names = family("phi3").NAMES
    state = {names.canonical_to_hf(n): torch.from_numpy(np.array(t)) for n, t in weights.tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if config.tie_word_embeddings else set()), missing
    model.save_pretrained(directory, safe_serialization=True)
    return model


def write_gguf(path: Path, weights: Weights) -> Path:
    """`weights` as an F32 GGUF of their family (models/tiny.write_model_gguf: the tiny vocabulary, the family's keys
    and configuration tensors)."""
    return write_model_gguf(path, weights.config, dict(weights.tensors))
