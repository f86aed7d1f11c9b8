"""`specedge export DIR --format onnx --weights fp32 --via optimum`: Hugging Face optimum exports the checkpoint
(any causal LM that optimum-onnx supports, task text-generation-with-past), and we describe its graph in our
manifest (format "optimum-onnx") so the runtime runs it with runtime/backends/onnx_optimum.py.

    out/
      model.onnx (+ model.onnx_data)   optimum's graph: past_key_values.N.key/value in, present.N.key/value out
      config.json, generation_config.json   written by optimum
      tokenizer.json, chat_template.jinja  the checkpoint's tokenizer (export/tokenizer_hf.py), as for our builder
      manifest.json                        format "optimum-onnx", IO names read from the graph, hashes, parity

The parity gate runs as for our builder, with transformers' own float32 forward as the reference (the NumPy
reference only knows the families we build). For llama and qwen2 prefer our builder: optimum's graph copies the whole
KV cache every call (see the backend's docstring), and only fp32 is exported here (no int8 / int4).
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..models.config import ModelConfig
from ..models.errors import ModelFileError
from ..models.generation import from_generation_config
from ..models.manifest import MANIFEST, OPTIMUM_FORMAT, OPTIMUM_FORMAT_VERSION, config_to_dict, sha256_file
from ..runtime.backends.ort_threads import foreign_sessions
from ..runtime.kv import LengthCursor
from ..models.hf_in import read_config
from .onnx_export import record_gate, write_tokenizer
from .parity_gate import GateReport, Tolerance, gate_prompts, measure
from ..models.tokenizer_hf import tokenizer_spec_from_hf

TASK = "text-generation-with-past"
MODEL_FILE = "model.onnx"
IO_NAMES = {
    "input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
    "past_key": "past_key_values.{i}.key", "past_value": "past_key_values.{i}.value",
    "present_key": "present.{i}.key", "present_value": "present.{i}.value", "logits": "logits",
}
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")


def _imports():
    try:
        import torch
        from optimum.exporters.onnx import onnx_export_from_model
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise ImportError(f"--via optimum needs torch, transformers and optimum-onnx ({e}): "
                          "pip install 'specedge[hf]'") from None
    return torch, AutoModelForCausalLM, onnx_export_from_model


class _History(LengthCursor):
    """The reference's "cache": the token ids so far (transformers reruns the whole sequence each call)."""

    def __init__(self, capacity: int) -> None:
        self._capacity, self._length, self.tokens = capacity, 0, np.zeros(capacity, np.int64)

    @property
    def capacity(self) -> int:
        return self._capacity


class TransformersReference:
    """transformers' float32 forward behind the Backend calls the parity gate makes (new_cache, forward)."""

    def __init__(self, model, torch) -> None:
        self.model, self.torch = model, torch

    def new_cache(self, max_len: int) -> _History:
        return _History(max_len)

    def forward(self, tokens, cache: _History) -> np.ndarray:
        n, t = cache.length, len(tokens)
        cache.tokens[n:n + t] = tokens
        with self.torch.no_grad():
            logits = self.model(self.torch.as_tensor(cache.tokens[None, :n + t])).logits[0, n:]
        cache.advance(t)
        return logits.float().numpy()


def graph_io(model_path: Path) -> tuple[dict[str, Any], int, tuple[int, int], int]:
    """(io names, n_layers, (n_kv_heads, head_dim), vocab size) read from optimum's graph; ValueError if its IO is
    not the text-generation-with-past layout the optimum backend runs."""
    import onnx
    graph = onnx.load(str(model_path), load_external_data=False).graph
    inputs = {i.name: i for i in graph.input}
    outputs = {o.name: o for o in graph.output}
    layers = sorted({int(m.group(1)) for name in inputs if (m := _PAST.match(name))})
    n = len(layers)
    io = dict(IO_NAMES)
    if "position_ids" not in inputs:
        io["position_ids"] = None
    want_in = {io["input_ids"], io["attention_mask"], io["position_ids"]} - {None}
    want_in |= {io[k].format(i=i) for i in range(n) for k in ("past_key", "past_value")}
    want_out = {io["logits"]} | {io[k].format(i=i) for i in range(n) for k in ("present_key", "present_value")}
    if not n or layers != list(range(n)) or set(inputs) != want_in or not want_out <= set(outputs):
        raise ValueError(f"optimum's graph has inputs {sorted(inputs)[:8]}... and outputs {sorted(outputs)[:6]}..., "
                         "not the text-generation-with-past layout (input_ids, attention_mask, position_ids, "
                         "past_key_values.N.key/value -> logits, present.N.key/value) the runtime runs")
    dims = [d.dim_value if d.HasField("dim_value") else None
            for d in inputs[io["past_key"].format(i=0)].type.tensor_type.shape.dim]
    vocab = outputs[io["logits"]].type.tensor_type.shape.dim[-1].dim_value
    if len(dims) != 4 or dims[1] is None or dims[3] is None:
        raise ValueError(f"optimum's past K/V has shape {dims}; the runtime runs [batch, heads, past, head_dim]")
    return io, n, (dims[1], dims[3]), vocab


def describe_config(hf_config, n_layers: int, kv: tuple[int, int], vocab: int, name: str) -> ModelConfig:
    """A ModelConfig for the manifest. The optimum backend reads n_layers, n_kv_heads, head_dim, vocab_size and
    context_length (taken from the graph where it can); the rest is descriptive, best effort per architecture."""
    n_kv, head_dim = kv
    get = lambda *keys, default=0: next((getattr(hf_config, k) for k in keys  # noqa: E731
                                         if getattr(hf_config, k, None) is not None), default)
    n_heads = int(get("num_attention_heads", default=n_kv))
    eos = get("eos_token_id", default=())
    bos = get("bos_token_id", default=None)
    return ModelConfig(
        arch=str(hf_config.model_type), n_layers=n_layers, d_model=int(get("hidden_size")), n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim, d_ff=int(get("intermediate_size", "n_inner", default=0) or 0),
        vocab_size=int(vocab or hf_config.vocab_size),
        rms_eps=float(get("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", default=0.0)),
        rope_theta=float(get("rope_theta", default=0.0)),
        context_length=int(get("max_position_embeddings", default=2048)),
        tied_embeddings=bool(get("tie_word_embeddings", default=False)),
        bos_id=None if bos is None else int(bos),
        eos_ids=tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])), name=name)


def export_via_optimum(src: str | Path, out_dir: str | Path, *, gate: bool = True, tolerance: Tolerance | None = None,
                       threads: int | None = None) -> Path:
    """Export a Hugging Face checkpoint directory with optimum, write our manifest, run the parity gate against
    transformers; returns the manifest path (ParityError, as for our builder, when out of tolerance)."""
    src, out = Path(src), Path(out_dir)
    torch, auto_model, onnx_export_from_model = _imports()
    spec = tokenizer_spec_from_hf(src, read_config(src))  # read_config: a clear error for a non-checkpoint
    if threads:
        torch.set_num_threads(threads)
    try:
        model = auto_model.from_pretrained(src, dtype=torch.float32, local_files_only=True).eval()
    except (ValueError, KeyError, OSError) as e:
        raise ModelFileError(f"transformers cannot load {src} as a causal LM ({e})") from None
    out.mkdir(parents=True, exist_ok=True)
    for stale in (MANIFEST, MODEL_FILE, MODEL_FILE + "_data"):
        (out / stale).unlink(missing_ok=True)
    try:
        with warnings.catch_warnings(), foreign_sessions():  # optimum checks the graph in its own session
            warnings.simplefilter("ignore")  # torch's tracer warns about every shape-dependent branch it freezes
            onnx_export_from_model(model, out, task=TASK, do_validation=False)  # the parity gate validates
    except (ValueError, RuntimeError, KeyError) as e:
        raise ModelFileError(f"optimum cannot export {src} ({type(e).__name__}: {e})") from None
    io, n_layers, kv, vocab = graph_io(out / MODEL_FILE)
    config = describe_config(model.config, n_layers, kv, vocab, src.name)
    tok = write_tokenizer(out, spec, [])  # all files are hashed below
    import onnxruntime
    import optimum.version
    manifest = {
        "format": OPTIMUM_FORMAT, "format_version": OPTIMUM_FORMAT_VERSION, "model": MODEL_FILE,
        "weight_format": "fp32", "config": config_to_dict(config),
        "io": {**io, "kv_layout": "[1, n_kv_heads, past, head_dim] in; [1, n_kv_heads, past + T, head_dim] out "
                                  "(a new tensor every call)", "kv_dtype": "float32", "task": TASK},
        "files": {f.name: {"sha256": sha256_file(f), "bytes": f.stat().st_size}
                  for f in sorted(out.iterdir()) if f.is_file() and f.name != MANIFEST},
        "provenance": {"exporter": f"optimum {optimum.version.__version__} (onnx_export_from_model, task {TASK}) "
                                   f"via specedge {__version__}", "onnxruntime": onnxruntime.__version__,
                       "source": str(src), "source_files": {f.name: sha256_file(f) for f in sorted(src.iterdir())
                                                            if f.is_file()}},
        "tokenizer": tok,
        "parity": {"passed": False, "pending": True} if gate else None,  # until the gate records its numbers
    }
    generation = from_generation_config(src)
    if generation:  # optional (models/manifest.py): the checkpoint's own sampling values
        manifest["generation"] = generation
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
    if gate:
        gate_with_transformers(path, model, torch, spec, tolerance=tolerance, threads=threads)
    return path


def gate_with_transformers(manifest_path: Path, model, torch, spec, *, tolerance: Tolerance | None = None,
                           threads: int | None = None) -> GateReport:
    """The parity gate of an optimum artifact: its backend vs transformers' forward on the fixed prompts."""
    from ..runtime.backends import open_onnx
    from ..runtime.tokenizer import Tokenizer
    backend = open_onnx(manifest_path.parent, threads=threads)
    prompts = gate_prompts(Tokenizer(spec), max_len=min(96, backend.config.context_length))
    report = measure(backend, TransformersReference(model, torch), prompts, "fp32", tolerance)
    return record_gate(manifest_path, report)
