"""Pulls leave nothing behind (issue 44): a pull killed with SIGKILL at any moment -- its folder just made, its pip
child mid-download from a stalled local index, mid-assembly, right after the rename -- leaves nothing after the next
pull, nothing ever in the system temp folder; the owner of a staging folder is judged by its lock, not by the pid in
its name; `specedge models` lists leftovers and `specedge rm --leftovers` removes them, a running pull's kept."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from specedge.apps.cli import cli
from specedge.models import catalog, staging
from specedge.models.catalog import CatalogEntry, pull
from specedge.models.tiny import write_tiny_gguf
from test_models_catalog import build_wheel

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or staging.fcntl is None,
                                reason="Linux: flock, /proc, PR_SET_PDEATHSIG")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A local 'package index' folder holding one wheel, and the catalogue entry fields of its model."""
    d = tmp_path_factory.mktemp("index")
    payload = write_tiny_gguf(d / "src.gguf").read_bytes()
    wheel = build_wheel(d, "tiny-model", "1.0", {"tiny_model/__init__.py": b"", "tiny_model/tiny.gguf": payload})
    fields = dict(name="tiny", packages=("tiny-model==1.0",), filename="tiny.gguf",
                  sha256=hashlib.sha256(payload).hexdigest(), size=len(payload), description="test model",
                  member="tiny_model/tiny.gguf")
    return d, wheel, fields


class StalledIndex:
    """A PEP 503 index on 127.0.0.1 serving one wheel: it sends the first half, then waits for `release`."""

    def __init__(self, wheel: Path) -> None:
        self.data, self.name = wheel.read_bytes(), wheel.name
        self.half_sent, self.release = threading.Event(), threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/tiny-model"):
                    body = f'<a href="/files/{outer.name}">{outer.name}</a>'.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if not self.path.endswith(outer.name):
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(outer.data)))
                self.end_headers()
                half = len(outer.data) // 2
                self.wfile.write(outer.data[:half])
                self.wfile.flush()
                outer.half_sent.set()
                outer.release.wait(120)
                try:
                    self.wfile.write(outer.data[half:])
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stalled(index):
    srv = StalledIndex(index[1])
    yield srv
    srv.close()


_PULL = ("import json, os, signal, sys\nimport specedge.models.catalog as c\n"
         "def die(*a, **k):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
         "{patch}\n"
         "c.pull(c.CatalogEntry(**json.loads(sys.argv[1])), sys.argv[2], pip_args=tuple(json.loads(sys.argv[3])), "
         "progress=False)\n")
_KILL = {  # kill point -> the patch run in the pull's process before it pulls
    "staged": "c._pip_download = die",  # its folder made and locked, nothing downloaded
    "pip": "",  # killed from outside while its pip child is stalled mid-download (StalledIndex)
    "assembly": ("real = c._stream\ndef cut(sources):\n    for block in real(sources):\n"
                 "        yield block[:len(block) // 2]\n        die()\nc._CHUNK = 4096; c._stream = cut"),
    "renamed": "c._sidecar = die",  # the verified file renamed into place, its sidecar and folder not yet written/gone
}


def _start_pull(point: str, fields: dict, cache: Path, pip_args: list[str], systmp: Path) -> subprocess.Popen:
    code = _PULL.replace("{patch}", _KILL[point])
    env = {**os.environ, "TMPDIR": str(systmp)}  # the "system temp folder" of this pull: must stay empty
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(fields), str(cache), json.dumps(pip_args)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and text in (p / "cmdline").read_bytes().decode(errors="replace") \
                    and (p / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                pids.append(int(p.name))
        except OSError:
            pass
    return pids


def _wait_gone(text: str) -> None:
    """Wait (bounded) until no live process names `text` on its command line (the killed pull's pip child)."""
    for _ in range(200):
        if not _processes_mentioning(text):
            return
        time.sleep(0.05)
    pytest.fail(f"a process mentioning {text} outlived the killed pull")


def _stalled_stage(cache: Path, proc: subprocess.Popen) -> Path:
    """The stalled pull's staging folder once pip's download file is in it. The index has sent half the wheel when
    `half_sent` is set, but pip opens its download file only after it has read the response headers, which under
    load can be a while later: wait (bounded) for the file, so what the test sees next is the stalled state."""
    for _ in range(1200):
        stages = list(cache.glob(".pull-*"))
        if stages and any(p.is_file() for p in (stages[0] / "tmp").rglob("*")):
            return stages[0]
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    pytest.fail(f"pip's download file never appeared in the staging folder: {_tree(cache)}")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("point", list(_KILL))
def test_a_pull_killed_at_any_moment_leaves_nothing_after_the_next(index, stalled, tmp_path, point):
    folder, _, fields = index
    cache, systmp = tmp_path / "cache", tmp_path / "systmp"
    systmp.mkdir()
    offline = ["--no-index", "--find-links", str(folder)]
    proc = _start_pull(point, fields, cache, ["--index-url", stalled.url] if point == "pip" else offline, systmp)
    if point == "pip":
        assert stalled.half_sent.wait(120), proc.stderr.read() if proc.poll() is not None else "no request"
        _stalled_stage(cache, proc)  # pip's download is in the stage
        assert _tree(systmp) == []
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err
    _wait_gone(str(cache))
    stalled.release.set()
    (stage,) = cache.glob(".pull-*")  # what the killed pull left: its one staging folder
    assert json.loads((stage / "owner.json").read_text())["model"] == "tiny"
    said: list[str] = []
    path = pull(CatalogEntry(**fields), cache, pip_args=offline, progress=False, log=said.append)
    assert path.read_bytes() == (folder / "src.gguf").read_bytes()
    assert _tree(cache) == ["tiny.gguf", "tiny.gguf.sha256"] and _tree(systmp) == []
    assert any(m.startswith("removed ") and "left by an interrupted pull of tiny" in m and str(stage) in m
               for m in said), said


def test_the_sweep_runs_even_when_the_model_is_already_here(index, tmp_path):
    folder, _, fields = index
    offline = ("--no-index", "--find-links", str(folder))
    pull(CatalogEntry(**fields), tmp_path, pip_args=offline, progress=False)
    left = tmp_path / ".pull-999999-old"  # a killed pull's folder: no lock held
    (left / "wheels").mkdir(parents=True)
    (left / "wheels" / "x.whl").write_bytes(bytes(1000))
    (tmp_path / "tiny.gguf.partial-999999").write_bytes(bytes(10))  # older versions' partial file
    pull(CatalogEntry(**fields), tmp_path, pip_args=offline, progress=False)
    assert _tree(tmp_path) == ["tiny.gguf", "tiny.gguf.sha256"]


def _hold_lock(path: Path) -> subprocess.Popen:
    """A live process holding an flock on `path` until its stdin closes."""
    code = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_the_owner_is_judged_by_its_lock_not_the_pid_in_the_name(tmp_path):
    reused = tmp_path / f".pull-{os.getpid()}-reused"  # named after a live pid (this one), but nobody holds it
    reused.mkdir()
    (reused / "lock").touch()
    held = tmp_path / ".pull-999999-held"  # named after a pid that is gone, but a live process holds its lock
    held.mkdir()
    (held / "wheels.whl").write_bytes(bytes(100))
    holder = _hold_lock(held / "lock")
    try:
        gone = staging.sweep(tmp_path, {"tiny.gguf": "tiny"})
        assert [g.path for g in gone] == [reused] and not reused.exists()
        assert (held / "wheels.whl").is_file()
    finally:
        holder.communicate("")
    assert [g.path for g in staging.sweep(tmp_path, {"tiny.gguf": "tiny"})] == [held] and _tree(tmp_path) == []


def test_an_old_style_partial_of_a_reused_pid_is_removed(tmp_path):
    """`<file>.partial-<pid>` from older versions: a live pid that started after the file was last written (reused)
    is not its owner; one whose process is older than the file may still be writing it."""
    old = tmp_path / f"tiny.gguf.partial-{os.getpid()}"
    old.write_bytes(bytes(10))
    assert staging.sweep(tmp_path, {"tiny.gguf": "tiny"}) == [] and old.exists()  # written after this process started
    os.utime(old, (1_000_000_000, 1_000_000_000))  # 2001: before this process started
    assert [g.path for g in staging.sweep(tmp_path, {"tiny.gguf": "tiny"})] == [old] and not old.exists()


def test_a_running_pull_keeps_its_folder(index, stalled, tmp_path):
    """A pull stalled mid-download is live: another pull of the same model, `specedge models` and
    `specedge rm --leftovers` leave its folder alone; released, it finishes and leaves nothing."""
    folder, _, fields = index
    cache, systmp = tmp_path / "cache", tmp_path / "systmp"
    systmp.mkdir()
    proc = _start_pull("pip", fields, cache, ["--index-url", stalled.url], systmp)
    try:
        assert stalled.half_sent.wait(120), "no request reached the index"
        stage = _stalled_stage(cache, proc)
        assert [stage] == list(cache.glob(".pull-*"))
        before = _tree(stage)
        pull(CatalogEntry(**fields), cache, pip_args=("--no-index", "--find-links", str(folder)), progress=False)
        assert stage.is_dir() and _tree(stage) == before
        out = _cli("models", "--cache-dir", cache)
        line = next(ln for ln in out.splitlines() if str(stage) in ln)
        assert "running (kept)" in line and "leftovers of interrupted pulls" not in out
        assert "no leftovers of interrupted pulls" in _cli("rm", "--leftovers", "--cache-dir", cache)
        assert stage.is_dir()
    finally:
        stalled.release.set()
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert _tree(cache) == ["tiny.gguf", "tiny.gguf.sha256"] and _tree(systmp) == []


def _cli(*args) -> str:
    r = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_models_shows_leftovers_and_rm_removes_them(tmp_path, monkeypatch):
    dead = tmp_path / ".pull-999999-dead"
    (dead / "tmp").mkdir(parents=True)
    (dead / "owner.json").write_text(json.dumps({"model": "smollm2-135m", "file": "x.gguf", "pid": 999999}))
    (dead / "tmp" / "pip-unpack-1.whl").write_bytes(bytes(2_500_000))
    legacy = tmp_path / f"{catalog.CATALOG['gemma3-270m'].filename}.partial-999999"
    legacy.write_bytes(bytes(500_000))
    live = tmp_path / ".pull-999998-live"
    live.mkdir()
    holder = _hold_lock(live / "lock")
    try:
        out = _cli("models", "--cache-dir", tmp_path)
        assert "leftovers of interrupted pulls: 3.0 MB (`specedge rm --leftovers` removes them" in out
        section = out.split("leftovers of interrupted pulls")[1]
        rows = {ln.split()[0]: ln for ln in section.splitlines()[1:] if ln.startswith("  ")}
        assert "2.5 MB" in rows["smollm2-135m"] and "interrupted" in rows["smollm2-135m"]
        assert "0.5 MB" in rows["gemma3-270m"] and str(legacy) in rows["gemma3-270m"]
        assert "pulls running now" in section and "running (kept)" in rows["?"] and str(live) in rows["?"]
        doc = json.loads(_cli("models", "--cache-dir", tmp_path, "--json"))["leftovers"]
        assert {(Path(r["path"]).name, r["live"]) for r in doc} == {(dead.name, False), (legacy.name, False),
                                                                    (live.name, True)}
        dry = _cli("rm", "--leftovers", "--dry-run", "--cache-dir", tmp_path)
        assert f"would delete {dead}" in dry and f"would delete {legacy}" in dry and str(live) not in dry
        assert dead.exists() and legacy.exists()
        gone = _cli("rm", "--leftovers", "--cache-dir", tmp_path)
        assert f"deleted {dead}" in gone and f"deleted {legacy}" in gone and str(live) not in gone
        assert not dead.exists() and not legacy.exists() and live.is_dir()
    finally:
        holder.communicate("")
    r = CliRunner().invoke(cli, ["rm", "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2 and "or give --leftovers" in r.output
