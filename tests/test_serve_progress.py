"""A long prompt's stream kept alive while it is read: a real `ead serve` on the tiny pair that reads every
prompt whole (--no-reuse) in batches of 512 tokens, with --ping-interval 0 (a keep-alive event at every
batch), so a prompt of a few thousand tokens shows its events at once. Anthropic's pings, the Responses
API's response.in_progress and llama-server's prompt_progress (asked for) come before the first token,
the real clients read them without a complaint, and the answers are those of the same request whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, JSON, TAU, serving

BATCH = 512  # llama.cpp's batch, ead's default
LONG_TEXT = "Summarise the following notes, line by line.\n" + "".join(
    f"Note {n}: the tide at the harbour rose {n % 7} feet, wörld 日本.\n" for n in range(40)
)
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--no-reuse", "--ping-interval", "0"]
    with serving(args, tmp_path_factory.mktemp("serve-progress") / "server.log") as running:
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


def sse(server: Server, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """A stream's events as they come: each its ``event:`` name (None where it has none) and its data."""
    read: list[tuple[str | None, Any]] = []
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
    # message_start and a ping at once, then a ping for each batch read
    assert names[:2] == ["message_start", "ping"] and set(names[2:first_token]) == {"ping"}
    readings(first_token - 2, prompt_tokens)

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
    # created and in progress at once, then in progress again for each batch read
    assert names[:2] == ["response.created", "response.in_progress"]
    assert set(names[2:first_item]) == {"response.in_progress"}
    readings(first_item - 2, prompt_tokens)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))

    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    parsed = list(client.responses.create(**body, stream=True))
    assert [event.type for event in parsed[:first_item]] == names[:first_item]
    assert parsed[-1].type == "response.incomplete"  # the token limit
    assert parsed[-1].response.output_text == expected["choices"][0]["message"]["content"]


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
