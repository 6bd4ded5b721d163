"""`ead serve` for real: a subprocess on a loopback port with the tiny pair, driven by real clients (the
official openai library, Simon Willison's llm CLI, curl, httpx), its answers checked against generate."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import http.server
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets.sync.client
from openai.types.chat import ChatCompletionChunk
from pydantic import BaseModel
from serve_process import EAD, Server
from test_cli import pair_args
from tiny_models import write_tiny_model

from ead_cli.decoder import ModelReport, Summary
from ead_cli.prompt import encode_rendered, render_chat
from ead_cli.runner import Runner
from ead_cli.serve.app import _Reply
from ead_cli.serve.engine import Finished, Ticket
from ead_cli.serve.schemas import ChatRequest, CompletionRequest

PROMPT = "hello wörld 日本"
TAU = ["--tau", "3"]  # the tiny pair's entropies cross 3 bits now and then: both models write
LONG = 16000  # tokens: a generation long enough (seconds, even for the tiny pair) to act while it runs
CTX = ["--ctx", "16384"]


@contextlib.contextmanager
def serving(args: list[str], log: Path) -> Iterator[Server]:
    """A server shared by a module's tests: stopped cleanly at the end, its log free of tracebacks."""
    with Server(args, log) as running:
        yield running
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        [*pair_args(tiny_pair), *TAU, *CTX], tmp_path_factory.mktemp("serve") / "server.log"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def generate_jsonl(pair: tuple[Path, Path], *args: str) -> tuple[list[dict], dict]:
    """`ead generate --format jsonl`: the token objects and the summary."""
    result = subprocess.run(
        [EAD, "generate", *pair_args(pair), *TAU, "--format", "jsonl", *args],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    objects = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return objects[:-1], objects[-1]


def attribution(tokens: list[dict]) -> list[tuple[int, str]]:
    return [(token["token"], token["model"]) for token in tokens]


def test_chat_streamed_and_whole_equal_generate_token_for_token(
    client: openai.OpenAI, tiny_pair: tuple[Path, Path]
) -> None:
    expected, summary = generate_jsonl(tiny_pair, "--max-tokens", "24", PROMPT)
    assert {token["model"] for token in expected} == {"small", "large"}
    messages = [{"role": "user", "content": PROMPT}]

    chunks = list(
        client.chat.completions.create(
            model="ead", messages=messages, max_tokens=24, temperature=0, stream=True
        )
    )
    tokens = [chunk.model_extra["ead"] for chunk in chunks[:-1]]
    assert attribution(tokens) == attribution(expected)
    assert [token["entropy"] for token in tokens] == pytest.approx([t["entropy"] for t in expected])
    assert "".join(chunk.choices[0].delta.content for chunk in chunks[:-1]) == "".join(
        token["text"] for token in expected
    )
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.choices[0].delta.content is None
    assert last.usage.completion_tokens == 24 and last.usage.prompt_tokens == summary["prompt_tokens"]
    figures = last.model_extra["ead"]["summary"]
    assert figures["large_share"] == summary["large_share"] and figures["switches"] == summary["switches"]
    assert [m["written"] for m in figures["models"]] == [m["written"] for m in summary["models"]]

    whole = client.chat.completions.create(model="ead", messages=messages, max_tokens=24, temperature=0)
    assert whole.choices[0].message.content == "".join(token["text"] for token in expected)
    assert whole.choices[0].finish_reason == "length"
    assert attribution(whole.model_extra["ead"]["tokens"]) == attribution(expected)
    assert whole.usage.total_tokens == summary["prompt_tokens"] + 24


def test_completions_equal_generate_raw(client: openai.OpenAI, tiny_pair: tuple[Path, Path]) -> None:
    expected, _ = generate_jsonl(tiny_pair, "--max-tokens", "16", "--raw", "def fib(n):")
    request = {"model": "ead", "prompt": "def fib(n):", "max_tokens": 16, "temperature": 0}
    streamed = list(client.completions.create(**request, stream=True))
    assert attribution([chunk.model_extra["ead"] for chunk in streamed[:-1]]) == attribution(expected)
    whole = client.completions.create(**request)
    assert whole.choices[0].text == "".join(token["text"] for token in expected)
    assert whole.choices[0].text == "".join(chunk.choices[0].text for chunk in streamed)


def test_completions_take_the_prompt_as_token_ids(
    client: openai.OpenAI, server: Server, tiny_pair: tuple[Path, Path]
) -> None:
    """As llama-server and OpenAI: a prompt of token ids is read as it is, the same answer as its text's."""
    with Runner(tiny_pair[0], name="small", n_ctx=64) as runner:
        ids, n_vocab = encode_rendered(runner, "def fib(n):"), runner.n_vocab
    request = {"model": "ead", "max_tokens": 12, "temperature": 0}
    expected = client.completions.create(prompt="def fib(n):", **request)
    for prompt in (ids, [ids]):
        given = client.completions.create(prompt=prompt, **request)
        assert given.choices[0].text == expected.choices[0].text
        assert given.usage.prompt_tokens == expected.usage.prompt_tokens == len(ids)
    other = client.completions.create(prompt=ids[:-1], **request)  # read as given: one id fewer
    assert other.usage.prompt_tokens == len(ids) - 1
    unknown = {"prompt": [1, n_vocab]}
    reply = httpx.post(f"{server.url}/v1/completions", json=unknown, headers=JSON, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["message"] == f"prompt: token id {n_vocab} is not in the vocabulary (ids 0-{n_vocab - 1})"
    assert error["param"] == "prompt"


def test_request_options_and_the_ead_object(client: openai.OpenAI, tiny_pair: tuple[Path, Path]) -> None:
    """seed, temperature, stop and the ead object reach the engine as the same options of generate do."""
    args = ["--max-tokens", "12", "--temp", "0.9", "--seed", "7", "--policy", "ead", "--min-run", "2"]
    expected, _ = generate_jsonl(tiny_pair, *args, PROMPT)
    messages = [{"role": "user", "content": PROMPT}]
    sampled = {"messages": messages, "max_tokens": 12, "temperature": 0.9, "seed": 7}
    ead = {"policy": "ead", "min_run": 2}
    whole = client.chat.completions.create(
        model="ead", **sampled, extra_body={"ead": ead, "unknown_field": [1, 2]}
    )
    assert attribution(whole.model_extra["ead"]["tokens"]) == attribution(expected)
    small_only = client.chat.completions.create(
        model="ead", messages=messages, max_tokens=8, extra_body={"ead": {"mode": "small"}}
    )
    assert {token["model"] for token in small_only.model_extra["ead"]["tokens"]} == {"small"}
    text = whole.choices[0].message.content
    stop = text[3:5]
    assert stop.strip()
    stopped = client.chat.completions.create(model="ead", **sampled, stop=[stop], extra_body={"ead": ead})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]


def test_a_request_resolves_the_mode_as_generate_does(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A server started with no mode and no switching option: a request without them runs the default
    mode, one whose ``ead`` object gives a switching field runs the pair (as generate with that option);
    a server given --mode keeps it whatever the request's other fields."""
    from ead_cli.option_table import DEFAULT_MODE

    def writers(running: Server, ead: dict | None) -> set[str]:
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "temperature": 0}
        reply = httpx.post(f"{running.base_url}/chat/completions", json={**body, "ead": ead}, timeout=60)
        assert reply.status_code == 200, reply.text
        return {token["model"] for token in reply.json()["ead"]["tokens"]}

    with serving(pair_args(tiny_pair), tmp_path / "bare.log") as bare:
        assert writers(bare, None) == ({"large"} if DEFAULT_MODE == "large" else {"small", "large"})
        assert writers(bare, {"tau": 3}) == {"small", "large"}
        assert writers(bare, {"min_run": 10}) == writers(bare, {"mode": "ead"})  # a field at its default
        assert writers(bare, {"mode": "small", "tau": 3}) == {"small"}
    with serving([*pair_args(tiny_pair), "--mode", "small"], tmp_path / "small.log") as small:
        assert writers(small, {"tau": 3}) == {"small"}


def test_include_usage_ends_a_stream_with_openais_usage_chunk(client: openai.OpenAI) -> None:
    """stream_options.include_usage: after the finish chunk, one with no choices and the usage, as OpenAI
    and llama-server send it; without it the finish chunk carries the usage (and never a choiceless one)."""
    chat = {"model": "ead", "messages": HI, "max_tokens": 5, "temperature": 0, "stream": True}
    text = {"model": "ead", "prompt": "def fib(n):", "max_tokens": 5, "temperature": 0, "stream": True}
    for create, request in ((client.chat.completions.create, chat), (client.completions.create, text)):
        chunks = list(create(**request, stream_options={"include_usage": True}))
        *tokens, finish, last = chunks
        assert last.choices == [] and last.object == finish.object and last.id == finish.id
        assert last.usage.completion_tokens == 5
        assert last.usage.total_tokens == last.usage.prompt_tokens + 5
        assert finish.choices[0].finish_reason == "length" and finish.usage is None
        assert finish.model_extra["ead"]["summary"]["generated"] == 5
        assert all(chunk.choices and chunk.usage is None for chunk in tokens)
        plain = list(create(**request))
        assert plain[-1].choices[0].finish_reason == "length"
        counts = {"prompt_tokens", "completion_tokens", "total_tokens"}  # more of the prompt cached now
        assert plain[-1].usage.model_dump(include=counts) == last.usage.model_dump(include=counts)
        assert all(chunk.choices for chunk in plain)


def test_a_stream_names_the_role_once_as_openai_does(client: openai.OpenAI) -> None:
    """The role comes in the first delta only: the openai client's stream helper adds up every string a
    delta repeats, and a role sent with each token's chunk had made it 'assistantassistant...'."""
    request = {"model": "ead", "messages": HI, "max_tokens": 5, "temperature": 0}
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert [chunk.choices[0].delta.role for chunk in chunks] == ["assistant", *[None] * (len(chunks) - 1)]
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        message = stream.current_completion_snapshot.choices[0].message
    assert message.role == "assistant"
    assert message.content == client.chat.completions.create(**request).choices[0].message.content


def test_a_chat_stream_of_no_tokens_still_names_the_role() -> None:
    """The first chunk of a chat stream names the role whatever follows: a stream whose first chunk was
    its finish (no token came) had named none, which clients that take the role from it then lacked."""
    report = ModelReport("large", "large.gguf", 1, 0, 4, 0.0, 0, 0.0, 0, 0.0, 0.0)
    summary = Summary.of([report], finish_reason="stop", prompt_tokens=4, generated=0, wall_s=0.0)

    async def stream() -> list[str]:
        ticket = Ticket(asyncio.get_running_loop())
        ticket.send(Finished(summary))
        reply = _Reply("chat.completion", CHAT, print, seed=0, piece=bytes)
        return [event["data"] async for event in reply.stream(ticket)]

    *chunks, done = asyncio.run(stream())
    assert done == "[DONE]"
    first = ChatCompletionChunk.model_validate_json(chunks[0])
    assert first.choices[0].delta.role == "assistant" and first.choices[0].finish_reason == "stop"


def test_stream_options_without_stream_is_a_400(client: openai.OpenAI) -> None:
    """As OpenAI answers it: include_usage asked of an answer sent whole had been ignored in silence."""
    for stream in (None, False):
        given = {} if stream is None else {"stream": stream}
        for create, request in (
            (client.chat.completions.create, {"messages": HI}),
            (client.completions.create, {"prompt": "def fib(n):"}),
        ):
            with pytest.raises(openai.BadRequestError) as refused:
                create(model="ead", max_tokens=2, stream_options={"include_usage": True}, **given, **request)
            error = refused.value.body
            assert error["param"] == "stream_options" and error["code"] == "invalid_value", error
            assert (
                error["message"] == "The 'stream_options' parameter is only allowed when 'stream' is enabled."
            )


def test_max_completion_tokens_is_max_tokens_and_different_limits_are_a_400(client: openai.OpenAI) -> None:
    """OpenAI's newer spelling, which the openai client sends as it is given (its reasoning models take no
    other): the same limit. Both, with different values, had been answered with the newer one's in
    silence: a 400 that names both, neither guessed to win; the same value in both is taken."""
    create = client.chat.completions.create
    assert create(model="ead", messages=HI, max_completion_tokens=3).usage.completion_tokens == 3
    both = create(model="ead", messages=HI, max_tokens=2, max_completion_tokens=2)
    assert both.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError) as refused:
        create(model="ead", messages=HI, max_tokens=2, max_completion_tokens=5)
    message = "max_tokens 2 and max_completion_tokens 5 differ: give one, or the same value in both"
    assert refused.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "invalid_value",
    }


def test_a_last_assistant_message_is_continued_as_llama_server_does(
    client: openai.OpenAI, tiny_pair: tuple[Path, Path]
) -> None:
    """A conversation ending in an assistant message (a prefill) is continued: its text opens the answer's
    turn, as llama-server and ollama take it. It had been closed and a new turn opened after it."""
    with Runner(tiny_pair[0], name="small", n_ctx=64) as runner:
        opened = render_chat(runner, HI)  # the user's turn and the assistant's opening
    request = {"model": "ead", "max_tokens": 8, "temperature": 0}
    prefill = [*HI, {"role": "assistant", "content": "Sure"}]
    expected = client.completions.create(prompt=f"{opened}Sure", **request)
    for stream in (False, True):
        answer = client.chat.completions.create(messages=prefill, stream=stream, **request)
        if stream:
            chunks = list(answer)
            text, usage = "".join(chunk.choices[0].delta.content or "" for chunk in chunks), chunks[-1].usage
        else:
            text, usage = answer.choices[0].message.content, answer.usage
        assert text == expected.choices[0].text
        assert usage.prompt_tokens == expected.usage.prompt_tokens


def test_models_and_health(client: openai.OpenAI, server: Server, tiny_pair: tuple[Path, Path]) -> None:
    models = client.models.list().data
    assert [model.id for model in models] == ["ead"]
    assert models[0].model_extra["ead"]["models"] == {"small": tiny_pair[0].name, "large": tiny_pair[1].name}
    assert client.models.retrieve("ead") == models[0]  # openai's models.retrieve: GET /v1/models/ead
    with pytest.raises(openai.NotFoundError) as unknown:
        client.models.retrieve("gpt-4o")
    assert unknown.value.code == "model_not_found" and "serves 'ead'" in unknown.value.message
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "generating": False, "waiting": 0}
    for path, status in (("/v1/models", 200), ("/v1/models/ead", 200), ("/v1/models/gpt-4o", 404)):
        head, got = httpx.head(f"{server.url}{path}"), httpx.get(f"{server.url}{path}")
        assert (head.status_code, got.status_code) == (status, status)  # HTTP: HEAD wherever GET is
        assert head.content == b"" and head.headers["content-length"] == str(len(got.content))


def test_llm_cli_answers_through_the_server(server: Server, tmp_path: Path) -> None:
    """Simon Willison's llm, configured with the server as an OpenAI-compatible model."""
    llm = shutil.which("llm", path=str(Path(EAD).parent))
    assert llm is not None, "llm is in the test extra"
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: ead-tiny\n  model_name: ead\n  api_base: {server.base_url}\n"
    )
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused"}
    args = [llm, "-m", "ead-tiny", "-o", "max_tokens", "10", "-o", "temperature", "0", PROMPT]
    result = subprocess.run(args, capture_output=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    whole = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 10, "temperature": 0},
        timeout=60,
    ).json()
    assert result.stdout.decode().rstrip("\n") == whole["choices"][0]["message"]["content"].rstrip("\n")


def curl_stream(server: Server, body: str) -> subprocess.Popen[bytes]:
    """``curl -sN`` posting a JSON body to the chat endpoint, its output a pipe read as it comes."""
    url = f"{server.base_url}/chat/completions"
    args = ["curl", "-sN", url, "-H", "Content-Type: application/json", "-d", body]
    return subprocess.Popen(args, stdout=subprocess.PIPE)


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_sees_each_frame_while_the_answer_is_written(server: Server) -> None:
    """curl -N gets frames as they are produced: the first while the engine is still generating."""
    body = json.dumps({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4000, "stream": True})
    curl = curl_stream(server, body)
    assert curl.stdout is not None
    first = curl.stdout.readline()
    assert first.startswith(b"data: {")
    assert httpx.get(f"{server.url}/health").json()["generating"] is True  # not all at the end
    rest = curl.stdout.read().decode()
    assert curl.wait(timeout=60) == 0
    frames = [first.decode().strip(), *(line for line in rest.splitlines() if line.startswith("data: "))]
    assert frames[-1] == "data: [DONE]"
    assert len(frames) == 4000 + 2  # a frame per token, the last with the figures, then [DONE]
    assert json.loads(frames[-2][6:])["choices"][0]["finish_reason"] == "length"


CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
JSON = {"Content-Type": "application/json"}
HI_JSON = json.dumps({"messages": HI}).encode()


def not_served(asked: str, nearest: str | None = None) -> str:
    """A 404's message: the method and path asked, as OpenAI names those it does not serve ("Invalid URL
    (POST /v1/x)"), the route served nearest by name if one is near, and where every route is listed."""
    listed = "every route is in ead-cli's docs/serve.md#endpoints"
    return f"Invalid URL ({asked}): " + (
        f"the nearest route served is {nearest}; {listed}" if nearest else listed
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        (CHAT, b'{"messages": [', 400, "not valid JSON"),
        (CHAT, b"[1, 2]", 400, "must be a JSON object"),
        # JSON has no NaN nor Infinity (Python's json reads them), and a parser's depth is bounded
        (CHAT, HI_JSON[:-1] + b', "temperature": NaN}', 400, "temperature: Input should be a finite number"),
        (CHAT, HI_JSON[:-1] + b', "top_p": -Infinity}', 400, "top_p: Input should be a finite number"),
        (CHAT, b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "recursion limit exceeded"),
        (CHAT, {"messages": "hi"}, 400, "messages"),
        (CHAT, {"messages": []}, 400, "messages"),
        (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
        (CHAT, {"messages": [{"role": "user", "content": "  "}]}, 400, "the prompt is empty"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "image_url parts"),
        (CHAT, {"messages": HI, "max_tokens": 0}, 400, "max_tokens: Input should be -1 (no limit: to the"),
        (CHAT, {"messages": HI, "max_completion_tokens": -2}, 400, "context's end) or at least 1, got -2"),
        (CHAT, {"messages": HI, "max_tokens": "5"}, 400, "max_tokens"),
        (CHAT, {"messages": HI, "temperature": -1}, 400, "temperature"),
        (CHAT, {"messages": HI, "top_p": 1.5}, 400, "top_p"),
        (CHAT, {"messages": HI, "seed": -3}, 400, "seed"),
        (CHAT, {"messages": HI, "n": 17}, 400, "n: at most 16 choices per request"),
        (CHAT, {"messages": HI, "ead": {"tau": -1}}, 400, "tau must be at least 0"),
        (CHAT, {"messages": HI, "ead": {"verify": 2}}, 400, "ead.verify must be in (0, 1]"),
        (CHAT, {"messages": HI, "ead": {"policy": "coin"}}, 400, "ead.policy"),
        (CHAT, {"messages": HI, "ead": {"mode": "spec", "verify": 2}}, 400, "ead.verify must be in (0, 1]"),
        (CHAT, {"messages": HI, "ead": {"tau": [1, 2]}}, 400, "2 models take one threshold, got 2"),
        (CHAT, {"messages": HI, "ead": {"colour": "red"}}, 400, "ead.colour"),
        # a value echoed back (strings take 1024 characters, a model's name 256) is cut, its length said
        (CHAT, {"messages": HI, "ead": {"tau": "x" * 1000}}, 400, f"got {'x' * 80!r}... (1000 characters)"),
        (CHAT, {"messages": HI, "ead": {"pattern": ["p" * 1000]}}, 400, f"got {'p' * 80!r}... (1000 char"),
        (CHAT, {"messages": HI, "model": "m" * 256}, 404, f"the model {'m' * 80!r}... (256 characters) is"),
        (CHAT, {"messages": [{"role": "user", "content": "word " * 20000}]}, 400, "too many for the context"),
        ("/v1/completions", {"prompt": ""}, 400, "the prompt is empty"),
        ("/v1/completions", {"prompt": 5}, 400, "prompt"),
        ("/v1/completions", {"prompt": [-1]}, 400, "prompt"),
        ("/v1/completions", {"prompt": []}, 400, "prompt"),
        # a batch: the prompt at fault named by its place
        ("/v1/completions", {"prompt": ["a", ""]}, 400, "prompt.1: the prompt is empty"),
        ("/v1/completions", {"prompt": [[1], [10**6]]}, 400, "prompt.1: token id 1000000 is not in the"),
        ("/v1/completions", {"prompt": ["a"] * 65}, 400, "prompt: List should have at most 64 items"),
        ("/v1/completions", {"prompt": ["a"] * 5, "n": 13}, 400, "prompt: 5 prompts of 13 choices each: at"),
        # token ids, one not an integer: had been "prompt: List should have at most 1 item" (of strings)
        ("/v1/completions", {"prompt": [1, 2, 3.5]}, 400, "prompt.2: Input should be a valid integer"),
        ("/v1/completions", {"prompt": [1.5]}, 400, "prompt.0: Input should be a valid integer"),
        (CHAT, {"messages": HI, "stop": ["a"] * 17}, 400, "stop: List should have at most 16 items"),
        (CHAT, {"messages": HI, "stop": [1]}, 400, "stop.0: Input should be a valid string"),
        # a named choice without its function: had been "tool_choice.NamedToolChoice.function", a class's name
        (CHAT, {"messages": HI, "tool_choice": {"type": "function"}}, 400, "tool_choice.function: Field req"),
        ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs: Input should be less than or"),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, "a text part needs its"),
        ("/v1/nothing", {}, 404, not_served("POST /v1/nothing", "POST /v1/completions")),
        # had been a bare 307 to the path without it
        (f"{CHAT}/", {"messages": HI}, 404, not_served(f"POST {CHAT}/", f"POST {CHAT}")),
        # a slip of a letter (twice), a path near none
        ("/v1/chat/completion", {}, 404, not_served("POST /v1/chat/completion", f"POST {CHAT}")),
        ("/v1/halth", {}, 404, not_served("POST /v1/halth", "GET /v1/health")),
        ("/x/y/z", {}, 404, not_served("POST /x/y/z")),
    ],
)
def test_bad_requests_get_an_error_object_and_one_log_line(
    server: Server, path: str, body: bytes | dict, status: int, fragment: str
) -> None:
    before = server.log().splitlines()
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    reply = httpx.post(f"{server.url}{path}", content=content, headers=JSON, timeout=60)
    assert reply.status_code == status
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    # one line, not a dump (a 404's had named all 15 routes, some 420 characters)
    assert fragment in error["message"] and "\n" not in error["message"] and len(error["message"]) < 300
    new = server.log().splitlines()[len(before) :]
    assert new == [f"error: POST {path} {status}: {error['message']}"]
    ok = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI, "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200  # and the server keeps serving


def test_the_log_line_of_a_one_token_answer_says_one_token(server: Server) -> None:
    """An answered request's log line counts its tokens as every count is said ('1 tokens' it had been)."""
    before = server.log().splitlines()
    ok = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI, "max_tokens": 1}, timeout=60)
    assert ok.status_code == 200
    [line] = server.log().splitlines()[len(before) :]
    assert line.startswith("POST /v1/chat/completions 200: 1 token (length), prompt "), line


def test_a_body_that_starts_with_a_byte_order_mark_is_json_all_the_same(server: Server) -> None:
    """A body read from a file saved as "UTF-8 with BOM" (curl -d @request.json, PowerShell's
    Invoke-RestMethod): llama-server's parser takes the mark and JSON allows a parser to ignore it (RFC
    8259, 8.1); it had been a 400 "expected value at line 1 column 1". A mark is no body, nor is a second."""
    bom = "\ufeff".encode()
    body = json.dumps({"messages": HI, "max_tokens": 2, "temperature": 0}).encode()
    marked = httpx.post(f"{server.url}{CHAT}", content=bom + body, headers=JSON, timeout=60)
    plain = httpx.post(f"{server.url}{CHAT}", content=body, headers=JSON, timeout=60)
    assert marked.status_code == 200, marked.text
    assert marked.json()["choices"] == plain.json()["choices"]
    for refused in (bom, bom + bom + body, b" " + bom + body):
        reply = httpx.post(f"{server.url}{CHAT}", content=refused, headers=JSON, timeout=60)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json", reply.text


def integer_fields(schema: type[BaseModel]) -> list[str]:
    """The fields of a request that take an integer (alone or among other types), its ``ead`` object's
    too, read from its JSON schema: every one the server would take a number of."""
    described = schema.model_json_schema()
    fields = []
    for prefix, properties in (
        ("", described["properties"]),
        ("ead.", described["$defs"]["EadOptions"]["properties"]),
    ):
        for name, field in properties.items():
            if "integer" in {member.get("type") for member in field.get("anyOf", [field])}:
                fields.append(f"{prefix}{name}")
    return fields


@pytest.mark.parametrize(
    ("path", "field"),
    [
        *((CHAT, field) for field in integer_fields(ChatRequest)),
        *(("/v1/completions", field) for field in integer_fields(CompletionRequest)),
    ],
)
def test_a_boolean_is_no_integer(server: Server, path: str, field: str) -> None:
    """JSON's true is no count, though Python's bool is an int: a text completion's ``logprobs: true``
    had been taken as ``logprobs: 0``. Every integer field of both endpoints refuses one by name."""
    body: dict[str, Any] = {"messages": HI} if path == CHAT else {"prompt": "hi"}
    body["max_tokens"] = 2  # an answer taken by mistake stays short
    name = field.removeprefix("ead.")
    body.update({"ead": {name: True}} if name != field else {field: True})
    reply = httpx.post(f"{server.url}{path}", json=body, headers=JSON, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == field and error["message"].startswith(f"{field}: "), error


def test_a_wrong_method_is_a_405_that_names_the_allowed_one(server: Server) -> None:
    """Its message had been Starlette's bare "Method Not Allowed": it names what was asked, and what the
    path takes, as the Allow header does."""
    for method, path, allowed in (("GET", CHAT, "POST"), ("POST", "/health", "GET, HEAD")):
        reply = httpx.request(method, f"{server.url}{path}", timeout=60)
        assert reply.status_code == 405  # and HTTP requires Allow:
        assert reply.headers["allow"] == allowed
        assert reply.json()["error"] == {
            "message": f"Invalid method for URL ({method} {path}): it takes {allowed}",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    for path, kind in (("/health", "application/json"), ("/", "text/html")):  # monitors, curl -I
        head = httpx.head(f"{server.url}{path}", timeout=60)
        assert head.status_code == 200 and head.headers["content-type"].startswith(kind)
        assert head.content == b""


def test_a_base_url_without_v1_is_served_as_llama_server_serves_it(server: Server) -> None:
    """llama-server 0.3.36 serves its OpenAI routes without /v1 too (and /health with it), so a client
    whose base URL is http://host:8080 works with it: with ead serve it had got a 404 on every call. The
    same answers, each logged under the path asked."""
    bare = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    with_v1 = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    before = server.log().splitlines()
    asked: dict[str, Any] = {"model": "ead", "messages": HI, "max_tokens": 3, "temperature": 0}
    chat = bare.chat.completions.create(**asked)
    assert chat.choices == with_v1.chat.completions.create(**asked).choices
    streamed = bare.chat.completions.create(**asked, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == (
        chat.choices[0].message.content
    )
    text = bare.completions.create(model="ead", prompt=PROMPT, max_tokens=3, temperature=0)
    assert (
        text.choices[0].text
        == with_v1.completions.create(model="ead", prompt=PROMPT, max_tokens=3, temperature=0).choices[0].text
    )
    assert [model.id for model in bare.models.list()] == ["ead"]
    assert bare.models.retrieve("ead").model_dump() == with_v1.models.retrieve("ead").model_dump()
    response = bare.responses.create(model="ead", input="hi", max_output_tokens=3, temperature=0)
    assert response.status in ("completed", "incomplete") and response.output_text
    assert httpx.get(f"{server.url}/v1/health", timeout=60).json()["status"] == "ok"
    logged = [line.split(" 200: ")[0] for line in server.log().splitlines()[len(before) :]]
    assert logged == [
        "POST /chat/completions",
        "POST /v1/chat/completions",
        "POST /chat/completions",
        "POST /completions",
        "POST /v1/completions",
        "POST /responses",
    ]


def test_a_path_served_nowhere_is_a_404_naming_the_nearest_route(server: Server) -> None:
    """A slip of a letter in the base URL: the openai client had shown Starlette's bare "Not Found", of
    type not_found_error; OpenAI says "Invalid URL (POST /chat/completions)", an invalid request."""
    before = server.log().splitlines()
    slipped = openai.OpenAI(base_url=f"{server.url}/v2", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as missing:
        slipped.chat.completions.create(model="ead", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    message = not_served("POST /v2/chat/completions", "POST /v1/chat/completions")
    assert missing.value.body == {
        "message": message,
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert server.log().splitlines()[len(before) :] == [f"error: POST /v2/chat/completions 404: {message}"]


def test_an_oversized_body_is_refused_before_it_is_read(server: Server) -> None:
    reply = httpx.post(f"{server.base_url}/completions", content=b"x" * (5 * 2**20), timeout=60)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize(
    ("template", "fragment", "param"),
    [
        ("{{ raise_exception('this template takes no users') }}", "this template takes no users", "messages"),
        (None, "has no chat template: use /v1/completions", None),
    ],
)
def test_a_chat_template_that_fails_is_a_400_with_its_reason(
    tiny_pair: tuple[Path, Path], tmp_path: Path, template: str | None, fragment: str, param: str | None
) -> None:
    """A template's failure on the messages names them (it had answered with ``param`` null)."""
    from tiny_models import write_tiny_model

    small = write_tiny_model(tmp_path / "templated.gguf", seed=0, chat_template=template)
    with Server([*pair_args((small, tiny_pair[1]))], tmp_path / "server.log") as server:
        reply = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI}, timeout=60)
        assert reply.status_code == 400
        assert fragment in reply.json()["error"]["message"] and reply.json()["error"]["param"] == param
        completion = httpx.post(
            f"{server.base_url}/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60
        )
        assert completion.status_code == 200
        assert server.stop() == 0
        assert "Traceback" not in server.log()


def test_an_api_key_is_required_when_set(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(tiny_pair), "--api-key", "s3cret"], tmp_path / "server.log") as server:
        for base, headers in itertools.product(
            (server.base_url, server.url),  # llama-server's path without /v1 too
            ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}),
        ):
            reply = httpx.get(f"{base}/models", headers=headers)
            assert reply.status_code == 401
            assert reply.json()["error"]["code"] == "invalid_api_key"
        keyed = openai.OpenAI(base_url=server.base_url, api_key="s3cret", max_retries=0)
        assert keyed.chat.completions.create(model="ead", messages=HI, max_tokens=2).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).models.list()
        assert httpx.get(f"{server.url}/health").status_code == 200  # health and the page stay open
        assert "warning" not in server.log()
        assert server.stop() == 0


def test_a_bind_beyond_loopback_without_a_key_warns(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(tiny_pair), "--host", "0.0.0.0"], tmp_path / "server.log") as server:
        lines = [line for line in server.log().splitlines() if not line.startswith("note:")]  # --small's
        assert lines[0].startswith("warning: listening on 0.0.0.0 without --api-key")
        assert server.stop() == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--port", "70000"], "--port"),
        # '' had listened on every interface, its warning naming no address ('listening on  without')
        (["--host", "", "--port", "0"], "--host is empty: give an address (0.0.0.0: every interface)"),
        (["--host", " ", "--port", "0"], "--host is empty"),
        (["--queue", "-1"], "--queue"),
        (["--api-key", " "], "--api-key"),
        (["--api-key", "sékret"], "--api-key must be printable ASCII"),
        (["--api-key", "s3cret "], "--api-key starts or ends with a space"),
        (["--cors-origin", "evil.example/path"], "--cors-origin takes scheme://host[:port]"),
        (["--shutdown-timeout", "0"], "--shutdown-timeout"),
        (["--read-timeout", "0"], "--read-timeout must be in (0, 86400] seconds"),
        (["--read-timeout", "nan"], "--read-timeout must be in (0, 86400] seconds"),
        (["--ping-interval", "-1"], "--ping-interval must be in [0, 86400] seconds, got -1.0"),
        (["--ping-interval", "nan"], "--ping-interval must be in [0, 86400] seconds"),
    ],
)
def test_bad_serve_options_are_one_line(tiny_pair: tuple[Path, Path], args: list[str], fragment: str) -> None:
    from test_cli import assert_one_line_error, ead

    assert_one_line_error(ead("serve", *pair_args(tiny_pair), *args), 2, fragment)


def test_a_port_in_use_is_the_one_line_before_any_note(tiny_pair: tuple[Path, Path]) -> None:
    """The port is taken before the models load: its error is the run's one line, not after the note on
    --small (which the default mode leaves unused) and the models' loading."""
    from test_cli import assert_one_line_error, ead

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = ead("serve", *pair_args(tiny_pair), "--port", str(port))
    assert_one_line_error(result, 1, f"cannot listen on 127.0.0.1:{port}: Address already in use")


def stream_request(url: str, max_tokens: int) -> tuple[httpx.Client, httpx.Response]:
    """A streamed chat request whose response is open (headers read), for tests that hold it."""
    http = httpx.Client(timeout=120)
    request = http.build_request(
        "POST",
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "stream": True},
    )
    return http, http.send(request, stream=True)


def frames(response: httpx.Response) -> Iterator[dict | str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[6:] if line == "data: [DONE]" else json.loads(line[6:])


def test_a_full_queue_answers_503_and_a_client_that_leaves_frees_the_engine(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--queue", "2"]
    with Server(args, tmp_path / "server.log") as server:
        first_http, first = stream_request(server.url, LONG)
        received = frames(first)  # kept: a generator closed when dropped would close the response
        assert next(received)["ead"]["index"] == 0  # generating
        second_http, second = stream_request(server.url, 2000)  # waits: the queue's first place
        third_http, third = stream_request(server.url, 5)  # waits: its second place
        assert second.status_code == third.status_code == 200
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "generating": True, "waiting": 2}
        refused = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI}, timeout=60)
        assert refused.status_code == 503
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
        third.close()  # leaves while it waits: skipped when its turn comes
        third_http.close()
        first.close()  # leaves mid-stream: its generation stops
        first_http.close()
        answer = list(frames(second))  # served: nothing accepted is dropped
        assert answer[-1] == "[DONE]" and answer[-2]["usage"]["completion_tokens"] == 2000
        second_http.close()
        assert server.stop() == 0
    log = server.log().splitlines()
    stopped = [line for line in log if line.startswith("stopped after")]
    assert len(stopped) == 1 and int(stopped[0].split()[2]) < LONG, log
    assert log.count("skipped a waiting request: its client went away") == 1, log


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_a_killed_client_stops_its_generation(server: Server) -> None:
    before = len(server.log().splitlines())
    body = json.dumps({"messages": HI, "max_tokens": LONG, "stream": True})
    curl = curl_stream(server, body)
    assert curl.stdout is not None and curl.stdout.readline().startswith(b"data: {")
    curl.kill()
    curl.wait(timeout=30)
    ok = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI, "max_tokens": 3}, timeout=60)
    assert ok.json()["usage"]["completion_tokens"] == 3
    new = server.log().splitlines()[before:]
    stopped = [line for line in new if line.startswith("stopped after")]
    assert len(stopped) == 1 and int(stopped[0].split()[2]) < LONG, new


def test_streams_whose_clients_leave_amid_queued_tokens_log_a_line_each(server: Server) -> None:
    """Tokens the engine wrote faster than a busy loop sent them wait in the request's queue; when its
    client left, each went to the closed socket within one turn of the loop, and asyncio logged
    'socket.send() raised exception.' for each after the fifth: some 20 lines per stream, none saying
    which. Eight clients at once keep the loop busy; each leaves after its first token."""
    before = len(server.log().splitlines())

    def leave_after_one_token(seed: int) -> None:
        body = {"messages": HI, "max_tokens": 400, "stream": True, "seed": seed}
        with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body, timeout=60) as answer:
            assert next(frames(answer))["ead"]["index"] == 0

    with ThreadPoolExecutor(8) as clients:
        list(clients.map(leave_after_one_token, range(16)))
    ok = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI, "max_tokens": 3}, timeout=60)
    assert ok.json()["usage"]["completion_tokens"] == 3
    new = server.log().splitlines()[before:]
    assert len(new) == 17 and "socket.send() raised exception." not in new, new


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_stream_finishes_what_was_accepted_then_exits_0(
    tiny_pair: tuple[Path, Path], tmp_path: Path, sig: int
) -> None:
    with Server([*pair_args(tiny_pair), *TAU, "--ctx", "4096"], tmp_path / "server.log") as server:
        first_http, first = stream_request(server.url, 4000)
        received = frames(first)
        assert next(received)["ead"]["index"] == 0
        second_http, second = stream_request(server.url, 4)  # accepted, waiting
        server.process.send_signal(sig)
        rest = list(received)
        assert rest[-1] == "[DONE]" and rest[-2]["choices"][0]["finish_reason"] == "length"
        assert rest[-2]["usage"]["completion_tokens"] == 4000 == len(rest) - 1
        assert list(frames(second))[-2]["usage"]["completion_tokens"] == 4
        first_http.close()
        second_http.close()
        assert server.process.wait(timeout=60) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/health")
    assert server.log().splitlines()[-1] == "ead serve: stopped"
    assert "Traceback" not in server.log()


def test_sixteen_streaming_clients_get_right_answers_and_nothing_piles_up(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """scripts/bench_serve.py on the tiny pair: 16 clients x 3 streamed requests, 4 of the clients agents
    with tools (the small model's template renders them), each answer equal token for token to its
    reference; a queue past its bound answers 503; RSS, descriptors and threads flat; a fifth chat turn
    reads only its new tokens when the caches hold the fourth."""
    from test_serve_tools import TOOLS_TEMPLATE
    from tiny_models import write_tiny_model

    small = write_tiny_model(tmp_path / "tools.gguf", seed=0, chat_template=TOOLS_TEMPLATE)
    large = tiny_pair[1]
    args = ["--small", str(small), "--large", str(large), "--clients", "16", "--requests", "3"]
    args += ["--tool-clients", "4"]
    args += ["--queue", "16", "--max-tokens", "16", "--hold-tokens", str(LONG), "--repeats", "1", "--exact"]
    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_serve.py"
    result = subprocess.run(
        [sys.executable, str(script), *args, "--", *TAU, *CTX], capture_output=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout)
    assert figures["failures"] == []
    assert figures["load"]["requests"] == 48 and figures["tool_clients"] == 4
    assert figures["load"]["agent_requests"] == 12
    assert figures["load"]["incomplete"] == figures["load"]["differing"] == 0
    assert figures["overflow"]["refused_503"] == 2 and figures["overflow"]["accepted"] == 16
    assert figures["overflow"]["accepted_completed"] == 16 and figures["overflow"]["retry_after"] == ["1"]
    server = figures["server"]
    assert server["fds_end"] <= server["fds_start"] and server["threads_end"] <= server["threads_start"]
    assert server["rss_growth_mib"] <= 64
    reuse = figures["reuse"]
    assert reuse["reuse"]["prompt_tokens"] == reuse["no_reuse"]["prompt_tokens"]
    assert reuse["reuse"]["read_by_model"]["small"] < reuse["no_reuse"]["read_by_model"]["small"]
    assert reuse["no_reuse"]["read_by_model"]["small"] >= reuse["reuse"]["prompt_tokens"] - 8


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SPAN = re.compile(r'<span data-model="([a-z0-9]+)" title="[^"]*">([^<]*)</span>')
DEVTOOLS = re.compile(rb"DevTools listening on (ws://\S+)")


class Browser:
    """Headless Chromium driven over its DevTools protocol: load a page, wait for something, read the DOM."""

    def __init__(self, profile: Path) -> None:
        assert CHROMIUM is not None
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0"]
        self.process = subprocess.Popen(
            [CHROMIUM, *args, f"--user-data-dir={profile}", "about:blank"], stderr=subprocess.PIPE
        )
        assert self.process.stderr is not None
        for line in self.process.stderr:
            found = DEVTOOLS.search(line)
            if found:
                break
        else:
            raise RuntimeError("chromium did not open its DevTools port")
        http_root = found.group(1).decode().replace("ws://", "http://").split("/devtools/")[0]
        page = next(t for t in httpx.get(f"{http_root}/json/list").json() if t["type"] == "page")
        self._closing = contextlib.ExitStack()
        self.socket = self._closing.enter_context(
            websockets.sync.client.connect(page["webSocketDebuggerUrl"], max_size=2**26)
        )
        self._id = 0

    def call(self, method: str, session: str | None = None, **params: object) -> dict:
        """A DevTools call, to the page or to the target of an attached ``session`` (a frame's)."""
        self._id += 1
        to = {} if session is None else {"sessionId": session}
        self.socket.send(json.dumps({"id": self._id, "method": method, "params": params, **to}))
        while True:
            reply = json.loads(self.socket.recv(timeout=120))
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]

    def evaluate(self, expression: str) -> object:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 240) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"the page never had {expression}: {self.evaluate('document.body.outerHTML')}")

    def close(self) -> None:
        self._closing.close()
        self.process.kill()
        self.process.wait(timeout=30)


def check_page(server: Server, prompt: str, out: Path) -> list[tuple[str, str]]:
    """Load /?q=PROMPT in Chromium: once the figures are under the answer, the DOM holds it as one span per
    token coloured by its model, and the legend; a screenshot goes to ``out``. Returns (model, text) spans."""
    browser = Browser(out.parent / "chromium-profile")
    try:
        size = {"width": 1000, "height": 700, "deviceScaleFactor": 1, "mobile": False}
        browser.call("Emulation.setDeviceMetricsOverride", **size)
        browser.call("Page.navigate", url=f"{server.url}/?q={urllib.parse.quote(prompt)}")
        figures = browser.wait_for("document.querySelector('.figures')?.textContent")
        assert re.match(r"\d+ tokens \((length|stop)\) · large share", str(figures)), figures
        dom = str(browser.evaluate("document.documentElement.outerHTML"))
        colours = browser.evaluate(
            "[...document.querySelectorAll('.answer span')]"
            ".map(span => [span.dataset.model, getComputedStyle(span).color])"
        )
        out.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"]))
    finally:
        browser.close()
    print(f"screenshot: {out}")
    assert "small: " in dom and "large: " in dom  # the legend
    by_model: dict[str, set[str]] = {}
    for model, colour in colours:  # type: ignore[union-attr]
        by_model.setdefault(model, set()).add(colour)
    assert all(len(found) == 1 for found in by_model.values()), by_model  # one colour per model...
    assert len({next(iter(found)) for found in by_model.values()}) == len(by_model)  # ...and apart
    return [(model, html.unescape(text)) for model, text in SPAN.findall(dom)]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_streams_an_answer_coloured_by_model(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(tiny_pair), *TAU, "--max-tokens", "40"], tmp_path / "server.log") as server:
        spans = check_page(server, PROMPT, tmp_path / "page.png")
        http, response = stream_request(server.url, 40)
        chunks = list(frames(response))[:-2]  # not the figures, nor [DONE]
        http.close()
        expected = [(c["ead"]["model"], c["choices"][0]["delta"]["content"]) for c in chunks]
        assert spans == [(model, text) for model, text in expected if text]  # one span per token with text
        assert {model for model, _ in spans} == {"small", "large"}
        assert server.stop() == 0
    assert "Traceback" not in server.log()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_tells_every_model_of_a_cascade_apart(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A cascade of four: mid1 and mid2 had shared one colour (and the legend two alike swatches)."""
    mids = [write_tiny_model(tmp_path / f"mid{level}.gguf", seed=4 + level) for level in (1, 2)]
    models = ",".join(str(path) for path in (tiny_pair[0], *mids, tiny_pair[1]))
    args = ["--models", models, "--mode", "ead", "--tau", "1.5,2.5,3.5", "--max-tokens", "60"]
    with Server(args, tmp_path / "server.log") as server:
        spans = check_page(server, PROMPT, tmp_path / "page.png")  # one colour per model, each apart
        assert server.stop() == 0
    assert {model for model, _ in spans} == {"small", "mid1", "mid2", "large"}


def open_page(server: Server, profile: Path) -> Browser:
    """The page in Chromium, its legend loaded: ready for a person to type."""
    browser = Browser(profile)
    browser.call("Page.navigate", url=f"{server.url}/")
    browser.wait_for("document.getElementById('legend').textContent.includes('small: ')")
    return browser


# A person types into the box and presses Enter; the state right after (the submit handler has run up to its
# first wait): whether the earlier answer was still streaming, the turns on the page, what is left in the box.
PRESS_ENTER = """((text) => {
  const figures = document.querySelector('.figures');
  const streaming = figures !== null && !figures.textContent;
  const box = document.getElementById('prompt');
  box.value = text;
  box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
  return [streaming, document.querySelectorAll('.turn').length, box.value];
})"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_sends_one_question_at_a_time(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Enter while an answer streams had sent a second request, its conversation lacking the first answer."""
    with Server([*pair_args(tiny_pair), *TAU, "--max-tokens", str(LONG)], tmp_path / "server.log") as server:
        browser = open_page(server, tmp_path / "chromium-profile")
        try:
            assert browser.evaluate(f"{PRESS_ENTER}('first')") == [False, 1, ""]
            browser.wait_for("document.querySelectorAll('.answer span').length > 3")
            assert browser.evaluate(f"{PRESS_ENTER}('second')") == [True, 1, "second"]
            assert browser.evaluate("messages") == [{"role": "user", "content": "first"}]
        finally:
            browser.close()  # the client leaves: the long answer stops
        assert server.stop() == 0


def click(browser: Browser, selector: str) -> None:
    """A person's click on the element: the mouse pressed and released at its middle."""
    x, y = browser.evaluate(  # type: ignore[misc]
        f"(({{x, y, width, height}}) => [x + width / 2, y + height / 2])"
        f"(document.querySelector({json.dumps(selector)}).getBoundingClientRect())"
    )
    for kind in ("mousePressed", "mouseReleased"):
        browser.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_stop_ends_an_answer_and_keeps_what_came(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A long answer can be stopped mid-stream: the server stops generating it, what came stays in the
    conversation, the next question goes out. (The page had no way to stop one but a reload, which loses
    the whole conversation.)"""
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--max-tokens", str(LONG)]  # the context no cap on its length
    with Server(args, tmp_path / "server.log") as server:
        browser = open_page(server, tmp_path / "chromium-profile")
        try:
            browser.evaluate(f"{PRESS_ENTER}('first')")
            browser.wait_for("document.querySelectorAll('.answer span').length > 3")
            click(browser, "#stop")
            assert browser.wait_for("document.querySelector('.figures').textContent") == "stopped"
            shown = browser.evaluate("document.querySelector('.answer').textContent")
            deadline = time.monotonic() + 60  # not a speed: only that the generation ends at all
            while "stopped after" not in server.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "stopped after" in server.log() and "the client went away" in server.log()
            assert browser.evaluate("document.getElementById('stop').hidden") is True
            assert browser.evaluate(f"{PRESS_ENTER}('second')") == [False, 2, ""]
            assert browser.evaluate("messages") == [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": shown},
                {"role": "user", "content": "second"},
            ]
        finally:
            browser.close()
        assert server.stop() == 0


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_stop_while_the_question_waits_its_turn_leaves_it_out_and_back_in_the_box(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Another client's answer holds the engine, so the page's question waits in the queue, its stream's
    headers already in: Stop then had kept the question in the conversation with an empty answer (sent
    with every later turn) and emptied the box, where a Stop before the headers left it out and put it
    back, as the page does with every question nothing came of."""
    with Server([*pair_args(tiny_pair), *TAU, *CTX], tmp_path / "server.log") as server:
        holding_http, holding = stream_request(server.url, LONG)
        received = frames(holding)  # kept: a generator closed when dropped would close the response
        assert next(received)["ead"]["index"] == 0  # generating
        browser = open_page(server, tmp_path / "chromium-profile")
        try:  # the real fetch, watched: whether the answer's headers came
            browser.evaluate(
                "window.fetch = ((real) => (...args) => real(...args).then((reply) => "
                "{ window.answering = true; return reply; }))(window.fetch)"
            )
            assert browser.evaluate(f"{PRESS_ENTER}('waiting')") == [False, 1, ""]
            browser.wait_for("window.answering")
            assert httpx.get(f"{server.url}/health").json()["waiting"] == 1
            click(browser, "#stop")
            notes = browser.wait_for("document.querySelector('.figures').textContent")
            assert notes == "stopped before the answer began"
            assert browser.evaluate("messages") == []
            assert browser.evaluate("document.getElementById('prompt').value") == "waiting"
        finally:
            browser.close()
            holding_http.close()
        assert server.stop() == 0


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_a_long_word_wraps_inside_the_page(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A word longer than a line (a URL, a hash, base64; the tiny models write runs of one letter) had run off
    the right edge of its box, the page scrolling sideways."""
    with Server([*pair_args(tiny_pair), *TAU, "--max-tokens", "1500"], tmp_path / "server.log") as server:
        browser = open_page(server, tmp_path / "chromium-profile")
        try:
            size = {"width": 800, "height": 600, "deviceScaleFactor": 1, "mobile": False}
            browser.call("Emulation.setDeviceMetricsOverride", **size)
            word = "https://example.com/" + "a1b2c3" * 100
            browser.evaluate(f"{PRESS_ENTER}({json.dumps(word)})")
            browser.wait_for("document.querySelector('.figures').textContent")
            assert browser.evaluate("document.querySelector('.user').textContent") == word
            assert browser.evaluate("document.querySelector('.answer').textContent.length") > 1000
            boxes = "[...document.querySelectorAll('.user, .answer')]"
            assert browser.evaluate(f"{boxes}.every((box) => box.scrollWidth <= box.clientWidth)")
            assert browser.evaluate("document.documentElement.scrollWidth <= innerWidth")
        finally:
            browser.close()
        assert server.stop() == 0


# After the page's next two frames (its own work for the tokens so far done): where the window is scrolled,
# and how far below the window's bottom the answer's last token is (tokens keep coming meanwhile: a few).
AFTER_FRAMES = """new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => {
  const last = document.querySelector('.answer').lastElementChild;
  done([scrollY, last.getBoundingClientRect().bottom - innerHeight]);
})))"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_follows_a_long_answer_until_the_reader_scrolls_up(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """An answer taller than the window had grown out of view below it while it streamed, Stop and the box
    to type in with it: the page follows it down now, and stays where the reader scrolls up to read. Stop
    stays in one place meanwhile, at the window's foot: it had moved down a line with each line the answer
    grew, from under the pointer of the person about to press it (a test's click, pressed where it had
    just been, missed it)."""

    def after_frames() -> list:
        reply = browser.call(
            "Runtime.evaluate", expression=AFTER_FRAMES, awaitPromise=True, returnByValue=True
        )
        return reply["result"]["value"]

    args = [*pair_args(tiny_pair), *TAU, *CTX, "--max-tokens", str(LONG)]
    with Server(args, tmp_path / "server.log") as server:
        browser = open_page(server, tmp_path / "chromium-profile")
        try:
            size = {"width": 800, "height": 400, "deviceScaleFactor": 1, "mobile": False}
            browser.call("Emulation.setDeviceMetricsOverride", **size)
            browser.evaluate(f"{PRESS_ENTER}('first')")
            stop = "document.getElementById('stop').getBoundingClientRect().bottom"
            at_first = browser.evaluate(stop)
            browser.wait_for("document.documentElement.scrollHeight > 4 * innerHeight")
            scrolled, below = after_frames()
            assert scrolled > 2 * 400 and below < 400  # not 3 windows further down: followed
            assert browser.evaluate(stop) == at_first
            browser.evaluate("scrollTo(0, 0)")  # the reader goes up to read the question again
            count = "document.querySelector('.answer').children.length"
            browser.wait_for(f"{count} > {browser.evaluate(count)} + 200")
            assert after_frames()[0] == 0
            assert browser.evaluate(stop) == at_first
            assert browser.evaluate("document.getElementById('stop').hidden") is False  # still streaming
        finally:
            browser.close()
        assert server.stop() == 0


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_a_refused_question_goes_back_to_the_box(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A server with --api-key, a question asked before the key is typed: the 401 is said under it, and the
    question is back in the box to send again once the key is in (it had been lost: the box emptied, the
    question left out of the conversation, to be typed again). The key goes in a header only: never in a
    URL the page loads, nor in the server's log."""
    key = "page-key-8f3a"
    args = [*pair_args(tiny_pair), *TAU, "--max-tokens", "4", "--api-key", key]
    with Server(args, tmp_path / "server.log") as server:
        browser = Browser(tmp_path / "chromium-profile")
        try:
            browser.call("Page.navigate", url=f"{server.url}/")
            browser.wait_for("document.getElementById('legend').textContent.includes('401')")
            assert browser.evaluate(f"{PRESS_ENTER}('what is 2+2?')") == [False, 1, ""]
            notes = browser.wait_for("document.querySelector('.figures.error')?.textContent")
            assert str(notes).startswith("a valid API key is needed")
            assert browser.evaluate("document.getElementById('prompt').value") == "what is 2+2?"
            browser.evaluate("document.getElementById('key').focus()")
            browser.call("Input.insertText", text=key)
            browser.evaluate("document.getElementById('prompt').focus()")  # the key's change: the legend
            browser.wait_for("document.getElementById('legend').textContent.includes('small: ')")
            enter = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
            browser.call("Input.dispatchKeyEvent", type="rawKeyDown", **enter)
            browser.wait_for("document.querySelectorAll('.figures')[1]?.textContent.startsWith('4 tokens')")
            asked = browser.evaluate("messages")
            loaded = browser.evaluate(
                "[location.href, ...performance.getEntriesByType('resource').map((entry) => entry.name)]"
            )
        finally:
            browser.close()
        assert server.stop() == 0
    assert [m["role"] for m in asked] == ["user", "assistant"]  # type: ignore[union-attr]
    assert asked[0]["content"] == "what is 2+2?"  # type: ignore[index]
    assert all(url.startswith(server.url) and key not in url for url in loaded)  # type: ignore[union-attr]
    assert key not in server.log() and "POST /v1/chat/completions 200" in server.log()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_a_question_in_a_right_to_left_script_reads_right_to_left(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Hebrew or Arabic had been laid out left to right: the question mark at the wrong end, a sentence that
    mixes in a Latin word in the wrong order. Each turn takes the direction of its own text."""
    questions = ["מה זה Python?", "ما هو 2+2؟", "<b>hello</b> שלום"]
    with Server([*pair_args(tiny_pair), *TAU, "--max-tokens", "3"], tmp_path / "server.log") as server:
        browser = open_page(server, tmp_path / "chromium-profile")
        try:
            browser.evaluate("document.getElementById('prompt').focus()")
            browser.call("Input.insertText", text=questions[0])  # typed: the box turns right to left
            assert browser.evaluate("getComputedStyle(document.getElementById('prompt')).direction") == "rtl"
            for turn, question in enumerate(questions, 1):
                # the figures come with the last chunk, Send back once the stream closes: an Enter between
                # them sends nothing (one answer at a time), which a loaded machine had hit
                browser.wait_for("!document.getElementById('send').disabled")
                browser.evaluate(f"{PRESS_ENTER}({json.dumps(question)})")
                browser.wait_for(f"document.querySelectorAll('.figures')[{turn - 1}]?.textContent")
            directions = browser.evaluate(
                "[...document.querySelectorAll('.user')].map((turn) => getComputedStyle(turn).direction)"
            )
            shown = browser.evaluate(
                "[...document.querySelectorAll('.user')].map((turn) => turn.textContent)"
            )
        finally:
            browser.close()
        assert server.stop() == 0
    assert directions == ["rtl", "rtl", "ltr"]  # the first letter's script decides, as dir="auto" does
    assert shown == questions


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_enter_that_ends_an_input_method_composition_sends_nothing(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Japanese, Chinese or Korean typed through an input method: Enter picks the conversion (the keydown
    says isComposing) and had sent the half-typed question; only the next Enter sends it."""
    with Server([*pair_args(tiny_pair), *TAU, "--max-tokens", "4"], tmp_path / "server.log") as server:
        browser = open_page(server, tmp_path / "chromium-profile")
        try:
            browser.evaluate("document.getElementById('prompt').focus()")
            browser.call("Input.imeSetComposition", text="日本", selectionStart=2, selectionEnd=2)
            enter = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
            browser.call("Input.dispatchKeyEvent", type="rawKeyDown", **enter)
            browser.call("Input.dispatchKeyEvent", type="keyUp", **enter)
            browser.call("Input.insertText", text="日本")  # the input method commits the conversion
            assert browser.evaluate("document.getElementById('prompt').value") == "日本"
            assert browser.evaluate("document.querySelectorAll('.turn').length") == 0
            browser.call("Input.dispatchKeyEvent", type="rawKeyDown", **enter)  # now Enter sends it
            browser.wait_for("document.querySelector('.figures')?.textContent.startsWith('4 tokens')")
            assert browser.evaluate("messages[0]") == {"role": "user", "content": "日本"}
        finally:
            browser.close()
        assert server.stop() == 0


@contextlib.contextmanager
def another_site(pages: dict[str, str]) -> Iterator[str]:
    """A real HTTP server on another loopback port (and named localhost, not 127.0.0.1): a site of another
    origin than the server's, serving ``pages`` (path -> HTML). Yields its root URL."""

    class Site(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Site, name="localhost") as url:
        yield url


@contextlib.contextmanager
def a_browser_and_another_site(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> Iterator[tuple[Browser, dict[str, str], str, list[str]]]:
    """A browser, another site (``another_site``) serving the pages put in the dict, and the arguments of a
    server that answers 3 tokens: what a test of another site's reach starts from."""
    pages: dict[str, str] = {}
    browser = Browser(tmp_path / "chromium-profile")
    try:
        with another_site(pages) as site:
            yield browser, pages, site, [*pair_args(tiny_pair), *TAU, "--max-tokens", "3"]
    finally:
        browser.close()


@contextlib.contextmanager
def http_server(handler: type[http.server.BaseHTTPRequestHandler], name: str = "127.0.0.1") -> Iterator[str]:
    """A Python HTTP server on a free loopback port, in a thread; yields its address, the host as ``name``
    (localhost: another origin than 127.0.0.1's)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{name}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# Another site's page trying to use the server: the page framed with a question in its URL, and the API
# called with JSON (a CORS preflight first) and with text/plain (no preflight, an opaque answer).
FOREIGN_PAGE = """<!doctype html><meta charset="utf-8">
<iframe id="frame" src="SERVER/?q=asked%20by%20another%20site"></iframe>
<script>
const results = {};
document.getElementById("frame").onload = () => { results.framed = true; };
const ask = JSON.stringify({messages: [{role: "user", content: "asked by another site"}], max_tokens: 3});
const post = (type, more) =>
  fetch("SERVER/v1/chat/completions", {method: "POST", headers: {"Content-Type": type}, body: ask, ...more});
post("application/json", {})
  .then((r) => r.text(), (e) => "refused: " + e.message).then((t) => { results.json = t; });
post("text/plain", {mode: "no-cors"})
  .then((r) => r.type, (e) => "refused: " + e.message).then((t) => { results.plain = t; });
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_a_page_of_another_site_cannot_drive_the_server(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A foreign page's calls are refused, and so is framing the page: a hidden frame of /?q=PROMPT had asked
    the question from the server's own origin (the server generated for any site the user opened)."""
    with a_browser_and_another_site(tiny_pair, tmp_path) as (browser, pages, site, args):
        with Server(args, tmp_path / "server.log") as server:
            pages["/"] = FOREIGN_PAGE.replace("SERVER", server.url)
            browser.call("Page.navigate", url=f"{site}/")
            results = browser.wait_for("results.framed && results.json && results.plain && results")
            targets = browser.call("Target.getTargets")["targetInfos"]
            (frame,) = [target for target in targets if target["type"] == "iframe"]
            session = browser.call("Target.attachToTarget", targetId=frame["targetId"], flatten=True)
            framed = browser.call(  # what the frame shows: Chromium's error page, or the server's page
                "Runtime.evaluate",
                session=session["sessionId"],
                expression="[location.href, document.title]",
                returnByValue=True,
            )["result"]["value"]
            assert server.stop() == 0
        log = server.log()
        assert results == {"framed": True, "json": "refused: Failed to fetch", "plain": "opaque"}
        assert framed[1] != "ead serve" and not framed[0].startswith(server.url), framed  # refused
        assert "POST /v1/chat/completions 200" not in log, log
        assert log.count(f"403: pages at {site!r} may not use this server") == 2, log
        # the same page where the server names the site with --cors-origin: its JSON call is answered
        with Server([*args, "--cors-origin", site], tmp_path / "allowed.log") as allowed:
            pages["/"] = FOREIGN_PAGE.replace("SERVER", allowed.url)
            browser.call("Page.navigate", url=f"{site}/")
            results = browser.wait_for("results.framed && results.json && results.plain && results")
            assert allowed.stop() == 0
        assert json.loads(results["json"])["usage"]["completion_tokens"] == 3  # type: ignore[index]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_a_link_from_another_site_fills_the_box_without_asking(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """/?q=PROMPT opened by another site's link or script (not framed: a page of its own) had asked its
    question at once, from the server's own origin: any site the user visited made the server generate, and
    put its words in the user's conversation. It fills the box now, for the user to send or not; opened by
    the user (typed, a bookmark, another program) it still asks at once."""
    with (
        a_browser_and_another_site(tiny_pair, tmp_path) as (browser, pages, site, args),
        Server(args, tmp_path / "server.log") as server,
    ):
        asked = f"{server.url}/?q=asked%20by%20another%20site"
        pages["/"] = f"<!doctype html><script>location = {json.dumps(asked)}</script>"
        browser.call("Page.navigate", url=f"{site}/")
        browser.wait_for(f"location.href === {json.dumps(asked)} && document.readyState === 'complete'")
        box = browser.evaluate("document.getElementById('prompt').value")
        turns = browser.evaluate("document.querySelectorAll('.turn').length")
        browser.call("Page.navigate", url=asked)  # the user's own: asked at once
        browser.wait_for("document.querySelector('.figures')?.textContent.startsWith('3 tokens')")
        assert server.stop() == 0
    assert box == "asked by another site" and turns == 0
    assert server.log().count("POST /v1/chat/completions 200") == 1


# Markup put into the page as markup (as a page that rendered an answer's HTML would): whether its inline
# handler ran once the image failed to load.
INJECTED = """new Promise((done) => {
  const log = document.getElementById('log');
  log.insertAdjacentHTML('beforeend', '<img id="injected" src="x" onerror="window.ran = 1">');
  const image = document.getElementById('injected');
  image.addEventListener('error', () => setTimeout(() => done(window.ran ?? null)));
})"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_runs_no_script_but_its_own(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A question in HTML is shown as its text; and markup that ever reached the page as markup (a model's
    answer rendered, a regression) runs nothing: the page's Content-Security-Policy allows its own script
    and style alone (it had named only frame-ancestors), and none of the page's own is refused. The page's
    type is never sniffed, and its URL (a /?q=PROMPT) goes to no other site as a referrer."""
    question = '<img src=x onerror="window.ran = 2"><script>window.ran = 3</script> **bold**'
    with Server([*pair_args(tiny_pair), *TAU, "--max-tokens", "4"], tmp_path / "server.log") as server:
        head = httpx.get(f"{server.url}/").headers
        browser = Browser(tmp_path / "chromium-profile")
        try:
            browser.call("Page.enable")
            browser.call(  # every policy violation, from the page's first line on
                "Page.addScriptToEvaluateOnNewDocument",
                source="window.refused = []; document.addEventListener('securitypolicyviolation',"
                " (event) => refused.push(event.effectiveDirective))",
            )
            browser.call("Page.navigate", url=f"{server.url}/")
            browser.wait_for("document.getElementById('legend').textContent.includes('small: ')")
            browser.evaluate(f"{PRESS_ENTER}({json.dumps(question)})")
            browser.wait_for("document.querySelector('.figures').textContent.startsWith('4 tokens')")
            shown = browser.evaluate("document.querySelector('.user').textContent")
            markup = browser.evaluate("document.querySelectorAll('#log img, #log script').length")
            refused = browser.evaluate("refused")  # none of the page's own
            ran = browser.call("Runtime.evaluate", expression=INJECTED, awaitPromise=True, returnByValue=True)
            refused_injected = browser.evaluate("refused")
        finally:
            browser.close()
        assert server.stop() == 0
    assert shown == question and markup == 0
    assert refused == [] and ran["result"]["value"] is None
    assert sorted(refused_injected) == ["img-src", "script-src-attr"]  # type: ignore[arg-type]
    assert head["x-content-type-options"] == "nosniff" and head["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'self'" in head["content-security-policy"]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_says_when_the_server_is_lost(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A server killed mid-answer, then none at all, then one back on the port: each is said under its turn,
    and the next question is asked with the conversation as the page showed it. (The page had said nothing:
    the unhandled network error left an empty line under the answer and a question without its answer.)"""
    last_notes = "[...document.querySelectorAll('.figures')].at(-1)"
    lost = Server([*pair_args(tiny_pair), *TAU, "--max-tokens", str(LONG)], tmp_path / "lost.log")
    port = lost.url.rsplit(":", 1)[1]
    browser = open_page(lost, tmp_path / "chromium-profile")
    try:
        with lost:
            browser.evaluate(f"{PRESS_ENTER}('first')")
            browser.wait_for("document.querySelectorAll('.answer span').length > 3")
            lost.process.kill()
        notes = browser.wait_for(f"{last_notes}.classList.contains('error') && {last_notes}.textContent")
        assert str(notes).startswith("the answer broke off: the connection to the server was lost (")
        shown = browser.evaluate("document.querySelector('.answer').textContent")
        assert browser.evaluate(f"{PRESS_ENTER}('nobody there')") == [False, 2, ""]
        notes = browser.wait_for(f"{last_notes}.classList.contains('error') && {last_notes}.textContent")
        assert str(notes).startswith("no answer from the server (")
        args = [*pair_args(tiny_pair), *TAU, "--max-tokens", "4", "--port", port]
        with Server(args, tmp_path / "back.log") as back:
            assert browser.evaluate(f"{PRESS_ENTER}('second')") == [False, 3, ""]
            browser.wait_for(f"{last_notes}.textContent.startsWith('4 tokens')")
            asked = browser.evaluate("messages")
            assert back.stop() == 0
    finally:
        browser.close()
    assert [m["role"] for m in asked] == ["user", "assistant", "user", "assistant"]  # type: ignore[union-attr]
    assert asked[:3] == [  # type: ignore[index]
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": shown},
        {"role": "user", "content": "second"},
    ]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_legend_says_when_the_server_is_gone(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The legend asks again when the API key changes: with the server gone its unhandled failure had left
    the legend as it was, 'loading…' on a page opened then."""
    server = Server([*pair_args(tiny_pair), "--max-tokens", "4"], tmp_path / "server.log")
    browser = open_page(server, tmp_path / "chromium-profile")
    try:
        with server:
            assert server.stop() == 0
        browser.evaluate("document.getElementById('legend').textContent = 'loading…'")
        browser.evaluate("document.getElementById('key').dispatchEvent(new Event('change'))")
        shown = browser.wait_for(
            "!document.getElementById('legend').textContent.includes('loading')"
            " && document.getElementById('legend').textContent"
        )
    finally:
        browser.close()
    assert str(shown).startswith("models: no answer from the server (")


def a_proxy(refusal: dict[str, Any]) -> type[http.server.BaseHTTPRequestHandler]:
    """A proxy in front of the server: the page itself, and every API call refused with ``refusal``'s
    status, content type and body (which may be no OpenAI error object: a proxy's own page)."""
    page = (Path(__file__).parents[1] / "ead_cli" / "static" / "index.html").read_bytes()

    class Proxy(http.server.BaseHTTPRequestHandler):
        def answer(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/":
                self.answer(200, "text/html; charset=utf-8", page)
            else:
                self.answer(refusal["status"], refusal["type"], refusal["body"].encode())

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.answer(refusal["status"], refusal["type"], refusal["body"].encode())

        def log_message(self, *args: object) -> None:
            pass

    return Proxy


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_a_refusal_that_is_no_openai_error_shows_its_status_and_text(tmp_path: Path) -> None:
    """A 4xx whose body is a proxy's page, not OpenAI's error object: JSON of another shape had been an
    unhandled exception (nothing said under the question), HTML the status text alone."""
    last_notes = "[...document.querySelectorAll('.figures')].at(-1)"
    refusal = {
        "status": 403,
        "type": "text/html",
        "body": "<html><body><h1>Blocked</h1> by the proxy</body></html>",
    }
    browser = Browser(tmp_path / "chromium-profile")
    try:
        with http_server(a_proxy(refusal)) as url:
            browser.call("Page.navigate", url=f"{url}/")
            browser.wait_for("document.getElementById('legend').textContent.includes('403')")
            shown = []
            for body, kind in (
                (refusal["body"], "text/html"),
                ('{"detail": "Not authenticated"}', "application/json"),
                ("x" * 500, "text/plain"),
            ):
                refusal.update(body=body, type=kind)
                browser.evaluate(f"{PRESS_ENTER}('hi')")
                shown.append(
                    browser.wait_for(f"{last_notes}.classList.contains('error') && {last_notes}.textContent")
                )
                browser.evaluate(f"{last_notes}.parentNode.remove()")
    finally:
        browser.close()
    assert shown[:2] == [
        "403 Forbidden: Blocked by the proxy",
        '403 Forbidden: {"detail": "Not authenticated"}',
    ]
    assert shown[2] == "403 Forbidden: " + "x" * 200 + "… (500 characters)"


@pytest.mark.real
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/install_chromium.sh installs Debian's)")
def test_the_page_on_the_real_pair(real_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(real_pair), "--max-tokens", "24"], tmp_path / "server.log") as server:
        spans = check_page(server, "Write a Python function that reverses a string.", tmp_path / "page.png")
        assert "".join(text for _, text in spans).strip()
        assert server.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_right_after_the_first_line_is_a_clean_stop(
    tiny_pair: tuple[Path, Path], tmp_path: Path, sig: int
) -> None:
    """No moment between the first line and serving where a signal kills the server uncleanly."""
    with Server([*pair_args(tiny_pair)], tmp_path / "server.log") as server:
        assert server.stop(sig) == 0, server.log()
    assert server.log().splitlines()[-1] == "ead serve: stopped"


def test_no_reuse_reads_every_prompt_whole(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(tiny_pair), "--no-reuse"], tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": PROMPT}]
        for _ in range(2):
            reply = client.chat.completions.create(model="ead", messages=messages, max_tokens=4)
            figures = reply.model_extra["ead"]["summary"]
            # the model that writes (the large one alone, the default mode) reads the whole prompt each time
            assert max(m["prefill_tokens"] for m in figures["models"]) == figures["prompt_tokens"]
            assert reply.usage.prompt_tokens_details.cached_tokens == 0
        assert server.stop() == 0
    assert "(0 cached)" in server.log().splitlines()[-2]


def test_usage_counts_the_prompt_tokens_the_cache_kept(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """usage.prompt_tokens_details.cached_tokens, as OpenAI and llama-server report it: the prompt tokens
    a request did not read again, kept from the one before it (the server log's count), whole, streamed
    (in the usage chunk or the finish chunk), in both endpoints. A fresh server has kept none."""
    with Server([*pair_args(tiny_pair)], tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
        question = [{"role": "user", "content": PROMPT}]
        first = client.chat.completions.create(model="ead", messages=question, max_tokens=4)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        turn = [*question, {"role": "assistant", "content": first.choices[0].message.content}, *HI]
        second = client.chat.completions.create(model="ead", messages=turn, max_tokens=4)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert 0 < cached < second.usage.prompt_tokens
        figures = second.model_extra["ead"]["summary"]
        assert cached == figures["prompt_tokens"] - max(m["prefill_tokens"] for m in figures["models"])
        assert f"({cached} cached)" in server.log().splitlines()[-1]
        streamed = list(client.chat.completions.create(model="ead", messages=turn, max_tokens=4, stream=True))
        assert streamed[-1].usage.prompt_tokens_details.cached_tokens > 0
        with_usage = client.chat.completions.create(
            model="ead", messages=turn, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
        assert list(with_usage)[-1].usage.prompt_tokens_details.cached_tokens > 0
        text = "def fib(n):"
        client.completions.create(model="ead", prompt=text, max_tokens=4)
        again = client.completions.create(model="ead", prompt=f"{text} return", max_tokens=4)
        assert again.usage.prompt_tokens_details.cached_tokens > 0
        assert server.stop() == 0


def test_a_client_that_leaves_a_whole_answer_stops_it_too(server: Server) -> None:
    """Not streamed: the server looks whether the client is still there while it generates."""
    before = len(server.log().splitlines())
    long = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": LONG}
    with pytest.raises(httpx.ReadTimeout):  # seconds of generation: the client gives up after one
        httpx.post(f"{server.base_url}/chat/completions", json=long, timeout=1)
    ok = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HI, "max_tokens": 3}, timeout=60)
    assert ok.json()["usage"]["completion_tokens"] == 3
    new = server.log().splitlines()[before:]
    stopped = [line for line in new if line.startswith("stopped after")]
    assert len(stopped) == 1 and int(stopped[0].split()[2]) < LONG, new
