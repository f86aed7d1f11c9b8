"""The draft head in torch, exactly docs/train_drafter.md's math, unrolled for EAGLE-3's training-time test.

Positions are indexed by p (the sequence position whose taps or previous output feed the step). Step j of the
chain rooted at the verified position r runs at p = r + j:

    g(0, p) = fc @ concat(taps(p))             g(j, p) = o(j - 1, p - 1)      (the head's own previous output)
    e(j, p) = embed(x[p + 1])                  (teacher-forced: an accepted draft equals it)
    u = concat(RMSNorm(e, input_norm), RMSNorm(g, hidden_norm));  q, k, v = wq u, wk u, wv u, RoPE at p + 1
    step j's query at p attends to step 0's keys at positions <= r = p - j and to the chain's own keys
    k(j', r + j') for j' = 1..j (its own included), as the runtime's cache holds them
    r = g + wo attn;  o = r + MLP(RMSNorm(r, post_norm));  logits(j, p) = lm_head RMSNorm(o, norm)  ~  x[p + 2]

torch_head.py holds the torch module; build_head imports it only after require_torch has found torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TORCH_HINT = ("install the train extra: pip install 'specedge[train]' (torch for the CPU; on Linux x86-64 "
              "pip install torch --index-url https://download.pytorch.org/whl/cpu avoids the CUDA build)")


def require_torch():
    """The torch module, or ImportError saying how to install the `train` extra."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"specedge train-drafter needs torch: {TORCH_HINT} ({e})") from None
    return torch


@dataclass(frozen=True)
class HeadConfig:
    """The head's shapes and constants (head.json's fields): the target's attention and MLP shapes."""
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab_draft: int
    rope_theta: float
    rms_eps: float

    @classmethod
    def for_target(cls, config, vocab_draft: int) -> "HeadConfig":
        """One decoder layer shaped like the target's (models/config.py ModelConfig)."""
        return cls(config.d_model, config.n_heads, config.n_kv_heads, config.head_dim, config.d_ff, vocab_draft,
                   float(config.rope_theta), float(config.rms_eps))

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """head.npz's weight arrays and their shapes (d2t, int64 [Vd], besides)."""
        d, qd, kd = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"fc": (d, 3 * d), "input_norm": (d,), "hidden_norm": (d,), "wq": (qd, 2 * d), "wk": (kd, 2 * d),
                "wv": (kd, 2 * d), "wo": (d, qd), "post_norm": (d,), "w_gate": (self.ffn, d),
                "w_up": (self.ffn, d), "w_down": (d, self.ffn), "norm": (d,), "lm_head": (self.vocab_draft, d)}


def build_head(cfg: HeadConfig, embed: np.ndarray):
    """A DraftHead (torch.nn.Module, torch_head.py) over the target's token embedding `embed` float32 [V, D]
    (already times the family's embedding scale; frozen, not saved). ImportError naming the extra without torch."""
    require_torch()
    from .torch_head import DraftHead
    return DraftHead(cfg, embed)
