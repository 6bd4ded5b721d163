"""A reply's text and calls in the order the model wrote them, on every route, whole and streamed: a tiny
pair scripted to write text, a call, a second call whose arguments hold ``NaN`` (Python's json reads it,
JSON has no such value), and text again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import ollama
import openai
import pytest
from bench_serve import TOOLS
from serve_process import Server
from test_cli import pair_args
from test_serve import serving
from test_serve_responses import FLAT_TOOLS
from test_serve_tools import TOOLS_TEMPLATE
from tiny_models import CALL_TOKEN, NAN_CALL_TOKEN, write_scripted_pair

# (from "Ċ", the prompt's last token)
SCRIPT = ["Ċ", "H", "i", CALL_TOKEN, "Ġ", NAN_CALL_TOKEN, "O", "k", "<|im_end|>"]
ASK = [{"role": "user", "content": "What is 6 times 7?"}]
# NaN is where the second call's arguments stop being JSON: they are closed there, the key before it left out
CALLS = [("multiply", {"a": 6, "b": 7}), ("multiply", {})]
# The items in order: the space between the calls is no text of its own
ORDERED = [("text", "Hi"), ("call", CALLS[0]), ("call", CALLS[1]), ("text", "Ok")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve-order")
    pair = write_scripted_pair(folder, "order", TOOLS_TEMPLATE, SCRIPT)
    with serving([*pair_args(pair), "--max-tokens", "32"], folder / "server.log") as running:
        yield running


def strict(text: str) -> Any:
    """``text`` read as JSON, which has no NaN nor Infinity (Python's json reads them)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def response_items(items: list[Any]) -> list[tuple[str, Any]]:
    """Responses output items as (kind, text or the call's name and arguments)."""
    return [
        ("text", "".join(part.text for part in item.content))
        if item.type == "message"
        else ("call", (item.name, strict(item.arguments)))
        for item in items
    ]


def message_blocks(blocks: list[Any]) -> list[tuple[str, Any]]:
    """Anthropic content blocks as (kind, text or the call's name and input)."""
    return [
        ("text", block.text) if block.type == "text" else ("call", (block.name, block.input))
        for block in blocks
    ]


def test_responses_and_messages_give_text_and_calls_in_order_whole_as_streamed(server: Server) -> None:
    """The whole reply's output items and content blocks are the stream's, in the order written: text, the
    calls, text (the whole reply had put all its text in one message before the calls)."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    asked = {"model": "ead", "input": ASK[0]["content"], "tools": FLAT_TOOLS}
    whole = client.responses.create(**asked)  # type: ignore[call-overload]
    assert response_items(whole.output) == ORDERED
    events = list(client.responses.create(**asked, stream=True))  # type: ignore[call-overload]
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert response_items(done) == ORDERED
    assert [item.status for item in whole.output] == [item.status for item in done]

    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    tools = [{"name": "multiply", "input_schema": TOOLS[0]["function"]["parameters"]}]
    body = {"model": "ead", "max_tokens": 32, "messages": ASK, "tools": tools}
    whole_message = messages.messages.create(**body)  # type: ignore[call-overload]
    assert message_blocks(whole_message.content) == ORDERED
    assert whole_message.stop_reason == "tool_use"
    with messages.messages.stream(**body) as stream:  # type: ignore[arg-type]
        streamed = stream.get_final_message()
    assert message_blocks(streamed.content) == ORDERED


def test_chat_and_ollama_keep_their_shape_one_text_and_the_calls(server: Server) -> None:
    """OpenAI's chat and ollama's have one ``content`` and ``tool_calls`` apart: the text around the calls
    joined, whole and streamed alike."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    whole = client.chat.completions.create(model="ead", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    message = whole.choices[0].message
    assert message.content == "Hi Ok"
    calls = [(call.function.name, strict(call.function.arguments)) for call in message.tool_calls or []]
    assert calls == CALLS
    chunks = client.chat.completions.create(model="ead", messages=ASK, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    content, arguments = "", {0: "", 1: ""}
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or []:
            arguments[piece.index] += piece.function.arguments or ""  # type: ignore[union-attr]
    assert content.strip() == "Hi Ok"
    assert [strict(text) for text in arguments.values()] == [arguments for _, arguments in CALLS]

    local = ollama.Client(host=server.url, timeout=60)
    said = local.chat(model="ead", messages=ASK, tools=TOOLS)
    assert said.message.content == "Hi Ok"
    assert [(c.function.name, dict(c.function.arguments)) for c in said.message.tool_calls or []] == CALLS
    lines = list(local.chat(model="ead", messages=ASK, tools=TOOLS, stream=True))
    assert "".join(line.message.content or "" for line in lines).strip() == "Hi Ok"
    streamed = [call for line in lines for call in line.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == CALLS
