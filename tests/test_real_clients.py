"""The clients app developers use, against `specedge serve` on loopback with the real default model
(SmolLM2-135M-Instruct Q4_1, llama.cpp at 1 thread: batch-invariant, so the n-gram drafter's greedy output equals
plain greedy) and the catalogue's embedding model (all-MiniLM-L6-v2): openai (chat `parse` with nested models and
enums, a forced `pydantic_function_tool`, `responses.create` streamed and not, `responses.parse`, `embeddings`),
instructor (TOOLS and JSON_SCHEMA modes), pydantic-ai (OpenAIChatModel with its default output, ToolOutput and
NativeOutput; OpenAIResponsesModel, streamed too). Speculation stays lossless under a forced call and a
`text.format` schema. Never litellm."""
import asyncio
from enum import Enum

import numpy as np
import openai
import pytest
from pydantic import BaseModel

from specedge.apps.api import Engine
from specedge.apps.model_pool import ModelPool, PoolEntry
from specedge.apps.serve_cmd import ServerThread
from specedge.apps.server import ServerConfig, create_app
from specedge.assembly.embedding import open_embedder

pytestmark = [pytest.mark.real, pytest.mark.slow]
TEXT = "Alice has a red cat called Tom."


class Color(str, Enum):
    red = "red"
    blue = "blue"
    green = "green"


class Pet(BaseModel):
    name: str
    color: Color


class Owner(BaseModel):
    name: str
    pet: Pet


def engine(drafter: str) -> Engine:
    return Engine.open("smollm2-135m", backend="llamacpp", drafter=drafter, k=4, threads=1, ctx=2048, plan=False)


@pytest.fixture(scope="module")
def served():
    spec, plain = engine("ngram"), engine("none")
    minilm = open_embedder("all-minilm-l6-v2")
    pool = ModelPool([PoolEntry("smollm2-135m", lambda: spec, 0), PoolEntry("smollm2-plain", lambda: plain, 0),
                      PoolEntry("all-minilm-l6-v2", lambda: minilm, 0)])
    with ServerThread(create_app(pool, ServerConfig())) as srv:
        yield srv, spec, plain, minilm


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_openai_chat_parse_and_a_forced_pydantic_function_tool(served):
    c = client(served[0])
    msgs = [{"role": "user", "content": TEXT}]
    r = c.chat.completions.parse(model="smollm2-135m", messages=msgs, response_format=Owner, temperature=0,
                                 max_tokens=120)
    assert isinstance(r.choices[0].message.parsed, Owner)
    r = c.chat.completions.parse(model="smollm2-135m", messages=msgs, tools=[openai.pydantic_function_tool(Owner)],
                                 tool_choice={"type": "function", "function": {"name": "Owner"}}, temperature=0,
                                 max_tokens=120)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and isinstance(call.function.parsed_arguments, Owner)
    with pytest.raises(openai.LengthFinishReasonError):
        c.chat.completions.parse(model="smollm2-135m", messages=msgs, response_format=Owner, max_tokens=5)


def test_forced_calls_and_text_format_are_lossless_under_speculation(served):
    """The same greedy output with the n-gram drafter as without, through the server (chat and Responses)."""
    c = client(served[0])
    tool = openai.pydantic_function_tool(Owner)
    rtool = {"type": "function", "name": "Owner", "parameters": Owner.model_json_schema()}
    fmt = {"format": {"type": "json_schema", "name": "Owner", "schema": Owner.model_json_schema(), "strict": True}}
    got = {}
    for model in ("smollm2-135m", "smollm2-plain"):
        chat = c.chat.completions.create(model=model, messages=[{"role": "user", "content": TEXT}], tools=[tool],
                                         tool_choice="required", temperature=0, max_tokens=120)
        resp = c.responses.create(model=model, input=TEXT, tools=[rtool], tool_choice="required", temperature=0,
                                  max_output_tokens=120)
        text = c.responses.create(model=model, input=TEXT, text=fmt, temperature=0, max_output_tokens=120)
        got[model] = (chat.choices[0].message.tool_calls[0].function.arguments,
                      [(o.type, o.name, o.arguments) for o in resp.output], text.output_text)
    assert got["smollm2-135m"] == got["smollm2-plain"]
    assert Owner.model_validate_json(got["smollm2-135m"][0]) and Owner.model_validate_json(got["smollm2-135m"][2])
    assert [t for t, _, _ in got["smollm2-135m"][1]] == ["function_call"]  # one call, no stray content


def test_responses_api_streamed_and_not(served):
    srv, _, plain, _ = served
    c = client(srv)
    want = plain.chat([{"role": "system", "content": "Answer briefly."},
                       {"role": "user", "content": "What is the capital of France?"}], temperature=0, max_tokens=24)
    args = dict(model="smollm2-plain", instructions="Answer briefly.", input="What is the capital of France?",
                temperature=0, max_output_tokens=24)
    r = c.responses.create(**args)
    assert r.output_text == want.text and r.usage.output_tokens == len(want.tokens)
    assert r.status == ("incomplete" if want.finish_reason.value == "length" else "completed")
    events = list(c.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{r.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want.text
    assert events[-1].response.output_text == want.text
    parsed = c.responses.parse(model="smollm2-135m", input=TEXT, instructions="Extract the owner and the pet.",
                               text_format=Owner, temperature=0, max_output_tokens=120)
    assert isinstance(parsed.output_parsed, Owner)


def test_embeddings_from_the_embedding_model_and_the_chat_model(served):
    srv, spec, _, minilm = served
    c = client(srv)
    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Quarterly revenue grew 5%."]
    r = c.embeddings.create(model="all-minilm-l6-v2", input=texts)  # the client asks for base64 and decodes it
    v = np.array([d.embedding for d in r.data], np.float32)
    assert v.shape == (3, 384) and np.allclose(v, minilm.embed(texts), atol=1e-6)
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert v[0] @ v[1] > 0.8 > 0.2 > v[0] @ v[2]  # similar sentences close, unrelated far
    f = c.embeddings.create(model="all-minilm-l6-v2", input=texts[0], encoding_format="float")
    assert np.allclose(f.data[0].embedding, v[0], atol=1e-6) and r.usage.prompt_tokens > 3
    g = c.embeddings.create(model="smollm2-135m", input=texts, encoding_format="float")
    w = np.array([d.embedding for d in g.data], np.float32)
    assert w.shape == (3, 576) and np.allclose(w, spec.embed(texts), atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        c.chat.completions.create(model="all-minilm-l6-v2", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        c.embeddings.create(model="all-minilm-l6-v2", input="x", dimensions=128)


def test_minilm_matches_sentence_transformers_reference(served):
    """The NumPy BERT encoder against transformers' BertModel + mean pooling on the same files."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import tempfile
    import zipfile

    from specedge.models.catalog import resolve_embedding
    texts = ["The cat sat on the mat.", "Embeddings map text to vectors. " * 20, "x"]
    with tempfile.TemporaryDirectory() as d:
        zipfile.ZipFile(resolve_embedding("all-minilm-l6-v2")).extractall(d)
        tok, model = transformers.AutoTokenizer.from_pretrained(d), transformers.AutoModel.from_pretrained(d).eval()
        with torch.no_grad():
            b = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
            h, m = model(**b).last_hidden_state, b["attention_mask"].unsqueeze(-1).float()
            ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1).numpy()
    assert np.abs(served[3].embed(texts) - ref).max() < 1e-5


def test_instructor_tools_and_json_schema_modes(served):
    instructor = pytest.importorskip("instructor")
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        c = instructor.from_openai(client(served[0]), mode=mode)
        got = c.chat.completions.create(model="smollm2-135m", response_model=Owner, max_retries=1, temperature=0,
                                        max_tokens=200, messages=[{"role": "user", "content": TEXT}])
        assert isinstance(got, Owner) and got.pet.color in Color, mode


def test_pydantic_ai_chat_and_responses_models(served):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, NativeOutput, ToolOutput
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
    provider = OpenAIProvider(base_url=served[0].url + "/v1", api_key="none")
    chat, responses = OpenAIChatModel("smollm2-135m", provider=provider), \
        OpenAIResponsesModel("smollm2-135m", provider=provider)
    settings = {"temperature": 0, "max_tokens": 200}
    for model, output in ((chat, Owner), (chat, ToolOutput(Owner)), (chat, NativeOutput(Owner)),
                          (responses, Owner), (responses, NativeOutput(Owner))):
        got = Agent(model, output_type=output, retries=1, model_settings=settings).run_sync(TEXT).output
        assert isinstance(got, Owner), (model, output)
    agent = Agent(responses, output_type=str, model_settings={"temperature": 0, "max_tokens": 40})
    assert agent.run_sync(TEXT).output

    async def streamed():
        async with agent.run_stream(TEXT) as run:
            return "".join([t async for t in run.stream_text(delta=True)])
    assert asyncio.run(streamed()) == agent.run_sync(TEXT).output
