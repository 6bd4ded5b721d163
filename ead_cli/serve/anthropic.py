"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``), for Claude Code and the
``anthropic`` SDK, over the same engine and the same request preparation as OpenAI's: a request checked in
Anthropic's shape, spelled as the OpenAI chat request it means and prepared as one (``app.Requests``: the
same checks, template, tool calling, tokenizing and decoding options), and its answer written in
Anthropic's shapes: a message of content blocks, or server-sent events named by their type, each token's
delta with the ``ead`` fields that say which model wrote it."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from ..decoder import Summary, TokenEvent
from ..thinking import ReasoningSplitter, Split, split_reasoning
from .app import (
    ANTHROPIC_PATH,
    KeepAlive,
    Requests,
    answer_messages,
    collected,
    error_of,
    log_answered,
    token_fields,
)
from .engine import Failed, Job, Log, PromptProgress, Ticket, Token
from .metrics import cached_tokens
from .native import stop_of
from .schemas import MAX_COUNT, ApiError, ChatRequest, parse, unsupported
from .tools import ArgumentsDelta, CallStart, HeldBlank, Piece, ToolCall, ToolCallReader

if TYPE_CHECKING:
    from ..runner import Runner

# The OpenAI fields an Anthropic request's own are spelled as, for the OpenAI checks' 400s
ANTHROPIC_SPELLING = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "reasoning_budget_tokens": "thinking.budget_tokens",
}
# What a content block that is no text, call or call's result is said to be in a 400
NOT_TEXT = {"image": "the models read text", "document": "the models read text"}


class Block(BaseModel):
    """A content block of a message (or of a tool's result): ``text``, ``tool_use`` (an assistant's call),
    ``tool_result`` (a user's answer to one) or ``thinking`` (an assistant's earlier reasoning, its
    ``reasoning_content`` as llama-server takes it; a ``redacted_thinking`` block, encrypted, is left out).
    Their other fields (``signature``, ``cache_control``, ``citations``) are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Annotated[str, Field(max_length=64)]
    text: str | None = None
    thinking: str | None = None
    id: Annotated[str, Field(max_length=256)] | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    input: dict[str, Any] | None = None
    tool_use_id: Annotated[str, Field(max_length=256)] | None = None
    content: str | list[Block] | None = None

    def needed(self, field: str, where: str) -> Any:
        """The block's ``field``, or a 400 naming the block."""
        value = getattr(self, field)
        if value is None:
            message = f"{where}: a {self.type} block needs its {field}"
            raise ApiError(400, message, code="invalid_value", param=where)
        return value

    def refused(self, where: str, whose: str) -> ApiError:
        """The 400 of a block ead serve does not take in ``whose`` content (a role's message, the system
        prompt, a tool's result)."""
        kind = self.type if self.type.isidentifier() else repr(self.type)
        if self.type in NOT_TEXT:
            return unsupported(where, f"{kind} blocks are not supported ({NOT_TEXT[self.type]})")
        if self.type in ("tool_use", "tool_result"):
            return unsupported(where, f"a {kind} block in {whose} is not supported")
        return unsupported(where, f"{kind} blocks are not supported")


def _texts(content: str | list[Block], where: str, whose: str) -> str:
    """The text of the system prompt or a tool's result (``whose``): a string, or text blocks (any other a
    400)."""
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content):
        if block.type != "text":
            raise block.refused(f"{where}.{i}", whose)
        texts.append(block.needed("text", f"{where}.{i}"))
    return "".join(texts)


class AnthropicMessage(BaseModel):
    """A turn of the conversation; a ``system`` one among them (Claude Code's beta
    ``mid-conversation-system``) is a system message where it stands, as the chat route takes one."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["user", "assistant", "system"]
    content: str | Annotated[list[Block], Field(max_length=4096)]

    def as_openai(self, where: str) -> list[dict[str, Any]]:
        """The OpenAI messages this one means: an assistant's text, calls (``tool_calls``) and reasoning
        (``reasoning_content``); a user's tool results (each a ``tool`` message, in order) and then its
        text."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        if self.role == "system":
            text = _texts(self.content, f"{where}.content", "a system message")
            return [{"role": "system", "content": text}]
        texts, calls, results, thoughts = [], [], [], []
        for i, block in enumerate(self.content):
            at = f"{where}.content.{i}"
            if block.type == "text":
                texts.append(block.needed("text", at))
            elif self.role == "assistant" and block.type == "thinking":
                thoughts.append(block.needed("thinking", at))
            elif self.role == "assistant" and block.type == "redacted_thinking":
                continue
            elif self.role == "assistant" and block.type == "tool_use":
                arguments = json.dumps(block.needed("input", at), ensure_ascii=False)
                function = {"name": block.needed("name", at), "arguments": arguments}
                calls.append({"id": block.needed("id", at), "type": "function", "function": function})
            elif self.role == "user" and block.type == "tool_result":
                result = _texts(block.content or "", f"{at}.content", "a tool's result")
                call = block.needed("tool_use_id", at)
                results.append({"role": "tool", "tool_call_id": call, "content": result})
            else:
                raise block.refused(at, f"a {self.role}'s message")
        text = "".join(texts)
        reasoning = {"reasoning_content": "".join(thoughts)} if thoughts else {}
        if calls:
            return [{"role": "assistant", "content": text or None, "tool_calls": calls, **reasoning}]
        if reasoning:
            return [{"role": "assistant", "content": text, **reasoning}]
        return [*results, *([{"role": self.role, "content": text}] if text or not results else [])]


class AnthropicTool(BaseModel):
    """A client tool (Anthropic's server tools, web search and the like, have a ``type`` of their own)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["custom"] | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.name, "parameters": self.input_schema}
        described = {"description": self.description} if self.description is not None else {}
        return {"type": "function", "function": {**function, **described}}


class AnthropicToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    def openai_fields(self) -> dict[str, Any]:
        """OpenAI's ``tool_choice`` (``any`` is its ``required``, ``tool`` a named function: a call
        forced, as the OpenAI route forces one) and ``parallel_tool_calls``. A 400 for a ``tool`` without
        its name."""
        if self.type == "tool" and self.name is None:
            message = "tool_choice.name: a tool choice of type 'tool' names the tool to call"
            raise ApiError(400, message, code="invalid_value", param="tool_choice.name")
        named = {"type": "function", "function": {"name": self.name}}
        fields: dict[str, Any] = {"tool_choice": {"any": "required", "tool": named}.get(self.type, self.type)}
        if self.disable_parallel_tool_use is not None:
            fields["parallel_tool_calls"] = not self.disable_parallel_tool_use
        return fields


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """``output_config``: its ``format`` is JSON mode (``response_format``); ``effort`` is ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    format: OutputFormat | None = None


class ThinkingConfig(BaseModel):
    """``thinking``: a thinking model's thinking on or off through its template (Qwen3's
    ``enable_thinking``); with ``enabled``, ``budget_tokens`` is llama.cpp's reasoning budget (the OpenAI
    routes' ``reasoning_budget_tokens``), as llama-server maps it: any count from 1, neither Anthropic's
    minimum of 1024 nor its bound of ``max_tokens`` enforced (a small model's thinking is worth cutting
    short; a budget past the answer's limit is never spent). Left out, the server's --reasoning-budget."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None

    def openai_fields(self) -> dict[str, Any]:
        """The chat request's fields this means: the template's variable, and the budget where enabled."""
        fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": self.type != "disabled"}}
        if self.type == "enabled" and self.budget_tokens is not None:
            fields["reasoning_budget_tokens"] = self.budget_tokens
        return fields


class AnthropicRequest(BaseModel):
    """A Messages request. ``max_tokens``, which Anthropic requires, may be left out: the server's
    ``--max-tokens``, as on the other routes. ``thinking`` turns a thinking model's thinking on or off, and
    budgets it (a model that does not think answers as it does); ``metadata`` and other fields are ignored,
    as the OpenAI routes ignore theirs. The sampling fields are checked as OpenAI's."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model: Annotated[str, Field(max_length=256)]
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | Annotated[list[Block], Field(max_length=4096)] | None = None
    max_tokens: Any = None
    stop_sequences: Any = None
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    stream: bool | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=128)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_config: OutputConfig | None = None
    thinking: ThinkingConfig | None = None
    ead: dict[str, Any] | None = None  # ead's options, as the OpenAI routes take them (checked there)

    def openai_body(self) -> bytes:
        """The OpenAI chat request this one means: the system text first, each message's OpenAI ones."""
        system = (
            []
            if self.system is None
            else [{"role": "system", "content": _texts(self.system, "system", "the system prompt")}]
        )
        messages = [
            openai for i, message in enumerate(self.messages) for openai in message.as_openai(f"messages.{i}")
        ]
        fields = {
            name: value
            for name, value in (
                ("model", self.model),
                ("max_tokens", self.max_tokens),
                ("stop", self.stop_sequences),
                ("temperature", self.temperature),
                ("top_p", self.top_p),
                ("top_k", self.top_k),
                ("ead", self.ead),
            )
            if value is not None
        }
        if self.tools is not None:
            fields["tools"] = [tool.as_openai() for tool in self.tools]
        if self.tool_choice is not None:
            fields |= self.tool_choice.openai_fields()
        if self.thinking is not None:
            fields |= self.thinking.openai_fields()
        if self.output_config is not None and self.output_config.format is not None:
            schema = {"name": "output", "schema": self.output_config.format.json_schema}
            fields["response_format"] = {"type": "json_schema", "json_schema": schema}
        return json.dumps({"messages": [*system, *messages], **fields}).encode()


def _respelled(error: ApiError) -> ApiError:
    """An OpenAI check's 400 naming the field as the Anthropic request spelled it."""
    return error.respelled(ANTHROPIC_SPELLING, "output_config.format.schema")


def _usage(summary: Summary) -> dict[str, int]:
    """An answer's usage as Anthropic counts it (and llama-server): ``input_tokens`` the prompt's tokens
    read, ``cache_read_input_tokens`` those the caches kept (the prompt is the two together)."""
    cached = cached_tokens(summary)
    return {
        "input_tokens": summary.prompt_tokens - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": summary.generated,
    }


def _thinking(reasoning: str) -> dict[str, Any]:
    """A thinking model's reasoning as Anthropic's ``thinking`` block, unsigned (as llama-server's)."""
    return {"type": "thinking", "thinking": reasoning, "signature": ""}


# The blocks a stream's deltas start, and a thinking block's signature, given before its stop
BLOCK_STARTS = {"text": {"type": "text", "text": ""}, "thinking": _thinking("")}
SIGNATURE = {"type": "signature_delta", "signature": ""}


def _tool_use(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """A call as Anthropic's ``tool_use`` block, its input ``given`` (whole: the call's arguments, an
    object by the reader's ``objects_only``; a stream's block starts with {} and deltas of the JSON)."""
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name, "input": given}


class _Message:
    """One request's answer in Anthropic's shapes: a message of content blocks, or its events."""

    def __init__(self, model: str, path: str, log: Log, job: Job, body: ChatRequest, runner: Runner) -> None:
        self.model, self.path, self.log, self.job, self.runner = model, path, log, job, runner
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.tools = body.tool_names()  # the names of the tools offered: calls are read out of the answer
        self.parallel = body.parallel_tool_calls is not False
        self.seed = job.generation.sampling.seed

    def _reader(self) -> ToolCallReader | None:
        return (
            ToolCallReader(self.tools, self.parallel, self.job.prefill, objects_only=True)
            if self.tools
            else None
        )

    def _finished(self, events: list[TokenEvent], summary: Summary, called: bool) -> dict[str, Any]:
        """The answer's log line said; its ``stop_reason`` and ``stop_sequence``: the token limit
        (``max_tokens``, calls made before the cut or not, as OpenAI's finish says ``length``), a call, a
        stop string, else the model's end."""
        log_answered(self.log, self.path, summary)
        stop_type, word = stop_of(self.runner, self.job.generation.stop, events, summary)
        reason = {"limit": "max_tokens", "word": "stop_sequence"}.get(stop_type, "end_turn")
        if called and reason != "max_tokens":
            reason = "tool_use"
        return {"stop_reason": reason, "stop_sequence": word if reason == "stop_sequence" else None}

    def _envelope(self, content: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            **fields,
        }

    async def whole(self, ticket: Ticket, request: Request) -> JSONResponse:
        """The message at once, its blocks in the order the model wrote them, read as the stream reads
        them (``_Blocks``, no event sent); a client that leaves while it waits cancels it."""
        try:
            answer = await collected(ticket, request)
        except ApiError as error:
            raise _respelled(error) from None
        if answer is None:
            return JSONResponse({}, status_code=499)
        tokens, summary = answer
        events = [token.event for token in tokens]
        text = "".join(event.text for event in events)
        thinking = self.job.thinking
        blocks, reader = _Blocks(), self._reader()
        blocks.split(Split(content=text) if thinking is None else split_reasoning(text, thinking), reader)
        blocks.end(reader)
        ead = {
            "tokens": [token_fields(event) for event in events],
            "summary": asdict(summary),
            "seed": self.seed,
        }
        stop = self._finished(events, summary, reader is not None and bool(reader.calls))
        usage = _usage(summary)
        return JSONResponse(self._envelope(blocks.content, **stop, usage=usage, ead=ead))

    async def stream(self, ticket: Ticket, keep_alive: KeepAlive) -> AsyncIterator[dict[str, str] | bytes]:
        """message_start, a ping, the content blocks (a text block's delta per token, a call as a
        tool_use block of input_json_deltas as its arguments are written), message_delta with the stop
        and usage, message_stop; a failure mid-answer ends it with an ``error`` event, as Anthropic's do.
        A ping each time ``keep_alive`` is due, whatever the engine does (queued, reading, holding text
        back), for byte watchdogs: Claude Code's content watchdog does not count pings."""
        start = self._envelope(
            [],
            stop_reason=None,
            stop_sequence=None,
            usage={"input_tokens": len(self.job.prompt), "output_tokens": 0},
        )
        yield _event("message_start", message=start)
        yield _event("ping")
        blocks = _Blocks()
        reader = self._reader()
        splitter = None if self.job.thinking is None else ReasoningSplitter(self.job.thinking)
        events: list[TokenEvent] = []
        async with contextlib.aclosing(answer_messages(ticket, keep_alive)) as messages:
            async for message in messages:
                sent = []
                if isinstance(message, Token):
                    events.append(message.event)
                    text = message.event.text
                    split = Split(content=text) if splitter is None else splitter.push(text)
                    sent = blocks.split(split, reader, ead=token_fields(message.event))
                if message is None or isinstance(message, (Token, PromptProgress)):
                    for event in keep_alive.kept(sent, lambda: _event("ping")):
                        yield event
                    continue
                if isinstance(message, Failed):
                    error = _respelled(error_of(message))
                    self.log(f"error: POST {self.path}: {error.message}")
                    yield error.anthropic_event()
                    return
                held = [] if splitter is None else blocks.split(splitter.flush(), reader)
                for event in [*held, *blocks.end(reader)]:
                    yield event
                summary = message.summary
                stop = self._finished(events, summary, reader is not None and bool(reader.calls))
                ead = {"summary": asdict(summary), "seed": self.seed}
                usage = _usage(summary)
                yield _event("message_delta", delta=stop, usage=usage, ead=ead)
                yield _event("message_stop")


class _Blocks:
    """A message's content blocks, as its stream's events and whole (``content``): a thinking model's
    reasoning into one thinking block, text pieces into one text block, each call a block of its own, a
    block stopped when the next starts. No text opens no block (an empty answer's content is none): a
    token of no text (half a character, or text held back) is a delta only in a block open, and blank
    text that would open a text block is held (``HeldBlank``)."""

    def __init__(self) -> None:
        self.count = 0
        self.open: str | None = None
        self.content: list[dict[str, Any]] = []  # the blocks given, their text and input so far
        self.blank = HeldBlank()

    def split(self, split: Split, reader: ToolCallReader | None, **extra: Any) -> list[dict[str, str]]:
        """The events of a token's text (``split`` into reasoning and content): the reasoning's delta, then
        the content's pieces (the calls ``reader`` reads), the first delta with ``extra``."""
        thought = split.reasoning or not split.content  # text held back: an empty delta of the open block
        events = self._text("thinking", split.reasoning, **extra) if thought else []
        pieces = [split.content] if reader is None else reader.push(split.content)
        extra = {} if events else extra
        for piece in pieces:
            given = self.piece(piece, **extra)
            if given and isinstance(piece, str | ArgumentsDelta):  # a delta: the token's fields given
                extra = {}
            events += given
        return events

    def piece(self, piece: Piece, **extra: Any) -> list[dict[str, str]]:
        """The events of a piece of the answer, a delta with ``extra`` (its token's ``ead`` fields): a call
        a tool_use block started with its name, an input_json_delta per piece of its arguments as they are
        written, stopped with the call."""
        if isinstance(piece, CallStart):
            self.blank.drop()
            return [*self.stop(), self._started(_tool_use(piece.name, {}))]
        if isinstance(piece, ArgumentsDelta):
            delta = {"type": "input_json_delta", "partial_json": piece.text}
            return [_event("content_block_delta", index=self.count - 1, delta=delta, **extra)]
        if isinstance(piece, ToolCall):
            self.content[-1]["input"] = json.loads(piece.arguments)  # an object (the reader's objects_only)
            return self.stop()
        return self._text("text", self.blank.opening(piece) if self.open != "text" else piece, **extra)

    def end(self, reader: ToolCallReader | None) -> list[dict[str, str]]:
        """The answer's end: what the reader still holds, the blank text held if the answer has no call
        (its only text), and the open block's stop."""
        held = [] if reader is None else reader.finish()
        events = [event for piece in held for event in self.piece(piece)]
        blank = self.blank.drop()
        if blank and (reader is None or not reader.calls):
            events += self._text("text", blank)
        return [*events, *self.stop()]

    def _text(self, kind: str, text: str, **extra: Any) -> list[dict[str, str]]:
        """A delta of the text block or of the thinking block (``kind``), the block started first."""
        if self.open != kind and not text:
            return []
        events = [] if self.open == kind else [*self.stop(), self._started(BLOCK_STARTS[kind])]
        self.content[-1][kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        return [*events, _event("content_block_delta", index=self.count - 1, delta=delta, **extra)]

    def _started(self, block: dict[str, Any]) -> dict[str, str]:
        self.open = block["type"]
        self.count += 1
        self.content.append(dict(block))
        return _event("content_block_start", index=self.count - 1, content_block=block)

    def stop(self) -> list[dict[str, str]]:
        """The open block's stop, if one is open."""
        if self.open is None:
            return []
        # a thinking block's signature, as llama-server's: empty (nothing signs the reasoning)
        signature = _event("content_block_delta", index=self.count - 1, delta=SIGNATURE)
        signed = [signature] if self.open == "thinking" else []
        self.open = None
        return [*signed, _event("content_block_stop", index=self.count - 1)]


def _event(kind: str, **data: Any) -> dict[str, str]:
    """A server-sent event named ``kind``, its data ``{"type": kind, ...}``, as Anthropic's."""
    return {"event": kind, "data": json.dumps({"type": kind, **data}, ensure_ascii=False)}


def add_routes(app: FastAPI, runner: Runner) -> None:
    """Anthropic's routes on ``app``, with its ``Requests``; the key is asked as of /v1 (``x-api-key``
    too). ``runner``: the smallest model, whose vocabulary reads the answer's stop."""
    requests: Requests = app.state.requests
    keyed = [Depends(requests.authorized)]

    async def prepared(request: Request) -> tuple[AnthropicRequest, ChatRequest, Job]:
        """The request checked in Anthropic's shape, then prepared as the OpenAI chat it means."""
        asked = parse(AnthropicRequest, await requests.json_body(request))
        try:
            body, job = await requests.chat(asked.openai_body())
        except ApiError as error:
            raise _respelled(error) from None
        return asked, body, job

    @app.post(ANTHROPIC_PATH, dependencies=keyed)
    async def messages(request: Request) -> Any:
        asked, body, job = await prepared(request)
        answer = _Message(asked.model, request.url.path, requests.log, job, body, runner)
        ticket = requests.submit(job)
        if asked.stream:
            return EventSourceResponse(answer.stream(ticket, requests.keep_alive()), ping=15)
        return await answer.whole(ticket, request)

    @app.post(f"{ANTHROPIC_PATH}/count_tokens", dependencies=keyed)
    async def count_tokens(request: Request) -> dict[str, int]:
        """The prompt's tokens, as the messages and tools render (an assistant prefill included)."""
        _, _, job = await prepared(request)
        return {"input_tokens": len(job.prompt)}
