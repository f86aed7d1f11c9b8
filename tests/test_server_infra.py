"""`specedge serve` infrastructure on tiny models: Prometheus /metrics, CORS, /tokenize and /detokenize, several
models in one server (routing by `model`, LRU eviction under --max-memory, 503 when nothing fits), the ModelPool
itself with a fake loader (busy engines are never evicted), and the command's option parsing."""
import threading
import time

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import specedge
from specedge.apps.cli import cli
from specedge.apps.model_pool import ModelNotFound, ModelPool, PoolEntry, PoolFull, parse_bytes
from specedge.apps.model_pool import engine_bytes
from specedge.apps.server import ServerConfig, create_app
from specedge.models.tiny import write_tiny_gguf

PROMPT = "the cat sat on the mat and the cat sat on the"
LOCAL = "http://127.0.0.1"  # TestClient's own "testserver" is not a Host the server answers without a key


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {name: write_tiny_gguf(d / f"{name}.gguf", seed=seed, n_layers=2, context=512)
            for name, seed in (("a", 0), ("b", 1))}


def make_engine(path):
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=512)


@pytest.fixture(scope="module")
def engines(paths):
    return {name: make_engine(p) for name, p in paths.items()}


def pool_of(paths, max_bytes=None, loads=None):
    def loader(name):
        def load():
            if loads is not None:
                loads.append(name)
            return make_engine(paths[name])
        return load
    return ModelPool([PoolEntry(f"{n}.gguf", loader(n), paths[n].stat().st_size) for n in ("a", "b")],
                     max_bytes=max_bytes, weigh=engine_bytes)


def samples(text):
    """{(name, labels as a sorted tuple): value} of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(metrics, name, **labels):
    return sum(v for (n, ls), v in metrics.items() if n == name and labels.items() <= dict(ls).items())


def complete(client, model, max_tokens=24, **extra):
    r = client.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": max_tokens,
                                             "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


# ---- /metrics -------------------------------------------------------------------------------------------------

def test_prometheus_metrics_count_a_request(engines):
    with TestClient(create_app(engines["a"], ServerConfig("tiny")), base_url=LOCAL) as c:
        before = samples(c.get("/metrics").text)
        assert total(before, "specedge_generated_tokens_total") == 0
        body = complete(c, "whatever", max_tokens=40)
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 8, "temperature": 0}).json()
        assert c.post("/v1/completions", json={"prompt": PROMPT, "n": 0}).status_code == 400
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = samples(r.text)
    ext = [body["specedge"], chat["specedge"]]
    assert body["model"] == "tiny"
    assert total(m, "specedge_generated_tokens_total", model="tiny") == (
        body["usage"]["completion_tokens"] + chat["usage"]["completion_tokens"])
    assert total(m, "specedge_prompt_tokens_total", model="tiny") == (
        body["usage"]["prompt_tokens"] + chat["usage"]["prompt_tokens"])
    drafted, accepted = sum(e["n_drafted"] for e in ext), sum(e["n_accepted"] for e in ext)
    assert drafted > 0  # the repetitive prompt gives the n-gram drafter something to propose
    assert total(m, "specedge_drafted_tokens_total", model="tiny") == drafted
    assert total(m, "specedge_accepted_tokens_total", model="tiny") == accepted
    assert total(m, "specedge_draft_position_proposed_total", model="tiny") == drafted
    assert total(m, "specedge_draft_position_accepted_total", model="tiny") == accepted
    assert total(m, "specedge_draft_position_proposed_total", model="tiny", position="0") > 0
    # the same counts under vLLM's / llama-server's names
    assert total(m, "specedge:spec_decode_num_draft_tokens_total", model="tiny") == drafted
    assert total(m, "specedge:spec_decode_num_accepted_tokens_total", model="tiny") == accepted
    assert total(m, "specedge:spec_decode_num_accepted_tokens_per_pos_total", model="tiny") == accepted
    assert total(m, "specedge:spec_decode_num_drafts_total", model="tiny") == \
        total(m, "specedge_draft_position_proposed_total", model="tiny", position="0")
    assert m[("specedge_requests_total", (("model", "tiny"), ("outcome", "completed"),
                                          ("route", "/v1/completions")))] == 1
    assert m[("specedge_requests_total", (("model", "tiny"), ("outcome", "completed"),
                                          ("route", "/v1/chat/completions")))] == 1
    assert total(m, "specedge_requests_total", outcome="client_error", route="/v1/completions") == 1
    assert total(m, "specedge_tau_count", model="tiny") == 2
    assert total(m, "specedge_tau_sum", model="tiny") == pytest.approx(sum(e["tau"] for e in ext))
    for name in ("specedge_request_duration_seconds_count", "specedge_time_to_first_token_seconds_count",
                 "specedge_decode_tokens_per_second_count"):
        assert total(m, name, model="tiny") == 2, name
    assert m[("specedge_requests_running", (("model", "tiny"),))] == 0
    assert m[("specedge_requests_waiting", (("model", "tiny"),))] == 0
    assert m[("specedge_model_loaded", (("model", "tiny"),))] == 1


def test_metrics_need_the_key_and_health_does_not(engines):
    with TestClient(create_app(engines["a"], ServerConfig("tiny", api_key="k")), base_url=LOCAL) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer k"}).status_code == 200
        h = c.get("/health")
        assert h.status_code == 200 and h.json() == {"status": "ok", "models": {"tiny": {"loaded": True}}}


def test_each_server_has_its_own_registry(engines):
    with TestClient(create_app(engines["a"], ServerConfig("one")), base_url=LOCAL) as c1, \
            TestClient(create_app(engines["a"], ServerConfig("two")), base_url=LOCAL) as c2:
        complete(c1, "one", max_tokens=4)
        assert total(samples(c1.get("/metrics").text), "specedge_requests_total") == 1
        assert total(samples(c2.get("/metrics").text), "specedge_requests_total") == 0


# ---- CORS -----------------------------------------------------------------------------------------------------

PREFLIGHT = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def test_cors_headers_only_with_an_origin(engines):
    config = ServerConfig("tiny", api_key="k", cors_origins=("http://app.example",))
    with TestClient(create_app(engines["a"], config), base_url=LOCAL) as c:
        pre = c.options("/v1/chat/completions", headers=PREFLIGHT)
        assert pre.status_code == 200
        assert pre.headers["access-control-allow-origin"] == "http://app.example"
        allowed = pre.headers["access-control-allow-headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
        r = c.get("/v1/models", headers={"Origin": "http://app.example", "Authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        denied = c.get("/v1/models", headers={"Origin": "http://app.example"})  # 401s carry it too
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "http://app.example"
        other = c.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "http://evil.example"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    with TestClient(create_app(engines["a"], ServerConfig("tiny", cors_origins=("*",))), base_url=LOCAL) as c:
        r = c.get("/v1/models", headers={"Origin": "http://anything.example"})
        assert r.headers["access-control-allow-origin"] == "*"
    with TestClient(create_app(engines["a"], ServerConfig("tiny")), base_url=LOCAL) as c:
        pre = c.options("/v1/chat/completions", headers=PREFLIGHT)  # no --cors-origin: every Origin refused
        assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers
        r = c.get("/v1/models", headers={"Origin": "http://app.example"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert "--cors-origin http://app.example" in r.json()["error"]["message"]
        assert c.get("/v1/models").status_code == 200  # no Origin: not a browser page


# ---- /tokenize, /detokenize -----------------------------------------------------------------------------------

def test_tokenize_and_detokenize_round_trip(engines):
    engine = engines["a"]
    text = "Hello world, the cat sat."
    with TestClient(create_app(engine, ServerConfig("tiny")), base_url=LOCAL) as c:
        with_bos = c.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
        plain = c.post("/tokenize", json={"content": text}).json()["tokens"]
        assert with_bos == engine.encode(text)
        assert plain == [int(t) for t in engine.tokenizer.encode(text, add_bos=False)]
        back = c.post("/detokenize", json={"tokens": plain, "model": "tiny"}).json()
        assert back == {"content": engine.tokenizer.decode(plain)} and back["content"] == text
        bad = c.post("/tokenize", json={"content": text, "with_pieces": True})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "with_pieces"
        assert "with_pieces" in bad.json()["error"]["message"]
        assert c.post("/tokenize", json={"content": 3}).json()["error"]["param"] == "content"
        assert c.post("/detokenize", json={"tokens": [1], "extra": 1}).json()["error"]["param"] == "extra"
        oob = c.post("/detokenize", json={"tokens": [1, engine.tokenizer.vocab_size]})
        assert oob.status_code == 400 and "out of range" in oob.json()["error"]["message"]
        assert c.post("/detokenize", json={"tokens": [-1]}).status_code == 400
        assert c.post("/detokenize", json={"tokens": ["a"]}).status_code == 400
        assert c.get("/v1/tokenize").status_code == 404  # llama-server's place: the root only


# ---- several models -------------------------------------------------------------------------------------------

def test_two_models_answer_by_name_like_their_own_engines(paths, engines):
    want = {n: engines[n].generate(PROMPT, max_tokens=24, temperature=0).text for n in ("a", "b")}
    assert want["a"] != want["b"]
    with TestClient(create_app(pool_of(paths), ServerConfig()), base_url=LOCAL) as c:
        cards = c.get("/v1/models").json()["data"]
        assert [(m["id"], m["specedge"]["loaded"]) for m in cards] == [("a.gguf", False), ("b.gguf", False)]
        for n in ("b", "a"):
            body = complete(c, f"{n}.gguf")
            assert body["choices"][0]["text"] == want[n] and body["model"] == f"{n}.gguf"
        card = c.get("/v1/models/b.gguf").json()
        assert card["specedge"]["loaded"] and card["specedge"]["bytes"] == engine_bytes(engines["b"])
        missing = c.post("/v1/completions", json={"model": "gpt-4", "prompt": "hi", "max_tokens": 2})
        err = missing.json()["error"]
        assert missing.status_code == 404 and err["code"] == "model_not_found"
        assert "a.gguf" in err["message"] and "b.gguf" in err["message"]
        assert c.post("/v1/completions", json={"prompt": "hi"}).json()["error"]["param"] == "model"
        assert c.get("/v1/models/gpt-4").status_code == 404
        tokens = c.post("/tokenize", json={"content": "hi", "model": "b.gguf"}).json()["tokens"]
        assert tokens == [int(t) for t in engines["b"].tokenizer.encode("hi", add_bos=False)]
        m = samples(c.get("/metrics").text)
        assert total(m, "specedge_requests_total", model="a.gguf", outcome="completed") == 1
        assert total(m, "specedge_requests_total", model="b.gguf", outcome="completed") == 2  # + /tokenize


def test_lru_eviction_under_max_memory(paths, engines):
    size = engine_bytes(engines["a"])
    assert engine_bytes(engines["b"]) == size
    loads = []
    pool = pool_of(paths, max_bytes=int(size * 1.5), loads=loads)
    want = {n: engines[n].generate(PROMPT, max_tokens=12, temperature=0).text for n in ("a", "b")}

    def loaded(c):
        return {k: v["loaded"] for k, v in c.get("/health").json()["models"].items()}
    with TestClient(create_app(pool, ServerConfig()), base_url=LOCAL) as c:
        assert complete(c, "a.gguf", 12)["choices"][0]["text"] == want["a"]
        assert loaded(c) == {"a.gguf": True, "b.gguf": False}
        assert complete(c, "b.gguf", 12)["choices"][0]["text"] == want["b"]
        assert loaded(c) == {"a.gguf": False, "b.gguf": True}
        assert complete(c, "a.gguf", 12)["choices"][0]["text"] == want["a"]
        assert loaded(c) == {"a.gguf": True, "b.gguf": False}
        assert loads == ["a", "b", "a"]
        assert complete(c, "a.gguf", 4)  # loaded: no reload
        assert loads == ["a", "b", "a"]


def test_a_model_larger_than_max_memory_gets_503(paths):
    with TestClient(create_app(pool_of(paths, max_bytes=1000), ServerConfig()), base_url=LOCAL) as c:
        r = c.post("/v1/completions", json={"model": "a.gguf", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 503 and "--max-memory" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "model_pool_full"


# ---- the pool on its own ---------------------------------------------------------------------------------------

class Fake:
    def __init__(self, name):
        self.name = name


def fake_pool(sizes, max_bytes, loads):
    def loader(name):
        return lambda: loads.append(name) or Fake(name)
    return ModelPool([PoolEntry(n, loader(n), s) for n, s in sizes.items()], max_bytes=max_bytes)


def test_pool_evicts_least_recently_used_idle_engines():
    loads = []
    pool = fake_pool({"a": 10, "b": 10, "c": 10}, 20, loads)
    pool.lease("a").release()
    pool.lease("b").release()
    pool.lease("a").release()  # a is now the most recently used
    with pool.lease("c") as lease:
        assert lease.engine.name == "c"
    assert [s.id for s in pool.state() if s.loaded] == ["a", "c"] and loads == ["a", "b", "c"]
    assert [s.in_use for s in pool.state()] == [0, 0, 0]


def test_pool_never_evicts_a_busy_engine():
    loads = []
    pool = fake_pool({"a": 10, "b": 10}, 15, loads)
    busy = pool.lease("a")
    with pytest.raises(PoolFull, match="in use") as e:
        pool.lease("b")
    assert e.value.busy and pool.engine_if_loaded("a") is busy.engine
    again = pool.lease("a")  # a loaded engine is shared: a second call on it does not reload
    busy.release()
    busy.release()  # idempotent
    with pytest.raises(PoolFull):
        pool.lease("b")  # `again` still holds a
    again.release()
    with pool.lease("b"):
        assert pool.engine_if_loaded("a") is None
    assert loads == ["a", "b"]
    with pytest.raises(PoolFull, match="raise --max-memory") as e:
        fake_pool({"big": 100}, 50, []).lease("big")
    assert not e.value.busy


def test_pool_loads_a_model_once_for_concurrent_leases():
    loads, gate = [], threading.Event()

    def slow():
        gate.wait(5)
        loads.append("a")
        return Fake("a")
    pool = ModelPool([PoolEntry("a", slow, 1), PoolEntry("b", lambda: Fake("b"), 1)])
    got = []
    threads = [threading.Thread(target=lambda: got.append(pool.lease("a"))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    with pool.lease("b"):  # another model loads meanwhile
        pass
    gate.set()
    for t in threads:
        t.join(5)
    assert loads == ["a"] and len({id(x.engine) for x in got}) == 1
    assert pool.state()[0].in_use == 3


def test_pool_a_failed_load_leaves_no_trace():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError("no such model")
        return Fake("a")
    pool = ModelPool([PoolEntry("a", flaky, 10)], max_bytes=10)
    with pytest.raises(FileNotFoundError):
        pool.lease("a")
    assert pool.lease("a").engine.name == "a"


def test_pool_resolves_names_and_refuses_duplicates():
    single = ModelPool([PoolEntry("only", lambda: Fake("only"))])
    assert single.resolve("gpt-4") == single.resolve(None) == "only"
    two = ModelPool([PoolEntry("x", lambda: Fake("x")), PoolEntry("y", lambda: Fake("y"))])
    assert two.resolve("y") == "y"
    with pytest.raises(ModelNotFound, match="x, y"):
        two.resolve("z")
    with pytest.raises(ValueError, match="unique"):
        ModelPool([PoolEntry("x", lambda: 1), PoolEntry("x", lambda: 2)])


@pytest.mark.parametrize("text, n", [("2GB", 2 * 10**9), ("1.5GiB", 3 * 2**29), ("512M", 512 * 2**20),
                                     ("800 mb", 800 * 10**6), ("4096", 4096), ("1g", 2**30)])
def test_parse_bytes(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "lots", "-1GB", "2XB", "0"])
def test_parse_bytes_refuses(text):
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes(text)


# ---- the command ----------------------------------------------------------------------------------------------

def test_serve_command_parses_several_models(paths, monkeypatch, tmp_path):
    import uvicorn
    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.update(app=app, **kw))
    args = ["serve", str(paths["a"]), str(paths["b"]), "--backend", "numpy", "--drafter", "ngram", "--ctx", "256",
            "--max-memory", "2GB", "--cors-origin", "http://a.example", "--cors-origin", "*", "--port", "9"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    server = ran["app"].state.server
    assert server.models.ids == ["a.gguf", "b.gguf"] and server.models.max_bytes == 2 * 10**9
    assert [s.loaded for s in server.models.state()] == [True, False]  # the first at start, the rest on use
    assert server.config.cors_origins == ("http://a.example", "*") and ran["port"] == 9
    assert "model a.gguf: numpy, drafter ngram, ctx 256" in r.output and "max memory" in r.output

    d = tmp_path / "dir"
    d.mkdir()
    (d / "m.gguf").write_bytes(paths["b"].read_bytes())
    (d / "notes.txt").write_text("not a model")
    r = CliRunner().invoke(cli, ["serve", str(paths["a"]), "--models-dir", str(d), "--backend", "numpy"])
    assert r.exit_code == 0, r.output
    assert ran["app"].state.server.models.ids == ["a.gguf", "m.gguf"]
    assert ran["app"].state.server.models.max_bytes is None

    bad = CliRunner().invoke(cli, ["serve", str(paths["a"]), "--max-memory", "lots"])
    assert bad.exit_code == 2 and "memory size" in bad.output
    two_ids = CliRunner().invoke(cli, ["serve", str(paths["a"]), str(paths["b"]), "--model-id", "x"])
    assert two_ids.exit_code == 2 and "--model-id" in two_ids.output
    none = CliRunner().invoke(cli, ["serve"])
    assert none.exit_code == 2 and "--models-dir" in none.output


def test_serve_takes_the_shared_engine_options_lossy_and_auto_included(paths, monkeypatch):
    """serve, generate and chat share their engine options (apps/options.py): --lossy serves the labelled lossy mode
    (each call's `specedge.drafter` says so), a bad --lossy or --drafter fails before anything loads."""
    import uvicorn
    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.update(app=app, **kw))
    r = CliRunner().invoke(cli, ["serve", str(paths["a"]), "--backend", "numpy", "--lossy", "loradrop", "--ctx",
                                 "256"])
    assert r.exit_code == 0, r.output
    engine = ran["app"].state.server.models.lease("a.gguf").engine
    assert "lossy loradrop" in engine.drafter_name
    with TestClient(ran["app"], base_url=LOCAL) as client:
        body = client.post("/v1/completions", json={"prompt": "the cat", "max_tokens": 4, "temperature": 0}).json()
        assert "lossy loradrop" in body["specedge"]["drafter"]
    for bad in (["--lossy", "sometimes"], ["--drafter", "nonsense"]):
        out = CliRunner().invoke(cli, ["serve", str(paths["a"]), "--backend", "numpy", *bad])
        assert out.exit_code != 0 and ("lossy mode" in out.output or "unknown drafter" in out.output), out.output
