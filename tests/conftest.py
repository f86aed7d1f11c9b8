"""The tiny seeded models many test files share, built once per pytest process (once per xdist worker).

Every fixture here is session-scoped and READ-ONLY: a test that changes a file, an artifact or a backend's state
copies it into its own tmp_path first (shutil.copy / copytree), so no test sees another's edits. Files that need a
model of another shape (more layers, another seed, a special head) still build their own.

    tiny_gguf        seed 0, 2 layers, context 256: the default target (models/tiny.py's defaults)
    draft_gguf       seed 1, 1 layer: a drafter with the same vocabulary
    tiny_gguf_4k     tiny_gguf's weights with a 4096-position context (servers, long answers)
    tiny_backends    (NumpyBackend float64 of tiny_gguf, of draft_gguf, Tokenizer): the decode-loop tests' pair
    onnx3(arch)      (3-layer GGUF opened, its fp32 dynamic ONNX artifact): seed 3, tied llama / untied qwen2 (q/k/v
                     biases), the ONNX parity tests' source, exported once (ungated)
    blas_on_every_core  the test's NumPy-reference matmuls on every core: once any engine is open in the process
                     they run on one (runtime/backends/blas.py); a real-model test of the reference takes it

Tiers (pyproject.toml markers): `pytest -m "not slow and not real"` is the fast tier a developer runs; CI runs
everything. Mark a test `slow` when it takes more than about 2 s on 2 cores, `real` when it needs a real model.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from specedge.models.gguf_in import GGUFModel, open_gguf
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.backends.blas import every_core
from specedge.runtime.backends.numpy_ref import NumpyBackend
from specedge.runtime.tokenizer import Tokenizer


@pytest.fixture
def blas_on_every_core():
    with every_core():
        yield


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="session")
def tiny_gguf(shared_dir) -> Path:
    return write_tiny_gguf(shared_dir / "tiny.gguf", seed=0, n_layers=2)


@pytest.fixture(scope="session")
def draft_gguf(shared_dir) -> Path:
    return write_tiny_gguf(shared_dir / "draft.gguf", seed=1, n_layers=1)


@pytest.fixture(scope="session")
def tiny_gguf_4k(shared_dir) -> Path:
    return write_tiny_gguf(shared_dir / "tiny-4k.gguf", seed=0, n_layers=2, context=4096)


@pytest.fixture(scope="session")
def tiny_backends(tiny_gguf, draft_gguf) -> tuple[NumpyBackend, NumpyBackend, Tokenizer]:
    target, draft = open_gguf(tiny_gguf), open_gguf(draft_gguf)
    return (NumpyBackend(target.load_weights(), np.float64), NumpyBackend(draft.load_weights(), np.float64),
            Tokenizer(target.tokenizer_spec()))


@pytest.fixture(scope="session")
def onnx3(shared_dir) -> Callable[[str], tuple[GGUFModel, Path]]:
    """arch -> (the 3-layer GGUF opened, its fp32 dynamic artifact, exported ungated on first use): a function, so a
    module parametrized over TINY_ARCHS keeps its own order."""
    made: dict[str, tuple[GGUFModel, Path]] = {}

    def get(arch: str) -> tuple[GGUFModel, Path]:
        if arch not in made:
            pytest.importorskip("onnxruntime")
            from specedge.export.onnx_export import export_gguf_to_onnx
            from specedge.export.onnx_linear import WeightFormat
            gguf = open_gguf(write_tiny_gguf(shared_dir / f"onnx3-{arch}.gguf", arch=arch, n_layers=3,
                                             tied=arch == "llama", seed=3))
            export_gguf_to_onnx(gguf, shared_dir / f"onnx3-{arch}-fp32", WeightFormat.FP32, gate=False)
            made[arch] = gguf, shared_dir / f"onnx3-{arch}-fp32"
        return made[arch]
    return get
