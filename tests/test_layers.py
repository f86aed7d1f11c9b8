"""The package's layers import one way (import-linter contracts in pyproject.toml) and the decode loop reaches
drafters and backends through declared capabilities, not attribute probes."""
import ast
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(exe).exists():
        pytest.fail("lint-imports is missing: install the dev extra (import-linter)")
    # analyse this checkout (not an installed copy): a folder whose `specedge` entry is the repository root
    link_dir = ROOT / ".pytest_cache" / "layers"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "specedge"
    if not link.exists():
        link.symlink_to(ROOT, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(link_dir)}
    r = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def _probes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [f"{path.name}:{n.lineno} {n.func.id}" for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr")]


@pytest.mark.parametrize("module", ["decode.py", "steppers.py", "lossy.py", "request.py", "generate.py"])
def test_decode_loop_and_steppers_have_no_attribute_probes(module):
    """The loop, what one round does (steppers, lossy modes) and what crosses into them (Request, Speculation) read
    declared capabilities (DrafterCaps, BackendCaps), never hasattr/getattr probes."""
    assert _probes(ROOT / "runtime" / module) == []


# ---- docs/ARCHITECTURE.md names what exists ------------------------------------------------------------------------

PACKAGES = ("models", "runtime", "export", "assembly", "perf", "apps")
_CODE: list[str] = []


def _code() -> str:
    if not _CODE:
        _CODE.append("\n".join(p.read_text() for d in PACKAGES for p in (ROOT / d).rglob("*.py")))
    return _CODE[0]


def _defined(name: str) -> bool:
    """A def, class, assignment, field or attribute named `name` in the package's code."""
    return re.search(rf"(def|class)\s+{name}\b|^\s*{name}\s*[:=]|\.{name}\s*=|\b{name}\s*:\s*[\w\"'\[]|\b{name}=",
                     _code(), re.M) is not None


def _architecture_problems(text: str) -> list[str]:
    bad = []
    for span in sorted(set(re.findall(r"`([^`\n]+)`", text))):
        s = span.strip()
        if not s or s.startswith(("specedge ", "--", "export ", "/", "hf:", "[", "lint-imports")) or s == "specedge":
            continue
        if " " not in s and (ROOT / s).exists():  # a file at the root (pyproject.toml)
            continue
        path = re.fullmatch(r"([\w.]+/[\w./]*)(?::([\w.]+))?", s)
        if path:  # a file or folder, optionally :Name.attr inside it
            p = ROOT / path[1]
            if not p.exists():
                bad.append(f"`{s}`: no {path[1]}")
            elif path[2] and not all(re.search(rf"\b{part}\b", p.read_text()) for part in path[2].split(".")):
                bad.append(f"`{s}`: {path[2]} not in {path[1]}")
            continue
        for call in re.findall(r"([A-Za-z_][\w.]*)\(", s):  # name(...): each part a definition
            for part in call.split("."):
                if part not in ("self",) and not _defined(part):
                    bad.append(f"`{s}`: {part} is not defined in the code")
        bare = re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*(\(\))?", s)
        if bare and "(" not in s:
            last = s.split(".")[-1]
            found = _defined(last) if last[0].isupper() else re.search(rf"\b{last}\b", _code()) is not None
            if not found:
                bad.append(f"`{s}`: {last} is not in the code")
    return bad


@pytest.mark.slow
def test_every_backticked_name_in_the_architecture_doc_exists():
    """The architecture doc quotes code by name; a rename or a removal that leaves the doc behind fails here."""
    assert _architecture_problems((ROOT / "docs" / "ARCHITECTURE.md").read_text()) == []
    made_up = _architecture_problems("`BlockSpec.require(builder)`, `runtime/kv.py:KVCache.trim`, `OldEngine`, "
                                     "`apps/engine.py`")
    assert len(made_up) == 4, made_up  # the check can fail: names and files that are not there are caught
