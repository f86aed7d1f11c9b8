"""`specedge serve` measures its engine threads under concurrency (apps/serve_threads.py): each candidate thread
count serves a short loopback load test with answers equal to single requests, the most requests per second wins,
the choice is cached; one measured on a busy machine is used but not cached."""
import json

import pytest

import specedge
from specedge.apps import serve_threads as st
from specedge.assembly.contention import Load
from specedge.models.tiny import write_tiny_gguf


class FakeWatch:
    """CpuWatch with a fixed reading of the other processes' load."""

    def __init__(self, other_cores):
        self.load = Load(other_cores, 1.0, 1.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("st") / "t.gguf", seed=0, context=1024)
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=1024, threads=2).decoder


def test_threads_are_measured_under_concurrency_and_cached(decoder, tmp_path, monkeypatch):
    monkeypatch.setattr(st, "CpuWatch", lambda threads: FakeWatch(0.0))
    lines = []
    choice = st.serve_threads(decoder, cache_dir=tmp_path, log=lines.append)
    assert not choice.cached and set(choice.requests_per_s) == {"1", "2"}
    assert choice.threads == max((1, 2), key=lambda t: choice.requests_per_s[str(t)])
    assert lines[0].startswith("serve: measuring engine threads 1 and 2 under 6 concurrent clients")
    saved = json.loads(next((tmp_path / "serve_threads").glob("*.json")).read_text())
    assert saved["threads"] == choice.threads and saved["requests_per_s"] == choice.requests_per_s
    again = st.serve_threads(decoder, cache_dir=tmp_path, log=lines.append)
    assert again.cached and again.threads == choice.threads and "cached" in again.summary()


def test_a_busy_measurement_is_used_but_not_cached(decoder, tmp_path, monkeypatch):
    monkeypatch.setattr(st, "CpuWatch", lambda threads: FakeWatch(1.5))
    lines = []
    choice = st.serve_threads(decoder, cache_dir=tmp_path, log=lines.append)
    assert choice.threads in (1, 2) and "BUSY" in choice.summary()
    assert any("busy machine" in ln and "not cached" in ln for ln in lines)
    assert not list(tmp_path.glob("serve_threads/*.json"))


def test_a_model_loaded_on_a_request_takes_the_cached_choice_or_the_plans_threads(decoder, tmp_path, monkeypatch):
    """With several models, one loaded on a request must not wait for a measurement: its cached choice (here,
    measured before), else the plan's threads, each said in one line."""
    from specedge.apps.serve_cmd import later_model_threads
    lines = []
    assert st.cached_threads(decoder, tmp_path) is None
    assert later_model_threads(decoder, "t", tmp_path, lines.append) is decoder  # nothing cached: the plan's
    assert "the plan's; not measured under concurrency" in lines[-1] and "2 engine threads" in lines[-1]
    monkeypatch.setattr(st, "CpuWatch", lambda threads: FakeWatch(0.0))
    measured = st.serve_threads(decoder, cache_dir=tmp_path)
    got = later_model_threads(decoder, "t", tmp_path, lines.append)
    assert "cached" in lines[-1] and lines[-1].startswith(f"t: {measured.threads} engine thread")
    assert got.model_settings.threads == measured.threads
    assert (got is decoder) == (measured.threads == 2)
