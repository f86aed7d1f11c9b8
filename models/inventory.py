"""What the model cache holds, for `specedge models` and `specedge rm`.

    <cache>/<catalogue file>.gguf (+ .sha256)   a pulled catalogue model
    <cache>/<other>.gguf                        a GGUF file put there by hand
    <cache>/<name>/manifest.json                an exported artifact (`specedge export` writes <model>-onnx-<weights>)
    <cache>/hf/OWNER--REPO/<commit>/...         pulled from the Hugging Face Hub (`specedge pull hf:...`, models/hub.py)
    <cache>/plans/*.json                        cached plans: {"model": name given, "sources": [paths measured],
                                                "choice": {..., "summary"?}, "created"}
    <cache>/profiles/*.json                     device profiles: {"model": path measured, "backend", "created", ...}
    <cache>/.pull-<pid>-*/                      a running pull's staging folder, or a killed pull's leftover
                                                (models/staging.py); <cache>/<file>.partial-<pid> from older versions

Listing reads manifests without hashing their files (`load` verifies them) and skips unreadable plans and profiles
with a note. Removal deletes a model's files and every plan and profile that references it, and nothing outside the
cache directory.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import hub
from .catalog import CATALOG, license_name, model_cache_dir, pull_leftovers
from .errors import ModelFileError
from .manifest import FORMAT, MANIFEST, PAD_ROW_NONE, read_manifest

PLANS, PROFILES = "plans", "profiles"


@dataclass(frozen=True)
class CatalogueRow:
    name: str
    size: int  # bytes of the assembled file
    pulled: bool  # the file is in the cache at its catalogue size (its hash is checked when it loads)
    license: str
    description: str
    path: str


@dataclass(frozen=True)
class GgufRow:
    name: str  # file name in the cache
    size: int
    path: str


@dataclass(frozen=True)
class ArtifactRow:
    name: str  # directory name in the cache (what `generate NAME` takes)
    weights: str | None  # int4 | int8 | fp16 | fp32 | ...; None when the manifest is unreadable
    profile: str | None  # dynamic | layered | static | gpu | optimum
    size: int  # bytes on disk, every file under the directory
    source_sha256: str | None  # the exported source's sha256, first 12 hex digits
    parity: str  # passed | FAILED | pending (an unfinished export) | not gated | unreadable
    path: str
    note: str | None = None  # why the manifest could not be read


@dataclass(frozen=True)
class PlanRow:
    file: str
    model: str
    sources: tuple[str, ...]
    summary: str | None
    created: str


@dataclass(frozen=True)
class ProfileRow:
    file: str
    model: str
    backend: str
    created: str


@dataclass(frozen=True)
class LeftoverRow:
    path: str
    model: str  # the model the pull was fetching ("?" when not recorded)
    size: int  # bytes on disk
    live: bool  # a running pull holds it (kept); else an interrupted pull's leftover (`specedge rm --leftovers`)


@dataclass(frozen=True)
class Inventory:
    cache: Path
    catalogue: list[CatalogueRow]
    ggufs: list[GgufRow]
    artifacts: list[ArtifactRow]
    plans: list[PlanRow]
    profiles: list[ProfileRow]
    notes: list[str] = field(default_factory=list)  # files skipped, and why
    hf: list[hub.HubRow] = field(default_factory=list)  # pulled from the Hugging Face Hub
    leftovers: list[LeftoverRow] = field(default_factory=list)  # staging folders of running or killed pulls

    def to_dict(self) -> dict[str, Any]:
        return {"cache": str(self.cache), "catalogue": [asdict(r) for r in self.catalogue],
                "gguf": [asdict(r) for r in self.ggufs], "hf": [asdict(r) for r in self.hf],
                "artifacts": [asdict(r) for r in self.artifacts],
                "plans": [{**asdict(r), "sources": list(r.sources)} for r in self.plans],
                "profiles": [asdict(r) for r in self.profiles],
                "leftovers": [asdict(r) for r in self.leftovers], "notes": list(self.notes)}


def _tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _artifact_row(root: Path) -> ArtifactRow:
    try:
        m = read_manifest(root, verify=False)  # schema checked, files not hashed: listing stays fast
    except ModelFileError as e:
        return ArtifactRow(root.name, None, None, _tree_size(root), None, "unreadable", str(root), str(e))
    profile = ("gpu" if m.format == FORMAT and m.pad_row == PAD_ROW_NONE else
               m.profile.value if m.format == FORMAT else "optimum")
    prov = m.raw.get("provenance")
    sha = prov.get("source_sha256") if isinstance(prov, dict) else None
    parity = m.raw.get("parity")
    gate = ("not gated" if not isinstance(parity, dict) else "pending" if parity.get("pending") else
            "passed" if parity.get("passed") else "FAILED")
    return ArtifactRow(root.name, m.weight_format, profile, _tree_size(root),
                       sha[:12] if isinstance(sha, str) else None, gate, str(root))


def _read_json(path: Path, required: dict[str, type], notes: list[str]) -> dict | None:
    """The JSON object in `path` with `required` fields of those types, or None with a note saying why not."""
    try:
        obj = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as e:
        notes.append(f"skipped {path}: not readable JSON ({type(e).__name__})")
        return None
    if not isinstance(obj, dict):
        notes.append(f"skipped {path}: not a JSON object")
        return None
    bad = [k for k, t in required.items() if not isinstance(obj.get(k), t)]
    if bad:
        notes.append(f"skipped {path}: missing or wrong {', '.join(bad)}")
        return None
    return obj


def read_plans(cache: Path, notes: list[str]) -> list[tuple[Path, PlanRow]]:
    rows = []
    for path in sorted((cache / PLANS).glob("*.json")):
        obj = _read_json(path, {"model": str, "sources": list, "choice": dict, "created": str}, notes)
        if obj is not None:
            summary = obj["choice"].get("summary")
            rows.append((path, PlanRow(path.name, obj["model"], tuple(str(s) for s in obj["sources"]),
                                       summary if isinstance(summary, str) else None, obj["created"])))
    return rows


def read_profiles(cache: Path, notes: list[str]) -> list[tuple[Path, ProfileRow]]:
    rows = []
    for path in sorted((cache / PROFILES).glob("*.json")):
        obj = _read_json(path, {"model": str, "backend": str, "created": str}, notes)
        if obj is not None:
            rows.append((path, ProfileRow(path.name, obj["model"], obj["backend"], obj["created"])))
    return rows


def scan(cache_dir: str | Path | None = None) -> Inventory:
    """Everything in the model cache (an absent cache lists the catalogue as not pulled)."""
    cache = model_cache_dir(cache_dir)
    notes: list[str] = []
    catalogue = []
    for e in CATALOG.values():
        path = cache / e.filename
        catalogue.append(CatalogueRow(e.name, e.size, path.is_file() and path.stat().st_size == e.size, e.license,
                                      e.description, str(path)))
    files = {e.filename for e in CATALOG.values()}
    entries = sorted(cache.iterdir()) if cache.is_dir() else []
    ggufs = [GgufRow(p.name, p.stat().st_size, str(p)) for p in entries
             if p.suffix == ".gguf" and p.is_file() and p.name not in files]
    artifacts = [_artifact_row(p) for p in entries if p.is_dir() and (p / MANIFEST).is_file()]
    notes += [f"{a.name}: {a.note}" for a in artifacts if a.note]
    plans = [r for _, r in read_plans(cache, notes)]
    profiles = [r for _, r in read_profiles(cache, notes)]
    leftovers = [LeftoverRow(str(x.path), x.model, x.size, x.live) for x in pull_leftovers(cache)]
    return Inventory(cache, catalogue, ggufs, artifacts, plans, profiles, notes, hub.list_cached(cache), leftovers)


def _mb(n: int) -> str:
    return f"{n / 1e6:8.1f} MB"


def format_inventory(inv: Inventory) -> str:
    """The `specedge models` table: one section per kind of cached thing."""
    out = [f"model cache: {inv.cache}", "", f"{'catalogue (specedge pull NAME)':36s} {'size':>11s}  {'state':10s}  "
                                              f"{'licence':11s} description"]
    for r in inv.catalogue:
        out.append(f"  {r.name:34s} {_mb(r.size)}  {'pulled' if r.pulled else 'not pulled':10s}  {license_name(r.license):11s} "
                   f"{r.description}")
    out += ["", "GGUF files (not in the catalogue)"]
    out += [f"  {r.name:34s} {_mb(r.size)}" for r in inv.ggufs] or ["  (none)"]
    out += ["", f"{'Hugging Face (specedge pull hf:OWNER/REPO[/FILE.gguf])':56s} {'size':>11s}  kind        revision"]
    out += [f"  {r.name:54s} {_mb(r.size)}  {r.kind:10s}  {r.revision}" for r in inv.hf] or ["  (none)"]
    out += ["", f"exported artifacts (run on ONNX Runtime)   {'weights':7s} {'profile':8s} {'size':>11s}  "
                f"{'source':12s}  parity"]
    out += [f"  {r.name:40s} {r.weights or '?':7s} {r.profile or '?':8s} {_mb(r.size)}  "
            f"{r.source_sha256 or '?':12s}  {r.parity}" for r in inv.artifacts] or ["  (none)"]
    out += ["", "plans"]
    out += [f"  {r.model:34s} {r.created:20s} {r.summary or '(no summary)'}   [{r.file}]" for r in inv.plans] \
        or ["  (none)"]
    out += ["", "device profiles"]
    out += [f"  {r.backend:8s} {r.model}   {r.created}   [{r.file}]" for r in inv.profiles] or ["  (none)"]
    out += _leftover_lines(inv.leftovers)
    if inv.notes:
        out += ["", "notes"] + [f"  {n}" for n in inv.notes]
    return "\n".join(out)


def _leftover_lines(rows: list[LeftoverRow]) -> list[str]:
    """The leftovers of interrupted pulls, and the folders of pulls running now (kept): sections shown only when
    there is something in them."""
    def lines(rs: list[LeftoverRow], state: str) -> list[str]:
        return [f"  {r.model:34s} {_mb(r.size)}  {state}   {r.path}" for r in rs]
    dead, live = [r for r in rows if not r.live], [r for r in rows if r.live]
    out = []
    if dead:
        out += ["", f"leftovers of interrupted pulls: {_mb(sum(r.size for r in dead)).strip()} (`specedge rm "
                    "--leftovers` removes them; so does the next `specedge pull`)"] + lines(dead, "interrupted")
    if live:
        out += ["", "pulls running now"] + lines(live, "running (kept)")
    return out


# -- removal ----------------------------------------------------------------------------------------------------

def _same(value: str, path: Path) -> bool:
    """`value` names `path`, or a file inside the directory `path` (a pulled checkpoint, a hub repo's folder)."""
    try:
        p, target = Path(value).expanduser().resolve(), path.resolve()
        return p == target or (path.is_dir() and target in p.parents)
    except (OSError, RuntimeError, ValueError):
        return False


def _model_paths(name: str, cache: Path) -> tuple[list[Path], set[str]]:
    """The files/directory `name` names in the cache and the names plans may use for it; ModelFileError when it
    names nothing cached or a path outside the cache."""
    if hub.is_hub_ref(name):
        return hub.removal_paths(name, cache), {name}
    given = Path(name).expanduser()
    if given.is_absolute() or len(given.parts) > 1 or (given.exists() and not (cache / name).exists()
                                                       and name not in CATALOG):
        if not given.exists() or given.resolve().parent != cache.resolve():
            raise ModelFileError(f"{name} is not in the model cache {cache}: `specedge rm` deletes only cached models "
                                 "(delete other files yourself)")
        name = given.resolve().name
    entry = CATALOG.get(name) or next((e for e in CATALOG.values() if e.filename == name), None)
    if entry is not None and (cache / entry.filename).is_file():
        gguf = cache / entry.filename
        return [gguf, gguf.with_name(gguf.name + ".sha256")], {entry.name, entry.filename}
    if name.endswith(".gguf") and (cache / name).is_file():
        return [cache / name, cache / (name + ".sha256")], {name}
    if (cache / name / MANIFEST).is_file():
        return [cache / name], {name}
    inv = scan(cache)
    cached = ([r.name for r in inv.catalogue if Path(r.path).is_file()] + [r.name for r in inv.ggufs]
              + [r.name for r in inv.artifacts])
    raise ModelFileError(f"{name!r} is not a cached model in {cache}; cached: {', '.join(cached) or 'nothing'} "
                         "(see `specedge models`)")


def removal(name: str, cache_dir: str | Path | None = None) -> tuple[list[Path], list[str]]:
    """What `specedge rm NAME` deletes: the model's files (a catalogue GGUF and its .sha256 sidecar, a GGUF file, or
    an artifact directory) and every plan and profile that references it (a plan whose "sources" holds its path or
    whose "model" is its name; a profile whose "model" is its path), plus notes on files skipped unread."""
    cache = model_cache_dir(cache_dir)
    paths, names = _model_paths(name, cache)
    target, notes = paths[0], []
    for path, plan in read_plans(cache, notes):
        if plan.model in names or _same(plan.model, target) or any(_same(s, target) for s in plan.sources):
            paths.append(path)
    paths += [path for path, prof in read_profiles(cache, notes) if _same(prof.model, target)]
    return [p for p in paths if p.exists()], notes


def delete(paths: list[Path]) -> None:
    """Delete files and directories (as `removal` returned them)."""
    for p in paths:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
