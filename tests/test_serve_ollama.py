"""ollama's API on `ead serve`: a real server on the tiny pair, real HTTP, NDJSON read line by line, each
answer the same as the OpenAI route's for the same greedy request."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama as ollama_client
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, HI, JSON, LONG, TAU, serving
from test_serve_json import PERSON
from test_serve_safety import exchange
from test_serve_tools import CALL_SCHEMA, TOOLS, tools_server  # noqa: F401 (a fixture)

from ead_cli.bench import native
from ead_cli.remote import built_server
from ead_cli.serve.app import MAX_BODY_BYTES, MAX_HEAD_BYTES
from ead_cli.serve.ollama import _ollama_call
from ead_cli.serve.tools import ToolCall, split_answer

NAMES = frozenset({"multiply"})
GREEDY = {"temperature": 0, "num_predict": 16}
OPENAI_GREEDY = {"temperature": 0, "max_tokens": 16}


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        [*pair_args(tiny_pair), *TAU, *CTX], tmp_path_factory.mktemp("serve-ollama") / "server.log"
    ) as running:
        yield running


def ollama(server: Server, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}/api/{path}", json=body, headers={**JSON, **headers}, timeout=120)


def ndjson(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed answer's lines, each parsed as it comes: every line one JSON object."""
    lines = []
    with httpx.stream("POST", f"{server.url}/api/{path}", json=body, headers=JSON, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"] == "application/x-ndjson"
        for line in reply.iter_lines():
            lines.append(json.loads(line))
    return lines


def openai_chat(server: Server, **body: Any) -> dict[str, Any]:
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def attribution(tokens: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(token["token"], token["model"]) for token in tokens]


def test_version_and_tags_list_the_one_model(server: Server, tiny_pair: tuple[Path, Path]) -> None:
    version = httpx.get(f"{server.url}/api/version").json()["version"]
    assert [int(part) for part in version.split(".")] >= [0, 1, 0]
    (model,) = httpx.get(f"{server.url}/api/tags").json()["models"]
    assert model["name"] == model["model"] == "ead:latest"
    assert model["size"] == sum(path.stat().st_size for path in tiny_pair)  # the files' bytes, as ollama's
    assert model["details"]["quantization_level"] == "F32"  # the tiny models' file type, as ollama names it
    assert model["details"]["format"] == "gguf" and model["digest"]
    assert set(model["ead"]["models"]) == {"small", "large"}
    shown = ollama(server, "show", {"model": "ead"}).json()
    assert shown["details"] == model["details"] and shown["capabilities"] == ["completion"]
    assert shown["model_info"]["ead.context_length"] == 16384


@pytest.mark.skipif(not built_server().exists(), reason="no llama-server: ./scripts/build_llama_server.sh")
def test_a_model_on_a_llama_server_adds_no_bytes_to_the_size(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The size counts the files on the server's machine: the large model's is on the llama-server's."""
    with native.llama_server(tiny_pair[1], ["-c", "512", "-t", "1"], tmp_path / "peer.log") as peer:
        args = ["--small", str(tiny_pair[0]), "--large", peer.url, "--threads", "1"]
        with serving(args, tmp_path / "server.log") as server:
            (model,) = httpx.get(f"{server.url}/api/tags").json()["models"]
    assert model["size"] == tiny_pair[0].stat().st_size


def test_chat_streamed_and_whole_equal_the_openai_route(server: Server) -> None:
    expected = openai_chat(server, messages=HI, **OPENAI_GREEDY)
    text = expected["choices"][0]["message"]["content"]

    lines = ndjson(server, "chat", {"model": "ead", "messages": HI, "options": GREEDY})  # streamed by default
    *parts, last = lines
    assert all(part["done"] is False and part["message"]["role"] == "assistant" for part in parts)
    assert "".join(part["message"]["content"] for part in parts) == text
    assert attribution([part["ead"] for part in parts]) == attribution(expected["ead"]["tokens"])
    assert {part["ead"]["model"] for part in parts} == {"small", "large"}
    assert last["done"] is True and last["done_reason"] == "length" and last["message"]["content"] == ""
    assert last["eval_count"] == 16 and last["prompt_eval_count"] == expected["usage"]["prompt_tokens"]
    assert all(isinstance(last[key], int) for key in ("total_duration", "eval_duration", "load_duration"))
    assert last["model"] == "ead" and last["ead"]["summary"]["generated"] == 16

    whole = ollama(
        server, "chat", {"model": "ead:latest", "messages": HI, "options": GREEDY, "stream": False}
    )
    answer = whole.json()
    assert answer["message"] == {"role": "assistant", "content": text} and answer["done"] is True
    assert answer["model"] == "ead:latest" and answer["done_reason"] == "length"
    assert attribution(answer["ead"]["tokens"]) == attribution(expected["ead"]["tokens"])


def test_generate_is_a_chat_turn_or_with_raw_the_prompt_as_is(server: Server) -> None:
    system = {"role": "system", "content": "Be brief."}
    chat = openai_chat(server, messages=[system, *HI], **OPENAI_GREEDY)["choices"][0]["message"]["content"]
    body = {"model": "ead", "prompt": "hi", "system": "Be brief.", "options": GREEDY}
    *parts, last = ndjson(server, "generate", body)
    assert "".join(part["response"] for part in parts) == chat and last["response"] == ""
    assert ollama(server, "generate", {**body, "stream": False}).json()["response"] == chat

    reply = httpx.post(
        f"{server.base_url}/completions",
        json={"prompt": "def fib(n):", **OPENAI_GREEDY},
        headers=JSON,
        timeout=120,
    )
    raw = {"model": "ead", "prompt": "def fib(n):", "raw": True, "options": GREEDY, "stream": False}
    assert ollama(server, "generate", raw).json()["response"] == reply.json()["choices"][0]["text"]


def test_format_takes_the_json_grammar_as_response_format_does(server: Server) -> None:
    for ollama_format, openai_format in (
        ("json", {"type": "json_object"}),
        (PERSON, {"type": "json_schema", "json_schema": {"name": "format", "schema": PERSON}}),
    ):
        expected = openai_chat(server, messages=HI, response_format=openai_format, **OPENAI_GREEDY)
        body = {"model": "ead", "messages": HI, "format": ollama_format, "options": GREEDY, "stream": False}
        content = ollama(server, "chat", body).json()["message"]["content"]
        assert content == expected["choices"][0]["message"]["content"] and content.lstrip().startswith("{")


def test_an_empty_request_loads_the_model_as_ollama_answers_it(server: Server) -> None:
    loaded = ollama(server, "chat", {"model": "ead", "messages": []}).json()
    assert loaded["done"] is True and loaded["done_reason"] == "load"
    assert ollama(server, "generate", {"model": "ead"}).json()["done_reason"] == "load"


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("chat", {"model": "llama3.2", "messages": HI}, 404, "model 'llama3.2' not found"),
        ("show", {"model": "llama3.2"}, 404, "not found"),
        ("generate", {"prompt": "hi"}, 400, "model: Field required"),
        ("chat", {"model": "ead", "messages": HI, "options": {"num_ctx": 32768}}, 400, "options.num_ctx"),
        (
            "chat",
            {"model": "ead", "messages": HI, "options": {"temperature": "hot"}},
            400,
            "options.temperature",
        ),
        (
            "chat",
            {"model": "ead", "messages": HI, "options": {"dynatemp_range": 0.5}},
            400,
            "options.dynatemp_range",
        ),
        ("chat", {"model": "ead", "messages": HI, "format": "yaml"}, 400, "format"),
        ("chat", {"model": "ead", "messages": HI, "format": {"$ref": "#/nowhere"}}, 400, "format cannot be"),
        ("chat", {"model": "ead", "messages": HI, "think": True}, 400, "think"),
        (
            "chat",
            {"model": "ead", "messages": HI, "tools": [{"type": "function"}]},
            400,
            "tools.0.function: Field required",
        ),
        ("chat", {"model": "ead", "messages": [{"role": "user", "images": ["AA=="]}]}, 400, "images"),
        ("generate", {"model": "ead", "prompt": "hi", "raw": True, "system": "x"}, 400, "system"),
        ("generate", {"model": "ead", "prompt": "hi", "context": [1, 2]}, 400, "context"),
        ("generate", {"model": "ead", "prompt": "x", "ead": {"mode": "nope"}}, 400, "ead.mode"),
    ],
)
def test_bad_requests_get_ollamas_error_object(
    server: Server, path: str, body: dict[str, Any], status: int, fragment: str
) -> None:
    reply = ollama(server, path, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert isinstance(error, str) and "\n" not in error and fragment in error, error


def test_a_body_that_is_no_json_is_a_400_in_ollamas_shape(server: Server) -> None:
    reply = httpx.post(f"{server.url}/api/chat", content=b"{nope", headers=JSON)
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]
    assert "Traceback" not in server.log()


def test_the_api_key_guards_ollamas_routes_as_openais(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(tiny_pair), "--api-key", "s3cret"], tmp_path / "server.log") as server:
        for path in ("version", "tags"):
            refused = httpx.get(f"{server.url}/api/{path}")
            assert refused.status_code == 401 and "API key" in refused.json()["error"]
        for path in ("pull", "copy"):
            refused = ollama(server, path, {"model": "ead"})
            assert refused.status_code == 401 and "API key" in refused.json()["error"]
        refused = ollama(server, "chat", {"model": "ead", "messages": HI})
        assert refused.status_code == 401 and "API key" in refused.json()["error"]
        key = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{server.url}/api/tags", headers=key).status_code == 200
        body = {"model": "ead", "messages": HI, "options": {"num_predict": 2}, "stream": False}
        assert ollama(server, "chat", body, **key).json()["done"] is True
        assert server.stop() == 0


def test_a_null_field_is_one_left_out_as_on_the_openai_routes(server: Server) -> None:
    message = {"role": "user", "content": "hi", "images": None, "tool_calls": None}
    body = {"model": "ead", "messages": [message], "stream": None, "options": {"num_predict": 2}}
    lines = ndjson(server, "chat", body)  # streamed: the default
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == 2
    generate = {"model": "ead", "prompt": "hi", "raw": None, "stream": False, "options": {"num_predict": 2}}
    assert ollama(server, "generate", generate).json()["done"] is True


def test_a_client_that_leaves_a_stream_stops_its_generation(server: Server) -> None:
    before = len(server.log().splitlines())
    body = {"model": "ead", "messages": HI, "options": {"num_predict": LONG}}
    with httpx.stream("POST", f"{server.url}/api/chat", json=body, headers=JSON, timeout=120) as reply:
        assert json.loads(next(reply.iter_lines()))["done"] is False  # generating
    answered = ollama(
        server, "chat", {"model": "ead", "messages": HI, "options": {"num_predict": 3}, "stream": False}
    )
    assert answered.json()["eval_count"] == 3
    new = server.log().splitlines()[before:]
    stopped = [line for line in new if line.startswith("stopped after")]
    assert len(stopped) == 1 and int(stopped[0].split()[2]) < LONG, new


def test_a_format_no_answer_can_meet_is_ollamas_error_whole_and_streamed(server: Server) -> None:
    """The grammar leaves no token after the opening quote: a 400 whole, an error line ending a stream,
    each naming the request's field as ollama spells it; the server goes on serving."""
    body = {"model": "ead", "messages": HI, "format": {"type": "string", "pattern": "^[b-a]$"}}
    whole = ollama(server, "chat", {**body, "stream": False})
    assert whole.status_code == 400 and whole.json()["error"].startswith("format: "), whole.text
    *_, last = ndjson(server, "chat", body)
    assert last["error"].startswith("format: ") and "allows no token" in last["error"], last
    assert ollama(server, "chat", {"model": "ead", "messages": HI, "stream": False}).json()["done"] is True


def test_tool_calls_come_back_in_ollamas_shape_whole_and_streamed(tools_server: Server) -> None:  # noqa: F811
    """JSON mode makes the tiny model write a bare call of a tool offered: ``message.tool_calls`` with the
    arguments as an object, as ollama sends them, the same whole and streamed and as the OpenAI route
    reads it; a conversation with the call and the tool's answer sent back is taken."""
    shown = ollama(tools_server, "show", {"model": "ead"}).json()
    assert shown["capabilities"] == ["completion", "tools"]  # the template renders tools
    ask = [{"role": "user", "content": "What is 6 times 7?"}]
    body = {
        "model": "ead",
        "messages": ask,
        "tools": TOOLS,
        "format": CALL_SCHEMA,
        "options": {"temperature": 0, "num_predict": 60},
    }
    expected = openai_chat(
        tools_server,
        messages=ask,
        tools=TOOLS,
        response_format={"type": "json_schema", "json_schema": {"name": "format", "schema": CALL_SCHEMA}},
        temperature=0,
        max_tokens=60,
    )
    (openai_call,) = expected["choices"][0]["message"]["tool_calls"]
    call = {
        "function": {
            "index": 0,
            "name": "multiply",
            "arguments": json.loads(openai_call["function"]["arguments"]),
        }
    }
    whole = ollama(tools_server, "chat", {**body, "stream": False}).json()
    assert whole["message"] == {"role": "assistant", "content": "", "tool_calls": [call]}, whole
    lines = ndjson(tools_server, "chat", body)
    assert [c for line in lines for c in line["message"].get("tool_calls", [])] == [call]
    assert "".join(line["message"]["content"] for line in lines) == ""
    turn = [
        *ask,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_name": "multiply", "content": "42"},
    ]
    answered = ollama(
        tools_server,
        "chat",
        {"model": "ead", "messages": turn, "tools": TOOLS, "options": {"num_predict": 2}, "stream": False},
    )
    assert answered.status_code == 200 and answered.json()["done"] is True, answered.text


def test_a_call_whose_arguments_are_no_json_object_stays_text() -> None:
    """ollama's clients read a call's arguments as an object (the official client's model refused the
    whole answer over a string): a call whose arguments the model wrote as a string that is no JSON
    object stays the answer's text, bare or tagged, as ollama leaves what it cannot read as a call; a
    JSON text of an object is a call, its arguments that object. The OpenAI routes' reading is unchanged."""
    written = '{"name": "multiply", "arguments": "6 and 7"}'
    for answer in (written, f"<tool_call>{written}</tool_call>"):
        assert split_answer(answer, NAMES, objects_only=True) == (answer, [])
    assert split_answer(written, NAMES) == ("", [ToolCall("multiply", "6 and 7")])
    encoded = json.dumps({"name": "multiply", "arguments": json.dumps({"a": 6})})
    _, (call,) = split_answer(encoded, NAMES, objects_only=True)
    read = ollama_client.Message.ToolCall.model_validate(_ollama_call(call, 0))
    assert read.function.name == "multiply" and read.function.arguments == {"a": 6}


def test_ollamas_curl_example_without_a_content_type_is_answered(server: Server) -> None:
    """ollama's docs post with a bare ``curl -d`` (``application/x-www-form-urlencoded``), which ollama
    takes: so does ead where no web page sent it (no Origin). From a page, only JSON, as on /v1: a page
    may post a form anywhere without asking first."""
    body = json.dumps({"model": "ead", "prompt": "hi", "stream": False, "options": GREEDY})
    command = ["curl", "-sS", f"{server.url}/api/generate", "-d", body]
    curl = subprocess.run(command, capture_output=True, timeout=120, check=True)
    answer = json.loads(curl.stdout)
    assert answer["done"] is True and answer["eval_count"] >= 1
    assert answer["response"] == ollama(server, "generate", json.loads(body)).json()["response"]
    from_page = httpx.post(
        f"{server.url}/api/generate",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded", "Origin": server.url},
        timeout=120,
    )
    assert from_page.status_code == 415
    assert "application/json" in from_page.json()["error"]


def client(server: Server) -> ollama_client.Client:
    return ollama_client.Client(host=server.url, timeout=120)


def test_the_official_client_lists_shows_and_answers(server: Server) -> None:
    """ollama's own Python client reads every answer into its pydantic models: the list (modified_at a
    datetime), show, a chat whole and streamed, generate, each the same as the raw route's answer."""
    talk = client(server)
    (listed,) = talk.list().models
    assert listed.model == "ead:latest" and listed.modified_at is not None and listed.details.format == "gguf"
    shown = talk.show("ead")
    assert shown.modified_at is not None and shown.capabilities == ["completion"]
    assert shown.modelinfo["ead.context_length"] == 16384

    expected = ollama(server, "chat", {"model": "ead", "messages": HI, "options": GREEDY, "stream": False})
    whole = talk.chat(model="ead", messages=HI, options=GREEDY)
    assert whole.message.content == expected.json()["message"]["content"] and whole.eval_count == 16
    assert whole.done and whole.done_reason == "length"
    parts = list(talk.chat(model="ead", messages=HI, options=GREEDY, stream=True))
    assert "".join(part.message.content or "" for part in parts) == whole.message.content
    assert parts[-1].done and not any(part.done for part in parts[:-1])

    generated = talk.generate(model="ead", prompt="hi", options=GREEDY)
    assert (
        generated.response
        == ollama(
            server, "generate", {"model": "ead", "prompt": "hi", "options": GREEDY, "stream": False}
        ).json()["response"]
    )
    streamed = talk.generate(model="ead", prompt="hi", options=GREEDY, stream=True)
    assert "".join(part.response or "" for part in streamed) == generated.response


def test_the_official_clients_options_and_format_are_taken(server: Server) -> None:
    """Its Options (num_predict, temperature, seed, stop) and format="json" mean what they mean to ollama:
    a seed's answer the same twice, a stop string cuts the answer before it, JSON mode writes JSON."""
    talk = client(server)
    sampled = {"num_predict": 12, "temperature": 0.9, "seed": 7}
    first = talk.chat(model="ead", messages=HI, options=sampled).message.content
    assert (
        first == talk.chat(model="ead", messages=HI, options=ollama_client.Options(**sampled)).message.content
    )
    text = talk.generate(model="ead", prompt="hi", options=GREEDY).response
    stop = text.strip()[len(text.strip()) // 2 :][:2]
    assert stop and stop in text
    stopped = talk.generate(model="ead", prompt="hi", options={**GREEDY, "stop": [stop]})
    assert stopped.response == text[: text.index(stop)] and stopped.done_reason == "stop"
    as_json = talk.chat(model="ead", messages=HI, format="json", options=GREEDY).message.content
    assert (
        as_json
        == ollama(
            server,
            "chat",
            {"model": "ead", "messages": HI, "format": "json", "options": GREEDY, "stream": False},
        ).json()["message"]["content"]
    )
    assert as_json.lstrip().startswith("{")


def scores(entries: list[Any]) -> tuple[list[str], list[float]]:
    """Log-probabilities as lists (each token's text then its alternatives', and their values), from
    OpenAI's dicts or the ollama client's models alike; the values compared approximately, as one read
    after a cached prefix differs in the last bits."""
    tokens, values = [], []
    for entry in entries:
        for scored in [entry, *entry["top_logprobs"]]:
            tokens.append(scored["token"])
            values.append(scored["logprob"])
    return tokens, values


def same_scores(entries: list[Any], expected: list[Any]) -> bool:
    (tokens, values), (expected_tokens, expected_values) = scores(entries), scores(expected)
    return tokens == expected_tokens and values == pytest.approx(expected_values, abs=1e-5)


def test_logprobs_come_back_in_ollamas_shape_as_the_openai_routes_score_them(server: Server) -> None:
    """The official client's ``logprobs=True, top_logprobs=N`` (ollama's since 0.12.11): each token shown
    with its log-probability, bytes and N alternatives, whole and streamed, the scores the OpenAI chat
    route gives the same greedy request; a raw generate's those of /v1/completions; none unless asked."""
    talk = client(server)
    expected = openai_chat(server, messages=HI, logprobs=True, top_logprobs=2, **OPENAI_GREEDY)
    content = expected["choices"][0]["logprobs"]["content"]
    assert len(content) == 16 and all(len(entry["top_logprobs"]) == 2 for entry in content)
    whole = talk.chat(model="ead", messages=HI, options=GREEDY, logprobs=True, top_logprobs=2)
    assert same_scores(list(whole.logprobs or []), content)
    parts = talk.chat(model="ead", messages=HI, options=GREEDY, logprobs=True, top_logprobs=2, stream=True)
    assert same_scores([entry for part in parts for entry in part.logprobs or []], content)
    generated = talk.generate(model="ead", prompt="hi", options=GREEDY, logprobs=True, top_logprobs=2)
    assert same_scores(list(generated.logprobs or []), content)
    body = {"model": "ead", "messages": HI, "options": GREEDY, "stream": False, "logprobs": True}
    (first, *_) = ollama(server, "chat", body).json()["logprobs"]
    assert first["bytes"] == content[0]["bytes"] and first["top_logprobs"] == []  # as ollama's, bytes too

    completion = httpx.post(
        f"{server.base_url}/completions",
        json={"prompt": "hi", "logprobs": 1, **OPENAI_GREEDY},
        headers=JSON,
        timeout=120,
    ).json()["choices"][0]["logprobs"]
    raw = talk.generate(model="ead", prompt="hi", raw=True, options=GREEDY, logprobs=True, top_logprobs=1)
    listed = list(raw.logprobs or [])
    assert [entry.logprob for entry in listed] == pytest.approx(completion["token_logprobs"], abs=1e-5)
    assert [entry.top_logprobs[0].logprob for entry in listed] == pytest.approx(
        [max(top.values()) for top in completion["top_logprobs"]], abs=1e-5
    )
    assert talk.chat(model="ead", messages=HI, options=GREEDY).logprobs is None
    unasked = {"model": "ead", "messages": HI, "options": GREEDY, "stream": False, "top_logprobs": 2}
    assert "logprobs" not in ollama(server, "chat", unasked).json()  # top_logprobs alone: read with logprobs


def test_the_official_client_raises_its_error_for_an_unknown_model(server: Server) -> None:
    with pytest.raises(ollama_client.ResponseError) as raised:
        client(server).chat(model="llama3.2", messages=HI)
    assert raised.value.status_code == 404 and "model 'llama3.2' not found" in raised.value.error


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
      a: the first factor
      b: the second factor

    Returns:
      the product
    """
    return a * b


def test_the_official_client_passes_a_python_function_as_a_tool(tools_server: Server) -> None:  # noqa: F811
    """A function given as a tool (the client writes its schema from the signature and docstring) is
    offered, and the call the model writes comes back in the client's ToolCall, its arguments a mapping
    the function takes; the tool's answer sent back as the client builds it is taken."""
    talk = client(tools_server)
    ask = [{"role": "user", "content": "What is 6 times 7?"}]
    factor = {"type": "integer", "minimum": 0, "maximum": 99}  # the tiny model's digits cut short
    arguments = {**CALL_SCHEMA["properties"]["arguments"], "properties": {"a": factor, "b": factor}}
    call_schema = {**CALL_SCHEMA, "properties": {**CALL_SCHEMA["properties"], "arguments": arguments}}
    answer = talk.chat(
        model="ead",
        messages=ask,
        tools=[multiply],
        format=call_schema,
        options={"temperature": 0, "num_predict": 60},
    )
    (call,) = answer.message.tool_calls
    assert call.function.name == "multiply"
    result = multiply(**call.function.arguments)
    turn = [*ask, answer.message, {"role": "tool", "tool_name": "multiply", "content": str(result)}]
    final = talk.chat(model="ead", messages=turn, tools=[multiply], options={"num_predict": 2})
    assert final.done and final.eval_count == 2


def test_ps_lists_the_loaded_model_and_keep_alive_is_taken_and_ignored(server: Server) -> None:
    """Open WebUI asks /api/ps which models are loaded, and clients send keep_alive (0: unload now): the
    one model is listed as loaded for good, and keep_alive, any of the client's spellings, changes
    nothing: the answer is given and the model stays listed."""
    talk = client(server)
    (loaded,) = talk.ps().models
    (listed,) = talk.list().models
    assert loaded.model == loaded.name == "ead:latest" and loaded.digest == listed.digest
    assert loaded.size == listed.size > 0 and loaded.size_vram == 0
    assert loaded.details == listed.details and loaded.context_length == 16384
    assert loaded.expires_at is not None and loaded.expires_at.year == 9999
    for keep_alive in (0, "5m", -1, 2.5):
        answer = talk.chat(model="ead", messages=HI, options={"num_predict": 2}, keep_alive=keep_alive)
        assert answer.done and answer.eval_count == 2
    assert talk.generate(model="ead", keep_alive=0).done_reason == "load"  # ollama's "unload": still 200
    assert [model.model for model in talk.ps().models] == ["ead:latest"]


CLOSE = b"Connection: close\r\n\r\n"


@pytest.mark.parametrize(
    ("data", "status", "fragment"),
    [
        (
            b"POST /api/chat HTTP/1.1\r\nHost: HOST\r\nContent-Length: %d\r\n" % (MAX_BODY_BYTES + 1) + CLOSE,
            b"413",
            "over",
        ),
        (
            b"POST /api/chat HTTP/1.1\r\nHost: HOST\r\nOrigin: https://evil.example\r\n" + CLOSE,
            b"403",
            "may not use",
        ),
        (b"POST /api/chat HTTP/1.1\r\nHost: evil.example\r\n" + CLOSE, b"403", "not a loopback name"),
        (b"POST /api/chat HTTP/2.0\r\nHost: HOST\r\n\r\n", b"505", "HTTP/2.0 is not served"),
        (
            b"POST http://HOST/api/chat HTTP/1.1\r\nHost: HOST\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"501",
            "not implemented",
        ),
        (
            b"GET /api/tags HTTP/1.1\r\nHost: HOST\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n",
            b"431",
            "over 16 KiB",
        ),
        (b"GET /api/tags HTTP/1.1\r\nHost: HOST\r\nContent-Length: abc\r\n\r\n", b"400", "not valid HTTP"),
    ],
)
def test_refusals_before_the_routes_are_ollamas_error_on_its_api(
    server: Server, data: bytes, status: bytes, fragment: str
) -> None:
    """The Guard's refusals (a body too large by its Content-Length, a page's Origin, a foreign Host) and
    the protocol's own (an HTTP version, a transfer coding, a head too large, no HTTP at all) answer
    /api/* in ollama's one-line shape, as the routes' errors do: its clients read ``error`` as a text."""
    head, body = exchange(server, data)
    assert head[0].split()[1] == status, head
    error = json.loads(body)["error"]
    assert isinstance(error, str) and fragment in error, error


def test_a_stop_past_its_timeout_ends_an_ollama_stream_with_its_error_line(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """--shutdown-timeout runs out while an NDJSON stream is written: its last line is ollama's error
    line, which its clients raise, not an SSE event it cannot read (nor a stream cut without a word)."""
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--shutdown-timeout", "1"]
    with Server(args, tmp_path / "server.log") as server:
        body = {"model": "ead", "messages": HI, "options": {"num_predict": LONG}}
        with httpx.stream("POST", f"{server.url}/api/chat", json=body, headers=JSON, timeout=120) as reply:
            lines = reply.iter_lines()
            assert json.loads(next(lines))["done"] is False  # generating
            server.process.terminate()
            *_, last = [json.loads(line) for line in lines]
        assert last == {"error": "the server is stopping: this request was cut off"}, last
        assert server.process.wait(timeout=60) == 0
    assert "Traceback" not in server.log()


def test_a_pull_of_the_model_served_succeeds_as_ollamas_of_one_it_has(server: Server) -> None:
    """Clients pull a model before they use it (Open WebUI, scripts): a pull of the model served answers
    as ollama's of a model it has, ``{"status": "success"}`` whole or as the stream's last line, under
    either of ollama's spellings of the name; a pull of any other is ollama's 404, saying how to serve it."""
    talk = client(server)
    assert talk.pull("ead").status == "success"
    assert [part.status for part in talk.pull("ead:latest", stream=True)] == ["success"]
    older = httpx.post(f"{server.url}/api/pull", json={"name": "ead", "stream": False}, headers=JSON)
    assert older.status_code == 200 and older.json() == {"status": "success"}
    for stream in (False, True):
        with pytest.raises(ollama_client.ResponseError) as raised:
            list(talk.pull("llama3.2", stream=True)) if stream else talk.pull("llama3.2")
        assert raised.value.status_code == 404, raised.value
        assert "model 'llama3.2' not found" in raised.value.error and "ead models pull" in raised.value.error
    nameless = httpx.post(f"{server.url}/api/pull", json={"stream": False}, headers=JSON)
    assert nameless.status_code == 400 and nameless.json() == {"error": "model is required"}


def test_model_management_is_ollamas_error_saying_what_to_do_instead(server: Server, tmp_path: Path) -> None:
    """A server of the models it was started with deletes, copies, creates and pushes none, nor takes a
    blob: each of the official client's calls raises its ResponseError, a 501 whose one line says what
    to do instead, never a 404 of a path not served; the server answers on."""
    talk = client(server)
    blob = tmp_path / "model.gguf"
    blob.write_bytes(b"GGUF")
    calls = {
        "delete": (lambda: talk.delete("ead"), "ead models rm"),
        "copy": (lambda: talk.copy("ead", "mine"), "--any-model"),
        "create": (lambda: talk.create(model="mine", from_="ead"), "--small"),
        "push": (lambda: talk.push("ead"), "pushes no models"),
        "blob": (lambda: talk.create_blob(blob), "--small"),
    }
    for name, (call, fragment) in calls.items():
        with pytest.raises(ollama_client.ResponseError) as raised:
            call()
        error = raised.value.error
        assert raised.value.status_code == 501 and fragment in error and "\n" not in error, (name, error)
    digest = f"{server.url}/api/blobs/sha256:{'0' * 64}"
    assert httpx.head(digest).status_code == 501  # ollama's check before a POST of the blob
    assert httpx.get(f"{server.url}/api/delete").status_code == 405  # DELETE, as ollama routes it
    assert talk.chat(model="ead", messages=HI, options={"num_predict": 2}).done
