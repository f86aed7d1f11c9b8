"""The per-call option lists are derived from CallSettings (assembly/decoder.py), not written by hand: a new or renamed
field shows up in the CLI flags, chat's /set keys and help, the Engine's keywords and the OpenAI wire, or this fails."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from specedge.apps import chat_state
from specedge.apps import openai_protocol as proto
from specedge.apps.chat_cmd import COMMANDS, chat_cmd
from specedge.apps.cli import generate
from specedge.apps.openai_responses import FIELDS as RESPONSES_FIELDS
from specedge.assembly.decoder import CALL_OPTIONS, CallSettings
from specedge.runtime.types import SamplingParams

ALL = tuple(f.name for f in fields(CallSettings))
DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_options_are_the_fields_declared_with_option():
    declared = tuple(f.name for f in fields(CallSettings) if f.metadata.get("help"))
    assert CALL_OPTIONS == declared and "temperature" in CALL_OPTIONS and "stop" not in CALL_OPTIONS


@pytest.mark.parametrize("command", [generate, chat_cmd], ids=["generate", "chat"])
def test_generate_and_chat_take_a_flag_per_option(command):
    params = {p.name: p for p in command.params}
    for name in CALL_OPTIONS:
        assert name in params, f"{command.name} has no flag for CallSettings.{name}"
        flags = params[name].opts + params[name].secondary_opts
        assert "--" + name.replace("_", "-") in flags
        want = CallSettings.__dataclass_fields__[name].default
        assert params[name].default == (() if name == "logit_bias" else want)


def test_set_takes_every_option_typed_as_declared_and_help_lists_them():
    assert chat_state.OPTION_NAMES == CALL_OPTIONS
    text = COMMANDS["/set KEY VALUE"]
    for name in CALL_OPTIONS:
        assert name in text
    opts = chat_state.parse_option("repetition_stop", "off", {})
    opts = chat_state.parse_option("dry_allowed_length", "3", opts)
    opts = chat_state.parse_option("typical_p", "0.5", opts)
    opts = chat_state.parse_option("repeat_penalty", "1.3", opts)
    assert opts == {"repetition_stop": False, "dry_allowed_length": 3, "typical_p": 0.5, "repeat_penalty": 1.3}
    assert type(opts["dry_allowed_length"]) is int
    with pytest.raises(ValueError, match="dry_allowed_length takes a int, got '2.5'"):
        chat_state.parse_option("dry_allowed_length", "2.5", {})


def test_the_engine_takes_each_field_and_names_an_unknown_one():
    call = CallSettings().with_options(**{"repeat_penalty": 1.2, "typical_p": 0.8})
    assert call.sampling().repeat_penalty == 1.2 and call.sampling().typical_p == 0.8
    with pytest.raises(TypeError, match="unknown call option 'repetition_penalty'; the call options are "
                                        "max_tokens, repetition_stop, .*repeat_penalty"):
        CallSettings().with_options(repetition_penalty=1.2)


def test_sampling_params_name_the_shared_fields_as_call_settings_does():
    shared = {f.name for f in fields(SamplingParams)} & set(ALL)
    assert {"temperature", "top_p", "repeat_penalty", "dry_multiplier", "logit_bias"} <= shared
    with pytest.raises(ValueError, match="repeat_penalty must be > 0"):
        CallSettings(repeat_penalty=0.0)


def test_every_field_is_on_the_wire_by_its_type_or_by_a_rule_of_its_own():
    assert set(proto.WIRE_FIELDS) | set(proto.OWN_RULES) == set(ALL)
    assert not set(proto.WIRE_FIELDS) & set(proto.OWN_RULES)
    for name in (*proto.WIRE_FIELDS, *proto.OWN_RULES):  # grammar is set by response_format & co.
        assert name == "grammar" or name in proto.CHAT_FIELDS & proto.COMPLETION_FIELDS
    assert set(proto.WIRE_FIELDS) <= RESPONSES_FIELDS


@pytest.mark.parametrize("name", list(proto.WIRE_FIELDS))
def test_each_wire_field_is_parsed_by_its_declared_type(name):
    kind = proto.WIRE_FIELDS[name]
    value = {"number": 0.5, "integer": 3, "boolean": False}[kind]
    value = 1.25 if name in ("repeat_penalty", "dry_base") else value
    req = proto.parse_completion({"prompt": "hi", name: value}, vocab_size=100)
    assert getattr(req.options, name) == value
    with pytest.raises(proto.APIError) as e:
        proto.parse_completion({"prompt": "hi", name: "x"}, vocab_size=100)
    assert e.value.param == name and name in e.value.message


def test_the_docs_name_every_option():
    cli, api, server = ((DOCS / f).read_text() for f in ("cli.md", "api.md", "server.md"))
    set_line = cli[cli.index("`/set KEY VALUE`"):][:600]
    for name in CALL_OPTIONS:
        flag = name.replace("_", "-")
        assert f"--{flag}" in cli or f"--no-{flag}" in cli, name
        assert name in set_line, name
        assert f"`{name}`" in api, name
    for name in proto.WIRE_FIELDS:
        assert f"`{name}`" in server, name
