"""A tiny seeded random model written as a real GGUF file: the test double every layer can load.

`write_model_gguf` writes any ModelConfig of a registered family with given canonical weights the same way (the
family test runner, tests/family_runner.py, writes its Hugging Face models' weights with it).
The file carries the metadata keys llama.cpp expects, a ~300-token byte-level BPE vocabulary with a
ChatML template, and tensors in GGUF layout (llama Q/K rows permuted, as llama.cpp's converter does).
Weights are scaled so the next-token distribution is peaked, which keeps speculative tests meaningful.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

from . import kquants
from .config import ModelConfig
from .families import family
from .generation import GGUF_KEYS
from .rope import rotary_dim
from .tokenizer_gguf import TOKEN_CONTROL

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Hand-listed merges of common English pairs, in priority order ("Ġ" is the byte-level space).
MERGES = (
    "Ġ t", "h e", "i n", "Ġ a", "r e", "o n", "Ġt he", "e r", "Ġ s", "a t", "Ġ w", "Ġ o", "e n", "Ġ c", "i t",
    "i s", "a n", "o r", "e s", "Ġ b", "e d", "Ġ f", "in g", "Ġ p", "o u", "Ġa n", "a l", "a r", "Ġt o", "Ġ m",
    "Ġo f", "Ġ in", "Ġ d", "Ġ h", "Ġan d", "l e", "Ġt h", "Ġ is", "Ġ it", "Ġw h", "l l", "Ċ Ċ",
)
_QTYPES = {"f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
           "q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0,
           "q4_1": GGMLQuantizationType.Q4_1, "q5_0": GGMLQuantizationType.Q5_0,
           "q5_1": GGMLQuantizationType.Q5_1, "bf16": GGMLQuantizationType.BF16,
           "q4_k": GGMLQuantizationType.Q4_K, "q5_k": GGMLQuantizationType.Q5_K,
           "q6_k": GGMLQuantizationType.Q6_K}
_FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q4_k": 15, "q5_k": 17, "q6_k": 18, "bf16": 32}


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable unicode table, in byte order (bytes_to_unicode)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 256 byte symbols + one token per merge + ChatML special tokens."""
    tokens = _byte_symbols()
    merges: list[str] = []
    known = set(tokens)
    for m in MERGES:
        a, b = m.split(" ")
        assert a in known and b in known, f"tiny vocab merge {m!r} uses unknown parts"
        merges.append(m)
        if a + b not in known:
            tokens.append(a + b)
            known.add(a + b)
    types = [int(TokenType.NORMAL)] * len(tokens) + [TOKEN_CONTROL] * len(SPECIAL_TOKENS)
    return tokens + list(SPECIAL_TOKENS), types, merges


TINY_ARCHS = ("llama", "qwen2")  # the architectures the tiny test doubles are built in (one per tokenizer family)


def tiny_config(*, arch: str = "llama", n_layers: int = 2, d_model: int = 64, n_heads: int = 4,
                n_kv_heads: int = 2, d_ff: int = 128, context: int = 256, tied: bool = True) -> ModelConfig:
    """The ModelConfig `write_tiny_gguf` writes (qwen2 gets Q/K/V biases)."""
    tokens, _, _ = tiny_vocab()
    eos = tokens.index("<|im_end|>")
    return ModelConfig(arch=arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                       head_dim=d_model // n_heads, d_ff=d_ff, vocab_size=len(tokens), rms_eps=1e-5,
                       rope_theta=10000.0, context_length=context, tied_embeddings=tied, block=family(arch).BLOCK,
                       bos_id=tokens.index("<|endoftext|>"), eos_ids=(eos,), name=f"tiny-{arch}")


def tiny_weights(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded canonical float32 weights: N(0, c/sqrt(fan_in)) matrices, norms near 1, large embeddings."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in config.tensor_names().items():
        if name.endswith("norm"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("_bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif name in ("embed", "lm_head"):
            w = 0.5 * rng.standard_normal(shape)  # logits std ~ 0.5*sqrt(d_model): a peaked distribution
        elif name.endswith((".o", ".down")):
            # Strong residual writes, so a tied head does not just echo the input token's embedding.
            w = 3.0 / np.sqrt(shape[-1]) * rng.standard_normal(shape)
        else:
            w = 1.0 / np.sqrt(shape[-1]) * rng.standard_normal(shape)
        out[name] = w.astype(np.float32)
    return out


def _stored(name: str, w: np.ndarray, dtype: str) -> tuple[np.ndarray, GGMLQuantizationType]:
    """Encode one GGUF-layout tensor; 1-D tensors and rows not a multiple of 32 stay f32 (as llama.cpp does), K-quant
    rows not a multiple of 256 take llama.cpp's fallback type (Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0)."""
    qtype = _QTYPES[dtype]
    if w.ndim == 1 or qtype == GGMLQuantizationType.F32:
        return w.astype(np.float32), GGMLQuantizationType.F32
    if qtype == GGMLQuantizationType.F16:
        return w.astype(np.float16), qtype
    if w.shape[-1] % 32:
        return w.astype(np.float32), GGMLQuantizationType.F32
    if qtype.name in kquants.ENCODERS:  # K-quants: whole 256-superblocks, else llama.cpp's fallback type
        if w.shape[-1] % kquants.QK_K:
            qtype = GGMLQuantizationType[kquants.FALLBACK[qtype.name]]
        else:
            return kquants.ENCODERS[qtype.name](w.reshape(-1, w.shape[-1])).reshape(*w.shape[:-1], -1), qtype
    return quantize(w.astype(np.float32), qtype), qtype


def _write_metadata(wr: GGUFWriter, cfg: ModelConfig, pre: str, vocab: Mapping[str, Any] | None = None,
                    chat_template: str | None = CHATML) -> None:
    a = cfg.arch
    wr.add_string("general.name", cfg.name)
    wr.add_uint32(f"{a}.block_count", cfg.n_layers)
    wr.add_uint32(f"{a}.context_length", cfg.context_length)
    wr.add_uint32(f"{a}.embedding_length", cfg.d_model)
    wr.add_uint32(f"{a}.feed_forward_length", cfg.d_ff)
    wr.add_uint32(f"{a}.attention.head_count", cfg.n_heads)
    wr.add_uint32(f"{a}.attention.head_count_kv", cfg.n_kv_heads)
    wr.add_float32(f"{a}.rope.freq_base", cfg.rope_theta)
    wr.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_eps)
    wr.add_uint32(f"{a}.rope.dimension_count", rotary_dim(cfg))  # partial rotary (phi4-mini): fewer than head_dim
    if cfg.head_dim != cfg.d_model // cfg.n_heads:  # qwen3, gemma3: a head size of its own
        wr.add_uint32(f"{a}.attention.key_length", cfg.head_dim)
        wr.add_uint32(f"{a}.attention.value_length", cfg.head_dim)
    wr.add_uint32(f"{a}.vocab_size", cfg.vocab_size)
    if vocab is None:
        tokens, types, merges = tiny_vocab()
        vocab = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
                 "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
                 "tokenizer.ggml.bos_token_id": cfg.bos_id, "tokenizer.ggml.eos_token_id": cfg.eos_ids[0],
                 "tokenizer.ggml.padding_token_id": cfg.bos_id, "tokenizer.ggml.add_bos_token": False}
    write_vocab_fields(wr, vocab)
    if chat_template is not None:
        wr.add_string("tokenizer.chat_template", chat_template)
    for key, value in family(cfg.arch).gguf_metadata(cfg).items():  # the family's own keys (sliding window, ...)
        _add_value(wr, key, value)


def write_vocab_fields(wr: GGUFWriter, fields: Mapping[str, Any]) -> None:
    """`tokenizer.*` fields with the types llama.cpp requires (scores float32, token types int32)."""
    for key, value in fields.items():
        if key == "tokenizer.ggml.scores":
            wr.add_array(key, [float(v) for v in value])  # float32 array, never uint32 for integral scores
        elif key == "tokenizer.ggml.token_type":
            wr.add_token_types(list(value))
        else:
            _add_value(wr, key, value)


def _add_value(wr: GGUFWriter, key: str, value) -> None:
    """A Python value under its natural GGUF type: bool, uint32 for ints >= 0, int32, float32, string, array."""
    if isinstance(value, bool):
        wr.add_bool(key, value)
    elif isinstance(value, int):
        wr.add_uint32(key, value) if value >= 0 else wr.add_int32(key, value)
    elif isinstance(value, float):
        wr.add_float32(key, value)
    elif isinstance(value, str):
        wr.add_string(key, value)
    else:
        wr.add_array(key, list(value))


def write_tiny_gguf(path: str | Path, *, arch: str = "llama", seed: int = 0, n_layers: int = 2, d_model: int = 64,
                    n_heads: int = 4, n_kv_heads: int = 2, d_ff: int = 128, context: int = 256, tied: bool = True,
                    dtype: str = "f32", weights: dict[str, np.ndarray] | None = None,
                    sampling: dict[str, float] | None = None, config: ModelConfig | None = None,
                    chat_template: str | None = CHATML) -> Path:
    """Write a seeded random tiny model as GGUF; `weights` (canonical) overrides the random ones; `sampling`
    ({temperature, top_p, top_k, min_p}) is written as the general.sampling.* keys llama.cpp reads. `config`
    replaces tiny_config's (the size arguments are then unused; its vocab must be the tiny vocab's): a family's own
    block, e.g. gemma3's sliding layers and embedding scale. chat_template None: the file has none (a family default
    then applies)."""
    cfg = config or tiny_config(arch=arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                                n_kv_heads=n_kv_heads, d_ff=d_ff, context=context, tied=tied)
    if cfg.arch != arch:
        raise ValueError(f"config for a tiny {arch} GGUF has arch {cfg.arch!r}")
    return write_model_gguf(path, cfg, weights if weights is not None else tiny_weights(cfg, seed), dtype=dtype,
                            sampling=sampling, chat_template=chat_template)


def write_model_gguf(path: str | Path, cfg: ModelConfig, tensors: Mapping[str, np.ndarray], *, dtype: str = "f32",
                     sampling: dict[str, float] | None = None, vocab: Mapping[str, Any] | None = None,
                     chat_template: str | None = CHATML) -> Path:
    """Write any ModelConfig of a registered family + its canonical weights as a GGUF llama.cpp loads, with the
    tiny vocabulary (cfg.vocab_size must be its size): the family's tensor names (NAMES), row layout
    (to_gguf_layout), metadata keys (gguf_metadata) and configuration tensors (gguf_config_tensors, e.g. llama3's
    rope_freqs); ValueError when the family cannot write this config (gguf_metadata refuses it). `vocab`: other
    `tokenizer.*` fields to write instead (models/tiny_vocab.py: a SentencePiece vocabulary); `chat_template` the
    template written (None: none)."""
    if dtype not in _QTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {sorted(_QTYPES)}")
    n_vocab = len(vocab["tokenizer.ggml.tokens"] if vocab is not None else tiny_vocab()[0])
    if cfg.vocab_size != n_vocab:
        raise ValueError(f"the vocabulary has {n_vocab} tokens; the config says {cfg.vocab_size}")
    fam = family(cfg.arch)
    path = Path(path)
    wr = GGUFWriter(str(path), cfg.arch)
    _write_metadata(wr, cfg, fam.tokenizer_pre(cfg), vocab, chat_template)
    for name, value in (sampling or {}).items():
        key = GGUF_KEYS[name]
        wr.add_int32(key, int(value)) if name == "top_k" else wr.add_float32(key, float(value))
    wr.add_file_type(_FILE_TYPES[dtype])
    for name in cfg.tensor_names():
        data, qtype = _stored(name, fam.to_gguf_layout(name, np.asarray(tensors[name], np.float32), cfg), dtype)
        wr.add_tensor(fam.NAMES.canonical_to_gguf(name), data, raw_dtype=qtype)
    for name, value in fam.gguf_config_tensors(cfg).items():  # configuration tensors (llama3 rope_freqs)
        wr.add_tensor(name, np.asarray(value, np.float32), raw_dtype=GGMLQuantizationType.F32)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
