"""What a model string names, decided in one place: `model_ref(text, cache_dir) -> ModelRef`.

    catalogue name       smollm2-135m                     CATALOG     (pulled from the package index on first use)
    GGUF file            ./m.gguf, or a .gguf in the cache GGUF
    Hugging Face ref     hf:OWNER/REPO[/FILE.gguf][@REV]  HUB, or CHECKPOINT once a checkpoint (no GGUF) is pulled
    exported artifact    a directory with manifest.json, or its name in the model cache (smollm2-135m-onnx-int8)
                                                          ARTIFACT (path: the directory)
    checkpoint           a Hugging Face checkpoint directory (config.json)   CHECKPOINT (export it first)

No file is read beyond existence checks and a pulled hub ref's record; nothing is pulled. Which engine runs a
reference is the assembly layer's (assembly/load.py engine_for, over the backend registry).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from . import hub
from .catalog import CATALOG, model_cache_dir
from .errors import ModelFileError
from .manifest import MANIFEST


class RefKind(enum.Enum):
    CATALOG = "catalog"
    GGUF = "gguf"
    HUB = "hub"
    ARTIFACT = "artifact"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class ModelRef:
    text: str  # as given
    kind: RefKind
    path: Path | None = None  # ARTIFACT / local CHECKPOINT: the directory; GGUF: the path as given

    @property
    def gguf(self) -> bool:
        """It names a GGUF file (a GGUF engine runs it)."""
        return self.kind in (RefKind.CATALOG, RefKind.GGUF, RefKind.HUB)

    def export_hint(self) -> str:
        return (f"{self.text} is a Hugging Face checkpoint: export it first with `specedge export {self.text} "
                "--format onnx` and run the directory it writes")


def model_ref(text: str | Path, cache_dir: str | Path | None = None) -> ModelRef:
    """The kind of model `text` names (module docstring). ModelFileError for a directory that is neither an
    artifact nor a checkpoint, and for a name that is nothing we know (listing the catalogue and cached artifacts)."""
    text = str(text)
    p = Path(text)
    if hub.is_hub_ref(text):
        return ModelRef(text, RefKind.CHECKPOINT if hub.cached_kind(text, cache_dir) == "checkpoint" else RefKind.HUB)
    if p.is_dir():
        if (p / MANIFEST).is_file():
            return ModelRef(text, RefKind.ARTIFACT, p)
        if (p / "config.json").is_file():
            return ModelRef(text, RefKind.CHECKPOINT, p)
        raise ModelFileError(f"{text} is a directory without {MANIFEST}: not an exported model (run `specedge "
                             "export MODEL --format onnx`), nor a GGUF file")
    if p.suffix == ".gguf":
        return ModelRef(text, RefKind.GGUF, p)  # a missing file is reported by resolve_model, naming it
    if text in CATALOG:
        return ModelRef(text, RefKind.CATALOG)
    cache = model_cache_dir(cache_dir)
    if (cache / text / MANIFEST).is_file():
        return ModelRef(text, RefKind.ARTIFACT, cache / text)
    artifacts = sorted(m.parent.name for m in cache.glob(f"*/{MANIFEST}")) if cache.is_dir() else []
    raise ModelFileError(f"model {text!r}: not a .gguf file, a catalogue name or an exported artifact; "
                         f"catalogue: {', '.join(CATALOG)}"
                         + (f"; exported artifacts in {cache}: {', '.join(artifacts)}" if artifacts else ""))
