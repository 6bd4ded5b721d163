"""``ead serve``: the loaded models behind an OpenAI-compatible HTTP API, and a page that shows them.

Chat and text completions, streamed (server-sent events) or not, ``/v1/models`` and ``/health``, on
FastAPI and uvicorn. Every answer comes from the engine ``ead generate`` uses: one decoder per request
over the runners loaded once. llama.cpp contexts cannot be shared, so one generation runs at a time, on
one engine thread; the others wait in a FIFO queue with a bound, past which a request gets 503 at once.
A request is checked before it queues (a bad one never waits): its JSON, its ``ead`` options (by the
rules of the command line's), its prompt against the context. The engine keeps whatever prefix the
previous request left in both models' caches (``Runner.align``); a chat whose client sends the whole
conversation each turn reads only the new turn's tokens. A client that goes away stops its generation
at the next token.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import math
import signal
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus
from starlette.exceptions import HTTPException as StarletteHTTPException

from .calibrate import with_saved_tau
from .decoder import Summary, TokenEvent
from .engine import GenerationOptions, PolicyOptions, build_decoder
from .errors import EadError
from .policies import parse_tau
from .prompt import check_fits, check_prompt_text, encode_rendered, render_chat
from .runner import Runner
from .sampling import SamplingParams

MODEL_ID = "ead"  # the one model this server lists; a request may name any model (as llama-server does)
MAX_BODY_BYTES = 4 * 2**20  # a request body past this is refused (413)
POLL_S = 0.25  # how often a non-streamed request looks whether its client is still there


@dataclass(frozen=True)
class ServeOptions:
    """Where and how to listen; checked when made, before any model loads."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    queue: int = 16  # requests that may wait while one generates
    reuse: bool = True  # keep the cached prefix a prompt shares with the previous request

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise EadError(f"--port must be in [0, 65535], got {self.port}", exit_code=2)
        if self.queue < 0:
            raise EadError(f"--queue must be at least 0, got {self.queue}", exit_code=2)
        if self.api_key is not None and not self.api_key.strip():
            raise EadError("--api-key is empty", exit_code=2)

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


Log = Callable[[str], None]  # one line per request, and one per error: never a traceback


# The engine: one generation at a time, requests in FIFO order, messages back to the event loop.


@dataclass(frozen=True)
class Job:
    """One generation to run: the prompt's tokens, and the options it was asked with (already checked)."""

    prompt: list[int]
    policy: PolicyOptions
    generation: GenerationOptions


@dataclass(frozen=True)
class Finished:
    """The generation ended (by itself, at its limit, or because its client went away)."""

    summary: Summary


@dataclass(frozen=True)
class Failed:
    """The generation could not go on (a remote model lost, a llama.cpp failure): one line why."""

    message: str


class QueueFull(Exception):
    """Every place in the queue is taken; ``retry_after``: seconds after which one may be free."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full: try again in {retry_after} s")
        self.retry_after = retry_after


class Ticket:
    """A request's end of its job: the messages the engine thread sends (token events, then one
    ``Finished`` or ``Failed``), and ``cancel`` for when its client goes away."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.messages: asyncio.Queue[TokenEvent | Finished | Failed] = asyncio.Queue()
        self.cancelled = threading.Event()
        self._loop = loop

    def send(self, message: TokenEvent | Finished | Failed) -> None:
        """From the engine thread. Once the server's event loop is gone, nobody reads: stop."""
        try:
            self._loop.call_soon_threadsafe(self.messages.put_nowait, message)
        except RuntimeError:  # the loop is closed (a forced stop)
            self.cancel()

    def cancel(self) -> None:
        self.cancelled.set()


def _hold_signals() -> None:
    """The engine thread leaves SIGINT and SIGTERM to the main thread, where uvicorn handles them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


class Engine:
    """The runners and one thread that generates with them, one job after another, in order.

    ``queue``: jobs that may wait while one runs; ``submit`` refuses more. Each prompt is tokenized
    alone; ``Runner.align`` keeps the prefix it shares with what the caches hold (the previous prompt and
    answer), which a chat client's next turn shares up to its new message. Logits are not bit-for-bit the
    same for another batch split (llama-server's ``cache_prompt`` warns of it too): a prompt the caches
    hold whole has its last token read again alone, and where two tokens nearly tie, its answer may
    differ from a fresh run's; ``reuse=False`` reads every prompt whole, as ``ead generate`` does.
    """

    def __init__(self, runners: Sequence[Runner], *, queue: int, log: Log, reuse: bool = True) -> None:
        self.runners = tuple(runners)
        self.queue = queue
        self.log = log
        self.reuse = reuse
        self._executor = ThreadPoolExecutor(1, "ead-engine", initializer=_hold_signals)
        self._lock = threading.Lock()
        self._pending = 0  # accepted, not yet finished (the running job included)
        self._mean_s = 1.0  # recent seconds per job: the Retry-After estimate
        self._stopped = threading.Event()

    @property
    def n_ctx(self) -> int:
        return min(runner.n_ctx for runner in self.runners)

    @property
    def pending(self) -> int:
        return self._pending

    def submit(self, job: Job, ticket: Ticket) -> None:
        with self._lock:
            if self._pending > self.queue:
                raise QueueFull(max(1, math.ceil(self._mean_s * (self._pending - self.queue))))
            self._pending += 1
        self._executor.submit(self._run, job, ticket)

    def _run(self, job: Job, ticket: Ticket) -> None:
        began = time.perf_counter()
        try:
            if ticket.cancelled.is_set() or self._stopped.is_set():
                why = "the server is stopping" if self._stopped.is_set() else "its client went away"
                self.log(f"skipped a waiting request: {why}")
                return
            ticket.send(self._generate(job, ticket))
        except Exception as error:  # the thread must live on: whatever failed is this job's answer
            ticket.send(Failed(str(error) or type(error).__name__))
        finally:
            with self._lock:
                self._pending -= 1
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.perf_counter() - began)

    def _generate(self, job: Job, ticket: Ticket) -> Finished | Failed:
        if not self.reuse:  # read every prompt whole, as ead generate does: the same logits to the bit
            for runner in self.runners:
                runner.truncate(0)
        decoder = build_decoder(self.runners, job.policy, job.generation)
        failure = None
        try:
            with closing(decoder.run(job.prompt)) as run:  # align keeps what the caches share with it
                for event in run:
                    ticket.send(event)
                    if ticket.cancelled.is_set() or self._stopped.is_set():
                        break
        except EadError as error:
            failure = Failed(str(error))
        summary = decoder.summary()
        if self._stopped.is_set() or ticket.cancelled.is_set():
            why = "the server is stopping" if self._stopped.is_set() else "the client went away"
            self.log(f"stopped after {summary.generated} tokens: {why}")
        return failure or Finished(summary)

    def close(self) -> None:
        """Stop the thread: after a clean shutdown every job accepted is done; after a forced one (a second
        Ctrl-C) the running job stops after its token and those waiting are dropped."""
        self._stopped.set()
        self._executor.shutdown(wait=True, cancel_futures=True)


# Requests: OpenAI's fields (others ignored, as OpenAI clients expect), and ead's own options.


class EadOptions(BaseModel):
    """The ``ead`` object of a request: policy options of ``ead generate``, checked by the same rules."""

    model_config = ConfigDict(extra="forbid", strict=True)

    mode: Literal["ead", "small", "large", "spec"] | None = None
    policy: Literal["gate", "ead", "lookahead"] | None = None
    tau: float | list[float] | str | None = None
    window: int | None = None
    min_run: int | None = None
    burst: int | Literal["line", "adaptive"] | None = None
    switch_point: Literal["before", "after"] | None = None
    normalize: bool | None = None
    draft: int | None = None
    draft_entropy_stop: float | None = None
    verify: float | None = None
    pattern: list[str] | None = None
    tau_range: tuple[float, float] | None = None
    top_k: int | None = None
    min_p: float | None = None

    def policy_changes(self) -> dict[str, Any]:
        """The fields given, as PolicyOptions takes them."""
        given = self.model_dump(exclude_none=True, exclude={"top_k", "min_p"})
        if isinstance(given.get("tau"), str):
            try:
                given["tau"] = parse_tau(given["tau"])
            except ValueError:
                raise EadError(f"ead.tau must be a number of bits or a list, got {self.tau!r}") from None
        elif isinstance(given.get("tau"), list):
            given["tau"] = tuple(given["tau"])
        if "pattern" in given:
            given["patterns"] = tuple(given.pop("pattern"))
        return given


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    stream: bool = False
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, Field(ge=0, le=2**32 - 2)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    ead: EadOptions | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]


class CompletionRequest(_Request):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ApiError(Exception):
    """An HTTP error with OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.headers = status, message, kind, code, headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": None, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _parse(model: type[BaseModel], data: bytes) -> Any:
    """A request body (JSON whatever its content type says, as curl -d sends it) into its schema;
    pydantic's first complaint as one line otherwise."""
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "json_invalid":
            message = f"the body is not valid JSON: {first['ctx']['error']}"
            raise ApiError(400, message, code="invalid_json") from None
        where = ".".join(str(part) for part in first["loc"])
        if first["type"] == "model_type" and not where:
            raise ApiError(400, "the body must be a JSON object", code="invalid_json") from None
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise ApiError(400, message, code="invalid_value") from None


# The app.


@dataclass(frozen=True)
class Defaults:
    """What a request gets for what it leaves out: the command line's options (before a saved τ)."""

    policy: PolicyOptions
    generation: GenerationOptions


class _BodyLimit:
    """Refuse a request body over ``limit`` bytes (413) before it is read whole; the app's outermost layer."""

    def __init__(self, app: Any, limit: int, log: Log) -> None:
        self.app, self.limit, self.log = app, limit, log

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = ApiError(413, f"the request body is over {self.limit} bytes", code="body_too_large")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            self.log(f"error: {scope['method']} {scope['path']} 413: {too_large.message}")
            return await too_large.response()(scope, receive, send)
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise too_large
            return message

        try:
            return await self.app(scope, counted, send)
        except asyncio.CancelledError:  # a forced stop (a second Ctrl-C) cancels open streams: no traceback
            return None


def create_app(engine: Engine, defaults: Defaults, options: ServeOptions, log: Log) -> FastAPI:
    """The ASGI app over a started engine."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    roles = {runner.name: runner.label for runner in engine.runners}

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        log(f"error: {request.method} {request.url.path} {error.status}: {error.message}")
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return await api_error(request, ApiError(error.status_code, str(error.detail), kind=kind))

    async def authorized(request: Request) -> None:
        if options.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        key = options.api_key.encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key):
            raise ApiError(
                401, "a valid API key is needed: Authorization: Bearer KEY", code="invalid_api_key"
            )

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("ead_cli").joinpath("static/index.html").read_text("utf-8"))

    @app.get("/favicon.ico")
    async def icon() -> Response:
        return Response(status_code=204)  # browsers ask for one; the page has none

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "generating": engine.pending > 0, "waiting": max(engine.pending - 1, 0)}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": MODEL_ID,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ead",
                    "ead": {"models": roles, "n_ctx": engine.n_ctx, "policy": asdict(defaults.policy)},
                }
            ],
        }

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat(request: Request) -> Any:
        body = _parse(ChatRequest, await request.body())
        messages = [{"role": message.role, "content": message.text()} for message in body.messages]
        _check(lambda: check_prompt_text("".join(message["content"] for message in messages)))
        rendered = _check(lambda: render_chat(engine.runners[0], messages))
        if rendered is None:
            message = f"{engine.runners[0].label} has no chat template: use /v1/completions"
            raise ApiError(400, message, code="no_template")
        return await _answer(body, request, rendered, "chat.completion")

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request) -> Any:
        body = _parse(CompletionRequest, await request.body())
        text = _check(lambda: check_prompt_text(body.text()))
        return await _answer(body, request, text, "text_completion")

    async def _answer(body: _Request, request: Request, text: str, kind: str) -> Any:
        job = Job(encode_rendered(engine.runners[0], text), *_settings(body))
        try:
            check_fits(job.prompt, engine.n_ctx)
        except EadError as error:
            raise ApiError(400, str(error), code="context_length_exceeded") from None
        ticket = Ticket(asyncio.get_running_loop())
        try:
            engine.submit(job, ticket)
        except QueueFull as full:
            raise ApiError(
                503,
                str(full),
                kind="server_error",
                code="queue_full",
                headers={"Retry-After": str(full.retry_after)},
            ) from None
        reply = _Reply(kind, request.url.path, log)
        if body.stream:
            return EventSourceResponse(reply.stream(ticket), ping=15)
        return await reply.whole(ticket, request)

    def _settings(body: _Request) -> tuple[PolicyOptions, GenerationOptions]:
        """The request's options over the defaults, checked by the command line's rules (400 if bad)."""
        ead = body.ead or EadOptions()
        max_tokens = body.max_completion_tokens or body.max_tokens or defaults.generation.max_tokens
        if max_tokens > engine.n_ctx:
            message = f"max_tokens must be at most the context, {engine.n_ctx} tokens"
            raise ApiError(400, message, code="invalid_value")
        base = defaults.generation.sampling

        def settings() -> tuple[PolicyOptions, GenerationOptions]:
            policy = replace(defaults.policy, **ead.policy_changes(), levels=len(engine.runners))
            policy = with_saved_tau(policy, engine.runners)[0]
            sampling = SamplingParams(
                temp=base.temp if body.temperature is None else body.temperature,
                top_k=base.top_k if ead.top_k is None else ead.top_k,
                top_p=base.top_p if body.top_p is None else body.top_p,
                min_p=base.min_p if ead.min_p is None else ead.min_p,
                seed=base.seed if body.seed is None else body.seed,
            )
            stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
            generation = replace(defaults.generation, sampling=sampling, max_tokens=max_tokens, stop=stop)
            build_decoder(engine.runners, policy, generation)  # only to check: a decoder costs nothing
            return policy, generation

        return _check(settings)

    return app


def _check(make: Callable[[], Any]) -> Any:
    """``make()``, with the command line's usage errors turned into 400s."""
    try:
        return make()
    except EadError as error:
        raise ApiError(400, str(error), code="invalid_value") from None


class _Reply:
    """One request's answer in OpenAI's shapes, from its ticket's messages."""

    def __init__(self, kind: str, path: str, log: Log) -> None:
        self.kind, self.path, self.log = kind, path, log
        self.id = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.chat = kind == "chat.completion"

    def _envelope(self, object_kind: str, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_kind,
            "created": self.created,
            "model": MODEL_ID,
            "choices": [{"index": 0, **choice}],
            **extra,
        }

    def _chunk(self, text: str | None, finish: str | None, **extra: Any) -> str:
        if self.chat:
            delta = {} if text is None else {"role": "assistant", "content": text}
            choice = {"delta": delta, "finish_reason": finish, "logprobs": None}
            return json.dumps(self._envelope("chat.completion.chunk", choice, **extra), ensure_ascii=False)
        choice = {"text": text or "", "finish_reason": finish, "logprobs": None}
        return json.dumps(self._envelope("text_completion", choice, **extra), ensure_ascii=False)

    async def stream(self, ticket: Ticket) -> AsyncIterator[dict[str, str]]:
        """Server-sent events: a chunk per token with its model, the last one with usage and figures."""
        ended = False
        try:
            while True:
                message = await ticket.messages.get()
                if isinstance(message, TokenEvent):
                    yield {"data": self._chunk(message.text, None, ead=_token_fields(message))}
                    continue
                if isinstance(message, Failed):
                    self.log(f"error: POST {self.path}: {message.message}")
                    body = {"message": message.message, "type": "server_error", "param": None, "code": None}
                    yield {"data": json.dumps({"error": body})}
                    ended = True
                    return
                self._done(message.summary)
                extra = {"usage": _usage(message.summary), "ead": {"summary": asdict(message.summary)}}
                yield {"data": self._chunk(None, _finish(message.summary), **extra)}
                ended = True
                yield {"data": "[DONE]"}
                return
        finally:
            if not ended:  # the client went away: the engine stops after the token it is on
                ticket.cancel()

    async def whole(self, ticket: Ticket, request: Request) -> JSONResponse:
        """The whole answer at once; a client that leaves while it waits cancels it."""
        events: list[TokenEvent] = []
        looked = time.monotonic()
        while True:
            try:
                message = await asyncio.wait_for(ticket.messages.get(), POLL_S)
            except asyncio.TimeoutError:
                message = None
            if time.monotonic() - looked >= POLL_S:  # tokens may come faster than that: look by the clock
                looked = time.monotonic()
                if await request.is_disconnected():
                    ticket.cancel()
                    return JSONResponse({}, status_code=499)
            if message is None:
                continue
            if isinstance(message, TokenEvent):
                events.append(message)
            elif isinstance(message, Failed):
                raise ApiError(502, message.message, kind="server_error", code="generation_failed")
            else:
                break
        summary = message.summary
        self._done(summary)
        text = "".join(event.text for event in events)
        finish = _finish(summary)
        choice = (
            {"message": {"role": "assistant", "content": text}, "finish_reason": finish, "logprobs": None}
            if self.chat
            else {"text": text, "finish_reason": finish, "logprobs": None}
        )
        ead = {"tokens": [_token_fields(event) for event in events], "summary": asdict(summary)}
        return JSONResponse(self._envelope(self.kind, choice, usage=_usage(summary), ead=ead))

    def _done(self, summary: Summary) -> None:
        reused = summary.prompt_tokens - summary.models[0].prefill_tokens
        self.log(
            f"POST {self.path} 200: {summary.generated} tokens ({summary.finish_reason}), "
            f"prompt {summary.prompt_tokens} ({reused} cached), large share {summary.large_share:.1%}, "
            f"{summary.wall_s:.2f} s"
        )


def _token_fields(event: TokenEvent) -> dict[str, Any]:
    """What a streamed chunk says of its token beside the text: which model wrote it, at what entropy."""
    fields = asdict(event)
    del fields["text"]
    return fields


def _usage(summary: Summary) -> dict[str, int]:
    return {
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.generated,
        "total_tokens": summary.prompt_tokens + summary.generated,
    }


def _finish(summary: Summary) -> str:
    """OpenAI's finish reasons: 'length' at the token limit or the context's end, else 'stop'."""
    return "length" if summary.finish_reason == "length" else "stop"


def listen(options: ServeOptions) -> socket.socket:
    """The listening socket (port 0: any free one), bound before the first line says where it is."""
    try:
        return socket.create_server(
            (options.host, options.port),
            family=socket.AF_INET6 if ":" in options.host else socket.AF_INET,
            reuse_port=False,
        )
    except OSError as error:
        raise EadError(f"cannot listen on {options.host}:{options.port}: {error.strerror or error}") from None


def serve(
    runners: Sequence[Runner],
    defaults: Defaults,
    options: ServeOptions,
    *,
    say: Callable[[str], None],
) -> None:
    """Serve until SIGINT or SIGTERM; then stop accepting, finish every request accepted, return."""
    engine = Engine(runners, queue=options.queue, log=say, reuse=options.reuse)
    app = _BodyLimit(create_app(engine, defaults, options, say), MAX_BODY_BYTES, say)
    # Streams end when their answer does, not when uvicorn starts to shut down (sse-starlette's default).
    AppStatus.disable_automatic_graceful_drain()
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", ws="none")
    server = uvicorn.Server(config)
    # From before the first line on, a signal asks uvicorn to stop (while it runs, its own handlers do; it
    # re-raises the signal when done, and this handler takes that too): the stop is clean, exit 0.
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with listen(options) as sock:
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

