"""``ead serve``: the loaded models behind an OpenAI-compatible HTTP API, and a page that shows them.

Chat and text completions, streamed (server-sent events) or not, ``/v1/models`` and ``/health``,
llama-server's ``/tokenize``, ``/detokenize`` and ``/metrics`` (``tokens.py``, ``metrics.py``) and its
``/completion``, ``/props`` and ``/apply-template`` (``native.py``), OpenAI's Responses API
(``responses.py``), ollama's API (``ollama.py``), Anthropic's Messages API (``anthropic.py``), embeddings
with ``--embeddings`` (OpenAI's, llama-server's and ollama's routes; ``embedding.py``), on FastAPI and
uvicorn. Every answer comes from the engine ``ead generate`` uses: one decoder per request
over the runners loaded once, on one engine thread (``engine.py``). A request is checked before it queues
(a bad one never waits): its JSON (``schemas.py``), its ``ead`` options (by the rules of the command
line's), its prompt against the context (``app.py``). The engine keeps whatever prefix the previous
request left in both models' caches (``Runner.align``); a chat whose client sends the whole conversation
each turn reads only the new turn's tokens. A client that goes away stops its generation at the next token.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import uvicorn
from sse_starlette.sse import AppStatus

from ..embedding import Embedder, model_to_embed
from ..errors import EadError, quoted
from ..options import check_api_key
from ..runner import Runner
from .anthropic import add_routes as add_anthropic_routes
from .app import (
    MAX_BODY_BYTES,
    MODEL_ID,
    PAGE_ORIGIN,
    Defaults,
    Guard,
    add_llama_server_aliases,
    create_app,
    http_protocol,
)
from .engine import Engine
from .native import add_routes as add_native_routes
from .ollama import add_routes as add_ollama_routes
from .responses import add_routes as add_responses_routes

if not hasattr(AppStatus, "disable_automatic_graceful_drain"):  # before 3.2, streams end at a stop
    raise ImportError("ead serve needs sse-starlette 3.2 or newer", name="sse-starlette>=3.2")

__all__ = ["Defaults", "ServeOptions", "listen", "serve"]


@dataclass(frozen=True)
class ServeOptions:
    """Where and how to listen; checked when made, before any model loads."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    queue: int = 16  # requests that may wait while one generates
    reuse: bool = True  # keep the cached prefix a prompt shares with the previous request
    cors_origins: tuple[str, ...] = ()  # web pages (scheme://host[:port]) that may use the server
    any_model: bool = False  # answer a request whatever model it names (as llama-server does)
    shutdown_timeout: float = 30.0  # seconds a stop waits for open requests before it cuts them off
    read_timeout: float = 30.0  # seconds a request's head may take to come whole, its body between parts
    metrics: bool = False  # GET /metrics answers (else a 501, as llama-server's without --metrics)
    embeddings: bool = False  # the embedding routes answer (else a 501, as llama-server's without it)
    # seconds a stream may send no event before a keep-alive one (0: at every batch or token that sends none)
    ping_interval: float = 10.0

    def __post_init__(self) -> None:
        if not self.host.strip():  # '' had listened on every interface, its warning naming no address
            raise EadError("--host is empty: give an address (0.0.0.0: every interface)", exit_code=2)
        if not 0 <= self.port <= 65535:
            raise EadError(f"--port must be in [0, 65535], got {self.port}", exit_code=2)
        if self.queue < 0:
            raise EadError(f"--queue must be at least 0, got {self.queue}", exit_code=2)
        check_api_key(self.api_key, "--api-key")
        if self.api_key is not None and "," in self.api_key:  # not taken as one key unsaid
            message = (
                "--api-key holds a comma: llama-server reads a comma-separated list of keys there, ead serve "
                "takes one key"
            )
            raise EadError(message, exit_code=2)
        for flag, seconds in (
            ("--shutdown-timeout", self.shutdown_timeout),
            ("--read-timeout", self.read_timeout),
        ):
            if not 0 < seconds <= 86400:
                raise EadError(f"{flag} must be in (0, 86400] seconds, got {seconds}", exit_code=2)
        if not 0 <= self.ping_interval <= 86400:
            message = f"--ping-interval must be in [0, 86400] seconds, got {self.ping_interval}"
            raise EadError(message, exit_code=2)
        for origin in self.cors_origins:
            if origin != "*" and not PAGE_ORIGIN.fullmatch(origin):
                raise EadError(
                    f"--cors-origin takes scheme://host[:port] (or *), got {quoted(origin)}", exit_code=2
                )

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def listen(options: ServeOptions) -> socket.socket:
    """The listening socket (port 0: any free one), bound before the models load (as llama-server binds
    its port first), so a port in use is the run's one line, not a failure after minutes of loading."""
    try:
        return socket.create_server(
            (options.host, options.port),
            family=socket.AF_INET6 if ":" in options.host else socket.AF_INET,
            reuse_port=False,
        )
    except OSError as error:  # the system's reason alone: create_server adds the address, said already
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise EadError(f"cannot listen on {options.host}:{options.port}: {reason}") from None


class _Server(uvicorn.Server):
    """uvicorn's server, telling the engine when a stop begins: what the stop cuts off later says so."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: object) -> None:
        self.engine.stopping.set()
        super().handle_exit(sig, frame)  # type: ignore[arg-type]


def _not_the_plain_400(record: logging.LogRecord) -> bool:
    """uvicorn's warning before its plain-text 400, which the JSON one replaces with a line that says why."""
    return record.getMessage() != "Invalid HTTP request received."


def _not_an_unfinished_answer(record: logging.LogRecord) -> bool:
    """uvicorn's error when the app returns before its answer's end, which it then closes: the Guard does so
    only after its own line that says why (a failure mid-stream)."""
    return record.getMessage() != "ASGI callable returned without completing response."


def _not_a_write_to_a_lost_client(record: logging.LogRecord) -> bool:
    """asyncio's warning for each write to a socket its client closed, after the fifth: the tokens a stream
    had queued when its client left go out within one turn of the loop, some 20 such lines a stream, none
    saying which; the request's own line says its client went away."""
    return record.getMessage() != "socket.send() raised exception."


def serve(
    runners: Sequence[Runner],
    defaults: Defaults,
    options: ServeOptions,
    sock: socket.socket,
    *,
    say: Callable[[str], None],
) -> None:
    """Serve on ``sock`` (``listen``'s) until SIGINT or SIGTERM; then stop accepting, finish every
    request accepted, return."""
    embedder = Embedder(model_to_embed(runners)) if options.embeddings else None
    engine = Engine(runners, queue=options.queue, log=say, reuse=options.reuse, embedder=embedder)
    api = create_app(engine, defaults, options, say)
    add_ollama_routes(api, engine, options.any_model)
    add_native_routes(api, engine, defaults, options)
    add_responses_routes(api)
    add_anthropic_routes(api, engine.runners[0])
    add_llama_server_aliases(api)  # the routes above, under llama-server's other paths
    app = Guard(api, options, MAX_BODY_BYTES, say, stopping=engine.stopping.is_set)
    # Streams end when their answer does, not when uvicorn starts to shut down (sse-starlette's default).
    AppStatus.disable_automatic_graceful_drain()
    config = uvicorn.Config(
        app,
        http=http_protocol(say, options.read_timeout, MAX_BODY_BYTES),  # h11 wherever httptools is too
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        timeout_graceful_shutdown=options.shutdown_timeout,  # then open requests are cut off
    )
    logging.getLogger("uvicorn.error").addFilter(_not_the_plain_400)  # http_protocol logs its own line
    logging.getLogger("uvicorn.error").addFilter(_not_an_unfinished_answer)  # and so does the Guard
    logging.getLogger("asyncio").addFilter(_not_a_write_to_a_lost_client)
    server = _Server(config, engine)
    # From before the first line on, a signal asks uvicorn to stop (while it runs, its own handlers do; it
    # re-raises the signal when done, and this handler takes that too): the stop is clean, exit 0.
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        if not options.loopback and options.api_key is None:
            warning = "without --api-key: anyone who can reach it can use it"
            say(f"warning: listening on {options.host} {warning}")
        say(f"ead serve: http://{shown}:{port}/v1 (model '{MODEL_ID}'), the page at http://{shown}:{port}/")
        server.run(sockets=[sock])
    finally:
        engine.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    say("ead serve: stopped")
