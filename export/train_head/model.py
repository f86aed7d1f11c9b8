"""The draft head in torch, exactly docs/heads.md's math, unrolled for EAGLE-3's training-time test.

Positions are indexed by p (the sequence position whose taps or previous output feed the step). Step j of the
chain rooted at the verified position r runs at p = r + j:

    g(0, p) = fc @ concat(taps(p))             g(j, p) = o(j - 1, p - 1)      (the head's own previous output)
    e(j, p) = embed(x[p + 1])                  (teacher-forced: an accepted draft equals it)
    u = concat(RMSNorm(e, input_norm), RMSNorm(g, hidden_norm));  q, k, v = wq u, wk u, wv u, RoPE at p + 1
    step j's query at p attends to step 0's keys at positions <= r = p - j and to the chain's own keys
    k(j', r + j') for j' = 1..j (its own included), as the runtime's cache holds them
    r = g + wo attn;  o = r + MLP(RMSNorm(r, post_norm));  logits(j, p) = lm_head RMSNorm(o, norm)  ~  x[p + 2]

Only this module and train.py import torch (require_torch, at the command's start).
"""
from __future__ import annotations

import math
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
    """A DraftHead (torch.nn.Module) over the target's token embedding `embed` float32 [V, D] (already times the
    family's embedding scale; frozen, not saved)."""
    torch = require_torch()
    nn = torch.nn

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_eps) * w

    def rotate_half(x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    def shift(x, n: int):
        """x [B, T, ...] moved n positions later along T (x'[p] = x[p - n], zeros before)."""
        if n == 0:
            return x
        return torch.cat((torch.zeros_like(x[:, :n]), x[:, :-n]), dim=1)

    class DraftHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c, d = cfg, cfg.d_model
            self.cfg = c
            self.register_buffer("embed", torch.tensor(np.asarray(embed, np.float32)), persistent=False)
            for name, shape in c.shapes().items():
                self.register_parameter(name, nn.Parameter(torch.ones(shape) if len(shape) == 1
                                                           else torch.empty(shape)))
            for name, shape in c.shapes().items():
                if len(shape) == 2:
                    nn.init.normal_(getattr(self, name), std=1.0 / math.sqrt(shape[1]))
            with torch.no_grad():  # the residual branches start small: o starts near g
                self.wo.mul_(0.1)
                self.w_down.mul_(0.1)
            inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
            self.register_buffer("inv_freq", inv, persistent=False)

        def _rope(self, x, positions):
            """x [B, heads, T, hd] rotated (NeoX / HF llama rotate-half) at positions [T]."""
            angles = positions.double()[:, None] * self.inv_freq.double()[None, :]  # float64 angles, as rope.py
            emb = torch.cat((angles, angles), dim=-1)
            return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)

        def _qkv(self, g, e, positions):
            c = self.cfg
            b, t, _ = g.shape
            u = torch.cat((rms(e, self.input_norm), rms(g, self.hidden_norm)), dim=-1)
            q = (u @ self.wq.T).view(b, t, c.n_heads, c.head_dim).transpose(1, 2)
            k = (u @ self.wk.T).view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
            v = (u @ self.wv.T).view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
            group = c.n_heads // c.n_kv_heads  # query head i reads KV head i // group (HF llama's repeat_kv)
            k = self._rope(k, positions).repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            return self._rope(q, positions), k, v

        def logits(self, o):
            """Draft logits [..., Vd] of output hidden states o [..., D] (the final norm and lm_head): the trainer
            applies it only to the rows it scores, the LM head being the head's largest matmul."""
            return rms(o, self.norm) @ self.lm_head.T

        def forward(self, taps, tokens, steps: int):
            """taps float [B, T, 3, D], tokens int64 [B, T] -> [o [B, T, D] per step]: step j's row p (logits(o))
            drafts x[p + 2] for the chain rooted at p - j."""
            c = self.cfg
            b, t = tokens.shape
            positions = torch.arange(1, t + 1)  # e = x[p + 1] sits at position p + 1
            e = self.embed[torch.cat((tokens[:, 1:], torch.zeros_like(tokens[:, :1])), dim=1)]
            g = taps.reshape(b, t, 3 * c.d_model) @ self.fc.T
            idx = torch.arange(t)
            outs, k0 = [], None
            chain: list[tuple] = []
            scale = 1.0 / math.sqrt(c.head_dim)
            for j in range(steps):
                if j:
                    g = shift(outs[-1], 1)
                q, k, v = self._qkv(g, e, positions)
                if j == 0:
                    k0, v0 = k, v
                chain.append((k, v))
                s0 = (q @ k0.transpose(-1, -2)) * scale  # [B, H, T, T]
                s0 = s0.masked_fill(idx[None, :] > (idx[:, None] - j), float("-inf"))
                diag_k = [shift(kk.transpose(1, 2), j - jj).transpose(1, 2) for jj, (kk, _) in
                          enumerate(chain) if jj >= 1]
                diag_v = [shift(vv.transpose(1, 2), j - jj).transpose(1, 2) for jj, (_, vv) in
                          enumerate(chain) if jj >= 1]
                sd = [(q * kk).sum(-1, keepdim=True) * scale for kk in diag_k]  # [B, H, T, 1] each
                w = torch.softmax(torch.cat([s0, *sd], dim=-1), dim=-1)
                attn = w[..., :t] @ v0
                for i, vv in enumerate(diag_v):
                    attn = attn + w[..., t + i:t + i + 1] * vv
                attn = attn.transpose(1, 2).reshape(b, t, c.n_heads * c.head_dim)
                r = g + attn @ self.wo.T
                x = rms(r, self.post_norm)
                o = r + (torch.nn.functional.silu(x @ self.w_gate.T) * (x @ self.w_up.T)) @ self.w_down.T
                outs.append(o)
            return outs

    return DraftHead()
