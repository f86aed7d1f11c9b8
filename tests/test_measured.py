"""The one cached-measurement helper (assembly/measured.py) that the plan, the device profiles, the engine gate and
serve's thread probe share: its key, atomic write, version check on read, and the busy machine's measurement used
for the run but not cached, said in one line."""
import hashlib
import json

import pytest

from specedge.assembly import measured
from specedge.assembly.contention import CpuWatch, Load
from specedge.assembly.measured import Store, described, recorded

STORE = Store("things", "thing", 3, covers="model and machine")
QUIET = Load(0.01, 0.4, 12.0, 2)
BUSY = Load(1.45, 3.9, 12.0, 2)


def thing(key="k1", **kw):
    return {"version": 3, "key": key, "tok_s": 97.5, **kw}


def test_a_saved_measurement_reads_back_for_its_key_only(tmp_path):
    path = STORE.save(thing(), STORE.path(tmp_path, "k1"))
    assert path == tmp_path / "things" / "k1.json"
    assert STORE.read(path, "k1") == (thing(), "")
    assert STORE.load(path, "k1", lambda o: o["tok_s"]) == (97.5, "")
    assert STORE.read(path, None)[0] == thing()  # any key (a scan of the folder)
    obj, why = STORE.read(path, "k2")
    assert obj is None and why == f"the cached thing {path} was measured for another model and machine"
    assert STORE.read(tmp_path / "none.json", "k1") == (None, "no thing for this model and machine yet")
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_another_version_is_measured_again_never_misread(tmp_path):
    path = STORE.path(tmp_path, "k1")
    path.parent.mkdir(parents=True)
    for old in ({**thing(), "version": 2}, {k: v for k, v in thing().items() if k != "version"}):
        path.write_text(json.dumps(old))
        obj, why = STORE.read(path, "k1")
        assert obj is None and f"is from another version (version {old.get('version')}, this specedge reads 3)" in why
    other = Store("things", "thing", 3, covers="x", version_field="schema_version")  # a store's own field name
    path.write_text(json.dumps(thing()))
    assert other.read(path, "k1")[0] is None
    with pytest.raises(ValueError, match="must carry version=3"):
        STORE.save({**thing(), "version": 2}, path)  # a store writes only its own version


def test_an_unreadable_or_misshapen_file_is_measured_again(tmp_path):
    path = STORE.path(tmp_path, "k1")
    path.parent.mkdir(parents=True)
    for text in ("{not json", "[1, 2]"):
        path.write_text(text)
        obj, why = STORE.read(path, "k1")
        assert obj is None and why.startswith(f"the cached thing {path} is unreadable (")
    path.write_text(json.dumps(thing()))
    value, why = STORE.load(path, "k1", lambda o: o["missing"])  # the decoder's KeyError: unreadable
    assert value is None and "unreadable ('missing')" in why


def test_the_write_is_atomic_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = STORE.save(thing(tok_s=1.0), STORE.path(tmp_path, "k1"))
    with pytest.raises(TypeError):
        STORE.save(thing(tok_s=object()), path)  # not JSON: fails before anything is replaced
    assert STORE.read(path, "k1")[0]["tok_s"] == 1.0

    def crash(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(measured.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        STORE.save(thing(tok_s=2.0), path)
    assert STORE.read(path, "k1")[0]["tok_s"] == 1.0 and list(path.parent.iterdir()) == [path]


def test_a_busy_machine_s_measurement_is_used_not_cached_in_one_line(tmp_path):
    path = STORE.path(tmp_path, "k1")
    lines = []
    assert not STORE.keep(thing(), path, BUSY, log=lines.append, again="`x --refresh` measures again")
    assert not path.exists() and len(lines) == 1
    assert lines[0].startswith("thing: other processes kept the machine busy while it measured (1.45 cores")
    assert lines[0].endswith(": used for this run only, not cached; `x --refresh` measures again")
    lines.clear()
    drift = "the rounds disagreed by 31% (a ran 60.1 then 41.5 tok/s)"
    assert not STORE.keep(thing(), path, QUIET, log=lines.append, drift=drift, subject="thing of m")
    assert not path.exists() and len(lines) == 1 and lines[0].startswith("thing of m: the rounds disagreed by 31%")
    assert "noise" in lines[0] and "busy" not in lines[0] and "not cached" in lines[0]
    lines.clear()
    assert STORE.keep(thing(), path, QUIET, log=lines.append)
    assert STORE.read(path, "k1")[0] == thing()
    assert lines == [f"thing saved to {path} (12 s, quiet (other processes 0.01 cores; load average 0.4 on 2 cores))"]


def test_the_load_is_recorded_with_the_measurement_and_read_back_in_words():
    record = recorded(BUSY, "")
    assert record == {"other_cores": 1.45, "loadavg": 3.9, "wall_s": 12.0, "cores": 2, "busy": True, "drift": ""}
    assert described(json.loads(json.dumps(record))) == BUSY.describe()
    assert described(recorded(QUIET, "the rounds disagreed by 31%")).startswith("UNSTEADY (")
    assert described({}) == ""
    with measured.watch(1) as w:
        sum(range(1000))
    assert isinstance(w, CpuWatch) and w.load is not None and w.load.wall_s >= 0


def test_keys_cover_version_and_parts_and_keep_the_existing_caches_names():
    """Plans, gates and thread probes keep the file names they had before the helper (their caches stay valid)."""
    from specedge.assembly.engine_gate import GATE_VERSION, GATES
    from specedge.assembly.plan import PLAN_VERSION, plan_key
    device = {"cpu_model": "x", "simd": ["avx2"], "engines": {"llama_cpp_python": "0.3.9"}}
    before = json.dumps([PLAN_VERSION, "fp", 2, ["int4", "int8"], device], sort_keys=True)
    assert plan_key("fp", 2, ("int8", "int4"), device) == hashlib.sha256(before.encode()).hexdigest()[:16]
    before = json.dumps([GATE_VERSION, "fp", "ik", "0.1.5", 2, (256, 16), (2, 3)])
    assert GATES.key("fp", "ik", "0.1.5", 2, (256, 16), (2, 3)) == hashlib.sha256(before.encode()).hexdigest()[:16]
    assert STORE.key("a", {"b": 1, "a": 2}) == STORE.key("a", {"a": 2, "b": 1})  # dicts by sorted keys
    assert STORE.key("a", 1) != STORE.key("a", 2) != Store("things", "thing", 4, "x").key("a", 2)


def test_a_profile_measured_on_a_busy_machine_is_used_not_cached(tmp_path, monkeypatch):
    """The device profile goes through the helper: measured while another process is busy, it is returned for this
    run, not written, and one line says so."""
    from specedge.assembly.auto import load_or_measure
    from specedge.assembly.load import load_model
    from specedge.assembly.profile_measure import MeasureSettings
    from specedge.models.tiny import write_tiny_gguf
    from specedge.runtime.backends import BackendKind

    class BusyWatch(CpuWatch):
        def stop(self):
            self.load = BUSY
            return self.load
    monkeypatch.setattr(measured, "CpuWatch", BusyWatch)
    target = load_model(str(write_tiny_gguf(tmp_path / "t.gguf", seed=0)), BackendKind.NUMPY, ctx=128, threads=1)
    lines = []
    tiny = MeasureSettings(k_max=2, ctx=16, reps=1, prompts=1, max_tokens=4, prompt_tokens=16, adaptive=False)
    profile, path = load_or_measure(target, "numpy:t", ["ngram"], threads=1, device="cpu", cache_dir=tmp_path,
                                    settings=tiny, log=lines.append)
    assert profile.drafters and profile.machine["load"]["busy"] and not path.exists()
    said = [m for m in lines if "not cached" in m]
    assert len(said) == 1 and said[0].startswith("device profile of numpy:t: other processes kept the machine busy")
