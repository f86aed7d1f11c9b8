"""The OpenAI surface of `specedge serve` beyond plain text: the parameter sweep (every documented request field is
honoured or refused with a 400 naming it), response_format and the grammar extensions, n > 1, logprobs and tool
calls in OpenAI's exact shapes, streamed and not.

The logprob / tool-call shape tests drive the server with a scripted engine (a fixed Response stream: the shapes are
the server's work, not the model's); the tests at the end run the tiny model end to end."""
import json

import httpx
import jsonschema
import openai
import pytest

import specedge
from specedge.apps import openai_protocol as proto
from specedge.apps.openai_grammar import grammar_of
from specedge.apps.serve_cmd import ServerThread
from specedge.apps.server import ServerConfig, create_app
from specedge.runtime.constraint import Gbnf, JsonObject, JsonSchema, Regex
from specedge.assembly.decoder import CallStream
from specedge.runtime.stats import CallStats, DecodeStats
from specedge.runtime.types import FinishReason, Response, SamplingParams, TokenLogprob

HI = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {
                                                "type": "string", "maxLength": 12}},
                                                           "required": ["city"], "additionalProperties": False}}}
OK, REFUSED = "ok", "400"
# Every documented /v1/chat/completions field with a non-default value, and what the server must do with it.
CHAT_SWEEP = {
    "messages": (HI, OK), "model": ("another-model", OK), "audio": ({"voice": "alloy", "format": "wav"}, REFUSED),
    "frequency_penalty": (0.5, OK), "function_call": ("auto", REFUSED), "functions": ([{"name": "f"}], REFUSED),
    "logit_bias": ({"5": 10}, OK), "logprobs": (True, OK), "max_completion_tokens": (3, OK),
    "max_tokens": (3, OK), "metadata": ({"a": "b"}, OK), "modalities": (["text", "audio"], REFUSED), "n": (2, OK),
    "parallel_tool_calls": (False, OK), "prediction": ({"type": "content", "content": "x"}, REFUSED),
    "presence_penalty": (0.5, OK), "prompt_cache_key": ("k", OK), "reasoning_effort": ("low", REFUSED),
    "response_format": ({"type": "json_object"}, OK), "safety_identifier": ("u1", OK), "seed": (5, OK),
    "service_tier": ("flex", REFUSED), "stop": (["zz"], OK), "store": (True, REFUSED), "stream": (True, OK),
    "stream_options": ({"include_usage": True}, OK), "temperature": (0.5, OK), "tool_choice": ("none", OK),
    "tools": ([WEATHER], OK), "top_logprobs": (2, OK), "top_p": (0.5, OK), "user": ("u1", OK),
    "verbosity": ("low", REFUSED), "web_search_options": ({}, REFUSED),
}
COMPLETION_SWEEP = {
    "model": ("another-model", OK), "prompt": ("hello", OK), "best_of": (2, REFUSED), "echo": (True, OK),
    "frequency_penalty": (0.5, OK), "logit_bias": ({"5": 10}, OK), "logprobs": (2, OK),
    "max_tokens": (3, OK), "n": (2, OK), "presence_penalty": (0.5, OK), "seed": (5, OK), "stop": (["zz"], OK),
    "stream": (True, OK), "stream_options": ({"include_usage": True}, OK), "suffix": ("x", REFUSED),
    "temperature": (0.5, OK), "top_p": (0.5, OK), "user": ("u1", OK),
    "max_completion_tokens": (3, OK),  # the chat API's name, accepted here too
    "response_format": ({"type": "json_object"}, OK),  # an extension here (llama.cpp's server takes it too)
}
EXTENSIONS = {"top_k": (5, OK), "min_p": (0.1, OK), "typical_p": (0.9, OK), "repeat_penalty": (1.1, OK),
              "dry_multiplier": (0.8, OK), "dry_base": (2.0, OK), "dry_allowed_length": (3, OK),
              "repetition_stop": (False, OK),
              "grammar": ('root ::= "a" "b"', OK), "json_schema": ({"type": "object"}, OK), "regex": ("[a-c]+", OK), "no_such_field": (1, REFUSED)}
NEEDS = {"top_logprobs": {"logprobs": True}, "stream_options": {"stream": True}, "tool_choice": {"tools": [WEATHER]},
         "parallel_tool_calls": {"tools": [WEATHER]}}


@pytest.fixture(scope="module")
def engine(tiny_gguf_4k):
    path = tiny_gguf_4k  # tests/conftest.py, shared (read-only)
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=4096)


@pytest.fixture(scope="module")
def server(engine):
    with ServerThread(create_app(engine, ServerConfig("tiny"))) as s:
        yield s


class Scripted:
    """The real engine with `stream` replaced by a fixed Response stream (text pieces, tokens, logprobs with
    `logprobs` alternatives); the last piece ends with EOS."""

    def __init__(self, engine, pieces):
        self._engine, self.pieces = engine, pieces

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def stream(self, prompt, call, *, cancel=None):
        n = call.logprobs

        def responses(out):
            for i, (text, token) in enumerate(self.pieces):
                lp = None if n is None else TokenLogprob(token, -0.25 * i, tuple((t, -1.0 - t) for t in range(n)))
                yield Response(text, token, False, 1.0, FinishReason.EOS if i == len(self.pieces) - 1 else None, lp)
            out.stats = CallStats(DecodeStats(n_generated=len(self.pieces)), 3, FinishReason.EOS, "ngram",
                                  SamplingParams())
        return CallStream(responses)


TOOL_PIECES = [("Sure. ", 40), ("<tool", 41), ('_call>\n{"name": "get_weather", ', 42),
               ('"arguments": {"city": "Paris"}}\n</tool_call>', 43), ("", 300)]


@pytest.fixture(scope="module")
def scripted(engine):
    with ServerThread(create_app(Scripted(engine, TOOL_PIECES), ServerConfig("tiny"))) as s:
        yield s


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)


def post(s, route, body):
    return httpx.post(f"{s.url}/v1/{route}", json=body, timeout=120)


def test_the_sweep_covers_every_documented_field():
    assert set(CHAT_SWEEP) == proto.CHAT_FIELDS - set(EXTENSIONS)
    assert set(COMPLETION_SWEEP) == proto.COMPLETION_FIELDS - set(EXTENSIONS)


@pytest.mark.parametrize("route,field,value,want", [
    *[("chat/completions", f, v, w) for f, (v, w) in CHAT_SWEEP.items()],
    *[("completions", f, v, w) for f, (v, w) in COMPLETION_SWEEP.items()],
    *[(r, f, v, w) for r in ("chat/completions", "completions") for f, (v, w) in EXTENSIONS.items()]])
def test_every_field_is_honoured_or_refused_by_name(server, route, field, value, want):
    base = {"model": "tiny", "max_tokens": 2, "temperature": 0}
    base.update({"messages": HI} if route == "chat/completions" else {"prompt": "hello"})
    body = {**base, **NEEDS.get(field, {}), field: value}
    r = post(server, route, body)
    if want == REFUSED:
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert field in r.json()["error"]["message"]
        return
    assert r.status_code == 200, r.text
    if body.get("stream"):
        assert r.text.rstrip().endswith("data: [DONE]")
        return
    out = r.json()
    assert len(out["choices"]) == body.get("n", 1)
    if field == "echo":
        assert out["choices"][0]["text"].startswith("hello")
    if field in ("presence_penalty", "frequency_penalty", "logit_bias"):  # the call sampled with it
        assert out["specedge"]["sampling"][field] == value


def test_logit_bias_and_penalties_are_honoured_as_the_engine_honours_them(server, engine):
    """Banning the greedy answer's first token changes the answer to what the Engine gives under the same ban;
    a presence penalty changes a repetitive greedy answer the same way on both paths."""
    base = {"model": "tiny", "prompt": "the cat sat on the mat", "max_tokens": 12, "temperature": 0}
    plain = post(server, "completions", base).json()["choices"][0]["text"]
    first = engine.generate("the cat sat on the mat", max_tokens=12, temperature=0).tokens[0]
    banned = post(server, "completions", {**base, "logit_bias": {str(first): -100}}).json()["choices"][0]["text"]
    want = engine.generate("the cat sat on the mat", max_tokens=12, temperature=0, logit_bias={first: -100})
    assert banned == want.text != plain and want.tokens[0] != first
    pen = post(server, "completions", {**base, "presence_penalty": 2, "frequency_penalty": 1}).json()
    want = engine.generate("the cat sat on the mat", max_tokens=12, temperature=0, presence_penalty=2,
                           frequency_penalty=1)
    assert pen["choices"][0]["text"] == want.text != plain


@pytest.mark.parametrize("body,want", [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, JsonObject()),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                 "strict": True}}},
     JsonSchema({"type": "object", "additionalProperties": False}, strict=True, name="x")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
     JsonSchema({}, strict=False, name="x")),
    ({"grammar": 'root ::= "a"'}, Gbnf('root ::= "a"')), ({"regex": "a+"}, Regex("a+")),
    ({"json_schema": {"type": "string"}}, JsonSchema({"type": "string"}, strict=False)),
    # llama-server's form: honoured, not ignored; objects closed unless they say otherwise (llama.cpp's reading)
    ({"response_format": {"type": "json_object", "schema": {"type": "object", "required": ["a"]}}},
     JsonSchema({"type": "object", "required": ["a"], "additionalProperties": False}, strict=False)),
    ({"json_schema": {"type": "object", "properties": {"p": {"type": "object", "additionalProperties": True}},
                      "$defs": {"D": {"properties": {"x": {"type": "string"}}}}}},
     JsonSchema({"type": "object", "properties": {"p": {"type": "object", "additionalProperties": True}},
                 "$defs": {"D": {"properties": {"x": {"type": "string"}}, "additionalProperties": False}},
                 "additionalProperties": False}, strict=False))])
def test_output_constraints_map_to_grammar_specs(body, want):
    assert grammar_of(body) == want


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "xml"}}, "response_format"), ({"grammar": 'root ::= "a"', "regex": "a"}, "regex"),
    ({"response_format": {"type": "json_object"}, "tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"), ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"n": 2, "stream": True}, "n"), ({"n": 0}, "n"), ({"stream_options": {"include_obfuscation": True}},
                                                       "stream_options"),
    # unknown keys inside response_format are refused naming them (issue 29), never silently ignored
    ({"response_format": {"type": "json_object", "bogus": 1}}, "response_format.bogus"),
    ({"response_format": {"type": "text", "schema": {}}}, "response_format.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}},
     "response_format.json_schema.extra"),
    ({"response_format": {"type": "json_object", "schema": "not an object"}}, "response_format.schema"),
    # OpenAI's ranges
    ({"temperature": 3}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"max_tokens": 10**30}, "max_tokens"),
    ({"max_completion_tokens": 2**31}, "max_completion_tokens"),
    # a grammar llguidance refuses names its field, and a forced tool's the tools
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}}}}, "response_format"),
    ({"regex": "(unclosed"}, "regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}}}], "tool_choice": "required"}, "tools"),
])
def test_bad_combinations_get_400_naming_the_field(server, body, param):
    r = post(server, "chat/completions", {"messages": HI, "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "%json" not in r.text and "body0" not in r.text  # no internal grammar in the message


def test_a_chat_prompt_over_the_context_names_messages(server):
    r = post(server, "chat/completions", {"messages": [{"role": "user", "content": "hi " * 5000}], "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_completion_logprobs_above_five_and_echo_with_logprobs_are_refused(server):
    for body, param in (({"logprobs": 6}, "logprobs"), ({"logprobs": 1, "echo": True}, "echo")):
        r = post(server, "completions", {"prompt": "hi", "max_tokens": 2, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_n_choices_decode_with_consecutive_seeds(server, engine):
    r = client(server).chat.completions.create(model="tiny", messages=HI, max_tokens=6, temperature=1.0, seed=7, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for i, c in enumerate(r.choices):
        assert c.message.content == engine.chat(HI, max_tokens=6, temperature=1.0, seed=7 + i).text
    assert r.usage.completion_tokens == sum(len(engine.chat(HI, max_tokens=6, temperature=1.0, seed=7 + i).tokens)
                                            for i in range(3))


def test_tool_call_is_parsed_into_the_message(scripted, engine):
    r = client(scripted).chat.completions.create(model="tiny", messages=HI, tools=[WEATHER], logprobs=True,
                                                 top_logprobs=2)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Sure."
    [call] = c.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert [e.logprob for e in c.logprobs.content] == [0.0, -0.25, -0.5, -0.75]  # EOS's dropped
    first, tok = c.logprobs.content[0], engine.tokenizer
    assert first.token == tok.token_bytes(40).decode() and first.bytes == list(tok.token_bytes(40))
    assert [(t.logprob, t.bytes) for t in first.top_logprobs] == [(-1.0, list(tok.token_bytes(0))),
                                                                   (-2.0, list(tok.token_bytes(1)))]


def test_streamed_tool_call_deltas_and_logprobs_per_chunk(scripted):
    chunks = list(client(scripted).chat.completions.create(model="tiny", messages=HI, tools=[WEATHER], stream=True,
                                                           logprobs=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert content == "Sure. " and len(calls) == 1
    assert calls[0].index == 0 and calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    per_chunk = [[e.logprob for e in ch.choices[0].logprobs.content] if ch.choices[0].logprobs else []
                 for ch in chunks]
    text_chunk = next(i for i, ch in enumerate(chunks) if ch.choices[0].delta.content == "Sure. ")
    call_chunk = next(i for i, ch in enumerate(chunks) if ch.choices[0].delta.tool_calls)
    assert per_chunk[text_chunk] == [0.0] and per_chunk[call_chunk] == [-0.25, -0.5, -0.75]
    assert sum(per_chunk, []) == [0.0, -0.25, -0.5, -0.75]


def test_tool_choice_none_parses_nothing(scripted):
    r = client(scripted).chat.completions.create(model="tiny", messages=HI, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert "<tool_call>" in r.choices[0].message.content


def test_completion_logprobs_take_the_legacy_shape(scripted, engine):
    r = post(scripted, "completions", {"prompt": "ab", "logprobs": 1})
    lp = r.json()["choices"][0]["logprobs"]
    tok = engine.tokenizer
    assert lp["token_logprobs"] == [0.0, -0.25, -0.5, -0.75] and lp["tokens"][0] == tok.token_bytes(40).decode()
    assert lp["top_logprobs"][0] == {tok.token_bytes(0).decode(): -1.0}
    assert lp["text_offset"][:2] == [2, 2 + len(lp["tokens"][0])]
    streamed = [json.loads(line[6:]) for line in post(scripted, "completions", {"prompt": "ab", "logprobs": 1,
                                                                               "stream": True}).text.splitlines()
                if line.startswith("data: {")]
    got = [v for ch in streamed if ch["choices"] and ch["choices"][0]["logprobs"]
           for v in ch["choices"][0]["logprobs"]["token_logprobs"]]
    assert got == lp["token_logprobs"]


# ---- end to end on the tiny model: these need the runtime's constraint and logprob implementation ----------------

COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
         "additionalProperties": False}


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_response_validates(server, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "color", "schema": COLOR, "strict": True}}
    c = client(server).chat.completions.create(model="tiny", messages=HI, response_format=fmt, temperature=0,
                                               max_tokens=300, stream=stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in c if ch.choices) if stream else \
        c.choices[0].message.content
    jsonschema.validate(json.loads(text), COLOR)


def test_forced_tool_call_through_the_server(server):
    r = client(server).chat.completions.create(model="tiny", messages=HI, tools=[WEATHER], temperature=0,
                                               tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                               parallel_tool_calls=False, max_tokens=300)
    [call] = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_logprobs_are_the_greedy_choice_and_equal_streamed(server, engine):
    kw = dict(model="tiny", messages=HI, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    # Each call starts from an empty KV cache, but the verify batches are not the same from call to call: the
    # adaptive draft length learns from measured verify times, so a slower call (streaming) may verify a shorter
    # prefix, and float32 matmuls over a different batch shape differ in the last bits. So the values agree to
    # float32 rounding (1e-5 on log-probabilities); a logprob taken from the wrong row or position differs by far more.
    engine.reset()
    r = client(server).chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and e.logprob == pytest.approx(tops[0])
    engine.reset()
    want = engine.chat(HI, temperature=0, max_tokens=12, logprobs=3).logprobs
    engine.reset()
    assert [e.logprob for e in content] == pytest.approx([lp.logprob for lp in want], abs=1e-5)
    streamed = [e for ch in client(server).chat.completions.create(**kw, stream=True)
                if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)
