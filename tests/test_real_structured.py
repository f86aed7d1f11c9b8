"""Structured output, tools and logprobs on the real default model (SmolLM2-135M-Instruct Q4_1, llama.cpp at 1
thread, where a verify batch gives the one-token logits bit for bit: tests/test_real_decode.py) through the real
`openai` client against the server with the n-gram drafter on: json_schema answers parse and validate on 6 dev
prompts, streamed and not, and equal plain decoding's constrained answers, with n-gram drafts accepted under the
grammar; a forced tool call is a valid `tool_calls` entry; logprobs equal the plain path's; /metrics parses as
Prometheus text; two models answer by name.
"""
import json

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from specedge.apps.api import Engine
from specedge.apps.model_pool import ModelPool, PoolEntry
from specedge.apps.serve_cmd import ServerThread
from specedge.apps.server import ServerConfig, create_app
from specedge.assembly.devset import load_prompts
from specedge.perf.constrained import SCHEMA, SYSTEM
from specedge.runtime.constraint import JsonSchema

pytestmark = [pytest.mark.real, pytest.mark.slow]
MAX_TOKENS = 256  # SCHEMA bounds every string and list: an answer fits
# 6 of the first 20 dev prompts (load_prompts(limit=20)): every answer goes through the same grammar, server and
# stream paths, and all 20 (3 decodes each) were ~1.5 of the suite's 25 minutes (issue 40). Under the grammar n-gram
# rarely drafts (a forbidden draft token ends the draft unverified); on 8, 10, 12 and 18 (translation, qa, rag,
# extraction) some drafts were rejected (measured 2026-11-27), so rollback under the grammar is likely exercised, but
# the engine's adaptive draft length follows timings, so how many are rejected varies run to run: not asserted.
PROMPTS = (0, 3, 8, 10, 12, 18)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def engine(drafter: str) -> Engine:
    return Engine.open("smollm2-135m", backend="llamacpp", drafter=drafter, k=4, threads=1, ctx=1024, plan=False)


@pytest.fixture(scope="module")
def served():
    spec, plain = engine("ngram"), engine("none")
    pool = ModelPool([PoolEntry("smollm2-135m", lambda: spec, 0), PoolEntry("smollm2-plain", lambda: plain, 0)])
    with ServerThread(create_app(pool, ServerConfig())) as srv:
        yield srv, spec, plain


def messages(text):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def test_json_schema_answers_validate_and_equal_plain_constrained_output(served):
    srv, spec, plain = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    fmt = {"type": "json_schema", "json_schema": {"name": "plan", "schema": SCHEMA, "strict": True}}
    n_drafted = n_accepted = 0
    dev = load_prompts(limit=20)
    for p in (dev[i] for i in PROMPTS):
        ref = plain.chat(messages(p.text), grammar=JsonSchema(SCHEMA), temperature=0, max_tokens=MAX_TOKENS)
        r = client.chat.completions.create(model="smollm2-135m", messages=messages(p.text), response_format=fmt,
                                           temperature=0, max_tokens=MAX_TOKENS)
        text = r.choices[0].message.content
        assert text == ref.text, p.qid
        assert r.choices[0].finish_reason == "stop", p.qid  # the answer ended, not cut by max_tokens
        jsonschema.validate(json.loads(text), SCHEMA)
        n_drafted += r.model_extra["specedge"]["n_drafted"]
        n_accepted += r.model_extra["specedge"]["n_accepted"]
        chunks = client.chat.completions.create(model="smollm2-135m", messages=messages(p.text), response_format=fmt,
                                                temperature=0, max_tokens=MAX_TOKENS, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == text, p.qid
    assert 0 < n_accepted <= n_drafted  # speculation ran: drafts verified and accepted (rejections: see PROMPTS)


def test_forced_tool_call_is_a_valid_tool_calls_entry(served):
    srv, _, _ = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    r = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0,
        max_tokens=96)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_logprobs_equal_the_plain_paths(served):
    srv, spec, plain = served
    # a fresh KV cache each: llama.cpp's logits also depend on which cells earlier calls left (tests/test_server.py)
    spec.reset()
    plain.reset()
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    got = {}
    for model in ("smollm2-135m", "smollm2-plain"):
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "List three colors."}],
                                           temperature=0, max_tokens=48, logprobs=True, top_logprobs=3)
        got[model] = r.choices[0].logprobs.content
        assert r.model_extra["specedge"]["drafter"] == ("ngram" if model == "smollm2-135m" else "none")
    a, b = got["smollm2-135m"], got["smollm2-plain"]
    assert [x.token for x in a] == [x.token for x in b] and len(a) > 10
    assert np.allclose([x.logprob for x in a], [x.logprob for x in b], atol=1e-5, rtol=0)
    for x, y in zip(a, b):
        assert len(x.top_logprobs) == 3 and [t.token for t in x.top_logprobs] == [t.token for t in y.top_logprobs]
        assert np.allclose([t.logprob for t in x.top_logprobs], [t.logprob for t in y.top_logprobs], atol=1e-5)


def test_metrics_parse_and_two_models_answer_by_name(served):
    from prometheus_client.parser import text_string_to_metric_families
    srv, _, _ = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
    ids = {m.id for m in client.models.list().data}
    assert ids == {"smollm2-135m", "smollm2-plain"}
    for model in ids:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], temperature=0,
                                           max_tokens=8)
        assert r.model == model
    text = httpx.get(srv.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    generated = {s.labels["model"]: s.value for s in families["specedge_generated_tokens"].samples
                 if s.name.endswith("_total")}
    assert set(generated) == ids and all(v > 0 for v in generated.values())
