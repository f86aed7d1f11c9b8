"""POST /v1/responses and /v1/embeddings on a tiny seeded model (no download): the Responses API equals the chat
route's greedy output, its streamed events come in the order and shape the openai client parses, function calls
become function_call items (streamed whole), input items render as chat history, and what cannot be honoured is
refused with a 400 naming the field; /v1/embeddings refuses bad input naming the field."""
import json

import httpx
import openai
import pytest

import specedge
from specedge.apps import openai_responses as responses_api
from specedge.apps.openai_protocol import APIError
from specedge.apps.serve_cmd import ServerThread
from specedge.apps.server import ServerConfig, create_app
from test_openai_surface import TOOL_PIECES, Scripted

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def engine(tiny_gguf_4k):
    path = tiny_gguf_4k  # tests/conftest.py, shared (read-only)
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=4096)


@pytest.fixture(scope="module")
def server(engine):
    with ServerThread(create_app(engine, ServerConfig("tiny"))) as s:
        yield s


@pytest.fixture(scope="module")
def scripted(engine):
    with ServerThread(create_app(Scripted(engine, TOOL_PIECES), ServerConfig("tiny"))) as s:
        yield s


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_a_response_equals_the_chat_routes_greedy_answer(server):
    c = client(server)
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "be brief"},
                                                             {"role": "user", "content": "hi there"}],
                                     max_tokens=12, temperature=0)
    r = c.responses.create(model="tiny", instructions="be brief", input="hi there", max_output_tokens=12,
                           temperature=0)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == 12
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.instructions == "be brief" and r.max_output_tokens == 12 and r.store is False
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    listed = c.responses.create(model="tiny", input=[{"role": "system", "content": "be brief"},
                                                     {"role": "user", "content": [{"type": "input_text",
                                                                                   "text": "hi there"}]}],
                                max_output_tokens=12, temperature=0)
    assert listed.output_text == r.output_text


def test_streamed_events_carry_the_same_answer_in_order(server):
    c = client(server)
    r = c.responses.create(model="tiny", input="hi there", max_output_tokens=10, temperature=0)
    events = list(c.responses.create(model="tiny", input="hi there", max_output_tokens=10, temperature=0,
                                     stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == r.output_text
    assert events[-1].response.output_text == r.output_text and events[-1].response.usage.output_tokens == 10
    raw = httpx.post(f"{server.url}/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 2,
                                                         "stream": True}, timeout=60).text
    assert raw.startswith("event: response.created\ndata: {") and "[DONE]" not in raw


def test_function_calls_become_items_streamed_whole(scripted):
    c = client(scripted)
    r = c.responses.create(model="tiny", input="weather in Paris?", tools=[WEATHER], top_logprobs=1,
                           include=["message.output_text.logprobs"])
    msg, call = r.output
    assert msg.content[0].text == "Sure." and [lp.logprob for lp in msg.content[0].logprobs] == [0.0, -0.25, -0.5,
                                                                                                 -0.75]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"} and r.status == "completed"
    events = list(c.responses.create(model="tiny", input="weather?", tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds.index("response.output_text.done") < kinds.index("response.function_call_arguments.done")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris"} and done.name == "get_weather"
    assert [o.type for o in events[-1].response.output] == ["message", "function_call"]


AROUND_A_CALL = [("Sure.", 40), ("\n", 41), ("<tool", 42), ('_call>\n{"name": "get_weather", "arguments": ', 43),
                 ('{"city": "Paris"}}\n</tool_call>', 44), ("\n", 45), ("Done", 46), ("\n", 47), ("", 300)]


def test_chat_and_responses_streams_group_text_and_logprobs_alike(engine):
    """The two streamed routes share one assembler: the same text pieces with the same logprobs (newlines held
    until text follows them, a call's tokens with the call, which a Responses function_call item does not show)."""
    with ServerThread(create_app(Scripted(engine, AROUND_A_CALL), ServerConfig("tiny"))) as s:
        c = client(s)
        chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "weather?"}],
                                                tools=[{"type": "function", "function": {
                                                    k: v for k, v in WEATHER.items() if k != "type"}}],
                                                stream=True, logprobs=True))
        events = list(c.responses.create(model="tiny", input="weather?", tools=[WEATHER], stream=True,
                                         include=["message.output_text.logprobs"]))
    chat = [(ch.choices[0].delta.content, [e.logprob for e in ch.choices[0].logprobs.content])
            for ch in chunks if ch.choices and ch.choices[0].delta.content]
    responses = [(e.delta, [lp.logprob for lp in e.logprobs]) for e in events if e.type == "response.output_text.delta"]
    assert chat == responses == [("Sure.", [0.0]), ("\n\nDone", [-0.25, -1.25, -1.5])]
    call_chunk = next(ch for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls)
    assert [e.logprob for e in call_chunk.choices[0].logprobs.content] == [-0.5, -0.75, -1.0]
    assert [e.logprob for e in chunks[-1].choices[0].logprobs.content] == [-1.75]  # the trailing newline's
    assert [o.type for o in events[-1].response.output] == ["message", "function_call", "message"]


def test_function_call_items_render_as_chat_history():
    body = {"instructions": "sys", "input": [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}
    chat, messages = responses_api.to_chat(body)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


@pytest.mark.parametrize("body, param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"), ({"store": True}, "store"),
    ({"conversation": "conv_1"}, "conversation"), ({"background": True}, "background"),
    ({"reasoning": {"effort": "high"}}, "reasoning"), ({"truncation": "auto"}, "truncation"),
    ({"tools": [{"type": "web_search"}]}, "tools"), ({"include": ["file_search_call.results"]}, "include"),
    ({"text": {"format": {"type": "json_schema", "schema": {}, "bogus": 1}}}, "text.format.bogus"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"), ({"bogus": 1}, "bogus"),
    ({"max_output_tokens": 0}, "max_output_tokens"), ({"temperature": 3}, "temperature"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
    ({"tool_choice": "required"}, "tool_choice"), ({"prompt": {"id": "p"}}, "prompt")])
def test_what_cannot_be_honoured_is_refused_by_name(server, body, param):
    r = httpx.post(f"{server.url}/v1/responses", json={"model": "tiny", "input": "hi", **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert "max_completion_tokens" not in err["message"] and "response_format" not in err["message"]


def test_renamed_errors_name_the_responses_fields():
    e = responses_api.renamed(APIError(400, "max_completion_tokens must be in [1, 5]", param="max_completion_tokens"))
    assert (e.param, e.message) == ("max_output_tokens", "max_output_tokens must be in [1, 5]")
    assert responses_api.renamed(APIError(400, "x", param="response_format.json_schema.bogus")).param == \
        "text.format.json_schema.bogus"


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"), ({"input": [1, 2, 3]}, "input"), ({"input": ""}, "input"), ({"input": "x", "bogus": 1},
                                                                                       "bogus"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format")])
def test_embedding_requests_with_bad_input_get_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server.url}/v1/embeddings", json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
