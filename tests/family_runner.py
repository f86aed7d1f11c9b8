"""The shared family test runner (mlx-lm style): one table entry per family, each built once per session as a tiny
seeded Hugging Face checkpoint (transformers' own config class, torch CPU, saved with save_pretrained) and as an F32
GGUF of the same canonical weights (models/tiny.write_model_gguf: the family's names, layout, keys and
configuration tensors), for tests/test_families.py to check against transformers, llama.cpp and our ONNX profiles.

Adding a family: one FamilyCase below (its arch, a factory of its transformers config from the shared tiny sizes,
its GGUF vocabulary kind). The sizes are tiny (d 64, 2 layers unless the family needs more) and the weights are our
seeded ones (models/tiny.tiny_weights: peaked next-token distributions), copied into the transformers model.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specedge.models.families import family
from specedge.models.tiny import CHATML, tiny_vocab, tiny_weights, write_model_gguf
from specedge.models.tiny_vocab import tiny_spm_fields

TOKENS, _, _ = tiny_vocab()
VOCAB = len(TOKENS)
BOS, EOS = TOKENS.index("<|endoftext|>"), TOKENS.index("<|im_end|>")
SPM = tiny_spm_fields(seed=0)  # a seeded SentencePiece vocabulary (scores, byte fallback, control tokens)
# Phi-3's own template; llama.cpp recognises it (<|assistant|> and <|end|>) as its built-in "phi3"
PHI3_TEMPLATE = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")


def tiny_sizes(n_layers: int = 2, tied: bool = True, spm: bool = False, **extra: Any) -> dict[str, Any]:
    """transformers config kwargs shared by every case: d 64, 4 heads (2 KV), ff 128, the tiny byte-level vocabulary
    (spm: the tiny SentencePiece one)."""
    vocab, bos, eos = ((len(SPM["tokenizer.ggml.tokens"]), SPM["tokenizer.ggml.bos_token_id"],
                        SPM["tokenizer.ggml.eos_token_id"]) if spm else (VOCAB, BOS, EOS))
    return dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=n_layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
                rope_theta=10000.0, bos_token_id=bos, eos_token_id=eos, pad_token_id=bos, tie_word_embeddings=tied,
                **extra)


def _gemma3(t):
    from gemma3_tiny import hf_gemma3_config  # tests/gemma3_tiny.py: 6 layers, window 5, the 6th global
    return hf_gemma3_config()


def _phi3(case: str):
    from phi3_models import hf_config  # tests/phi3_models.py: the phi3 cases of tests/test_family_phi3.py
    return hf_config(case)


# llama3 RoPE on head_dim 16, theta 1e4: wavelengths 6.3 .. 2e4, so original context 64 (low 64, high 16) keeps the
# first frequency, blends the next two and scales the rest: every branch of the rule.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


@dataclass(frozen=True)
class FamilyCase:
    """One family in the runner: `hf_config(transformers)` builds its transformers config (a PretrainedConfig whose
    model_type is the family's architecture); `vocab` the GGUF vocabulary kind ("bpe": the tiny byte-level BPE
    under the family's tokenizer_pre, or `pre` when given; "spm": the tiny SentencePiece vocabulary, SPM)."""

    name: str
    arch: str
    hf_config: Callable[[Any], Any]
    vocab: str = "bpe"
    pre: str | None = None
    chat_template: str = CHATML
    seed: int = 0


CASES: tuple[FamilyCase, ...] = (
    FamilyCase("llama", "llama", lambda t: t.LlamaConfig(**tiny_sizes())),
    FamilyCase("llama3-untied", "llama", lambda t: t.LlamaConfig(**tiny_sizes(tied=False, rope_scaling=LLAMA3_ROPE)),
               seed=1),
    FamilyCase("qwen2", "qwen2", lambda t: t.Qwen2Config(**tiny_sizes(tied=False)), seed=2),
    # head_dim 32 != 64 / 4: qwen3's own head size (attention.key_length); ORT's GroupQueryAttention needs a
    # multiple of 16
    FamilyCase("qwen3", "qwen3", lambda t: t.Qwen3Config(**tiny_sizes(head_dim=32)), seed=3),
    # 4 layers: layer 3 is llama.cpp's (and the config's) NoPE layer
    FamilyCase("smollm3", "smollm3", lambda t: t.SmolLM3Config(**tiny_sizes(n_layers=4)), seed=4),
    # a Mistral checkpoint (llama block, written as a "llama" GGUF as llama.cpp's converter does) with a
    # SentencePiece vocabulary: the Llama 2 / Mistral / TinyLlama kind of file
    FamilyCase("mistral-spm", "mistral", lambda t: t.MistralConfig(**tiny_sizes(tied=False, spm=True,
                                                                                  sliding_window=None)),
               vocab="spm", seed=5),
    # (not "phi3" in the name: llama.cpp looks up Phi-3 tokens for a model so named) Phi-3.5-like LongRoPE (original context 16 < 64: the long factors, attention factor) and Phi-4-mini-like
    # partial rotary (0.75 of head dim 64) with LongRoPE and a tied head; fused qkv and gate_up
    FamilyCase("phi-longrope", "phi3", lambda t: _phi3("longrope"), chat_template=PHI3_TEMPLATE, seed=6),
    FamilyCase("phi4-mini", "phi3", lambda t: _phi3("partial"), chat_template=PHI3_TEMPLATE, seed=7),
    # (1 + w) norms, pre/post norms, q/k norms, GeGLU-tanh, sqrt(d) embedding scale, five sliding layers (window 5,
    # local RoPE base 1e4) and a global one (1e6), Gemma's turn template (llama.cpp's built-in "gemma")
    FamilyCase("gemma3", "gemma3", _gemma3, chat_template=family("gemma3").DEFAULT_CHAT_TEMPLATE, seed=8),
)
CASE_IDS = [c.name for c in CASES]


@dataclass
class Built:
    """One case built: the checkpoint directory and the GGUF, both opened, and the transformers model (None when
    torch / transformers are not installed: the GGUF is then written from the family's tiny config)."""

    case: FamilyCase
    gguf_path: Path
    gguf: Any  # GGUFModel
    hf_dir: Path | None = None
    hf: Any = None  # HFModel
    torch_model: Any = None
    onnx: dict[str, Any] = field(default_factory=dict)  # profile name -> backend, exported once


def _copy_into_torch(model, cfg, weights: dict[str, np.ndarray]) -> None:
    import torch
    names = family(cfg.arch).NAMES
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, w in weights.items():
            params[names.canonical_to_hf(name)].copy_(torch.from_numpy(w))


def build(case: FamilyCase, root: Path) -> Built:
    """The case's checkpoint (when transformers is installed) and its GGUF under `root`."""
    from specedge.models.gguf_in import open_gguf
    fam = family(case.arch)
    if case.vocab not in ("bpe", "spm"):
        raise ValueError(f"{case.name}: GGUF vocabulary kind {case.vocab!r} is not written by the runner")
    try:
        import torch
        import transformers
    except ImportError:
        return _build_without_transformers(case, root, fam)
    from specedge.models.hf_in import open_hf
    torch.manual_seed(case.seed)
    hf_cfg = case.hf_config(transformers)
    hf_cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    cfg = fam.config_from_hf(hf_cfg.to_dict())
    _copy_into_torch(model, cfg, tiny_weights(cfg, case.seed))
    hf_dir = root / f"{case.name}-hf"
    model.save_pretrained(hf_dir, safe_serialization=True)
    hf = open_hf(hf_dir)
    gguf_cfg = dataclasses.replace(hf.config, name=f"tiny-{case.name}")
    path = write_model_gguf(root / f"{case.name}.gguf", gguf_cfg, dict(hf.load_weights().tensors),
                            vocab=_vocab_fields(case, gguf_cfg), chat_template=case.chat_template)
    return Built(case, path, open_gguf(path), hf_dir, hf, model)


def _vocab_fields(case: FamilyCase, cfg) -> dict[str, Any] | None:
    """The GGUF `tokenizer.*` fields of the case (None: the tiny byte-level BPE under the family's pre-tokenizer)."""
    if case.vocab == "spm":
        return SPM
    if case.pre is not None:
        tokens, types, merges = tiny_vocab()
        return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": case.pre, "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
                "tokenizer.ggml.bos_token_id": cfg.bos_id, "tokenizer.ggml.eos_token_id": cfg.eos_ids[0],
                "tokenizer.ggml.add_bos_token": False}
    return None


def _build_without_transformers(case: FamilyCase, root: Path, fam) -> Built:
    from specedge.models.gguf_in import open_gguf
    from specedge.models.tiny import tiny_config
    if case.vocab != "bpe" or fam.ARCH != case.arch or case.arch in ("mistral", "phi3", "gemma3"):
        import pytest  # these cases are defined by their transformers config (phi3's LongRoPE, mistral's vocab)
        pytest.skip(f"{case.name} is built from its transformers config: install the hf extra")
    cfg = dataclasses.replace(tiny_config(arch=case.arch), block=fam.BLOCK)
    path = write_model_gguf(root / f"{case.name}.gguf", cfg, tiny_weights(cfg, case.seed))
    return Built(case, path, open_gguf(path))


class Report:
    """family x check -> result (max |dlogit| or "ok"); printed at the session's end (-s shows it), written as JSON
    to $SPECEDGE_FAMILY_REPORT when set."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def record(self, case: str, check: str, value: Any) -> None:
        self.rows.setdefault(case, {})[check] = value

    def table(self) -> str:
        checks = sorted({c for row in self.rows.values() for c in row})
        lines = ["family".ljust(16) + "".join(c[:24].ljust(26) for c in checks)]
        for name, row in self.rows.items():
            cells = [row.get(c, "-") for c in checks]
            lines.append(name.ljust(16) + "".join(
                (f"{v:.2e}" if isinstance(v, float) else str(v))[:24].ljust(26) for v in cells))
        return "\n".join(lines)

    def finish(self) -> None:
        if not self.rows:
            return
        print("\nfamily x check (float: max |dlogit|)\n" + self.table())
        path = os.environ.get("SPECEDGE_FAMILY_REPORT")
        if path:
            Path(path).write_text(json.dumps(self.rows, indent=1, sort_keys=True), encoding="utf-8")
