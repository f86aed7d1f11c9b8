"""An exported artifact's manifest.json: what the runtime reads instead of guessing from file names.

Written by export/onnx_export.py (and export/optimum_export.py), read here (below both export and runtime). Two
formats, each with its own versions; the runtime picks its backend by `format` and `profile`
(runtime/backends/__init__.py open_onnx):
  "specedge-onnx" 2        our graph builder, dynamic profile: GroupQueryAttention over shared in-place KV buffers
                           (version 1 artifacts predate the pad row that makes verify batches bit-identical to
                           one-token decoding; they must be re-exported)
  "specedge-onnx" 4        version 2 plus the position_ids and tree_bias inputs: the same graph verifies token trees
                           (version 2 artifacts still load, chains only: caps.tree_mask is False; the GPU graph,
                           `specedge export --gpu`, is written as version 2 with io.pad_row "none")
  "specedge-onnx" 3        our graph builder, static-shape profile (every dimension fixed; for NPU providers), so a
                           reader that only knows version 2 refuses it instead of failing on missing IO names
  "specedge-onnx" 5        our graph builder, layered profile: one graph per segment (embed.onnx, layer.{i}.onnx,
                           head.onnx) over one shared data file; runs layer plans (export/onnx_layered.py)
  "specedge-onnx" 6        version 5 plus each layer's position_ids and attn_bias inputs: token trees, and LoRA-Drop
                           drop steps (slots a layer did not write are masked); version 5 still loads, chains and
                           plans without drop steps
  "optimum-onnx" 1         Hugging Face optimum's text-generation-with-past graph (export/optimum_export.py):
                           past_key_values.N.key/value in, present.N.key/value out (a full copy of the KV per call)

    format, format_version        as above
    profile                       dynamic (any T, any cache length; GroupQueryAttention) | static (every dimension
                                  fixed: verify width W, max context C; standard ONNX ops only; for NPU providers)
    model                         the ONNX graph file (weights in `weights_file`, ONNX external data); layered: the
                                  embedding segment
    segments                      layered only: embed, layers (one file per layer), head, and shared (initializer
                                  names several segment graphs hold: stored once, loaded once, shared by sessions)
    weight_format                 fp32 | fp16 | int8 | int8-dynamic | int4
    config                        ModelConfig fields (rope_scaling and block nested; manifests written before the
                                  block existed carry qkv_bias instead and read as the llama block with it)
    io                            graph input/output names ("{i}" = layer index), the KV layout, and
                                  dynamic and layered: kv_pad_rows (cache rows past the capacity that the graph
                                  writes scratch K/V into) and pad_row: "network" when the pad row runs through every
                                  node (export/onnx_graph.pad_rows), "none" for the GPU graph (no pad row: float16
                                  attention and KV, kv_dtype float16, chains only; docs/accelerators.md); artifacts
                                  without it ran it through attention only, so int4 ones are not batch-invariant on
                                  CPUs without AVX-512 (docs/onnx.md);
                                  static: verify_width, max_context, mask_value
    tensors                       canonical tensor -> {linear, storage, source_type, exact, max_abs_err}
                                  (specedge-onnx only)
    files                         file name -> {sha256, bytes} for every file of the artifact but the manifest
    provenance                    source path and sha256, exporter and library versions
    tokenizer                     tokenizer.json, chat template file, special ids
    drafter_vocab                 optional (--drafter-vocab N; docs/algorithms.md 2.2 VocabTrim): file (the id list,
                                  JSON {"ids": [...]}, ascending), n, vocab_size, model (the decoder with the LM head
                                  cut to those rows: logits [T, n]), head (final norm + trimmed head on hidden states),
                                  head_io, calibration (target, engine, prompts, max_tokens, generated, source);
                                  runtime/vocab_trim.py reads it
    generation                    optional: the source's own sampling values {temperature, top_p, top_k, min_p}
                                  (GGUF general.sampling.*, or generation_config.json; models/generation.py); the
                                  defaults of calls that leave them unset (assembly/sampling_defaults.py). Optional
                                  in every format version: artifacts without it sample with the chat defaults
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .block import BlockSpec
from .config import ModelConfig, RopeScaling
from .errors import ModelFileError
from .tokenizer_spec import TokenizerSpec

FORMAT = "specedge-onnx"
FORMAT_VERSION = 4  # what dynamic artifacts are written as (4: tree inputs)
CHAIN_FORMAT_VERSION = 2  # dynamic artifacts without the tree inputs; still read, chains only
STATIC_FORMAT_VERSION = 3  # static-profile artifacts: readers of version 2 only must refuse them
LAYERED_FORMAT_VERSION = 6  # layered-profile artifacts (one graph per segment): readers of 2 and 3 must refuse them
LAYERED_CHAIN_FORMAT_VERSION = 5  # layered artifacts without the attention feeds; still read (no trees, no drop steps)
OPTIMUM_FORMAT = "optimum-onnx"
OPTIMUM_FORMAT_VERSION = 1
READ_VERSIONS = {FORMAT: (CHAIN_FORMAT_VERSION, STATIC_FORMAT_VERSION, FORMAT_VERSION, LAYERED_CHAIN_FORMAT_VERSION,
                          LAYERED_FORMAT_VERSION),
                 OPTIMUM_FORMAT: (OPTIMUM_FORMAT_VERSION,)}
MANIFEST = "manifest.json"
PAD_ROW_NETWORK = "network"  # io.pad_row of artifacts whose pad row runs through every node
PAD_ROW_ATTENTION = "attention"  # what dynamic and layered artifacts without io.pad_row have: attention only
PAD_ROW_NONE = "none"  # io.pad_row of the GPU graph (export/onnx_graph.py): no pad row, not batch-invariant


class Profile(enum.Enum):
    """Shape profile of an exported graph."""

    DYNAMIC = "dynamic"  # T and the cache length are free; com.microsoft GroupQueryAttention (CPU, CUDA, DirectML)
    STATIC = "static"  # [1, W] in, [1, n_kv, C, head_dim] caches; standard ops only (NPU providers need this)
    LAYERED = "layered"  # dynamic shapes, one graph per segment (embed, each layer, head): runs layer plans


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["eos_ids"] = list(cfg.eos_ids)
    d["block"] = cfg.block.to_dict()
    return d


def config_from_dict(d: Mapping[str, Any]) -> ModelConfig:
    """ModelConfig from its manifest dict; TypeError / ValueError on wrong keys, types or sizes."""
    d = dict(d)
    rope = d.get("rope_scaling", {})
    if not isinstance(rope, dict):
        raise TypeError(f"rope_scaling must be an object, not {type(rope).__name__}")
    d["rope_scaling"] = RopeScaling(**rope)
    if "block" in d:  # manifests written before the block declaration carry qkv_bias (ModelConfig takes both)
        d["block"] = BlockSpec.from_dict(d["block"])
    eos = d.get("eos_ids", ())
    if not isinstance(eos, (list, tuple)) or not all(_is_int(i) and i >= 0 for i in eos):
        raise TypeError(f"eos_ids must be a list of token ids, not {eos!r}")
    d["eos_ids"] = tuple(eos)
    if not isinstance(d.get("arch"), str) or not isinstance(d.get("tied_embeddings"), bool):
        raise TypeError("arch must be a string and tied_embeddings a boolean")
    if d.get("bos_id") is not None and not (_is_int(d["bos_id"]) and d["bos_id"] >= 0):
        raise TypeError(f"bos_id must be a token id or null, not {d['bos_id']!r}")
    return ModelConfig(**d)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _safe_name(v: Any) -> bool:
    """A file name inside the artifact directory: relative, no '..', no NUL."""
    if not isinstance(v, str) or not v or "\0" in v:
        return False
    p = Path(v)
    return not p.is_absolute() and ".." not in p.parts and not v.startswith(("/", "\\"))


def _schema_problem(raw: Any) -> str | None:
    """The first structural problem of a parsed manifest (what the runtime reads unguarded), or None."""
    if not isinstance(raw, dict):
        return f"the manifest is a JSON {type(raw).__name__}, not an object"
    if not isinstance(raw.get("format"), str) or not _is_int(raw.get("format_version")):
        return "format must be a string and format_version an integer"
    files = raw.get("files")
    if not isinstance(files, dict) or not files:
        return "files must be a non-empty object of file name -> {sha256, bytes}"
    for name, meta in files.items():
        if not _safe_name(name):
            return f"file name {name!r} points outside the artifact directory"
        if not (isinstance(meta, dict) and isinstance(meta.get("sha256"), str) and len(meta["sha256"]) == 64
                and _is_int(meta.get("bytes")) and meta["bytes"] >= 0):
            return f"files[{name!r}] must be {{\"sha256\": 64 hex digits, \"bytes\": a size}}, not {meta!r}"[:300]
    if not _safe_name(raw.get("model")) or raw["model"] not in files:
        return f"model {raw.get('model')!r} must name one of the listed files"
    if not isinstance(raw.get("weight_format"), str):
        return "weight_format must be a string"
    if "profile" in raw and not isinstance(raw["profile"], str):
        return "profile must be a string"
    for key in ("io", "config"):
        if not isinstance(raw.get(key), dict):
            return f"{key} must be an object"
    for key in ("tensors", "segments", "drafter_vocab", "parity", "generation"):
        if raw.get(key) is not None and not isinstance(raw[key], dict):
            return f"{key} must be an object or null"
    tok = raw.get("tokenizer")
    if tok is not None:
        if not isinstance(tok, dict) or not _safe_name(tok.get("file")) or tok["file"] not in files:
            return "tokenizer.file must name one of the listed files"
        if tok.get("chat_template") is not None and (not _safe_name(tok["chat_template"])
                                                     or tok["chat_template"] not in files):
            return "tokenizer.chat_template must be null or name one of the listed files"
        if tok.get("bos_id") is not None and not _is_int(tok["bos_id"]):
            return "tokenizer.bos_id must be an integer or null"
        if not isinstance(tok.get("eos_ids", []), list) or not all(_is_int(i) for i in tok.get("eos_ids", [])):
            return "tokenizer.eos_ids must be a list of integers"
        for key in ("bos_token", "eos_token"):
            if tok.get(key) is not None and not isinstance(tok[key], str):
                return f"tokenizer.{key} must be a string or null"
    return None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Manifest:
    root: Path
    raw: Mapping[str, Any]
    config: ModelConfig

    @property
    def format(self) -> str:
        return str(self.raw["format"])

    @property
    def model_path(self) -> Path:
        return self.root / self.raw["model"]

    @property
    def weight_format(self) -> str:
        return str(self.raw["weight_format"])

    @property
    def io(self) -> Mapping[str, Any]:
        return self.raw["io"]

    @property
    def profile(self) -> Profile:
        return Profile(self.raw.get("profile", Profile.DYNAMIC.value))

    @property
    def tensors(self) -> Mapping[str, Any]:
        return self.raw.get("tensors", {})

    @property
    def pad_row(self) -> str | None:
        """Where the graph's batch-invariance pad row runs: PAD_ROW_NETWORK (every node), PAD_ROW_ATTENTION (dynamic
        and layered artifacts written before it ran through the network), PAD_ROW_NONE (the GPU graph: none at
        all), None (static and optimum graphs)."""
        if self.format != FORMAT or self.profile is Profile.STATIC:
            return None
        return str(self.io.get("pad_row", PAD_ROW_ATTENTION))

    def tokenizer_spec(self) -> TokenizerSpec:
        """The artifact's tokenizer.json + chat template; ModelFileError when missing, unreadable or not UTF-8."""
        t = self.raw.get("tokenizer")
        if t is None:
            raise ModelFileError(f"{self.root}/{MANIFEST} lists no tokenizer; re-export the model with "
                                 "`specedge export`")
        try:
            template = (self.root / t["chat_template"]).read_text("utf-8") if t.get("chat_template") else None
            hf_json = (self.root / t["file"]).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ModelFileError(f"{self.root}: cannot read the tokenizer ({type(e).__name__}: {e}); re-export the "
                                 "model") from None
        return TokenizerSpec(hf_json=hf_json, bos_id=t.get("bos_id"),
                             eos_ids=tuple(t.get("eos_ids", ())), add_bos=bool(t.get("add_bos", False)),
                             chat_template=template, bos_token=t.get("bos_token"), eos_token=t.get("eos_token"))

    def verify_files(self) -> None:
        """Every listed file exists with its recorded size and SHA-256; ModelFileError names the first that does not."""
        for name, meta in self.raw["files"].items():
            path = self.root / name
            if not path.is_file():
                raise ModelFileError(f"{self.root}: artifact file {name} is missing; re-export the model")
            if path.stat().st_size != meta["bytes"] or sha256_file(path) != meta["sha256"]:
                raise ModelFileError(f"{path} does not match the SHA-256 in {MANIFEST} (damaged or edited); "
                                     "re-export the model")


def manifest_with_profile(manifest: "Manifest | str | Path", profile: Profile, *, verify: bool = True) -> "Manifest":
    """A Manifest (read from a directory when given a path) whose profile must be `profile`: each ONNX backend class
    runs one graph layout; runtime.backends.open_onnx picks the class from the manifest."""
    m = manifest if isinstance(manifest, Manifest) else read_manifest(manifest, verify=verify)
    if m.profile is not profile:
        raise ValueError(f"{m.root} has the {m.profile.value} profile, not {profile.value}: open it with "
                         "runtime.backends.open_onnx, which picks the backend for its profile")
    return m


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")  # Python's json accepts NaN / Infinity; a manifest never has them


def read_manifest(root: str | Path, *, verify: bool = True) -> Manifest:
    """Read and validate `root/manifest.json`; verify=True also checks every file's hash."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise ModelFileError(f"{root} is not an exported model directory (no {MANIFEST}); run `specedge export`")
    try:
        raw = json.loads(path.read_text("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelFileError(f"{path} is not valid JSON ({type(e).__name__}: {str(e)[:200]}); re-export the "
                             "model") from None
    problem = _schema_problem(raw)
    if problem is not None:
        raise ModelFileError(f"{path}: {problem}; the manifest is damaged or hand-edited: re-export the model")
    fmt = raw.get("format")
    if fmt not in READ_VERSIONS:
        raise ModelFileError(f"{path}: format {fmt!r} is not one of {', '.join(map(repr, READ_VERSIONS))}; "
                             "re-export the model (or upgrade specedge if a newer one wrote it)")
    if raw.get("format_version") not in READ_VERSIONS[fmt]:
        raise ModelFileError(f"{path}: {fmt} format version {raw.get('format_version')} is not supported by this "
                             f"specedge (reads versions {', '.join(map(str, READ_VERSIONS[fmt]))}); re-export or "
                             "upgrade specedge")
    try:
        profile = Profile(raw.get("profile", Profile.DYNAMIC.value))
    except ValueError:
        raise ModelFileError(f"{path}: unknown profile {raw.get('profile')!r} (this specedge reads "
                             f"{', '.join(p.value for p in Profile)}); upgrade specedge") from None
    expected = {Profile.STATIC: (STATIC_FORMAT_VERSION,), Profile.LAYERED: (LAYERED_CHAIN_FORMAT_VERSION,
                                                                                 LAYERED_FORMAT_VERSION)}.get(
        profile, (CHAIN_FORMAT_VERSION, FORMAT_VERSION))
    if fmt == FORMAT and raw["format_version"] not in expected:
        raise ModelFileError(f"{path}: profile {profile.value} does not match format version "
                             f"{raw['format_version']}; re-export the model")
    try:
        config = config_from_dict(raw["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{path}: bad model config ({e}); re-export the model") from None
    manifest = Manifest(root, raw, config)
    if verify:
        manifest.verify_files()
    return manifest
