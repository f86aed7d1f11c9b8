"""Tool calling (apps/tools.py, tool_parse.py, tool_grammar.py): typed tools, rendering through a template or a system message, parsing whole and
streamed outputs, the forced-call grammar compiled by llguidance against the tiny model's tokenizer, and
Engine.chat's tools / tool_choice."""
import json

import llguidance as llg
import pytest

import specedge
from specedge import ForceTool, JsonObject, Tool, ToolCall
from specedge.apps.tool_grammar import forced_grammar
from specedge.apps.tool_parse import ToolStream, parse_tool_calls
from specedge.apps.tools import render_messages, resolve_choice, tools_of

# bounded strings: the random tiny model's forced arguments must end within max_tokens
WEATHER = Tool("get_weather", "The weather in a city", {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": False})
TIME = Tool("get_time", "The time", {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}},
                                     "required": ["tz"], "additionalProperties": False})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS_TEMPLATE = ("{% if tools %}TOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}\n{% endif %}"
                  "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
                  "{% for c in m.get('tool_calls', []) %}CALL {{ c['function']['name'] }} "
                  "{{ c['function']['arguments']['city'] }}{% endfor %}\n{% endfor %}")


@pytest.fixture(scope="module")
def engine(tiny_gguf_4k):
    path = tiny_gguf_4k  # tests/conftest.py, shared (read-only)
    return specedge.Engine.open(str(path), backend="numpy", drafter="ngram", ctx=4096)


def matcher(engine, grammar):
    tok = llg.LLTokenizer(engine.tokenizer.spec.hf_json, eos_token=list(engine.tokenizer.eos_ids))
    return tok, llg.LLMatcher(tok, llg.LLMatcher.grammar_from_lark(grammar.grammar))


def test_tools_are_typed_and_validated():
    assert Tool.from_openai(WEATHER.openai()) == WEATHER
    assert Tool("f").parameters == {"type": "object", "properties": {}}
    for bad in ("", "has space", "x" * 65):
        with pytest.raises(ValueError, match="tool name"):
            Tool(bad)
    with pytest.raises(ValueError, match="unique"):
        tools_of([WEATHER, WEATHER.openai()])
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    assert call.args == {"city": "Paris"} and ToolCall.from_openai(call.openai()) == call
    assert resolve_choice("get_time", [TIME]) == ForceTool("get_time")
    with pytest.raises(ValueError, match="not among the tools"):
        resolve_choice("nope", [TIME])
    with pytest.raises(ValueError, match="at least one tool"):
        resolve_choice("required", [])


def test_parse_blocks_bare_json_and_leftover_content():
    content, calls = parse_tool_calls("Let me check.\n" + CALL + "\nand " + CALL.replace("Paris", "Rome"),
                                      [WEATHER])
    assert content == "Let me check.\n\nand" and [c.args["city"] for c in calls] == ["Paris", "Rome"]
    assert all(c.id.startswith("call_") and len(c.id) > 10 for c in calls) and calls[0].id != calls[1].id
    content, calls = parse_tool_calls(' {"name": "get_weather", "parameters": {"city": "Oslo"}} ', [WEATHER])
    assert content == "" and calls[0].name == "get_weather" and calls[0].args == {"city": "Oslo"}
    for text in (CALL.replace("get_weather", "unknown"), "<tool_call>{not json}</tool_call>"):
        assert parse_tool_calls(text, [WEATHER]) == (text.strip(), [])
    assert parse_tool_calls("<tool_call>{\"na", [WEATHER]) == ("", [])  # cut by max_tokens: not content
    assert parse_tool_calls(CALL, []) == (CALL, [])  # no tools: nothing is a call


def _content(events) -> str:
    return "".join(e.value for e in events if isinstance(e.value, str))


def _calls(events) -> list[ToolCall]:
    return [e.value for e in events if isinstance(e.value, ToolCall)]


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_tool_stream_equals_whole_parse_at_any_split(step):
    text = "Sure. <tool_ca" + "ll>x</tool_call> then " + CALL + " bye <tool"
    stream, events = ToolStream([WEATHER]), []
    for i in range(0, len(text), step):
        events += stream.push(text[i:i + step])
        assert not _content(events).endswith("<tool")  # a possible call start is held back
    events += stream.finish()
    want_content, want_calls = parse_tool_calls(text, [WEATHER])
    assert _content(events).replace(" ", "") == want_content.replace(" ", "")
    assert [(c.name, c.arguments) for c in _calls(events)] == [(c.name, c.arguments) for c in want_calls]
    assert stream.consumed == len(text)
    # each piece of content is the output's text just before its `end`; ends only grow
    assert all(text[e.end - len(e.value):e.end] == e.value for e in events if isinstance(e.value, str))
    assert [e.end for e in events] == sorted(e.end for e in events)
    assert text[:_calls_end(events)].endswith("</tool_call>")


def _calls_end(events) -> int:
    return [e.end for e in events if isinstance(e.value, ToolCall)][-1]


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_a_call_cut_by_max_tokens_never_reaches_content(step):
    """tool_choice "required" with parallel calls: a small model repeats calls until max_tokens, and the cut-off
    last block was returned as content beside the parsed call (issue 29)."""
    text = "Here. " + CALL + "\n<tool_call>\n{\"name\": \"get_weather\", \"argu"
    content, calls = parse_tool_calls(text, [WEATHER])
    assert content == "Here." and [c.args for c in calls] == [{"city": "Paris"}]
    stream, events = ToolStream([WEATHER]), []
    for i in range(0, len(text), step):
        events += stream.push(text[i:i + step])
    events += stream.finish()
    assert _content(events).strip() == "Here."
    assert [c.args for c in _calls(events)] == [{"city": "Paris"}] and stream.consumed == len(text)
    assert _calls_end(events) == len("Here. " + CALL)
    assert parse_tool_calls("no calls, just <tool_call> talk", [WEATHER])[0] == "no calls, just"


def test_tool_stream_holds_a_bare_json_call_to_the_end():
    stream = ToolStream([WEATHER])
    text = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert [e for i in range(len(text)) for e in stream.push(text[i])] == []
    [found] = stream.finish()
    assert found.value.args == {"city": "Oslo"} and found.end == len(text)


def test_render_without_template_tools_uses_a_merged_system_message(engine):
    assert "tools" not in engine.tokenizer.chat_template
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather?"}]
    text = render_messages(engine.tokenizer, msgs, [WEATHER])
    assert text.count("<|im_start|>system") == 1 and "Be brief.\n\n# Tools" in text
    assert json.dumps(WEATHER.openai()) in text and "<tool_call>" in text
    alone = render_messages(engine.tokenizer, msgs[1:], [WEATHER])
    assert alone.startswith("<|im_start|>system\n# Tools")
    assert render_messages(engine.tokenizer, msgs, [WEATHER], "none") == engine.tokenizer.apply_chat_template(msgs)


def test_history_with_calls_and_results_renders_as_text(engine):
    msgs = [{"role": "user", "content": "weather in Paris and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "get_weather",
                                                                   "arguments": '{"city": "Paris"}'}},
                ToolCall("call_b", "get_weather", '{"city": "Rome"}')]},
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": "rain"}]
    text = render_messages(engine.tokenizer, msgs, [WEATHER])
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call>\n<tool_call>') in text
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n"
            "</tool_response><|im_end|>") in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_template_that_renders_tools_gets_them_as_a_variable(engine):
    tok = engine.tokenizer
    old = tok.chat_template, tok._template
    tok.chat_template, tok._template = TOOLS_TEMPLATE, None
    try:
        msgs = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [ToolCall("c", "get_weather", '{"city": "Oslo"}')]},
                {"role": "tool", "tool_call_id": "c", "content": "cold"}]
        text = render_messages(tok, msgs, [WEATHER, TIME])
        assert text == "TOOLS:get_weather;get_time;[user]hi[assistant]CALL get_weather Oslo[tool]cold"  # trim_blocks
        with pytest.raises(ValueError, match="set by the renderer"):
            tok.apply_chat_template(msgs, variables={"messages": []})
    finally:
        tok.chat_template, tok._template = old


@pytest.mark.parametrize("choice,parallel", [(ForceTool("get_weather"), False), ("required", False),
                                             ("required", True)])
def test_forced_grammar_compiles_and_accepts_exactly_calls(engine, choice, parallel):
    grammar = forced_grammar([WEATHER, TIME], choice, parallel=parallel)
    tok, m = matcher(engine, grammar)
    assert not m.is_error(), m.get_error()
    assert m.consume_tokens(tok.tokenize_str(CALL)) and m.is_accepting()
    if parallel:
        assert m.consume_tokens(tok.tokenize_str("\n" + CALL.replace("Paris", "Rome"))) and m.is_accepting()
    for wrong in (CALL.replace("Paris", "1").replace('"1"', "1"),  # city must be a string
                  CALL.replace("get_weather", "get_time") if isinstance(choice, ForceTool) else "plain text"):
        _, m = matcher(engine, grammar)
        m.consume_tokens(tok.tokenize_str(wrong))
        assert m.is_error() or not m.is_accepting()


def _pydantic_tools():
    """What instructor, pydantic-ai and openai's pydantic_function_tool send: nested models and enums as $defs/$ref;
    two tools whose definitions share a name (Color) with different meanings; a draft-7 `definitions` schema with a
    recursive root reference."""
    import enum
    pydantic = pytest.importorskip("pydantic")

    class Color(str, enum.Enum):
        red = "red"
        green = "green"

    class Size(pydantic.BaseModel):
        w: int
        h: int

    class Paint(pydantic.BaseModel):
        color: Color
        size: Size

    class Shade(str, enum.Enum):
        dark = "dark"

    class Mood(pydantic.BaseModel):
        color: Shade

    tree = {"type": "object", "properties": {"label": {"$ref": "#/definitions/Label"},
                                            "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}}},
            "required": ["label", "kids"], "definitions": {"Label": {"type": "string", "maxLength": 4}}}
    return [Tool("paint", "Paint", Paint.model_json_schema()), Tool("mood", "Mood", Mood.model_json_schema()),
            Tool("tree", "A tree", tree)]


def _call(name, arguments):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


@pytest.mark.parametrize("choice", ["required", ForceTool("paint"), ForceTool("tree")])
def test_forced_grammar_compiles_any_client_schema_with_defs_refs_and_colliding_names(engine, choice):
    """Issue 29: the wrapper once left `#/$defs/Color` pointing at a root without $defs (a 400 for every nested
    pydantic model). Valid calls pass; a wrong enum value, a missing nested field or an invented key do not."""
    tools = _pydantic_tools()
    grammar = forced_grammar(tools, choice, parallel=False)
    good = {"paint": _call("paint", {"color": "green", "size": {"w": 1, "h": 2}}),
            "tree": _call("tree", {"label": "a", "kids": [{"label": "b", "kids": []}]})}
    bad = {"paint": [_call("paint", {"color": "blue", "size": {"w": 1, "h": 2}}),
                     _call("paint", {"color": "red", "size": {"w": 1}}),
                     _call("paint", {"color": "red", "size": {"w": 1, "h": 2}, "junk": 1}),
                     _call("paint", {"color": "red", "size": {"w": 1, "h": 2, "d": 3}})],
           "tree": [_call("tree", {"label": "a", "kids": [{"label": 1, "kids": []}]}),
                    _call("tree", {"label": "a", "kids": [], "x": 0})]}
    names = ["paint", "tree"] if choice == "required" else [choice.name]
    for name in names:
        tok, m = matcher(engine, grammar)
        assert not m.is_error(), m.get_error()
        assert m.consume_tokens(tok.tokenize_str(good[name])) and m.is_accepting(), name
        for wrong in bad[name]:
            _, m = matcher(engine, grammar)
            m.consume_tokens(tok.tokenize_str(wrong))
            assert m.is_error() or not m.is_accepting(), wrong
    if choice == "required":  # the other tool's Color is not this one's
        tok, m = matcher(engine, grammar)
        assert m.consume_tokens(tok.tokenize_str(_call("mood", {"color": "dark"}))) and m.is_accepting()
        _, m = matcher(engine, grammar)
        m.consume_tokens(tok.tokenize_str(_call("mood", {"color": "red"})))
        assert m.is_error() or not m.is_accepting()


def test_embedded_arguments_reroots_references_and_closes_objects():
    from specedge.apps.tool_grammar import embedded_arguments
    params = {"type": "object", "properties": {"properties": {"type": "string"}, "c": {"$ref": "#/$defs/C"},
                                               "me": {"$ref": "#"}, "o": {"type": "object", "properties": {},
                                                                          "additionalProperties": True}},
              "$defs": {"C": {"type": "object", "properties": {"x": {"$ref": "#/properties/c"}}}}}
    args, defs = embedded_arguments(params)
    assert "$defs" not in args and defs["$defs"]["C"]["additionalProperties"] is False
    assert args["properties"]["c"] == {"$ref": "#/$defs/C"} and args["properties"]["me"]["$ref"] == \
        "#/properties/arguments"
    assert defs["$defs"]["C"]["properties"]["x"]["$ref"] == "#/properties/arguments/properties/c"
    assert args["additionalProperties"] is False and args["properties"]["o"]["additionalProperties"] is True
    assert args["properties"]["properties"] == {"type": "string"}  # a property named "properties" stays a property
    assert params["$defs"]["C"]["properties"]["x"]["$ref"] == "#/properties/c"  # the tool's own schema untouched


def test_engine_chat_refuses_grammar_with_a_forced_tool(engine):
    with pytest.raises(ValueError, match="forced tool_choice"):
        engine.chat([{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice="required",
                    grammar=JsonObject(), max_tokens=4)


def test_engine_chat_without_a_call_returns_content(engine):
    r = engine.chat([{"role": "user", "content": "hi"}], tools=[WEATHER], max_tokens=6, temperature=0)
    assert isinstance(r, specedge.ChatResult) and isinstance(r, specedge.apps.api.GenerationResult)
    assert r.tool_calls == [] and r.content == r.text.strip()


@pytest.mark.parametrize("choice", ["required", "get_time", ForceTool("get_weather")])
def test_engine_chat_forced_call_is_a_valid_call(engine, choice):
    """Needs the constraint implementation (runtime): the grammar forces the call."""
    r = engine.chat([{"role": "user", "content": "what time is it in Paris?"}], tools=[WEATHER, TIME],
                    tool_choice=choice, parallel_tool_calls=False, max_tokens=200, temperature=0)
    assert r.finish_reason == "eos" and len(r.tool_calls) == 1 and r.content == ""
    call = r.tool_calls[0]
    want = {"required": None, "get_time": "get_time"}.get(choice, getattr(choice, "name", None))
    assert want is None or call.name == want
    schema = {t.name: t for t in (WEATHER, TIME)}[call.name].parameters
    import jsonschema
    jsonschema.validate(call.args, schema)
