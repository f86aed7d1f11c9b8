"""Models from the Hugging Face Hub: `specedge pull hf:OWNER/REPO[/FILE.gguf][@REVISION]`.

    hf:OWNER/REPO/FILE.gguf     that one GGUF file (FILE may sit in a folder of the repo: hf:o/r/q4/x.gguf)
    hf:OWNER/REPO               the Hugging Face checkpoint: the files models/hf_in.py reads (CHECKPOINT_FILES, the
                                *.safetensors shards); or the repo's only GGUF when it has no config.json
    @REVISION, or --revision    a branch, tag or commit (default: main)

The cache lives inside the model cache (models/catalog.model_cache_dir):

    <cache>/hf/OWNER--REPO/refs.json                    {revision: commit}, as the hub last resolved them
    <cache>/hf/OWNER--REPO/<commit>/<files>             the files, written by huggingface_hub's local_dir mode (an
                                                        interrupted download stays in .cache/huggingface/download/
                                                        <file>.<etag>.incomplete and resumes with a Range request)
    <cache>/hf/OWNER--REPO/<commit>/specedge-hub.json   {"repo", "commit", "files": {path: {"sha256", "size"}},
                                                        "repo_default": {"kind": "gguf"|"checkpoint", "files"}}

Every downloaded file is checked against the hub's own record of it (an LFS file's sha256, which the hub also sends
as its ETag; a small file's git blob id) and its SHA-256 recorded; a cached copy is re-hashed against that record
on reuse (catalog.file_sha256's sidecar spares the hash while size and mtime are unchanged). Reuse needs no network;
HF_HUB_OFFLINE=1 makes `pull` use the cache only. huggingface_hub is imported only to talk to the hub.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .catalog import file_sha256, model_cache_dir
from .errors import ModelFileError

PREFIX = "hf:"
HUB_DIR = "hf"
RECORD = "specedge-hub.json"
REFS = "refs.json"
CHECKPOINT_FILES = ("config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                    "generation_config.json", "chat_template.jinja")
TORCH_WEIGHTS = (".bin", ".pt", ".pth")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class HubUnreachable(ModelFileError):
    """The hub could not be reached (no network, offline mode, wrong HF_ENDPOINT)."""


@dataclass(frozen=True)
class HubRef:
    """hf:OWNER/REPO[/FILE][@REVISION] parsed; file None means the repo's default (checkpoint or only GGUF)."""

    repo_id: str
    file: str | None = None
    revision: str | None = None

    @classmethod
    def parse(cls, text: str, revision: str | None = None) -> "HubRef":
        body, _, rev = str(text)[len(PREFIX):].partition("@") if is_hub_ref(text) else ("", "", "")
        parts = body.split("/")
        repo_id, file = "/".join(parts[:2]), "/".join(parts[2:]) or None
        if not _REPO.fullmatch(repo_id) or ".." in parts or "" in parts:
            raise ModelFileError(f"{text!r}: write a Hugging Face model as hf:OWNER/REPO or hf:OWNER/REPO/FILE.gguf "
                                 "(optionally @REVISION)")
        if file is not None and not file.endswith(".gguf"):
            raise ModelFileError(f"{text!r}: FILE must be a .gguf file; leave it out to fetch the repo's "
                                 f"checkpoint (hf:{repo_id})")
        if rev and revision and rev != revision:
            raise ModelFileError(f"{text!r} names revision {rev!r} but --revision says {revision!r}")
        return cls(repo_id, file, revision or rev or None)

    def __str__(self) -> str:
        return PREFIX + self.repo_id + (f"/{self.file}" if self.file else "") + (f"@{self.revision}" if self.revision
                                                                                 else "")

    @property
    def folder(self) -> str:
        return self.repo_id.replace("/", "--")

    @property
    def rev(self) -> str:
        return self.revision or "main"


def is_hub_ref(text: object) -> bool:
    return str(text).startswith(PREFIX)


def base_name(text: str) -> str:
    """What an export of this model is named after: the GGUF file's stem, else the repo's name."""
    ref = HubRef.parse(text)
    return Path(ref.file).stem if ref.file else ref.repo_id.split("/")[1]


def _repo_dir(ref: HubRef, cache: Path) -> Path:
    return cache / HUB_DIR / ref.folder


def _read(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text("utf-8"))
        return obj if isinstance(obj, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


# -- the cache, without the network ------------------------------------------------------------------------------

def _commit_dir(ref: HubRef, cache: Path) -> Path | None:
    """The cached commit directory a ref's revision resolved to when it was pulled (None: never pulled)."""
    repo = _repo_dir(ref, cache)
    commit = ref.rev if _COMMIT.fullmatch(ref.rev) else _read(repo / REFS).get(ref.rev)
    return repo / commit if isinstance(commit, str) and (repo / commit / RECORD).is_file() else None


def _wanted(ref: HubRef, record: dict) -> tuple[str, list[str]] | None:
    if ref.file is not None:
        return "gguf", [ref.file]
    default = record.get("repo_default")
    return (default["kind"], list(default["files"])) if isinstance(default, dict) else None


def _result(ref: HubRef, folder: Path, kind: str, files: list[str]) -> Path:
    return folder / files[0] if kind == "gguf" else folder


def _verify_cached(ref: HubRef, folder: Path, files: list[str], record: dict) -> list[str]:
    """The files missing or not matching their recorded SHA-256 (an empty list: all verified)."""
    bad = []
    for name in files:
        rec, path = record.get("files", {}).get(name), folder / name
        if not isinstance(rec, dict) or not path.is_file() or file_sha256(path) != rec.get("sha256"):
            bad.append(name)
    return bad


def cached(spec: str | HubRef, cache_dir: str | Path | None = None) -> Path | None:
    """The verified cached copy (GGUF file, or checkpoint directory) of a hub ref, or None if it was never pulled;
    ModelFileError when a cached file no longer matches the SHA-256 recorded when it was pulled."""
    ref = spec if isinstance(spec, HubRef) else HubRef.parse(spec)
    folder = _commit_dir(ref, model_cache_dir(cache_dir))
    record = _read(folder / RECORD) if folder else {}
    wanted = _wanted(ref, record)
    if folder is None or wanted is None or not all((folder / f).is_file() for f in wanted[1]):
        return None
    bad = _verify_cached(ref, folder, wanted[1], record)
    if bad:
        raise ModelFileError(f"{ref}: cached {', '.join(bad)} in {folder} does not match the SHA-256 recorded when it "
                             f"was pulled (changed or corrupted on disk); run `specedge pull {ref}` to download it "
                             f"again, or `specedge rm {ref}`")
    return _result(ref, folder, *wanted)


def cached_kind(spec: str, cache_dir: str | Path | None = None) -> str | None:
    """"gguf" or "checkpoint" for a pulled ref (no hashing, no network); None if not pulled."""
    ref = HubRef.parse(spec)
    folder = _commit_dir(ref, model_cache_dir(cache_dir))
    wanted = _wanted(ref, _read(folder / RECORD)) if folder else None
    return wanted[0] if wanted else None


def resolve(spec: str, cache_dir: str | Path | None = None, *, pull_if_missing: bool = True) -> Path:
    """The cached copy of a hub ref (no network), pulled first when missing and pull_if_missing."""
    found = cached(spec, cache_dir)
    if found is not None:
        return found
    if not pull_if_missing:
        raise ModelFileError(f"{spec} is not in the cache; run: specedge pull {spec}")
    return pull(spec, cache_dir)


def resolve_gguf(spec: str, cache_dir: str | Path | None = None, *, pull_if_missing: bool = True) -> Path:
    """resolve(), for the GGUF engines: a ref that resolves to a checkpoint says to export it."""
    path = resolve(spec, cache_dir, pull_if_missing=pull_if_missing)
    if path.is_dir():
        raise ModelFileError(f"{spec} is a Hugging Face checkpoint (safetensors), not a GGUF file: export it with "
                             f"`specedge export {spec} --format onnx` and run what it writes, or pull one of the "
                             "repo's GGUF files as hf:OWNER/REPO/FILE.gguf")
    return path


# -- the hub -----------------------------------------------------------------------------------------------------

def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None  # None: huggingface_hub's own lookup (a stored login)


def select(ref: HubRef, siblings: dict) -> tuple[str, list[str]]:
    """(kind, files) to download from a repo listing {path: size-or-info}: the named GGUF; else the checkpoint files
    when config.json is there; else the only GGUF. ModelFileError listing the choices otherwise."""
    names = sorted(siblings)
    ggufs = [n for n in names if n.endswith(".gguf")]
    if ref.file is not None:
        if ref.file not in siblings:
            raise ModelFileError(f"{ref.repo_id} at {ref.rev} has no file {ref.file}; its GGUF files: "
                                 f"{', '.join(ggufs) or 'none'}")
        return "gguf", [ref.file]
    if "config.json" in siblings:
        shards = [n for n in names if n.endswith(".safetensors") and "/" not in n]
        if not shards:
            torch_files = [n for n in names if n.endswith(TORCH_WEIGHTS)]
            what = (f"only PyTorch weights ({', '.join(torch_files)}), which specedge does not read"
                    if torch_files else "no .safetensors weights")
            raise ModelFileError(f"{ref.repo_id} has {what}: pick a repo with safetensors"
                                 + (f" or one of its GGUF files: {', '.join(f'hf:{ref.repo_id}/{g}' for g in ggufs)}"
                                    if ggufs else " or GGUF files"))
        return "checkpoint", [n for n in CHECKPOINT_FILES if n in siblings] + shards
    if len(ggufs) == 1:
        return "gguf", ggufs
    if ggufs:
        raise ModelFileError(f"{ref.repo_id} holds {len(ggufs)} GGUF files; name one: "
                             + ", ".join(f"specedge pull hf:{ref.repo_id}/{g}" for g in ggufs))
    raise ModelFileError(f"{ref.repo_id} holds neither a Hugging Face checkpoint (config.json + *.safetensors) nor "
                         "a GGUF file")


@contextmanager
def _hub_errors(ref: HubRef) -> Iterator[None]:
    """huggingface_hub's and requests' exceptions -> ModelFileError naming the fix."""
    import requests
    from huggingface_hub import errors as e
    where = _endpoint()
    try:
        yield
    except e.GatedRepoError:
        raise ModelFileError(f"{ref.repo_id} is gated: accept its terms at {where}/{ref.repo_id} and set HF_TOKEN to "
                             "an access token of that account") from None
    except (requests.ConnectionError, requests.Timeout, e.LocalEntryNotFoundError, e.OfflineModeIsEnabled) as err:
        raise HubUnreachable(f"cannot reach the Hugging Face Hub at {where} ({type(err).__name__}): check the "
                             "network (or HF_ENDPOINT); models pulled before run offline, also with HF_HUB_OFFLINE=1")\
            from None
    except e.RevisionNotFoundError:
        raise ModelFileError(f"{ref.repo_id} has no revision {ref.rev!r} (a branch, tag or commit; --revision)") \
            from None
    except e.EntryNotFoundError:
        raise ModelFileError(f"{ref.repo_id} at {ref.rev}: a file it lists is missing on {where}; try again later "
                             "or pick another revision") from None
    except e.RepositoryNotFoundError:
        raise ModelFileError(f"no model repository {ref.repo_id} on {where} (check OWNER/REPO; a private repo needs "
                             "HF_TOKEN set to an access token that can read it)") from None
    except e.HfHubHTTPError as err:
        raise ModelFileError(f"the hub at {where} refused {ref}: {str(err).splitlines()[0]}") from None
    except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError, OSError) as err:
        if not isinstance(err, requests.RequestException) and "Consistency check failed" not in str(err):
            raise  # a local OSError (disk full, permissions) is not an interrupted transfer
        raise ModelFileError(f"{ref}: the download was interrupted ({type(err).__name__}); run `specedge pull {ref}` "
                             "again: it resumes from the partial file") from None


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_download(ref: HubRef, path: Path, sibling) -> str:
    """SHA-256 of a downloaded file after checking it against the hub's record of it; a mismatch deletes it."""
    digest = file_sha256(path)
    lfs = getattr(sibling, "lfs", None)
    if lfs is not None:
        ok, expected = digest == lfs.sha256 and path.stat().st_size == lfs.size, f"sha256 {lfs.sha256}"
    elif getattr(sibling, "blob_id", None):
        ok, expected = _git_blob_sha1(path) == sibling.blob_id, f"git blob {sibling.blob_id}"
    else:
        ok, expected = True, ""
    if not ok:
        for p in (path, path.with_name(path.name + ".sha256")):
            p.unlink(missing_ok=True)
        raise ModelFileError(f"{ref}: downloaded {sibling.rfilename} does not match the hub's {expected} (got sha256 "
                             f"{digest}; deleted): the transfer was corrupted or altered on the way; run `specedge "
                             f"pull {ref}` again")
    return digest


def pull(spec: str | HubRef, cache_dir: str | Path | None = None, *, revision: str | None = None,
         log: Callable[[str], None] | None = None) -> Path:
    """Download a hub ref into the cache (files already there and verified are kept) and return its GGUF file or
    checkpoint directory. Offline (HF_HUB_OFFLINE=1) or with the hub unreachable, a cached copy is used."""
    ref = spec if isinstance(spec, HubRef) else HubRef.parse(spec, revision)
    cache = model_cache_dir(cache_dir)
    if _offline():
        found = cached(ref, cache)
        if found is None:
            raise ModelFileError(f"{ref} is not in the cache {cache} and HF_HUB_OFFLINE is set: unset it and run "
                                 f"`specedge pull {ref}`")
        return found
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ModelFileError("pulling hf: models needs huggingface_hub: pip install 'specedge[hub]'") from None
    try:
        with _hub_errors(ref):
            info = HfApi(endpoint=_endpoint(), token=_token()).model_info(ref.repo_id, revision=ref.rev,
                                                                          files_metadata=True)
    except HubUnreachable:
        found = cached(ref, cache)
        if found is None:
            raise
        (log or (lambda m: None))(f"note: the hub is unreachable; using the cached {ref} ({found})")
        return found
    siblings = {s.rfilename: s for s in info.siblings or []}
    kind, files = select(ref, siblings)
    folder = _repo_dir(ref, cache) / info.sha
    folder.mkdir(parents=True, exist_ok=True)
    record = _read(folder / RECORD) or {"repo": ref.repo_id, "commit": info.sha, "files": {}}
    for name in files:
        _fetch(ref, folder, name, siblings[name], info.sha, record, log)
    if ref.file is None:
        record["repo_default"] = {"kind": kind, "files": files}
    _write(folder / RECORD, record)
    refs = _read(_repo_dir(ref, cache) / REFS)
    _write(_repo_dir(ref, cache) / REFS, {**refs, ref.rev: info.sha})
    return _result(ref, folder, kind, files)


def _fetch(ref: HubRef, folder: Path, name: str, sibling, commit: str, record: dict, log) -> None:
    """One file into `folder` (kept when already there and verified), checked and recorded."""
    from huggingface_hub import hf_hub_download
    path, rec = folder / name, record["files"].get(name)
    if path.is_file() and isinstance(rec, dict):
        if file_sha256(path) == rec.get("sha256"):
            return
        (log or (lambda m: None))(f"note: cached {name} does not match its recorded SHA-256; downloading it again")
    path.unlink(missing_ok=True)  # local_dir mode would keep a file whose commit matches, whatever its bytes
    with _hub_errors(ref):
        hf_hub_download(ref.repo_id, name, revision=commit, local_dir=folder, endpoint=_endpoint(), token=_token(),
                        cache_dir=folder.parent / ".hub-cache")
    record["files"][name] = {"sha256": _check_download(ref, path, sibling), "size": path.stat().st_size}
    _write(folder / RECORD, record)  # what is verified so far survives an interrupted pull


# -- listing and removal (models/inventory.py) --------------------------------------------------------------------

@dataclass(frozen=True)
class HubRow:
    name: str  # the ref that names it: hf:OWNER/REPO/FILE.gguf, or hf:OWNER/REPO for a checkpoint
    kind: str  # gguf | checkpoint
    size: int  # bytes of its files
    revision: str  # the revisions resolved to this commit (main, v1.0), else the commit's first 12 hex digits
    path: str


def list_cached(cache: Path) -> list[HubRow]:
    """What `specedge pull hf:...` put in the cache, read from its records (nothing hashed)."""
    rows = []
    for record_path in sorted((cache / HUB_DIR).glob(f"*/*/{RECORD}")):
        folder, record = record_path.parent, _read(record_path)
        repo, files = record.get("repo"), record.get("files")
        if not isinstance(repo, str) or not isinstance(files, dict):
            continue
        refs = _read(folder.parent / REFS)
        revision = ",".join(sorted(r for r, c in refs.items() if c == folder.name)) or folder.name[:12]
        present = {n: folder / n for n in files if (folder / n).is_file()}
        for n, p in present.items():
            if n.endswith(".gguf"):
                rows.append(HubRow(f"{PREFIX}{repo}/{n}", "gguf", p.stat().st_size, revision, str(p)))
        default = record.get("repo_default")
        if isinstance(default, dict) and default.get("kind") == "checkpoint" and \
                all(f in present for f in default.get("files", [])):
            rows.append(HubRow(f"{PREFIX}{repo}", "checkpoint", sum(present[f].stat().st_size
                                                                   for f in default["files"]), revision, str(folder)))
    return rows


def removal_paths(spec: str, cache: Path) -> list[Path]:
    """What `specedge rm` deletes for a ref, at every cached revision: hf:OWNER/REPO the repo's whole folder;
    hf:OWNER/REPO/FILE.gguf that file and its sidecar. ModelFileError when nothing of it is cached."""
    ref = HubRef.parse(spec)
    repo = _repo_dir(ref, cache)
    if ref.file is None:
        paths = [repo] if repo.is_dir() else []
    else:
        paths = [p for f in sorted(repo.glob(f"*/{ref.file}")) for p in (f, f.with_name(f.name + ".sha256"))]
    if not paths:
        cached_refs = [r.name for r in list_cached(cache)]
        raise ModelFileError(f"{spec} is not in the model cache {cache}; pulled from the hub: "
                             f"{', '.join(cached_refs) or 'nothing'} (see `specedge models`)")
    return paths
