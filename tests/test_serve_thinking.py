"""A thinking model on `ead serve`: a real server on a tiny pair whose template opens a ``<think>`` block in
the prompt (as DeepSeek-R1's does) and reads ``enable_thinking`` (as Qwen3's does). A logit bias on
``</think>`` makes the tiny models close the block partway through a greedy answer; the raw text of the
same request (``reasoning_format: none``) is what the split is checked against."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from bench_serve import TOOLS
from serve_process import Server
from test_cli import pair_args
from test_serve import CHROMIUM, HI, JSON, PRESS_ENTER, TAU, open_page, serving
from test_serve_fim import wait_loaded
from test_serve_responses import FLAT_TOOLS, collapsed
from test_serve_tools import FLIP, PICK, assert_one_bound_pick
from test_thinking import OWN_BLOCK_TEMPLATE, generate
from tiny_models import BARE_OPENING, CALL_TOKEN, THINKING_TOOLS_TEMPLATE, vocabulary, write_scripted_pair

from ead_cli.bench import native
from ead_cli.remote import built_server

CLOSE_ID = vocabulary("think")[0].index("</think>")
# The server's defaults: greedy, and </think> favoured, so that it comes ~10 tokens into the answer to
# "hi" and text follows it (on the routes of ollama too, which have no logit bias of their own)
CLOSING = ["--temp", "0", "--max-tokens", "32", "--logit-bias", f"{CLOSE_ID}+5"]
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(tiny_think_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve-thinking") / "server.log"
    with serving([*pair_args(tiny_think_pair), *TAU, *CLOSING], log) as running:
        yield running


def chat(server: Server, **body: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI, **body}, timeout=120)


def message(server: Server, **body: Any) -> dict[str, Any]:
    reply = chat(server, **body)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]


@pytest.fixture(scope="module")
def raw(server: Server) -> str:
    """The answer's text as the model wrote it: the block is opened by the prompt, closed in the text."""
    unsplit = message(server, reasoning_format="none")
    assert "reasoning_content" not in unsplit
    text = unsplit["content"]
    assert "</think>" in text and text.partition("</think>")[2].strip()  # a block that closes, then an answer
    return text


def test_chat_gives_the_reasoning_apart_as_llama_servers_default_format(server: Server, raw: str) -> None:
    reasoning, _, content = raw.partition("</think>")
    for asked in ({}, {"reasoning_format": "auto"}, {"reasoning_format": "deepseek"}):
        answer = message(server, **asked)
        assert answer["reasoning_content"] == reasoning.strip()
        assert answer["content"] == content.lstrip()


def test_a_stream_gives_reasoning_deltas_then_content_deltas(server: Server, raw: str) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(model="ead", messages=HI, stream=True)  # type: ignore[arg-type]
    kinds, reasoning, content = [], "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        piece = (delta.model_extra or {}).get("reasoning_content")
        if piece:
            reasoning, kinds = reasoning + piece, [*kinds, "reasoning"]
        if delta.content:
            content, kinds = content + delta.content, [*kinds, "content"]
    before, _, after = raw.partition("</think>")
    assert (reasoning, content) == (before.strip(), after.lstrip())
    assert kinds == sorted(kinds, key=["reasoning", "content"].index) and len(set(kinds)) == 2


def test_an_answer_cut_inside_the_block_is_all_reasoning(server: Server, raw: str) -> None:
    answer = message(server, max_tokens=4)
    assert answer["content"] == "" and answer["reasoning_content"]
    assert raw.lstrip().startswith(answer["reasoning_content"])


def test_thinking_turned_off_through_the_template(server: Server) -> None:
    """``enable_thinking: false``: the template closes an empty block in the prompt, so the answer starts
    past it and is all content, the same text as the one unsplit."""
    prompt = httpx.post(f"{server.url}/apply-template", json={"messages": HI, **THINKING_OFF}).json()[
        "prompt"
    ]
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    off = message(server, **THINKING_OFF)
    assert "reasoning_content" not in off
    assert off["content"] == message(server, **THINKING_OFF, reasoning_format="none")["content"]


def test_the_servers_options_are_the_requests_defaults(
    tiny_think_pair: tuple[Path, Path], raw: str, tmp_path: Path
) -> None:
    """``ead serve --reasoning-budget 0 --reasoning-format none``, as llama-server takes them: thinking off
    and the block left in the content unless a request asks otherwise."""
    options = ["--reasoning-budget", "0", "--reasoning-format", "none"]
    with serving([*pair_args(tiny_think_pair), *TAU, *CLOSING, *options], tmp_path / "server.log") as off:
        prompt = httpx.post(f"{off.url}/apply-template", json={"messages": HI}).json()["prompt"]
        assert prompt.endswith("<think>\n\n</think>\n\n")
        assert "reasoning_content" not in message(off)
        on = {"chat_template_kwargs": {"enable_thinking": True}}
        assert message(off, **on)["content"] == raw  # the request's variable over the server's budget
        before, _, after = raw.partition("</think>")
        split = message(off, **on, reasoning_format="auto")
        assert (split["reasoning_content"], split["content"]) == (before.strip(), after.lstrip())
        think = {"model": "ead", "messages": HI, "stream": False, "think": True}  # ollama's, over the format
        thought = httpx.post(f"{off.url}/api/chat", json=think).json()["message"]
        assert (thought["thinking"], thought["content"]) == (before.strip(), after.lstrip())


def test_a_reasoning_budget_closes_the_block_as_generate_does(
    server: Server, tiny_think_pair: tuple[Path, Path], raw: str
) -> None:
    """llama-server's request fields ``reasoning_budget_tokens`` and ``reasoning_budget_message``: the
    answer is ``ead generate --reasoning-budget 3 --reasoning-budget-message``'s for the same prompt, its
    thinking cut short by the message and ``</think>``; a budget the thinking stays within changes nothing,
    and -1 is the server's (unrestricted)."""
    budget = {"reasoning_budget_tokens": 3, "reasoning_budget_message": " Enough."}
    budgeted = message(server, **budget, reasoning_format="none")["content"]
    options = (
        "--reasoning-budget",
        "3",
        "--reasoning-budget-message",
        " Enough.",
        "--reasoning-format",
        "none",
    )
    assert budgeted + "\n" == generate(tiny_think_pair, *options) and " Enough.</think>" in budgeted
    before, _, after = budgeted.partition("</think>")
    split = message(server, **budget)
    assert (split["reasoning_content"], split["content"]) == (before.strip(), after.lstrip())
    for unbudgeted in (30, -1):
        assert message(server, reasoning_budget_tokens=unbudgeted, reasoning_format="none")["content"] == raw


OBJECT = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": OBJECT}}
JSON_FORMATS = ({"type": "json_object"}, SCHEMA_FORMAT)
ROOM = {"max_tokens": 64}  # the thinking's ~10 tokens, then the JSON


def bound_json(text: str) -> dict[str, Any]:
    """The JSON object a content holds, checked against ``OBJECT``."""
    value = json.loads(text)
    assert isinstance(value, dict) and isinstance(value["a"], int), text
    return value


def test_json_mode_binds_the_content_after_the_thinking(server: Server, raw: str) -> None:
    """``response_format`` json_schema on a model whose template opens the block: the block is written
    free, as without a format, so ``reasoning_content`` is the same thinking, and the grammar binds what
    follows ``</think>``: ``content`` is JSON that meets the schema, whole and streamed."""
    thinking = raw.partition("</think>")[0].strip()
    answer = message(server, response_format=SCHEMA_FORMAT, **ROOM)
    assert answer["reasoning_content"] == thinking
    bound_json(answer["content"])
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    said = {"reasoning_content": "", "content": ""}
    for chunk in client.chat.completions.create(
        model="ead", messages=HI, response_format=SCHEMA_FORMAT, stream=True, **ROOM
    ):  # type: ignore[call-overload]
        delta = chunk.choices[0].delta.model_dump() if chunk.choices else {}
        for field in said:
            said[field] += delta.get(field) or ""
    assert said == {"reasoning_content": thinking, "content": answer["content"]}


@pytest.mark.parametrize(
    ("prefill", "state"),
    [
        ("<think>Let me", "a <think> block is open at its end"),  # the prefill opens one and leaves it open
        ("Let me", "a <think> block is open at its end"),  # the template opened it: a prefill is thinking
        ('Let me</think>{"a": ', "it ends a <think> block"),
    ],
)
def test_a_prefill_of_thinking_with_json_mode_is_a_400_that_says_why(
    server: Server, prefill: str, state: str
) -> None:
    """With a format, a prefill is the start of the answer the format binds; thinking is none of it, so a
    prefill that is (or holds) thinking is refused, as llama-server refuses it ("Failed to initialize
    samplers"), in one line that says so, on ollama's route too; without a format it is taken."""
    messages = [*HI, {"role": "assistant", "content": prefill}]
    refused = chat(server, messages=messages, response_format=SCHEMA_FORMAT, **ROOM)
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "message": f"messages.1.content: the assistant prefill holds a thinking model's thinking ({state}), "
        "but with response_format a prefill must start the answer the format binds, as llama-server's "
        "must (it refuses this too): send the thinking without response_format",
        "type": "invalid_request_error",
        "param": "messages.1.content",
        "code": "invalid_value",
    }
    body = {"messages": messages, "format": OBJECT, "stream": False}
    assert ollama(server, "chat", body).json() == {"error": refused.json()["error"]["message"]}
    assert chat(server, messages=messages, **ROOM).status_code == 200


def test_the_servers_reasoning_budget_binds_json_mode_too(
    server: Server, tiny_think_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """``ead serve --reasoning-budget 3`` budgets a request in JSON mode as any other: its thinking is cut
    short by the budget (the answer a request giving ``reasoning_budget_tokens: 3`` gets), then the
    grammar binds the content, as llama-server does; Anthropic's ``output_config.format`` and ollama's
    ``format`` likewise."""
    options = [*pair_args(tiny_think_pair), *TAU, *CLOSING, "--reasoning-budget", "3"]
    with serving(options, tmp_path / "server.log") as budgeted:
        cut_short = message(server, reasoning_budget_tokens=3)["reasoning_content"]
        assert cut_short != message(server)["reasoning_content"]
        for json_mode in JSON_FORMATS:
            answer = message(budgeted, response_format=json_mode, **ROOM)
            assert answer == message(server, response_format=json_mode, reasoning_budget_tokens=3, **ROOM)
            assert answer["reasoning_content"] == cut_short
        bound_json(answer["content"])  # the schema's (json_object's tiny JSON may not end within 64 tokens)
        formatted = {
            "model": "ead",
            **ROOM,
            "messages": HI,
            "output_config": {"format": {"type": "json_schema", "schema": OBJECT}},
        }
        thinking = {"thinking": {"type": "enabled", "budget_tokens": 3}}
        said = [
            httpx.post(f"{each.url}/v1/messages", json=body, timeout=120)
            for each, body in ((budgeted, formatted), (server, {**formatted, **thinking}))
        ]
        assert [reply.status_code for reply in said] == [200, 200], said[0].text
        blocks = said[0].json()["content"]
        assert blocks == said[1].json()["content"] and blocks[0]["thinking"] == cut_short
        bound_json(blocks[1]["text"])
        ollama_json = {"messages": HI, "stream": False, "format": OBJECT, "options": {"num_predict": 64}}
        reply = ollama(budgeted, "chat", ollama_json)
        assert reply.status_code == 200, reply.text
        assert reply.json()["message"]["thinking"] == cut_short
        bound_json(reply.json()["message"]["content"])


def thinking_and_json(base_url: str, stream: bool, **body: Any) -> dict[str, str]:
    """The reasoning and the content one greedy json_schema request gets, through the openai client."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    asked = {"model": "ead", "messages": HI, "temperature": 0, "response_format": SCHEMA_FORMAT, **ROOM}
    said = {"reasoning_content": "", "content": ""}
    answer = client.chat.completions.create(**asked, stream=stream, extra_body=body)  # type: ignore[call-overload]
    parts = (
        [chunk.choices[0].delta for chunk in answer if chunk.choices]
        if stream
        else [answer.choices[0].message]
    )
    for part in parts:
        for field, text in said.items():
            said[field] = text + (part.model_dump().get(field) or "")
    return said


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_json_mode_after_a_models_own_block_is_llama_servers(tmp_path: Path) -> None:
    """A template that leaves the block to the model (Qwen3's way), the model writing ``<think>ok</think>``:
    ead serve's reasoning and JSON are llama-server's on the same model for a json_schema, without a
    budget and with one that cuts the block after its first token, whole and streamed. (On
    ``tiny_think_pair`` the two differ where docs/serve.md says: llama-server's grammar binds the block
    to whole UTF-8 characters, and lets whitespace come before the JSON.)"""
    pair = write_scripted_pair(tmp_path, "own", OWN_BLOCK_TEMPLATE, ["Ċ", "<think>", "o", "k", "</think>"])
    budgets = ({}, {"reasoning_budget_tokens": 1})
    asked = [(budget, stream) for budget in budgets for stream in (False, True)]
    with native.llama_server(pair[1], ["-c", "512", "-t", "1"], tmp_path / "llama-server.log") as peer:
        wait_loaded(peer)
        theirs = [thinking_and_json(f"{peer.url}/v1", stream, **budget) for budget, stream in asked]
    with serving([*pair_args(pair), "--mode", "large"], tmp_path / "server.log") as ours:
        assert [thinking_and_json(ours.base_url, stream, **budget) for budget, stream in asked] == theirs
    assert [said["reasoning_content"] for said in theirs] == ["ok", "ok", "o", "o"]
    for said in theirs:
        bound_json(said["content"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"reasoning_format": "deepseek-legacy"}, "reasoning_format"),
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"messages": []}}, "messages"),  # a variable the template is given already
        ({"reasoning_budget_tokens": -2}, "reasoning_budget_tokens"),
        ({"reasoning_budget_tokens": "3"}, "reasoning_budget_tokens"),
        ({"reasoning_budget_message": 3}, "reasoning_budget_message"),
    ],
)
def test_bad_reasoning_fields_are_400s(server: Server, body: dict[str, Any], param: str) -> None:
    reply = chat(server, **body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    assert message(server, max_tokens=2)["reasoning_content"]  # and the server serves on


def ollama(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/api/{path}", json={"model": "ead", **body}, headers=JSON, timeout=120)


THINKING_AND_CONTENT = ("thinking", "content")


def ndjson(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    reply = ollama(server, path, body)
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines()]


def test_ollama_think_gives_thinking_apart_whole_and_streamed(server: Server, raw: str) -> None:
    """ollama's ``think``: ``message.thinking`` on /api/chat and ``thinking`` on /api/generate, whole and
    in the NDJSON lines (left out, the model's default: thinking); ``think: false`` turns it off through
    the template."""
    before, _, after = raw.partition("</think>")
    split = (before.strip(), after.lstrip())
    assert "thinking" in ollama(server, "show", {}).json()["capabilities"]
    for think in ({"think": True}, {}):
        whole = ollama(server, "chat", {"messages": HI, "stream": False, **think}).json()["message"]
        assert (whole["thinking"], whole["content"]) == split
        lines = ndjson(server, "chat", {"messages": HI, **think})
        said = [
            "".join(line["message"].get(field, "") for line in lines) for field in ("thinking", "content")
        ]
        assert tuple(said) == split
    generated = ollama(server, "generate", {"prompt": "hi", "stream": False, "think": True}).json()
    assert (generated["thinking"], generated["response"]) == split
    lines = ndjson(server, "generate", {"prompt": "hi", "think": True})
    assert (
        tuple("".join(line.get(field, "") for line in lines) for field in ("thinking", "response")) == split
    )
    off = ollama(server, "chat", {"messages": HI, "stream": False, "think": False}).json()["message"]
    assert "thinking" not in off and off["content"] == message(server, **THINKING_OFF)["content"]


def test_ollama_think_levels_are_a_400_in_ollamas_shape(server: Server) -> None:
    reply = ollama(server, "chat", {"messages": HI, "think": "high"})
    assert reply.status_code == 400 and "think: levels" in reply.json()["error"]


def split_of(raw: str) -> tuple[str, str]:
    """The reasoning and the content /v1/chat/completions gives for the raw answer."""
    before, _, after = raw.partition("</think>")
    return before.strip(), after.lstrip()


def test_responses_give_a_reasoning_item_before_the_message_whole_and_streamed(
    server: Server, raw: str
) -> None:
    """As llama-server's: a ``reasoning`` item of one ``reasoning_text`` part, then the message; streamed,
    its ``response.reasoning_text`` deltas before the text's, the same item done in the final Response."""
    reasoning, content = split_of(raw)
    chat_answer = message(server)
    assert (chat_answer["reasoning_content"], chat_answer["content"]) == (reasoning, content)
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    whole = client.responses.create(model="ead", input="hi")
    thought, said = whole.output
    assert thought.type == "reasoning" and said.type == "message"
    assert [(part.type, part.text) for part in thought.content or []] == [("reasoning_text", reasoning)]
    assert thought.summary == [] and whole.output_text == content
    kinds, deltas, done = [], {"reasoning": "", "text": ""}, {}
    for event in client.responses.create(model="ead", input="hi", stream=True):
        if event.type in ("response.reasoning_text.delta", "response.output_text.delta"):
            kind = "reasoning" if "reasoning" in event.type else "text"
            deltas[kind] += event.delta
            kinds.append(kind)
        elif event.type in ("response.reasoning_text.done", "response.output_text.done"):
            done[event.type] = event.text
        elif event.type in ("response.completed", "response.incomplete"):  # the last, with the Response
            final = event.response
    assert deltas == {"reasoning": reasoning, "text": content}
    assert done == {"response.reasoning_text.done": reasoning, "response.output_text.done": content}
    assert kinds == sorted(kinds, key=["reasoning", "text"].index) and len(set(kinds)) == 2
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == reasoning and final.output_text == content
    off = client.responses.create(model="ead", input="hi", extra_body=THINKING_OFF)
    assert [item.type for item in off.output] == ["message"]
    assert off.output_text == message(server, **THINKING_OFF)["content"]


EARLIER_REASONING = "an earlier thought"


def prompt_tokens(server: Server, messages: list[dict[str, Any]]) -> int:
    reply = chat(server, messages=messages, max_tokens=1)
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens"]


def test_earlier_reasoning_sent_back_is_rendered_as_the_template_takes_it(server: Server) -> None:
    """An assistant's ``reasoning_content`` (chat), ``reasoning`` item (Responses: Codex sends them back)
    and ``thinking`` block (Messages: Claude Code does) are the same prompt, the template's block."""
    turns = [*HI, {"role": "assistant", "content": "hello", "reasoning_content": EARLIER_REASONING}, *HI]
    prompt = httpx.post(f"{server.url}/apply-template", json={"messages": turns}).json()["prompt"]
    assert f"<think>\n{EARLIER_REASONING}\n</think>\n\nhello<|im_end|>" in prompt
    counted = prompt_tokens(server, turns)
    assert counted > prompt_tokens(server, [*HI, {"role": "assistant", "content": "hello"}, *HI])
    part = {"type": "reasoning_text", "text": EARLIER_REASONING}
    items = [
        *HI,
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [part], "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
        *HI,
    ]
    reply = httpx.post(f"{server.base_url}/responses", json={"input": items, "max_output_tokens": 1})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["input_tokens"] == counted
    thought = {"type": "thinking", "thinking": EARLIER_REASONING, "signature": "sig"}
    said = [*HI, {"role": "assistant", "content": [thought, {"type": "text", "text": "hello"}]}, *HI]
    body = {"model": "ead", "max_tokens": 1, "messages": said}
    assert httpx.post(f"{server.url}/v1/messages/count_tokens", json=body).json()["input_tokens"] == counted


def test_messages_give_thinking_blocks_before_the_text_whole_and_streamed(server: Server, raw: str) -> None:
    """As llama-server's: a ``thinking`` block (its signature empty) before the text block; streamed, a
    thinking block of ``thinking_delta``s and a ``signature_delta``, then the text block."""
    reasoning, content = split_of(raw)
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    whole = client.messages.create(model="ead", max_tokens=32, messages=HI)  # type: ignore[arg-type]
    assert [block.model_dump() for block in whole.content] == [
        {"type": "thinking", "thinking": reasoning, "signature": ""},
        {"type": "text", "text": content, "citations": None},
    ]
    started, deltas = [], {"thinking_delta": "", "text_delta": "", "signature_delta": ""}
    stream = client.messages.create(model="ead", max_tokens=32, messages=HI, stream=True)  # type: ignore[arg-type]
    for event in stream:
        if event.type == "content_block_start":
            started.append((event.index, event.content_block.type))
        elif event.type == "content_block_delta":
            field = {"thinking_delta": "thinking", "text_delta": "text", "signature_delta": "signature"}
            deltas[event.delta.type] += getattr(event.delta, field[event.delta.type])
    assert started == [(0, "thinking"), (1, "text")]
    assert deltas == {"thinking_delta": reasoning, "text_delta": content, "signature_delta": ""}
    enabled = {"type": "enabled", "budget_tokens": 1024}
    on = client.messages.create(model="ead", max_tokens=32, messages=HI, thinking=enabled)  # type: ignore[arg-type]
    assert on.content == whole.content
    off = client.messages.create(
        model="ead",
        max_tokens=32,
        messages=HI,
        thinking={"type": "disabled"},  # type: ignore[arg-type]
    )
    assert [block.model_dump() for block in off.content] == [
        {"type": "text", "text": message(server, **THINKING_OFF)["content"], "citations": None}
    ]


def test_messages_thinking_budget_tokens_is_the_reasoning_budget(server: Server) -> None:
    """``thinking: {type: enabled, budget_tokens: N}`` is llama.cpp's reasoning budget, as
    llama-server maps it: the thinking block cut after N tokens and the text the answer
    ``reasoning_budget_tokens: N`` gives on /v1/chat/completions, whole and streamed (anthropic's client);
    with ``disabled`` the budget is unused."""
    budgeted = message(server, reasoning_budget_tokens=3)
    assert budgeted != message(server)  # the budget cuts this answer's thinking
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    asked = {"model": "ead", "max_tokens": 32, "messages": HI}
    enabled = {"type": "enabled", "budget_tokens": 3}
    whole = client.messages.create(**asked, thinking=enabled)  # type: ignore[call-overload]
    assert [block.model_dump() for block in whole.content] == [
        {"type": "thinking", "thinking": budgeted["reasoning_content"], "signature": ""},
        {"type": "text", "text": budgeted["content"], "citations": None},
    ]
    deltas = {"thinking_delta": "", "text_delta": ""}
    for event in client.messages.create(**asked, thinking=enabled, stream=True):  # type: ignore[call-overload]
        if event.type == "content_block_delta" and event.delta.type in deltas:
            deltas[event.delta.type] += getattr(event.delta, event.delta.type.removesuffix("_delta"))
    assert deltas == {"thinking_delta": budgeted["reasoning_content"], "text_delta": budgeted["content"]}
    disabled = client.messages.create(**asked, thinking={"type": "disabled", "budget_tokens": 3})  # type: ignore[call-overload]
    assert [block.text for block in disabled.content] == [message(server, **THINKING_OFF)["content"]]


@pytest.mark.parametrize(
    ("thinking", "fields", "fragment"),
    [
        ({"type": "enabled", "budget_tokens": 0}, {}, "greater than or equal to 1"),
        ({"type": "enabled", "budget_tokens": -1}, {}, "greater than or equal to 1"),
        ({"type": "enabled", "budget_tokens": "3"}, {}, "valid integer"),
        ({"type": "enabled", "budget_tokens": True}, {}, "valid integer"),
        ({"type": "enabled", "budget_tokens": 2**40}, {}, "less than or equal to"),
    ],
)
def test_bad_thinking_budgets_are_anthropics_400s(
    server: Server, thinking: dict[str, Any], fields: dict[str, Any], fragment: str
) -> None:
    body = {"model": "ead", "max_tokens": 8, "messages": HI, "thinking": thinking, **fields}
    reply = httpx.post(f"{server.url}/v1/messages", json=body, timeout=120)
    assert reply.status_code == 400, reply.text
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    said = error["error"]["message"]
    assert said.startswith("thinking.budget_tokens") and fragment in said and "\n" not in said, said
    assert message(server, max_tokens=2)["reasoning_content"]  # and the server serves on


# Each change to the page's turn, as the reader would have seen it: the Thinking block's state (none yet, open
# or collapsed) beside the answer's text so far
WATCH_THINKING = """new MutationObserver(() => {
  const thinking = document.querySelector('.turn .thinking');
  const state = thinking === null ? 'none' : thinking.open ? 'open' : 'collapsed';
  window.seen.push([state, document.querySelector('.turn .answer').textContent]);
}).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true})"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_shows_the_reasoning_in_a_thinking_block_collapsed_once_the_answer_starts(
    server: Server, raw: str, tmp_path: Path
) -> None:
    """As llama-server's page: the streamed ``reasoning_content`` in a "Thinking" block above the answer,
    open while it streams and collapsed once the answer starts, its text as text (the page had dropped
    it: a thinking model's answer showed its content alone, or nothing while it thought)."""
    reasoning, content = split_of(raw)
    browser = open_page(server, tmp_path / "chromium-profile")
    try:
        browser.evaluate(f"window.seen = []; {WATCH_THINKING}")
        browser.evaluate(f"{PRESS_ENTER}('hi')")
        browser.wait_for("document.querySelector('.figures').textContent")
        turn = "document.querySelector('.turn')"
        assert browser.evaluate(f"[...{turn}.children].map((node) => node.className)") == [
            "user",
            "thinking",
            "answer",
            "figures",
        ]
        assert browser.evaluate(f"{turn}.querySelector('.thinking summary').textContent") == "Thinking"
        thought = browser.evaluate(f"{turn}.querySelector('.reasoning').textContent")
        said = browser.evaluate(f"{turn}.querySelector('.answer').textContent")
        assert (thought, said) == (reasoning, content)
        # text nodes in the model's spans alone: nothing of the reasoning read as markup
        tags = browser.evaluate(f"[...{turn}.querySelectorAll('.reasoning *')].map((node) => node.tagName)")
        assert set(tags) == {"SPAN"}  # type: ignore[arg-type]
        seen = browser.evaluate("window.seen")
        assert seen[-1] == ["collapsed", content]  # type: ignore[index]
        states = [state for state, answer in seen if not answer]  # type: ignore[union-attr]
        assert "open" in states and "collapsed" not in states  # open while it thought
        assert all(state == "collapsed" for state, answer in seen if answer)  # type: ignore[union-attr]
        # the answer alone goes back with the next question, as llama-server's page sends it
        assert browser.evaluate("messages") == [*HI, {"role": "assistant", "content": content}]
    finally:
        browser.close()


# A thinking model that calls a tool: it thinks THOUGHT, closes the block, and calls multiply (a script: the
# same answer, greedy or sampled, from either model)
THOUGHT = "6*7=?"
CALLING = ["Ċ", *THOUGHT, "</think>", "Ġ", CALL_TOKEN, "<|im_end|>"]
ARGUMENTS = {"a": 6, "b": 7}
ASK = [{"role": "user", "content": "What is 6 times 7?"}]


@pytest.fixture(scope="module")
def calling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve-thinking-calls")
    small, large = write_scripted_pair(folder, "calling", THINKING_TOOLS_TEMPLATE, CALLING)
    with serving([*pair_args((small, large)), *TAU, "--max-tokens", "32"], folder / "server.log") as running:
        yield running


def test_a_forced_call_comes_after_the_reasoning(calling: Server) -> None:
    """A forced call on a thinking model: the model thinks first, free, and the call's grammar binds the
    answer from its </think> on (as llama-server's grammar lets the reasoning come first). Named, the
    call is of that tool though the model, unbound, called another (its script's multiply), whole and
    streamed alike."""
    client = openai.OpenAI(base_url=calling.base_url, api_key="unused", max_retries=0, timeout=60)
    request: dict[str, Any] = {
        "model": "ead",
        "messages": ASK,
        "tools": [*TOOLS, *FLIP],
        "tool_choice": {"type": "function", "function": {"name": "flip"}},
        "parallel_tool_calls": False,  # one call: the random rows after it would write more to the limit
        "max_tokens": 200,
    }
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    assert (whole.message.model_extra or {})["reasoning_content"] == THOUGHT
    (call,) = whole.message.tool_calls or []
    assert call.function.name == "flip"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) in ({"side": "heads"}, {"side": "tails"})  # type: ignore[union-attr]
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert (streamed.message.model_extra or {})["reasoning_content"] == THOUGHT
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls or []] == [
        (call.function.name, call.function.arguments)  # type: ignore[union-attr]
    ]


# The same thought, then a bare call's opening (no <tool_call> tags): its arguments the random rows'
BARE_CALLING = ["Ċ", *THOUGHT, "</think>", "Ġ", BARE_OPENING]


@pytest.fixture(scope="module")
def bare_calling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve-thinking-bare-calls")
    small, large = write_scripted_pair(folder, "bare", THINKING_TOOLS_TEMPLATE, BARE_CALLING, "think-bare")
    with serving([*pair_args((small, large)), *TAU], folder / "server.log") as running:
        yield running


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bare_call_after_the_reasoning_is_bound_by_its_schema(bare_calling: Server, seed: int) -> None:
    """A thinking model's bare call, after its </think>: the calls' grammar binds it once its text names
    a tool offered, as it binds one without a block, so the random draws after the name are the call's
    arguments as its schema allows, whole and streamed, the reasoning apart. Unbound, the tiny model wrote
    no JSON after the name: the answer stayed text, cut off at max_tokens."""
    client = openai.OpenAI(base_url=bare_calling.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {
        "model": "ead",
        "messages": ASK,
        "tools": PICK,
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": 200,
    }
    for choice in assert_one_bound_pick(client, request):
        assert (choice.message.model_extra or {})["reasoning_content"] == THOUGHT


def test_chat_gives_the_reasoning_then_the_call_whole_and_streamed(calling: Server) -> None:
    """``reasoning_content`` beside ``tool_calls`` (no content), as llama-server gives them; streamed, the
    reasoning deltas, then the call's at index 0, then the finish ``tool_calls``."""
    client = openai.OpenAI(base_url=calling.base_url, api_key="unused", max_retries=0, timeout=60)
    raw = client.chat.completions.create(model="ead", messages=ASK, extra_body={"reasoning_format": "none"})
    assert raw.choices[0].message.content == f"{THOUGHT}</think> {CALL_TOKEN}"  # the script, written
    whole = client.chat.completions.create(model="ead", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    choice = whole.choices[0]
    assert (choice.message.model_extra or {})["reasoning_content"] == THOUGHT
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert (call.function.name, json.loads(call.function.arguments)) == ("multiply", ARGUMENTS)
    kinds, reasoning, pieces, finishes = [], "", [], []
    stream = client.chat.completions.create(model="ead", messages=ASK, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    for chunk in stream:
        delta = chunk.choices[0].delta
        thought = (delta.model_extra or {}).get("reasoning_content")
        if thought:
            kinds, reasoning = [*kinds, "reasoning"], reasoning + thought
        if delta.content:
            kinds.append("content")
        for piece in delta.tool_calls or []:
            kinds.append("call")
            pieces.append((piece.index, piece.function.name, piece.function.arguments))  # type: ignore[union-attr]
        if chunk.choices[0].finish_reason:
            kinds, finishes = [*kinds, "finish"], [*finishes, chunk.choices[0].finish_reason]
    assert collapsed(kinds) == ["reasoning", "call", "finish"] and finishes == ["tool_calls"]
    assert reasoning == THOUGHT
    assert {index for index, _, _ in pieces} == {0}
    assert [name for _, name, _ in pieces if name] == ["multiply"]
    assert "".join(arguments or "" for _, _, arguments in pieces) == call.function.arguments


def test_responses_give_the_reasoning_item_then_the_call_whole_and_streamed(calling: Server) -> None:
    """A ``reasoning`` item at output 0, the ``function_call`` at 1 (no message); streamed, the reasoning
    item done before the call's is added, every event at its item's index."""
    client = openai.OpenAI(base_url=calling.base_url, api_key="unused", max_retries=0, timeout=60)
    asked = {"model": "ead", "input": ASK[0]["content"], "tools": FLAT_TOOLS}
    whole = client.responses.create(**asked)  # type: ignore[call-overload]
    thought, call = whole.output
    assert thought.type == "reasoning" and [part.text for part in thought.content] == [THOUGHT]
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "multiply", ARGUMENTS)
    assert whole.status == "completed" and whole.output_text == ""
    events = list(client.responses.create(**asked, stream=True))  # type: ignore[call-overload]
    placed = [(event.type, getattr(event, "output_index", None)) for event in events]
    assert collapsed([f"{kind} {index}" for kind, index in placed]) == [
        "response.created None",
        "response.in_progress None",
        "response.output_item.added 0",
        "response.content_part.added 0",
        "response.reasoning_text.delta 0",
        "response.reasoning_text.done 0",
        "response.content_part.done 0",
        "response.output_item.done 0",
        "response.output_item.added 1",
        "response.function_call_arguments.delta 1",
        "response.function_call_arguments.done 1",
        "response.output_item.done 1",
        "response.completed None",
    ]
    added = [event.item.type for event in events if event.type == "response.output_item.added"]
    assert added == ["reasoning", "function_call"]
    deltas = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    assert deltas == THOUGHT
    final = events[-1].response.output
    assert [item.type for item in final] == ["reasoning", "function_call"]
    assert final[0].content[0].text == THOUGHT and json.loads(final[1].arguments) == ARGUMENTS


def test_messages_give_the_thinking_block_then_the_tool_use_whole_and_streamed(calling: Server) -> None:
    """A ``thinking`` block at index 0, the ``tool_use`` at 1, ``stop_reason`` tool_use; streamed, the
    thinking block signed and stopped before the tool_use block starts."""
    client = anthropic.Anthropic(base_url=calling.url, api_key="unused", max_retries=0, timeout=60)
    tools = [{"name": "multiply", "input_schema": TOOLS[0]["function"]["parameters"]}]
    asked = {"model": "ead", "max_tokens": 32, "messages": ASK, "tools": tools}
    whole = client.messages.create(**asked)  # type: ignore[call-overload]
    assert whole.stop_reason == "tool_use"
    thought, call = whole.content
    assert (thought.type, thought.thinking) == ("thinking", THOUGHT)
    assert (call.type, call.name, call.input) == ("tool_use", "multiply", ARGUMENTS)
    events = list(client.messages.create(**asked, stream=True))  # type: ignore[call-overload]
    shown = {
        "content_block_start": lambda event: f"{event.index} {event.content_block.type}",
        "content_block_delta": lambda event: f"{event.index} {event.delta.type}",
        "content_block_stop": lambda event: f"{event.index}",
        "message_delta": lambda event: event.delta.stop_reason,
    }
    placed = [f"{event.type} {shown[event.type](event)}" for event in events if event.type in shown]
    assert collapsed(placed) == [
        "content_block_start 0 thinking",
        "content_block_delta 0 thinking_delta",
        "content_block_delta 0 signature_delta",
        "content_block_stop 0",
        "content_block_start 1 tool_use",
        "content_block_delta 1 input_json_delta",
        "content_block_stop 1",
        "message_delta tool_use",
    ]
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    thinking = "".join(delta.thinking for delta in deltas if delta.type == "thinking_delta")
    arguments = "".join(delta.partial_json for delta in deltas if delta.type == "input_json_delta")
    assert (thinking, json.loads(arguments)) == (THOUGHT, ARGUMENTS)
