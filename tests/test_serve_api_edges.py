"""The hard cases of `ead serve`'s Responses API (/v1/responses) and Anthropic's Messages API
(/v1/messages): a client that leaves mid-stream, a full queue, bad HTTP, both streams at once, and a stop
(SIGTERM, Ctrl-C) that cuts a stream off, each answered in its API's shape. A real server on the tiny
pair, driven by httpx, raw sockets and the official openai and anthropic clients."""

from __future__ import annotations

import json
import signal
import threading
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
from test_serve_safety import exchange, wait_until

KEY = "s3cret"
HEADERS = {**JSON, "x-api-key": KEY, "anthropic-version": "2023-06-01"}
HI = [{"role": "user", "content": "hi"}]
CUT_OFF = "the server is stopping: this request was cut off"


def responses_body(max_tokens: int, **fields: Any) -> dict[str, Any]:
    return {"input": "hi", "max_output_tokens": max_tokens, "temperature": 0, **fields}


def messages_body(max_tokens: int, **fields: Any) -> dict[str, Any]:
    return {"model": "ead", "messages": HI, "max_tokens": max_tokens, "temperature": 0, **fields}


# each API's path and a greedy request of it, by its name
BODIES = {"/v1/responses": responses_body, "/v1/messages": messages_body}


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One place in the queue: a second request waits behind the one generating, a third is refused."""
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--queue", "1", "--api-key", KEY]
    with serving(args, tmp_path_factory.mktemp("serve-api-edges") / "server.log") as running:
        yield running


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=HEADERS, timeout=120)


def events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A stream's events, each its name (the type in its data where it has none) and its data."""
    name = ""
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            yield name or data.get("type", ""), data
            name = ""


def text_of(path: str, read: list[tuple[str, dict[str, Any]]]) -> str:
    """A stream's answer text, read from its deltas."""
    if path == "/v1/responses":
        return "".join(data["delta"] for name, data in read if name == "response.output_text.delta")
    return "".join(
        data["delta"]["text"]
        for name, data in read
        if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
    )


def streamed(server: Server, path: str, max_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    body = BODIES[path](max_tokens, stream=True)
    with httpx.stream("POST", f"{server.url}{path}", json=body, headers=HEADERS, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        return list(events(reply.iter_lines()))


def new_lines(server: Server, before: int) -> list[str]:
    """The log's lines after its first ``before``."""
    return server.log().splitlines()[before:]


def is_delta(name: str) -> bool:
    return name in ("response.output_text.delta", "content_block_delta")


@pytest.mark.parametrize("path", list(BODIES))
def test_a_client_that_leaves_mid_stream_cancels_its_answer(server: Server, path: str) -> None:
    """It closes its socket after a few deltas: the generation stops (one line says its client went
    away), and the next request is answered."""
    before = len(server.log().splitlines())
    body = BODIES[path](LONG, stream=True)
    with httpx.stream("POST", f"{server.url}{path}", json=body, headers=HEADERS, timeout=120) as reply:
        read = events(reply.iter_lines())
        deltas = 0
        while deltas < 3:
            deltas += is_delta(next(read)[0])
    wait_until(lambda: any(line.startswith("stopped after") for line in new_lines(server, before)), 60)
    assert post(server, path, BODIES[path](3)).status_code == 200
    new = new_lines(server, before)
    stopped = [line for line in new if line.startswith("stopped after")]
    assert len(stopped) == 1 and int(stopped[0].split()[2]) < LONG, new
    assert stopped[0].endswith("went away"), new


def test_a_full_queue_is_a_503_in_each_apis_shape_with_retry_after(server: Server) -> None:
    """One stream generating, one waiting: a third request is refused in the shape of its API, OpenAI's
    object on /v1/responses, Anthropic's ``overloaded_error`` on /v1/messages; the waiting one is
    served once the first leaves."""
    body = messages_body(LONG, stream=True)
    with httpx.stream("POST", f"{server.url}/v1/messages", json=body, headers=HEADERS, timeout=120) as first:
        read = events(first.iter_lines())
        while not is_delta(next(read)[0]):
            pass
        with ThreadPoolExecutor(1) as waiter:
            waiting = waiter.submit(streamed, server, "/v1/responses", 4)
            wait_until(lambda: httpx.get(f"{server.url}/health").json()["waiting"] == 1, 60)
            before = len(server.log().splitlines())
            refused = post(server, "/v1/responses", responses_body(2))
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "queue_full", refused.json()
            overloaded = post(server, "/v1/messages", messages_body(2))
            assert overloaded.status_code == 503 and int(overloaded.headers["Retry-After"]) >= 1
            error = overloaded.json()
            assert error["type"] == "error" and error["error"]["type"] == "overloaded_error", error
            assert error["error"]["message"] == refused.json()["error"]["message"]
            new = new_lines(server, before)
            assert len(new) == 2 and all(" 503: " in line for line in new), new
            first.close()  # leaves: the waiting one's turn
            answer = waiting.result(timeout=120)
    assert answer[-1][0] == "response.incomplete" and answer[-1][1]["response"]["usage"]["output_tokens"] == 4


# A bad request's head and body after its request line, and the status it gets
BAD_HTTP = {
    "a body over the limit": (
        f"x-api-key: {KEY}\r\nContent-Type: application/json\r\nContent-Length: 9999999\r\n\r\n",
        413,
    ),
    "no JSON": (
        f"x-api-key: {KEY}\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{{nope",
        400,
    ),
    "not sent as JSON": (
        f"x-api-key: {KEY}\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{{}}",
        415,
    ),
    "a wrong key": ("x-api-key: wrong\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", 401),
    "a GET": (f"x-api-key: {KEY}\r\n\r\n", 405),
    "a HEAD": (f"x-api-key: {KEY}\r\n\r\n", 405),
}
PATHS = ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens")
COVERED = {("/v1/messages", "not sent as JSON"), ("/v1/messages", "a wrong key")}  # test_serve_anthropic.py


@pytest.mark.parametrize(
    ("path", "case"), [(path, case) for path in PATHS for case in BAD_HTTP if (path, case) not in COVERED]
)
def test_bad_http_is_refused_in_the_routes_shape_with_one_log_line(
    server: Server, path: str, case: str
) -> None:
    """Each is refused in the error shape of the route's API (Anthropic's on /v1/messages and under it,
    OpenAI's object on /v1/responses), with one line in the log, and the server serves on."""
    rest, status = BAD_HTTP[case]
    method = case.split()[-1] if case in ("a GET", "a HEAD") else "POST"
    before = len(server.log().splitlines())
    head, body = exchange(
        server, f"{method} {path} HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n{rest}".encode()
    )
    assert head[0].split()[1] == str(status).encode(), head
    new = new_lines(server, before)
    assert len(new) == 1 and new[0].startswith(f"error: {method} {path} {status}: "), new
    if method == "HEAD":
        assert body == b""
    elif path == "/v1/responses":
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}, body
    else:
        error = json.loads(body)
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}, error
    assert post(server, path, BODIES.get(path, messages_body)(2)).status_code == 200


def test_a_responses_and_a_messages_stream_at_once_answer_as_alone(server: Server) -> None:
    """Started together, one waits behind the other; both answer the same greedy text as alone."""
    alone = {path: text_of(path, streamed(server, path, 24)) for path in BODIES}
    assert all(alone.values()), alone
    with ThreadPoolExecutor(2) as clients:
        together = dict(
            zip(BODIES, clients.map(lambda path: streamed(server, path, 24), BODIES), strict=True)
        )
    assert {path: text_of(path, read) for path, read in together.items()} == alone
    assert together["/v1/responses"][-1][0] == "response.incomplete"
    assert together["/v1/messages"][-1][0] == "message_stop"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_ends_both_streams_as_a_failure_mid_answer_does(
    tiny_pair: tuple[Path, Path], tmp_path: Path, sig: int
) -> None:
    """A stop whose --shutdown-timeout runs out while a Messages stream is written and a Responses stream
    waits: each ends the way its API ends a failure mid-answer, Anthropic's error event (its client raises,
    not a truncated success) and the Responses API's typed ``response.failed`` (the Response failed with
    the stop's error, numbered as the events before it, read by the openai client's ``responses.stream``),
    and the server exits 0."""
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--shutdown-timeout", "1"]
    with Server(args, tmp_path / "server.log") as server:
        claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        codex = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        generating = claude.messages.create(
            model="ead",
            messages=HI,
            max_tokens=LONG,
            stream=True,  # type: ignore[arg-type]
        )
        read = iter(generating)
        while next(read).type != "content_block_delta":
            pass
        read_events: list[Any] = []

        def wait_then_read() -> None:
            with codex.responses.stream(model="ead", input="hi", max_output_tokens=4) as stream:
                read_events.extend(stream)

        waiting = threading.Thread(target=wait_then_read)
        waiting.start()
        wait_until(lambda: httpx.get(f"{server.url}/health").json()["waiting"] == 1, 60)
        server.process.send_signal(sig)
        with pytest.raises(anthropic.APIStatusError) as cut:
            list(read)
        assert cut.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": CUT_OFF}}
        waiting.join(timeout=60)
        kinds = [event.type for event in read_events]  # a keep-alive is one more response.in_progress
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.failed"
        assert set(kinds[1:-1]) == {"response.in_progress"}, kinds
        assert [event.sequence_number for event in read_events] == list(range(len(read_events)))
        failed = read_events[-1].response
        assert failed.status == "failed" and failed.id == read_events[0].response.id
        assert failed.error is not None and failed.error.message == CUT_OFF
        assert failed.error.code == "server_error"
        assert server.process.wait(timeout=60) == 0
    log = server.log()
    assert "went away" not in log and "Traceback" not in log, log
    assert log.count(f"error: POST /v1/messages 503: {CUT_OFF}") == 1, log
    assert log.count(f"error: POST /v1/responses 503: {CUT_OFF}") == 1, log
    assert log.splitlines()[-1] == "ead serve: stopped"
