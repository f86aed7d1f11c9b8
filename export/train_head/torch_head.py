"""The draft head as a torch module (imported by model.build_head only, once torch is known to be there).

The math, per docs/train_drafter.md, unrolled for the training-time test: step j of the chain rooted at verified
position r runs at row p = r + j; step j's query attends to step 0's keys at rows <= r and to the chain's own keys
k(j', r + j'), j' = 1..j (model.py's docstring draws it).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .model import HeadConfig


def rms(x, w, eps: float):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def shift(x, n: int):
    """x [B, T, ...] moved n positions later along T (x'[p] = x[p - n], zeros before)."""
    if n == 0:
        return x
    return torch.cat((torch.zeros_like(x[:, :n]), x[:, :-n]), dim=1)


class DraftHead(nn.Module):
    def __init__(self, cfg: HeadConfig, embed: np.ndarray) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", torch.tensor(np.asarray(embed, np.float32)), persistent=False)
        for name, shape in cfg.shapes().items():
            self.register_parameter(name, nn.Parameter(torch.ones(shape) if len(shape) == 1 else torch.empty(shape)))
            if len(shape) == 2:
                nn.init.normal_(getattr(self, name), std=1.0 / math.sqrt(shape[1]))
        with torch.no_grad():  # the residual branches start small: o starts near g
            self.wo.mul_(0.1)
            self.w_down.mul_(0.1)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rope(self, x, positions):
        """x [B, heads, T, hd] rotated (NeoX / HF llama rotate-half) at positions [T]."""
        angles = positions.double()[:, None] * self.inv_freq.double()[None, :]  # float64 angles, as rope.py
        emb = torch.cat((angles, angles), dim=-1)
        return x * emb.cos().to(x.dtype) + rotate_half(x) * emb.sin().to(x.dtype)

    def _qkv(self, g, e, positions):
        c = self.cfg
        b, t, _ = g.shape
        u = torch.cat((rms(e, self.input_norm, c.rms_eps), rms(g, self.hidden_norm, c.rms_eps)), dim=-1)
        q = (u @ self.wq.T).view(b, t, c.n_heads, c.head_dim).transpose(1, 2)
        k = (u @ self.wk.T).view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = (u @ self.wv.T).view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
        group = c.n_heads // c.n_kv_heads  # query head i reads KV head i // group (HF llama's repeat_kv)
        k = self._rope(k, positions).repeat_interleave(group, dim=1)
        return self._rope(q, positions), k, v.repeat_interleave(group, dim=1)

    def _attend(self, q, first, chain, j: int):
        """Step j's attention [B, H, T, hd]: step 0's keys/values `first` at rows <= p - j, and the chain's own
        (steps 1..j in `chain`) on the diagonal: k(j', p - j + j')."""
        k0, v0 = first
        t = q.shape[2]
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        idx = torch.arange(t)
        s0 = ((q @ k0.transpose(-1, -2)) * scale).masked_fill(idx[None, :] > (idx[:, None] - j), float("-inf"))
        moved = [(shift(k.transpose(1, 2), j - jj).transpose(1, 2), shift(v.transpose(1, 2), j - jj).transpose(1, 2))
                 for jj, (k, v) in enumerate(chain, start=1)]
        sd = [(q * k).sum(-1, keepdim=True) * scale for k, _ in moved]  # [B, H, T, 1] each
        w = torch.softmax(torch.cat([s0, *sd], dim=-1), dim=-1)
        attn = w[..., :t] @ v0
        for i, (_, v) in enumerate(moved):
            attn = attn + w[..., t + i:t + i + 1] * v
        return attn

    def logits(self, o):
        """Draft logits [..., Vd] of output hidden states o [..., D] (the final norm and lm_head): the trainer
        applies it only to the rows it scores, the LM head being the head's largest matmul."""
        return rms(o, self.norm, self.cfg.rms_eps) @ self.lm_head.T

    def forward(self, taps, tokens, steps: int):
        """taps float [B, T, 3, D], tokens int64 [B, T] -> [o [B, T, D] per step]: step j's row p (logits(o))
        drafts x[p + 2] for the chain rooted at p - j."""
        c = self.cfg
        b, t = tokens.shape
        positions = torch.arange(1, t + 1)  # e = x[p + 1] sits at position p + 1
        e = self.embed[torch.cat((tokens[:, 1:], torch.zeros_like(tokens[:, :1])), dim=1)]
        g = taps.reshape(b, t, 3 * c.d_model) @ self.fc.T
        outs, first, chain = [], None, []
        for j in range(steps):
            if j:
                g = shift(outs[-1], 1)  # g(j, p) = o(j - 1, p - 1)
            q, k, v = self._qkv(g, e, positions)
            if j == 0:
                first = (k, v)
            else:
                chain.append((k, v))
            attn = self._attend(q, first, chain, j).transpose(1, 2).reshape(b, t, c.n_heads * c.head_dim)
            r = g + attn @ self.wo.T
            x = rms(r, self.post_norm, c.rms_eps)
            outs.append(r + (nn.functional.silu(x @ self.w_gate.T) * (x @ self.w_up.T)) @ self.w_down.T)
        return outs
