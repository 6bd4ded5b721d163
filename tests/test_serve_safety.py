"""`ead serve` against what a hostile page, a careless client or a stalled one can do (issue 23's review):
each test drives a real server subprocess over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.client
import itertools
import json
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import httpx
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, HI, JSON, LONG, PROMPT, TAU, frames, not_served, serving, stream_request

from ead_cli.errors import quoted
from ead_cli.serve.app import MAX_BODY_BYTES, MAX_HEAD_BYTES, SEND_TIMEOUT_S, _LingeringTransport

CHAT = "/v1/chat/completions"
HI_BODY = json.dumps({"messages": HI, "max_tokens": 2}).encode()
LENGTH = "context_length_exceeded"


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        [*pair_args(tiny_pair), *TAU, *CTX], tmp_path_factory.mktemp("serve-safety") / "server.log"
    ) as running:
        yield running


def post(server: Server, path: str, body: dict, **kwargs: object) -> httpx.Response:
    headers = {**JSON, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        # the check's own words after the field, without pydantic's "Value error, " between them
        ({"ead": {"pattern": ["(a+)+$"]}}, "ead.pattern: over HTTP only named patterns (@code)"),
        ({"ead": {"pattern": ["(x|x)*y" * 20]}}, "only named patterns (@code)"),
        ({"ead": {"window": 10**30}}, "ead.window"),
        ({"ead": {"min_run": 10**30}}, "ead.min_run"),
        ({"ead": {"burst": 10**30}}, "ead.burst"),
        ({"ead": {"draft": 10**30, "mode": "spec"}}, "ead.draft"),
        ({"ead": {"top_k": 10**30}}, "ead.top_k"),
        ({"seed": 10**30}, "seed"),
        ({"n": 10**30}, "n"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": "y" * 513}, "stop"),
        ({"temperature": 10**30}, "temperature"),
    ],
)
def test_hostile_patterns_and_huge_numbers_are_a_400_in_bounded_time(
    server: Server, body: dict, fragment: str
) -> None:
    began = time.monotonic()
    reply = post(server, CHAT, {"messages": HI, "max_tokens": 8, **body})
    assert time.monotonic() - began < 10  # generous: bounded, not a frozen server
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"
    assert httpx.get(f"{server.url}/health", timeout=5).json()["status"] == "ok"


def test_the_servers_own_pattern_stays_any_regular_expression(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """The operator's --pattern is trusted; only a client's is limited to named ones."""
    args = [*pair_args(tiny_pair), "--pattern", r"\w\w", "--min-run", "1"]
    with Server(args, tmp_path / "server.log") as server:
        reply = post(server, CHAT, {"messages": HI, "max_tokens": 6})
        assert reply.status_code == 200
        named = post(server, CHAT, {"messages": HI, "max_tokens": 6, "ead": {"pattern": ["@code"]}})
        assert named.status_code == 200
        assert server.stop() == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 17}, "n"),
        ({"suffix": "}"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prediction": {"type": "content", "content": "hi"}}, "prediction"),
    ],
)
def test_fields_that_would_change_the_answer_are_refused_not_ignored(
    server: Server, body: dict, param: str
) -> None:
    for path, request in ((CHAT, {"messages": HI}), ("/v1/completions", {"prompt": "hi"})):
        reply = post(server, path, {**request, **body})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "unsupported_parameter" and error["param"] == param
        assert error["message"].startswith(f"{param}: ")


def test_fill_in_the_middle_on_a_model_without_fim_tokens_names_it(server: Server) -> None:
    """Each API's suffix (llama-server's /infill, OpenAI's and ollama's) on a vocabulary with no FIM
    tokens: a 400 naming the model, in its API's shape; the server serves on."""
    why = (
        "small.gguf has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>): "
        "it cannot complete code at a cursor"
    )
    openai_reply = post(server, "/v1/completions", {"prompt": "def f(", "suffix": ")"})
    assert openai_reply.status_code == 400
    assert openai_reply.json()["error"] == {
        "message": f"suffix: {why}",
        "type": "invalid_request_error",
        "param": "suffix",
        "code": "unsupported_parameter",
    }
    infill = post(server, "/infill", {"input_prefix": "def f(", "input_suffix": ")"})
    assert infill.status_code == 400
    assert infill.json()["error"]["message"] == f"input_suffix: {why}"
    assert infill.json()["error"]["param"] == "input_suffix"
    ollama = post(server, "/api/generate", {"model": "ead", "prompt": "def f(", "suffix": ")"})
    assert (ollama.status_code, ollama.json()) == (400, {"error": f"suffix: {why}"})
    # an empty suffix is none, as ollama reads it (and as clients send it for none): a plain completion
    plain = post(server, "/v1/completions", {"prompt": "def f(", "suffix": "", "max_tokens": 1})
    assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 1


# llama-server's fields that would change the answer, each with a value that does and one meaning "off"
LLAMA_SERVER_REFUSED = [
    ("n_predict", 8, -1),
    ("dynatemp_range", 0.5, 0),
    ("min_keep", 5, 0),
    ("samplers", ["temperature", "top_k"], ["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]),
    ("grammar", 'root ::= "a"', ""),
    ("json_schema", {}, None),
    ("lora", [{"id": 0, "scale": 0.5}], []),
]


# llama-server's fields that do not change the answer: its cache and slot ones, and those that only tune a
# sampler that is off
LLAMA_SERVER_HARMLESS = {
    "cache_prompt": False,
    "id_slot": 0,
    "timings_per_token": True,
    "n_keep": -1,
    "n_probs": 0,
    "mirostat_tau": 3.0,
    "dry_base": 2.0,
    "xtc_threshold": 0.2,
    "repeat_last_n": 32,
}


@pytest.mark.parametrize(("param", "value", "off"), LLAMA_SERVER_REFUSED)
def test_llama_servers_fields_are_refused_by_name_unless_off(
    server: Server, param: str, value: object, off: object
) -> None:
    """A llama.cpp client's extra_body (dynatemp_range, grammar...) had been ignored silently;
    its off value is answered, beside the fields that change nothing."""
    for path, request in ((CHAT, {"messages": HI}), ("/v1/completions", {"prompt": "hi"})):
        reply = post(server, path, {**request, "max_tokens": 2, param: value})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "unsupported_parameter" and error["param"] == param
        assert error["message"] == f"{param}: {param} is not supported by ead serve"
        answered = post(server, path, {**request, "max_tokens": 2, param: off, **LLAMA_SERVER_HARMLESS})
        assert answered.status_code == 200, answered.text


def sampled_text(server: Server, **fields: object) -> str:
    """A chat answer drawn at a high temperature with a fixed seed, with ``fields`` in the request."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16, "seed": 3, **fields}
    reply = post(server, CHAT, {"temperature": 1.5, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


def test_llama_servers_top_k_and_min_p_are_the_ead_ones(server: Server) -> None:
    """Top-level top_k and min_p (llama-server's spelling, a llama.cpp client's extra_body) had been ignored:
    the answer was drawn from top-k 40, min-p 0.05."""
    greedy = sampled_text(server, temperature=0)
    assert sampled_text(server) != greedy  # the temperature draws another answer
    assert sampled_text(server, top_k=1) == sampled_text(server, ead={"top_k": 1}) == greedy
    assert sampled_text(server, min_p=1) == sampled_text(server, ead={"min_p": 1}) == greedy
    assert sampled_text(server, top_k=1, ead={"top_k": 1}) == greedy  # the same value in both


def as_top_level(error: dict) -> dict:
    """The error object about ``ead.FIELD`` as it reads about ``FIELD``."""
    return {key: text.removeprefix("ead.") if isinstance(text, str) else text for key, text in error.items()}


@pytest.mark.parametrize(
    ("field", "bad"), [("top_k", -1), ("top_k", 10**30), ("top_k", 1.5), ("min_p", 2), ("min_p", -0.5)]
)
def test_a_bad_top_level_top_k_or_min_p_is_the_ead_ones_400(server: Server, field: str, bad: object) -> None:
    """min_p past [0, 1] had been the command line's "--min-p must be in [0, 1]", param null."""
    top = post(server, CHAT, {"messages": HI, field: bad})
    inner = post(server, CHAT, {"messages": HI, "ead": {field: bad}})
    assert top.status_code == inner.status_code == 400, top.text
    assert top.json()["error"] == as_top_level(inner.json()["error"])
    assert (top.json()["error"]["param"], inner.json()["error"]["param"]) == (field, f"ead.{field}")


@pytest.mark.parametrize(("field", "top", "inner"), [("top_k", 1, 2), ("min_p", 0.5, 0.1)])
def test_top_level_and_ead_values_that_differ_are_a_400(
    server: Server, field: str, top: object, inner: object
) -> None:
    for path, request in ((CHAT, {"messages": HI}), ("/v1/completions", {"prompt": "hi"})):
        reply = post(server, path, {**request, field: top, "ead": {field: inner}})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["param"], error["code"]) == (field, "invalid_value")
        assert error["message"].startswith(f"{field} {top!r} and ead.{field} {inner!r} differ")


ORDERED = "0 <= low < high, both finite"
GATE = "ead.policy gate"
FRACTION = "fraction of log2|V| in [0, 1]"


@pytest.mark.parametrize(
    ("ead", "param", "message"),
    [
        ({"tau": -1}, "ead.tau", "ead.tau must be at least 0, got -1.0"),
        ({"tau": "abc"}, "ead.tau", "ead.tau must be a number of bits or a list, got 'abc'"),
        ({"window": 8, "tau": [1, 2, 3]}, "ead.tau", "2 models take one threshold, got 3"),
        ({"tau_range": [2, 1]}, "ead.tau_range", f"ead.tau_range must satisfy {ORDERED}, got 2.0:1.0"),
        ({"mode": "spec", "draft": 100}, "ead.draft", "ead.draft must be in [1, 64], got 100"),
        ({"verify": 5}, "ead.verify", "ead.verify must be in (0, 1], got 5.0"),
        ({"pattern": ["@code"], "policy": "ead"}, "ead", f"ead.pattern and ead.burst apply to {GATE}"),
        ({"normalize": True, "tau": 2}, "ead", f"with ead.normalize, ead.tau is a {FRACTION}, got 2.0"),
    ],
)
def test_a_bad_ead_option_names_its_field(server: Server, ead: dict, param: str, message: str) -> None:
    """The command line's checks of the ``ead`` options, which check them as a whole, had answered with
    ``param`` null; it is the field that alone gets the complaint, or ``ead`` where only fields together
    do (a pattern with the ead policy). The message names fields as the request spells them, not as the
    command line's flags (it had said 'verify ratio' and '--pattern')."""
    for path, request in ((CHAT, {"messages": HI}), ("/v1/completions", {"prompt": "hi"})):
        reply = post(server, path, {**request, "max_tokens": 2, "ead": ead})
        assert reply.status_code == 400, reply.text
        error = {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_value"}
        assert reply.json() == {"error": error}


@pytest.mark.parametrize(
    ("path", "body", "param", "code", "fragment"),
    [
        (CHAT, {"messages": [{"role": "user", "content": " "}]}, "messages", "invalid_value", "is empty"),
        (CHAT, {"messages": [{"role": "user", "content": "a\0b"}]}, "messages", "invalid_value", "a NUL"),
        ("/v1/completions", {"prompt": ""}, "prompt", "invalid_value", "the prompt is empty"),
        ("/v1/completions", {"prompt": ["a\0b"]}, "prompt", "invalid_value", "the prompt contains a NUL"),
        (CHAT, {"messages": [{"role": "user", "content": "word " * 20000}]}, "messages", LENGTH, "too many"),
        ("/v1/completions", {"prompt": "word " * 20000}, "prompt", LENGTH, "too many for the context"),
        ("/v1/completions", {"prompt": "<|im_end|>" * 20000}, "prompt", LENGTH, "special tokens"),
    ],
)
def test_a_bad_prompt_names_its_field(
    server: Server, path: str, body: dict, param: str, code: str, fragment: str
) -> None:
    """The prompt's checks (empty, a NUL byte, past the context) had answered with ``param`` null; they
    name ``messages`` or ``prompt``, as OpenAI's context_length_exceeded names ``messages``."""
    reply = post(server, path, {**body, "max_tokens": 2})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, code) and fragment in error["message"]


def test_parts_that_are_not_text_are_refused_by_name(server: Server) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    reply = post(server, CHAT, {"messages": [{"role": "user", "content": [image]}]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == "messages.0.content"
    assert "image_url parts are not supported" in error["message"]


def test_an_assistants_refusal_sent_back_is_its_text(server: Server) -> None:
    """OpenAI answers a refusal as the assistant message's ``refusal`` (content null), and takes it back in
    a conversation as that field or as a ``refusal`` part: it was a 400 (refusal parts not supported), or
    dropped (an empty turn). It is the turn's text; a user's refusal part is still a 400."""
    said = "I can't help with that."
    request = {"max_tokens": 6, "temperature": 0}

    def answer(assistant: dict) -> dict:
        messages = [*HI, {"role": "assistant", **assistant}, {"role": "user", "content": "Why?"}]
        reply = post(server, CHAT, {"messages": messages, **request})
        assert reply.status_code == 200, reply.text
        return reply.json()

    expected = answer({"content": said})
    for assistant in (
        {"content": [{"type": "refusal", "refusal": said}]},
        {"content": None, "refusal": said},
    ):
        got = answer(assistant)
        assert got["choices"] == expected["choices"]
        assert got["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]  # the same prompt
    refusal = [{"role": "user", "content": [{"type": "refusal", "refusal": said}]}]
    reply = post(server, CHAT, {"messages": refusal, **request})
    assert reply.status_code == 400 and "refusal parts are not supported" in reply.json()["error"]["message"]


def test_valid_values_once_refused_are_taken(server: Server) -> None:
    """stream and n null, seed -1 (a fresh one), top_p 0 (the likeliest token: greedy), a developer
    message (OpenAI's newer name for system), the neutral values of unsupported fields, and a max_tokens
    past the context (clamped, as llama-server and ollama do)."""
    developer = [{"role": "developer", "content": "Be brief."}, *HI]
    neutral = {"echo": False, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "tools": []}
    body = {"messages": developer, "max_tokens": 6, "stream": None, "n": None, "seed": -1, **neutral}
    reply = post(server, CHAT, body)
    assert reply.status_code == 200, reply.text
    greedy = post(server, CHAT, {"messages": HI, "max_tokens": 6, "temperature": 0})
    top_p_zero = post(server, CHAT, {"messages": HI, "max_tokens": 6, "temperature": 1.5, "top_p": 0})
    assert top_p_zero.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


def test_max_tokens_past_the_context_is_clamped(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(tiny_pair), "--ctx", "64"], tmp_path / "server.log") as server:
        reply = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 10**30})
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        # the context's end at most (llama.cpp pads 64 to its own size; the last token is written, never read)
        served = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"][0]["ead"]
        assert usage["completion_tokens"] > 0 and usage["total_tokens"] <= served["n_ctx"] + 1
        assert server.stop() == 0


def test_a_page_elsewhere_cannot_drive_a_loopback_server(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A text/plain POST (no preflight) is refused, a foreign Origin is refused, a DNS-rebinding Host is
    refused; the server's own page and a --cors-origin page are served."""
    allowed = "http://app.example:3000"
    with Server([*pair_args(tiny_pair), "--cors-origin", allowed], tmp_path / "server.log") as server:
        body = {"messages": HI, "max_tokens": 2}
        plain = httpx.post(
            f"{server.url}{CHAT}",
            content=b'{"messages": [{"role": "user", "content": "hi"}]}',
            headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
            timeout=60,
        )
        assert plain.status_code == 403 and plain.json()["error"]["code"] == "origin_not_allowed"
        plain_same_origin = httpx.post(
            f"{server.url}{CHAT}", content=b"{}", headers={"Content-Type": "text/plain"}, timeout=60
        )
        assert plain_same_origin.status_code == 415
        assert plain_same_origin.json()["error"]["code"] == "unsupported_media_type"
        foreign = post(server, CHAT, body, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        assert "--cors-origin 'http://evil.example'" in foreign.json()["error"]["message"]
        port = server.url.rsplit(":", 1)[1]
        rebound = httpx.get(f"{server.url}/v1/models", headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "invalid_host"
        assert httpx.get(f"{server.url}/", headers={"Host": f"evil.example:{port}"}).status_code == 403
        for host, scheme in itertools.product((f"localhost:{port}", f"127.0.0.1:{port}"), ("http", "https")):
            same = post(server, CHAT, body, headers={"Host": host, "Origin": f"{scheme}://{host}"})
            assert same.status_code == 200  # the page the server serves itself (https: behind a TLS proxy)
        for scheme in ("ftp", "https"):  # the scheme alone of the server's own origin, not another host's
            foreign = {"Host": f"localhost:{port}", "Origin": f"{scheme}://x.example"}
            other = post(server, CHAT, body, headers=foreign)
            assert other.status_code == 403
        preflight = httpx.options(
            f"{server.url}{CHAT}",
            headers={
                "Origin": allowed,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == allowed
        # the openai npm client (dangerouslyAllowBrowser) sends these with every request
        asked = "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-retry-count"
        stainless = httpx.options(
            f"{server.url}{CHAT}",
            headers={
                "Origin": allowed,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": asked,
            },
        )
        assert stainless.status_code == 200, stainless.text
        assert stainless.headers["access-control-allow-headers"] == asked
        # Chrome's Private Network Access (a page on a public site calling loopback), a method not served:
        # answered, and the request itself gets its 405 as an error object the page can read
        network = {"Access-Control-Request-Private-Network": "true"}
        for method, extra, granted in (("POST", network, "true"), ("PUT", {}, None)):
            asks = {"Origin": allowed, "Access-Control-Request-Method": method, **extra}
            answered = httpx.options(f"{server.url}{CHAT}", headers=asks)
            assert answered.status_code == 200, answered.text
            assert answered.headers["access-control-allow-origin"] == allowed
            assert answered.headers.get("access-control-allow-private-network") == granted
        put = httpx.put(f"{server.url}{CHAT}", json=body, headers={"Origin": allowed})
        assert put.status_code == 405 and put.headers["access-control-allow-origin"] == allowed
        assert put.json()["error"]["message"] == f"Invalid method for URL (PUT {CHAT}): it takes POST"
        cors = post(server, CHAT, body, headers={"Origin": allowed})
        assert cors.status_code == 200 and cors.headers["access-control-allow-origin"] == allowed
        head, _ = exchange(server, b"OPTIONS * HTTP/1.1\r\nHost: HOST\r\nOrigin: " + allowed.encode() + CLOSE)
        assert head[0] == b"HTTP/1.1 204 No Content"
        assert f"access-control-allow-origin: {allowed}".encode() in head
        assert server.stop() == 0
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("host", ["[::1", "[zz]", "a]"])
def test_a_malformed_host_is_a_403_not_a_500(server: Server, host: str) -> None:
    """A Host that is no URL authority (an unclosed or bogus IPv6 bracket) names no loopback address:
    refused as any other foreign Host, one log line, never a traceback."""
    before = server.log().splitlines()
    for path in ("/health", "/v1/models"):
        reply = httpx.get(f"{server.url}{path}", headers={"Host": host}, timeout=60)
        assert reply.status_code == 403, reply.text
        error = reply.json()["error"]
        assert error["code"] == "invalid_host"
        assert error["message"] == (
            f"Host {host!r} is not a loopback name: this server answers localhost and 127.0.0.1"
        )
    new = server.log().splitlines()[len(before) :]
    assert new == [f"error: GET {path} 403: {error['message']}" for path in ("/health", "/v1/models")]
    assert httpx.get(f"{server.url}/health", timeout=60).status_code == 200  # still serving


def test_a_part_type_is_shown_on_one_line(server: Server) -> None:
    """A content part's type is the client's text: a newline in it must not split the error in two, nor
    write a second line into the server's log that reads as another request's."""
    forged = "image\nPOST /v1/chat/completions 200: 5 tokens (stop)"
    before = server.log().splitlines()
    reply = post(server, CHAT, {"messages": [{"role": "user", "content": [{"type": forged}]}]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "unsupported_parameter" and error["param"] == "messages.0.content"
    assert error["message"] == (
        f"messages.0.content: {forged!r} parts are not supported (the models read text) by ead serve"
    )
    assert server.log().splitlines()[len(before) :] == [f"error: POST {CHAT} 400: {error['message']}"]


def test_a_path_cannot_write_control_characters_into_the_log(server: Server) -> None:
    """The path (and an Origin) is logged with each refusal, before any key is asked for: its control
    characters (an escape sequence that clears the operator's terminal, a backspace) are written escaped."""
    before = server.log().splitlines()
    port = server.url.rsplit(":", 1)[1]
    missing = httpx.get(f"{server.url}/v1/x%1b[2Jy%08", timeout=60)
    missing_message = not_served("GET /v1/x\\x1b[2Jy\\x08")
    assert missing.status_code == 404 and missing.json()["error"]["message"] == missing_message
    foreign = httpx.get(f"{server.url}/v1/%1b]0;owned%07", headers={"Host": f"evil.example:{port}"})
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "invalid_host"
    with socket.create_connection(("127.0.0.1", int(port)), timeout=60) as raw:  # httpx sends no ESC
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://x\x1b[2J\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 403 ")
    new = server.log().splitlines()[len(before) :]
    origin = "pages at 'http://x\\x1b[2J' may not use this server"
    assert new == [
        f"error: GET /v1/x\\x1b[2Jy\\x08 404: {missing_message}",
        f"error: GET /v1/\\x1b]0;owned\\x07 403: {foreign.json()['error']['message']}",
        f"error: GET /health 403: {origin}: start it with --cors-origin 'http://x\\x1b[2J' to allow them",
    ]


ORIGIN = b"Host: HOST\r\nOrigin: http://x\x1b[2J\r\n"
ESCAPED = "'http://x\\x1b[2J'"  # the Origin as an error shows it
REFUSED = f"pages at {ESCAPED} may not use this server: start it with --cors-origin {ESCAPED} to allow them"


def test_client_text_in_an_error_is_one_printable_line_in_the_answer_and_the_log(server: Server) -> None:
    """Only the log had escaped control characters: the answer carried an Origin's escape sequence, and the
    schema converter's complaint the pattern's, raw (a client printing the error drove its terminal)."""
    before = server.log().splitlines()
    head, body = exchange(server, b"GET /health HTTP/1.1\r\n" + ORIGIN + b"Connection: close\r\n\r\n")
    assert head[0] == b"HTTP/1.1 403 Forbidden"
    origin = json.loads(body)["error"]["message"]
    assert origin == REFUSED
    schema = {"name": "x", "schema": {"type": "string", "pattern": "^\\p{L}\n\x1b[2J$"}}
    response_format = {"type": "json_schema", "json_schema": schema}
    reply = post(server, CHAT, {"messages": HI, "response_format": response_format})
    converter = reply.json()["error"]["message"]
    assert converter.endswith("Invalid quantifier {L} in /\\p{L} \\x1b[2J/")  # the newline a space
    reply = post(server, CHAT, {"messages": HI, "model": "gpt\nPOST /v1/chat/completions 200: 5 tokens"})
    named = reply.json()["error"]["message"]
    assert named.startswith("the model 'gpt\\nPOST /v1/chat/completions 200: 5 tokens' is not served here")
    assert all(message.isprintable() for message in (origin, converter, named))
    assert server.log().splitlines()[len(before) :] == [
        f"error: GET /health 403: {origin}",
        f"error: POST {CHAT} 400: {converter}",
        f"error: POST {CHAT} 404: {named}",
    ]


def test_a_long_origin_is_echoed_cut(server: Server) -> None:
    """The Host a refusal echoes went through errors.quoted, the Origin not: a 10 kB Origin came back twice
    in the 403, and in its log line."""
    before = server.log()
    origin = "http://" + "x" * 10000
    reply = httpx.get(f"{server.url}/health", headers={"Origin": origin}, timeout=60)
    assert reply.status_code == 403 and reply.json()["error"]["code"] == "origin_not_allowed"
    shown = quoted(origin)
    assert reply.json()["error"]["message"] == (
        f"pages at {shown} may not use this server: start it with --cors-origin {shown} to allow them"
    )
    assert server.log()[len(before) :] == f"error: GET /health 403: {reply.json()['error']['message']}\n"


@pytest.mark.parametrize("origin", ["null", "chrome-extension://abcdefghijklmnop", "file://"])
def test_the_advice_to_an_origin_the_option_cannot_name_is_one_it_takes(
    server: Server, tiny_pair: tuple[Path, Path], tmp_path: Path, origin: str
) -> None:
    """A page opened from a file (Origin: null), a sandboxed frame or an extension had been told to start
    the server with --cors-origin 'null', which ead serve refuses (scheme://host[:port] or *): the advice
    now is an option it takes, and the page is served once the server follows it."""
    refused = httpx.get(f"{server.url}/health", headers={"Origin": origin}, timeout=60)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"
    advice = re.search(r"--cors-origin '([^']*)'", refused.json()["error"]["message"])
    assert advice is not None, refused.json()
    args = [*pair_args(tiny_pair), "--cors-origin", advice.group(1)]
    with Server(args, tmp_path / "server.log") as advised:
        served = httpx.get(f"{advised.url}/health", headers={"Origin": origin}, timeout=60)
        assert served.status_code == 200, served.text
        assert advised.stop() == 0


def test_two_sampled_requests_without_a_seed_differ(server: Server) -> None:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 1.0}
    first, second = (post(server, CHAT, body).json() for _ in range(2))
    assert first["ead"]["seed"] != second["ead"]["seed"]
    assert first["choices"][0]["message"] != second["choices"][0]["message"]
    again = post(server, CHAT, {**body, "seed": first["ead"]["seed"]}).json()  # the seed it was drawn with
    assert again["choices"][0]["message"] == first["choices"][0]["message"]


def test_a_server_started_with_a_seed_draws_requests_without_one_with_it(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """``ead serve --seed N`` is each request's seed unless it sends its own, as llama-server's ``--seed``:
    the option had been taken and never used, every request drawn afresh."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 1.0}
    with serving([*pair_args(tiny_pair), *TAU, *CTX, "--seed", "7"], tmp_path / "server.log") as seeded:
        first, second = (post(seeded, CHAT, body).json() for _ in range(2))
        own, fresh = (post(seeded, CHAT, {**body, "seed": seed}).json() for seed in (8, -1))
    assert first["ead"]["seed"] == second["ead"]["seed"] == 7
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    assert own["ead"]["seed"] == 8
    assert fresh["ead"]["seed"] != 7  # -1 asks for a fresh draw whatever the server's seed


def test_an_unknown_model_name_is_a_404_unless_any_model(
    server: Server, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=HI, max_tokens=2)
    assert refused.value.code == "model_not_found" and "serves 'ead'" in refused.value.message
    assert client.models.list().data[0].model_extra["ead"]["any_model_name"] is False
    with Server([*pair_args(tiny_pair), "--any-model"], tmp_path / "server.log") as anything:
        client = openai.OpenAI(base_url=anything.base_url, api_key="unused", max_retries=0)
        assert client.chat.completions.create(model="gpt-4o", messages=HI, max_tokens=2).choices
        assert client.models.list().data[0].model_extra["ead"]["any_model_name"] is True
        assert anything.stop() == 0


def test_the_api_key_can_come_from_the_environment(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Not on the command line, where ps shows it."""
    with Server(pair_args(tiny_pair), tmp_path / "server.log", env={"EAD_API_KEY": "s3cret"}) as server:
        assert httpx.get(f"{server.base_url}/models").status_code == 401
        keyed = httpx.get(f"{server.base_url}/models", headers={"Authorization": "Bearer s3cret"})
        assert keyed.status_code == 200
        assert "s3cret" not in " ".join(server.process.args)  # type: ignore[arg-type]
        assert server.stop() == 0


def test_a_client_that_leaves_while_sending_its_body_is_one_log_line(server: Server) -> None:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    before = len(server.log().splitlines())
    with socket.create_connection((host, int(port))) as leaving:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        leaving.sendall(f'{head}Content-Length: 1000\r\n\r\n{{"prompt": '.encode())  # then leaves
    wait_until(lambda: len(server.log().splitlines()) > before, 30)
    assert server.log().splitlines()[before:] == [
        "error: POST /v1/completions: the client went away while sending its body"
    ]
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200


def test_a_compressed_body_is_a_415_that_names_its_encoding(server: Server) -> None:
    """As llama-server answers it: not a 400 that calls the gzip bytes invalid JSON."""
    body = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    before = len(server.log().splitlines())
    headers = {**JSON, "Content-Encoding": "gzip"}
    reply = httpx.post(f"{server.url}{CHAT}", content=gzip.compress(body), headers=headers, timeout=60)
    assert reply.status_code == 415 and reply.headers["accept-encoding"] == "identity"
    message = "Content-Encoding 'gzip' is not taken: send the body uncompressed"
    assert reply.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": None,
        "code": "unsupported_media_type",
    }
    assert server.log().splitlines()[before:] == [f"error: POST {CHAT} 415: {message}"]
    plain = {**JSON, "Content-Encoding": "identity"}
    assert httpx.post(f"{server.url}{CHAT}", content=body, headers=plain, timeout=60).status_code == 200


def test_a_chunked_body_over_the_limit_is_a_413(server: Server) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(5 * 16):
            yield b"x" * 2**16
        yield b'"}'

    reply = httpx.post(f"{server.base_url}/completions", content=chunks(), headers=JSON, timeout=60)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "body_too_large"


def read_to_close(raw: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    answer = b""
    while chunk := raw.recv(65536):
        answer += chunk
    return answer


def exchange(server: Server, data: bytes) -> tuple[list[bytes], bytes]:
    """``data`` sent as it is on a socket of its own: the answer's head (its lines) and its body, read
    until the server closes the connection."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as raw:
        raw.sendall(data.replace(b"HOST", f"{host}:{port}".encode()))
        answer = read_to_close(raw)
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n"), body


POST_JSON = b"POST /v1/chat/completions HTTP/1.1\r\nHost: HOST\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (POST_JSON + b"Content-Length: abc\r\n\r\n{}", "bad Content-Length"),
        (
            POST_JSON + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            "conflicting Content-Length headers",
        ),
        (
            # a smuggling shape (RFC 9112 §6.1): it had been read by its chunks and its connection kept
            POST_JSON + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "Transfer-Encoding and Content-Length together",
        ),
        (b"GARBAGE\r\n\r\n", "illegal request line: bytearray(b'GARBAGE')"),
        (
            b"GET /health HTTP/1.1\r\nHost: HOST\r\nno colon\r\n\r\n",
            "illegal header line: bytearray(b'no colon')",
        ),
    ],
)
def test_a_request_that_is_not_http_gets_openais_error_object(
    server: Server, data: bytes, reason: str
) -> None:
    """uvicorn had answered it with its own plain text ("Invalid HTTP request received."), which an OpenAI
    client cannot read, and logged a bare WARNING that did not say what was wrong."""
    before = server.log().splitlines()
    head, body = exchange(server, data)
    assert head[0] == b"HTTP/1.1 400 Bad Request"
    assert b"content-type: application/json" in head and b"connection: close" in head
    message = f"the request is not valid HTTP: {reason}"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_http"}
    assert json.loads(body) == {"error": error}
    assert server.log().splitlines()[len(before) :] == [f"error: 400: {message}"]
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


CLOSE = b"\r\nConnection: close\r\n\r\n"

NOT_VALID = "the request is not valid HTTP: Transfer-Encoding"
UNKNOWN_CODING = "is not implemented: send the body chunked alone, or with a Content-Length"
UNFRAMED = "does not end in chunked: where the body ends is unknown"


@pytest.mark.parametrize(
    ("framing", "status", "message"),
    [
        (b"Transfer-Encoding: gzip, chunked", 501, f"Transfer-Encoding 'gzip' {UNKNOWN_CODING}"),
        (
            b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
            501,
            f"Transfer-Encoding 'gzip' {UNKNOWN_CODING}",
        ),
        (b"Transfer-Encoding: br, foo,, chunked", 501, f"Transfer-Encoding 'br, foo' {UNKNOWN_CODING}"),
        # chunked not last: where the body ends cannot be known (RFC 9112 §6.3, a 400, not 6.1's 501)
        (b"Transfer-Encoding: foo", 400, f"{NOT_VALID} 'foo' {UNFRAMED}"),
        (b"Transfer-Encoding: chunked, gzip", 400, f"{NOT_VALID} 'chunked, gzip' {UNFRAMED}"),
        (b"Transfer-Encoding: chunked, chunked", 400, f"{NOT_VALID} 'chunked, chunked' names chunked twice"),
        (
            b"Transfer-Encoding: gzip, chunked\r\nContent-Length: 2",
            400,
            "the request is not valid HTTP: Transfer-Encoding and Content-Length together",
        ),
    ],
)
def test_a_transfer_coding_not_implemented_is_a_501_and_a_malformed_one_a_400(
    server: Server, framing: bytes, status: int, message: str
) -> None:
    """RFC 9112 §6.1: a transfer coding the server does not implement is a 501 (h11's own hint, which had
    been answered as a 400 in h11's words, "Only Transfer-Encoding: chunked is supported"). A list that
    does not end in chunked, or names it twice, is a request whose body cannot be framed: a 400."""
    before = server.log().splitlines()
    head, body = exchange(server, POST_JSON + framing + b"\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert head[0] == b"HTTP/1.1 %d %s" % (status, HTTPStatus(status).phrase.encode()), head
    assert b"connection: close" in [line.lower() for line in head], head
    code = "unsupported_transfer_encoding" if status == 501 else "invalid_http"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    assert json.loads(body) == {"error": error}
    assert server.log().splitlines()[len(before) :] == [f"error: {status}: {message}"]
    chunked = POST_JSON + b"Transfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
    head, body = exchange(server, chunked + b"%x\r\n%s\r\n0\r\n\r\n" % (len(HI_BODY), HI_BODY))
    assert head[0] == b"HTTP/1.1 200 OK", body  # chunked alone, in any case, is read


@pytest.mark.parametrize(
    ("request_line", "version"),
    [
        (b"GET /health HTTP/2.0", "2.0"),
        (b"GET /health HTTP/3.0", "3.0"),
        (b"GET /health HTTP/0.9", "0.9"),
        (b"PRI * HTTP/2.0", "2.0"),  # an HTTP/2 client's preface (prior knowledge) on this HTTP/1 port
    ],
)
def test_an_http_version_other_than_1_is_a_505(server: Server, request_line: bytes, version: str) -> None:
    """h11 reads any one-digit major version; HTTP/2.0 had been answered as if it were 1.1 (and the HTTP/2
    preface was a 400 naming its target '*'): RFC 9110 §15.6.6, a major version the server does not
    speak is a 505, the connection closed."""
    before = server.log().splitlines()
    head, body = exchange(server, request_line + b"\r\nHost: HOST" + CLOSE)
    assert head[0] == b"HTTP/1.1 505 HTTP Version Not Supported", head
    assert b"connection: close" in [line.lower() for line in head], head
    message = f"HTTP/{version} is not served: this server speaks HTTP/1.1 (and 1.0)"
    error = {"message": message, "type": "invalid_request_error", "param": None}
    assert json.loads(body) == {"error": {**error, "code": "http_version_not_supported"}}
    assert server.log().splitlines()[len(before) :] == [f"error: 505: {message}"]
    head, _ = exchange(server, b"GET /health HTTP/1.1\r\nHost: HOST" + CLOSE)
    assert head[0] == b"HTTP/1.1 200 OK"  # still serving


def test_an_absolute_form_target_is_served_as_its_path_its_authority_the_host(server: Server) -> None:
    """RFC 9112 §3.2.2: a server MUST accept a request target in absolute-form (what a client sends a proxy);
    it had been a 404 naming "/http://...". Its authority, not the Host header, names the server (the RFC
    says to ignore Host then): a DNS-rebinding name there is refused as it is in Host."""
    head, body = exchange(server, b"GET http://HOST/v1/models?x=1 HTTP/1.1\r\nHost: HOST" + CLOSE)
    assert head[0] == b"HTTP/1.1 200 OK" and json.loads(body)["data"][0]["id"] == "ead"
    head, body = exchange(server, b"GET http://evil.example/health HTTP/1.1\r\nHost: HOST" + CLOSE)
    assert head[0] == b"HTTP/1.1 403 Forbidden" and json.loads(body)["error"]["code"] == "invalid_host"
    before = server.log().splitlines()
    head, body = exchange(server, b"GET http://HOST HTTP/1.1\r\nHost: HOST" + CLOSE)  # no path: "/"
    assert head[0] == b"HTTP/1.1 200 OK" and body.startswith(b"<!doctype html>")
    assert server.log().splitlines()[len(before) :] == []


def test_options_asterisk_names_the_methods_served_and_other_targets_are_a_400(server: Server) -> None:
    """``OPTIONS *`` (the server as a whole, RFC 9110 §9.3.7) had been a 404 naming "/*"; the asterisk with
    another method, and a target that is neither a path, an http URL nor the asterisk, are no request
    this server can route: a 400 that says so, not a 404 that names a path never asked for."""
    for target in (b"*", b"http://HOST"):  # an absolute URL without a path asks OPTIONS of the server too
        head, body = exchange(server, b"OPTIONS " + target + b" HTTP/1.1\r\nHost: HOST" + CLOSE)
        assert head[0] == b"HTTP/1.1 204 No Content" and body == b""
        assert b"allow: DELETE, GET, HEAD, OPTIONS, POST" in head  # DELETE: ollama's /api/delete
    for request, target in (
        (b"GET *", "'*'"),
        (b"GET health", "'health'"),
        (b"GET ftp://x/y", "'ftp://x/y'"),
    ):
        before = server.log().splitlines()
        head, body = exchange(server, request + b" HTTP/1.1\r\nHost: HOST" + CLOSE)
        assert head[0] == b"HTTP/1.1 400 Bad Request"
        message = (
            f"the request target {target} is not a path (/v1/...), an http URL, nor * (of OPTIONS alone)"
        )
        assert json.loads(body)["error"] == {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_http",
        }
        method, path = request.decode().split(" ")
        assert server.log().splitlines()[len(before) :] == [f"error: {method} {path} 400: {message}"]


CHUNKED = b"Host: HOST\r\nTransfer-Encoding: chunked\r\n\r\n"
BROKEN_CHUNK = "the request is not valid HTTP: illegal chunk header: bytearray(b'zz\\r\\n')"


def test_a_body_that_breaks_after_its_answer_is_one_log_line_not_a_traceback(server: Server) -> None:
    """A chunked body refused unread (415), then broken: uvicorn's 400 could not follow the answer sent,
    and its failure was a traceback in the log; the connection is closed and the log says why."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    before = server.log().splitlines()
    with socket.create_connection((host, int(port)), timeout=60) as raw:
        head = b"POST /v1/completions HTTP/1.1\r\nContent-Type: text/plain\r\n"
        raw.sendall(head + CHUNKED.replace(b"HOST", f"{host}:{port}".encode()))
        answer = b""
        while b"unsupported_media_type" not in answer:
            answer += raw.recv(65536)
        assert answer.startswith(b"HTTP/1.1 415 ")
        raw.sendall(b"zz\r\n")
        assert raw.recv(65536) == b""  # closed, nothing more written
    refused = "the body must be JSON sent as Content-Type: application/json, not 'text/plain'"
    assert server.log().splitlines()[len(before) :] == [
        f"error: POST /v1/completions 415: {refused}",
        f"error: {BROKEN_CHUNK}: the connection is closed",
    ]


def test_a_broken_body_the_app_would_answer_unread_gets_only_the_400(server: Server) -> None:
    """A path that answers without reading the body (a 404) behind a broken chunk: the app's answer,
    after uvicorn's 400, had been refused by h11, and logged as a 500 beside uvicorn's own ERROR line."""
    before = server.log().splitlines()
    head, body = exchange(server, b"GET /v1/nothing HTTP/1.1\r\n" + CHUNKED + b"zz\r\n")
    assert head[0] == b"HTTP/1.1 400 Bad Request"
    assert json.loads(body)["error"]["message"] == BROKEN_CHUNK
    # the 404's line comes when its app has run, which may be after the 400 reached the client
    wait_until(lambda: len(server.log().splitlines()) >= len(before) + 2, 30)
    assert server.log().splitlines()[len(before) :] == [
        f"error: 400: {BROKEN_CHUNK}",
        f"error: GET /v1/nothing 404: {not_served('GET /v1/nothing', 'GET /v1/health')}",
    ]
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200


LONG_TEXT = 10_000  # characters of a path, a method or a request line, each sent whole


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /" + b"a" * LONG_TEXT + b" HTTP/1.1\r\nHost: HOST\r\n\r\n", b"404"),
        (b"G" * LONG_TEXT + b" /health HTTP/1.1\r\nHost: HOST\r\n\r\n", b"405"),
        (b"GET /" + b"a" * LONG_TEXT + b"\x00 HTTP/1.1\r\nHost: HOST\r\n\r\n", b"400"),
    ],
)
def test_a_long_path_or_request_line_is_cut_in_the_answer_and_the_log(
    server: Server, data: bytes, status: bytes
) -> None:
    """A 10 kB path or method had been written whole into its refusal's log line, and a 10 kB request line
    h11 refuses into the 400's message too: each is cut, its length said, as every echoed value is."""
    before = server.log().splitlines()
    head, body = exchange(server, data.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    assert head[0].split()[1] == status
    message = json.loads(body)["error"]["message"]
    assert len(message) < 500, message[:500]  # a 404's names the request line (cut) and what is served
    new = server.log().splitlines()[len(before) :]
    # a 404's or 405's line names the request line twice: as every line does, and in its message
    assert len(new) == 1 and len(new[0]) < 600 and "characters)" in new[0], [line[:600] for line in new]
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


def test_headers_past_the_limit_are_a_431_that_says_so(server: Server) -> None:
    """A request whose line and headers outgrow h11's buffer (16 KiB held, their end not in sight) had been
    a 400 saying "the request is not valid HTTP: Receive buffer too long", h11's words."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    before = server.log().splitlines()
    with socket.create_connection((host, int(port)), timeout=60) as raw:
        raw.sendall(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n".encode())
        raw.sendall((b"X-Filler: " + b"a" * 1000 + b"\r\n") * 40)  # the head never ends
        answer = read_to_close(raw)  # the rest dropped, not reset
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 431 Request Header Fields Too Large"
    error = json.loads(body)["error"]
    assert error["code"] == "headers_too_large" and "16 KiB" in error["message"], error
    assert server.log().splitlines()[len(before) :] == [f"error: 431: {error['message']}"]
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


@pytest.fixture(scope="module")
def impatient(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that waits 1 s for what a client has yet to send."""
    log = tmp_path_factory.mktemp("serve-impatient") / "server.log"
    with serving([*pair_args(tiny_pair), *TAU, "--read-timeout", "1"], log) as running:
        yield running


def test_a_request_head_not_whole_within_the_read_timeout_is_a_408_and_closed(impatient: Server) -> None:
    """A client that opened a connection and sent its request line and headers a byte at a time, or began
    them and stopped, had held the connection forever (uvicorn times out only the wait between requests):
    past --read-timeout it gets a 408 and the connection is closed; one that sent nothing is closed
    without a word, as a kept-alive one is. A request under way is no head: its answer is not cut."""
    host, port = impatient.url.removeprefix("http://").rsplit(":", 1)
    health = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
    before = impatient.log().splitlines()
    with socket.create_connection((host, int(port)), timeout=60) as silent:
        assert read_to_close(silent) == b""
    with socket.create_connection((host, int(port)), timeout=60) as trickling:
        for byte in health:
            if select.select([trickling], [], [], 0)[0]:  # answered: a byte more would be reset
                break
            trickling.sendall(bytes([byte]))
            time.sleep(0.2)
        trickled = read_to_close(trickling)
    with socket.create_connection((host, int(port)), timeout=60) as kept:  # a second request's head
        kept.sendall(health + b"\r\n")
        first = b""
        while not first.endswith(b"}"):  # its JSON read whole
            first += kept.recv(65536)
        kept.sendall(health)  # the second's head begun, never ended
        second = read_to_close(kept)
    message = "the request line and headers did not all come within 1 s (--read-timeout)"
    error = {"message": message, "type": "invalid_request_error", "param": None}
    assert first.startswith(b"HTTP/1.1 200 OK")
    for answer in (trickled, second):
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b"\r\n")[0].removeprefix(b"HTTP/1.1 ") == b"408 Request Timeout", answer
        assert b"connection: close" in head.split(b"\r\n")
        assert json.loads(body) == {"error": {**error, "code": "request_timeout"}}
    assert impatient.log().splitlines()[len(before) :] == [f"error: 408: {message}"] * 2
    client, reply = stream_request(impatient.url, 64)
    received = frames(reply)
    assert next(received)["ead"]["index"] == 0
    time.sleep(1.5)  # past the head timeout, while the answer is written: not cut
    assert list(received)[-1] == "[DONE]"
    client.close()
    assert httpx.get(f"{impatient.url}/health", timeout=60).status_code == 200  # still serving


def test_a_pipelined_head_not_whole_within_the_read_timeout_is_a_408_too(impatient: Server) -> None:
    """A second request begun in the same write as the first (pipelined), its head never ended: once the
    first is answered, it gets the 408 a head begun after the answer gets; it had been closed without a
    word by uvicorn's keep-alive timer (5 s, whatever --read-timeout said)."""
    host, port = impatient.url.removeprefix("http://").rsplit(":", 1)
    health = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
    before = impatient.log().splitlines()
    with socket.create_connection((host, int(port)), timeout=60) as pipelining:
        pipelining.sendall(health + b"\r\n" + health)
        answer = read_to_close(pipelining)
    first, _, rest = answer.partition(b"}")  # the first answer's JSON ends at its only brace
    assert first.startswith(b"HTTP/1.1 200 OK"), answer
    message = "the request line and headers did not all come within 1 s (--read-timeout)"
    assert rest.startswith(b"HTTP/1.1 408 Request Timeout"), answer
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["message"] == message
    assert impatient.log().splitlines()[len(before) :] == [f"error: 408: {message}"]


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_that_stops_coming_for_the_read_timeout_is_a_408_and_closed(
    impatient: Server, chunked: bool
) -> None:
    """A body that stops short of its Content-Length (or of its last chunk) had been awaited forever, its
    connection held: after --read-timeout without a byte of it, a 408 that says so, the connection closed."""
    host, port = impatient.url.removeprefix("http://").rsplit(":", 1)
    head = f"POST {CHAT} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    framing = "Transfer-Encoding: chunked\r\n\r\n6\r\n" if chunked else "Content-Length: 100\r\n\r\n"
    before = impatient.log().splitlines()
    with socket.create_connection((host, int(port)), timeout=60) as stalled:
        stalled.sendall(f'{head}{framing}{{"mes'.encode())  # then nothing more
        answer = read_to_close(stalled)
    head_lines, _, body = answer.partition(b"\r\n\r\n")
    assert head_lines.split(b"\r\n")[0] == b"HTTP/1.1 408 Request Timeout", answer
    assert b"connection: close" in head_lines.lower().split(b"\r\n")
    message = "the request body stopped: none of it came for 1 s (--read-timeout)"
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": "request_timeout"}
    assert json.loads(body) == {"error": error}
    assert impatient.log().splitlines()[len(before) :] == [f"error: POST {CHAT} 408: {message}"]
    assert post(impatient, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


@pytest.mark.parametrize("size", [b"400001", b"ffffffffffff"])
def test_a_chunk_declared_past_the_body_limit_is_a_413_at_once_and_closed(
    impatient: Server, size: bytes
) -> None:
    """A chunk whose size line alone passes the 4 MiB limit had been awaited, a 408 after --read-timeout:
    it is the 413 a body over the limit gets, when its size line comes, and the connection is closed. One
    of the limit exactly is awaited as any other (here cut short: the 408)."""
    exact = "the request body stopped: none of it came for 1 s (--read-timeout)"
    for chunk, status, message in (
        (size, b"413 Request Entity Too Large", f"the request body is over {MAX_BODY_BYTES} bytes"),
        (b"%x" % MAX_BODY_BYTES, b"408 Request Timeout", exact),
    ):
        before = impatient.log().splitlines()
        head, body = exchange(
            impatient, POST_JSON + CHUNKED.removeprefix(b"Host: HOST\r\n") + chunk + b"\r\n"
        )
        assert head[0] == b"HTTP/1.1 " + status and b"connection: close" in head, head
        assert json.loads(body)["error"]["message"] == message
        logged = impatient.log().splitlines()[len(before) :]
        assert logged in (
            [f"error: {status.split()[0].decode()}: {message}"],
            [f"error: POST {CHAT} 408: {message}"],
        )
    assert post(impatient, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


def test_a_chunk_that_breaks_while_its_body_is_read_is_one_log_line(server: Server) -> None:
    """The 400 of a broken chunk had been followed in the log by "the client went away while sending its
    body", which it had not: the server closed the connection on it."""
    before = server.log().splitlines()
    head, body = exchange(
        server, POST_JSON + CHUNKED.removeprefix(b"Host: HOST\r\n") + b'5\r\n{"mes\r\nzz\r\n'
    )
    assert head[0] == b"HTTP/1.1 400 Bad Request"
    assert json.loads(body)["error"]["message"] == BROKEN_CHUNK
    wait_until(lambda: len(server.log().splitlines()) > len(before), 30)
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # after what it logs
    errors = [line for line in server.log().splitlines()[len(before) :] if line.startswith("error")]
    assert errors == [f"error: 400: {BROKEN_CHUNK}"]


BIG = 2 * MAX_BODY_BYTES  # bytes more than the socket buffers between client and server hold


@pytest.mark.parametrize(
    ("data", "status"),
    [
        # a chunk's size line past the limit, its bytes behind it: the 413 when the line comes
        (POST_JSON + CHUNKED.removeprefix(b"Host: HOST\r\n") + b"%x\r\n" % BIG + b"x" * BIG, b"413"),
        (b"GET /health HTTP/1.1\r\nHost: HOST\r\nX-Filler: " + b"a" * BIG + b"\r\n\r\n", b"431"),
    ],
)
def test_a_refusal_that_closes_is_read_whole_by_a_client_still_sending(
    server: Server, data: bytes, status: bytes
) -> None:
    """A refusal that closes the connection while the client still sends its request (a 413 by a chunk's
    size, a 431) had closed it with the client's bytes unread, which is a reset (RST): the client's send
    failed before it could read the answer (one on Windows loses an answer already received too). The
    server shuts its side and drops what still comes (RFC 9112 §9.6): the request is sent whole, the
    answer read whole, and the connection ends cleanly."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as raw:
        raw.sendall(data.replace(b"HOST", f"{host}:{port}".encode()))
        answer = read_to_close(raw)
    assert re.findall(rb"HTTP/1.1 (\d{3}) ", answer) == [status], answer[:300]
    assert b"connection: close" in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


def test_a_stop_closes_idle_and_refused_connections_at_once_however_long_the_read_timeout(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """A stop closes a kept-alive connection between requests, one that sent nothing and one a refusal
    closed, though none of their clients closes its side: a close that lingered for the client's (RFC 9112
    §9.6) had held the stop for --read-timeout, an hour here, with the clients still open."""
    args = [*pair_args(tiny_pair), "--read-timeout", "3600", "--shutdown-timeout", "3600"]
    with Server(args, tmp_path / "server.log") as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        client = http.client.HTTPConnection(host, int(port), timeout=60)
        client.request("GET", "/health")
        assert client.getresponse().read()
        kept = client.sock  # the answer read whole, the connection kept alive
        silent, refused = (socket.create_connection((host, int(port)), timeout=60) for _ in range(2))
        refused.sendall(b"GARBAGE\r\n\r\n")
        assert read_to_close(refused).startswith(b"HTTP/1.1 400 Bad Request")  # its side open still
        server.process.terminate()
        assert server.process.wait(timeout=60) == 0
        assert read_to_close(kept) == read_to_close(silent) == b""  # closed cleanly
        for raw in (kept, silent, refused):
            raw.close()
    assert server.log().splitlines()[-1] == "ead serve: stopped"
    assert "Traceback" not in server.log()


def test_a_close_after_the_client_reset_its_connection_is_at_once() -> None:
    """The server closes a connection its client has just reset (a client that raised on a stream's
    error event and closed, as a stop cut it off): the reset had reached the kernel, not yet the event
    loop, and the staged close's shutdown failed (ENOTCONN), a traceback in the log and its half-made
    drain's AttributeError after it. Now it closes at once, and the protocol that served it is told."""

    class Served(asyncio.Protocol):
        def __init__(self) -> None:
            self.lost: list[Exception | None] = []

        def connection_lost(self, exc: Exception | None) -> None:
            self.lost.append(exc)

    async def close_after_reset() -> tuple[list[Exception | None], list[dict]]:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            client = socket.create_connection(listener.getsockname())
            accepted, _ = listener.accept()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset
        assert select.select([accepted], [], [], 30)[0]  # it has reached the server's kernel
        loop = asyncio.get_running_loop()
        failures: list[dict] = []
        loop.set_exception_handler(lambda _, context: failures.append(context))
        served = Served()
        transport, _ = await loop.connect_accepted_socket(lambda: served, accepted)
        closing = _LingeringTransport(transport, 3600)  # type: ignore[arg-type]
        closing.close()
        while not served.lost:
            await asyncio.sleep(0)
        return served.lost, failures

    lost, failures = asyncio.run(close_after_reset())
    assert len(lost) == 1 and failures == []


def tcp_state(raw: socket.socket) -> int:
    """The kernel's state of a TCP connection (Linux's TCP_INFO): 1 established, 7 closed (reset)."""
    return raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def unread_answers(server: Server, requests: int) -> socket.socket:
    """A connection that sends ``requests`` requests in one write, each for a large answer (some 5 MB of
    log-probabilities, past what the sockets' buffers hold), and reads nothing."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"messages": HI, "max_tokens": 4000, "logprobs": True, "top_logprobs": 20})
    head = f"POST {CHAT} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    unread = socket.socket()
    unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    unread.connect((host, int(port)))
    unread.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode() * requests)
    return unread


UNREAD_ARGS = ["--read-timeout", "1", "--shutdown-timeout", "3600"]


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="needs Linux's TCP_INFO")
def test_an_answer_its_client_never_reads_holds_neither_its_connection_nor_the_stop(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Two clients that send a request for a large answer and read none of it. The server's close (the
    first's, kept alive, when its keep-alive ends; the second's when the server stops) had waited for
    what was still unwritten, forever: the first's connection was held, and the stop for its
    --shutdown-timeout (an hour here). A close lingers (--read-timeout) while the client takes what is
    written; one that takes nothing for as long loses the rest, its connection reset."""
    with Server([*pair_args(tiny_pair), *TAU, *CTX, *UNREAD_ARGS], tmp_path / "server.log") as server:
        first, second = (unread_answers(server, 1) for _ in range(2))  # the second waits its turn
        wait_until(lambda: f"POST {CHAT} 200" in server.log(), 300)
        wait_until(lambda: tcp_state(first) == 7, 60)  # reset, its answer's rest dropped
        wait_until(lambda: server.log().count(f"POST {CHAT} 200") == 2, 300)
        server.process.terminate()
        assert server.process.wait(timeout=60) == 0
        assert tcp_state(second) == 7
        first.close()
        second.close()
    assert server.log().splitlines()[-1] == "ead serve: stopped"
    assert "Traceback" not in server.log()


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="needs Linux's TCP_INFO")
def test_a_pipelined_answer_its_client_never_reads_is_dropped_after_the_send_timeout(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Two requests in one write, none of their answers read: the first fills what the sockets hold, and
    the second's send had waited for room forever (uvicorn times no send, and sse-starlette's send
    timeout was a stream's alone): its connection held, and a stop for its --shutdown-timeout. Every
    send of an answer is timed: the second is dropped after the send timeout, said as a stream's is,
    the connection reset after --read-timeout, and the stop is not held."""
    with Server([*pair_args(tiny_pair), *TAU, *CTX, *UNREAD_ARGS], tmp_path / "server.log") as server:
        pipelining = unread_answers(server, 2)
        dropped = f"the client read nothing for {SEND_TIMEOUT_S:g} s: its answer dropped"
        read_nothing = f"error: POST {CHAT}: {dropped}"
        wait_until(lambda: read_nothing in server.log().splitlines(), 200)
        wait_until(lambda: tcp_state(pipelining) == 7, 60)
        pipelining.close()
        server.process.terminate()
        assert server.process.wait(timeout=60) == 0
    assert server.log().count(f"POST {CHAT} 200") == 2
    assert "Traceback" not in server.log() and "ERROR" not in server.log(), server.log()


def test_a_request_refused_before_its_100_continue_closes_its_connection(server: Server) -> None:
    """A client that asked ``Expect: 100-continue`` and got a refusal instead may send no body; the next
    request it sent on the connection had been read as that body (and never answered): the refusal says
    ``Connection: close`` and the connection is closed (RFC 9110 §10.1.1)."""
    asks = b"Expect: 100-continue\r\nContent-Length: 50\r\n\r\n"
    head, body = exchange(server, POST_JSON.replace(b"application/json", b"text/plain") + asks)
    assert head[0] == b"HTTP/1.1 415 Unsupported Media Type" and b"connection: close" in head, head
    assert json.loads(body)["error"]["code"] == "unsupported_media_type"
    asks = b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1)
    head, body = exchange(server, POST_JSON + asks)
    assert head[0] == b"HTTP/1.1 413 Request Entity Too Large" and b"connection: close" in head, head
    body = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    asks = b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    head, answer = exchange(server, POST_JSON + asks + body)  # taken: the 100 first, then the answer
    assert head == [b"HTTP/1.1 100 Continue"] and answer.startswith(b"HTTP/1.1 200 OK"), head


def head_of(size: int, host: str) -> bytes:
    """A request line and headers of exactly ``size`` bytes, the blank line that ends them included."""
    start = f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Filler: ".encode()
    end = b"\r\nConnection: close\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize("pieces", [1, 7])
def test_the_head_limit_is_exact_however_the_head_arrives(server: Server, pieces: int) -> None:
    """16 KiB of request line and headers, the blank line included, is served; a byte more is the 431,
    whether the head comes in one read or in several (h11 had held an unended head to one byte more, the
    whole one to an estimate some bytes short), alone or behind a request in the same write."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    first = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    for size, status in ((MAX_HEAD_BYTES, b"200"), (MAX_HEAD_BYTES + 1, b"431")):
        for pipelined in (b"", first):
            data = pipelined + head_of(size, f"{host}:{port}")
            with socket.create_connection((host, int(port)), timeout=60) as raw:
                cuts = range(0, len(data), -(-len(data) // pieces))
                for at in cuts:  # after a 431, the rest is dropped, not reset
                    raw.sendall(data[at : at + -(-len(data) // pieces)])
                    time.sleep(0.05 if pieces > 1 else 0)  # apart, so that the server reads them apart
                answer = read_to_close(raw)
            statuses = re.findall(rb"HTTP/1.1 (\d{3}) ", answer)  # one answer after another
            assert statuses == ([b"200"] if pipelined else []) + [status], (size, pipelined, answer[-300:])
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


def test_the_rest_of_a_body_answered_unread_must_come_within_the_read_timeout(impatient: Server) -> None:
    """A request answered before its body is read (a 404, a 413 by its Content-Length): uvicorn reads the
    rest of the body and drops it, and a client that sent it a byte at a time had held the connection
    forever (the 408 of a body cut short is the app's, which has answered): it is closed once the rest
    has not all come within --read-timeout. One that sends the rest at once keeps its connection."""
    host, port = impatient.url.removeprefix("http://").rsplit(":", 1)
    head = f"POST /v1/nothing HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port)), timeout=60) as trickling:
        trickling.sendall(f"{head}Content-Length: 1000\r\n\r\n".encode())
        answer = b""
        while not answer.endswith(b"}}"):
            answer += trickling.recv(65536)
        assert answer.startswith(b"HTTP/1.1 404 Not Found")
        closed = False
        for _ in range(100):  # 30 s of a byte each 0.3 s, 30 times the read timeout
            time.sleep(0.3)
            with contextlib.suppress(OSError):
                trickling.sendall(b"x")
            if select.select([trickling], [], [], 0)[0]:
                closed = trickling.recv(65536) == b""
                break
        assert closed
    with socket.create_connection((host, int(port)), timeout=60) as prompt:
        prompt.sendall(f"{head}Content-Length: 5\r\n\r\nhello".encode())
        prompt.sendall(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        statuses = re.findall(rb"HTTP/1.1 (\d{3}) ", read_to_close(prompt))
    assert statuses == [b"404", b"200"]


def test_a_whole_head_past_the_limit_is_a_431_too(server: Server) -> None:
    """Headers past 16 KiB that arrive whole, in one read: h11 holds to its limit only a head whose end
    it has not seen, so a 20 KiB one sent at once had been answered as any request (its 431 depended on
    how the bytes came)."""
    before = server.log().splitlines()
    filler = (b"X-Filler: " + b"a" * 1000 + b"\r\n") * 20
    head, body = exchange(
        server, b"GET /health HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n" + filler + b"\r\n"
    )
    assert head[0] == b"HTTP/1.1 431 Request Header Fields Too Large"
    error = json.loads(body)["error"]
    assert error["code"] == "headers_too_large" and "16 KiB" in error["message"], error
    assert server.log().splitlines()[len(before) :] == [f"error: 431: {error['message']}"]  # as unended
    fits = (b"X-Filler: " + b"a" * 1000 + b"\r\n") * 12
    head, _ = exchange(
        server, b"GET /health HTTP/1.1\r\nHost: HOST\r\nConnection: close\r\n" + fits + b"\r\n"
    )
    assert head[0] == b"HTTP/1.1 200 OK"


@pytest.mark.parametrize("upgrade", [b"websocket", b"h2c"])
def test_an_upgrade_the_server_does_not_take_is_answered_as_http_without_a_log_line(
    server: Server, upgrade: bytes
) -> None:
    """HTTP lets a server ignore Upgrade: the request is answered as it is. uvicorn had logged two
    WARNING lines for each, one telling the operator to pip install a WebSocket library it never needs."""
    before = server.log().splitlines()
    asked = b"Upgrade: " + upgrade + b"\r\nConnection: Upgrade, close\r\n"
    head, body = exchange(server, b"GET /health HTTP/1.1\r\nHost: HOST\r\n" + asked + b"\r\n")
    assert head[0] == b"HTTP/1.1 200 OK" and json.loads(body)["status"] == "ok"
    assert server.log().splitlines()[len(before) :] == []


def wait_until(condition: object, timeout: float) -> float:
    """Seconds until ``condition()`` holds; fails after ``timeout``."""
    began = time.monotonic()
    while not condition():  # type: ignore[operator]
        assert time.monotonic() - began < timeout, "timed out"
        time.sleep(0.02)
    return time.monotonic() - began


def generating(server: Server) -> bool:
    return httpx.get(f"{server.url}/health", timeout=5).json()["generating"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_client_that_leaves_during_a_long_prefill_frees_the_engine_at_once(server: Server) -> None:
    """The prefill stops between graph nodes when its client leaves, not at the end of the prompt: the
    server's CPU time from the client leaving to the engine being free is under a quarter of what the
    same length of prompt takes to read whole (counted in the server's CPU ticks, not timed: the wall
    clock of a busy 2-core machine is no measure)."""
    prompt = "word " * 3000  # 15,000 tokens of the tiny vocabulary: seconds of prefill
    http = httpx.Client(timeout=120)
    request = http.build_request(
        "POST", f"{server.base_url}/completions", json={"prompt": prompt, "max_tokens": 4, "stream": True}
    )
    response = http.send(request, stream=True)
    wait_until(lambda: generating(server), 30)
    time.sleep(0.3)  # well into the prefill
    assert generating(server)
    left = cpu_ticks(server.process.pid)
    response.close()
    http.close()
    wait_until(lambda: not generating(server), 60)
    after_leaving = cpu_ticks(server.process.pid) - left
    before = cpu_ticks(server.process.pid)
    whole = post(server, "/v1/completions", {"prompt": "wore " * 3000, "max_tokens": 1})  # no shared prefix
    assert whole.status_code == 200, whole.text
    read_whole = cpu_ticks(server.process.pid) - before
    assert after_leaving < read_whole / 4, (after_leaving, read_whole)
    ok = post(server, CHAT, {"messages": HI, "max_tokens": 3})
    assert ok.json()["usage"]["completion_tokens"] == 3


def test_a_waiting_request_that_leaves_frees_its_place(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(tiny_pair), *TAU, *CTX, "--queue", "1"], tmp_path / "server.log") as server:
        first_http, first = stream_request(server.url, LONG)
        received = frames(first)
        assert next(received)["ead"]["index"] == 0  # generating
        second_http, second = stream_request(server.url, 4)  # waits: the queue's one place
        assert post(server, CHAT, {"messages": HI}).status_code == 503  # full
        second.close()
        second_http.close()
        wait_until(lambda: httpx.get(f"{server.url}/health").json()["waiting"] == 0, 5)
        third_http, third = stream_request(server.url, 4)  # takes the place the second gave back
        assert third.status_code == 200
        first.close()
        first_http.close()
        assert list(frames(third))[-2]["usage"]["completion_tokens"] == 4
        third_http.close()
        assert server.stop() == 0
    assert server.log().count("skipped a waiting request: its client went away") == 1


def cpu_ticks(pid: int) -> int:
    """The CPU time a process has used, user and system, in clock ticks (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_health_answers_at_once_while_a_long_prompt_is_tokenized(server: Server) -> None:
    """A prompt that is tokenized, and slowly: one special token fewer than the context holds (the time
    is quadratic in them), then words past it. (A 4 MiB one is refused by its length, untokenized.)

    Health is asked once the server has spent 5 clock ticks of CPU on the request (into the tokenization:
    the request takes 31 to 35 on a 2-core AMD EPYC) and must be answered more than once before the
    refusal is logged (which comes before its reply): with the tokenization on the event loop, none is
    (0 in each of 3 runs; 7 to 32 as served, under two busy loops too). Counted, not timed: the median
    health latency had to stay under 0.1 s, and on a busy 2-core machine it was 0.12 to 0.20 s."""
    body = {"prompt": "<|im_end|>" * (int(CTX[1]) - 1) + "word " * 100, "max_tokens": 1}
    logged = len(server.log())
    result: dict[str, httpx.Response] = {}
    idle = cpu_ticks(server.process.pid)
    thread = threading.Thread(target=lambda: result.update(reply=post(server, "/v1/completions", body)))
    thread.start()
    while cpu_ticks(server.process.pid) < idle + 5 and thread.is_alive():
        time.sleep(0.005)
    answered = 0
    with httpx.Client(timeout=60) as http:
        while thread.is_alive() and "error: POST /v1/completions 400" not in server.log()[logged:]:
            assert http.get(f"{server.url}/health").status_code == 200
            answered += 1 if "error: POST /v1/completions 400" not in server.log()[logged:] else 0
    thread.join()
    assert result["reply"].status_code == 400
    assert result["reply"].json()["error"]["code"] == "context_length_exceeded"
    assert answered >= 2  # health was answered while the prompt was being tokenized


def test_special_tokens_past_the_context_are_refused_before_they_are_tokenized(server: Server) -> None:
    """llama.cpp's tokenizer takes time quadratic in a text's special tokens (minutes for the ~400,000 of
    a 4 MiB body, with both preparing threads busy and every other request waiting): a prompt holding
    more than the context has room for is refused by counting them, in a text prompt and in a chat whose
    messages' markers add up; one that fits is read and counted alike."""
    n_ctx = int(CTX[1])
    for path, body in (
        ("/v1/completions", {"prompt": "<|im_end|>" * n_ctx}),
        (CHAT, {"messages": HI * (n_ctx // 2)}),  # <|im_start|> and <|im_end|> each
    ):
        reply = post(server, path, {**body, "max_tokens": 1})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "context_length_exceeded"
        assert f"{n_ctx} or more special tokens" in error["message"]
    fits = post(server, "/v1/completions", {"prompt": "<|im_end|>" * (n_ctx - 2), "max_tokens": 1})
    assert fits.status_code == 200, fits.text
    assert fits.json()["usage"]["prompt_tokens"] == n_ctx - 2


def test_a_stalled_reader_does_not_hold_the_stop_past_its_timeout(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--shutdown-timeout", "2"]
    with Server(args, tmp_path / "server.log") as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        body = f'{{"prompt": "hi", "max_tokens": {LONG}, "stream": true}}'.encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        stalled.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)  # then reads nothing
        wait_until(lambda: generating(server), 30)
        began = time.monotonic()
        server.process.terminate()
        assert server.process.wait(timeout=60) == 0
        assert time.monotonic() - began < 2 + 10  # the timeout, and generous room for a busy machine
        stalled.close()
    assert server.log().splitlines()[-1] == "ead serve: stopped"
    assert "Traceback" not in server.log()


def test_a_reader_that_stalls_loses_its_answer_and_frees_the_engine_with_one_line(server: Server) -> None:
    """A streaming client that reads nothing (its window full) for the send timeout: its answer is dropped
    and the engine stops it and serves the next; one line says why, and uvicorn's "ERROR: ASGI
    callable returned without completing response." had followed it."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    before = len(server.log().splitlines())
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        # 20 alternatives a token: some 3 kB a chunk, so the server's send buffer fills within seconds
        body = f'{{"prompt": "hi", "max_tokens": {LONG}, "logprobs": 20, "stream": true}}'.encode()
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        stalled.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)  # then reads nothing
        wait_until(lambda: "stopped after" in "".join(server.log().splitlines()[before:]), 300)
    assert post(server, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200  # served next
    new = server.log().splitlines()[before:]
    read_nothing = f"the client read nothing for {SEND_TIMEOUT_S:g} s: its answer dropped"
    stopped = [line for line in new if line.startswith("stopped after ")]
    assert f"error: POST /v1/completions: {read_nothing}" in new, new
    assert len(stopped) == 1 and int(stopped[0].split()[2]) < LONG, new
    assert not [line for line in new if line.startswith(("ERROR", "WARNING"))], new  # uvicorn's own


def test_a_reader_that_stalls_holds_the_engine_no_longer_than_its_generation(server: Server) -> None:
    """A streaming client that reads nothing (its window full): the engine hands each token to the
    request's queue without waiting on the client, so it generates the answer whole and is free, and
    the next request is served, while the stalled stream is still open and unwritten (its send timeout
    has yet to drop it). Were the engine held by the client, it would be stopped by that timeout."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    before = len(server.log().splitlines())
    with socket.socket() as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        # 20 alternatives a token, some 3 kB a chunk: 9 MB, past the server's 4 MiB send buffer and more
        body = b'{"prompt": "hi", "max_tokens": 3000, "logprobs": 20, "stream": true}'
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        stalled.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)  # then reads nothing
        wait_until(lambda: generating(server), 60)
        wait_until(lambda: not generating(server), 300)
        served = post(server, CHAT, {"messages": HI, "max_tokens": 2})
        assert served.status_code == 200
        new = server.log().splitlines()[before:]
        assert len(new) == 1 and new[0].startswith("POST /v1/chat/completions 200: 2 tokens"), new
    # the stalled answer was not written whole (its line comes at its end), nor cut short


def test_a_stop_past_its_timeout_cuts_requests_off_with_a_503_that_says_so(
    tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """--shutdown-timeout runs out: the stream still being written ends with an error event, the request
    still waiting gets OpenAI's error object (503, not uvicorn's plain-text 500 after its "ASGI callable
    returned without starting response"), and the log blames the stop, not clients that never left."""
    args = [*pair_args(tiny_pair), *TAU, *CTX, "--shutdown-timeout", "1"]
    with Server(args, tmp_path / "server.log") as server:
        first_http, first = stream_request(server.url, LONG)
        received = frames(first)
        assert next(received)["ead"]["index"] == 0
        waiting: dict[str, httpx.Response] = {}
        body = {"messages": HI, "max_tokens": 4}
        thread = threading.Thread(
            target=lambda: waiting.update(
                reply=httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
            )
        )
        thread.start()
        wait_until(lambda: httpx.get(f"{server.url}/health").json()["waiting"] == 1, 30)
        server.process.terminate()
        rest = list(received)
        assert rest[-1]["error"]["message"] == "the server is stopping: this request was cut off"
        thread.join(timeout=60)
        assert waiting["reply"].status_code == 503
        assert (
            waiting["reply"].json()["error"]["message"] == "the server is stopping: this request was cut off"
        )
        first_http.close()
        assert server.process.wait(timeout=60) == 0
    log = server.log()
    assert "went away" not in log and "ASGI callable" not in log and "Traceback" not in log, log
    assert "Cancel 2 running task(s), timeout graceful shutdown exceeded" in log  # uvicorn's own word on it
    assert "skipped a waiting request: the server is stopping" in log, log
    assert log.count("error: POST /v1/chat/completions 503: the server is stopping") == 2, log


def test_an_http_1_0_request_without_host_is_answered_an_empty_host_refused(server: Server) -> None:
    """HTTP/1.0 has no Host (nc, a proxy's health check): it was a 403 naming Host ''. No browser sends a
    request without one, so no page rebound to a loopback name can: it is answered. An empty Host stays
    refused."""
    head, body = exchange(server, b"GET /health HTTP/1.0\r\n\r\n")
    assert head[0].startswith(b"HTTP/1.1 200") and json.loads(body)["status"] == "ok"
    head, body = exchange(server, b"GET /health HTTP/1.0\r\nHost: \r\n\r\n")
    assert head[0].startswith(b"HTTP/1.1 403") and json.loads(body)["error"]["code"] == "invalid_host"
