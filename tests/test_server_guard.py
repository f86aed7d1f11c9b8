"""`specedge serve` refuses cross-site requests (apps/server_guard.py): the attacks of issue 44 (a foreign Host, a
text/plain JSON body, a foreign Origin, a DNS-rebinding Host) get 403 / 415 naming the problem and the fix, while
loopback clients, an API key, --host and --cors-origin keep working; deeply nested JSON is a 400, not a 500."""
import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

import specedge
from specedge.apps.cli import cli
from specedge.apps.serve_cmd import ServerThread, is_origin
from specedge.apps.server import ServerConfig, create_app
from specedge.apps.server_guard import MAX_JSON_DEPTH, SitePolicy, host_name, json_depth

LOCAL = "http://127.0.0.1"
BODY = b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}'
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return tiny_gguf  # tests/conftest.py, shared (read-only): 2 layers, context 256


@pytest.fixture(scope="module")
def engine(tiny):
    return specedge.Engine.open(str(tiny), backend="numpy", drafter="ngram", ctx=256)


def app(engine, **config):
    return create_app(engine, ServerConfig("tiny", **config))


def counters(client):
    return client.app.state.server.metrics.to_dict()


# ---- the policy itself ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("host, want", [("localhost", True), ("LOCALHOST:8000", True), ("localhost.:80", True),
                                        ("127.0.0.1:38471", True), ("127.9.8.7", True), ("[::1]:8000", True),
                                        ("[::1]", True), ("attacker.example:38471", False), ("localhost.evil", False),
                                        ("127.0.0.1.nip.io", False), ("10.0.0.5:8000", False), ("", False)])
def test_loopback_hosts_only_without_a_key(host, want):
    assert SitePolicy().host_allowed(host) is want
    assert SitePolicy(check_host=False).host_allowed(host)  # with an API key: any Host


def test_the_bind_host_and_a_wildcard_bind():
    named = SitePolicy("box.lan")
    assert named.host_allowed("box.lan:8000") and named.host_allowed("localhost")
    assert not named.host_allowed("other.lan:8000")
    for bind in ("0.0.0.0", "::"):  # every address of this machine: an IP is fine, a (rebindable) name is not
        wide = SitePolicy(bind)
        assert wide.host_allowed("192.168.1.5:8000") and wide.host_allowed("[fe80::1]:8000")
        assert not wide.host_allowed("attacker.example:8000")
    assert host_name("[::1]:8000") == "::1" and host_name("Box.LAN.:80") == "box.lan"


def test_origins_need_listing():
    assert SitePolicy().origin_allowed(None)
    assert not SitePolicy().origin_allowed("http://localhost:5173")  # a local page is still another origin
    listed = SitePolicy(cors_origins=("http://localhost:5173",))
    assert listed.origin_allowed("http://localhost:5173") and not listed.origin_allowed("http://localhost:5174")
    assert SitePolicy(cors_origins=("*",)).origin_allowed("http://anything.example")


# ---- the issue's attacks, through the app ---------------------------------------------------------------------

def test_a_foreign_host_is_refused_before_anything_runs(engine):
    with TestClient(app(engine), base_url="http://attacker.example:38471") as c:
        r = c.post("/v1/chat/completions", content=BODY, headers={"Content-Type": "text/plain"})
        assert r.status_code == 403
        err = r.json()["error"]
        assert err["code"] == "host_not_allowed"
        assert "'attacker.example:38471'" in err["message"] and "--api-key" in err["message"]
        for path in ("/v1/models", "/metrics", "/specedge/metrics", "/health"):  # what rebinding would read
            assert c.get(path).status_code == 403, path
        assert counters(c)["requests"] == 0 and counters(c)["client_errors"] == 5


def test_dns_rebinding_is_refused_even_as_same_origin(engine):
    # attacker.example re-resolved to 127.0.0.1: the page's requests are same-origin to the browser
    rebound = {"Host": "attacker.example:8000", "Origin": "http://attacker.example:8000", **JSON}
    with TestClient(app(engine, cors_origins=("*",)), base_url=LOCAL) as c:
        r = c.post("/v1/chat/completions", content=BODY, headers=rebound)
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
        assert "access-control-allow-origin" not in r.headers


def test_text_plain_json_gets_415(engine):
    with TestClient(app(engine), base_url=LOCAL) as c:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            r = c.post("/v1/chat/completions", content=BODY, headers={"Content-Type": ctype})
            assert r.status_code == 415, ctype
            assert "application/json" in r.json()["error"]["message"] and ctype in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", content=BODY)  # no Content-Type at all
        assert r.status_code == 415 and "none was sent" in r.json()["error"]["message"]
        assert c.post("/tokenize", content=b'{"content": "hi"}',
                      headers={"Content-Type": "text/plain"}).status_code == 415  # every POST route
        ok = c.post("/v1/chat/completions", content=BODY, headers={"Content-Type": "Application/JSON; charset=utf-8"})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] > 0
        assert counters(c)["requests"] == 1


def test_a_foreign_origin_is_refused_and_a_listed_one_served(engine):
    evil = {"Origin": "http://evil.example", **JSON}
    with TestClient(app(engine), base_url=LOCAL) as c:
        r = c.post("/v1/chat/completions", content=BODY, headers=evil)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert "--cors-origin http://evil.example" in r.json()["error"]["message"]
    with TestClient(app(engine, cors_origins=("http://app.example",)), base_url=LOCAL) as c:
        assert c.post("/v1/chat/completions", content=BODY, headers=evil).status_code == 403
        pre = c.options("/v1/chat/completions", headers={"Origin": "http://app.example",
                                                         "Access-Control-Request-Method": "POST",
                                                         "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.example"
        r = c.post("/v1/chat/completions", content=BODY, headers={"Origin": "http://app.example", **JSON})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        bad = c.post("/v1/chat/completions", content=BODY, headers={"Origin": "http://app.example",
                                                                    "Content-Type": "text/plain"})
        assert bad.status_code == 415 and bad.headers["access-control-allow-origin"] == "http://app.example"


def test_with_an_api_key_any_host_but_still_no_foreign_origin(engine):
    with TestClient(app(engine, api_key="k"), base_url="http://models.example.org") as c:
        assert c.get("/v1/models").status_code == 401  # the key, not the Host, keeps strangers out
        key = {"Authorization": "Bearer k"}
        assert c.get("/v1/models", headers=key).status_code == 200
        r = c.post("/v1/chat/completions", content=BODY, headers={**key, **JSON})
        assert r.status_code == 200
        assert c.get("/v1/models", headers={**key, "Origin": "http://evil.example"}).status_code == 403


def test_the_started_host_is_answered(engine):
    with TestClient(app(engine, bind_host="0.0.0.0"), base_url="http://192.168.1.5:8000") as c:
        assert c.post("/v1/chat/completions", content=BODY, headers=JSON).status_code == 200
        assert c.get("/v1/models", headers={"Host": "attacker.example"}).status_code == 403


def test_a_real_socket_refuses_the_issues_curl_and_serves_loopback(engine):
    """The issue's curl: Host attacker.example and a text/plain body, to a server on 127.0.0.1."""
    with ServerThread(app(engine)) as s:
        url = s.url + "/v1/chat/completions"
        r = httpx.post(url, content=BODY, headers={"Host": f"attacker.example:{s.port}",
                                                    "Content-Type": "text/plain"})
        assert r.status_code == 403
        assert httpx.post(url, content=BODY, headers={"Content-Type": "text/plain"}).status_code == 415
        assert httpx.post(url, content=BODY, headers={"Origin": "http://evil.example", **JSON}).status_code == 403
        local = httpx.post(f"http://localhost:{s.port}/v1/chat/completions", content=BODY, headers=JSON)
        assert local.status_code == 200 and local.json()["choices"][0]["message"]["content"] is not None


# ---- JSON nesting ---------------------------------------------------------------------------------------------

def test_json_depth_skips_strings_and_runs_without_recursion():
    assert json_depth(b'{"a": [1, {"b": "]]] [[[ {{"}]}') == 3
    assert json_depth(b'["\\"[[[", ["\\\\"]]') == 2  # an escaped quote does not end the string
    assert json_depth(b'"[[[') == 0  # an unterminated string: the rest is its text
    assert json_depth(b"[" * 100_000) == 100_000
    assert json_depth(b'"\\"' * 300_000) == 0  # escapes without a closing quote: one pass, not one per quote


def test_deep_nesting_is_a_400_naming_the_limit(engine):
    with TestClient(app(engine), base_url=LOCAL) as c:
        r = c.post("/v1/completions", content=b"[" * 100_000 + b"]" * 100_000, headers=JSON)
        assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"
        assert str(MAX_JSON_DEPTH) in r.json()["error"]["message"]
        deep = b'{"prompt": "hi", "max_tokens": 2, "metadata": ' + b"[" * (MAX_JSON_DEPTH - 1) + \
            b"]" * (MAX_JSON_DEPTH - 1) + b"}"
        at = c.post("/v1/completions", content=deep, headers=JSON)  # exactly the limit: read, then judged
        assert at.status_code == 400 and at.json()["error"]["code"] != "json_too_deep"
        over = c.post("/v1/completions", content=deep.replace(b"[", b"[[", 1).replace(b"]", b"]]", 1), headers=JSON)
        assert over.json()["error"]["code"] == "json_too_deep"
        huge = c.post("/v1/completions", content=b'{"prompt": "hi", "seed": ' + b"7" * 5000 + b"}", headers=JSON)
        assert huge.status_code == 400 and "not valid JSON" in huge.json()["error"]["message"]


# ---- the command ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("origin, ok", [("http://localhost:5173", True), ("https://app.example.org", True),
                                        ("chrome-extension://abcdef", True), ("http://[::1]:8080", True),
                                        ("http://localhost:5173/", False), ("localhost:5173", False),
                                        ("http://app.example/path", False), ("http://u@app.example", False),
                                        ("http://app.example:99999", False), ("http://", False)])
def test_cors_origin_values_are_origins(origin, ok):
    assert is_origin(origin) is ok


def test_serve_passes_host_and_origins_and_refuses_a_bad_origin(tiny, monkeypatch):
    import uvicorn
    ran = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: ran.update(app=app, **kw))
    r = CliRunner().invoke(cli, ["serve", str(tiny), "--backend", "numpy", "--drafter", "ngram", "--ctx", "64",
                                 "--host", "0.0.0.0", "--allow-remote", "--cors-origin", "HTTP://LocalHost:5173"])
    assert r.exit_code == 0, r.output
    config = ran["app"].state.server.config
    assert (config.bind_host, config.cors_origins) == ("0.0.0.0", ("http://localhost:5173",))
    bad = CliRunner().invoke(cli, ["serve", str(tiny), "--cors-origin", "http://localhost:5173/"])
    assert bad.exit_code == 2 and "not an origin" in bad.output and "trailing slash" in bad.output
