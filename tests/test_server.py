"""`specedge serve` through the real `openai` client against a server on a loopback port (uvicorn in a thread):
greedy output equal to Engine.generate and plain decoding, streaming, stop strings, seeds, usage, the `specedge`
extension, every error status with its message, the API key, disconnect cancellation and a small load run."""
import json
import os
import re
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest
from click.testing import CliRunner

import specedge
from specedge.apps.cli import cli
from specedge.apps.serve_cmd import ServerThread
from specedge.apps.server import ServerConfig, create_app
from specedge.perf.load_test import free_port, reference, run_load, wait_ready
from specedge.runtime.decode import decode
from specedge.runtime.request import PLAIN, Request
KEY = "sekret"
HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def tiny_path(tiny_gguf_4k):
    # 4096 positions: a long generation takes ~2 s, long enough to disconnect from in the middle
    return tiny_gguf_4k  # tests/conftest.py, shared (read-only)


@pytest.fixture(scope="module")
def engine(tiny_path):
    return specedge.Engine.open(str(tiny_path), backend="numpy", drafter="ngram", ctx=4096)


@pytest.fixture(scope="module")
def server(engine):
    with ServerThread(create_app(engine, ServerConfig("tiny", max_queue=8))) as s:
        yield s


@pytest.fixture(scope="module")
def strict(engine):
    """The same engine behind an API key, a 4 KiB body limit and no waiting room (a second call gets 429)."""
    config = ServerConfig("tiny", api_key=KEY, max_queue=0, max_request_bytes=4096)
    with ServerThread(create_app(engine, config)) as s:
        yield s


def client(s, key="none"):
    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0, timeout=60)


def plain(engine, ids, max_tokens):
    events = decode(engine.model.backend, np.asarray(ids, np.int32), PLAIN,
                    Request(max_tokens=max_tokens, eos_ids=engine.tokenizer.eos_ids))
    return [e.token for e in events]


def test_models_list_names_the_loaded_model(server):
    models = client(server).models.list().data
    assert [(m.id, m.object, m.owned_by) for m in models] == [("tiny", "model", "specedge")]
    assert client(server).models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client(server).models.retrieve("gpt-4")


def test_greedy_completion_equals_engine_and_plain_decoding(server, engine):
    ids = engine.encode("hello world")
    r = client(server).completions.create(model="any-name", prompt="hello world", max_tokens=24, temperature=0)
    want = engine.generate("hello world", max_tokens=24, temperature=0)
    tokens = plain(engine, ids, 24)
    assert r.choices[0].text == want.text == engine.tokenizer.decode(
        tokens[:-1] if tokens[-1] in engine.tokenizer.eos_ids else tokens)
    assert r.model == "tiny" and r.object == "text_completion"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(want.tokens)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    by_ids = client(server).completions.create(model="tiny", prompt=ids, max_tokens=24, temperature=0)
    assert by_ids.choices[0].text == r.choices[0].text


def test_chat_streamed_deltas_equal_the_plain_response(server, engine):
    c = client(server)
    r = c.chat.completions.create(model="tiny", messages=HI, max_tokens=30, temperature=0)
    want = engine.chat(HI, max_tokens=30, temperature=0)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode(engine.render_chat(HI)))
    assert r.usage.completion_tokens == len(want.tokens)
    assert r.choices[0].finish_reason == {"eos": "stop", "length": "length"}[want.finish_reason]
    chunks = list(c.chat.completions.create(model="tiny", messages=HI, max_tokens=30, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].delta.role is None for ch in chunks[1:] if ch.choices)  # the role comes once, first
    assert len({(ch.id, ch.created, ch.model) for ch in chunks}) == 1  # one id across the chunks (llama.cpp's check)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == r.choices[0].finish_reason
    assert finals[0].model_extra["specedge"]["n_generated"] >= r.usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump()["completion_tokens"] == len(want.tokens)


def test_streamed_completion_ends_with_done(server):
    with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 8,
                                                                    "temperature": 0, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and "specedge" in last


def test_stop_sequences_cut_the_text(server, engine):
    full = engine.generate("the cat", max_tokens=40, temperature=0).text
    stop = full[6:8]
    r = client(server).completions.create(model="tiny", prompt="the cat", max_tokens=40, temperature=0,
                                          stop=[stop, "never-there"])
    assert r.choices[0].text == full[:full.find(stop)] and r.choices[0].finish_reason == "stop"
    one = client(server).completions.create(model="tiny", prompt="the cat", max_tokens=40, temperature=0, stop=stop)
    assert one.choices[0].text == r.choices[0].text


def test_a_seed_reproduces_a_sampled_answer(server, engine):
    c = client(server)
    ask = dict(model="tiny", prompt="sample me", max_tokens=16, temperature=1.0, top_p=0.9)
    a = c.completions.create(seed=7, **ask).choices[0].text
    assert a == c.completions.create(seed=7, **ask).choices[0].text
    assert a == engine.generate("sample me", max_tokens=16, temperature=1.0, top_p=0.9, seed=7).text
    assert a != c.completions.create(seed=8, **ask).choices[0].text


def test_the_specedge_extension_carries_the_speculative_statistics(server):
    r = client(server).completions.create(model="tiny", prompt="a b a b a b", max_tokens=24, temperature=0)
    ext = r.model_extra["specedge"]
    for key in ("tau", "acceptance_rate", "n_drafted", "n_accepted", "tokens_per_s", "ttft_s",
                "reused_prompt_tokens", "drafter", "prompt_tokens_per_s"):
        assert key in ext, key
    assert ext["drafter"] == "ngram" and ext["tau"] >= 1.0 and ext["ttft_s"] > 0
    assert ext["prompt_tokens_per_s"] == pytest.approx(ext["n_prefilled"] / ext["prefill_s"])
    assert ext["n_accepted"] <= ext["n_drafted"]


@pytest.mark.parametrize("ask, status, match", [
    (dict(temperature=-1), 400, "temperature"),
    (dict(top_p=1.5), 400, "top_p"),
    (dict(max_tokens=0), 400, "max_tokens must be in \\[1, "),
    (dict(max_completion_tokens=-3), 400, "max_completion_tokens must be in \\[1, "),
    (dict(temperature="hot"), 400, "temperature must be a finite number"),
    (dict(n=0), 400, "n must be in"),
    (dict(presence_penalty=2.5), 400, "presence_penalty must be in \\[-2, 2\\]"),
    (dict(logit_bias={"5": 200}), 400, "logit_bias maps token ids"),
    (dict(logit_bias={"99999999": 1}), 400, "logit_bias names token id 99999999, outside this model's vocabulary"),
    (dict(logit_bias=[[5, 1]]), 400, "logit_bias must be an object"),
    (dict(stop=3), 400, "stop must be a string"),
    (dict(prompt=list(range(5000))), 400, "token ids in"),
    (dict(prompt=[5] * 5000), 400, "context holds 4096.*--ctx"),
    (dict(prompt=["a", "b"]), 400, "batches are not supported"),
])
def test_invalid_requests_get_400_naming_the_field(server, ask, status, match):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, **ask}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert re.search(match, err["message"]), err["message"]


# llama.cpp's server tests (tools/server/tests/unit/test_chat_completion.py test_invalid_chat_completion_req), ported
@pytest.mark.parametrize("messages", [None, "string", [123], [{}], [{"role": 123}], [{"role": "system", "content": 123}],
                                      [{"role": "system", "content": "test"}, {}], [], [{"content": "hello"}]])
def test_invalid_messages_get_400_naming_messages(server, messages):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": messages}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_openai_client_sees_engine_errors(server):
    with pytest.raises(openai.BadRequestError, match="temperature") as e:
        client(server).chat.completions.create(model="tiny", messages=HI, temperature=-0.5)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError, match="messages"):
        client(server).chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])


@pytest.mark.parametrize("path, body, status, match", [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("/v1/nothing", b"{}", 404, "no route"),
])
def test_malformed_bodies_and_routes_get_json_errors(server, path, body, status, match):
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and match in r.json()["error"]["message"]


def test_api_key_is_required_when_set(strict):
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        client(strict, "wrong").models.list()
    r = httpx.get(strict.url + "/v1/models")
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
    assert client(strict, KEY).models.list().data[0].id == "tiny"
    assert httpx.get(strict.url + "/health").status_code == 200  # liveness needs no key


def test_a_body_over_the_limit_gets_413(strict):
    r = httpx.post(strict.url + "/v1/completions", json={"prompt": "x" * 5000},
                   headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 413 and "--max-request-bytes" in r.json()["error"]["message"]


def test_a_full_queue_gets_429_with_retry_after(strict):
    long = {"prompt": "hello world", "max_tokens": 3000, "temperature": 0, "stream": True}
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", strict.url + "/v1/completions", json=long, headers=headers, timeout=60) as running:
        lines = running.iter_lines()  # kept: dropping the iterator closes the connection (a disconnect)
        assert running.status_code == 200 and next(lines).startswith("data: ")  # this call holds the only slot
        r = httpx.post(strict.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=headers)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert "--max-queue" in r.json()["error"]["message"]


def test_a_client_that_disconnects_cancels_its_generation(server, engine):
    metrics = server.server.config.app.state.server.metrics
    before = metrics.to_dict()["cancelled"]
    body = {"prompt": "hello world", "max_tokens": 3000, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    t0 = time.perf_counter()  # leaving the block closed the connection mid-stream
    quick = client(server).completions.create(model="tiny", prompt="x", max_tokens=4, temperature=0)
    assert quick.usage.completion_tokens >= 1 and time.perf_counter() - t0 < 2.0
    deadline = time.monotonic() + 10
    while metrics.to_dict()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.02)
    record = [m for m in metrics.to_dict()["recent"] if m["finish_reason"] == "cancelled"][-1]
    assert record["max_tokens"] == 3000 and record["n_generated"] < 1500


def test_small_load_has_no_errors_and_exact_greedy_outputs(server):
    prompts = [[{"role": "user", "content": t}] for t in ("hi", "tell me a story", "a b c", "count to ten")]
    expected = reference(server.url, prompts, max_tokens=16)
    report = run_load(server.url, prompts, expected, clients=4, requests=5, max_tokens=16)
    assert report.requests == 20 and report.errors == 0, report.error_samples
    assert report.mismatches == 0, report.mismatch_samples
    assert report.latency_s["n"] == 20 and report.ttft_s["n"] == 8
    assert len(report.per_request) == 20 and report.end_to_end_tokens_per_s["n"] == 20
    assert all(r["latency_s"] > 0 and r["tokens"] >= 1 for r in report.per_request)
    whole = run_load(server.url, prompts, expected, clients=2, requests=2, max_tokens=16, stream="never")
    assert whole.errors == whole.mismatches == 0 and not any(r["stream"] for r in whole.per_request)
    assert whole.ttft_s == {}  # nothing streamed: the clients slept until each whole answer


def test_serve_refuses_a_public_address_without_a_key():
    r = CliRunner().invoke(cli, ["serve", "model", "--host", "0.0.0.0"], env={"SPECEDGE_API_KEY": ""})
    assert r.exit_code == 2 and "--allow-remote" in r.output


def test_specedge_serve_command_serves(tiny_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "specedge.apps.cli", "serve", str(tiny_path), "--backend",
                             "numpy", "--port", str(port), "--api-key", KEY, "--log-level", "warning"],
                            env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc, timeout=120)
        c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        assert c.models.list().data[0].id == tiny_path.name  # the file's name
        assert c.completions.create(model=tiny_path.name, prompt="hi", max_tokens=3).usage.completion_tokens >= 1
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode()
    assert "API key required" in out


@pytest.mark.real
@pytest.mark.slow
def test_real_smollm2_server_matches_the_engine():
    eng = specedge.Engine.open("smollm2-135m", backend="llamacpp", drafter="ngram", ctx=1024)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    want = eng.chat(messages, max_tokens=32, temperature=0)
    with ServerThread(create_app(eng, ServerConfig("smollm2-135m"))) as s:
        c = client(s)
        r = c.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=32, temperature=0)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="smollm2-135m", messages=messages, max_tokens=32, temperature=0, stream=True))
    assert r.choices[0].message.content == want.text == streamed
    assert "Paris" in want.text
    assert r.usage.prompt_tokens == len(eng.tokenizer.encode(eng.render_chat(messages)))
    assert r.usage.completion_tokens == len(want.tokens) and r.model_extra["specedge"]["drafter"] == "ngram"
