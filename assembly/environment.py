"""The machine a measurement ran on: package versions, threads, CPU model and SIMD flags, git commit. Every report
(bench results, device profiles) records it; the profile cache keys on it."""
from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path

from ..runtime.cores import cpu_info  # noqa: F401 (re-exported: the reports' CPU model and flags)

SIMD = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
        "amx_tile", "amx_int8", "amx_bf16", "neon", "asimd", "asimddp", "sve", "i8mm")


def environment(threads: int | None, root: Path | None = None) -> dict:
    """Package versions, threads, CPU model and SIMD flags (/proc/cpuinfo), git commit of the project checkout."""
    packages = {}
    for name in ("specedge", "numpy", "onnxruntime", "onnx", "llama_cpp_python", "tokenizers", "gguf"):
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    model, flags = cpu_info()
    commit = None
    try:
        root = root or Path(__file__).resolve().parent.parent
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"packages": packages, "python": platform.python_version(), "platform": platform.platform(),
            "threads": threads, "cpu_model": model, "cpu_flags": flags, "git_commit": commit}
