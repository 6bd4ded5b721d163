"""OpenAI's Responses API (`POST /v1/responses`) on `ead serve`: a real server on the tiny pair (the small
model's template renders tools), driven by the openai client and curl; each answer the same as the chat
route's for the same greedy request, the stream's typed events in OpenAI's order."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from bench_serve import TOOLS
from serve_process import Server
from test_cli import pair_args
from test_serve import HI, JSON, serving
from test_serve_tools import CALL_SCHEMA, QUESTION, TOOLS_TEMPLATE, multiply
from tiny_models import write_tiny_model

FLAT_TOOLS = [{"type": "function", **tool["function"]} for tool in TOOLS]  # Responses' shape
ASK = "What is 6 times 7?"
MAKES_A_CALL = {  # JSON mode makes the tiny model write a bare call of multiply
    "tools": FLAT_TOOLS,
    "text": {"format": {"type": "json_schema", "name": "call", "schema": CALL_SCHEMA}},
}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve-responses")
    small = write_tiny_model(folder / "tools.gguf", seed=0, chat_template=TOOLS_TEMPLATE, n_ctx_train=4096)
    with serving([*pair_args((small, tiny_pair[1])), "--ctx", "4096"], folder / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def chat(server: Server, **body: Any) -> dict[str, Any]:
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def responses(server: Server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/responses", json=body, headers=JSON, timeout=60)


def collapsed(types: list[str]) -> list[str]:
    """Event types with each run of one type as one (the deltas, a token or more each)."""
    return [kind for i, kind in enumerate(types) if i == 0 or types[i - 1] != kind]


def test_text_whole_and_streamed_equals_the_chat_route(server: Server, client: openai.OpenAI) -> None:
    expected = chat(server, messages=HI, temperature=0, max_tokens=16)
    text = expected["choices"][0]["message"]["content"]
    assert text  # the tiny model writes something to compare
    status = "incomplete" if expected["choices"][0]["finish_reason"] == "length" else "completed"

    whole = client.responses.create(model="ead", input="hi", temperature=0, max_output_tokens=16)
    assert whole.id.startswith("resp_") and whole.object == "response" and whole.status == status
    assert whole.output_text == text
    (message,) = whole.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [part.type for part in message.content] == ["output_text"]
    usage = expected["usage"]
    assert whole.usage.input_tokens == usage["prompt_tokens"]
    assert whole.usage.output_tokens == usage["completion_tokens"]
    assert whole.usage.total_tokens == usage["total_tokens"]
    ead = whole.model_extra["ead"]
    tokens = [(token["token"], token["model"]) for token in ead["tokens"]]
    assert tokens == [(token["token"], token["model"]) for token in expected["ead"]["tokens"]]

    events = list(
        client.responses.create(model="ead", input="hi", temperature=0, max_output_tokens=16, stream=True)
    )
    assert [event.sequence_number for event in events] == list(range(len(events)))
    ending = "response.incomplete" if status == "incomplete" else "response.completed"
    assert collapsed([event.type for event in events]) == [*TEXT_EVENTS, ending]
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == text
    done = next(event for event in events if event.type == "response.output_text.done")
    assert done.text == text
    last = events[-1].response
    assert last.output_text == text and last.status == status
    assert (last.usage.input_tokens, last.usage.output_tokens) == (
        whole.usage.input_tokens,
        whole.usage.output_tokens,
    )
    assert last.model_extra["ead"]["summary"]["generated"] == usage["completion_tokens"]

    # the client's stream helper adds the deltas up (its final response is a completed one's alone)
    with client.responses.stream(model="ead", input="hi", temperature=0, max_output_tokens=16) as stream:
        deltas = [event for event in stream if event.type == "response.output_text.delta"]
    assert deltas[-1].snapshot == text


def test_a_cut_off_answer_is_incomplete_with_its_reason(client: openai.OpenAI, server: Server) -> None:
    expected = chat(server, messages=HI, temperature=0, max_tokens=3)
    assert expected["choices"][0]["finish_reason"] == "length"
    cut = client.responses.create(model="ead", input="hi", temperature=0, max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3 and cut.output[0].status == "incomplete"
    assert cut.output_text == expected["choices"][0]["message"]["content"]


def test_instructions_and_items_are_the_chat_they_mean(server: Server, client: openai.OpenAI) -> None:
    """``instructions`` is the system message; a list of message items, their content a string or
    input_text and output_text parts, the conversation; developer is system, as on the chat route."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "again"},
        {"role": "user", "content": "and you?"},
    ]
    expected = chat(server, messages=messages, temperature=0, max_tokens=8)
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        {"role": "developer", "content": "again"},
        {"role": "user", "content": "and you?"},
    ]
    answer = client.responses.create(
        model="ead", instructions="Be brief.", input=items, temperature=0, max_output_tokens=8
    )
    assert answer.usage.input_tokens == expected["usage"]["prompt_tokens"]
    assert answer.output_text == expected["choices"][0]["message"]["content"]


def test_a_namespace_of_functions_is_its_functions_as_codex_sends_it(server: Server) -> None:
    """Codex CLI 0.171 groups its sub-agent functions in a ``namespace`` tool, beside flat ones: each of
    its functions is offered as a flat one is (the same prompt and answer)."""
    namespace = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Tools for spawning and managing sub-agents.",
        "tools": [{**FLAT_TOOLS[0], "strict": False}],
    }
    asked = {"model": "ead", "input": ASK, "temperature": 0, "max_output_tokens": 8, "tool_choice": "auto"}
    flat = responses(server, {**asked, "tools": [{**FLAT_TOOLS[0], "strict": False}]})
    grouped = responses(server, {**asked, "tools": [namespace]})
    assert flat.status_code == 200 and grouped.status_code == 200, grouped.text
    assert grouped.json()["usage"]["input_tokens"] == flat.json()["usage"]["input_tokens"]
    assert grouped.json()["output"][0]["content"] == flat.json()["output"][0]["content"]
    bare = responses(server, {**asked, "tools": [{"type": "namespace", "name": "empty"}]})
    assert bare.status_code == 400 and bare.json()["error"]["param"] == "tools.0.tools", bare.text


def test_a_function_call_round_trip(server: Server, client: openai.OpenAI) -> None:
    """Tools in Responses' flat shape: the call comes back as a function_call item, whole and streamed
    (its argument events, the arguments in pieces as they are written), and goes back with its output
    as the chat route's assistant call and tool message (the same prompt)."""
    asked = {"model": "ead", "input": ASK, "temperature": 0, "max_output_tokens": 60, **MAKES_A_CALL}
    whole = client.responses.create(**asked)
    (call,) = whole.output
    assert call.type == "function_call" and call.name == "multiply" and call.status == "completed"
    assert call.call_id.startswith("call_") and set(json.loads(call.arguments)) == {"a", "b"}
    assert whole.status == "completed" and whole.output_text == ""
    expected = chat(
        server,
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,
        response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}},
        temperature=0,
        max_tokens=60,
    )
    (chat_call,) = expected["choices"][0]["message"]["tool_calls"]
    assert (call.name, call.arguments) == (chat_call["function"]["name"], chat_call["function"]["arguments"])
    assert whole.usage.input_tokens == expected["usage"]["prompt_tokens"]

    events = list(client.responses.create(**asked, stream=True))
    assert collapsed([event.type for event in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (streamed,) = events[-1].response.output
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)
    # the arguments as the model writes them: several deltas that add up to the whole answer's
    pieces = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    assert len(pieces) >= 3 and "".join(pieces) == call.arguments
    added = events[2].item
    assert added.id == streamed.id and added.call_id == streamed.call_id
    with client.responses.stream(**asked) as stream:
        (helped,) = stream.get_final_response().output
    assert (helped.type, helped.name, helped.arguments) == ("function_call", call.name, call.arguments)

    turn = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
    ]
    answered = client.responses.create(
        model="ead", input=turn, tools=FLAT_TOOLS, temperature=0, max_output_tokens=8
    )
    chat_call = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    after = chat(
        server,
        messages=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": None, "tool_calls": [chat_call]},
            {"role": "tool", "tool_call_id": call.call_id, "content": "42"},
        ],
        tools=TOOLS,
        temperature=0,
        max_tokens=8,
    )
    assert answered.usage.input_tokens == after["usage"]["prompt_tokens"]
    assert answered.output_text == after["choices"][0]["message"]["content"]


def test_metadata_comes_back_on_the_response_whole_and_streamed(client: openai.OpenAI) -> None:
    """OpenAI's Response carries the request's ``metadata`` (a client's tags, to match answers to what
    asked them): it had been left out, the openai client's ``response.metadata`` None; none sent is {}."""
    tags = {"task": "review", "attempt": "2"}
    whole = client.responses.create(model="ead", input="hi", metadata=tags, max_output_tokens=2)
    assert whole.metadata == tags
    streamed = client.responses.create(
        model="ead", input="hi", metadata=tags, max_output_tokens=2, stream=True
    )
    carried = [event.response.metadata for event in streamed if hasattr(event, "response")]
    assert carried == [tags] * 3  # created, in_progress, incomplete
    assert client.responses.create(model="ead", input="hi", max_output_tokens=2).metadata == {}


def test_store_is_a_no_op_and_json_object_mode_is_taken(client: openai.OpenAI, server: Server) -> None:
    kept = client.responses.create(model="ead", input="hi", store=True, temperature=0, max_output_tokens=4)
    assert kept.store is False  # nothing is kept: the reply says so
    data = client.responses.create(
        model="ead", input="hi", text={"format": {"type": "json_object"}}, temperature=0, max_output_tokens=30
    )
    expected = chat(
        server, messages=HI, response_format={"type": "json_object"}, temperature=0, max_tokens=30
    )
    assert data.output_text == expected["choices"][0]["message"]["content"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "multiply"}])
def test_a_forced_tool_choice_is_the_chat_routes_forced_call(
    server: Server, client: openai.OpenAI, choice: str | dict[str, str]
) -> None:
    """``required`` and a named function (Responses' flat spelling) force a call as the chat route does."""
    asked = {"model": "ead", "input": ASK, "tools": FLAT_TOOLS, "parallel_tool_calls": False}
    asked |= {"temperature": 0, "max_output_tokens": 300}
    (call,) = client.responses.create(**asked, tool_choice=choice).output
    assert call.type == "function_call" and call.name == "multiply", call
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"a", "b"} and all(type(value) is int for value in arguments.values())
    chat_choice = (
        choice if isinstance(choice, str) else {"type": "function", "function": {"name": "multiply"}}
    )
    expected = chat(
        server,
        messages=[{"role": "user", "content": ASK}],
        tools=TOOLS,
        tool_choice=chat_choice,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=300,
    )
    (chat_call,) = expected["choices"][0]["message"]["tool_calls"]
    assert (call.name, call.arguments) == (chat_call["function"]["name"], chat_call["function"]["arguments"])


def test_hosted_tools_are_not_offered_as_llama_server_drops_them(server: Server) -> None:
    """Codex CLI offers OpenAI's hosted web search by default: no hosted tool runs here, so the model is
    offered the other tools alone, the same prompt and answer as a request without them."""
    hosted = [{"type": "web_search"}, {"type": "web_search_preview"}, {"type": "file_search"}]
    asked = {"model": "ead", "input": ASK, "temperature": 0, "max_output_tokens": 8}
    for tools in (FLAT_TOOLS, []):
        alone = responses(server, {**asked, **({"tools": tools} if tools else {})})
        beside = responses(server, {**asked, "tools": [hosted[0], *tools, *hosted[1:]]})
        assert alone.status_code == beside.status_code == 200, beside.text
        assert beside.json()["usage"]["input_tokens"] == alone.json()["usage"]["input_tokens"]
        assert beside.json()["output"][0]["content"] == alone.json()["output"][0]["content"]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x/a.png"}]}
                ]
            },
            "input.0.content",
            "input_image parts are not supported",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}]},
            "input.0.output",
            "input_file parts are not supported",
        ),
        ({"tools": [{"type": "custom", "name": "patch"}]}, "tools.0.type", "custom tools are not supported"),
        ({"tools": [{"type": "function", "name": ""}]}, "tools.0.name", "at least 1 character"),
        ({"max_output_tokens": 0}, "max_output_tokens", "-1 (no limit: to the context's end) or at least 1"),
        ({"messages": HI}, "messages", "takes input"),
        ({"input": [{"type": "item_reference", "id": "r"}]}, "input.0.type", "item_reference items"),
        ({"input": [{"type": "function_call", "name": "multiply"}]}, "input.0.call_id", "needs its call_id"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role", "'user'"),
        (
            {"tool_choice": {"type": "function", "name": "nope"}, "tools": FLAT_TOOLS},
            "tool_choice",
            "'nope' is not among the tools offered",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
            "text.format",
            "text.format.schema",
        ),
        ({"input": []}, "input", ""),
        # OpenAI's bounds, as it refuses them: what would come back in every event is bounded
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 items"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", "metadata: a key has at most 64 characters, got 'kkk"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "at most 512 characters"),
        ({"metadata": {"k": 1}}, "metadata.k", "a valid string"),
    ],
)
def test_bad_requests_are_a_400_naming_the_responses_field(
    server: Server, body: dict[str, Any], param: str, fragment: str
) -> None:
    reply = responses(server, {"model": "ead", "input": "hi", "max_output_tokens": 2, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and fragment in error["message"]
    assert "\n" not in error["message"] and "messages." not in error["message"]
    assert responses(server, {"input": "hi", "max_output_tokens": 1}).status_code == 200  # still serving


def test_a_format_no_answer_meets_ends_a_stream_with_response_failed(
    server: Server, client: openai.OpenAI
) -> None:
    """A failure mid-answer (a schema that allows no token) ends the stream as OpenAI's do, with
    ``response.failed`` (Codex reads an event's type: a bare error object is none to it): the Response
    failed, its error's code a Responses one and its message naming the field as the request spelled it,
    numbered as the other events; the openai client's stream reads it; whole, it is a 400; the server
    serves on."""
    never = {"format": {"type": "json_schema", "name": "never", "schema": {"pattern": "^[b-a]$"}}}
    body = {"model": "ead", "input": "hi", "max_output_tokens": 8, "text": never}
    events = list(client.responses.create(**body, stream=True))
    assert [event.type for event in events[:2]] == ["response.created", "response.in_progress"]
    failed = events[-1]  # after what the answer wrote before it failed (its opening quote)
    assert isinstance(failed, openai.types.responses.ResponseFailedEvent)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert failed.response.status == "failed" and failed.response.id == events[0].response.id
    error = failed.response.error
    assert error is not None and error.code == "invalid_prompt" and error.param == "text.format"
    assert "text.format" in error.message and "allows no token" in error.message
    whole = responses(server, body)
    assert whole.status_code == 400 and whole.json()["error"]["message"] == error.message
    assert responses(server, {"model": "ead", "input": "hi", "max_output_tokens": 2}).status_code == 200


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_gets_named_events(server: Server) -> None:
    body = json.dumps({"input": "hi", "max_output_tokens": 4, "temperature": 0, "stream": True})
    url = f"{server.base_url}/responses"
    out = subprocess.run(
        ["curl", "-sN", url, "-H", "Content-Type: application/json", "-d", body],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    frames = [frame for frame in out.replace("\r\n", "\n").split("\n\n") if frame.strip()]
    named = [frame.split("\n")[0].removeprefix("event: ") for frame in frames]
    assert named == [json.loads(frame.split("\n")[1].removeprefix("data: "))["type"] for frame in frames]
    assert named[0] == "response.created" and named[-1] in ("response.completed", "response.incomplete")


@pytest.mark.real
def test_an_agents_round_trip_on_the_real_pair(real_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """As an agent speaks it: ask with instructions and tools, get a function_call item (the same
    streamed), send the output items back with the call's output, get the answer that states it; both
    models write along the way."""
    with Server([*pair_args(real_pair), "--mode", "ead"], tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
        system, user = QUESTION
        asked = {"model": "ead", "instructions": system["content"], "tools": FLAT_TOOLS, "temperature": 0}
        first = client.responses.create(**asked, input=user["content"], max_output_tokens=60)
        (call,) = first.output
        assert call.type == "function_call" and call.name == "multiply"
        assert json.loads(call.arguments) == {"a": 1234, "b": 5678}
        with client.responses.stream(**asked, input=user["content"], max_output_tokens=60) as stream:
            (streamed,) = stream.get_final_response().output
        assert (streamed.name, streamed.arguments) == (call.name, call.arguments)

        turn = [
            {"role": "user", "content": user["content"]},
            *(item.model_dump(exclude_none=True) for item in first.output),
            {"type": "function_call_output", "call_id": call.call_id, "output": multiply(call.arguments)},
        ]
        answer = client.responses.create(**asked, input=turn, max_output_tokens=60)
        assert answer.status == "completed" and "7006652" in answer.output_text.replace(",", "")
        assert {token["model"] for token in answer.model_extra["ead"]["tokens"]} == {"small", "large"}
        assert server.stop() == 0
