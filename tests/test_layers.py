"""The package's layers import one way (import-linter contracts in pyproject.toml) and the decode loop reaches
drafters and backends through declared capabilities, not attribute probes."""
import ast
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


def test_decode_loop_has_no_attribute_probes():
    assert _probes(ROOT / "runtime" / "decode.py") == []
