"""Anthropic's Messages API on `ead serve`: a real server on the tiny pair (its small model with a tool
template), driven by the official `anthropic` client and httpx, each answer the same as the OpenAI route's
for the same greedy request."""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from bench_serve import TOOLS
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, JSON, TAU, serving
from test_serve_safety import exchange
from test_serve_tools import CALL_SCHEMA, QUESTION, TOOLS_TEMPLATE
from tiny_models import write_tiny_model

from ead_cli.serve.app import _stream_end
from ead_cli.serve.schemas import ApiError

KEY = "s3cret"
SYSTEM = "Be brief."
HI = [{"role": "user", "content": "hi"}]
# the tools of bench_serve.py as Anthropic spells them
TOOL = {
    "name": TOOLS[0]["function"]["name"],
    "description": TOOLS[0]["function"]["description"],
    "input_schema": TOOLS[0]["function"]["parameters"],
}
ASK = [{"role": "user", "content": "What is 6 times 7?"}]
FORCED_CALL = {"format": {"type": "json_schema", "schema": CALL_SCHEMA}}  # the tiny model writes a call


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve-anthropic")
    small = write_tiny_model(folder / "tools.gguf", seed=0, chat_template=TOOLS_TEMPLATE, n_ctx_train=16384)
    args = [*pair_args((small, tiny_pair[1])), *TAU, *CTX, "--api-key", KEY]
    with serving(args, folder / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def post(server: Server, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    headers = {**JSON, "x-api-key": KEY, "anthropic-version": "2023-06-01", **headers}
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=120)


def openai_chat(server: Server, **body: Any) -> dict[str, Any]:
    headers = {**JSON, "Authorization": f"Bearer {KEY}"}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def events(server: Server, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A streamed answer's server-sent events, each its ``event:`` name and its data, read as they come."""
    read: list[tuple[str, dict[str, Any]]] = []
    headers = {**JSON, "x-api-key": KEY}
    with httpx.stream(
        "POST", f"{server.url}/v1/messages", json={**body, "stream": True}, headers=headers, timeout=120
    ) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in reply.iter_lines():
            if line.startswith("event:"):
                name = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data = json.loads(line.removeprefix("data:"))
                assert name == data["type"]  # each event named as its data's type
                read.append((name, data))
    return read


def one_text_block(deltas: int) -> list[str]:
    """The events of a streamed answer of one text block written in ``deltas`` deltas, in order."""
    return [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_a_message_whole_and_streamed_is_the_openai_routes_answer(
    server: Server, client: anthropic.Anthropic
) -> None:
    expected = openai_chat(
        server, messages=[{"role": "system", "content": SYSTEM}, *HI], temperature=0, max_tokens=16
    )
    text = expected["choices"][0]["message"]["content"]
    request = {"model": "ead", "max_tokens": 16, "system": SYSTEM, "messages": HI}  # the server's greedy

    whole = client.messages.create(**request)
    assert whole.id.startswith("msg_") and whole.type == "message" and whole.role == "assistant"
    assert [(block.type, block.text) for block in whole.content] == [("text", text)]
    assert whole.model == "ead" and whole.stop_reason == "max_tokens" and whole.stop_sequence is None
    # the prompt the OpenAI request read just before is kept in the caches: read from them
    prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert prompt == expected["usage"]["prompt_tokens"] and whole.usage.cache_read_input_tokens > 0
    assert whole.usage.output_tokens == 16
    tokens = [(token["token"], token["model"]) for token in whole.model_extra["ead"]["tokens"]]
    assert tokens == [(token["token"], token["model"]) for token in expected["ead"]["tokens"]]
    assert {model for _, model in tokens} == {"small", "large"}

    with client.messages.stream(**request) as stream:
        assert "".join(stream.text_stream) == text
        streamed = stream.get_final_message()
    assert [(block.type, block.text) for block in streamed.content] == [("text", text)]
    assert streamed.stop_reason == "max_tokens" and streamed.id.startswith("msg_")
    assert streamed.usage.output_tokens == 16
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == prompt

    counted = client.messages.count_tokens(model="ead", system=SYSTEM, messages=HI)
    assert counted.input_tokens == prompt


def test_the_stream_is_anthropics_event_sequence(server: Server) -> None:
    """message_start (the prompt's tokens counted), a ping, one text block of a delta per token (each with
    the model that wrote it), its stop, message_delta with the stop reason and usage, message_stop."""
    thinking = {"type": "enabled", "budget_tokens": 1024}  # a model that does not think answers as it does
    body = {"model": "ead", "max_tokens": 8, "messages": HI, "temperature": 0, "thinking": thinking}
    read = events(server, {**body, "metadata": {"user_id": "someone"}})
    names = [name for name, _ in read]
    assert names == one_text_block(8)
    start = read[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert read[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [data for name, data in read if name == "content_block_delta"]
    assert all(data["index"] == 0 and data["delta"]["type"] == "text_delta" for data in deltas)
    assert [data["ead"]["index"] for data in deltas] == list(range(8))
    end = read[-2][1]
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    usage = end["usage"]  # the prompt's tokens as the caches kept them, known at the end
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == start["usage"]["input_tokens"]
    assert usage["output_tokens"] == 8
    assert end["ead"]["summary"]["generated"] == 8


def test_a_stop_sequence_ends_the_answer_and_is_named(client: anthropic.Anthropic) -> None:
    request = {"model": "ead", "messages": HI}
    text = client.messages.create(**request, max_tokens=24).content[0].text
    stop = text[5:7]  # whatever the tiny model writes: the answer ends before its first place
    ended = client.messages.create(**request, max_tokens=24, stop_sequences=["\u2042\u2042\u2042", stop])
    assert ended.stop_reason == "stop_sequence" and ended.stop_sequence == stop
    assert ended.content[0].text == text[: text.index(stop)]


def test_a_tool_use_round_trip(server: Server, client: anthropic.Anthropic) -> None:
    """The tiny model, held to a call's JSON by output_config.format, calls the tool: a tool_use block
    (its input an object, streamed in pieces as it is written), stop_reason tool_use, whole and streamed
    alike; the call and its tool_result sent back render as the OpenAI route's assistant call and tool
    message do."""
    request = {
        "model": "ead",
        "max_tokens": 120,  # the tiny model puts blank lines wherever JSON's blank allows them
        "messages": ASK,
        "tools": [TOOL],
        "output_config": FORCED_CALL,
    }
    whole = client.messages.create(**request)
    assert whole.stop_reason == "tool_use"
    (call,) = whole.content
    assert call.type == "tool_use" and call.name == "multiply" and call.id.startswith("toolu_")
    assert set(call.input) == {"a", "b"} and all(isinstance(value, int) for value in call.input.values())
    with client.messages.stream(**request) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(block.type, block.name, block.input) for block in streamed.content] == [
        ("tool_use", "multiply", call.input)
    ]
    # the input as the model writes it: several input_json_delta pieces, the whole input's JSON
    pieces = [event.partial_json for event in events if event.type == "input_json"]
    assert len(pieces) >= 3 and json.loads("".join(pieces)) == call.input

    product = str(call.input["a"] * call.input["b"])
    turn = [
        *ASK,
        {"role": "assistant", "content": [call.model_dump(exclude_none=True)]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": [{"type": "text", "text": product}],
                }
            ],
        },
    ]
    counted = client.messages.count_tokens(model="ead", messages=turn, tools=[TOOL])
    openai_call = {
        "id": call.id,
        "type": "function",
        "function": {"name": "multiply", "arguments": json.dumps(call.input)},
    }
    openai_turn = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [openai_call]},
        {"role": "tool", "tool_call_id": call.id, "content": product},
    ]
    expected = openai_chat(server, messages=openai_turn, tools=TOOLS, max_tokens=4, temperature=0)
    assert counted.input_tokens == expected["usage"]["prompt_tokens"]
    answered = client.messages.create(model="ead", max_tokens=4, messages=turn, tools=[TOOL])
    assert answered.content[0].text == expected["choices"][0]["message"]["content"]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "multiply"}])
def test_a_forced_tool_choice_is_a_tool_use(client: anthropic.Anthropic, choice: dict[str, str]) -> None:
    """``any`` and a named tool force a call as the OpenAI route's ``required`` and named function do: a
    grammar from the answer's first token (this vocabulary has no <tool_call> token, which only the lazy
    grammar needs), whole and streamed alike."""
    side = {"type": "string", "enum": ["heads", "tails"]}
    schema = {
        "type": "object",
        "properties": {"side": side},
        "required": ["side"],
        "additionalProperties": False,
    }
    request = {
        "model": "ead",
        "max_tokens": 300,
        "messages": ASK,
        "tools": [TOOL, {"name": "flip", "input_schema": schema}],
    }
    request |= {"tool_choice": {**choice, "disable_parallel_tool_use": True}}
    whole = client.messages.create(**request)
    assert whole.stop_reason == "tool_use", whole
    (call,) = whole.content
    assert call.type == "tool_use" and call.name in ("multiply", choice.get("name", "flip"))
    if call.name == "multiply":
        assert set(call.input) == {"a", "b"} and all(type(value) is int for value in call.input.values())
    else:
        assert call.input in ({"side": "heads"}, {"side": "tails"})
    with client.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [(block.type, block.name, block.input) for block in streamed.content] == [
        ("tool_use", call.name, call.input)
    ]


def test_the_key_is_taken_as_x_api_key_or_bearer(server: Server) -> None:
    body = {"model": "ead", "max_tokens": 2, "messages": HI}
    assert post(server, "/v1/messages", body).status_code == 200
    assert (
        post(server, "/v1/messages", body, **{"x-api-key": ""}, Authorization=f"Bearer {KEY}").json()["type"]
        == "message"
    )
    refused = post(server, "/v1/messages", body, **{"x-api-key": "wrong"})
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    refused_client = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        refused_client.messages.create(**body)
    # one key check for every route, as llama-server's: x-api-key on OpenAI's too, OpenAI's error there
    assert httpx.get(f"{server.base_url}/models", headers={"x-api-key": KEY}).status_code == 200
    refused = httpx.get(f"{server.base_url}/models", headers={"x-api-key": "wrong"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_the_anthropic_client_lists_and_retrieves_the_model_in_its_shape(client: anthropic.Anthropic) -> None:
    """The SDK's ``models.list()`` and ``models.retrieve()`` read Anthropic's ModelInfo (``type``,
    ``display_name``, ``created_at``) and its page (``has_more``, ``first_id``, ``last_id``): all had been
    None, OpenAI's fields alone. The one entry carries both shapes; the context bounds its tokens."""
    [listed] = client.models.list()
    assert listed == client.models.retrieve("ead")
    assert (listed.id, listed.type, listed.display_name) == ("ead", "model", "ead")
    assert listed.created_at == datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)  # OpenAI's 0
    # a prompt takes all but a token of the context, and an answer all but the prompt's one at least
    assert listed.max_input_tokens == listed.max_tokens == int(CTX[1]) - 1
    page = client.models.with_raw_response.list().http_response.json()
    assert (page["has_more"], page["first_id"], page["last_id"]) == (False, "ead", "ead")


@pytest.mark.parametrize(
    ("body", "status", "kind", "fragment"),
    [
        ({"model": "claude-sonnet-4-6", "messages": HI}, 404, "not_found_error", "--any-model"),
        ({"model": "ead"}, 400, "invalid_request_error", "messages: Field required"),
        (
            {"model": "ead", "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "invalid_request_error",
            "messages.0.content.0: image blocks are not supported",
        ),
        (
            {"model": "ead", "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            400,
            "invalid_request_error",
            "messages.0.content.0: document blocks",
        ),
        (
            {"model": "ead", "messages": [{"role": "user", "content": [{"type": "tool_use", "input": {}}]}]},
            400,
            "invalid_request_error",
            "messages.0.content.0: a tool_use block in a user's message is not supported",
        ),
        (
            {"model": "ead", "system": [{"type": "tool_result"}], "messages": HI},
            400,
            "invalid_request_error",
            "system.0: a tool_result block in the system prompt is not supported",
        ),
        (
            {"model": "ead", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            400,
            "invalid_request_error",
            "messages.0.content.0: a text block needs its text",
        ),
        (
            {"model": "ead", "messages": [{"role": "tool", "content": "x"}]},
            400,
            "invalid_request_error",
            "messages.0.role",
        ),
        (
            {
                "model": "ead",
                "messages": HI,
                "tools": [TOOL],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            400,
            "invalid_request_error",
            "tool_choice: the function 'nope' is not among the tools offered",
        ),
        (
            {"model": "ead", "messages": HI, "tools": [TOOL], "tool_choice": {"type": "tool"}},
            400,
            "invalid_request_error",
            "tool_choice.name",
        ),
        (
            {
                "model": "ead",
                "messages": HI,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            400,
            "invalid_request_error",
            "tools.0.type",
        ),
        (
            {"model": "ead", "messages": HI, "stop_sequences": ["x"] * 17},
            400,
            "invalid_request_error",
            "stop_sequences",
        ),
        ({"model": "ead", "messages": HI, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
        (
            {"model": "ead", "messages": HI, "thinking": {"type": "on"}},
            400,
            "invalid_request_error",
            "thinking.type",
        ),
        (
            {"model": "ead", "messages": [*HI, {"role": "assistant", "content": [{"type": "thinking"}]}]},
            400,
            "invalid_request_error",
            "messages.1.content.0: a thinking block needs its thinking",
        ),
        (
            {
                "model": "ead",
                "messages": HI,
                "output_config": {"format": {"type": "json_schema", "schema": {"$ref": "#/x"}}},
            },
            400,
            "invalid_request_error",
            "output_config.format",
        ),
    ],
)
def test_bad_requests_get_anthropics_error_object(
    server: Server, body: dict[str, Any], status: int, kind: str, fragment: str
) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        before = server.log().count("\n")
        reply = post(server, path, {"max_tokens": 2, **body})
        assert reply.status_code == status, reply.text
        error = reply.json()
        assert error["type"] == "error" and error["error"]["type"] == kind, error
        assert "\n" not in error["error"]["message"] and fragment in error["error"]["message"], error
        assert server.log().count("\n") == before + 1  # one line
    assert post(server, "/v1/messages", {"model": "ead", "max_tokens": 2, "messages": HI}).status_code == 200
    assert "Traceback" not in server.log()


def test_the_guards_refusals_on_its_paths_are_anthropics_too(server: Server) -> None:
    reply = httpx.post(
        f"{server.url}/v1/messages", content=b"{}", headers={"Content-Type": "text/plain", "x-api-key": KEY}
    )
    assert reply.status_code == 415 and reply.json()["error"]["type"] == "invalid_request_error"
    head, body = exchange(server, b"POST /v1/messages HTTP/2.0\r\nHost: HOST\r\n\r\n")  # the protocol's
    assert head[0].startswith(b"HTTP/1.1 505") and json.loads(body)["error"]["type"] == "api_error"
    cut = _stream_end(ApiError(503, "the server is stopping", kind="server_error"), "/v1/messages")
    assert cut.startswith(b"event: error\r\n")
    data = json.loads(cut.split(b"data: ", 1)[1])
    assert data == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the server is stopping"},
    }


def test_a_format_no_answer_meets_ends_a_stream_with_an_error_event(server: Server) -> None:
    """A failure mid-answer (a schema that allows no token) ends the stream with Anthropic's ``error``
    event, naming the field as the request spelled it; whole, it is a 400; the server serves on."""
    never = {"format": {"type": "json_schema", "schema": {"pattern": "^[b-a]$"}}}
    body = {"model": "ead", "max_tokens": 8, "messages": HI, "output_config": never}
    read = events(server, body)
    assert [name for name, _ in read][:2] == ["message_start", "ping"]
    name, error = read[-1]
    assert name == "error" and error["error"]["type"] == "invalid_request_error"
    assert (
        "output_config.format" in error["error"]["message"] and "allows no token" in error["error"]["message"]
    )
    whole = post(server, "/v1/messages", body)
    assert whole.status_code == 400 and whole.json()["error"]["message"] == error["error"]["message"]
    assert post(server, "/v1/messages", {"model": "ead", "max_tokens": 2, "messages": HI}).status_code == 200


def test_an_answer_a_stop_sequence_ends_at_once_has_no_content(client: anthropic.Anthropic) -> None:
    """An empty answer is a message of no content blocks, whole and streamed alike (as llama-server's)."""
    request = {"model": "ead", "messages": HI, "max_tokens": 8}
    stop = client.messages.create(**request).content[0].text[:1]
    whole = client.messages.create(**request, stop_sequences=[stop])
    assert whole.content == [] and whole.stop_reason == "stop_sequence" and whole.stop_sequence == stop
    with client.messages.stream(**request, stop_sequences=[stop]) as stream:
        streamed = stream.get_final_message()
    assert streamed.content == [] and streamed.stop_sequence == stop


@pytest.mark.real
def test_claude_codes_way_round_trip_on_the_real_pair(real_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """As Claude Code asks (a Claude model's name, --any-model; ANTHROPIC_AUTH_TOKEN's Bearer key; the
    system prompt as text blocks with cache_control): a tool_use for the question, whole and streamed the
    same, then the answer to its tool_result, which states the product; both models write along the
    way."""
    args = [*pair_args(real_pair), "--mode", "ead", "--any-model", "--api-key", KEY]
    with Server(args, tmp_path / "server.log") as server:
        client = anthropic.Anthropic(base_url=server.url, auth_token=KEY, max_retries=0, timeout=600)
        system = [{"type": "text", "text": QUESTION[0]["content"], "cache_control": {"type": "ephemeral"}}]
        request = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 60,
            "system": system,
            "messages": QUESTION[1:],
            "tools": [TOOL],
        }
        asked = client.messages.create(**request)
        assert asked.model == "claude-sonnet-4-6" and asked.stop_reason == "tool_use"
        (call,) = [block for block in asked.content if block.type == "tool_use"]
        assert call.name == "multiply" and call.input == {"a": 1234, "b": 5678}
        with client.messages.stream(**request) as stream:
            streamed = stream.get_final_message()
        assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [
            (call.name, call.input)
        ]

        result = {"type": "tool_result", "tool_use_id": call.id, "content": str(1234 * 5678)}
        turn = [
            *QUESTION[1:],
            {"role": "assistant", "content": asked.content},
            {"role": "user", "content": [result]},
        ]
        answer = client.messages.create(**{**request, "messages": turn})
        assert answer.stop_reason == "end_turn"
        assert "7006652" in answer.content[0].text.replace(",", "")
        assert {token["model"] for token in answer.model_extra["ead"]["tokens"]} == {"small", "large"}
        assert server.stop() == 0


def test_curl_streams_the_named_events(server: Server) -> None:
    """``curl -N`` as the API's docs show it: x-api-key and anthropic-version, the events as they come."""
    body = json.dumps({"model": "ead", "max_tokens": 3, "stream": True, "messages": HI})
    headers = [f"x-api-key: {KEY}", "anthropic-version: 2023-06-01", "content-type: application/json"]
    streamed = subprocess.run(
        ["curl", "-sN", f"{server.url}/v1/messages", *(f"-H{header}" for header in headers), "-d", body],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    names = [line.removeprefix("event: ") for line in streamed.splitlines() if line.startswith("event: ")]
    assert names == one_text_block(3)


def test_a_system_message_among_the_turns_is_taken_as_claude_code_sends_it(server: Server) -> None:
    """Claude Code 2.1's first request (its beta ``mid-conversation-system``) puts a ``system`` message after
    the user's, a string, the user's text in blocks with ``cache_control``: the chat request with the
    system message where it stands, the same answer and count."""
    user = [
        {"type": "text", "text": "<system-reminder>\nToday's date is 2026-11-27.\n</system-reminder>\n\n"},
        {"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}},
    ]
    later = "Available agent types for the Agent tool:\n- claude: Catch-all."
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": user}, {"role": "system", "content": later}]
    expected = openai_chat(
        server,
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user[0]["text"] + user[1]["text"]},
            {"role": "system", "content": later},
        ],
        temperature=0,
        max_tokens=8,
    )
    request = {"model": "ead", "max_tokens": 8, "system": system, "messages": messages}
    reply = post(server, "/v1/messages", request, **{"anthropic-beta": "mid-conversation-system-2026-04-07"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"] == [{"type": "text", "text": expected["choices"][0]["message"]["content"]}]
    counted = post(server, "/v1/messages/count_tokens", request)
    assert counted.json() == {"input_tokens": expected["usage"]["prompt_tokens"]}
