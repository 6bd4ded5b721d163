"""The routes of ``ead serve`` and the answers in OpenAI's shapes (whole, or chunk by chunk as
server-sent events), each token with the ``ead`` fields that say which model wrote it."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..calibrate import with_saved_tau
from ..decoder import Summary, TokenEvent
from ..engine import GenerationOptions, PolicyOptions, build_decoder
from ..errors import EadError
from ..prompt import check_fits, check_prompt_text, encode_rendered, render_chat
from ..sampling import SamplingParams
from .engine import Engine, Failed, Job, Log, QueueFull, Ticket
from .schemas import ApiError, ChatRequest, CompletionBase, CompletionRequest, EadOptions, parse

if TYPE_CHECKING:
    from . import ServeOptions

MODEL_ID = "ead"  # the one model this server lists; a request may name any model (as llama-server does)
MAX_BODY_BYTES = 4 * 2**20  # a request body past this is refused (413)
POLL_S = 0.25  # how often a non-streamed request looks whether its client is still there


@dataclass(frozen=True)
class Defaults:
    """What a request gets for what it leaves out: the command line's options (before a saved τ)."""

    policy: PolicyOptions
    generation: GenerationOptions


class BodyLimit:
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
        body = parse(ChatRequest, await request.body())
        messages = [{"role": message.role, "content": message.text()} for message in body.messages]
        _check(lambda: check_prompt_text("".join(message["content"] for message in messages)))
        rendered = _check(lambda: render_chat(engine.runners[0], messages))
        if rendered is None:
            message = f"{engine.runners[0].label} has no chat template: use /v1/completions"
            raise ApiError(400, message, code="no_template")
        return await _answer(body, request, rendered, "chat.completion")

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request) -> Any:
        body = parse(CompletionRequest, await request.body())
        text = _check(lambda: check_prompt_text(body.text()))
        return await _answer(body, request, text, "text_completion")

    async def _answer(body: CompletionBase, request: Request, text: str, kind: str) -> Any:
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

    def _settings(body: CompletionBase) -> tuple[PolicyOptions, GenerationOptions]:
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
