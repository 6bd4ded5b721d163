"""OpenAI's Responses API (``POST /v1/responses``), the one API some agents speak (Codex CLI, the openai
client's ``responses.create``): a request is spelled as the chat request it means and prepared as one
(``app.Requests``: the same checks, template, tools and JSON mode), a 400 naming the field as the
Responses request spelled it; its answer is the Response object, or its typed events streamed. Stateless,
as llama-server's: no response is kept, so one cannot be continued by its id."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from ..decoder import Summary
from ..errors import quoted
from ..thinking import ReasoningSplitter, Split, split_reasoning
from .app import (
    MODEL_ID,
    STREAM_END,
    KeepAlive,
    Requests,
    answer_messages,
    collected,
    error_of,
    log_answered,
    token_fields,
)
from .engine import Failed, Log, PromptProgress, Ticket, Token
from .metrics import cached_tokens
from .schemas import SCHEMA_PATH, ApiError, ContentPart, parse, refuse_unless_off, unsupported
from .tools import ArgumentsDelta, CallStart, HeldBlank, Piece, ToolCall, ToolCallReader, new_call_id

SCHEMA_AS = "text.format.schema"  # where a Responses request gives the JSON schema
# Fields that ask for state the server does not keep, or for what it does not do, with the values that
# ask for nothing; any other is a 400 with its reason.
STATEFUL: dict[str, tuple[Any, ...]] = {
    "previous_response_id": (None,),
    "conversation": (None,),
    "background": (None, False),
    "prompt": (None,),
    "top_logprobs": (None, 0),
}
NO_STATE = "ead serve keeps no responses (stateless, as llama-server): send the whole conversation in input"
STATEFUL_REASONS = {
    "previous_response_id": NO_STATE,
    "conversation": NO_STATE,
    "background": "a response is answered while the request waits (none is kept to poll)",
    "prompt": "no stored prompt is kept: send instructions and input",
    "top_logprobs": "log-probabilities are served by /v1/chat/completions (logprobs: true)",
}
# The chat route's fields whose meaning a Responses request gives under its own name: a 400 that says it,
# never a second spelling read beside the first
CHAT_SPELLINGS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
}
# Tools OpenAI's servers run themselves (web_search and its dated names, ...): Codex CLI offers web search
# by default. None runs here, so the model is not offered them, as llama-server drops them; a client tool
# of another type (custom, local_shell...) is a 400, since the client expects the model to call it.
HOSTED_TOOLS = ("web_search", "file_search", "code_interpreter", "image_generation", "mcp")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text")  # a part's text, as chat's {"type": "text"} part
# A reasoning item's text: its reasoning_text parts (llama-server's), else its summary's (OpenAI's)
REASONING_PARTS = {"content": "reasoning_text", "summary": "summary_text"}


class InputItem(BaseModel):
    """An item of ``input``: a message (its content a string or parts), a call the assistant made, the
    call's output, or the assistant's reasoning (as Codex sends an earlier turn's back)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Annotated[str, Field(max_length=64)] = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | Annotated[list[ContentPart], Field(max_length=1024)] | None = None
    call_id: Annotated[str, Field(max_length=256)] | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    arguments: str | None = None
    output: str | Annotated[list[ContentPart], Field(max_length=1024)] | None = None
    summary: Annotated[list[ContentPart], Field(max_length=1024)] | None = None

    def chat_message(self, where: str) -> dict[str, Any]:
        """The chat message this item means (a call: an assistant's message of one call; reasoning: an
        assistant's ``reasoning_content``, as llama-server takes it, for the template to write)."""
        if self.type not in ITEM_TYPES:
            kind = self.type if self.type.isidentifier() else quoted(self.type)
            raise unsupported(f"{where}.type", f"{kind} items are not supported")
        if self.type == "message":
            self._need(where, "role")
            return {"role": self.role, "content": _chat_content(self.content)}
        if self.type == "reasoning":
            return {"role": "assistant", "content": None, "reasoning_content": self._reasoning()}
        if self.type == "function_call":
            self._need(where, "call_id", "name", "arguments")
            function = {"name": self.name, "arguments": self.arguments}
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": self.call_id, "function": function}],
            }
        self._need(where, "call_id", "output")
        return {"role": "tool", "tool_call_id": self.call_id, "content": _chat_content(self.output)}

    def _reasoning(self) -> str:
        for field, kind in REASONING_PARTS.items():
            texts = [part.text or "" for part in getattr(self, field) or () if part.type == kind]
            if texts:
                return "".join(texts)
        return ""

    def _need(self, where: str, *fields: str) -> None:
        for field in fields:
            if getattr(self, field) is None:
                message = f"{where}.{field}: a {self.type} item needs its {field}"
                raise ApiError(400, message, code="invalid_value", param=f"{where}.{field}")


def _reasoning_alone(message: dict[str, Any]) -> bool:
    """Whether a chat message is an assistant's reasoning with no text or calls yet."""
    return (
        message["role"] == "assistant"
        and "reasoning_content" in message
        and message["content"] is None
        and "tool_calls" not in message
    )


def _chat_content(content: str | list[ContentPart] | None) -> str | list[dict[str, Any]] | None:
    """Content as the chat route takes it: input_text and output_text parts are its text parts; any other
    part goes as it came, for the chat check to refuse by its type (an image: the models read text)."""
    if not isinstance(content, list):
        return content
    return [
        {"type": "text", "text": part.text} if part.type in TEXT_PARTS else part.model_dump(exclude_none=True)
        for part in content
    ]


class ResponsesTool(BaseModel):
    """A tool in Responses' flat shape; its fields are checked as the chat route checks a function's. A
    ``namespace`` tool (Codex CLI groups its sub-agent functions in one) is its functions, each offered
    as a flat one."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Annotated[str, Field(max_length=64)]
    name: Any = None
    description: Any = None
    parameters: Any = None
    strict: Any = None
    tools: Annotated[list[ResponsesTool], Field(max_length=128)] | None = None

    def chat_tools(self, where: str) -> list[tuple[dict[str, Any], str]]:
        """The chat route's function tools this one offers, each with where the request spells it."""
        if self.type == "namespace":
            if self.tools is None:
                message = f"{where}.tools: a namespace tool needs its tools"
                raise ApiError(400, message, code="invalid_value", param=f"{where}.tools")
            inner = enumerate(self.tools)
            return [pair for i, tool in inner for pair in tool.chat_tools(f"{where}.tools.{i}")]
        if self.type.startswith(HOSTED_TOOLS):
            return []  # one OpenAI runs for its model: none here, so not offered (llama-server ignores it)
        if self.type != "function":
            kind = self.type if self.type.isidentifier() else quoted(self.type)
            raise unsupported(f"{where}.type", f"{kind} tools are not supported")
        given = self.model_dump(exclude={"type", "tools"}, exclude_none=True)
        return [({"type": "function", "function": given}, where)]


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: Any = None
    json_schema: Any = Field(None, alias="schema")
    strict: Any = None

    def response_format(self) -> dict[str, Any]:
        """The chat route's ``response_format`` of this format."""
        if self.type != "json_schema":
            return {"type": self.type}
        given = self.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)
        return {"type": "json_schema", "json_schema": given}


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    format: TextFormat | None = None


def _metadata_keys(metadata: dict[str, str]) -> dict[str, str]:
    """A metadata key past OpenAI's 64 characters, named as a key (its value's own bound is 512)."""
    for key in metadata:
        if len(key) > 64:
            raise ValueError(f"a key has at most 64 characters, got {quoted(key)}")
    return metadata


class ResponsesRequest(BaseModel):
    """A Responses request. The fields it spells its own way are read here; every other (``model``,
    ``temperature``, ``top_p``, ``parallel_tool_calls``, ead's ``ead`` object...) goes to the chat
    request as it came, so it is checked, or ignored, as the chat route checks or ignores it."""

    model_config = ConfigDict(extra="allow", strict=True)

    input: str | Annotated[list[InputItem], Field(max_length=4096)]
    instructions: str | None = None
    stream: bool | None = None
    tools: Annotated[list[ResponsesTool], Field(max_length=128)] | None = None
    tool_choice: Any = None
    text: TextOptions | None = None
    max_output_tokens: Any = None
    # a client's tags, which its Response carries back (in every event streamed): OpenAI's bounds
    metadata: (
        Annotated[
            dict[str, Annotated[str, Field(max_length=512)]],
            Field(max_length=16),
            AfterValidator(_metadata_keys),
        ]
        | None
    ) = None

    def chat_body(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The chat request this one means, and how its fields are spelled here (for its 400s)."""
        extra = dict(self.model_extra or {})
        for name, ours in CHAT_SPELLINGS.items():
            if name in extra:
                message = f"{name}: /v1/responses takes {ours} (the chat route's {name} is not read here)"
                raise ApiError(400, message, code="unsupported_parameter", param=name)
        refuse_unless_off(extra, STATEFUL, STATEFUL_REASONS)
        extra.pop("stream_options", None)  # Responses' own (its obfuscation padding): nothing to pad
        messages, origins = self._messages()
        body = {**extra, "messages": messages}
        spelling = {
            "messages": "input",
            **{f"messages.{n}": origin for n, origin in enumerate(origins)},
            # a tool's message is a function_call_output item: its content, the item's output
            **{
                f"messages.{n}.content": f"{origins[n]}.output"
                for n, message in enumerate(messages)
                if message["role"] == "tool"
            },
            "max_tokens": "max_output_tokens",
            "response_format": "text.format",
            "response_format.json_schema": "text.format",
            SCHEMA_PATH: SCHEMA_AS,
        }
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        if self.tools is not None:
            offered = [pair for i, tool in enumerate(self.tools) for pair in tool.chat_tools(f"tools.{i}")]
            body["tools"] = [tool for tool, _ in offered]
            spelling |= {f"tools.{n}.function": where for n, (_, where) in enumerate(offered)}
        if self.tool_choice is not None:
            body["tool_choice"] = self._chat_tool_choice()
        if self.text is not None and self.text.format is not None:
            body["response_format"] = self.text.format.response_format()
        return body, spelling

    def _messages(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The chat's messages, each with where this request gives it; calls in a row (or after the
        assistant's text) are one assistant message's, as the chat route takes parallel calls, and the
        assistant's text or calls after its reasoning are the reasoning's message (as llama-server's)."""
        messages: list[dict[str, Any]] = []
        origins: list[str] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
            origins.append("instructions")
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}], [*origins, "input"]
        for i, item in enumerate(self.input):
            message = item.chat_message(f"input.{i}")
            last = messages[-1] if messages else None
            if "tool_calls" in message and last is not None and last["role"] == "assistant":
                last["tool_calls"] = [*last.get("tool_calls", []), *message["tool_calls"]]
                continue
            if message["role"] == "assistant" and last is not None and _reasoning_alone(last):
                last["content"] = message["content"]
                continue
            messages.append(message)
            origins.append(f"input.{i}")
        return messages, origins

    def _chat_tool_choice(self) -> Any:
        """Responses' ``{"type": "function", "name": N}`` as the chat route spells a named function."""
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
            return {"type": "function", "function": {"name": choice["name"]}}
        return choice


def _usage(summary: Summary) -> dict[str, Any]:
    return {
        "input_tokens": summary.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens(summary)},
        "output_tokens": summary.generated,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": summary.prompt_tokens + summary.generated,
    }


def _response_error(error: ApiError) -> dict[str, Any]:
    """A failed Response's ``error``: its code one of the Responses API's (the request's fault
    ``invalid_prompt``, which Codex does not retry; else ``server_error``), its message, field and type as
    the error object gives them."""
    code = "invalid_prompt" if error.status < 500 else "server_error"
    return {"code": code, "message": error.message, "param": error.param, "type": error.kind}


def _status(summary: Summary) -> str:
    """'incomplete' where the token limit (or the context's end) cut the answer, else 'completed'."""
    return "incomplete" if summary.finish_reason == "length" else "completed"


def _part(kind: str, text: str) -> dict[str, Any]:
    """A text item's part: the message's output_text, the reasoning's reasoning_text."""
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _text_item(kind: str, item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """The assistant's message item, or its reasoning item (llama-server's shape: one reasoning_text
    part, no summary); ``text`` None: as it is opened, before its part."""
    content = [] if text is None else [_part(kind, text)]
    if kind == "reasoning":
        return {
            "type": "reasoning",
            "id": item_id,
            "summary": [],
            "content": content,
            "encrypted_content": "",
            "status": status,
        }
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


# Each text item's id prefix, and its text's events (its part's .delta and .done)
ITEM_ID = {"message": "msg", "reasoning": "rs"}
TEXT_EVENTS = {"message": "response.output_text", "reasoning": "response.reasoning_text"}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Answer:
    """One request's answer as a Response object, whole or as its typed events."""

    def __init__(self, asked: ResponsesRequest, path: str, log: Log, spelling: dict[str, str]) -> None:
        self.asked, self.path, self.log, self.spelling = asked, path, log, spelling
        self.id = _new_id("resp")
        self.created = int(time.time())
        self.sequence = 0  # the next event's sequence_number
        self.output: list[dict[str, Any]] = []  # the items done
        self.open: dict[str, Any] | None = None  # the text item open (message or reasoning), its text so far
        self.call: dict[str, Any] | None = None  # the call item whose arguments are being written
        self.blank = HeldBlank()  # blank text that would open a message, held until text follows

    def respelled(self, error: ApiError) -> ApiError:
        return error.respelled(self.spelling, SCHEMA_AS)

    def response(
        self,
        status: str,
        summary: Summary | None = None,
        ead: dict[str, Any] | None = None,
        error: ApiError | None = None,
    ) -> dict:
        """The Response object; ``summary`` None while it is in progress, ``error`` what failed it."""
        extra = self.asked.model_extra or {}
        done = {} if summary is None else {"usage": _usage(summary), "ead": ead}
        cut = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None if error is None else _response_error(error),
            "incomplete_details": cut,
            "instructions": self.asked.instructions,
            "max_output_tokens": self.asked.max_output_tokens,
            "metadata": self.asked.metadata or {},
            "model": MODEL_ID,
            "output": self.output,
            "parallel_tool_calls": extra.get("parallel_tool_calls", True) is not False,
            "previous_response_id": None,
            "store": False,  # nothing is kept, whatever store asked
            "temperature": extra.get("temperature"),
            "top_p": extra.get("top_p"),
            "tool_choice": self.asked.tool_choice or "auto",
            "tools": [tool.model_dump(exclude_none=True) for tool in self.asked.tools or ()],
            "text": {"format": {"type": "text"}}
            if self.asked.text is None
            else self.asked.text.model_dump(exclude_none=True, by_alias=True),
            **done,
        }

    async def whole(
        self,
        ticket: Ticket,
        request: Request,
        tools: frozenset[str] | None,
        parallel: bool,
        prefill: str,
        seed: int,
        thinking: bool | None,
    ) -> JSONResponse:
        try:
            answer = await collected(ticket, request)
        except ApiError as error:  # the generation failed
            raise self.respelled(error) from None
        if answer is None:
            return JSONResponse({}, status_code=499)
        tokens, summary = answer
        log_answered(self.log, self.path, summary)
        text = "".join(token.event.text for token in tokens)
        # a thinking model's: its reasoning is an item before the others
        split = Split(content=text) if thinking is None else split_reasoning(text, thinking)
        reader = ToolCallReader(tools, parallel, prefill) if tools else None
        status = _status(summary)
        # the items in the order the model wrote them, read as the stream reads them (no event is sent)
        self._split_events(split, reader)
        self._ended(reader, status)
        ead = {
            "tokens": [token_fields(token.event) for token in tokens],
            "summary": asdict(summary),
            "seed": seed,
        }
        return JSONResponse(self.response(status, summary, ead))

    def _event(self, kind: str, **fields: Any) -> dict[str, str]:
        """A server-sent event of its type, numbered."""
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return {"event": kind, "data": json.dumps(data, ensure_ascii=False)}

    def _failed(self, error: ApiError) -> dict[str, str]:
        """``response.failed``: the Response failed with ``error``, as OpenAI's streams end a failure
        mid-answer (Codex reads an event's type: a bare error object is none to it)."""
        return self._event("response.failed", response=self.response("failed", error=error))

    def cut_off(self, error: ApiError) -> bytes:
        """The stream's last frame where a stop cuts it (the Guard, through ``STREAM_END``): its
        ``response.failed``, framed as sse-starlette frames the others."""
        return ServerSentEvent(**self._failed(error)).encode()

    def _in_progress(self) -> dict[str, str]:
        """``response.in_progress``: sent after ``response.created``, and again as the stream's keep-alive
        (Codex's idle timer is reset by any event, not by a comment)."""
        return self._event("response.in_progress", response=self.response("in_progress"))

    def _open_item(self, kind: str) -> list[dict[str, str]]:
        """A text item of ``kind`` opened, with its one part, if it is not the one open (which is done)."""
        if self.open is not None and self.open["type"] == kind:
            return []
        events = self._close_item("completed")
        self.open = _text_item(kind, _new_id(ITEM_ID[kind]), "", "in_progress")
        where = {"output_index": len(self.output)}
        return [
            *events,
            self._event(
                "response.output_item.added",
                **where,
                item=_text_item(kind, self.open["id"], None, "in_progress"),
            ),
            self._event(
                "response.content_part.added",
                item_id=self.open["id"],
                **where,
                content_index=0,
                part=_part(kind, ""),
            ),
        ]

    def _text_events(self, text: str, kind: str = "message", **extra: Any) -> list[dict[str, str]]:
        """A piece of the message's text or of the reasoning's: its delta, its item opened first."""
        events = self._open_item(kind)
        assert self.open is not None
        self.open["content"][0]["text"] += text
        where = {"item_id": self.open["id"], "output_index": len(self.output), "content_index": 0}
        logprobs = {"logprobs": []} if kind == "message" else {}
        return [*events, self._event(f"{TEXT_EVENTS[kind]}.delta", **where, delta=text, **logprobs, **extra)]

    def _close_item(self, status: str) -> list[dict[str, str]]:
        """The open text item's end (its text, its part, the item), if one is open."""
        if self.open is None:
            return []
        item, self.open = self.open, None
        item["status"] = status
        index, part = len(self.output), item["content"][0]
        self.output.append(item)
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        logprobs = {"logprobs": []} if item["type"] == "message" else {}
        return [
            self._event(f"{TEXT_EVENTS[item['type']]}.done", **where, text=part["text"], **logprobs),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _call_started(self, start: CallStart) -> list[dict[str, str]]:
        """A call begun: the open text item done, the call's item added, its arguments to come."""
        events = self._close_item("completed")
        self.blank.drop()
        self.call = _call_item(_new_id("fc"), new_call_id(), start.name, "", "in_progress")
        return [
            *events,
            self._event("response.output_item.added", output_index=len(self.output), item=self.call),
        ]

    def _arguments_events(self, delta: ArgumentsDelta, **extra: Any) -> list[dict[str, str]]:
        """A piece of the begun call's arguments, as the model writes them."""
        assert self.call is not None
        where = {"item_id": self.call["id"], "output_index": len(self.output)}
        return [self._event("response.function_call_arguments.delta", **where, delta=delta.text, **extra)]

    def _call_events(self, call: ToolCall) -> list[dict[str, str]]:
        """The begun call's end: its arguments (the deltas' sum) done, its item done."""
        assert self.call is not None
        item, self.call = {**self.call, "arguments": call.arguments, "status": "completed"}, None
        index = len(self.output)
        self.output.append(item)
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=call.name,
                arguments=call.arguments,
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _ended(self, reader: ToolCallReader | None, status: str) -> list[dict[str, str]]:
        """The answer's end: what the reader still holds, a message if nothing else was given (the blank
        text held, or none), and the item open closed with the answer's ``status``."""
        events = self._piece_events([] if reader is None else reader.finish())
        if not self._answered():
            blank = self.blank.drop()
            events += self._text_events(blank) if blank else self._open_item("message")
        return [*events, *self._close_item(status)]

    def _answered(self) -> bool:
        """Whether a message or a call is given (not only reasoning)."""
        items = [*self.output, *([self.open] if self.open is not None else [])]
        return any(item["type"] != "reasoning" for item in items)

    def _piece_events(self, pieces: list[Piece], **extra: Any) -> list[dict[str, str]]:
        """The events of pieces of text and of calls, the first delta with ``extra`` (its token's fields)."""
        events = []
        for piece in pieces:
            if isinstance(piece, CallStart):
                events += self._call_started(piece)
            elif isinstance(piece, ArgumentsDelta):
                events += self._arguments_events(piece, **extra)
                extra = {}
            elif isinstance(piece, ToolCall):
                events += self._call_events(piece)
            elif piece:
                events += self._shown(piece, **extra)
                extra = {}
        return events

    def _shown(self, text: str, **extra: Any) -> list[dict[str, str]]:
        """A piece of the message's text; blank, where it would open a message, held (``HeldBlank``)."""
        opening = self.open is None or self.open["type"] != "message"
        text = self.blank.opening(text) if opening else text
        return self._text_events(text, **extra) if text else []

    def _split_events(
        self, split: Split, reader: ToolCallReader | None, **extra: Any
    ) -> list[dict[str, str]]:
        """A piece of a thinking model's answer: its reasoning's delta, then its content's pieces."""
        events = self._text_events(split.reasoning, "reasoning", **extra) if split.reasoning else []
        content = [split.content] if reader is None else reader.push(split.content)
        return [*events, *self._piece_events(content, **({} if events else extra))]

    async def events(
        self,
        ticket: Ticket,
        tools: frozenset[str] | None,
        parallel: bool,
        prefill: str,
        seed: int,
        thinking: bool | None,
        keep_alive: KeepAlive,
    ) -> AsyncIterator[dict[str, str] | bytes]:
        """The typed events: created, in progress, each item's (a text delta per token that shows text,
        with its ``ead`` fields; a thinking model's reasoning an item of its own first), then completed or
        incomplete with the whole Response; a failure mid-answer is ``response.failed`` (``_failed``), as a
        stop's cut is (``cut_off``). ``response.in_progress`` again each time ``keep_alive`` is due,
        whatever the engine does (queued, reading, holding text back)."""
        reader = ToolCallReader(tools, parallel, prefill) if tools else None
        splitter = None if thinking is None else ReasoningSplitter(thinking)
        yield self._event("response.created", response=self.response("in_progress"))
        yield self._in_progress()
        tokens = []
        async with contextlib.aclosing(answer_messages(ticket, keep_alive)) as messages:
            async for message in messages:
                events = []
                if isinstance(message, Token):
                    fields = token_fields(message.event)
                    tokens.append(fields)
                    text = message.event.text
                    split = Split(content=text) if splitter is None else splitter.push(text)
                    events = self._split_events(split, reader, ead=fields)
                if message is None or isinstance(message, (Token, PromptProgress)):
                    for event in keep_alive.kept(events, self._in_progress):
                        yield event
                    continue
                if isinstance(message, Failed):
                    error = self.respelled(error_of(message))
                    self.log(f"error: POST {self.path}: {error.message}")
                    yield self._failed(error)
                    return
                summary = message.summary
                log_answered(self.log, self.path, summary)
                held = [] if splitter is None else self._split_events(splitter.flush(), reader)
                status = _status(summary)
                for event in [*held, *self._ended(reader, status)]:
                    yield event
                ead = {"tokens": tokens, "summary": asdict(summary), "seed": seed}
                kind = "response.incomplete" if status == "incomplete" else "response.completed"
                yield self._event(kind, response=self.response(status, summary, ead))


def add_routes(app: FastAPI) -> None:
    """``POST /v1/responses`` on ``app``, with its ``Requests``; the key (--api-key) asked as of /v1."""
    requests: Requests = app.state.requests

    @app.post("/v1/responses", dependencies=[Depends(requests.authorized)])
    async def responses(request: Request) -> Any:
        asked = parse(ResponsesRequest, await requests.json_body(request))
        body, spelling = asked.chat_body()
        answer = _Answer(asked, request.url.path, requests.log, spelling)
        try:
            prepared, job = await requests.chat(json.dumps(body).encode())
        except ApiError as error:
            raise answer.respelled(error) from None
        ticket = requests.submit(job)
        how = (
            prepared.tool_names(),
            prepared.parallel_tool_calls is not False,
            job.prefill,
            job.generation.sampling.seed,
            job.thinking,
        )
        if asked.stream:
            request.scope[STREAM_END] = answer.cut_off
            return EventSourceResponse(answer.events(ticket, *how, requests.keep_alive()), ping=15)
        return await answer.whole(ticket, request, *how)
