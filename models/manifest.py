"""An exported artifact's manifest.json: what the runtime reads instead of guessing from file names.

Written by export/onnx_export.py (and export/optimum_export.py), read here (below both export and runtime). Two
formats, each with its own versions; the runtime picks its backend by `format` and `profile`
(runtime/backends/__init__.py open_onnx):
  "specedge-onnx" 2        our graph builder, dynamic profile: GroupQueryAttention over shared in-place KV buffers
                           (version 1 artifacts predate the pad row that makes verify batches bit-identical to
                           one-token decoding; they must be re-exported)
  "specedge-onnx" 4        version 2 plus the position_ids and tree_bias inputs: the same graph verifies token trees
                           (version 2 artifacts still load, chains only: caps.tree_mask is False)
  "specedge-onnx" 3        our graph builder, static-shape profile (every dimension fixed; for NPU providers), so a
                           reader that only knows version 2 refuses it instead of failing on missing IO names
  "specedge-onnx" 5        our graph builder, layered profile: one graph per segment (embed.onnx, layer.{i}.onnx,
                           head.onnx) over one shared data file; runs layer plans (export/onnx_layered.py)
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
    config                        ModelConfig fields (rope_scaling nested)
    io                            graph input/output names ("{i}" = layer index), the KV layout, and
                                  dynamic: kv_pad_rows (cache rows past the capacity that the graph writes scratch
                                  K/V into); static: verify_width, max_context, mask_value
    tensors                       canonical tensor -> {linear, storage, source_type, exact, max_abs_err}
                                  (specedge-onnx only)
    files                         file name -> {sha256, bytes} for every file of the artifact but the manifest
    provenance                    source path and sha256, exporter and library versions
    tokenizer                     tokenizer.json, chat template file, special ids
    drafter_vocab                 optional (export --drafter-vocab N; ALGORITHMS.md 2.2 VocabTrim): file (the id list,
                                  JSON {"ids": [...]}, ascending), n, vocab_size, model (the decoder with the LM head
                                  cut to those rows: logits [T, n]), head (final norm + trimmed head on hidden states),
                                  head_io, calibration (target, engine, prompts, max_tokens, generated, source);
                                  runtime/vocab_trim.py reads it
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .config import ModelConfig, RopeScaling
from .errors import ModelFileError
from .tokenizer_spec import TokenizerSpec

FORMAT = "specedge-onnx"
FORMAT_VERSION = 4  # what dynamic artifacts are written as (4: tree inputs)
CHAIN_FORMAT_VERSION = 2  # dynamic artifacts without the tree inputs; still read, chains only
STATIC_FORMAT_VERSION = 3  # static-profile artifacts: readers of version 2 only must refuse them
LAYERED_FORMAT_VERSION = 5  # layered-profile artifacts (one graph per segment): readers of 2 and 3 must refuse them
OPTIMUM_FORMAT = "optimum-onnx"
OPTIMUM_FORMAT_VERSION = 1
READ_VERSIONS = {FORMAT: (CHAIN_FORMAT_VERSION, STATIC_FORMAT_VERSION, FORMAT_VERSION, LAYERED_FORMAT_VERSION),
                 OPTIMUM_FORMAT: (OPTIMUM_FORMAT_VERSION,)}
MANIFEST = "manifest.json"


class Profile(enum.Enum):
    """Shape profile of an exported graph."""

    DYNAMIC = "dynamic"  # T and the cache length are free; com.microsoft GroupQueryAttention (CPU, CUDA, DirectML)
    STATIC = "static"  # [1, W] in, [1, n_kv, C, head_dim] caches; standard ops only (NPU providers need this)
    LAYERED = "layered"  # dynamic shapes, one graph per segment (embed, each layer, head): runs layer plans


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["eos_ids"] = list(cfg.eos_ids)
    return d


def config_from_dict(d: Mapping[str, Any]) -> ModelConfig:
    d = dict(d)
    d["rope_scaling"] = RopeScaling(**d.get("rope_scaling", {}))
    d["eos_ids"] = tuple(d.get("eos_ids", ()))
    return ModelConfig(**d)


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

    def tokenizer_spec(self) -> TokenizerSpec:
        t = self.raw["tokenizer"]
        template = (self.root / t["chat_template"]).read_text("utf-8") if t.get("chat_template") else None
        return TokenizerSpec(hf_json=(self.root / t["file"]).read_text("utf-8"), bos_id=t.get("bos_id"),
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


def read_manifest(root: str | Path, *, verify: bool = True) -> Manifest:
    """Read and validate `root/manifest.json`; verify=True also checks every file's hash."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise ModelFileError(f"{root} is not an exported model directory (no {MANIFEST}); run `specedge export`")
    try:
        raw = json.loads(path.read_text("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFileError(f"{path} is not valid JSON ({e}); re-export the model") from None
    fmt = raw.get("format")
    if fmt not in READ_VERSIONS:
        raise ModelFileError(f"{path}: format {fmt!r} is not one of {', '.join(map(repr, READ_VERSIONS))}")
    if raw.get("format_version") not in READ_VERSIONS[fmt]:
        raise ModelFileError(f"{path}: {fmt} format version {raw.get('format_version')} is not supported by this "
                             f"specedge (reads versions {', '.join(map(str, READ_VERSIONS[fmt]))}); re-export or "
                             "upgrade specedge")
    try:
        profile = Profile(raw.get("profile", Profile.DYNAMIC.value))
    except ValueError:
        raise ModelFileError(f"{path}: unknown profile {raw.get('profile')!r} (this specedge reads "
                             f"{', '.join(p.value for p in Profile)}); upgrade specedge") from None
    expected = {Profile.STATIC: (STATIC_FORMAT_VERSION,), Profile.LAYERED: (LAYERED_FORMAT_VERSION,)}.get(
        profile, (CHAIN_FORMAT_VERSION, FORMAT_VERSION))
    if fmt == FORMAT and raw["format_version"] not in expected:
        raise ModelFileError(f"{path}: profile {profile.value} does not match format version "
                             f"{raw['format_version']}; re-export the model")
    try:
        config = config_from_dict(raw["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"{path}: bad model config ({e})") from None
    manifest = Manifest(root, raw, config)
    if verify:
        manifest.verify_files()
    return manifest
