"""Export a model to an ONNX artifact directory: model.onnx + model.onnx.data + tokenizer files + manifest.json.

Sources: a GGUF file (export_gguf_to_onnx) or a Hugging Face checkpoint directory (export_hf_to_onnx); both become
canonical weights, the same graph builder, and the same parity gate against the NumPy reference.

    out/
      model.onnx            graph (path-named nodes), weights as ONNX external data in:
      model.onnx.data
      tokenizer.json        serialized HF tokenizer (built from the GGUF vocabulary, or the checkpoint's own)
      chat_template.jinja   the model's chat template (when it has one)
      manifest.json         models/manifest.py describes the fields

Graph profiles: dynamic (export/onnx_graph.py: any T, any cache length), its GPU graph (ExportProfile(gpu=True):
float16 attention and KV, chains only, no pad row; for the CUDA provider), layered (export/onnx_layered.py: one
graph per segment) and static (export/onnx_static.py: fixed verify width and max context, standard ops only, for NPU
execution providers).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .._version import __version__
from ..models.config import Weights
from ..models.manifest import CHAIN_FORMAT_VERSION, FORMAT, FORMAT_VERSION, LAYERED_FORMAT_VERSION, MANIFEST, \
    PAD_ROW_NONE, STATIC_FORMAT_VERSION, Profile, config_to_dict, sha256_file
from ..models.tokenizer_spec import TokenizerSpec
from ..models.gguf_in import GGUFModel
from ..models.generation import from_generation_config, from_gguf_metadata
from ..models.hf_in import HFModel
from .onnx_graph import PAD_ROW, PAD_ROWS, GraphIO, build_decoder
from .onnx_layered import LAYERED_DATA, build_layered, layered_fields, save_layered
from .onnx_ir import IR_VERSION, MS_OPSET, OPSET
from .onnx_linear import ExportOptions, KVDtype, TensorRecord, WeightFormat
from .onnx_static import MASK_VALUE, StaticIO, StaticShape, build_static_decoder
from .parity_gate import GateReport, ParityError, Tolerance, check_artifact

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"


@dataclass(frozen=True)
class ExportProfile:
    """Which graph profile to build: dynamic (the default), its GPU graph, layered, or static with its fixed shape."""

    kind: Profile = Profile.DYNAMIC
    shape: StaticShape | None = None  # Profile.STATIC: the [1, W] call width and C cache slots
    gpu: bool = False  # Profile.DYNAMIC: the GPU graph (gpu_options; a dynamic-profile artifact, chains only)

    def __post_init__(self) -> None:
        if (self.kind is Profile.STATIC) != (self.shape is not None):
            raise ValueError("a static export profile needs its StaticShape (and only a static one has a shape)")
        if self.gpu and self.kind is not Profile.DYNAMIC:
            raise ValueError(f"the GPU graph is a dynamic-profile graph, not {self.kind.value}")

    @classmethod
    def static(cls, shape: StaticShape) -> "ExportProfile":
        return cls(Profile.STATIC, shape)


DYNAMIC, LAYERED, GPU = ExportProfile(), ExportProfile(Profile.LAYERED), ExportProfile(gpu=True)


def gpu_options(opts: ExportOptions) -> ExportOptions:
    """`opts` for the GPU graph (export/onnx_graph.py): float16 GroupQueryAttention and cache (CUDA's kernel takes
    no float32), no tree inputs (its fused kernels take no attention bias), no pad row (CUDA's GroupQueryAttention
    computes wrong outputs when its lengths come from the pad row's Add nodes; docs/accelerators.md)."""
    return dataclasses.replace(opts, kv_dtype=KVDtype.FLOAT16, trees=False, pad_row=False)


class FloatSource:
    """WeightSource over canonical float weights only (everything below int formats is re-quantized)."""

    def __init__(self, weights: Weights, types: dict[str, str] | None = None) -> None:
        self.weights = weights
        self._types = types or {}

    def float(self, name: str) -> np.ndarray:
        return self.weights[name]

    def blocks(self, name: str) -> tuple[str, np.ndarray] | None:
        return None

    def source_type(self, name: str) -> str:
        return self._types.get(name, "F32")


class GGUFSource(FloatSource):
    """WeightSource over a GGUF file: dequantized floats plus the stored blocks for exact transcoding."""

    def __init__(self, gguf: GGUFModel, weights: Weights | None = None) -> None:
        super().__init__(weights or gguf.load_weights(), gguf.tensor_types())
        self.gguf = gguf

    def blocks(self, name: str) -> tuple[str, np.ndarray] | None:
        qtype, raw = self.gguf.raw_blocks(name)
        return None if qtype in ("F32", "F16", "BF16") else (qtype, raw)


def export_onnx(src: FloatSource, out_dir: str | Path, opts: ExportOptions, *,
                tokenizer: TokenizerSpec | None = None, provenance: Path | None = None,
                profile: ExportProfile = DYNAMIC, generation: dict | None = None) -> Path:
    """Build, save and describe one decoder artifact in the given profile (static: fixed shapes; layered: one graph
    per segment); returns the manifest path. generation: the source's own sampling values (models/generation.py),
    recorded as the manifest's optional `generation` when it states any."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = src.weights.config
    static = profile.shape
    opts = gpu_options(opts) if profile.gpu else opts
    if profile.kind is Profile.LAYERED:
        graphs, records = build_layered(cfg, src, opts, GraphIO())
        files, shared = save_layered(graphs, out)
        fields = {"format_version": LAYERED_FORMAT_VERSION, "profile": Profile.LAYERED.value,
                  **layered_fields(cfg, opts, graphs, shared, PAD_ROWS)}
        return _write_manifest(out, files, "embed.onnx", LAYERED_DATA, opts, fields, cfg, records, tokenizer,
                               provenance, generation)
    if static is None:
        model, records = build_decoder(cfg, src, opts, GraphIO())
    else:
        model, records = build_static_decoder(cfg, src, opts, static, StaticIO())
    for stale in (MODEL_FILE, DATA_FILE):  # save_model appends to an existing data file
        (out / stale).unlink(missing_ok=True)
    onnx.save_model(model, str(out / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)
    fields = _dynamic_fields(cfg, opts) if static is None else _static_fields(cfg, static)
    return _write_manifest(out, [MODEL_FILE, DATA_FILE], MODEL_FILE, DATA_FILE, opts, fields, cfg, records, tokenizer,
                           provenance, generation)


def _umask_mode() -> int:
    """The mode a plain open() gives a new file here (0o666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _write_manifest(out: Path, files: list[str], model: str, data: str, opts: ExportOptions, fields: dict, cfg,
                    records: dict[str, TensorRecord], tokenizer: TokenizerSpec | None, provenance: Path | None,
                    generation: dict | None = None) -> Path:
    for name in files:  # onnx writes external data files 0600: a cache shared between users could not read them
        if (out / name).is_file():
            os.chmod(out / name, _umask_mode())
    tok = write_tokenizer(out, tokenizer, files) if tokenizer is not None else None
    manifest = {
        "format": FORMAT, "model": model, "weights_file": data, "weight_format": opts.fmt.value, **fields,
        "config": config_to_dict(cfg),
        "tensors": {name: dataclasses.asdict(r) for name, r in sorted(records.items())},
        "exact_tensors": sum(r.exact for r in records.values()), "n_tensors": len(records),
        "files": {name: {"sha256": sha256_file(out / name), "bytes": (out / name).stat().st_size} for name in files},
        "provenance": _provenance(provenance),
        "tokenizer": tok,
        "parity": None,  # filled in by gate_artifact
    }
    if generation:  # optional: readers without it ignore it, the runtime falls back to its chat defaults
        manifest["generation"] = dict(generation)
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
    return path


def _dynamic_fields(cfg, opts: ExportOptions) -> dict:
    io = dataclasses.asdict(GraphIO())
    if not opts.trees:  # a chain-only graph has no position_ids / tree_bias inputs
        io = {k: v for k, v in io.items() if k not in ("position_ids", "tree_bias")}
    return {"format_version": FORMAT_VERSION if opts.trees else CHAIN_FORMAT_VERSION, "profile": Profile.DYNAMIC.value,
            "accuracy_level": opts.accuracy_level, "exact_mins": opts.exact_mins,
            "io": {**io, "kv_layout": "BNSH [1, n_kv_heads, max_ctx, head_dim]",
                   "kv_dtype": opts.kv_dtype.value, "max_positions": cfg.context_length,
                   "attention": "com.microsoft.GroupQueryAttention shared buffers",
                   "kv_pad_rows": PAD_ROWS if opts.pad_row else 0,
                   "pad_row": PAD_ROW if opts.pad_row else PAD_ROW_NONE}}


def _static_fields(cfg, shape: StaticShape) -> dict:
    return {"format_version": STATIC_FORMAT_VERSION, "profile": Profile.STATIC.value,
            "io": {**dataclasses.asdict(StaticIO()), "verify_width": shape.verify_width,
                   "max_context": shape.max_context, "mask_value": MASK_VALUE,
                   "kv_layout": "BNSH [1, n_kv_heads, max_context, head_dim], slot = position", "kv_dtype": "float32",
                   "attention": "masked over all max_context slots; new rows scattered in (export/onnx_static.py)"}}


def write_tokenizer(out: Path, spec: TokenizerSpec, files: list[str]) -> dict:
    """tokenizer.json (+ chat_template.jinja) into `out`, their names appended to `files`; the manifest's section."""
    (out / "tokenizer.json").write_text(spec.hf_json, "utf-8")
    files.append("tokenizer.json")
    template = None
    if spec.chat_template:
        template = "chat_template.jinja"
        (out / template).write_text(spec.chat_template, "utf-8")
        files.append(template)
    return {"file": "tokenizer.json", "chat_template": template, "bos_id": spec.bos_id, "eos_ids": list(spec.eos_ids),
            "add_bos": spec.add_bos, "bos_token": spec.bos_token, "eos_token": spec.eos_token}


def _provenance(source: Path | None) -> dict:
    """Exporter versions, and the source: a GGUF file's hash, or every file's hash of a checkpoint directory."""
    import onnxruntime  # noqa: F401  (only its version is recorded; export itself needs no session)
    info = {"exporter": f"specedge {__version__}", "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "opset": OPSET, "ms_opset": MS_OPSET, "ir_version": IR_VERSION}
    if source is not None and source.is_dir():
        info.update(source=str(source), source_files={f.name: sha256_file(f) for f in sorted(source.iterdir())
                                                      if f.is_file()})
    elif source is not None:
        info.update(source=str(source), source_sha256=sha256_file(source), source_bytes=os.path.getsize(source))
    return info


def record_gate(manifest_path: Path, report: GateReport) -> GateReport:
    """Write the gate's numbers into the manifest ("parity"); raise ParityError when out of tolerance."""
    manifest = json.loads(manifest_path.read_text("utf-8"))
    manifest["parity"] = report.to_dict()
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
    if not report.passed:
        raise ParityError(report)
    return report


def gate_artifact(manifest_path: Path, weights: Weights, tokenizer: TokenizerSpec, *,
                  tolerance: Tolerance | None = None, threads: int | None = None) -> GateReport:
    """Run the parity gate, record its numbers in the manifest ("parity"), raise ParityError when out of tolerance.
    A failed artifact stays on disk for inspection, marked failed; the engine refuses to load it."""
    from ..runtime.tokenizer import Tokenizer
    # Until the gate's numbers replace it, the manifest says "pending": an export killed during the gate leaves an
    # artifact the loader refuses (assembly/load.py load_onnx) instead of one that looks ungated-but-usable.
    manifest = json.loads(manifest_path.read_text("utf-8"))
    manifest["parity"] = {"passed": False, "pending": True}
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n", "utf-8")
    report = check_artifact(manifest_path.parent, weights, Tokenizer(tokenizer), tolerance=tolerance, threads=threads)
    return record_gate(manifest_path, report)


def export_gguf_to_onnx(gguf: GGUFModel, out_dir: str | Path, fmt: WeightFormat, *, accuracy_level: int = 4,
                        exact_mins: bool = True, gate: bool = True, tolerance: Tolerance | None = None,
                        threads: int | None = None, profile: ExportProfile = DYNAMIC) -> Path:
    """The GGUF path of `specedge export`: blocks transcoded where exact, tokenizer and template carried over,
    then the parity gate (gate=False skips it and records "parity": null; only tests and benchmarks do that).
    `profile`: dynamic, its GPU graph (GPU: float16 attention and KV, chains only, no pad row; for --device cuda),
    static (export/onnx_static.py) or layered (export/onnx_layered.py)."""
    src = GGUFSource(gguf)
    spec = gguf.tokenizer_spec()
    path = export_onnx(src, out_dir, ExportOptions(fmt, accuracy_level, exact_mins), tokenizer=spec,
                       provenance=gguf.path, profile=profile, generation=from_gguf_metadata(gguf.metadata))
    if gate:
        gate_artifact(path, src.weights, spec, tolerance=tolerance, threads=threads)
    return path


def export_hf_to_onnx(hf: HFModel, out_dir: str | Path, fmt: WeightFormat, *, accuracy_level: int = 4,
                      gate: bool = True, tolerance: Tolerance | None = None, threads: int | None = None,
                      profile: ExportProfile = DYNAMIC) -> Path:
    """The Hugging Face path of `specedge export`: safetensors weights (F32/F16/BF16 widened to float32; int
    formats re-quantized from them), the checkpoint's tokenizer and template, then the same parity gate.
    `profile` as for export_gguf_to_onnx."""
    src = FloatSource(hf.load_weights(), hf.tensor_types())
    spec = hf.tokenizer_spec()
    path = export_onnx(src, out_dir, ExportOptions(fmt, accuracy_level), tokenizer=spec, provenance=hf.path,
                       profile=profile, generation=from_generation_config(hf.path))
    if gate:
        gate_artifact(path, src.weights, spec, tolerance=tolerance, threads=threads)
    return path


__all__ = ["DYNAMIC", "ExportOptions", "ExportProfile", "FloatSource", "GGUFSource", "GPU", "GateReport", "KVDtype",
           "LAYERED", "ParityError", "StaticShape", "TensorRecord", "Tolerance", "WeightFormat", "export_gguf_to_onnx",
           "export_hf_to_onnx", "export_onnx", "gate_artifact", "gpu_options", "record_gate"]
