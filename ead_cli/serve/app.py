"""The routes of ``ead serve`` and the answers in OpenAI's shapes (whole, or chunk by chunk as
server-sent events), each token with the ``ead`` fields that say which model wrote it."""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import difflib
import functools
import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from http import HTTPStatus
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar, overload

import h11
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from sse_starlette import EventSourceResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..calibrate import PairTaus, with_saved_tau
from ..decoder import Summary, TokenEvent
from ..embedding import Embedder, InputTooLong, normalized
from ..engine import block_tags, build_decoder, reasoning_budget_for
from ..errors import EadError, counted, cut, quoted
from ..options import GenerationOptions, PolicyOptions, answer_limit
from ..prompt import (
    check_fits,
    check_infill,
    check_prompt_text,
    check_special_tokens_fit,
    check_text,
    encode_fitting,
    encode_infill,
    render_chat,
    special_token_pattern,
)
from ..remote import RemoteRunner, any_remote
from ..sampling import GrammarRefusal, SamplingParams
from ..thinking import CLOSE, ReasoningSplitter, answer_start, split_reasoning, template_variables
from .engine import (
    Engine,
    Failed,
    Finished,
    Job,
    Log,
    Logprobs,
    Message,
    PromptProgress,
    PromptScores,
    QueueFull,
    Ticket,
    Token,
    scoring_runner,
)
from .metrics import CONTENT_TYPE, cached_tokens
from .schemas import (
    CHAIN_ONLY_FIELDS,
    LLAMA_SAMPLERS,
    MAX_ANSWERS,
    MAX_CHOICES,
    PENALTIES,
    Api,
    ApiError,
    ChatRequest,
    CompletionBase,
    CompletionRequest,
    EadOptions,
    EmbeddingRequest,
    loggable,
    parse,
    unsupported,
)
from .tokens import detokenize, known_tokens, text_of, tokenize, tokenizer_info
from .tools import (
    ArgumentsDelta,
    CallStart,
    Piece,
    ToolCall,
    ToolCallReader,
    call_grammar,
    call_trigger,
    new_call_id,
    opens_call,
    split_answer,
    template_message,
    template_takes_tools,
)

if TYPE_CHECKING:
    import numpy as np

    from ..runner import Runner
    from . import ServeOptions

Body = TypeVar("Body", bound=CompletionBase)
# llama-server's /infill's parts besides the prompt and suffix: extra files (name, text), and the text
# that follows the prefix
Infill = tuple[Sequence[tuple[str, str]], str]
Prepared = TypeVar("Prepared")
Event = TypeVar("Event")  # a stream's event, as its route writes it
Whole = TypeVar("Whole")  # a choice's whole answer, as its route writes it

MODEL_ID = (
    "ead"  # the one model this server serves (and with --any-model, answers whatever name a request gives)
)
MAX_BODY_BYTES = 4 * 2**20  # a request body past this is refused (413)
MAX_HEAD_BYTES = 16 * 2**10  # a request line and headers past this (the blank line after them counted): 431
# Set in a request's scope by the protocol that answered it itself (a broken body): its app is cut off.
REFUSED_BY_PROTOCOL = "ead.refused_by_protocol"
# Set in a request's scope by a route whose stream ends a failure mid-answer in its own way (the Responses
# API's response.failed): a function of the error to the stream's last bytes, which a stop's cut sends too.
STREAM_END = "ead.stream_end"
OLLAMA_PATHS = "/api/"  # ollama's API (serve/ollama.py): its errors are ollama's {"error": "..."}
ANTHROPIC_PATH = "/v1/messages"  # Anthropic's Messages API (serve/anthropic.py), and the paths under it
FORM = "application/x-www-form-urlencoded"  # what curl -d sends without -H
# Both framings of a body in one request: a request-smuggling shape (RFC 9112 §6.1), a 400.
FRAMED_TWICE = "Transfer-Encoding and Content-Length together"
PAGE_ORIGIN = re.compile(r"https?://[^/\s]+")  # what --cors-origin names (or *): a web page's origin
SSE = "text/event-stream"  # a streamed answer's content type
NDJSON = "application/x-ndjson"  # ollama's: a JSON object a line
SEND_TIMEOUT_S = 30.0  # a client that reads nothing for this long loses its answer (streamed or not)
POLL_S = 0.25  # how often a non-streamed request looks whether its client is still there
ROUTES_LISTED = "ead-cli's docs/serve.md#endpoints"  # where a 404 says every route served is listed
# Routes llama-server 0.3.36 serves under a second path too, and so ead serve: its OpenAI routes without
# /v1 (an OpenAI client whose base URL is http://host:8080 works with it) and /health with it. Each the
# same route, its handler, methods and key check, logged under the path asked.
LLAMA_SERVER_ALIASES = {
    "/v1/chat/completions": "/chat/completions",
    "/v1/completions": "/completions",
    "/v1/responses": "/responses",
    "/v1/models": "/models",
    "/v1/models/{name:path}": "/models/{name:path}",  # openai's models.retrieve, from that base URL
    "/health": "/v1/health",
}


@dataclass(frozen=True)
class Defaults:
    """What a request gets for what it leaves out: the command line's options (before a saved τ), and the
    pair's saved τs as the server read them at its start (``calibrate.saved_taus``: None where no request
    can take one)."""

    policy: PolicyOptions
    generation: GenerationOptions
    taus: PairTaus | None


@dataclass(frozen=True)
class Requests:
    """The steps of a request that other APIs' routes (serve/ollama.py, serve/native.py) share with
    OpenAI's, so they check, prepare and answer it alike: the key, the body's media type, parsing,
    rendering, tokenizing (on the preparing threads) and the engine's queue."""

    authorized: Callable[[Request], Awaitable[None]]
    json_body: Callable[[Request], Awaitable[bytes]]  # sent as JSON, or by a bare curl -d (no web page)
    chat: Callable[[bytes], Awaitable[tuple[ChatRequest, Job]]]  # an OpenAI chat request's body
    template: Callable[[bytes], Awaitable[str]]  # a chat request's body: its prompt, rendered
    text: Callable[[bytes], Awaitable[tuple[CompletionRequest, list[Job]]]]  # a text completion's (a batch)
    # a text completion's, filled in the middle with llama-server's /infill parts
    infill: Callable[[bytes, Infill], Awaitable[tuple[CompletionRequest, list[Job]]]]
    submit: Callable[[Job], Ticket]
    served_model: Callable[[], dict[str, Any]]  # the one model, as /v1/models lists it
    log: Log
    prepared: Callable[[Callable[[bytes], Any], bytes], Awaitable[Any]]  # a step on a preparing thread
    embedder: Callable[[], Embedder]  # the server's, or a 501 (ead serve without --embeddings)
    # the inputs' vectors, on the embedding thread (a 503 past its queue), the request's log line said
    embedded: Callable[[str, list[list[int]]], Awaitable[list[np.ndarray]]]
    keep_alive: Callable[[], KeepAlive]  # a stream's, at the server's --ping-interval


class KeepAlive:
    """When a stream is due an event that tells its client it is alive: on a timer, after ``interval``
    seconds (``ead serve --ping-interval``) with no event sent and again every interval, whatever the
    engine is doing (the request queued behind another, its prompt read, one slow token, its answer's text
    held back by the tool-call reader or a thinking splitter): ``answer_messages`` waits for the engine's
    next message no longer than ``wait``. Codex gives up on a stream after its idle timeout with no event,
    and so do byte watchdogs such as Claude Code's. At interval 0 there is no timer: a keep-alive event
    goes out for each engine message that sends nothing (a prompt batch read, a token held back)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = time.monotonic()  # when the last event was sent: the stream's start, at first

    def wait(self) -> float | None:
        """Seconds until a keep-alive event is due; None at interval 0 (wait for the engine's message)."""
        return max(0.0, self._last + self.interval - time.monotonic()) if self.interval else None

    def kept(self, events: list[Event], keep_alive: Callable[[], Event]) -> list[Event]:
        """``events``, to be sent now for an engine's message (a token's, a prompt batch's; none where the
        timer ran out before a message came); where there are none and the last was sent ``interval``
        seconds ago or more, the route's ``keep_alive`` event."""
        now = time.monotonic()
        if not events and now - self._last < self.interval:
            return []
        self._last = now
        return events or [keep_alive()]


class Guard:
    """The app's outermost layer. A loopback server answers only requests that name it in ``Host`` (a
    DNS-rebinding page names its own domain) and, from a web page, only those whose ``Origin`` is the
    server itself or a ``--cors-origin``; a target in absolute-form is served as its path; a body over
    ``limit`` bytes is refused (413) before it is read whole, chunked or not, and one that stops coming
    for the read timeout (408); an answer to a client still waiting for its 100 Continue closes the
    connection; whatever fails unforeseen is OpenAI's error object (500) and one log line. (What h11
    reads, the head's size included, the protocol checks: ``http_protocol``.)"""

    def __init__(
        self, app: Any, options: ServeOptions, limit: int, log: Log, stopping: Callable[[], bool]
    ) -> None:
        self.app, self.options, self.limit, self.log = app, options, limit, log
        self.stopping = stopping  # whether a stop has begun: a cancelled request was cut off by it

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        where = _request_line(scope["method"], scope["path"])
        refusal = _in_origin_form(scope)
        headers = Headers(scope=scope)
        # A client that waits for a 100 Continue (uvicorn sends it when the body is first asked for) may
        # send no body after an answer without one: its next request would be read as that body.
        continuing = headers.get("expect", "").lower() == "100-continue"
        seen, whole, asked = 0, False, False
        started, streaming = False, False

        async def watched(message: dict) -> None:
            nonlocal started, streaming
            if message["type"] == "http.response.start":
                started = True
                content_type = Headers(raw=message["headers"]).get("content-type", "")
                streaming = content_type.startswith((SSE, NDJSON))
                if continuing and not asked:
                    message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
            await send(message)

        refusal = refusal or self._refusal(headers)
        if refusal is not None:
            self.log(f"error: {where} {refusal.status}: {refusal.message}")  # Origin, Host, size
            return await error_answer(refusal, scope["path"])(scope, receive, watched)

        async def counted() -> dict:
            """The body's next part, each within the read timeout (a client that stopped sending it had held
            its connection forever), counted against the limit; then whatever comes (a disconnect)."""
            nonlocal seen, whole, asked
            asked = True
            if whole:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.options.read_timeout)
            except asyncio.TimeoutError:
                raise self._body_late() from None
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise self._too_large()
            whole = not message.get("more_body", False)
            return message

        try:
            return await self.app(scope, counted, watched)
        except asyncio.CancelledError:  # a stream's client left, or a forced stop (its timeout, a second
            if not self.stopping():  # Ctrl-C) cancels what is open
                return None
            cut = ApiError(503, "the server is stopping: this request was cut off", kind="server_error")
            self.log(f"error: {where} {cut.status}: {cut.message}")
            if not started:
                await error_answer(cut, scope["path"])(scope, receive, send)
            elif streaming:  # ended as a failure mid-answer ends it: the route's own end (STREAM_END),
                end = scope.get(STREAM_END)  # else an error event (ollama's: a line)
                event = end(cut) if end is not None else _stream_end(cut, scope["path"])
                await send({"type": "http.response.body", "body": event, "more_body": False})
            return None
        except ClientDisconnect:  # it left while sending its body (or the protocol refused the body, and
            if not scope.get(REFUSED_BY_PROTOCOL):  # said so): nobody to answer
                self.log(f"error: {where}: the client went away while sending its body")
        except Exception as error:  # after the app's own handler answered it (below): one line here
            self.log(f"error: {where} 500: {type(error).__name__}: {' '.join(str(error).split())}")
            if not started:
                await error_answer(_internal_error(), scope["path"])(scope, receive, send)
        return None

    def _body_late(self) -> ApiError:
        late = f"none of it came for {self.options.read_timeout:g} s (--read-timeout)"
        # the rest of the body would be read as the next request: its connection is closed
        headers = {"Connection": "close"}
        return ApiError(408, f"the request body stopped: {late}", code="request_timeout", headers=headers)

    def _too_large(self) -> ApiError:
        return _body_too_large(self.limit)

    def _refusal(self, headers: Headers) -> ApiError | None:
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            return self._too_large()
        host = headers.get("host")
        # No Host at all is HTTP/1.0 (a health check by nc or a proxy): no browser, so no page rebound to
        # this address, sends none; an empty or foreign one is refused.
        if self.options.loopback and host is not None and not _names_loopback(host):
            message = (
                f"Host {quoted(host)} is not a loopback name: this server answers localhost and 127.0.0.1"
            )
            return ApiError(403, message, code="invalid_host")
        origin = headers.get("origin")
        allowed = self.options.cors_origins
        # its own page, over http or behind a TLS proxy (the page then at https://HOST, as the Host says)
        own = origin in (f"http://{host}", f"https://{host}")
        if origin is None or own or origin in allowed or "*" in allowed:
            return None
        shown = quoted(origin)
        # a file's page or a sandboxed frame (Origin: null), an extension's: no --cors-origin names them
        advice = (
            f"--cors-origin {shown} to allow them"
            if PAGE_ORIGIN.fullmatch(origin)
            else "--cors-origin '*' to allow them (and every page: only http and https origins can be named)"
        )
        return ApiError(
            403,
            f"pages at {shown} may not use this server: start it with {advice}",
            code="origin_not_allowed",
        )


class _CheckedConnection(h11.Connection):
    """h11's server side, refusing besides what h11 refuses (as h11 does, a ``RemoteProtocolError`` whose
    ``error_status_hint`` is the status): a request line and headers over ``MAX_HEAD_BYTES``, counted
    exactly as they came (the blank line that ends them included), in one read or many; an HTTP version
    whose major is not 1 (h11 reads any digit: HTTP/2.0 had been answered as 1.1), a 505; a request with
    both Transfer-Encoding and Content-Length (a request-smuggling shape, RFC 9112 §6.1); and a chunk
    whose size line alone passes ``body_limit``, when that line comes (its bytes had been awaited)."""

    def __init__(self, body_limit: int) -> None:
        # an unended head of MAX_HEAD_BYTES is over it once whole: h11 refuses a buffer past its bound
        super().__init__(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES - 1)
        self.body_limit = body_limit
        self.request_head = b""

    def next_event(self) -> Any:
        unread = self.trailing_data[0] if self.their_state is h11.IDLE else b""
        if self.their_state is h11.IDLE:
            self.request_head = unread  # what has come of the request read now: its path, for a refusal
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as refused:
            if refused.error_status_hint == 501:  # h11's one word for every Transfer-Encoding but chunked
                raise _transfer_coding_refusal(unread) from None
            raise
        if isinstance(event, h11.Request):
            if len(unread) - len(self.trailing_data[0]) > MAX_HEAD_BYTES:
                raise h11.RemoteProtocolError("head too large", error_status_hint=431)
            if not event.http_version.startswith(b"1."):
                version = event.http_version.decode()
                message = f"HTTP/{version} is not served: this server speaks HTTP/1.1 (and 1.0)"
                raise h11.RemoteProtocolError(message, error_status_hint=505)
            names = {name for name, _ in event.headers}  # lower case: h11's
            if {b"transfer-encoding", b"content-length"} <= names:
                raise h11.RemoteProtocolError(FRAMED_TWICE)
        elif self.their_state is h11.SEND_BODY:
            # the bytes of the chunk under way that h11 has yet to hand on (its reader's count: h11 says
            # nothing of a chunk's size), with those of its first part, handed on now
            chunk = getattr(self._reader, "_bytes_in_chunk", 0)
            if isinstance(event, h11.Data) and event.chunk_start:
                chunk += len(event.data)
            if chunk > self.body_limit:
                raise h11.RemoteProtocolError("chunk too large", error_status_hint=413)
        return event


def _transfer_coding_refusal(unread: bytes) -> h11.RemoteProtocolError:
    """What a request whose Transfer-Encoding h11 refused (any but chunked alone, with a 501 that names
    none) is, from its head among the ``unread`` bytes: with Content-Length too, the 400 of the two
    together; a list of codings that does not end in chunked, or names it twice, a body whose end cannot
    be known (RFC 9112 §6.3: a 400); else codings this server does not implement (§6.1: a 501)."""
    head = re.split(rb"\r?\n\r?\n", unread, maxsplit=1)[0]
    lines = re.split(rb"\r?\n", re.sub(rb"\r?\n[ \t]+", b" ", head))[1:]  # unfolded, as h11 reads them
    fields = []  # each header's name (lower case) and value
    for line in lines:
        name, _, value = line.partition(b":")
        fields.append((name.lower(), value.strip().decode("latin-1")))
    if b"content-length" in {name for name, _ in fields}:
        return h11.RemoteProtocolError(FRAMED_TWICE)
    given = ", ".join(value for name, value in fields if name == b"transfer-encoding")
    codings = [coding.strip() for coding in given.split(",") if coding.strip()]
    named = [coding.lower() for coding in codings]
    if named[-1:] != ["chunked"]:
        reason = f"Transfer-Encoding {quoted(given)} does not end in chunked: where the body ends is unknown"
        return h11.RemoteProtocolError(reason)
    if named.count("chunked") > 1:
        return h11.RemoteProtocolError(f"Transfer-Encoding {quoted(given)} names chunked twice")
    unknown = ", ".join(coding for coding in codings if coding.lower() != "chunked")
    advice = "send the body chunked alone, or with a Content-Length"
    message = f"Transfer-Encoding {quoted(unknown)} is not implemented: {advice}"
    return h11.RemoteProtocolError(message, error_status_hint=501)


class _TimedFlow(FlowControl):
    """uvicorn's flow control, whose wait for room to write ends after ``SEND_TIMEOUT_S`` in ``stalled``:
    uvicorn waits forever, and a client that read nothing (an answer pipelined behind a large one it had
    not read) held its connection, and a stop for its --shutdown-timeout."""

    def __init__(self, transport: asyncio.Transport, stalled: Callable[[], None]) -> None:
        super().__init__(transport)
        self.stalled = stalled

    async def drain(self) -> None:
        try:
            await asyncio.wait_for(super().drain(), SEND_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.stalled()


class _LingeringTransport:
    """A connection's transport whose first close is the staged one RFC 9112 §9.6 asks of a server: what
    is written goes out, then its side is shut (a FIN), and what the client still sends is read and
    dropped (``_Drain``) until the client shuts its own side or ``linger`` seconds pass. Closed at once
    with the client's bytes unread, the connection is reset (RST): a client still sending its request (a
    431's head, a chunk a 413 refused by its size) had its send fail before it read the answer, and one
    whose last bytes raced a 408 got the reset after it. A second close (the server stopping) is at once,
    as is any close once ``lingers`` is off, where all that was written has gone; else the drain closes
    it when it has, or resets it if the client stops taking it."""

    def __init__(self, transport: asyncio.Transport, linger: float) -> None:
        self._transport, self._linger = transport, linger
        self._drain: _Drain | None = None
        self.lingers = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._drain is not None or self._transport.is_closing()

    def close(self) -> None:
        if self._drain is None and not self._transport.is_closing():
            self._drain = _Drain(self._transport, self._linger)
            if self.lingers:
                return
        if not self._transport.get_write_buffer_size():
            self._transport.close()


class _Drain(asyncio.Protocol):
    """A closing connection's protocol: the client's bytes dropped, and a look every ``linger`` seconds:
    the connection closed once what was written has gone (the client has had a look's time to shut its
    side; asyncio closes it at the client's EOF), reset once the client has taken none of it since the
    last look (a close waits for what is unwritten: a client that read nothing had held its connection
    forever, and a stop for its --shutdown-timeout); its loss told to the protocol that served it
    (uvicorn counts its connections by it)."""

    def __init__(self, transport: asyncio.Transport, linger: float) -> None:
        self.served = transport.get_protocol()
        self.transport, self.linger = transport, linger
        self.unsent = transport.get_write_buffer_size()
        self.timer = asyncio.get_running_loop().call_later(linger, self._look)
        transport.set_protocol(self)
        try:
            transport.write_eof()  # once what is written has gone
        except OSError:  # the client reset it, which the loop has yet to read: nobody to linger for
            transport.abort()
            return
        transport.resume_reading()

    def _look(self) -> None:
        unsent = self.transport.get_write_buffer_size()
        if not unsent:
            self.transport.close()
        elif unsent == self.unsent:  # a reset (no linger): the kernel's unsent bytes are dropped too
            reset = struct.pack("ii", 1, 0)
            self.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
            self.transport.abort()
        else:
            self.unsent = unsent
            self.timer = asyncio.get_running_loop().call_later(self.linger, self._look)

    def data_received(self, data: bytes) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.served.connection_lost(exc)


def http_protocol(log: Log, read_timeout: float, body_limit: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol, except that a request it cannot parse (a Content-Length of "abc", a bad
    request line or header) is answered as every other 400 is, with OpenAI's error object and one log
    line, not uvicorn's plain text (which an OpenAI client cannot read), a head past ``MAX_HEAD_BYTES``
    with a 431 that says so and a chunk past ``body_limit`` with the 413 (``_CheckedConnection``); a
    request line and headers not whole within ``read_timeout`` seconds (of the
    connection, of their first byte after an answer, or of the answer a pipelined one began before) are
    a 408, and a connection that sent nothing by then is closed (uvicorn times out only the wait between
    requests: a client that sent a byte a minute held its connection forever); an Upgrade is ignored; a
    close lingers (``_LingeringTransport``)."""

    class Protocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None  # while a request's head is awaited

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _CheckedConnection(body_limit)

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            lingering = _LingeringTransport(transport, read_timeout)  # type: ignore[arg-type]
            super().connection_made(lingering)  # type: ignore[arg-type]
            self.flow = _TimedFlow(lingering, self._drop_stalled)  # type: ignore[arg-type]
            self._await_head()

        def _drop_stalled(self) -> None:
            """A send that found no room for ``SEND_TIMEOUT_S``: its client reads nothing. It is taken as
            gone (its app's sends dropped, a stream's generation stopped), with one line, and the
            connection closed."""
            cycle = self.cycle
            assert cycle is not None  # a send waits within its request's cycle
            where = _request_line(cycle.scope["method"], cycle.scope["path"])
            log(f"error: {where}: the client read nothing for {SEND_TIMEOUT_S:g} s: its answer dropped")
            cycle.disconnected = True
            cycle.message_event.set()  # a receive that waits learns it
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def shutdown(self) -> None:
            """The server stopping closes a connection between requests at once: its client, who does not
            know to close its side, had held the stop for the read timeout with the close lingering."""
            if self.cycle is None or self.cycle.response_complete:
                self.transport.lingers = False  # type: ignore[attr-defined]
            super().shutdown()

        def on_response_complete(self) -> None:
            """A pipelined request's head begun before this answer is timed from it, as one begun after:
            uvicorn's keep-alive timer had closed its connection without a word. The rest of a body the
            answer did not read (a 404, a 413 by its Content-Length), which uvicorn reads and drops, must
            come within the read timeout, or the connection is closed: the app that timed the body has
            answered, and a client that sent it a byte at a time had held the connection forever."""
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
                self._unset_keepalive_if_required()
                self._await_head()
            elif self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                answered = self.cycle
                self.loop.call_later(read_timeout, lambda: self._close_if_unread(answered))

        def _close_if_unread(self, answered: object) -> None:
            if self.cycle is answered and self.conn.their_state is h11.SEND_BODY:
                self.transport.close()

        def _await_head(self) -> None:
            """The head timer running while h11 awaits a request (its line and headers not whole), from the
            first call that finds it so; stopped once the request is read."""
            if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
                self._stop_head_timer()
            elif self.head_timer is None:
                self.head_timer = self.loop.call_later(read_timeout, self._head_late)

        def _stop_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_late(self) -> None:
            self.head_timer = None
            if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
                return
            if not self.conn.trailing_data[0]:  # nothing of a request: closed as a kept-alive one is
                self.transport.close()
                return
            late = f"did not all come within {read_timeout:g} s (--read-timeout)"
            self._refuse(ApiError(408, f"the request line and headers {late}", code="request_timeout"))

        def send_400_response(self, msg: str) -> None:
            failure = sys.exc_info()[1]  # uvicorn calls this from its handler of h11's complaint
            status = getattr(failure, "error_status_hint", 400)
            if status == 431:
                error = _head_too_large()
            elif status == 413:
                error = _body_too_large(body_limit)
            elif status in (501, 505):  # _CheckedConnection's words, whole
                code = "unsupported_transfer_encoding" if status == 501 else "http_version_not_supported"
                error = ApiError(status, str(failure), code=code)
            else:
                reason = "" if failure is None else f": {cut(str(failure))}"  # h11 quotes what it refuses
                error = ApiError(400, f"the request is not valid HTTP{reason}", code="invalid_http")
            if self.cycle is not None:  # its app answers nobody now (h11 would refuse the answer: a 500)
                self.cycle.disconnected = True
                self.scope[REFUSED_BY_PROTOCOL] = True  # the Guard's "went away" would be untrue
            if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):  # a body refused unread, then
                log(f"error: {error.message}: the connection is closed")  # broken: its answer went out
                self.transport.close()
            else:
                self._refuse(error)

        def _refuse(self, error: ApiError) -> None:
            """``error`` answered (in the words of the API the request's path names) and logged, the
            connection closed: what h11 read is no request the app could answer."""
            log(f"error: {error.status}: {error.message}")
            answer = error_answer(error, _requested_path(self.conn.request_head))
            headers = [*answer.raw_headers, (b"connection", b"close")]
            reason = HTTPStatus(error.status).phrase.encode()
            response = h11.Response(status_code=error.status, headers=headers, reason=reason)
            for event in (response, h11.Data(data=answer.body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def _unsupported_upgrade_warning(self) -> None:
            """An Upgrade this server does not take (a WebSocket, h2c) is answered as plain HTTP, as HTTP
            lets a server do, and logs nothing: uvicorn's two lines told the operator to install a
            WebSocket library the server never uses."""

    return Protocol


def api_of(path: str) -> Api:
    """Whose API ``path`` belongs to: ollama's ``/api/*``, Anthropic's ``/v1/messages`` and the paths under
    it, else OpenAI's (llama-server's routes answer as its OpenAI ones do)."""
    if path.startswith(OLLAMA_PATHS):
        return "ollama"
    if path == ANTHROPIC_PATH or path.startswith(f"{ANTHROPIC_PATH}/"):
        return "anthropic"
    return "openai"


def error_answer(error: ApiError, path: str) -> JSONResponse:
    """``error`` as the API ``path`` belongs to words it, whoever refused the request (a route, the Guard,
    the protocol): ollama's ``{"error": "..."}`` on its ``/api/*`` (its clients read a text there, and
    had read OpenAI's object as none), Anthropic's on its Messages API, OpenAI's error object elsewhere."""
    return error.response(api_of(path))


def _stream_end(error: ApiError, path: str) -> bytes:
    """The last of a stream that ``error`` cuts: ollama's error line on its API, Anthropic's error event
    on its, else OpenAI's error event."""
    api = api_of(path)
    if api == "ollama":
        return error.ndjson_line().encode()
    return error.anthropic_event() if api == "anthropic" else error.sse_event()


def _requested_path(head: bytes) -> str:
    """The path a request's head names (in absolute-form too), for a refusal the protocol gives before
    any app sees the request; "" where its first line names none."""
    parts = head.split(b"\n", 1)[0].split(b" ")
    target = parts[1].decode("latin-1") if len(parts) > 1 else ""
    if target.startswith("/"):
        return target
    try:
        return urllib.parse.urlsplit(target).path
    except ValueError:  # a bracket left open in its authority
        return ""


def _head_too_large() -> ApiError:
    """The 431 of a request line and headers past ``MAX_HEAD_BYTES``, however they came (unended in h11's
    buffer, or counted whole by ``_CheckedConnection``)."""
    message = f"the request line and headers are over {MAX_HEAD_BYTES // 1024} KiB"
    return ApiError(431, message, code="headers_too_large")


def _body_too_large(limit: int) -> ApiError:
    """The 413 of a body past ``limit``: declared, counted as it comes (the Guard), or one chunk's size
    (the protocol)."""
    return ApiError(413, f"the request body is over {limit} bytes", code="body_too_large")


def _in_origin_form(scope: dict) -> ApiError | None:
    """A request target in absolute-form (``GET http://host/v1/models``: what a client sends a proxy, which
    a server must take, RFC 9112 §3.2.2) made the path it names, its authority the ``Host`` (the RFC has
    the received one ignored), in ``scope``; a target that is no path, no http URL and no ``*`` (OPTIONS's
    alone: the app answers it) is a 400 (it had been a 404 naming "/" and the target)."""
    target = scope["raw_path"]
    if target.startswith(b"/") or (target == b"*" and scope["method"] == "OPTIONS"):
        return None
    try:
        url = urllib.parse.urlsplit(target.decode("ascii"))
    except ValueError:  # a bracket left open in its authority
        url = None
    if url is None or url.scheme.lower() not in ("http", "https") or not url.netloc or "@" in url.netloc:
        message = (
            f"the request target {quoted(scope['path'])} is not a path (/v1/...), an http URL, "
            "nor * (of OPTIONS alone)"
        )
        return ApiError(400, message, code="invalid_http")
    path = url.path or ("*" if scope["method"] == "OPTIONS" else "/")  # RFC 9112 §3.2.4
    host = [(b"host", url.netloc.encode())]
    scope.update(
        path=urllib.parse.unquote(path),
        raw_path=path.encode(),
        headers=[(name, value) for name, value in scope["headers"] if name != b"host"] + host,
    )
    return None


def _request_line(method: str, path: str) -> str:
    """A request's method and path as its log lines name it: a client's text, escaped, and cut past a
    readable length (a 10 kB path had been written whole into each line)."""
    return f"{cut(loggable(method))} {cut(loggable(path))}"


def add_llama_server_aliases(app: FastAPI) -> None:
    """Each route of ``LLAMA_SERVER_ALIASES`` served under its second path as well: once every API's
    routes are added (serve/responses.py's among them)."""
    routes = {route.path: route for route in app.routes if isinstance(route, APIRoute)}
    for path, alias in LLAMA_SERVER_ALIASES.items():
        route = routes[path]
        app.add_api_route(
            alias,
            route.endpoint,
            methods=sorted(route.methods),
            dependencies=route.dependencies,
            response_class=route.response_class,
        )


def _not_served(app: FastAPI, method: str, path: str) -> str:
    """What a 404 says besides the request line: the route served whose method and path are nearest by
    name to those asked (a base URL without /v1, a slip of a letter), if one is near, and where every route
    is listed (the 404 had listed them all, some 420 characters, growing with every route added)."""
    served = [
        f"{served_method} {route.path_format}"
        for route in app.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for served_method in sorted(route.methods - {"HEAD"})  # every GET's
    ]
    nearest = difflib.get_close_matches(f"{method} {path}", served, n=1)
    listed = f"every route is in {ROUTES_LISTED}"
    return f"the nearest route served is {nearest[0]}; {listed}" if nearest else listed


def _methods(app: FastAPI) -> str:
    """Every method the server answers (OPTIONS, ``OPTIONS *``'s, too), as an ``Allow`` names them."""
    methods = {"OPTIONS"}.union(*(route.methods for route in app.routes if isinstance(route, APIRoute)))
    return ", ".join(sorted(methods))


def _names_loopback(host: str) -> bool:
    """Whether ``Host`` names this machine; one that is no URL authority at all ("[::1") names nothing."""
    try:
        name = urllib.parse.urlsplit(f"//{host}").hostname or ""
    except ValueError:  # a bracket left open, or around what is no IPv6 address
        return False
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@functools.cache
def _page() -> tuple[str, dict[str, str]]:
    """The page and its headers. Its own inline script and style alone run (named by their hashes), and it
    calls this server alone: markup that ever reached it as markup (an answer's HTML) runs nothing. In no
    other site's frame: a hidden frame of /?q=PROMPT asks from the server's own origin, which the Origin
    check lets through (any site the user opened had made the server generate). Never sniffed as another
    type, and its URL (a /?q=PROMPT) sent to no other site as a referrer."""
    text = resources.files("ead_cli").joinpath("static/index.html").read_text("utf-8")

    def inline(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'" for body in bodies
        )

    policy = (
        f"default-src 'none'; script-src {inline('script')}; style-src {inline('style')}; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Frame-Options": "SAMEORIGIN",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    return text, headers


def _internal_error() -> ApiError:
    return ApiError(500, "the server failed on this request (its log says why)", kind="server_error")


def create_app(engine: Engine, defaults: Defaults, options: ServeOptions, log: Log) -> FastAPI:
    """The ASGI app over a started engine."""
    # No redirect from a path with a trailing slash: a bare 307, no error object, no log line (and a
    # client that follows it with a GET gets a 405); llama-server answers such a path with a 404 too.
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    if options.cors_origins:
        # Every preflight of a page allowed (the Guard refuses the others) is answered: any header (the
        # openai npm client sends its X-Stainless-* ones), any method (the request itself then gets its
        # 405 as an error object, not a plain-text 400 to the preflight), and Chrome's Private Network
        # Access (a page on a public site reaching this loopback server is what --cors-origin allows).
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.cors_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            allow_private_network=True,
        )
    roles = {runner.name: runner.label for runner in engine.runners}
    # Parsing, rendering and tokenizing a request (a 4 MiB body takes a while) run on the engine's
    # preparing threads, not on the event loop: a fixed pool, so the server's threads stay as many under
    # any load, which the engine waits for before the models it reads are freed.
    preparing = engine.preparing
    specials = special_token_pattern(engine.runners[0])  # the prompts are tokenized by the smallest model

    async def prepared(prepare: Callable[[bytes], Prepared], data: bytes) -> Prepared:
        return await asyncio.get_running_loop().run_in_executor(preparing, prepare, data)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        log(f"error: {_request_line(request.method, request.url.path)} {error.status}: {error.message}")
        return error_answer(error, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        """Routing's refusals as OpenAI words them, "Invalid URL (POST /v1/x)", with what is served: the
        path not served (404) and the method a path does not take (405, its Allow kept) had been
        Starlette's bare "Not Found" and "Method Not Allowed", which named neither."""
        if error.status_code == 404 and request.scope["path"] == "*":  # OPTIONS *, the Guard's one asterisk:
            # the server as a whole (RFC 9110 §9.3.7), no route: the methods it serves, with CORS headers
            # where --cors-origin gives them (this handler is inside the CORS middleware)
            return Response(status_code=204, headers={"Allow": _methods(app)})
        asked = _request_line(request.method, request.url.path)
        headers = dict(error.headers) if error.headers else None  # a 405's Allow
        if error.status_code == 404:
            message = f"Invalid URL ({asked}): {_not_served(app, request.method, request.url.path)}"
        elif headers is not None and "Allow" in headers:  # Starlette's is in a set's order, run to run
            headers["Allow"] = ", ".join(sorted(headers["Allow"].split(", ")))
            message = f"Invalid method for URL ({asked}): it takes {headers['Allow']}"
        else:
            message = str(error.detail)
        return await api_error(request, ApiError(error.status_code, message, headers=headers))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        # Starlette raises it on to the Guard, which logs it
        return error_answer(_internal_error(), request.url.path)

    async def authorized(request: Request) -> None:
        """The key (--api-key) as OpenAI's clients send it, ``Authorization: Bearer KEY``, or as Anthropic's
        do, ``x-api-key: KEY`` (llama-server takes both on every route)."""
        if options.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        key = options.api_key.encode()
        bearer = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key)
        if not bearer and not hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key):
            message = "a valid API key is needed: Authorization: Bearer KEY, or x-api-key: KEY"
            raise ApiError(401, message, code="invalid_api_key")

    def get(path: str, **route: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A GET route that answers HEAD too, as HTTP asks of every GET (monitors, curl -I, probes)."""
        return app.api_route(path, methods=["GET", "HEAD"], **route)

    @get("/", response_class=HTMLResponse)
    async def page(request: Request) -> HTMLResponse:
        """/?q=PROMPT asks at once only where the user opened the page (typed, a bookmark, another program:
        the browser says none) or the page itself did; another site's link or script fills the box alone,
        or any site the user visited would make the server generate, its words in the conversation."""
        text, headers = _page()
        if request.headers.get("sec-fetch-site") in ("none", "same-origin"):
            text = text.replace("<body>", "<body data-ask-at-once>", 1)
        return HTMLResponse(text, headers={**headers, "Vary": "Sec-Fetch-Site"})

    @get("/favicon.ico", include_in_schema=False)  # no part of what a 404 lists
    async def icon() -> Response:
        return Response(status_code=204)  # browsers ask for one; the page has none

    @get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "generating": engine.pending > 0, "waiting": max(engine.pending - 1, 0)}

    def served_model() -> dict[str, Any]:
        served = {
            "models": roles,
            "n_ctx": engine.n_ctx,
            "policy": asdict(defaults.policy),
            "any_model_name": options.any_model,  # whether a request naming another model is answered
        }
        # OpenAI's fields, then Anthropic's ModelInfo's (its SDK's models.list() reads these): one entry
        openai = {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "ead"}
        room = engine.n_ctx - 1  # a prompt's at most, and an answer's after a prompt of one token
        anthropic = {
            "type": "model",
            "display_name": MODEL_ID,
            "created_at": "1970-01-01T00:00:00Z",  # OpenAI's created 0
            "max_input_tokens": room,
            "max_tokens": room,
        }
        return {**openai, **anthropic, "ead": served}

    @get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        """OpenAI's list, and Anthropic's page of it (one page: the one model)."""
        page = {"has_more": False, "first_id": MODEL_ID, "last_id": MODEL_ID}
        return {"object": "list", "data": [served_model()], **page}

    @get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model(name: str) -> dict[str, Any]:
        if name != MODEL_ID:  # even with --any-model: the list names one model, and so does this
            message = f"the model {quoted(name)} is not served here: this server serves {MODEL_ID!r}"
            raise ApiError(404, message, code="model_not_found")
        return served_model()

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat(request: Request) -> Any:
        data = await _json_body(request)
        body, job = await prepared(functools.partial(_prepare_chat, choices=MAX_CHOICES), data)
        return await _answer(request, body, [job], "chat.completion")

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request) -> Any:
        data = await _json_body(request)
        prepare = functools.partial(_prepare_text, choices=MAX_CHOICES)
        return await _answer(request, *await prepared(prepare, data), "text_completion")

    # llama-server's utility routes: the smallest model's tokenizer (every model's), and --metrics.

    @app.post("/tokenize", dependencies=[Depends(authorized)])
    async def tokenize_text(request: Request) -> Response:
        data = await _json_body(request)
        return await prepared(functools.partial(tokenize, engine.runners[0], specials), data)

    @app.post("/detokenize", dependencies=[Depends(authorized)])
    async def detokenize_tokens(request: Request) -> dict[str, Any]:
        data = await _json_body(request)
        return await prepared(functools.partial(detokenize, engine.runners[0]), data)

    @get("/tokenizer_info", dependencies=[Depends(authorized)])
    async def tokenizer() -> dict[str, Any]:
        return tokenizer_info(engine.runners[0])

    @get("/metrics", dependencies=[Depends(authorized)])
    async def metrics() -> Response:
        if not options.metrics:  # as llama-server answers it
            raise ApiError(501, "metrics are off: start ead serve with --metrics", kind="not_supported_error")
        processing, deferred = engine.requests()
        exposition = engine.metrics.exposition(processing=processing, deferred=deferred)
        return Response(exposition, media_type=CONTENT_TYPE)

    # Embeddings (ead serve --embeddings; serve/ollama.py has ollama's): OpenAI's, and llama-server's own
    # shape on its routes, each vector the mean of the tokens' (embedding.py), normalised as llama-server's.

    def embedder() -> Embedder:
        if engine.embedder is None:  # as llama-server answers without --embeddings
            message = "embeddings are off: start ead serve with --embeddings"
            raise ApiError(501, message, kind="not_supported_error")
        return engine.embedder

    @app.post("/v1/embeddings", dependencies=[Depends(authorized)])
    async def embeddings(request: Request) -> dict[str, Any]:
        body, tokens, vectors = await _embeddings_of(request)
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(vector, body)}
            for i, vector in enumerate(vectors)
        ]
        read = sum(map(len, tokens))
        usage = {"prompt_tokens": read, "total_tokens": read}
        return {"object": "list", "data": data, "model": body.model or MODEL_ID, "usage": usage}

    @app.post("/embeddings", dependencies=[Depends(authorized)])
    @app.post("/embedding", dependencies=[Depends(authorized)])  # llama-server's older name: listed first
    async def llama_server_embeddings(request: Request) -> list[dict[str, Any]]:
        """llama-server's own shape: a list of ``{"index", "embedding": [vector]}`` (a list of one vector:
        a pooled model's; an unpooled one's lists every token's)."""
        body, _, vectors = await _embeddings_of(request)
        return [
            {"index": i, "embedding": [normalized(vector, body.embd_normalize).tolist()]}
            for i, vector in enumerate(vectors)
        ]

    async def _embeddings_of(request: Request) -> tuple[EmbeddingRequest, list[list[int]], list[np.ndarray]]:
        embedder()  # a 501 before the body is read, without --embeddings
        body, tokens = await prepared(_prepare_embeddings, await _json_body(request))
        return body, tokens, await embedded(request.url.path, tokens)

    def _prepare_embeddings(data: bytes) -> tuple[EmbeddingRequest, list[list[int]]]:
        body = parse(EmbeddingRequest, data)
        _check_model(body.model)
        body.check_dimensions(embedder().n_embd)
        return body, input_tokens(embedder(), body.inputs(), truncate=False)

    async def embedded(path: str, tokens: list[list[int]]) -> list[np.ndarray]:
        """The inputs' vectors (unnormalised), the request's log line said; none for no input (ollama's
        load request: no line)."""
        if not tokens:
            return []
        began = time.perf_counter()
        try:
            vectors = await engine.embedded(tokens)
        except QueueFull as full:
            raise _busy(full) from None
        read = sum(map(len, tokens))
        seconds = time.perf_counter() - began
        log(f"POST {path} 200: {counted(len(tokens), 'embedding')} of {read} tokens, {seconds:.2f} s")
        return vectors

    # On the preparing threads: parse, check, render, tokenize.

    def _prepare_chat(data: bytes, choices: int = 1) -> tuple[ChatRequest, Job]:
        body = _accepted(ChatRequest, data, choices)
        prompt, prefill = _rendered(body)
        reasoning_format = body.reasoning_format or defaults.generation.reasoning_format  # --reasoning-format
        thinking = answer_start(engine.runners[0].chat_template, prompt, reasoning_format)
        return body, _job(body, prompt, prefill, thinking)

    def _prepare_template(data: bytes) -> str:
        """A chat request's prompt, as the model is given it (llama-server's /apply-template)."""
        return _rendered(_accepted(ChatRequest, data))[0]

    def _rendered(body: ChatRequest) -> tuple[str, str | None]:
        """The chat's prompt as the template writes it, ending with the assistant prefill that opens the
        answer if the conversation ends in one (as llama-server and ollama take it); and the prefill."""
        tools = body.tools_offered()
        if tools is not None and not template_takes_tools(engine.runners[0]):
            given = engine.runners[0].template_override  # named as the server was given it, not the model's
            template = given.origin if given else f"the chat template of {engine.runners[0].label}"
            raise unsupported("tools", f"{template} has no tool support")
        messages = [
            template_message(message.as_template_message(f"messages.{i}"))
            for i, message in enumerate(body.messages)
        ]
        texts = "".join(message["content"] + message.get("reasoning_content", "") for message in messages)
        usage_checked(lambda: check_prompt_text(texts), "messages")
        prefill = _prefill(messages)
        earlier = messages if prefill is None else messages[:-1]
        # Qwen3's enable_thinking: the request's over --reasoning-budget's, as llama-server takes them
        generation = defaults.generation
        budget = template_variables(body.reasoning_budget(generation.reasoning_budget, "")[0])
        variables = {**budget, **(body.chat_template_kwargs or {})}
        rendered = usage_checked(
            lambda: render_chat(engine.runners[0], earlier, tools=tools, template_kwargs=variables),
            "messages",
        )
        if rendered is None:
            message = f"{engine.runners[0].label} has no chat template: use /v1/completions"
            raise ApiError(400, message, code="no_template")
        return rendered + (prefill or ""), prefill

    def _prepare_text(
        data: bytes, infill: Infill | None = None, choices: int = 1
    ) -> tuple[CompletionRequest, list[Job]]:
        """A text completion's body and its prompts' jobs (a batch's, in order); each filled in the middle
        with a suffix that is not empty (an empty one, what clients send for none, is none, as ollama reads
        it), or always with llama-server's /infill's ``infill`` parts (its extra files, and the text after
        the prefix). ``choices``: the most ``n`` the route writes. A batch's fault names its prompt
        (``prompt.1``)."""
        body = _accepted(CompletionRequest, data, choices)
        prompts = body.prompts()
        if len(prompts) * body.choices() > MAX_ANSWERS:
            message = (
                f"prompt: {len(prompts)} prompts of {body.choices()} choices each: at most {MAX_ANSWERS} "
                "answers per request"
            )
            raise ApiError(400, message, code="invalid_value", param="prompt")
        jobs = []
        for index, given in enumerate(prompts):
            try:
                jobs.append(_text_job(body, given, infill))
            except ApiError as error:
                if len(prompts) == 1 or error.param != "prompt":
                    raise
                where = f"prompt.{index}"
                message = f"{where}: {error.message.removeprefix('prompt: ')}"
                raise ApiError(error.status, message, kind=error.kind, code=error.code, param=where) from None
        return body, jobs

    def _text_job(body: CompletionRequest, given: str | list[int], infill: Infill | None) -> Job:
        """One prompt's job: a text, or token ids; one that echoes it, checked that it can."""
        if body.suffix or infill is not None:
            if body.echo:
                message = "echo: a fill-in-the-middle completion has no one prompt to echo (send no suffix)"
                raise ApiError(400, message, code="invalid_value", param="echo")
            text = given if isinstance(given, str) else None
            return _job(body, _infill(body, text, *(infill or ((), ""))))
        if isinstance(given, list):
            job = _job(body, known_tokens(given, engine.runners[0].n_vocab, "prompt"))
        else:
            job = _job(body, usage_checked(lambda: check_prompt_text(given), "prompt"))
        if not body.echo:
            return job
        scorer = scoring_runner(engine.runners, job.policy)
        if job.logprobs is not None and isinstance(scorer, RemoteRunner):
            message = (
                f"echo: the prompt's log-probabilities need a local model, and {cut(scorer.label)} is "
                "a llama-server's (drop logprobs, or serve a local file)"
            )
            raise ApiError(400, message, code="invalid_value", param="echo")
        return replace(job, echo=True)

    def _infill(
        body: CompletionRequest, prefix: str | None, extra: Sequence[tuple[str, str]], middle: str
    ) -> list[int]:
        """The fill-in-the-middle prompt of the text before the cursor (the prompt) and after it (the
        suffix), as llama-server's /infill lays it out; a 400 for a model without FIM tokens."""
        runner = engine.runners[0]
        try:
            check_infill(runner)
        except EadError as error:
            raise ApiError(400, f"suffix: {error}", code="unsupported_parameter", param="suffix") from None
        if prefix is None:
            message = "suffix: fill-in-the-middle reads the prompt as text (the code before the cursor)"
            raise ApiError(400, message, code="invalid_value", param="suffix")
        usage_checked(lambda: check_text(prefix, "the prompt"), "prompt")
        suffix = body.suffix or ""
        usage_checked(lambda: check_text(suffix, "the suffix"), "suffix")
        try:
            check_special_tokens_fit(middle, specials, engine.n_ctx)  # the code is read without them
            return encode_infill(
                runner,
                prefix,
                suffix,
                extra=extra,
                middle=middle,
                answer_tokens=defaults.generation.max_tokens,  # the server's, as llama-server's -n
                runners=engine.runners,
            )
        except EadError as error:
            raise ApiError(400, str(error), code="context_length_exceeded", param="prompt") from None

    def _answer_limit(body: CompletionBase) -> int:
        """The most tokens the answer may have: the request's limit or the server's, within the context
        (-1, either's: all of it)."""
        limit = body.token_limit()
        return answer_limit(defaults.generation.max_tokens if limit is None else limit, engine.n_ctx)

    def _accepted(schema: type[Body], data: bytes, choices: int = 1) -> Body:
        body = parse(schema, data)
        body.check_supported(choices)
        _check_model(body.model)
        return body

    def _check_model(name: str | None) -> None:
        if name not in (None, "", MODEL_ID) and not options.any_model:
            message = (
                f"the model {quoted(name)} is not served here: this server serves {MODEL_ID!r} "
                "(ead serve --any-model answers any name)"
            )
            raise ApiError(404, message, code="model_not_found", param="model")

    def _job(
        body: CompletionBase, given: str | list[int], prefill: str | None = None, thinking: bool | None = None
    ) -> Job:
        """The request's work: its prompt (rendered text, or token ids as given, ending with the
        ``prefill`` that opens the answer if any) and options, checked; how its answer is split
        (``thinking``, ``thinking.answer_start``)."""
        try:
            if isinstance(given, str):
                check_special_tokens_fit(given, specials, engine.n_ctx)
                prompt = encode_fitting(engine.runners[0], given, engine.runners)
            else:
                check_fits(given, engine.runners)
                prompt = given
        except EadError as error:
            field = "messages" if isinstance(body, ChatRequest) else "prompt"
            raise ApiError(400, str(error), code="context_length_exceeded", param=field) from None
        policy, generation = _settings(body, prefill, prompt)
        logprobs = body.logprobs_count()
        if logprobs is not None:
            _without_rollbacks(
                policy, "logprobs", "log-probabilities follow the tokens as they are drawn: they need"
            )
        banned_by = "the request's ignore_eos" if body.ignore_eos else "the server's --ignore-eos"
        return Job(prompt, policy, generation, logprobs, prefill or "", thinking, banned_by)

    def _submitted(job: Job) -> Ticket:
        """The job queued for the engine, its ticket to read the answer from; a 503 if the queue is full."""
        ticket = Ticket(asyncio.get_running_loop())
        try:
            engine.submit(job, ticket)
        except QueueFull as full:
            raise _busy(full) from None
        return ticket

    async def _answer(request: Request, body: CompletionBase, prompts: list[Job], kind: str) -> Any:
        """OpenAI's answer of ``n`` choices of each prompt (a text completion's batch: prompt i's choice j
        is choice i * n + j, as OpenAI and llama-server index them): one job each, drawn one after the
        other (the first queued now: a full queue is a 503), choice j with the request's seed + j, so each
        differs where the answer is drawn, and a seed given draws the same choices again."""
        per_prompt = body.choices()
        jobs = [each for job in prompts for each in choice_jobs(job, per_prompt)]
        names = body.tool_names() if isinstance(body, ChatRequest) else None
        answer = new_answer(kind)
        echoes: list[Echo | None] = [None] * len(jobs)
        if isinstance(body, CompletionRequest) and body.echo:
            given = [prompt for prompt in body.prompts() for _ in range(per_prompt)]
            echoes = [echoed(engine.runners[0], *each) for each in zip(given, jobs, strict=True)]
        replies = [
            _Reply(
                kind,
                request.url.path,
                log,
                seed=each.generation.sampling.seed,
                piece=engine.runners[0].token_bytes,
                tools=names,
                parallel=not isinstance(body, ChatRequest) or body.parallel_tool_calls is not False,
                prefill=each.prefill,
                thinking=each.thinking,
                usage_chunk=body.stream_options is not None and body.stream_options.include_usage is True,
                progress=body.return_progress is True,
                index=index,
                answer=answer,
                per_prompt=per_prompt,
                echo=echoes[index],
            )
            for index, each in enumerate(jobs)
        ]
        tickets = queued_in_turn(jobs, _submitted)
        if body.stream:  # its sends timed by the protocol
            summaries: list[Summary] = []
            streams = [
                functools.partial(reply.stream, summaries=summaries, last=index == len(replies) - 1)
                for index, reply in enumerate(replies)
            ]
            return EventSourceResponse(
                in_turn(tickets, streams, lambda index: len(summaries) > index), ping=15
            )
        answers = await wholes_in_turn(tickets, lambda index, ticket: replies[index].choice(ticket, request))
        if answers is None:
            return JSONResponse({}, status_code=499)
        return JSONResponse(replies[0].whole(answers))

    def _settings(
        body: CompletionBase, prefill: str | None, prompt: list[int]
    ) -> tuple[PolicyOptions, GenerationOptions]:
        """The request's options over the defaults, checked by the command line's rules (400 if bad)."""
        ead = body.ead or EadOptions()
        base = defaults.generation.sampling
        temp = base.temp if body.temperature is None else body.temperature
        grammar = body.response_format.grammar() if body.response_format is not None else None
        top_k, min_p = body.sampling_value("top_k"), body.sampling_value("min_p")
        penalties = body.penalties()
        biases = body.biases()
        known_tokens([token for token, _ in biases], engine.runners[0].n_vocab, "logit_bias")

        def settings() -> tuple[PolicyOptions, GenerationOptions]:
            # the request's options given over the command line's: one of them may turn the pair on
            policy = _with_saved_tau_noted(
                ead.policy_options(defaults.policy, len(engine.runners), _models_take)
            )
            start = () if grammar is None else _check_grammar(grammar, policy, prefill, body, prompt)
            calls = _bound_calls(body, policy, prefill, grammar is not None)
            sampling = SamplingParams(
                grammar=grammar if calls is None else calls[0],
                grammar_start=start if calls is None else calls[2],
                grammar_trigger=None if calls is None else calls[1],
                grammar_opening=None if calls is None else calls[3],
                temp=0.0 if body.top_p == 0 else temp,  # top_p 0 keeps the likeliest token alone: greedy
                top_k=base.top_k if top_k is None else top_k,
                top_p=base.top_p if not body.top_p else body.top_p,
                min_p=base.min_p if min_p is None else min_p,
                seed=_request_seed(body.seed, base.seed if "seed" in defaults.policy.given else None),
                **{
                    name: getattr(base, name)
                    for name in (*PENALTIES, *LLAMA_SAMPLERS, "dry_sequence_breakers")
                }
                | penalties
                | body.llama_samplers(),
                logit_bias=biases if body.logit_bias is not None else base.logit_bias,
            )
            sampling = replace(sampling, **body.chain_settings())
            remote = any_remote(engine.runners)
            if sampling.infill and (policy.mode == "spec" or remote):
                message = "samplers: the infill sampler needs local models, and no speculative decoding"
                raise ApiError(400, message, param="samplers", code="unsupported_parameter")
            chain_only = sampling.chain_only
            if chain_only is not None and (policy.mode == "spec" or remote):
                param = CHAIN_ONLY_FIELDS[chain_only]
                message = f"{param}: the sampler needs local models, and no speculative decoding"
                raise ApiError(400, message, param=param, code="unsupported_parameter")
            if chain_only == "--mirostat":
                _without_rollbacks(policy, "mirostat", "Mirostat's running target goes with")
            stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
            generation = replace(
                defaults.generation,
                sampling=sampling,
                max_tokens=_answer_limit(body),
                ignore_eos=defaults.generation.ignore_eos if body.ignore_eos is None else body.ignore_eos,
                stop=stop,
                min_indent=body.n_indent or 0,
                newline_time_limit_ms=max(body.t_max_predict_ms or 0, 0),
            )
            budget, message = body.reasoning_budget(
                generation.reasoning_budget, generation.reasoning_budget_message
            )
            generation = replace(generation, reasoning_budget=budget, reasoning_budget_message=message)
            # refused here, not in the engine
            field = "reasoning_budget_tokens"
            usage_checked(lambda: reasoning_budget_for(engine.runners[0], policy, generation, field), field)
            return policy, generation

        return usage_checked(settings)

    def _models_take(policy: PolicyOptions) -> None:
        """Raises what the loaded models refuse of these options (a decoder costs nothing to build)."""
        build_decoder(
            engine.runners, with_saved_tau(policy, engine.runners, defaults.taus).options, defaults.generation
        )

    # The notes logged where a request's rule options leave a saved τ for the policy's default: one per
    # setting, not per request; the server's own settings' note was said at its start.
    started = with_saved_tau(defaults.policy, engine.runners, defaults.taus).mismatch
    mismatches_noted = set() if started is None else {started}
    noting = threading.Lock()  # requests are prepared on several threads

    def _with_saved_tau_noted(policy: PolicyOptions) -> PolicyOptions:
        """A request's options with the pair's saved τ where it applies; where its rule options leave the
        policy's default τ instead, the log says so the first time."""
        saved = with_saved_tau(policy, engine.runners, defaults.taus)
        if saved.mismatch is not None:
            with noting:
                first = saved.mismatch not in mismatches_noted
                mismatches_noted.add(saved.mismatch)
            if first:
                log(f"note: {saved.mismatch}")
        return saved.options

    def _check_grammar(
        grammar: str, policy: PolicyOptions, prefill: str | None, body: CompletionBase, prompt: list[int]
    ) -> tuple[int, ...]:
        """JSON mode: a grammar cannot take a token back, nor reach into a llama-server. The prefill's
        tokens, which the grammar follows before the answer's first (its text opens the answer, which
        ends the ``prompt``)."""
        if any_remote(engine.runners):
            message = (
                "response_format: JSON mode needs every model local (a grammar cannot reach a llama-server)"
            )
            raise ApiError(400, message, code="invalid_value", param="response_format")
        _without_rollbacks(policy, "response_format", "JSON mode needs")
        runner = engine.runners[0]
        usage_checked(lambda: runner.grammars.check(grammar), "response_format")
        if not prefill or not isinstance(body, ChatRequest):
            return ()
        where = f"messages.{len(body.messages) - 1}.content"
        _check_not_thinking(runner, prompt, prefill, where)
        return _followed_prefill(runner, grammar, prefill, where)

    def _bound_calls(
        body: CompletionBase,
        policy: PolicyOptions,
        prefill: str | None,
        json_mode: bool,
    ) -> tuple[str, int | None, tuple[int, ...], Callable[[str], bool | None] | None] | None:
        """The tools' grammar (``call_grammar``: a call's arguments as its schema allows, as llama-server
        binds them), the token it is triggered by, the prefill's tokens it follows and the test of a bare
        call's opening that triggers it too, where the run can follow it: every model local, no step that
        takes tokens back, schemas the converter and llama.cpp take, and a prefill that it does not rule
        out. Lazy, from the first ``<tool_call>`` on (a vocabulary with that token), or from the answer's
        start once it opens a bare call of a tool offered (``opens_call``; a thinking model's answer, from
        the end of its reasoning); elsewhere the calls are read as the model writes them (None), as
        they were before any grammar bound them. Where ``tool_choice`` forces a call (``forced_tools``),
        from the answer's first token, over the tools it may call (llama-server's ``required``), a thinking
        model's from the end of its reasoning, written free (the decoder's ``thinking_tags``); where the
        run cannot bind it so (JSON mode's grammar binds it already), a 400 that says why."""
        if not isinstance(body, ChatRequest):
            return None
        tools, forced, names = body.tools_offered(), body.forced_tools(), body.tool_names()
        if not tools or names is None or (json_mode and not forced):
            return None
        runner = engine.runners[0]
        trigger = None if forced else call_trigger(runner)
        opening = None if forced else functools.partial(opens_call, names=names)
        start = runner.spelling(prefill) if prefill else []
        unbound = _unbindable(policy, json_mode)
        if unbound is None and start is None:
            unbound = "an assistant prefill the vocabulary cannot spell for a grammar"
        try:
            if unbound is not None:
                raise EadError(unbound)
            grammar = call_grammar(forced or tools, body.parallel_tool_calls is not False, not forced)
            runner.grammars.check(grammar, start if trigger is not None or forced else (), trigger)
        except EadError as error:  # a schema no grammar holds, or a prefill the calls rule out
            if not forced:
                return None
            message = f"tool_choice: a forced call needs a grammar, which this answer cannot take: {error}"
            raise ApiError(400, message, code="invalid_value", param="tool_choice") from None
        return grammar, trigger, tuple(start or ()), opening

    def _unbindable(policy: PolicyOptions, json_mode: bool) -> str | None:
        """Why no calls' grammar can bind this run's answer (None where one can)."""
        steps = policy.takes_tokens_back()
        if json_mode:
            return "response_format, whose grammar binds the answer already"
        if any_remote(engine.runners):
            return "a model on a llama-server, which a grammar cannot reach"
        if steps is not None:
            return f"{steps}, which takes tokens back that a grammar cannot"
        return None

    async def _json_body(request: Request) -> bytes:
        """The body, if it says it is JSON: a web page can POST text/plain or a form anywhere without
        asking; and if it is sent as is (a gzip body read as JSON was a 400 that called it invalid JSON).
        A bare ``curl -d``'s form type, or none, is taken where no page sent it (no Origin), as
        llama-server and ollama take a body whatever its type (ollama's docs' examples send none)."""
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        from_curl = "origin" not in request.headers and media in ("", FORM)
        if media != "application/json" and not from_curl:
            sent = quoted(media or "none")
            message = f"the body must be JSON sent as Content-Type: application/json, not {sent}"
            raise ApiError(415, message, code="unsupported_media_type")
        coding = request.headers.get("content-encoding", "").strip().lower()
        if coding not in ("", "identity"):
            message = f"Content-Encoding {quoted(coding)} is not taken: send the body uncompressed"
            raise ApiError(
                415, message, code="unsupported_media_type", headers={"Accept-Encoding": "identity"}
            )
        return await request.body()

    # serve/ollama.py's and serve/native.py's routes take the same steps as OpenAI's: see Requests
    app.state.requests = Requests(
        authorized=authorized,
        json_body=_json_body,
        chat=functools.partial(prepared, _prepare_chat),
        template=functools.partial(prepared, _prepare_template),
        text=functools.partial(prepared, functools.partial(_prepare_text, choices=MAX_CHOICES)),
        infill=lambda data, infill: prepared(
            functools.partial(_prepare_text, infill=infill, choices=MAX_CHOICES), data
        ),
        submit=_submitted,
        served_model=served_model,
        log=log,
        prepared=prepared,
        embedder=embedder,
        embedded=embedded,
        keep_alive=lambda: KeepAlive(options.ping_interval),
    )
    return app


def _busy(full: QueueFull) -> ApiError:
    """A full queue's 503, with when to try again."""
    headers = {"Retry-After": str(full.retry_after)}
    return ApiError(503, str(full), kind="server_error", code="queue_full", headers=headers)


def input_tokens(
    embedder: Embedder, inputs: list[tuple[str, str | list[int]]], *, truncate: bool, n_ctx: int | None = None
) -> list[list[int]]:
    """Each input's tokens to embed (``inputs``: where the request gives it, and a text or token ids), or a
    400 naming the first at fault; ``truncate``: one past the context (``n_ctx``: a smaller one the
    request asks for, ollama's num_ctx) cut (ollama's), else refused."""

    def read(where: str, given: str | list[int]) -> list[int]:
        try:
            if isinstance(given, str):
                return embedder.tokens(given, truncate=truncate, what=where, n_ctx=n_ctx)
            ids = known_tokens(given, embedder.runner.n_vocab, where)
            return embedder.fitting(ids, truncate=truncate, what=where, n_ctx=n_ctx)
        except EadError as error:
            code = "context_length_exceeded" if isinstance(error, InputTooLong) else "invalid_value"
            raise ApiError(400, str(error), code=code, param=where) from None

    return [read(where, given) for where, given in inputs]


def _encoded(vector: np.ndarray, body: EmbeddingRequest) -> list[float] | str:
    """A vector normalised as asked (L2 by default) and written as asked: numbers, or OpenAI's base64 of
    its little-endian float32 bytes (what the openai client asks for and decodes)."""
    vector = normalized(vector, body.embd_normalize)
    if body.encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


SEEDS = 2**32 - 1  # llama.cpp's: 0 to 4294967294 (4294967295 asks for a fresh one)


def _request_seed(asked: int | None, served: int | None) -> int:
    """The seed a request draws with, as llama-server's: its own (``asked``; -1 a fresh one), else the
    server's ``--seed`` (``served``) if it was started with one, else a fresh one, so that a sampled
    "regenerate" differs."""
    if asked is not None and asked >= 0:
        return asked
    if asked is None and served is not None:
        return served
    return secrets.randbelow(SEEDS)


def _prefill(messages: list[dict[str, Any]]) -> str | None:
    """The text of a conversation's last message where it is the assistant's (and no call, nor the only
    message): the start of the answer, which the answer's turn continues, as llama-server and ollama take
    it (an assistant prefill), rather than a turn closed before a new one."""
    last = messages[-1]
    if len(messages) < 2 or last["role"] != "assistant" or last.get("tool_calls"):
        return None
    return str(last["content"])


def _check_not_thinking(runner: Runner, prompt: list[int], prefill: str, where: str) -> None:
    """A 400 for an assistant prefill (at ``where``, ending ``prompt``) that holds a thinking model's
    thinking: a block open at its end (the prefill's or the template's), or one it ends. JSON mode's
    grammar follows a prefill as the start of the answer it binds; the decoder could write such thinking
    free and bind what follows, but llama-server refuses the request (its samplers fail to start), so
    ead does too, saying why (its message had blamed the prefill's first character)."""
    tags = block_tags(runner)
    if tags is None:
        return
    if tags.left_open(prompt):
        state = "a <think> block is open at its end"
    elif CLOSE in prefill:
        state = "it ends a <think> block"
    else:
        return
    message = (
        f"{where}: the assistant prefill holds a thinking model's thinking ({state}), but with "
        "response_format a prefill must start the answer the format binds, as llama-server's must (it "
        "refuses this too): send the thinking without response_format"
    )
    raise ApiError(400, message, code="invalid_value", param=where)


def _followed_prefill(runner: Runner, grammar: str, prefill: str, where: str) -> tuple[int, ...]:
    """Tokens that spell an assistant prefill (at ``where``), which opens the answer, so the grammar
    follows its text before the answer's first token; a 400 where the grammar rules one out (checked token
    by token: llama.cpp aborts the process on a token its grammar rules out) or where the vocabulary has
    no tokens for it."""
    start = runner.spelling(prefill)
    if start is None:
        message = (
            f"{where}: {runner.label}'s vocabulary has no tokens that spell the assistant prefill as it "
            "is, so response_format cannot follow it: send the prefill or the format, not both"
        )
        raise ApiError(400, message, code="invalid_value", param=where)
    try:
        runner.grammars.check(grammar, start)
    except GrammarRefusal as refused:
        # the whole characters before the refused token: one it begins in the middle is where it breaks
        at = len(b"".join(map(runner.token_bytes, start[: refused.index])).decode("utf-8", "ignore"))
        message = (
            f"{where}: the assistant prefill breaks response_format at character {at} "
            f"({prefill[at : at + 20]!r}): an answer of the format cannot start with it"
        )
        raise ApiError(400, message, code="invalid_value", param=where) from None
    return tuple(start)


def _without_rollbacks(policy: PolicyOptions, param: str, what: str) -> None:
    """A 400 for the policies that take tokens back, which ``what`` cannot go with."""
    if policy.takes_tokens_back() is not None:
        steps = "ead.mode spec, ead.verify, ead.policy lookahead"
        message = f"{param}: {what} no step that takes tokens back ({steps})"
        raise ApiError(400, message, code="invalid_value", param=param)


def usage_checked(make: Callable[[], Any], param: str | None = None) -> Any:
    """``make()``, with the command line's usage errors turned into 400s about ``param``."""
    try:
        return make()
    except EadError as error:
        raise ApiError(400, str(error), code="invalid_value", param=param) from None


Scored = tuple[TokenEvent, Logprobs, int]  # a token's event, its log-probabilities, where its text starts


@dataclass(frozen=True)
class Echo:
    """A text completion's echoed prompt: its text (as given, or its token ids' text), its tokens, where
    each one's text starts in it, and whether their log-probabilities come (``PromptScores``)."""

    text: str
    tokens: tuple[int, ...]
    offsets: tuple[int, ...]
    scored: bool


def echoed(runner: Runner, given: str | list[int], job: Job) -> Echo:
    """The echo of ``job``'s prompt, ``given`` as the request gave it."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, written = [], 0
    for token in job.prompt:
        offsets.append(written)
        written += len(decoder.decode(runner.token_piece(token)))
    text = given if isinstance(given, str) else text_of(runner, given)
    return Echo(text, tuple(job.prompt), tuple(offsets), job.logprobs is not None)


class ScoredText:
    """A request's scored tokens matched to the text it is shown. A token's log-probabilities go out once
    the text is released past its end (text held back as a possible stop string, or half a character,
    waits), with where its text starts in the answer (characters); tokens that wrote only a stop string,
    which the answer never shows, are left out, as llama-server leaves them out."""

    def __init__(self, piece: Callable[[int], bytes], start: int = 0) -> None:
        self.piece = piece
        self.asked = False  # whether the request asked for log-probabilities (its tokens carry them)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # as TextStream decodes
        self._written = start  # characters of the tokens' own text so far, after an echoed prompt's
        self._shown = start  # characters of the answer released so far
        self._waiting: list[tuple[TokenEvent, Logprobs, int, int]] = []

    def add(self, token: Token) -> list[Scored]:
        """The scored tokens this token's released text completes. A request's tokens all carry
        log-probabilities or none do (a step that takes tokens back is refused with them): without, no
        text is followed."""
        if token.logprobs is None:
            return []
        self.asked = True
        piece = self.piece(token.event.token)
        # the bytes of a character begun before, which this token's first byte breaks, show as one U+FFFD
        # ahead of this token's own text (one finished here starts where it began)
        held = self._decoder.getstate()[0]
        start = self._written + (held != b"" and piece != b"" and not _continues(held, piece[:1]))
        self._written += len(self._decoder.decode(piece))
        self._shown += len(token.event.text)
        self._waiting.append((token.event, token.logprobs, start, self._written))
        return self._release(lambda start, end: end <= self._shown)

    def finish(self) -> list[Scored]:
        """At the answer's end: the tokens still waiting whose text is at least partly shown (the rest
        wrote the stop string)."""
        released = self._release(lambda start, end: start < self._shown)
        self._waiting = []
        return released

    def _release(self, shown: Callable[[int, int], bool]) -> list[Scored]:
        """The waiting tokens, in order, for which ``shown(start, end)`` of their text holds."""
        count = 0
        while count < len(self._waiting) and shown(*self._waiting[count][2:]):
            count += 1
        released, self._waiting = self._waiting[:count], self._waiting[count:]
        return [(event, scores, start) for event, scores, start, _ in released]


def scored_entries(piece: Callable[[int], bytes], scored: list[Scored]) -> list[dict[str, Any]]:
    """These scored tokens as OpenAI's chat lists them (``logprobs.content``), and ollama's
    ``logprobs`` alike: each token's text, log-probability and bytes, and its likeliest alternatives'."""

    def entry(token: int, logprob: float) -> dict[str, Any]:
        data = piece(token)
        return {"token": data.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(data)}

    return [
        {**entry(event.token, scores.logprob), "top_logprobs": [entry(t, lp) for t, lp in scores.top]}
        for event, scores, _ in scored
    ]


def _continues(held: bytes, byte: bytes) -> bool:
    """Whether ``byte`` goes on with the character that the bytes ``held`` begin."""
    try:
        codecs.utf_8_decode(held + byte, "strict", False)
    except UnicodeDecodeError:
        return False
    return True


def new_answer(kind: str) -> tuple[str, int]:
    """A new answer's id and time of creation, as OpenAI's."""
    return f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())


def choice_jobs(job: Job, count: int) -> list[Job]:
    """The jobs of an answer's ``count`` choices (OpenAI's n, llama-server's n_cmpl): choice i drawn with
    the job's seed + i, so each differs where the answer is drawn, and a seed given draws them again."""
    seeds = [(job.generation.sampling.seed + index) % SEEDS for index in range(count)]
    return [
        replace(job, generation=replace(job.generation, sampling=replace(job.generation.sampling, seed=seed)))
        for seed in seeds
    ]


def queued_in_turn(jobs: list[Job], submit: Callable[[Job], Ticket]) -> list[Callable[[], Ticket]]:
    """How each choice's job is queued: the first now (a full queue is the request's 503), each later one
    when it is asked for, once the choice before it is done."""
    first = submit(jobs[0])
    return [lambda: first, *(functools.partial(submit, later) for later in jobs[1:])]


async def wholes_in_turn(
    tickets: list[Callable[[], Ticket]], whole: Callable[[int, Ticket], Awaitable[Whole | None]]
) -> list[Whole] | None:
    """Each choice ``whole``, one after the other, each ticket taken (its job queued) once the choice
    before it is done; None where the client left while one waited (its job cancelled)."""
    wholes = []
    for index, ticket in enumerate(tickets):
        answered = await whole(index, ticket())
        if answered is None:
            return None
        wholes.append(answered)
    return wholes


async def in_turn(
    tickets: list[Callable[[], Ticket]],
    streams: list[Callable[[Ticket], AsyncIterator[dict[str, str] | bytes]]],
    finished: Callable[[int], bool],
) -> AsyncIterator[dict[str, str] | bytes]:
    """The choices' streams one after the other, each ticket taken (its job queued) once the choice
    before it is ``finished``: a failure, said in its stream, or a queue full for a later one, ends them."""
    for index, (ticket, stream) in enumerate(zip(tickets, streams, strict=True)):
        try:
            current = ticket()
        except ApiError as error:
            yield error.sse_event()
            return
        async for event in stream(current):
            yield event
        if not finished(index):  # it failed, and said so
            return


class _Reply:
    """One choice of a request's answer in OpenAI's shapes, from its ticket's messages."""

    def __init__(
        self,
        kind: str,
        path: str,
        log: Log,
        *,
        seed: int,
        piece: Callable[[int], bytes],
        tools: frozenset[str] | None = None,
        parallel: bool = True,
        prefill: str = "",
        thinking: bool | None = None,
        usage_chunk: bool = False,
        progress: bool = False,
        index: int = 0,
        answer: tuple[str, int] | None = None,
        per_prompt: int = 1,
        echo: Echo | None = None,
    ) -> None:
        self.kind, self.path, self.log = kind, path, log
        self.echo = echo  # a text completion's prompt, before its answer
        self.index = index  # its place among the answer's choices (OpenAI's n, a batch's prompts)
        self.per_prompt = per_prompt  # each prompt's choices: the usage counts each prompt once
        self.progress = progress  # llama-server's return_progress: a chunk per batch of the prompt read
        # stream_options.include_usage: the usage in a last chunk of its own, with no choice, as OpenAI
        # and llama-server send it (clients that asked for it read it there); else on the finish chunk
        self.usage_chunk = usage_chunk
        self.piece = piece  # a token id's bytes, for log-probabilities
        self._scored = ScoredText(piece, len(echo.text) if echo is not None else 0)
        self.tools = tools  # the names of the tools offered: read calls out of the answer
        self.parallel = parallel  # parallel_tool_calls: more than one call per answer
        self.prefill = prefill  # the assistant message the answer continues: a call it opens is read whole
        self.seed = seed  # the one it was drawn with: sent back, so an answer can be drawn again
        self.id, self.created = answer or new_answer(kind)  # the answer's, which its choices share
        self.chat = kind == "chat.completion"
        self._role_sent = False  # a stream names the role in its first delta only, as OpenAI does
        self.thinking = thinking  # a thinking model's answer: its reasoning given apart (Job.thinking)
        self._splitter = None if thinking is None else ReasoningSplitter(thinking)

    def reader(self) -> ToolCallReader | None:
        """The reader of the calls in a streamed answer; None where no tools are offered."""
        return ToolCallReader(self.tools, self.parallel, self.prefill) if self.tools else None

    def _envelope(self, object_kind: str, choice: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
        """The answer or chunk around its one choice (None: a chunk of no choice, the usage chunk)."""
        return {
            "id": self.id,
            "object": object_kind,
            "created": self.created,
            "model": MODEL_ID,
            "choices": [] if choice is None else [{"index": self.index, **choice}],
            **extra,
        }

    def _chunk(self, text: str | None, finish: str | None, logprobs: Any = None, **extra: Any) -> str:
        if self.chat:
            delta = {} if text is None else {"content": text}
            return self._delta(delta, finish, logprobs, **extra)
        choice = {"text": text or "", "finish_reason": finish, "logprobs": logprobs}
        return json.dumps(self._envelope("text_completion", choice, **extra), ensure_ascii=False)

    def _delta(self, delta: dict[str, Any], finish: str | None, logprobs: Any = None, **extra: Any) -> str:
        """A chat chunk; the first delta names the role, the others not: the openai client's stream
        helper adds up a string each delta repeats (a role in every chunk was 'assistantassistant...').
        The first may be the finish (no token came): it names the role all the same."""
        if not self._role_sent:
            delta, self._role_sent = {"role": "assistant", **delta}, True
        choice = {"delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return json.dumps(self._envelope("chat.completion.chunk", choice, **extra), ensure_ascii=False)

    def _token_chunks(self, token: Token, reader: ToolCallReader | None) -> list[str]:
        """A token's chunks: its text; with tools, the text and calls it completes (text that may open a
        call is held), the first carrying the token's ``ead`` fields and log-probabilities, an empty one
        if it completes none."""
        first = {"ead": token_fields(token.event), "logprobs": self._logprobs(self._scored.add(token))}
        if self._splitter is None:
            return self._content_chunks(token.event.text, reader, first)
        # a thinking model's: the reasoning it completes, then its content (held text: an empty delta)
        reasoning, content = self._splitter.push(token.event.text)
        return self._split_chunks(reasoning, content, reader, first) or [self._delta({}, None, **first)]

    def _split_chunks(
        self, reasoning: str, content: str, reader: ToolCallReader | None, first: dict[str, Any]
    ) -> list[str]:
        """A reasoning delta as llama-server's ``reasoning_content``, then the content's chunks."""
        chunks = [self._delta({"reasoning_content": reasoning}, None, **first)] if reasoning else []
        if content:
            chunks += self._content_chunks(content, reader, {} if chunks else first)
        return chunks

    def _content_chunks(self, text: str, reader: ToolCallReader | None, first: dict[str, Any]) -> list[str]:
        if reader is None:
            return [self._chunk(text, None, **first)]
        # a token that completes nothing yet (text that may open a call) says nothing of the content: an
        # empty one made a call alone's content "" once a client added the deltas up (whole: null)
        return self._piece_chunks(reader.push(text), first) or [self._delta({}, None, **first)]

    def _piece_chunks(self, pieces: list[Piece], first: dict[str, Any]) -> list[str]:
        """A chunk per piece of text or of a call: its start (id, name, no arguments yet), then its
        arguments' pieces as the model writes them, each at the call's place among the answer's (a
        client's accumulator merges the deltas of one index into one call)."""
        chunks = []
        for piece in pieces:
            extra = {} if chunks else first
            if isinstance(piece, CallStart):
                function = {"name": piece.name, "arguments": ""}
                call = {"index": piece.index, "id": new_call_id(), "type": "function", "function": function}
                chunks.append(self._delta({"tool_calls": [call]}, None, **extra))
            elif isinstance(piece, ArgumentsDelta):
                call = {"index": piece.index, "function": {"arguments": piece.text}}
                chunks.append(self._delta({"tool_calls": [call]}, None, **extra))
            elif isinstance(piece, str):
                chunks.append(self._chunk(piece, None, **extra))
        return chunks

    def _logprobs(self, scored: list[Scored]) -> dict[str, Any] | None:
        """OpenAI's ``logprobs`` of a choice for these scored tokens (chat's ``content`` list, or a text
        completion's parallel lists); None if the request did not ask for them."""
        if not self._scored.asked:
            return None
        if self.chat:
            return {"content": scored_entries(self.piece, scored), "refusal": None}
        return {
            "tokens": [self._legacy_name(event.token) for event, _, _ in scored],
            "token_logprobs": [scores.logprob for _, scores, _ in scored],
            "top_logprobs": [self._legacy_top(event.token, scores) for event, scores, _ in scored],
            "text_offset": [start for _, _, start in scored],
        }

    def _echo_logprobs(
        self, scores: PromptScores | None, answer: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """A text completion's ``logprobs`` with its echoed prompt's before the ``answer``'s, as OpenAI
        lists them: the first token's null (nothing predicts it)."""
        if scores is None or self.echo is None:
            return answer
        tokens = self.echo.tokens
        prompt = {
            "tokens": [self._legacy_name(token) for token in tokens],
            "token_logprobs": [None, *(each.logprob for each in scores.scores)],
            "top_logprobs": [
                None,
                *map(self._legacy_top, tokens[1:], scores.scores),
            ],
            "text_offset": list(self.echo.offsets),
        }
        return prompt if answer is None else {key: prompt[key] + answer[key] for key in prompt}

    def _legacy_top(self, token: int, scores: Logprobs) -> dict[str, float]:
        """A text completion's row of alternatives: the N likeliest, and the token drawn where it is not
        among them, as OpenAI lists up to N + 1 ("always the logprob of the sampled token"): a client
        reading a row's best met an empty row at ``logprobs: 0``."""
        top = {self._legacy_name(alternative): logprob for alternative, logprob in scores.top}
        top.setdefault(self._legacy_name(token), scores.logprob)
        return top

    def _legacy_name(self, token: int) -> str:
        """A token as a text completion's logprobs name it, a key of ``top_logprobs``: its text; where its
        bytes are not text on their own (a character split across tokens) ``bytes:\\xe2\\x80``, as OpenAI
        names them; a control token (no bytes) ``token_id:N``, as vLLM does. Each as U+FFFD or as '' had
        shared one key, and the dict kept one of them."""
        piece = self.piece(token)
        if not piece:
            return f"token_id:{token}"
        try:
            return piece.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{byte:02x}" for byte in piece)

    async def stream(
        self, ticket: Ticket, summaries: list[Summary] | None = None, last: bool = True
    ) -> AsyncIterator[dict[str, str] | bytes]:
        """Server-sent events: a chunk per token with its model, then the finish with usage and figures
        (with ``usage_chunk``, the usage in a chunk of its own after it, of every choice's ``summaries``,
        this one's added). Where it is not the ``last`` choice, it ends with its finish, not [DONE]."""
        summaries = [] if summaries is None else summaries
        reader = self.reader()
        if self.echo is not None and not self.echo.scored:
            yield {"data": self._chunk(self.echo.text, None)}
        async with contextlib.aclosing(answer_messages(ticket)) as messages:
            async for message in messages:
                if isinstance(message, PromptScores):  # the echoed prompt, with its log-probabilities
                    assert self.echo is not None
                    yield {"data": self._chunk(self.echo.text, None, self._echo_logprobs(message, None))}
                    continue
                if isinstance(message, Token):
                    for chunk in self._token_chunks(message, reader):
                        yield {"data": chunk}
                    continue
                if isinstance(message, PromptProgress):
                    if self.progress:
                        yield {"data": self._chunk(None, None, prompt_progress=prompt_progress(message))}
                    continue
                if isinstance(message, Failed):
                    error = error_of(message)
                    self.log(f"error: POST {self.path}: {error.message}")
                    yield error.sse_event()
                    return
                self._done(message.summary)
                summaries.append(message.summary)
                if self._splitter is not None:
                    for chunk in self._split_chunks(*self._splitter.flush(), reader, {}):
                        yield {"data": chunk}
                if reader is not None:
                    for chunk in self._piece_chunks(reader.finish(), {}):
                        yield {"data": chunk}
                finish = _finish(message.summary, called=reader is not None and bool(reader.calls))
                ead = {"summary": asdict(message.summary), "seed": self.seed}
                usage = {"usage": _usage([message.summary])}
                extra = {"ead": ead} if self.usage_chunk else {**usage, "ead": ead}
                yield {"data": self._chunk(None, finish, self._logprobs(self._scored.finish()), **extra)}
                if not last:
                    return
                if self.usage_chunk:
                    kind = "chat.completion.chunk" if self.chat else "text_completion"
                    yield {
                        "data": json.dumps(
                            self._envelope(kind, None, usage=_usage(summaries, self.per_prompt))
                        )
                    }
                yield {"data": "[DONE]"}

    async def choice(
        self, ticket: Ticket, request: Request
    ) -> tuple[dict[str, Any], Summary, dict[str, Any]] | None:
        """This choice whole (without its index), its figures and its ``ead`` fields; None where the
        client left while it waited (the job cancelled)."""
        prompt_scores: list[PromptScores] = []
        answer = await collected(ticket, request, prompt_scores)
        if answer is None:
            return None
        tokens, summary = answer
        self._done(summary)
        events = [token.event for token in tokens]
        text = "".join(event.text for event in events)
        finish = _finish(summary)
        scored = [entry for token in tokens for entry in self._scored.add(token)]
        logprobs = self._logprobs([*scored, *self._scored.finish()])
        if not self.chat:
            echo = "" if self.echo is None else self.echo.text
            logprobs = self._echo_logprobs(next(iter(prompt_scores), None), logprobs)
            return (
                {"text": echo + text, "finish_reason": finish, "logprobs": logprobs},
                summary,
                self._ead(events, summary),
            )
        reasoning = ""
        if self.thinking is not None:
            reasoning, text = split_reasoning(text, self.thinking)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.tools:
            content, calls = split_answer(text, self.tools, self.parallel, self.prefill)
            if calls:
                message = {
                    "role": "assistant",
                    "content": content or None,
                    "tool_calls": [call.as_openai() for call in calls],
                }
                finish = _finish(summary, called=True)
        if reasoning:  # as llama-server: the field only where the model wrote reasoning
            message["reasoning_content"] = reasoning
        choice = {"message": message, "finish_reason": finish, "logprobs": logprobs}
        return choice, summary, self._ead(events, summary)

    def _ead(self, events: list[TokenEvent], summary: Summary) -> dict[str, Any]:
        return {
            "tokens": [token_fields(event) for event in events],
            "summary": asdict(summary),
            "seed": self.seed,
        }

    def whole(self, answers: list[tuple[dict[str, Any], Summary, dict[str, Any]]]) -> dict[str, Any]:
        """The whole answer of these choices (``choice``'s), in order, the usage of them all: one
        choice's ``ead`` fields beside it, as before OpenAI's ``n``; each of several choices' in it."""
        several = len(answers) > 1
        choices = [
            {"index": index, **choice, **({"ead": ead} if several else {})}
            for index, (choice, _, ead) in enumerate(answers)
        ]
        extra = {} if several else {"ead": answers[0][2]}
        envelope = self._envelope(
            self.kind, None, usage=_usage([summary for _, summary, _ in answers], self.per_prompt), **extra
        )
        return envelope | {"choices": choices}

    def _done(self, summary: Summary) -> None:
        log_answered(self.log, self.path, summary)


def prompt_progress(progress: PromptProgress) -> dict[str, int]:
    """A prompt's progress as llama-server's ``prompt_progress`` spells it (``processed``: the tokens in
    the cache, those it kept included)."""
    return {
        "total": progress.total,
        "cache": progress.cached,
        "processed": progress.read,
        "time_ms": round(progress.seconds * 1000),
    }


@overload
def answer_messages(ticket: Ticket) -> AsyncIterator[Message]: ...
@overload
def answer_messages(ticket: Ticket, keep_alive: KeepAlive) -> AsyncIterator[Message | None]: ...


async def answer_messages(
    ticket: Ticket, keep_alive: KeepAlive | None = None
) -> AsyncIterator[Message | None]:
    """A streamed answer's messages from the engine, to the last (``Finished`` or ``Failed``); with a
    ``keep_alive``, None each time its timer runs out first (the stream is due its keep-alive event while
    the engine sends it nothing: queued, or in a slow batch or token). Closed before the last (its client
    went away: read it in ``contextlib.aclosing``), it cancels the job, and the engine stops after the
    token it is on."""
    ended = False
    try:
        while not ended:
            message = await ticket.next(None if keep_alive is None else keep_alive.wait())
            ended = isinstance(message, (Finished, Failed))
            yield message
    finally:
        if not ended:
            ticket.cancel()


async def collected(
    ticket: Ticket, request: Request, prompt_scores: list[PromptScores] | None = None
) -> tuple[list[Token], Summary] | None:
    """A whole answer's tokens and figures; None where its client left while it waited (the job then
    cancelled, as it is where a stop cuts the request off); a failed generation raised as its error. An
    echoed prompt's log-probabilities go to ``prompt_scores``."""
    tokens: list[Token] = []
    looked = time.monotonic()
    message: Message | None = None
    try:
        while True:
            message = await ticket.next(POLL_S)
            if time.monotonic() - looked >= POLL_S:  # tokens may come faster: look by the clock
                looked = time.monotonic()
                if await request.is_disconnected():
                    return None
            if message is None or isinstance(message, PromptProgress):
                continue
            if isinstance(message, PromptScores):
                if prompt_scores is not None:
                    prompt_scores.append(message)
            elif isinstance(message, Token):
                tokens.append(message)
            elif isinstance(message, Failed):
                raise error_of(message)
            else:
                return tokens, message.summary
    finally:
        if not isinstance(message, Finished):  # the client left, or a stop cut the request off
            ticket.cancel()


async def collected_calls(
    ticket: Ticket,
    request: Request,
    respelled: Callable[[ApiError], ApiError],
    tools: frozenset[str] | None,
    parallel: bool,
    prefill: str,
    thinking: bool | None = None,
) -> tuple[list[Token], Summary, str, list[ToolCall], str] | None:
    """A whole answer (``collected``) as ollama's routes write it: its tokens, figures, text outside the
    calls and calls (where ``tools`` are offered; each call's arguments an object, as ollama sends them),
    and a thinking model's reasoning (``thinking``: ``Job.thinking``; the calls read from the content
    alone), a failed generation raised as its error ``respelled`` as their request spells the fields; None
    where its client left."""
    try:
        answer = await collected(ticket, request)
    except ApiError as error:
        raise respelled(error) from None
    if answer is None:
        return None
    tokens, summary = answer
    text, reasoning = "".join(token.event.text for token in tokens), ""
    if thinking is not None:
        reasoning, text = split_reasoning(text, thinking)
    if not tools:
        return tokens, summary, text, [], reasoning
    return tokens, summary, *split_answer(text, tools, parallel, prefill, objects_only=True), reasoning


def log_answered(log: Log, path: str, summary: Summary) -> None:
    """The one log line of an answered request."""
    log(
        f"POST {path} 200: {counted(summary.generated, 'token')} ({summary.finish_reason}), "
        f"prompt {summary.prompt_tokens} ({cached_tokens(summary)} cached), "
        f"large share {summary.large_share:.1%}, {summary.wall_s:.2f} s"
    )


def error_of(failed: Failed) -> ApiError:
    """A generation that could not go on: the request's fault (a 400 naming its field), or the server's."""
    if failed.param is not None:
        return ApiError(400, failed.message, code="invalid_value", param=failed.param)
    return ApiError(502, failed.message, kind="server_error", code="generation_failed")


def token_fields(event: TokenEvent) -> dict[str, Any]:
    """What a streamed chunk says of its token beside the text: which model wrote it, at what entropy."""
    fields = asdict(event)
    del fields["text"]
    return fields


def _usage(summaries: Sequence[Summary], per_prompt: int = 1) -> dict[str, Any]:
    """OpenAI's usage of an answer's choices, ``per_prompt`` of each prompt in turn: each prompt counted
    once (its first choice's read), the tokens of every choice."""
    firsts, generated = summaries[::per_prompt], sum(summary.generated for summary in summaries)
    read = sum(first.prompt_tokens for first in firsts)
    return {
        "prompt_tokens": read,
        "completion_tokens": generated,
        "total_tokens": read + generated,
        "prompt_tokens_details": {"cached_tokens": sum(cached_tokens(first) for first in firsts)},
    }


def _finish(summary: Summary, called: bool = False) -> str:
    """OpenAI's finish reasons: 'length' at the token limit or the context's end, calls made before the
    cut or not (as llama-server says: the model may have had more to write), else 'tool_calls' where
    the answer ``called`` a tool, else 'stop'."""
    if summary.finish_reason == "length":
        return "length"
    return "tool_calls" if called else "stop"
