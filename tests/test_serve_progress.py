"""A stream kept alive while its prompt is read, and while its answer is held back: a real `ead serve` on
the tiny pair (its small model's template renders tools) that reads every prompt whole (--no-reuse) in
batches of 512 tokens, with --ping-interval 0 (a keep-alive event at every batch, and at every token that
sends nothing), so a prompt of a few thousand tokens shows its events at once. Anthropic's pings, the
Responses API's response.in_progress and llama-server's prompt_progress (asked for) come before the first
token, the real clients read them without a complaint, and the answers are those of the same request
whole. A second server keeps streams alive on a timer (--ping-interval 0.1): a stream waiting in the queue
behind a long generation gets its keep-alive events while it waits, before its first token."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, JSON, LONG, TAU, serving
from test_serve_safety import wait_until
from test_serve_tools import TOOLS_TEMPLATE
from tiny_models import write_tiny_model

BATCH = 512  # llama.cpp's batch, ead's default
LONG_TEXT = "Summarise the following notes, line by line.\n" + "".join(
    f"Note {n}: the tide at the harbour rose {n % 7} feet, wörld 日本.\n" for n in range(40)
)
MAX_TOKENS = 12
# Tools offered and an answer that is a JSON object but no call: the tool-call reader holds it to its end
HELD_TOOL = {"name": "multiply", "description": "a times b", "parameters": {"type": "object"}}
# Each route's keep-alive event and a token's text delta
PINGS = ("ping", "content_block_delta")
IN_PROGRESS = ("response.in_progress", "response.output_text.delta")
NOTE_SCHEMA = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve-progress")
    small = write_tiny_model(folder / "tools.gguf", seed=0, chat_template=TOOLS_TEMPLATE)
    args = [*pair_args((small, tiny_pair[1])), *TAU, *CTX, "--no-reuse", "--ping-interval", "0"]
    with serving(args, folder / "server.log") as running:
        yield running


def messages(text: str = LONG_TEXT) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def whole_chat(server: Server) -> dict[str, Any]:
    body = {"messages": messages(), "max_tokens": MAX_TOKENS, "temperature": 0}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def batches(prompt_tokens: int) -> list[int]:
    """The tokens read after each batch of a prompt read whole."""
    return [*range(BATCH, prompt_tokens, BATCH), prompt_tokens]


def readings(count: int, prompt_tokens: int) -> int:
    """How many models read the prompt whole before the first token, from the ``count`` of its batches
    told: one, or both where the small model's first entropy passes --tau."""
    assert count in (len(batches(prompt_tokens)), 2 * len(batches(prompt_tokens)))
    return count // len(batches(prompt_tokens))


def shown(events: list[tuple[str | None, Any]], delta: str) -> int:
    """The tokens that showed text: each sends one ``delta`` with its ``ead`` fields (one held back, or
    half a character, sends nothing)."""
    return sum(1 for name, data in events if name == delta and "ead" in data)


def batches_told(events: list[tuple[str | None, Any]], kinds: tuple[str, str], generated: int) -> int:
    """The keep-alive events a stream sent for the prompt's batches read (``kinds``: the route's keep-alive
    event and text delta): all but the first (at the stream's start) and those for the tokens of the
    ``generated`` that showed nothing."""
    keep_alive, delta = kinds
    return [name for name, _ in events].count(keep_alive) - 1 - (generated - shown(events, delta))


def sse(
    server: Server, path: str, body: dict[str, Any], read: list[tuple[str | None, Any]] | None = None
) -> list[tuple[str | None, Any]]:
    """A stream's events as they come: each its ``event:`` name (None where it has none) and its data,
    appended to ``read`` (another thread may watch it) as each is read."""
    read = [] if read is None else read
    with httpx.stream("POST", f"{server.url}{path}", json=body, headers=JSON, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        name = None
        for line in reply.iter_lines():
            if line.startswith("event:"):
                name = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data = line.removeprefix("data:").strip()
                read.append((name, data if data == "[DONE]" else json.loads(data)))
                name = None
    return read


def test_chat_completions_prompt_progress_only_when_asked_before_the_first_token(server: Server) -> None:
    expected = whole_chat(server)
    prompt_tokens = expected["usage"]["prompt_tokens"]
    assert prompt_tokens > 3 * BATCH  # read in several batches
    body = {"messages": messages(), "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}

    plain = [data for _, data in sse(server, "/v1/chat/completions", body)]
    assert not any("prompt_progress" in chunk for chunk in plain[:-1])

    chunks = [data for _, data in sse(server, "/v1/chat/completions", {**body, "return_progress": True})]
    first_token = next(i for i, chunk in enumerate(chunks) if "ead" in chunk)
    progress = [chunk["prompt_progress"] for chunk in chunks[:first_token]]
    assert len(progress) == first_token  # nothing else before the first token
    models = readings(len(progress), prompt_tokens)
    assert [(p["processed"], p["total"], p["cache"]) for p in progress] == [
        (read, prompt_tokens, 0) for read in batches(prompt_tokens) * models
    ]
    assert all(isinstance(p["time_ms"], int) for p in progress)
    assert chunks[0]["object"] == "chat.completion.chunk" and chunks[0]["choices"][0]["delta"] == {
        "role": "assistant"
    }

    def text(stream: list[Any]) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in stream[:-1] if c["choices"])

    assert text(chunks) == text(plain) == expected["choices"][0]["message"]["content"]

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    parsed = list(
        client.chat.completions.create(
            model="ead",
            messages=messages(),
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            extra_body={"return_progress": True},
        )
    )
    told = [c.model_extra["prompt_progress"]["processed"] for c in parsed[:first_token]]
    assert told == batches(prompt_tokens) * models
    assert "".join(c.choices[0].delta.content or "" for c in parsed if c.choices) == text(plain)


def test_anthropic_pings_while_the_prompt_is_read(server: Server) -> None:
    expected = whole_chat(server)
    prompt_tokens = expected["usage"]["prompt_tokens"]
    request = {"model": "ead", "max_tokens": MAX_TOKENS, "messages": messages()}

    events = sse(server, "/v1/messages", {**request, "stream": True})
    names = [name for name, _ in events]
    first_token = names.index("content_block_start")
    # message_start and a ping at once, then a ping for each batch read (and for each token that showed
    # nothing)
    assert names[:2] == ["message_start", "ping"] and set(names[2:first_token]) == {"ping"}
    generated = events[names.index("message_delta")][1]["usage"]["output_tokens"]
    readings(batches_told(events, PINGS, generated), prompt_tokens)

    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    with client.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == expected["choices"][0]["message"]["content"] == final.content[0].text
    assert final.usage.input_tokens == prompt_tokens


def test_responses_in_progress_while_the_prompt_is_read(server: Server) -> None:
    expected = whole_chat(server)
    prompt_tokens = expected["usage"]["prompt_tokens"]
    body = {"model": "ead", "input": LONG_TEXT, "max_output_tokens": MAX_TOKENS, "temperature": 0}

    events = sse(server, "/v1/responses", {**body, "stream": True})
    names = [name for name, _ in events]
    first_item = names.index("response.output_item.added")
    # created and in progress at once, then in progress again for each batch read (and for each token
    # that showed nothing)
    assert names[:2] == ["response.created", "response.in_progress"]
    assert set(names[2:first_item]) == {"response.in_progress"}
    generated = events[-1][1]["response"]["usage"]["output_tokens"]
    readings(batches_told(events, IN_PROGRESS, generated), prompt_tokens)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    parsed = list(client.responses.create(**body, stream=True))
    assert [event.type for event in parsed[:first_item]] == names[:first_item]
    assert parsed[-1].type == "response.incomplete"  # the token limit
    assert parsed[-1].response.output_text == expected["choices"][0]["message"]["content"]


def test_anthropic_pings_while_the_answer_is_held(server: Server) -> None:
    tool = {
        "name": HELD_TOOL["name"],
        "description": HELD_TOOL["description"],
        "input_schema": {"type": "object"},
    }
    request = {
        "model": "ead",
        "max_tokens": MAX_TOKENS,
        "messages": messages("hi"),
        "tools": [tool],
        "output_config": {"format": {"type": "json_schema", "schema": NOTE_SCHEMA}},
    }
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    expected = client.messages.create(**request)
    (block,) = expected.content
    assert block.type == "text" and block.text.startswith("{")  # held to its end: a text, not a call

    events = sse(server, "/v1/messages", {**request, "stream": True})
    names = [name for name, _ in events]
    first_block = names.index("content_block_start")
    # message_start and a ping at once, a ping for the prompt read (by one model or both), and one for
    # each token of the answer held
    assert names[:2] == ["message_start", "ping"] and set(names[2:first_block]) == {"ping"}
    assert shown(events, "content_block_delta") == 0
    readings(batches_told(events, PINGS, expected.usage.output_tokens), expected.usage.input_tokens)
    assert (
        "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == block.text
    )

    with client.messages.stream(**request) as stream:
        assert "".join(stream.text_stream) == block.text


def test_responses_in_progress_while_the_answer_is_held(server: Server) -> None:
    body = {
        "model": "ead",
        "input": "hi",
        "tools": [{"type": "function", **HELD_TOOL}],
        "text": {"format": {"type": "json_schema", "name": "note", "schema": NOTE_SCHEMA}},
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    expected = client.responses.create(**body)
    (item,) = expected.output
    assert item.type == "message" and expected.output_text.startswith("{")  # held to its end: no call

    events = sse(server, "/v1/responses", {**body, "stream": True})
    names = [name for name, _ in events]
    first_item = names.index("response.output_item.added")
    # created and in progress at once, in progress for the prompt read (by one model or both), and for
    # each token of the answer held
    assert names[:2] == ["response.created", "response.in_progress"]
    assert set(names[2:first_item]) == {"response.in_progress"}
    assert expected.usage is not None
    assert shown(events, "response.output_text.delta") == 0
    readings(batches_told(events, IN_PROGRESS, expected.usage.output_tokens), expected.usage.input_tokens)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))

    parsed = list(client.responses.create(**body, stream=True))
    assert [event.type for event in parsed] == names
    assert parsed[-1].response.output_text == expected.output_text


def test_ollama_streams_nothing_before_the_first_token(server: Server) -> None:
    expected = whole_chat(server)
    body = {"model": "ead", "messages": messages(), "options": {"num_predict": MAX_TOKENS, "temperature": 0}}
    with httpx.stream("POST", f"{server.url}/api/chat", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        lines = [json.loads(line) for line in reply.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * MAX_TOKENS + [True]
    assert (
        "".join(line["message"]["content"] for line in lines) == expected["choices"][0]["message"]["content"]
    )


@pytest.fixture(scope="module")
def timed_server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Keep-alive events on a timer, every 0.1 s with none sent; every prompt read whole (--no-reuse), so
    a stream's answer is its request's whole one."""
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--no-reuse", "--ping-interval", "0.1"]
    with serving(args, tmp_path_factory.mktemp("serve-timer") / "server.log") as running:
        yield running


QUEUED = {  # each route's short greedy request, and its keep-alive event and text delta
    "/v1/messages": ({"model": "ead", "messages": messages("hi"), "max_tokens": MAX_TOKENS}, PINGS),
    "/v1/responses": ({"model": "ead", "input": "hi", "max_output_tokens": MAX_TOKENS}, IN_PROGRESS),
}


def streamed(server: Server, path: str, body: dict[str, Any], read: list[tuple[str | None, Any]]) -> None:
    """A stream's events appended to ``read`` as they come: on /v1/responses as the openai client reads
    them (its keep-alive events typed among them); on /v1/messages as sent (the anthropic client drops
    pings)."""
    if path == "/v1/messages":
        sse(server, path, {**body, "stream": True}, read)
        return
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    for event in client.responses.create(**body, stream=True):
        read.append((event.type, event.to_dict()))


@pytest.mark.parametrize("path", list(QUEUED))
def test_a_stream_waiting_in_the_queue_is_kept_alive(timed_server: Server, path: str) -> None:
    """Queued behind a long generation, where the engine sends it nothing, a stream gets its route's
    keep-alive event while it waits (its head's at once, then the timer's); its answer is unchanged, and
    the openai client reads the Responses stream."""
    server = timed_server
    body, (keep_alive, delta) = QUEUED[path]
    body = {**body, "temperature": 0}
    long = {"model": "ead", "messages": messages("hi"), "max_tokens": LONG, "stream": True}
    events: list[tuple[str | None, Any]] = []
    with httpx.stream("POST", f"{server.url}/v1/messages", json=long, headers=JSON, timeout=120) as first:
        lines = first.iter_lines()  # kept: a reader dropped closes the stream
        next(line for line in lines if "text_delta" in line)  # generating
        with ThreadPoolExecutor(1) as waiter:
            waiting = waiter.submit(streamed, server, path, body, events)
            wait_until(lambda: [name for name, _ in events].count(keep_alive) >= 3, 60)
            # the keep-alive events came while it waited: the long one still generates
            assert httpx.get(f"{server.url}/health").json()["waiting"] == 1
            first.close()  # leaves: the waiting one's turn
            waiting.result(timeout=120)
    names = [name for name, _ in events]
    first_token = next(i for i, (name, data) in enumerate(events) if name == delta and "ead" in data)
    assert names[:first_token].count(keep_alive) >= 3
    texts = [data["delta"] for name, data in events if name == delta]
    if path == "/v1/messages":
        assert set(names[1 : names.index("content_block_start")]) == {"ping"}
        answer = "".join(text["text"] for text in texts)
        whole = httpx.post(f"{server.url}{path}", json=body, headers=JSON, timeout=120).json()
        assert answer == whole["content"][0]["text"]
    else:
        assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
        assert "".join(texts) == client.responses.create(**body).output_text
