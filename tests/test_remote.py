"""A large model on llama.cpp's own server: real llama-server processes on loopback serving tiny GGUF
models, and every failure provoked for real (a closed port, a server killed mid-answer, a listener
that never answers, an HTTP server that answers wrongly)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

import httpx
import numpy as np
import pexpect
import pytest
from serve_process import Server
from test_cli import EAD, assert_one_line_error, ead, interruptible, read_to_the_end
from test_repl import PROMPT, SUMMARY, plain, send, type_line
from test_serve import http_server, serving
from test_serve_tools import TOOLS_TEMPLATE
from tiny_models import write_tiny_model

from ead_cli.bench import native
from ead_cli.errors import quoted
from ead_cli.options import ModelOptions
from ead_cli.remote import OpenAIRunner, RemoteError, RemoteRunner, built_server, topk_entropy
from ead_cli.runner import Runner

SERVER = built_server()
ADDRESS_FORM = (
    "a server address must look like http://HOST:PORT[/PREFIX], or the same ending in /v1 (OpenAI-compatible)"
)
pytestmark = pytest.mark.skipif(
    not SERVER.exists(), reason="no llama-server: ./scripts/build_llama_server.sh builds it (CI does)"
)


@contextmanager
def llama_server(
    model: Path, tmp_path: Path, n_ctx: int = 2048, port: int = 0, alias: str = ""
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A llama-server on a free loopback port (native.llama_server), or on ``port`` (the last --port is
    the one it takes), listing the model as ``alias`` if given; yields (process, its address)."""
    log = tmp_path / f"server-{model.stem}-{time.monotonic_ns()}.log"
    args = ["-c", str(n_ctx), "-t", "1", *(["--port", str(port)] if port else [])]
    args += ["--alias", alias] if alias else []
    with native.llama_server(model, args, log) as server:
        yield server.process, server.url


@pytest.fixture(scope="module")
def served_large(tiny_large: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server(tiny_large, tmp_path_factory.mktemp("server")) as (_, url):
        yield url


def models(small: Path, large: str) -> list[str]:
    return ["--small", str(small), "--large", large, "--threads", "1"]


def jsonl_tokens(result: subprocess.CompletedProcess) -> list[dict]:
    lines = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return [line for line in lines if line["type"] == "token"]


# ---------------------------------------------------------------------------------------- behaviour


def test_large_mode_through_the_server_equals_the_local_large_model(tiny_pair, served_large) -> None:
    args = ["generate", "--mode", "large", "--max-tokens", "40", "--format", "jsonl", "hi there"]
    local = ead(*args, *models(tiny_pair[0], str(tiny_pair[1])))
    remote = ead(*args, *models(tiny_pair[0], served_large))
    assert remote.returncode == 0, remote.stderr
    assert [t["token"] for t in jsonl_tokens(remote)] == [t["token"] for t in jsonl_tokens(local)]
    assert len(jsonl_tokens(remote)) == 40


def test_a_middle_tau_uses_both_models_and_reports_the_network(tiny_pair, served_large) -> None:
    base = ["generate", "--max-tokens", "60", "--format", "jsonl", "--stats", "hi there"]
    small_alone = ead(*base, *models(tiny_pair[0], served_large), "--mode", "small")
    entropies = sorted(t["entropy"] for t in jsonl_tokens(small_alone))
    tau = entropies[len(entropies) // 2]
    result = ead(*base, *models(tiny_pair[0], served_large), "--tau", f"{tau}")
    assert result.returncode == 0, result.stderr
    assert {t["model"] for t in jsonl_tokens(result)} == {"small", "large"}
    summary = json.loads(result.stdout.decode().splitlines()[-1])
    large = next(report for report in summary["models"] if report["role"] == "large")
    assert large["path"] == served_large and large["requests"] >= large["written"] > 0
    assert large["bytes_sent"] > 0 and large["bytes_received"] > 0 and large["network_s"] > 0
    assert large["prefill_tokens"] + large["catchup_tokens"] + large["decode_tokens"] > 0
    assert "large over the network:" in result.stderr.decode()


def test_one_request_is_said_in_the_singular(tiny_pair, served_large) -> None:
    """--stats' network line counts its requests as every count is said ('1 requests' it had been)."""
    args = ["generate", "--mode", "large", "--max-tokens", "1", "--stats", "hi there"]
    result = ead(*args, *models(tiny_pair[0], served_large))
    assert result.returncode == 0, result.stderr
    assert "large over the network: 1 request in " in result.stderr.decode()


def test_the_remote_entropy_is_the_top_k_lower_bound_of_the_exact_one(tiny_pair, served_large) -> None:
    """The server's top-k probabilities are the softmax of its raw logits: the estimate from them
    matches the bound computed from the local model's own logits for the same tokens."""
    local = Runner(tiny_pair[1], name="large", n_ctx=512, n_threads=1)
    small = Runner(tiny_pair[0], name="small", n_ctx=512, n_threads=1)
    remote = RemoteRunner(served_large, name="large", tokenizer=small, top_k=5)
    try:
        tokens = small.tokenize("The quick brown fox", add_special=False)
        row = local.sync(tokens, prompt_len=len(tokens), own_tail=False).astype(np.float64)
        probs = np.sort(np.exp(row - row.max()) / np.exp(row - row.max()).sum())[::-1]
        remote_row = remote.sync(tokens, prompt_len=len(tokens), own_tail=False)
        assert int(np.argmax(remote_row)) == int(np.argmax(row))
        assert np.isfinite(remote_row).sum() == 5
        lower, upper = topk_entropy(probs[:5], local.n_vocab)
        exact = float(-(probs * np.log2(probs)).sum())
        assert remote.entropy(remote_row) == pytest.approx(lower, abs=1e-3)
        assert lower <= exact + 1e-6 and exact <= upper + 1e-6
    finally:
        for runner in (local, small, remote):
            runner.close()


def test_verify_and_speculative_decoding_need_a_local_checker(tiny_pair, served_large) -> None:
    for extra in (["--verify", "0.1"], ["--mode", "spec"]):
        result = ead("generate", *models(tiny_pair[0], served_large), *extra, "hi")
        assert_one_line_error(result, 2, "llama-server does not return")


def test_ead_serve_names_the_field_a_remote_large_model_refuses(tiny_pair, served_large, tmp_path) -> None:
    """Over HTTP the same refusal had come with ``param`` null: it names the field the client sent."""
    with serving([*models(tiny_pair[0], served_large)], tmp_path / "server.log") as server:
        for ead_options, param in (({"verify": 0.5}, "ead.verify"), ({"mode": "spec"}, "ead.mode")):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "ead": ead_options}
            reply = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert (error["param"], error["code"]) == (param, "invalid_value")
            assert "llama-server does not return" in error["message"]
        answered = httpx.post(f"{server.base_url}/chat/completions", json={**body, "ead": {}}, timeout=60)
        assert answered.status_code == 200, answered.text


def test_an_echoed_prompt_s_log_probabilities_need_a_local_large_model(
    tiny_pair, served_large, tmp_path
) -> None:
    """llama-server's /completion returns no prompt's probabilities: echo with logprobs is a 400 naming the
    server, echo alone the prompt and the answer; the small model's mode scores it locally."""
    with serving([*models(tiny_pair[0], served_large)], tmp_path / "server.log") as server:
        body = {"prompt": "def fib(n):", "max_tokens": 2, "temperature": 0, "echo": True}
        reply = httpx.post(f"{server.base_url}/completions", json={**body, "logprobs": 1}, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "echo" and served_large in error["message"], error
        answered = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
        assert answered.status_code == 200 and answered.json()["choices"][0]["text"].startswith("def fib(n):")
        # the prompt alone (one no other test sends: nothing of it cached): read by llama-server all the
        # same, and counted as read
        alone = {**body, "prompt": "class Alone:", "max_tokens": 0}
        reply = httpx.post(f"{server.base_url}/completions", json=alone, timeout=60).json()
        assert reply["choices"][0]["text"] == "class Alone:" and reply["usage"]["completion_tokens"] == 0
        assert reply["ead"]["summary"]["models"][1]["prefill_tokens"] == reply["usage"]["prompt_tokens"]
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        small = {**body, "logprobs": 1, "ead": {"mode": "small"}}
        scored = httpx.post(f"{server.base_url}/completions", json=small, timeout=60).json()
        assert scored["choices"][0]["logprobs"]["token_logprobs"][0] is None


def test_a_forced_tool_call_needs_every_model_local(tiny_pair, served_large, tmp_path) -> None:
    """A forced call is bound by a grammar, which cannot reach a llama-server: a 400 that says so, and the
    same tools with ``auto`` still answered (their calls read as the model writes them)."""
    small = write_tiny_model(tmp_path / "tools.gguf", seed=0, chat_template=TOOLS_TEMPLATE)
    tools = [{"type": "function", "function": {"name": "flip", "parameters": {"type": "object"}}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": tools}
    with serving(models(small, served_large), tmp_path / "server.log") as server:
        reply = httpx.post(
            f"{server.base_url}/chat/completions", json={**body, "tool_choice": "required"}, timeout=60
        )
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "tool_choice" and "a model on a llama-server" in error["message"], error
        answered = httpx.post(
            f"{server.base_url}/chat/completions", json={**body, "tool_choice": "auto"}, timeout=60
        )
        assert answered.status_code == 200, answered.text


def test_a_server_with_another_tokenizer_is_refused(tiny_pair, tiny_other_vocab, tmp_path) -> None:
    with llama_server(tiny_other_vocab, tmp_path) as (_, url):
        result = ead("generate", *models(tiny_pair[0], url), "hi")
    assert_one_line_error(result, 1, "do not share a tokenizer", "tokenizes differently")


def test_a_server_whose_model_ends_generations_at_another_token_is_refused(tiny_pair, tmp_path) -> None:
    """Every token the same, but <|im_start|> ends a turn there: the large model would stop where the
    small one writes on."""
    model = write_tiny_model(tmp_path / "eog.gguf", seed=1, eot_token="<|im_start|>")
    with llama_server(model, tmp_path) as (_, url):
        result = ead("generate", *models(tiny_pair[0], url), "hi")
    assert_one_line_error(result, 1, "do not share a tokenizer", "token 265 ends a generation only in")


def test_a_server_restarted_with_another_model_is_refused_per_request(
    tiny_pair, tiny_other_vocab, tmp_path
) -> None:
    """The tokenizer was checked once, at start: a llama-server restarted on the same port with a model
    of another tokenizer (the same size) had answered every request after, silently wrong. The model
    the server names is read again on each new connection; another one is checked again, and refused
    request by request with an error object while ead serve goes on serving; a model that shares the
    tokenizer is served."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with llama_server(tiny_pair[1], tmp_path) as (first, url):
        port = urlsplit(url).port
        assert port is not None
        with serving([*models(tiny_pair[0], url)], tmp_path / "serve.log") as server:

            def ask() -> httpx.Response:
                return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)

            assert ask().status_code == 200
            native.stop(first)
            with llama_server(tiny_other_vocab, tmp_path, port=port):
                for _ in range(2):
                    reply = ask()
                    assert reply.status_code == 502, reply.text
                    message = reply.json()["error"]["message"]
                    assert message.startswith(f"{url} now serves another model"), message
                    assert "do not share a tokenizer" in message, message
            with llama_server(tiny_pair[0], tmp_path, port=port):  # another model, the same tokenizer
                assert ask().status_code == 200


@pytest.mark.parametrize(
    ("other", "reason"),
    [
        ("vocabulary", "tokenizes differently"),
        # every token the same but one more ending a generation: the ids were not in the fingerprint
        ("end of generation", "token 265 ends a generation only in the server's model"),
    ],
)
def test_another_tokenizer_under_the_same_name_and_sizes_is_refused(
    tiny_pair, tiny_other_vocab, tmp_path, other: str, reason: str
) -> None:
    """A llama-server restarted with a model of another tokenizer under the same alias and sizes lists
    the same model: it had been taken, silently. The server's tokens for the probes and its
    end-of-generation ids, asked with the listing on each new connection, tell it."""
    if other == "vocabulary":
        model = tiny_other_vocab
    else:  # the large model's weights and sizes, with <|im_start|> ending a turn
        model = write_tiny_model(tmp_path / "eog.gguf", seed=1, eot_token="<|im_start|>")
    small = Runner(tiny_pair[0], name="small", n_ctx=512, n_threads=1)
    tokens = small.tokenize("hello", add_special=False)
    with llama_server(tiny_pair[1], tmp_path, alias="large") as (first, url):
        port = urlsplit(url).port
        assert port is not None
        remote = RemoteRunner(url, name="large", tokenizer=small)
        try:
            remote.check_tokenizer("small")
            remote.sync(tokens, prompt_len=len(tokens), own_tail=False)
            native.stop(first)
            with (
                llama_server(model, tmp_path, port=port, alias="large"),
                pytest.raises(RemoteError, match=f"^{url} now serves another model .* {re.escape(reason)}"),
            ):
                remote.sync(tokens, prompt_len=len(tokens), own_tail=False)
        finally:
            remote.close()
            small.close()


KEY = "k3y-0f-the-server"
REFUSED = "GET /v1/models answered HTTP 401: Invalid API Key"


@contextmanager
def keyed_server(model: Path, tmp_path: Path) -> Iterator[str]:
    """A llama-server started with --api-key KEY; yields its address."""
    args = ["-c", "2048", "-t", "1", "--api-key", KEY]
    with native.llama_server(model, args, tmp_path / "server.log") as server:
        yield server.url


def given_key(key: str, given: str) -> tuple[list[str], dict[str, str] | None]:
    """The key as --remote-api-key (the options, no environment) or as EAD_REMOTE_API_KEY."""
    return (["--remote-api-key", key], None) if given == "option" else ([], {"EAD_REMOTE_API_KEY": key})


def assert_key_unsaid(result: subprocess.CompletedProcess) -> None:
    assert KEY.encode() not in result.stdout + result.stderr


@pytest.mark.parametrize("suffix", ["", "/v1"])
def test_a_server_that_asks_for_an_api_key_says_how_to_give_it(tiny_pair, tmp_path, suffix: str) -> None:
    """A llama-server started with --api-key and no key given: its 401 had read as any failure ('failed
    with HTTP 401'), then as a key ead does not send."""
    with keyed_server(tiny_pair[1], tmp_path) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}{suffix}"), "hi")
    how = "give it with --remote-api-key or EAD_REMOTE_API_KEY"
    assert assert_one_line_error(result, 1) == f"error: {url}{suffix} asks for an API key ({REFUSED}): {how}"


@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_wrong_api_key_is_said_refused_without_being_said(tiny_pair, tmp_path, given: str) -> None:
    wrong = "not-" + KEY
    option, env = given_key(wrong, given)
    with keyed_server(tiny_pair[1], tmp_path) as url:
        result = ead("generate", *models(tiny_pair[0], url), *option, "hi", env=env)
    assert assert_one_line_error(result, 1) == f"error: {url} refused the API key given ({REFUSED})"
    assert b"k3y" not in result.stderr


@pytest.mark.parametrize("status", [401, 403, 404, 500])
def test_a_server_that_quotes_the_key_it_was_sent_has_it_masked(tiny_pair, status: int) -> None:
    """A server (a proxy, a gateway) whose refusal quotes the Authorization header it got: ead quotes the
    server's words, and the key had been said in them."""
    said = json.dumps({"error": {"message": f"Authorization: Bearer {KEY} is not valid here"}}).encode()
    with wrong_server({"/health": (status, said)}) as url:
        result = ead("generate", *models(tiny_pair[0], url), "--remote-api-key", KEY, "hi")
    assert "Authorization: Bearer *** is not valid here" in assert_one_line_error(result, 1)
    assert_key_unsaid(result)


LOADING = "HTTP 503: Loading model"


def test_a_server_still_loading_its_model_past_the_timeout_says_so(tiny_pair) -> None:
    """llama-server answers /health with 503 while it loads: ead says it waits (it had waited up to a
    minute without a word), up to --remote-timeout, then says so (it had quoted the last 503, 'failed
    with HTTP 503: Loading model')."""
    loading = b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'
    with wrong_server({"/health": (503, loading)}) as url:
        result = ead("generate", *models(tiny_pair[0], url), "--remote-timeout", "1", "hi")
    assert result.returncode == 1 and result.stdout == b""
    assert result.stderr.decode().splitlines() == [
        f"waiting for {url}: not ready ({LOADING}), for up to 1 s (--remote-timeout)",
        f"error: {url} was still not ready after 1 s ({LOADING}; --remote-timeout sets the wait)",
    ]


# Its -c named as llama-server's: ead takes -c too, for --ctx, which sizes only its own models ('a larger -c,
# llama-server's context size, which --ctx does not set or shorten the prompt' had read as ead's -c)
SERVER_CONTEXT_ADVICE = "start the llama-server at {url} with a larger context, llama-server -c N"


def test_a_context_the_server_s_makes_too_small_says_to_raise_that(tiny_pair, tmp_path) -> None:
    """The server's context is the run's where it is the smallest: 'raise --ctx' had been the advice
    when an answer filled it and when a prompt did not fit it, where --ctx was already past it."""
    with llama_server(tiny_pair[1], tmp_path, n_ctx=256) as (_, url):  # llama-server's least per slot
        args = ["--mode", "large", "--ctx", "4096", "--max-tokens", "400", "--format", "jsonl"]
        answer = ead("generate", *models(tiny_pair[0], url), *args, "hi")
        # each 'z' one token of the tiny vocabulary
        prompt = ead("generate", *models(tiny_pair[0], url), *args, "--raw", "z" * 255)
        system = ead("chat", *models(tiny_pair[0], url), "--ctx", "4096", "--system", "z" * 300, stdin=b"")
    advice = SERVER_CONTEXT_ADVICE.format(url=url)
    assert answer.returncode == 0, answer.stderr
    note = answer.stderr.decode().strip()
    assert note.startswith("the context (255 tokens) is full: the answer stops at "), note
    assert note.endswith(f"of the 400 asked ({advice})"), note
    assert assert_one_line_error(prompt, 2) == (
        "error: the prompt is 255 tokens, too many for the context of 255 tokens: it takes at most 254, to "
        f"leave room for the answer ({advice} or shorten the prompt)"
    )
    assert assert_one_line_error(system, 2).endswith(f"({advice} or shorten the system message)")


def test_the_smallest_model_must_be_local(tiny_pair, served_large) -> None:
    result = ead("generate", "--small", served_large, "--large", str(tiny_pair[1]), "hi")
    assert_one_line_error(result, 2, "the smallest model must be local")


# ----------------------------------------------------------------------------------------- failures


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("scheme", ["http", "HTTP"])
def test_a_server_that_is_down_at_start_is_one_line(tiny_pair, scheme: str) -> None:
    """A scheme in capitals is the same address (it had been taken for a file: 'model file not found')."""
    url = f"{scheme}://127.0.0.1:{closed_port()}"
    result = ead("generate", *models(tiny_pair[0], url), "hi")
    assert_one_line_error(result, 1, url, "unreachable")


@pytest.mark.parametrize(
    "url",
    [
        "http://",
        # http:// mistyped: these had been taken for files ('model file not found: http:/host')
        "http:/127.0.0.1:8080",
        "HTTP:/127.0.0.1:8080",
        "http//127.0.0.1:8080",
        "http:127.0.0.1:8080",
        "http://[::1",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:x/v1",
        # parts that had been dropped without a word (port 0 had become 80, a path other than /v1 had
        # been ignored but named in every error, a user and password were never sent but printed)
        "http://127.0.0.1:0",
        # a path http.client cannot send: it had been a traceback once a path was taken as a prefix
        "http://127.0.0.1:8080/a b",
        "http://127.0.0.1:8080/café",
        "http://user:secret@127.0.0.1:8080",
        "http://127.0.0.1:8080/?key=1",
        "http://127.0.0.1:8080/v1#models",
        "http:// 127.0.0.1:8080",  # it had been 'unreachable (URL can't contain control characters...)'
        # a host name the resolver cannot encode (a label past 63 characters, an empty one): tracebacks
        f"http://{'a' * 64}:8080",
        "http://gpu..box:8080",
        "http://127.0.0.1:0/" + "p" * 10_000,  # echoed whole, it had been a 10 kB line
    ],
    ids=lambda url: url[:60],
)
def test_a_malformed_server_address_is_a_usage_error_before_loading(tiny_pair, url: str) -> None:
    """Whatever urlsplit makes of it (an unclosed IPv6 bracket, a port out of range or not a number,
    parts ead would not use): one line and exit 2, before the small model loads (here it is a file that
    is not there), the address echoed as any bad value is."""
    message = f"error: {quoted(url)}: {ADDRESS_FORM}"
    assert assert_one_line_error(ead("generate", *models(tiny_pair[0], url), "hi"), 2) == message
    assert assert_one_line_error(ead("generate", *models(Path("absent.gguf"), url), "hi"), 2) == message


@pytest.mark.parametrize(
    ("path", "endpoint", "address"),
    [
        ("/completion", "/completion", ""),
        ("/chat/completions/", "/chat/completions", ""),
        ("/health", "/health", ""),
        ("/proxy/tokenize", "/tokenize", "/proxy"),
        ("/v1/completions", "/completions", "/v1"),
        ("/v1/chat/completions", "/chat/completions", "/v1"),
        ("/proxy/v1/models/", "/models", "/proxy/v1"),
    ],
)
def test_an_address_that_ends_in_an_endpoint_says_which_address_to_give(
    tiny_pair, path: str, endpoint: str, address: str
) -> None:
    """An endpoint copied from llama-server's or OpenAI's docs: one in /v1 had been refused as malformed,
    with no word of what was wrong, and one of llama-server's own taken as a proxy's prefix ('is not a
    llama-server: GET /completion/health answered HTTP 404'). The line names the address to give,
    before the small model loads (here it is a file that is not there)."""
    url = f"http://127.0.0.1:8080{path}"
    expected = (
        f"error: {quoted(url)} ends in the endpoint {endpoint}: give the server's address, "
        f"http://127.0.0.1:8080{address}"
    )
    for small in (tiny_pair[0], Path("absent.gguf")):
        assert assert_one_line_error(ead("generate", *models(small, url), "hi"), 2) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        # another scheme: it had been taken for a file ('model file not found: ftp:/x/y'), https for a
        # malformed address
        ("ftp://x/y", "ead reaches a server over plain http:// only"),
        ("WS://gpu-box:8080", "ead reaches a server over plain http:// only"),
        ("htp://gpu-box:8080", "ead reaches a server over plain http:// only"),
        ("https://127.0.0.1:8080", "ead reaches a server over plain http:// only"),
        ("file:///tmp/large.gguf", "a model file is given by its path, not as a file:// address"),
    ],
)
def test_an_address_of_another_scheme_is_a_usage_error_naming_the_one_taken(tiny_pair, url, reason) -> None:
    for small in (tiny_pair[0], Path("absent.gguf")):  # before the small model loads
        result = ead("generate", *models(small, url), "hi")
        assert assert_one_line_error(result, 2) == f"error: {quoted(url)}: {reason}; {ADDRESS_FORM}"


@pytest.mark.parametrize("reference", ["C:/models/large.gguf", "lmstudio:/x/large.gguf"])
def test_a_drive_letter_or_another_tool_s_prefix_is_no_address(tiny_pair, reference: str) -> None:
    """A scheme is two characters or more, and the prefixes of ollama's and LM Studio's models are theirs."""
    result = ead("generate", *models(tiny_pair[0], reference), "hi")
    assert ADDRESS_FORM not in assert_one_line_error(result, 1)


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "[::1]")])
def test_a_server_that_never_answers_times_out(tiny_pair, family: socket.AddressFamily, host: str) -> None:
    """An IPv6 literal is asked at its address and named as given."""
    with socket.socket(family) as listener:
        try:
            listener.bind((host.strip("[]"), 0))
        except OSError:
            pytest.skip(f"no {host} loopback here")
        listener.listen()
        url = f"http://{host}:{listener.getsockname()[1]}"
        began = time.monotonic()
        result = ead("generate", *models(tiny_pair[0], url), "--remote-timeout", "1", "hi")
    assert assert_one_line_error(result, 1) == f"error: {url} did not answer /health within 1 s"
    assert time.monotonic() - began < 30


def test_an_openai_server_that_never_answers_is_named_once(tiny_pair) -> None:
    """The address with its /v1 once: it had been '.../v1 did not answer /v1/models within 1 s'."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        result = ead("generate", *models(tiny_pair[0], f"{url}/v1"), "--remote-timeout", "1", "hi")
    assert assert_one_line_error(result, 1) == f"error: {url} did not answer /v1/models within 1 s"


class _Redirect(BaseHTTPRequestHandler):
    """Sends every request elsewhere, as a proxy or a load balancer in front of a server may."""

    def do_GET(self) -> None:
        self.send_response(301)
        self.send_header("Location", f"https://gpu-box:8443{self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("suffix", ["", "/v1"])
def test_a_redirect_is_named_with_where_it_points(tiny_pair, suffix: str) -> None:
    """A 3xx had been taken for a healthy server, then 'did not describe the model' followed."""
    with http_server(_Redirect) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}{suffix}"), "hi")
    path = "/v1/models" if suffix else "/health"
    expected = f"error: {url}{path} redirects (HTTP 301) to https://gpu-box:8443{path}: give that address"
    assert assert_one_line_error(result, 1) == expected


class _Wrong(BaseHTTPRequestHandler):
    """Answers like no llama-server would: the test sets what."""

    replies: ClassVar[dict[str, tuple[int, bytes]]] = {}

    def do_GET(self) -> None:
        status, body = self.replies.get(self.path, (404, b'{"error": {"message": "not found"}}'))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def wrong_server(replies: dict[str, tuple[int, bytes]]) -> Iterator[str]:
    with http_server(type("Handler", (_Wrong,), {"replies": replies})) as url:
        yield url


NGINX_502 = b"""<html>
<head><title>502 Bad Gateway</title></head>
<body>
<center><h1>502 Bad Gateway</h1></center>
<hr><center>nginx/1.24.0</center>
</body>
</html>
"""
NO_SUCH_SIZE = b'{"data": [{"meta": {"n_vocab": 1e999, "n_ctx": 512, "n_params": 1, "n_embd": 64}}]}'


@pytest.mark.parametrize(
    ("replies", "fragment"),
    [
        ({"/health": (500, b'{"error": {"message": "out of memory"}}')}, "HTTP 500: out of memory"),
        ({"/health": (200, b"<html>hello</html>")}, "sent a reply that is not JSON"),
        ({"/health": (200, b"{}"), "/v1/models": (200, b'{"data": []}')}, "did not describe the model"),
        # the error as a bare string (ollama's and others' shape): it had been a traceback
        ({"/health": (500, b'{"error": "model crashed"}')}, "HTTP 500: model crashed"),
        # a message of several lines, and one of 100 kB: it had been printed whole
        ({"/health": (500, b'{"error": {"message": "line one\\nline two"}}')}, "HTTP 500: line one line two"),
        ({"/health": (500, b'{"error": {"message": "%s"}}' % (b"x" * 100_000))}, "HTTP 500: xxx"),
        # an error page that is not JSON (a proxy's): its text, where it had been 'no message'
        ({"/health": (502, b"upstream went away\r\n")}, "HTTP 502: upstream went away"),
        # an HTML one (nginx's) by its words: its markup had been quoted
        (
            {"/health": (502, NGINX_502)},
            "/health failed with HTTP 502: 502 Bad Gateway nginx/1.24.0",
        ),
        # JSON nested past Python's recursion limit, and a number past a 64-bit one: tracebacks before
        ({"/health": (200, b"[" * 100_000)}, "sent a reply that is not JSON"),
        ({"/health": (200, b"{}"), "/v1/models": (200, NO_SUCH_SIZE)}, "did not describe the model"),
    ],
)
def test_http_errors_and_malformed_replies_are_one_line(tiny_pair, replies, fragment) -> None:
    with wrong_server(replies) as url:
        result = ead("generate", *models(tiny_pair[0], url), "hi")
    assert len(assert_one_line_error(result, 1, fragment)) < 500


class _Files(SimpleHTTPRequestHandler):
    """``python -m http.server`` serving an empty folder: every path a 404 with an HTML page."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, directory=str(Path(__file__).parent / "no such folder"), **kwargs)

    def log_message(self, *args: object) -> None:
        pass


PYTHON_404 = "(Error response Error code: 404 Message: File not found. E...)"


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        ("", " is not a llama-server: GET /health answered HTTP 404 " + PYTHON_404),
        ("/v1", "/v1 is not an OpenAI-compatible server: GET /v1/models answered HTTP 404 " + PYTHON_404),
    ],
)
def test_a_server_that_is_not_a_llama_server_is_named_so(tiny_pair, suffix: str, message: str) -> None:
    """Any other HTTP server (a file server, a web site): its 404 page had been quoted as the error, HTML
    and all, 'failed with HTTP 404: <!DOCTYPE HTML> <html lang="en"> <head> ...'."""
    with http_server(_Files) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}{suffix}"), "hi")
    assert assert_one_line_error(result, 1) == f"error: {url}{message}"


def test_an_openai_server_without_tokenize_is_named_so(tiny_pair) -> None:
    """An OpenAI-compatible server lacking llama-server's /tokenize (ollama's, LM Studio's) is not 'not
    OpenAI-compatible': what is missing, and why ead asks for it."""
    with wrong_server({"/v1/models": (200, b'{"data": [{"id": "m"}]}')}) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}/v1"), "hi")
    message = "not found (HTTP 404): ead's tokenizer check needs it (llama-server and vLLM have one)"
    assert assert_one_line_error(result, 1) == f"error: {url}/tokenize {message}"


@pytest.mark.parametrize("size", [b"null", b'"4k"', b"1e999"])
def test_an_openai_server_whose_model_size_is_not_a_count_is_one_line(tiny_pair, size: bytes) -> None:
    """The context size (vLLM's ``max_model_len``) as null, text or past 64 bits: tracebacks before."""
    listing = b'{"data": [{"id": "m", "max_model_len": %s}]}' % size
    with wrong_server({"/v1/models": (200, listing)}) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}/v1"), "hi")
    assert_one_line_error(result, 1, url, "did not describe the model")


def test_an_openai_server_s_http_error_names_the_address_asked(tiny_pair) -> None:
    """The address with its /v1 once: it had been '.../v1/v1/models failed with HTTP 500'."""
    with wrong_server({"/v1/models": (500, b'{"error": {"message": "busy"}}')}) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}/v1"), "hi")
    assert assert_one_line_error(result, 1) == f"error: {url}/v1/models failed with HTTP 500: busy"


class _Corrupt(BaseHTTPRequestHandler):
    """Passes each request on to a real llama-server and its reply back, but answers a token step (a
    completion that asks for probabilities) with ``reply``."""

    upstream: ClassVar[tuple[str, int]]
    reply: ClassVar[bytes]

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        self._forward(self.rfile.read(int(self.headers["Content-Length"])))

    def _forward(self, body: bytes | None) -> None:
        if body is not None and b"n_probs" in body:
            status, payload = 200, self.reply
        else:
            upstream = http.client.HTTPConnection(*self.upstream, timeout=30)
            upstream.request(self.command, self.path, body=body, headers={"Content-Type": "application/json"})
            answer = upstream.getresponse()
            status, payload = answer.status, answer.read()
            upstream.close()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def step_reply(entry: str, timings: str = "{}") -> bytes:
    return b'{"completion_probabilities": [{"top_logprobs": [%s]}], "timings": %s}' % (
        entry.encode(),
        timings.encode(),
    )


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (step_reply('{"id": 1e30, "logprob": -0.1}'), "malformed reply"),
        (step_reply('{"id": 100000000000000000000000000000, "logprob": -0.1}'), "malformed reply"),
        (step_reply('{"id": 5, "logprob": -%s}' % ("9" * 400)), "malformed reply"),
        (step_reply('{"id": 5, "logprob": -0.1}', '{"prompt_n": 1e999}'), "malformed timings"),
        (b"[" * 100_000, "not JSON"),
        # a probability above 1, or none at all: nonsense entropies had followed
        (step_reply('{"id": 5, "logprob": 0.5}'), "malformed reply (log-probabilities"),
        (step_reply('{"id": 5, "logprob": NaN}'), "malformed reply (log-probabilities"),
        (step_reply('{"id": 5, "logprob": "nan"}'), "malformed reply (log-probabilities"),
        (step_reply('{"id": 5, "logprob": -0.1}, {"id": 6, "logprob": -0.2}'), "add up to more than 1"),
        # timings that are no times or counts: NaN had made the --stats summary invalid JSON
        (step_reply('{"id": 5, "logprob": -0.1}', '{"prompt_ms": NaN}'), "malformed timings"),
        (step_reply('{"id": 5, "logprob": -0.1}', '{"predicted_ms": -1}'), "malformed timings"),
        (step_reply('{"id": 5, "logprob": -0.1}', '{"prompt_n": -3}'), "malformed timings"),
        (step_reply('{"id": 5, "logprob": -0.1}', '{"prompt_n": 1000000}'), "malformed timings"),
    ],
    ids=[
        *("float id", "64-bit id", "logprob", "prompt_n", "nesting", "above 0", "NaN", "nan text", "sum"),
        *("NaN ms", "negative ms", "negative count", "count past the prompt"),
    ],
)
def test_a_token_step_answered_with_numbers_past_any_bound_is_one_line(
    tiny_pair, served_large, reply: bytes, fragment: str
) -> None:
    """Ids and counts past 64 bits, a log-probability past a float, nesting past the recursion limit:
    an OverflowError or a RecursionError had been a traceback."""
    parts = urlsplit(served_large)
    handler = type("Handler", (_Corrupt,), {"upstream": (parts.hostname, parts.port), "reply": reply})
    with http_server(handler) as url:
        result = ead("generate", *models(tiny_pair[0], url), "--mode", "large", "--max-tokens", "3", "hi")
    err = result.stderr.decode()
    assert result.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {url}") and fragment in err, err


def test_top_probabilities_in_any_order_give_the_same_entropy(tiny_pair, served_large) -> None:
    """The estimate takes the last of the top k for the least likely: a server that lists them in
    another order had given another entropy, silently; the same token twice is a malformed reply."""
    parts = urlsplit(served_large)

    def step(*entries: str) -> subprocess.CompletedProcess:
        handler = type(
            "Handler",
            (_Corrupt,),
            {"upstream": (parts.hostname, parts.port), "reply": step_reply(", ".join(entries))},
        )
        with http_server(handler) as url:
            args = ["--mode", "large", "--max-tokens", "1", "--format", "jsonl", "hi"]
            return ead("generate", *models(tiny_pair[0], url), *args)

    likely, unlikely = '{"id": 5, "logprob": -0.5}', '{"id": 6, "logprob": -3.0}'
    entropies = [
        jsonl_tokens(step(*entries))[0]["entropy"] for entries in ((likely, unlikely), (unlikely, likely))
    ]
    assert entropies[0] == pytest.approx(entropies[1])
    twice = step(unlikely, unlikely)
    assert twice.returncode == 1 and "malformed reply (token 6 twice)" in twice.stderr.decode(), twice.stderr


class _CorruptOpenAI(_Corrupt):
    """As ``_Corrupt``, for an OpenAI-compatible token step (it asks for ``logprobs``)."""

    def _forward(self, body: bytes | None) -> None:
        super()._forward(body.replace(b'"logprobs"', b'"n_probs"') if body else body)


def test_an_openai_step_with_a_probability_above_1_names_its_path(tiny_pair, served_large) -> None:
    """The step's own path (it had been named '/v1/completion', a path ead never asked)."""
    parts = urlsplit(served_large)
    reply = b'{"choices": [{"logprobs": {"content": [{"top_logprobs": [{"id": 5, "logprob": 0.5}]}]}}]}'
    handler = type("Handler", (_CorruptOpenAI,), {"upstream": (parts.hostname, parts.port), "reply": reply})
    with http_server(handler) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}/v1"), "--mode", "large", "hi")
    message = "/v1/completions sent a malformed reply (log-probabilities must be at most 0, got 0.5)"
    assert result.returncode == 1 and result.stderr.decode() == f"error: {url}{message}\n"


@contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback listener that reads each request and lets ``answer`` write whatever bytes it likes on
    the connection (not HTTP, half a reply, an endless one); yields its address."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_one(connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):  # the client may leave first
            connection.recv(65536)
            answer(connection)

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            while True:
                threading.Thread(target=answer_one, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


NOT_HTTP = "/health did not answer in HTTP: it sent "
CUT = "/health sent an incomplete reply"


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        # a TLS alert (an https server), an SSH banner: the reply's first line had been printed raw
        (b"\x15\x03\x01\x00\x02\x02\n", NOT_HTTP + r"'\x15\x03\x01\x00\x02\x02\n'"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", NOT_HTTP + r"'SSH-2.0-OpenSSH_9.6\r\n'"),
        # half a reply, then the connection closed: it had been 'unreachable (IncompleteRead(...))'
        (b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"status": ', CUT),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", CUT),
        # the head cut short: it had been taken for a healthy server's empty reply
        (b"HTTP/1.1 200 OK\r\nContent-Le", CUT),
        (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 200 + b"\r\n", "/health sent a malformed HTTP reply"),
    ],
    ids=["tls", "ssh", "cut", "chunks", "cut head", "headers"],
)
def test_a_reply_that_is_not_http_or_is_cut_is_one_line(tiny_pair, reply: bytes, message: str) -> None:
    with raw_server(lambda connection: connection.sendall(reply)) as url:
        result = ead("generate", *models(tiny_pair[0], url), "hi")
    assert message in assert_one_line_error(result, 1, url)


def trickle(connection: socket.socket) -> None:
    """A reply's head, then a byte of its body every 0.1 s: each read is quick, the reply endless (it
    stops after 20 s, so that a client that waits for it all fails in bounded time)."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    for _ in range(200):
        connection.sendall(b" ")
        time.sleep(0.1)


def trickle_head(connection: socket.socket) -> None:
    """As ``trickle``, in the reply's head: its status line, then a header a byte every 0.1 s."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    for _ in range(200):
        connection.sendall(b"y")
        time.sleep(0.1)


def flood(connection: socket.socket) -> None:
    """A reply with no length whose body runs on (64 MiB here, then it closes)."""
    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    for _ in range(1024):
        connection.sendall(b" " * 65536)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (trickle, "did not answer /health within 1 s"),
        (trickle_head, "did not answer /health within 1 s"),
        (flood, "/health sent a reply of more than 16 MiB"),
    ],
    ids=["trickle", "trickle head", "flood"],
)
def test_a_reply_that_never_ends_is_cut_off(tiny_pair, answer, message: str) -> None:
    """--remote-timeout bounds the whole reply, its head too, not each read of it, and a reply's size is
    bounded: a byte every 0.1 s had held ead for as long as the server liked (in the head, until the
    server stopped), an endless body had filled memory."""
    with raw_server(answer) as url:
        result = ead("generate", *models(tiny_pair[0], url), "--remote-timeout", "1", "hi")
    assert message in assert_one_line_error(result, 1, url)


def run_and_kill_the_server(tiny_pair, tmp_path: Path, *extra: str) -> tuple[int, list[dict], str]:
    """Start a long answer through a real server, kill the server after a few tokens; return the exit
    code, the token objects printed and stderr."""
    with llama_server(tiny_pair[1], tmp_path, n_ctx=4096) as (server, url):
        args = ["generate", *models(tiny_pair[0], url), "--mode", "large", "--max-tokens", "3000"]
        process = subprocess.Popen(
            [str(EAD), *args, "--ctx", "4096", "--format", "jsonl", *extra, "hi"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=interruptible,
        )
        assert process.stdout is not None
        first = [process.stdout.readline() for _ in range(5)]
        server.send_signal(signal.SIGKILL)
        rest, err = read_to_the_end(process)
    lines = [json.loads(line) for line in b"".join(first).splitlines() + rest.splitlines()]
    return process.returncode, [line for line in lines if line["type"] == "token"], err.decode()


def test_a_server_lost_mid_answer_stops_with_what_was_written(tiny_pair, tmp_path) -> None:
    code, tokens, err = run_and_kill_the_server(tiny_pair, tmp_path)
    assert code == 1, err
    assert 5 <= len(tokens) < 3000
    assert {t["model"] for t in tokens} == {"large"}
    assert err.startswith("error: http://127.0.0.1:") and ("unreachable" in err or "incomplete reply" in err)
    assert len(err.strip().splitlines()) == 1


def test_a_server_lost_mid_answer_falls_back_to_the_small_model(tiny_pair, tmp_path) -> None:
    code, tokens, err = run_and_kill_the_server(tiny_pair, tmp_path, "--fallback", "small")
    assert code == 0, err
    models_written = [t["model"] for t in tokens]
    switch = models_written.index("small")
    assert switch >= 5 and set(models_written[switch:]) == {"small"}
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert "unreachable" in err and "the small model wrote the rest" in err


def test_a_server_lost_mid_answer_in_chat_closes_the_answer_before_saying_why(tiny_pair, tmp_path) -> None:
    """As generate does: the cut answer's line is ended and its summary said, then the error (it had
    been glued to the last token, with no summary)."""
    with llama_server(tiny_pair[1], tmp_path, n_ctx=4096) as (server, url):
        args = ["--mode", "large", "--max-tokens", "3000", "--ctx", "4096"]
        process = subprocess.Popen(
            [EAD, "chat", *models(tiny_pair[0], url), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=interruptible,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(b"hi\n")
        process.stdin.close()
        first = process.stdout.read(5)
        server.send_signal(signal.SIGKILL)
        rest, err = read_to_the_end(process)
    assert process.returncode == 1, err
    answer, lines = first + rest, err.decode().splitlines()
    assert len(answer) > 5 and answer.endswith(b"\n"), answer
    assert SUMMARY.match(lines[-2]) and lines[-2].endswith("cut (error)"), err
    assert lines[-1].startswith("error: http://127.0.0.1:") and "unreachable" in lines[-1], err


def test_fallback_where_no_model_on_a_server_writes_is_said_unused(tiny_pair, served_large) -> None:
    """--fallback small acts where a llama-server's model is lost mid-answer: with every model local, or
    a mode whose writer is local, it is said unused in the one note (chat too: no command brings a server
    in); where the served large model writes, it is not."""

    def notes(command: str, large: str, *args: str) -> list[str]:
        stdin, prompt = ("hi\n", []) if command == "chat" else (None, ["hi"])
        given = [*models(tiny_pair[0], large), "--max-tokens", "2", "--fallback", "small", *args, *prompt]
        done = ead(command, *given, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stderr.decode().splitlines() if line.startswith("note:")]

    local = ["note: no model on a llama-server leaves --fallback unused"]
    assert (
        notes("generate", str(tiny_pair[1]), "--tau", "3")
        == notes("chat", str(tiny_pair[1]), "--tau", "3")
        == local
    )
    assert notes("generate", served_large, "--mode", "small") == [
        "note: --mode small leaves --fallback unused"
    ]
    assert notes("chat", served_large, "--mode", "small") == []  # /mode ead lets the served model write
    assert notes("generate", served_large) == notes("generate", served_large, "--tau", "3") == []


def test_fallback_takes_only_small(tiny_pair) -> None:
    result = ead("generate", "--small", str(tiny_pair[0]), "--fallback", "medium", "hi")
    assert_one_line_error(result, 2, "--fallback must be 'small'")


def test_a_connection_the_server_closed_while_idle_is_reopened(tiny_pair, served_large) -> None:
    """llama-server drops an idle kept-alive connection after a few seconds (a chat user thinking):
    the next request goes out again on a new connection instead of failing."""
    small = Runner(tiny_pair[0], name="small", n_ctx=512, n_threads=1)
    remote = RemoteRunner(served_large, name="large", tokenizer=small)
    try:
        tokens = small.tokenize("hello", add_special=False)
        first = remote.sync(tokens, prompt_len=len(tokens), own_tail=False).copy()
        time.sleep(7)
        again = remote.sync(tokens, prompt_len=len(tokens), own_tail=False)
        assert np.array_equal(np.isfinite(first), np.isfinite(again))
    finally:
        remote.close()
        small.close()


class _Proxy(BaseHTTPRequestHandler):
    """Passes each request on to a real llama-server (``_ask``) and its reply back (``_answer``); the
    subclasses say what happens between (``_forward``)."""

    protocol_version = "HTTP/1.1"  # kept-alive connections, as llama-server's
    upstream: ClassVar[tuple[str, int]]

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        self._forward(self.rfile.read(int(self.headers["Content-Length"])))

    def _forward(self, body: bytes | None) -> None:
        raise NotImplementedError

    def _ask(self, body: bytes | None) -> tuple[int, bytes]:
        upstream = http.client.HTTPConnection(*self.upstream, timeout=30)
        headers = {"Content-Type": "application/json"}
        if "Authorization" in self.headers:
            headers["Authorization"] = self.headers["Authorization"]
        upstream.request(self.command, self.path, body=body, headers=headers)
        reply = upstream.getresponse()
        payload = reply.read()
        upstream.close()
        return reply.status, payload

    def _answer(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


class _Closing(_Proxy):
    """Answers each request, then closes the connection (HTTP/1.0, as some proxies do)."""

    protocol_version = "HTTP/1.0"

    def _forward(self, body: bytes | None) -> None:
        self._answer(*self._ask(body))


def test_a_server_that_closes_every_connection_is_checked_again_on_each(tiny_pair, tmp_path) -> None:
    """Behind a server that closes the connection after each reply, http.client opened the next one by
    itself, so the check on each new connection never ran: a model of another tokenizer put behind the
    same address was answered with, silently."""
    small = Runner(tiny_pair[0], name="small", n_ctx=512, n_threads=1)
    tokens = small.tokenize("hello", add_special=False)
    other = write_tiny_model(tmp_path / "eog.gguf", seed=1, eot_token="<|im_start|>")
    with (
        llama_server(tiny_pair[1], tmp_path, alias="large") as (_, first),
        llama_server(other, tmp_path, alias="large") as (_, second),
    ):
        handler = type("Handler", (_Closing,), {"upstream": address(first)})
        with http_server(handler) as url:
            remote = RemoteRunner(url, name="large", tokenizer=small)
            try:
                remote.check_tokenizer("small")
                remote.sync(tokens, prompt_len=len(tokens), own_tail=False)
                handler.upstream = address(second)
                with pytest.raises(RemoteError, match=f"^{url} now serves another model .* token 265 ends"):
                    remote.sync(tokens, prompt_len=len(tokens), own_tail=False)
            finally:
                remote.close()
                small.close()


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


class _Keys(_Proxy):
    """Passes each request on with its Authorization header, noting the header and the endpoint."""

    seen: ClassVar[list[tuple[str, str | None]]]

    def _forward(self, body: bytes | None) -> None:
        self.seen.append((self.path, self.headers["Authorization"]))
        self._answer(*self._ask(body))


@pytest.mark.parametrize(("suffix", "given"), [("", "environment"), ("/v1", "option")])
def test_the_api_key_goes_with_every_request_and_is_never_said(tiny_pair, tmp_path, suffix, given) -> None:
    """The key as llama.cpp's clients send it, Authorization: Bearer KEY, on each request (the health
    check and the listing too); not in the tokens, the stats, nor --help."""
    option, env = given_key(KEY, given)
    args = ["generate", "--mode", "large", "--max-tokens", "8", "--format", "jsonl", "--stats", "hi"]
    with keyed_server(tiny_pair[1], tmp_path) as upstream:
        handler = type("Handler", (_Keys,), {"upstream": address(upstream), "seen": []})
        with http_server(handler) as url:
            result = ead(*args, *models(tiny_pair[0], f"{url}{suffix}"), *option, env=env)
    assert result.returncode == 0, result.stderr
    assert len(jsonl_tokens(result)) == 8
    assert_key_unsaid(result)
    paths = {path.split("?")[0] for path, _ in handler.seen}
    assert {"/health" if not suffix else "/v1/models", "/tokenize"} <= paths
    assert {"/completion" if not suffix else "/v1/completions"} <= paths
    assert {header for _, header in handler.seen} == {f"Bearer {KEY}"}
    helped = ead("generate", "--help", env={"EAD_REMOTE_API_KEY": KEY, "COLUMNS": "200"})
    assert b"--remote-api-key" in helped.stdout
    assert_key_unsaid(helped)


def test_serve_and_the_bench_take_the_key_and_record_none_of_it(tiny_pair, tmp_path) -> None:
    """The model options are every command's: ead serve answers through a keyed server (the key from
    the environment, out of ps), and a bench's results (its config record names the models) and output
    hold no key."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ead": {"mode": "large"}}
    with keyed_server(tiny_pair[1], tmp_path) as url:
        env = {"EAD_REMOTE_API_KEY": KEY}
        with Server(models(tiny_pair[0], url), tmp_path / "serve.log", env=env) as server:
            reply = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
            assert server.stop() == 0
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        assert KEY not in server.log() + reply.text
        out = tmp_path / "bench"
        bench = ["bench", "humaneval", "--ids", "0", "--strategies", "large", "--max-tokens", "4"]
        result = ead(*bench, *models(tiny_pair[0], url), "--remote-api-key", KEY, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert_key_unsaid(result)
    written = [path.read_bytes() for path in out.iterdir()]
    assert b'"type": "config"' in written[0] + written[-1] and not any(
        KEY.encode() in data for data in written
    )


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "--remote-api-key is empty"),
        ("s\u00e9kret", "--remote-api-key must be printable ASCII: an HTTP header carries it"),
        ("line\nbreak", "--remote-api-key must be printable ASCII: an HTTP header carries it"),
        ("s3cret ", "--remote-api-key starts or ends with a space, which clients do not send"),
    ],
)
def test_a_key_no_header_can_carry_is_a_usage_error(tiny_pair, key: str, message: str) -> None:
    """Checked as ead serve's --api-key is, before any model loads: http.client had raised a traceback
    for a key with a line break; the key itself is not echoed."""
    url = f"http://127.0.0.1:{closed_port()}"
    result = ead("generate", *models(tiny_pair[0], url), "--remote-api-key", key, "hi")
    assert assert_one_line_error(result, 2) == f"error: {message}"


def test_the_model_options_keep_the_key_out_of_their_repr() -> None:
    """A repr in a log line or a debugger's view of the options: the key is left out of it."""
    options = ModelOptions(large="http://gpu-box:8080", remote_api_key=KEY)
    assert options.remote_api_key == KEY and KEY not in repr(options)


class _Slow(_Proxy):
    """Holds the reply to the ``hold_at``-th token step until ``release`` (a server that answers
    slowly); ``held`` says it holds."""

    hold_at: ClassVar[int]
    completions: ClassVar[list[bytes]]
    held: ClassVar[threading.Event]
    release: ClassVar[threading.Event]

    def _forward(self, body: bytes | None) -> None:
        status, payload = self._ask(body)
        if body is not None and b"n_probs" in body:  # a token step, not a check's completion
            self.completions.append(payload)
            if len(self.completions) == self.hold_at:
                self.held.set()
                self.release.wait(30)
                self.close_connection = True  # the client may have left: no next request on this one
        with contextlib.suppress(OSError):  # the client may have gone meanwhile
            self._answer(status, payload)


def test_ctrl_c_while_a_slow_server_answers_lets_the_chat_ask_again(tiny_pair, served_large) -> None:
    """Ctrl-C while a reply is awaited stops that answer; the kept-alive connection it was sent on is
    dropped, so the next answer goes out on a new one (it had failed: 'unreachable (Request-sent)')."""
    parts = urlsplit(served_large)
    handler = type(
        "Handler",
        (_Slow,),
        {
            "upstream": (parts.hostname, parts.port),
            "hold_at": 3,
            "completions": [],
            "held": threading.Event(),
            "release": threading.Event(),
        },
    )
    with http_server(handler) as url:
        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
        child = pexpect.spawn(
            EAD,
            ["chat", *models(tiny_pair[0], url), "--mode", "large", "--max-tokens", "20"],
            env=env | {"TERM": "xterm", "LANG": "C.UTF-8"},
            encoding="utf-8",
            codec_errors="replace",
            timeout=30,
            preexec_fn=interruptible,
        )
        try:
            child.expect_exact(PROMPT)
            type_line(child, "hi")
            assert handler.held.wait(30)
            child.sendcontrol("c")
            child.expect_exact(PROMPT)
            assert "cut (interrupted)" in plain(child.before)
            handler.release.set()
            answer = plain(send(child, "hi again"))
            assert "error" not in answer and SUMMARY.search(answer), answer
            assert len(handler.completions) > 3
        finally:
            handler.release.set()
            child.close(force=True)


def test_ctrl_c_while_a_slow_server_answers_ends_generate_in_one_line(tiny_pair, served_large) -> None:
    """A real SIGINT while ead generate waits for a token step: the tokens written stay, then one line
    and exit 130, with no wait for the reply."""
    parts = urlsplit(served_large)
    fields = {"upstream": (parts.hostname, parts.port), "hold_at": 3, "completions": []}
    handler = type("Handler", (_Slow,), fields | {"held": threading.Event(), "release": threading.Event()})
    with http_server(handler) as url:
        args = ["--mode", "large", "--max-tokens", "20", "--format", "jsonl", "hi"]
        process = subprocess.Popen(
            [EAD, "generate", *models(tiny_pair[0], url), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=interruptible,
        )
        try:
            assert handler.held.wait(30)
            process.send_signal(signal.SIGINT)
            out, err = read_to_the_end(process)
        finally:
            handler.release.set()
    assert process.returncode == 130, err
    assert err.decode() == "error: interrupted\n"
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["index"] for line in lines if line["type"] == "token"] == [0, 1], lines


class _DropThenSlow(_Proxy):
    """The second token step is held ``hold`` seconds, then its connection closed unanswered (a proxy
    whose upstream went away), and the third, the client's retry on a new connection, answered ``delay``
    seconds late."""

    hold: ClassVar[float]
    delay: ClassVar[float]
    completions: ClassVar[list[int]]

    def _forward(self, body: bytes | None) -> None:
        if body is not None and b"n_probs" in body:  # a token step, not a check's completion
            self.completions.append(len(self.completions) + 1)
            if len(self.completions) == 2:
                time.sleep(self.hold)
                self.close_connection = True
                return
            if len(self.completions) == 3:
                time.sleep(self.delay)
        self._answer(*self._ask(body))


def test_a_retry_on_a_new_connection_has_the_whole_timeout(tiny_pair, served_large) -> None:
    """A kept-alive connection that dies unanswered is retried once on a new one; the retry had kept
    the first attempt's deadline, so a reply within the timeout of its own request was cut short."""
    parts = urlsplit(served_large)
    fields = {"upstream": (parts.hostname, parts.port), "hold": 1.5, "delay": 1.0, "completions": []}
    handler = type("Handler", (_DropThenSlow,), fields)
    small = Runner(tiny_pair[0], name="small", n_ctx=512, n_threads=1)
    with http_server(handler) as url:
        remote = RemoteRunner(url, name="large", tokenizer=small, timeout_s=2)
        try:
            tokens = small.tokenize("hello", add_special=False)
            remote.sync(tokens, prompt_len=len(tokens), own_tail=False)
            remote.sync([*tokens, tokens[0]], prompt_len=len(tokens), own_tail=False)
            assert handler.completions == [1, 2, 3]
        finally:
            remote.close()
            small.close()


class _Listing(_Proxy):
    """Passes everything on, but lists the model with a context of ``context`` tokens."""

    context: ClassVar[int]

    def _forward(self, body: bytes | None) -> None:
        status, payload = self._ask(body)
        if self.path == "/v1/models":
            listing = json.loads(payload)
            listing["data"][0]["meta"]["n_ctx"] = self.context
            payload = json.dumps(listing).encode()
        self._answer(status, payload)


@pytest.mark.parametrize(("suffix", "context"), [("", 0), ("", 1), ("/v1", 0)])
def test_a_listed_context_too_small_for_a_prompt_is_refused_at_start(
    tiny_pair, served_large, suffix: str, context: int
) -> None:
    """A server that lists a context of 0 tokens (llama-server's router says 0 where it has no model)
    had been taken, and every request then failed ('... do not fit the server's context of -1
    tokens'): it is refused when ead connects, in one line that names the listing."""
    parts = urlsplit(served_large)
    handler = type("Handler", (_Listing,), {"upstream": (parts.hostname, parts.port), "context": context})
    with http_server(handler) as url:
        result = ead("generate", *models(tiny_pair[0], f"{url}{suffix}"), "--mode", "large", "hi")
    expected = f"error: {url}/v1/models reports a context of {context} tokens: no prompt fits"
    assert assert_one_line_error(result, 1) == expected


class _Prefixed(_Proxy):
    """A reverse proxy that serves the llama-server under ``prefix``; a request elsewhere is a 404,
    recorded in ``stray``."""

    prefix: ClassVar[str] = "/proxy"
    stray: ClassVar[list[str]]

    def _forward(self, body: bytes | None) -> None:
        if not self.path.startswith(f"{self.prefix}/"):
            self.stray.append(self.path)
            self._answer(404, b'{"error": {"message": "not found"}}')
            return
        self.path = self.path.removeprefix(self.prefix)
        self._answer(*self._ask(body))


LONG_PREFIX = "/" + "p" * 10_000  # a 10,000-character address: each error had echoed it whole


@pytest.mark.parametrize("failure", ["unreachable", "HTTP error", "no answer"])
def test_a_long_server_address_is_cut_in_errors(tiny_pair, failure: str) -> None:
    with contextlib.ExitStack() as stack:
        if failure == "unreachable":
            origin = f"http://127.0.0.1:{closed_port()}"
        elif failure == "HTTP error":
            origin = stack.enter_context(wrong_server({}))
        else:
            listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
            origin = f"http://127.0.0.1:{listener.getsockname()[1]}"
        result = ead("generate", *models(tiny_pair[0], origin + LONG_PREFIX), "--remote-timeout", "1", "hi")
    line = assert_one_line_error(result, 1, origin, "characters)")
    assert len(line) < 400, line


@pytest.mark.parametrize("served", ["large", "another tokenizer"])
def test_a_long_server_address_is_cut_where_it_is_refused(
    tiny_pair, tiny_other_vocab, served_large, tmp_path, served: str
) -> None:
    """A server behind a long prefix that answers: refused by the tokenizer check, or for --verify."""
    with contextlib.ExitStack() as stack:
        if served == "large":
            upstream = served_large
        else:
            upstream = stack.enter_context(llama_server(tiny_other_vocab, tmp_path))[1]
        parts = urlsplit(upstream)
        fields = {"upstream": (parts.hostname, parts.port), "prefix": LONG_PREFIX, "stray": []}
        url = stack.enter_context(http_server(type("Handler", (_Prefixed,), fields)))
        result = ead("generate", *models(tiny_pair[0], url + LONG_PREFIX), "--verify", "0.1", "hi")
    fragment = "llama-server does not return" if served == "large" else "do not share a tokenizer"
    line = assert_one_line_error(result, 2 if served == "large" else 1, url, fragment, "characters)")
    assert len(line) < 400, line


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_a_server_behind_a_path_prefix_is_asked_there(tiny_pair, served_large, suffix: str) -> None:
    """Behind a reverse proxy at http://HOST/proxy every request goes under /proxy: llama-server's own
    endpoints (/tokenize) had been asked at the root for an address with /v1, and an address with
    another path was refused."""
    parts = urlsplit(served_large)
    handler = type("Handler", (_Prefixed,), {"upstream": (parts.hostname, parts.port), "stray": []})
    args = ["generate", "--mode", "large", "--max-tokens", "10", "--format", "jsonl", "hi there"]
    local = ead(*args, *models(tiny_pair[0], str(tiny_pair[1])))
    with http_server(handler) as url:
        remote = ead(*args, *models(tiny_pair[0], f"{url}/proxy{suffix}"))
    assert remote.returncode == 0, remote.stderr
    assert [t["token"] for t in jsonl_tokens(remote)] == [t["token"] for t in jsonl_tokens(local)]
    assert handler.stray == []


# ------------------------------------------------------------------------ OpenAI-compatible endpoint


def test_the_openai_compatible_endpoint_gives_the_same_greedy_text(tiny_pair, served_large) -> None:
    """llama-server's own /v1/completions stands in for any OpenAI-compatible server (vLLM and others)."""
    args = ["generate", "--mode", "large", "--max-tokens", "30", "--format", "jsonl", "hi there"]
    local = ead(*args, *models(tiny_pair[0], str(tiny_pair[1])))
    remote = ead(*args, *models(tiny_pair[0], f"{served_large}/v1"))
    assert remote.returncode == 0, remote.stderr
    assert [t["token"] for t in jsonl_tokens(remote)] == [t["token"] for t in jsonl_tokens(local)]
    middle = ead(
        "generate", *models(tiny_pair[0], f"{served_large}/v1"), "--tau", "4", "--format", "jsonl", "hi"
    )
    assert middle.returncode == 0, middle.stderr


def test_openai_legacy_log_probabilities_map_back_to_ids(tiny_pair, served_large) -> None:
    """OpenAI's legacy shape keys the top log-probabilities by token text; vLLM sends ``token_id:N``
    when asked. Text that is exactly one local token maps to it; anything else stays in the tail."""
    small = Runner(tiny_pair[0], name="small", n_ctx=512, n_threads=1)
    runner = OpenAIRunner(f"{served_large}/v1", name="large", tokenizer=small)
    try:
        [a_token] = small.tokenize("a", add_special=False)
        legacy = {"top_logprobs": [{"token_id:7": -2.0, "a": -0.5, "not one token at all": -1.0}]}
        ids, logprobs = runner._parse_logprobs(legacy)
        assert ids.tolist() == [a_token, 7] and logprobs.tolist() == [-0.5, -2.0]
    finally:
        runner.close()
        small.close()
