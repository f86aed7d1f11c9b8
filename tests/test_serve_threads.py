"""`specedge serve` runs each call with the plan's engine threads (the fastest for one request) and shares them
only while calls actually compute at once (runtime/cores.py CoreShare, apps/serve_threads.py): no load test at
start. The share follows the number of calls computing, step by step; an engine whose logits change with the
thread count keeps its count; the start line says which."""
import numpy as np
import pytest
from click.testing import CliRunner

import specedge
from specedge.apps.cli import cli
from specedge.apps.serve_threads import threads_line
from specedge.assembly.plan_run import resolved_threads
from specedge.models.tiny import write_tiny_gguf
from specedge.runtime.cores import CoreShare, same_logits_across_threads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("st") / "t.gguf", seed=0, context=1024)


def threaded(decoder, planned: int, drift: float = 0.0):
    """Give the NumPy backend a thread setting (a ThreadedBackend) that records each change; drift > 0 makes its
    logits depend on the thread count, as mainline llama.cpp's attention does beyond ~100 cached positions."""
    backend = decoder.model.backend
    backend.threads, backend.changes = planned, []
    forward = type(backend).forward

    def set_threads(n):
        backend.threads = n
        backend.changes.append(n)

    def forward_at(tokens, cache, **kw):
        return forward(backend, tokens, cache, **kw) + np.float32(drift * backend.threads)
    backend.set_threads = set_threads
    if drift:
        backend.forward = forward_at
    return decoder


def open_threaded(tiny, planned, drift=0.0):
    engine = specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=1024)
    return threaded(engine.decoder, planned, drift)


def test_each_call_takes_its_share_of_the_threads_while_others_compute():
    share = CoreShare()
    assert share.threads(2) == 2  # nothing computing yet: a call starting now has the cores
    with share.computing():
        assert share.threads(2) == 2 and share.threads(1) == 1
        with share.computing():
            assert share.running == 2 and share.threads(2) == 1 and share.threads(4) == 2 and share.threads(8) == 4
            with share.computing():
                assert share.threads(2) == 1  # never below one thread
        assert share.threads(2) == 2
    assert share.running == 0


def test_a_call_steps_with_fewer_threads_while_another_computes_and_gets_them_back(tiny):
    share = CoreShare()
    engine = specedge.Engine(open_threaded(tiny, 2), "t", cores=share)
    backend = engine.decoder.model.backend
    assert engine.threads == 2 and engine.shares_threads  # the NumPy logits do not depend on the setting
    stream = iter(engine.stream("hello there", max_tokens=12, temperature=0))
    got = [next(stream)]
    assert backend.threads == 2  # alone
    with share.computing():  # another engine's call starts
        got.append(next(stream))
        assert backend.threads == 1
        got.append(next(stream))
        assert backend.threads == 1
    got.append(next(stream))
    assert backend.threads == 2  # alone again
    tokens = [r.token for r in got + list(stream) if r.token is not None]
    alone = specedge.Engine(open_threaded(tiny, 2), "t").generate("hello there", max_tokens=12, temperature=0)
    assert len(tokens) >= 5 and tokens[:len(alone.tokens)] == alone.tokens  # the same answer


def test_an_engine_whose_logits_change_with_the_thread_count_keeps_its_threads(tiny):
    share = CoreShare()
    decoder = open_threaded(tiny, 2, drift=1e-3)
    assert not same_logits_across_threads(decoder.model.backend, 2)
    engine = specedge.Engine(decoder, "t", cores=share)
    assert not engine.shares_threads and engine.decoder.model.backend.threads == 2
    engine.decoder.model.backend.changes.clear()  # the probe's own changes
    with share.computing():
        engine.generate("hello there", max_tokens=4, temperature=0)
    assert engine.decoder.model.backend.changes == []  # never changed during a call
    line = threads_line(engine, "t", given=False)
    assert line.startswith("serve: t: 2 engine threads (the engine's default") and "kept when calls compute" in line


def test_the_start_line_says_the_choice(tiny):
    engine = specedge.Engine(open_threaded(tiny, 2), "t", cores=CoreShare())
    assert threads_line(engine, "t", given=True) == ("serve: t: 2 engine threads (--threads); calls computing at once "
                                                     "share them, each step max(1, 2 // calls)")
    engine.plan = object()  # opened by a plan
    assert "(the plan's: fastest for one request)" in threads_line(engine, "t", given=False)
    plain = specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=1024)  # no thread setting
    assert plain.threads is None and "sets its own threads" in threads_line(plain, "t", given=False)


@pytest.mark.llamacpp
def test_serve_defaults_to_the_single_request_thread_count_and_measures_nothing(tiny, tmp_path, monkeypatch):
    """No --threads: llama.cpp at the count a plan uses (resolved_threads(None)), said at start, no load test; the
    thread probe runs once per engine and machine, then comes from the cache."""
    import uvicorn
    from specedge.apps import api
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(kw))
    args = ["serve", str(tiny), "--backend", "llamacpp", "--drafter", "none", "--ctx", "512", "--port", "0",
            "--cache-dir", str(tmp_path)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    n = resolved_threads(None)
    line = next(ln for ln in r.output.splitlines() if ln.startswith("serve: t.gguf: "))
    assert line.startswith(f"serve: t.gguf: {n} engine thread") and "measur" not in r.output
    assert served["port"] == 0
    if n > 1:
        assert len(list((tmp_path / "thread_probes").glob("*.json"))) == 1
        monkeypatch.setattr(api, "same_logits_across_threads", lambda *a: pytest.fail("probed again"))
        again = CliRunner().invoke(cli, args)
        assert again.exit_code == 0 and line in again.output, again.output
