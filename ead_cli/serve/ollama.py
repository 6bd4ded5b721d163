"""ollama's API (``/api/...``), for the clients that speak it (Open WebUI, Enchanted, editor plugins), over
the same engine and the same request preparation as OpenAI's: an ollama request is checked in its own
shape, then spelled as the OpenAI request it means and prepared as one (``app.Requests``: the same
checks, template, tokenizing and decoding options), and its answer written in ollama's shapes, NDJSON
lines when streamed, each token with the ``ead`` fields that say which model wrote it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..decoder import Summary
from ..embedding import Embedder, normalized
from ..errors import quoted
from ..gguf_files import model_bytes
from ..options import NO_LIMIT
from ..prompt import infill_tokens
from ..remote import RemoteRunner
from ..thinking import ReasoningSplitter, Split, thinks
from .app import (
    MODEL_ID,
    NDJSON,
    Requests,
    Scored,
    ScoredText,
    answer_messages,
    collected_calls,
    error_of,
    input_tokens,
    log_answered,
    scored_entries,
    token_fields,
)
from .engine import Engine, Failed, Log, PromptProgress, Ticket, Token
from .metrics import prompt_seconds
from .schemas import (
    DRY,
    MAX_EMBEDDING_INPUTS,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_TOP_LOGPROBS,
    MIROSTAT,
    PENALTIES,
    UNSUPPORTED,
    ApiError,
    ChatRequest,
    DryBreakers,
    DryLength,
    DryMultiplier,
    Fraction,
    MinP,
    Mirostat,
    MirostatRate,
    Penalty,
    Positive,
    RepeatLastN,
    RepeatPenalty,
    TopK,
    TypicalP,
    listed_inputs,
    parse,
)
from .tools import Piece, ToolCall, ToolCallReader, template_takes_tools, whole

if TYPE_CHECKING:
    import numpy as np

    from ..runner import Runner

# The ollama release whose docs/api.md these shapes follow: clients read it to know what they may ask.
OLLAMA_VERSION = "0.33.0"
LISTED_NAME = f"{MODEL_ID}:latest"  # as /api/tags lists it; a name without its tag is its ':latest'
NS = 10**9  # ollama's durations are nanoseconds
# When /api/ps says the model unloads: never (keep_alive is ignored), as the latest time a client can read
NEVER = "9999-12-31T23:59:59Z"
PULLED = {"status": "success"}  # the end of ollama's pull, all there is to one of the model served
# what a pull of another name says to do instead: the server serves the models it was started with
PULL_INSTEAD = "it pulls none: ead models pull NAME on its machine, then restart it with --small/--large NAME"
STARTED_WITH = "ead serve --small FILE --large FILE"  # how a server is given its GGUF files
# ollama's model management, which a server of the models it was started with does none of: each route's
# methods and what its 501 says to do instead (a client had been told the path was not served)
UNMANAGED = {
    "/api/delete": (
        ["DELETE"],
        "ead serve deletes no models: stop it, then ead models rm NAME on its machine",
    ),
    "/api/copy": (
        ["POST"],
        f"ead serve copies no models: it answers {MODEL_ID!r} and {LISTED_NAME!r} "
        "(start it with --any-model to answer any name)",
    ),
    "/api/create": (["POST"], f"ead serve creates no models: start it with the GGUF files ({STARTED_WITH})"),
    "/api/push": (["POST"], "ead serve pushes no models: they are GGUF files on its machine"),
    "/api/blobs/{digest}": (
        ["HEAD", "POST"],
        f"ead serve takes no blobs, as it creates no models: start it with the GGUF files ({STARTED_WITH})",
    ),
}


class OllamaOptions(BaseModel):
    """``options``: those whose meaning is the OpenAI field's, with its bounds; the runtime's own
    (num_gpu, num_thread, use_mmap...) are ignored, as they do not change an answer; those that would
    and that ead serve does not do (dynatemp_range...) go on to the OpenAI check, which refuses
    any value but the one that means "off"."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    num_predict: Annotated[int, Field(ge=-2)] | None = None  # -1 no limit, -2 fill the context: both NO_LIMIT
    num_ctx: Positive | None = None  # a context past the served one is a 400 (ead serve --ctx sets it)
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_k: TopK | None = None
    top_p: Fraction | None = None
    min_p: MinP | None = None
    typical_p: TypicalP | None = None
    mirostat: Mirostat | None = None
    mirostat_tau: MirostatRate | None = None
    mirostat_eta: MirostatRate | None = None
    # llama.cpp's DRY, which ollama's options do not have: llama-server's fields
    dry_multiplier: DryMultiplier | None = None
    dry_base: float | None = None
    dry_allowed_length: DryLength | None = None
    dry_penalty_last_n: DryLength | None = None
    dry_sequence_breakers: DryBreakers | None = None
    seed: Annotated[int, Field(ge=-1, le=2**32 - 2)] | None = None
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: RepeatLastN | None = None  # -1: the whole context
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: (
        Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOPS)] | None
    ) = None

    def check_context(self, n_ctx: int) -> None:
        """A 400 for a ``num_ctx`` past the context served, ``n_ctx`` tokens."""
        if self.num_ctx is not None and self.num_ctx > n_ctx:
            message = (
                f"options.num_ctx {self.num_ctx} is past the context served, {n_ctx} tokens "
                "(ead serve --ctx sets it)"
            )
            raise ApiError(400, message, param="options.num_ctx")

    def openai_fields(self, n_ctx: int) -> dict[str, Any]:
        """These options as an OpenAI request's fields."""
        self.check_context(n_ctx)
        fields = self.model_dump(exclude_none=True, exclude={"num_predict", "num_ctx"})
        fields = {name: value for name, value in fields.items() if name not in (self.model_extra or {})}
        fields |= {name: value for name, value in (self.model_extra or {}).items() if name in UNSUPPORTED}
        if self.num_predict is not None:  # 0 or less (ollama's -1 and -2): no limit, to the context's end
            fields["max_tokens"] = self.num_predict if self.num_predict > 0 else NO_LIMIT
        return fields


class _OllamaRequest(BaseModel):
    """What /api/chat and /api/generate both take. Fields not named here are ignored, as ollama
    ignores them (``keep_alive``: the models stay loaded)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model: Annotated[str, Field(max_length=256)]
    stream: bool | None = None  # ollama streams unless told not to (a null, as every field's, is left out)
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # read with logprobs alone
    ead: dict[str, Any] | None = None  # ead's options, as the OpenAI routes take them (checked there)

    def openai_fields(self, n_ctx: int) -> dict[str, Any]:
        """The OpenAI request's fields for the options, the format and ``ead``."""
        if isinstance(self.think, str):
            message = "think: levels ('high', 'medium', 'low') are not supported by ead serve: true or false"
            raise ApiError(400, message, param="think")
        fields = (self.options or OllamaOptions()).openai_fields(n_ctx)
        if self.think is not None:  # as ollama turns Qwen3's thinking on and off: through its template,
            # over the server's --reasoning-budget; on, apart whatever the server's --reasoning-format
            fields["chat_template_kwargs"] = {"enable_thinking": self.think}
            fields |= {"reasoning_format": "deepseek"} if self.think else {}
        if self.format == "json":
            fields["response_format"] = {"type": "json_object"}
        elif isinstance(self.format, dict):
            schema = {"name": "format", "schema": self.format}
            fields["response_format"] = {"type": "json_schema", "json_schema": schema}
        if self.ead is not None:
            fields["ead"] = self.ead
        return fields

    def logprob_fields(self, chat: bool) -> dict[str, Any]:
        """``logprobs`` as the OpenAI request means it: a ``chat``'s flag and count, a text completion's
        count; none unless asked."""
        if not self.logprobs:
            return {}
        top = self.top_logprobs or 0
        return {"logprobs": True, "top_logprobs": top} if chat else {"logprobs": top}


class _OllamaEmbedding(BaseModel):
    """What /api/embed and /api/embeddings both take; ``options`` checked (``num_ctx`` past the served
    context a 400; below it, the context an input must fit, as ollama loads the model with it), and
    otherwise ignored: they sample, and an embedding draws nothing."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    model: Annotated[str, Field(max_length=256)]
    options: OllamaOptions | None = None

    def inputs(self) -> list[tuple[str, str | list[int]]]:
        """Each input with where the request gives it; none: ollama's load request."""
        raise NotImplementedError

    def truncates(self) -> bool:
        return False

    def tokens(self, embedder: Embedder) -> list[list[int]]:
        """Each input's tokens, or a 400 naming the first at fault."""
        options = self.options or OllamaOptions()
        options.check_context(embedder.n_ctx)
        return input_tokens(embedder, self.inputs(), truncate=self.truncates(), n_ctx=options.num_ctx)


class OllamaEmbed(_OllamaEmbedding):
    """``/api/embed``: ``input`` a text or a list (none, or an empty text: a load request), ``truncate``
    (default true: an input past the context is cut to it), ``dimensions`` (each vector cut to its
    first N and normalised again, as ollama cuts a vector: 0, or N past the model's, leaves it whole)."""

    input: str | Annotated[list[str], Field(max_length=MAX_EMBEDDING_INPUTS)] | None = None
    truncate: bool | None = None
    dimensions: Annotated[int, Field(ge=0)] | None = None

    def inputs(self) -> list[tuple[str, str | list[int]]]:
        return listed_inputs("input", self.input) if self.input not in (None, "") else []

    def truncates(self) -> bool:
        return self.truncate is not False


class OllamaEmbeddings(_OllamaEmbedding):
    """``/api/embeddings``, ollama's older route: one ``prompt`` (none or empty: a load request), its
    vector unnormalised, never cut (one past the context a 400)."""

    prompt: str | None = None

    def inputs(self) -> list[tuple[str, str | list[int]]]:
        return [("prompt", self.prompt)] if self.prompt else []


Asked = TypeVar("Asked", bound=_OllamaEmbedding)


class OllamaFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: Annotated[str, Field(max_length=256)]
    arguments: dict[str, Any]  # an object, where OpenAI sends a JSON text


class OllamaToolCall(BaseModel):
    """A call an assistant made in an earlier turn, as ollama's clients send it back."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: Annotated[str, Field(max_length=256)] | None = None
    function: OllamaFunction

    def as_openai(self) -> dict[str, Any]:
        function = {"name": self.function.name, "arguments": json.dumps(self.function.arguments)}
        called = {"id": self.id} if self.id is not None else {}
        return {**called, "type": "function", "function": function}


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    images: list[str] | None = None
    tool_calls: Annotated[list[OllamaToolCall], Field(max_length=128)] | None = None
    tool_name: Annotated[str, Field(max_length=256)] | None = None
    tool_call_id: Annotated[str, Field(max_length=256)] | None = None

    def as_openai(self) -> dict[str, Any]:
        """The message as OpenAI's chat takes it: a tool's answer named by ``name``, calls' arguments as
        JSON texts."""
        fields: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.tool_calls:
            fields["tool_calls"] = [call.as_openai() for call in self.tool_calls]
        if self.tool_name is not None:
            fields["name"] = self.tool_name
        if self.tool_call_id is not None:
            fields["tool_call_id"] = self.tool_call_id
        return fields


class OllamaChat(_OllamaRequest):
    messages: list[OllamaMessage] = []
    tools: list[Any] | None = None  # OpenAI's shape: checked as /v1/chat/completions checks them

    def loads_only(self) -> bool:
        """No messages: ollama's request to load the model, answered at once."""
        return not self.messages

    def openai_body(self, n_ctx: int) -> dict[str, Any]:
        for i, message in enumerate(self.messages):
            if message.images:
                message_text = f"messages.{i}.images: images are not supported (the models read text)"
                raise ApiError(400, message_text, param=f"messages.{i}.images")
        messages = [message.as_openai() for message in self.messages]
        tools = {"tools": self.tools} if self.tools is not None else {}
        return {"messages": messages, **tools, **self.openai_fields(n_ctx), **self.logprob_fields(True)}


class OllamaGenerate(_OllamaRequest):
    prompt: str | None = None
    system: str | None = None
    raw: bool | None = None
    suffix: str | None = None
    template: str | None = None
    images: list[str] | None = None
    context: list[int] | None = None

    def loads_only(self) -> bool:
        """No prompt: ollama's request to load the model, answered at once."""
        return not self.prompt and not self.suffix

    def openai_body(self, n_ctx: int) -> dict[str, Any]:
        """A chat of the system text and the prompt (rendered with the model's template), or with
        ``raw`` the prompt as it is, a text completion; with a ``suffix`` (ollama's: one not empty), the
        text completion of the code before the cursor (the prompt) and after it, fill-in-the-middle."""
        for field, why in (
            ("template", "the prompt is rendered with the model's own template"),
            ("images", "images are not supported (the models read text)"),
            ("context", "an earlier answer's context is not kept: send the conversation to /api/chat"),
        ):
            if getattr(self, field):
                raise ApiError(400, f"{field}: {why} by ead serve", param=field)
        fields = self.openai_fields(n_ctx)
        completion = {**fields, **self.logprob_fields(False)}  # a text completion's fields
        if self.suffix:
            if self.system:
                message = "system: a fill-in-the-middle prompt has no place for a system text"
                raise ApiError(400, message, param="system")
            return {"prompt": self.prompt or "", "suffix": self.suffix, **completion}
        if self.raw:
            if self.system:
                message = (
                    "system: a raw prompt is sent as it is, with no template to place a system text: "
                    "put it in the prompt"
                )
                raise ApiError(400, message, param="system")
            return {"prompt": self.prompt or "", **completion}
        system = [{"role": "system", "content": self.system}] if self.system else []
        user = {"role": "user", "content": self.prompt or ""}
        return {"messages": [*system, user], **fields, **self.logprob_fields(True)}


# The OpenAI fields an ollama request's own are spelled as, for the OpenAI checks' 400s
OLLAMA_SPELLING = {
    "response_format": "format",
    "max_tokens": "options.num_predict",
    **{
        name: f"options.{name}"
        for name in (
            *("temperature", "top_k", "top_p", "min_p", "typical_p", "seed", "stop"),
            *PENALTIES,
            *MIROSTAT,
            *DRY,
            "dry_sequence_breakers",
        )
    },
    # those options passes on (a request's own fields, tools and suffix, keep their names)
    **{
        name: f"options.{name}"
        for name in UNSUPPORTED
        if name not in OllamaChat.model_fields and name not in OllamaGenerate.model_fields
    },
}


def _respelled(error: ApiError) -> ApiError:
    """An OpenAI check's 400 naming the field as the ollama request spelled it."""
    return error.respelled(OLLAMA_SPELLING, "format")


def _capabilities(runner: Runner) -> list[str]:
    """What ollama's /api/show says the model does: complete text, call tools where its template offers
    them, fill in the middle ("insert", /api/generate's suffix) where its vocabulary has FIM tokens, and
    think where its template writes a thinking block."""
    return [
        "completion",
        *(["tools"] if template_takes_tools(runner) else []),
        *(["insert"] if infill_tokens(runner) is not None else []),
        *(["thinking"] if thinks(runner.chat_template) else []),
    ]


def _now() -> str:
    """A time as ollama writes it: RFC 3339, UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _durations(summary: Summary, started_ns: int) -> dict[str, int]:
    """ollama's figures of an answer, in nanoseconds (the models are loaded once: no load time)."""
    prompt_ns = round(prompt_seconds(summary) * NS)
    return {
        "total_duration": time.monotonic_ns() - started_ns,
        "load_duration": 0,
        "prompt_eval_count": summary.prompt_tokens,
        "prompt_eval_duration": prompt_ns,
        "eval_count": summary.generated,
        "eval_duration": max(round(summary.wall_s * NS) - prompt_ns, 0),
    }


class _Answer:
    """One request's answer in ollama's shapes: a line per token, then the last, ``done: true``, with the
    figures; or all of it in one object."""

    def __init__(
        self,
        chat: bool,
        model: str,
        path: str,
        log: Log,
        piece: Callable[[int], bytes],
        tools: frozenset[str] | None = None,
        prefill: str = "",
        thinking: bool | None = None,
    ) -> None:
        self.chat, self.model, self.path, self.log = chat, model, path, log
        self.piece = piece  # a token id's bytes, for log-probabilities
        self._scored = ScoredText(piece)
        self.started_ns = time.monotonic_ns()
        self.tools = tools  # the names of the tools offered: calls are read back out of the answer
        self.prefill = prefill  # the assistant message the answer continues: a call it opens is read whole
        self.thinking = thinking  # a thinking model's answer: its reasoning given apart (Job.thinking)
        self._splitter = None if thinking is None else ReasoningSplitter(thinking)

    def part(
        self, text: str, calls: Sequence[dict[str, Any]] = (), thinking: str = "", **extra: Any
    ) -> dict[str, Any]:
        """A line of the answer: its text, the reasoning and the calls it completes (ollama's shape, its
        ``thinking`` only where there is some)."""
        thought = {"thinking": thinking} if thinking else {}
        said: dict[str, Any] = {"response": text, **thought}
        if self.chat:
            message = {"role": "assistant", "content": text, **thought}
            said = {"message": {**message, "tool_calls": list(calls)} if calls else message}
        return {"model": self.model, "created_at": _now(), **said, "done": False, **extra}

    def last(
        self,
        text: str,
        summary: Summary | None,
        ead: dict[str, Any],
        calls: Sequence[dict[str, Any]] = (),
        thinking: str = "",
        scored: list[Scored] | None = None,
    ) -> dict[str, Any]:
        """The answer's end, with the log-probabilities of the ``scored`` tokens; ``summary`` None where
        nothing was generated (a request to load the model)."""
        if summary is None:
            return {**self.part(text), "done": True, "done_reason": "load"}
        log_answered(self.log, self.path, summary)
        reason = "length" if summary.finish_reason == "length" else "stop"
        figures = _durations(summary, self.started_ns)
        ead = {**ead, "summary": asdict(summary)}
        said = self.part(text, calls, thinking, **self._logprobs(scored or []))
        return {**said, "done": True, "done_reason": reason, **figures, "ead": ead}

    def _logprobs(self, scored: list[Scored]) -> dict[str, Any]:
        """ollama's ``logprobs`` of these scored tokens, OpenAI's chat entries; none where there are none
        (not asked, or no token's text shown yet), as ollama leaves the field out."""
        return {"logprobs": scored_entries(self.piece, scored)} if scored else {}

    def _token_lines(self, text: str, reader: ToolCallReader | None, **extra: Any) -> list[str]:
        """A token's lines, the first with ``extra`` (its ``ead`` fields); a thinking model's reasoning
        first, in a line of its own."""
        if self._splitter is None:
            return self._content_lines(text, reader, **extra)
        lines = self._split_lines(*self._splitter.push(text), reader, **extra)
        return lines or [_line(self.part("", **extra))]

    def _split_lines(
        self, reasoning: str, content: str, reader: ToolCallReader | None, **extra: Any
    ) -> list[str]:
        lines = [_line(self.part("", thinking=reasoning, **extra))] if reasoning else []
        if content:
            lines += self._content_lines(content, reader, **({} if lines else extra))
        return lines

    def _content_lines(self, text: str, reader: ToolCallReader | None, **extra: Any) -> list[str]:
        """Text's lines; with tools, a line per piece of text or call the reader lets through (text that
        may open a call is held), one of no text if none."""
        if reader is None:
            return [_line(self.part(text, **extra))]
        return self._piece_lines(reader.push(text), reader, **extra) or [_line(self.part("", **extra))]

    def _piece_lines(self, pieces: list[Piece], reader: ToolCallReader, **extra: Any) -> list[str]:
        """A line per piece of text or call the reader let through, the first with ``extra``: a call whole,
        once it is read, as ollama sends one."""
        pieces, lines = whole(pieces), []
        # the first of these calls' place among the answer's: counted, as two calls alike are equal
        index = len(reader.calls) - sum(isinstance(piece, ToolCall) for piece in pieces)
        for piece in pieces:
            first = {} if lines else extra
            if isinstance(piece, ToolCall):
                lines.append(_line(self.part("", [_ollama_call(piece, index)], **first)))
                index += 1
            else:
                lines.append(_line(self.part(piece, **first)))
        return lines

    async def lines(self, ticket: Ticket, seed: int) -> AsyncIterator[str]:
        """NDJSON: a line per token with its ``ead`` fields, then the last; a failure mid-answer is an
        ``{"error": ...}`` line, as ollama ends a stream it cannot finish."""
        reader = ToolCallReader(self.tools, True, self.prefill, objects_only=True) if self.tools else None
        async with contextlib.aclosing(answer_messages(ticket)) as messages:
            async for message in messages:
                if isinstance(message, Token):
                    scored = self._logprobs(self._scored.add(message))
                    for line in self._token_lines(
                        message.event.text, reader, ead=token_fields(message.event), **scored
                    ):
                        yield line
                    continue
                if isinstance(message, PromptProgress):  # ollama streams nothing before the first token
                    continue
                if isinstance(message, Failed):
                    error = _respelled(error_of(message))
                    self.log(f"error: POST {self.path}: {error.message}")
                    yield error.ndjson_line()
                    return
                held = Split() if self._splitter is None else self._splitter.flush()
                for line in self._split_lines(*held, reader):
                    yield line
                for line in [] if reader is None else self._piece_lines(reader.finish(), reader):
                    yield line
                yield _line(self.last("", message.summary, {"seed": seed}, scored=self._scored.finish()))

    async def whole(self, ticket: Ticket, seed: int, request: Request) -> JSONResponse:
        answer = await collected_calls(
            ticket, request, _respelled, self.tools, True, self.prefill, self.thinking
        )
        if answer is None:
            return JSONResponse({}, status_code=499)
        tokens, summary, text, calls, thinking = answer
        ead = {"tokens": [token_fields(token.event) for token in tokens], "seed": seed}
        said = [_ollama_call(call, index) for index, call in enumerate(calls)]
        scored = [entry for token in tokens for entry in self._scored.add(token)] + self._scored.finish()
        return JSONResponse(self.last(text, summary, ead, said, thinking, scored))


def _ollama_call(call: ToolCall, index: int) -> dict[str, Any]:
    """A call as ollama sends it: its arguments an object (its reader's ``objects_only``), not a JSON
    text."""
    return {"function": {"index": index, "name": call.name, "arguments": json.loads(call.arguments)}}


def _line(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False) + "\n"


def _served_name(name: str, any_model: bool, instead: str = "ead serve --any-model answers any name") -> None:
    """A 404 in ollama's words for a model not served: ``ead`` (``ead:latest``), or any with --any-model;
    ``instead``, what to do to be served that name."""
    if not any_model and name not in (MODEL_ID, LISTED_NAME):
        message = f"model {quoted(name)} not found: this server serves {LISTED_NAME!r} ({instead})"
        raise ApiError(404, message, param="model")


def _refusal(instead: str) -> Callable[[], Awaitable[NoReturn]]:
    """A model management route's answer: a 501 saying what to do instead, whatever the request."""

    async def refuse() -> NoReturn:
        raise ApiError(501, instead, kind="not_supported_error")

    return refuse


def _stored_bytes(engine: Engine) -> int:
    """The bytes of the served models' files, as ollama sizes a model by its blobs: each local model's
    every shard; a model on a server is not counted (its file is on that machine)."""
    return sum(model_bytes(runner.path) for runner in engine.runners if not isinstance(runner, RemoteRunner))


def _tag(engine: Engine, served: dict[str, Any], started: str, size: int) -> dict[str, Any]:
    """The served model as /api/tags lists it, its ``details`` ollama's (the largest model's size and
    quantization: a llama-server's file type is not listed), ``ead`` as /v1/models says it."""
    labels = "\n".join(runner.label for runner in engine.runners)
    largest = max(engine.runners, key=lambda runner: runner.n_params)
    details = {
        "parent_model": "",
        "format": "gguf",
        "family": MODEL_ID,
        "families": [MODEL_ID],
        "parameter_size": f"{largest.n_params / 1e9:.1f}B",
        "quantization_level": "" if isinstance(largest, RemoteRunner) else largest.file_type,
    }
    return {
        "name": LISTED_NAME,
        "model": LISTED_NAME,
        "modified_at": started,  # when the server loaded it
        "size": size,
        "digest": hashlib.sha256(labels.encode()).hexdigest(),  # which models: a name for the pair
        "details": details,
        "ead": served["ead"],
    }


class _Named(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: Annotated[str, Field(max_length=256)]


class _Pulled(BaseModel):
    """A pull: the name as ``model``, or as ``name`` (ollama's older spelling, which it still reads)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: Annotated[str | None, Field(max_length=256)] = None
    name: Annotated[str | None, Field(max_length=256)] = None
    stream: bool | None = None


def add_routes(app: FastAPI, engine: Engine, any_model: bool) -> None:
    """ollama's routes on ``app``, with its ``Requests``; a key (--api-key) is asked of them as of /v1."""
    requests: Requests = app.state.requests
    keyed = [Depends(requests.authorized)]
    started = _now()
    size = _stored_bytes(engine)  # when the server loaded them: a file removed since is still served

    @app.api_route("/api/version", methods=["GET", "HEAD"], dependencies=keyed)
    async def version() -> dict[str, Any]:
        return {"version": OLLAMA_VERSION}

    @app.api_route("/api/tags", methods=["GET", "HEAD"], dependencies=keyed)
    async def tags() -> dict[str, Any]:
        return {"models": [_tag(engine, requests.served_model(), started, size)]}

    @app.api_route("/api/ps", methods=["GET", "HEAD"], dependencies=keyed)
    async def loaded() -> dict[str, Any]:
        """The models loaded: the one served, for as long as the server runs, its size /api/tags's (the
        weights' bytes, mapped; ollama adds its estimate of the caches and buffers, which ead does not
        measure; nor what is on a GPU: size_vram 0)."""
        tag = _tag(engine, requests.served_model(), started, size)
        kept = ("name", "model", "size", "digest", "details", "ead")
        placed = {"expires_at": NEVER, "size_vram": 0, "context_length": engine.n_ctx}
        return {"models": [{**{key: tag[key] for key in kept}, **placed}]}

    @app.post("/api/show", dependencies=keyed)
    async def show(request: Request) -> dict[str, Any]:
        named = parse(_Named, await requests.json_body(request))
        _served_name(named.model, any_model)
        tag = _tag(engine, requests.served_model(), started, size)
        info = {"general.architecture": MODEL_ID, f"{MODEL_ID}.context_length": engine.n_ctx}
        return {
            "license": "",
            "modelfile": "",
            "parameters": "",
            "template": "",
            "details": tag["details"],
            "model_info": info,
            "capabilities": _capabilities(engine.runners[0]),
            "modified_at": tag["modified_at"],
            "ead": tag["ead"],
        }

    @app.post("/api/pull", dependencies=keyed)
    async def pull(request: Request) -> Any:
        """A pull of the model served answers as ollama's of a model it has, so that clients that pull
        before they use a model go on: its last line, ``{"status": "success"}``, streamed unless
        ``stream: false``; another name is the 404 of a model not served."""
        asked = parse(_Pulled, await requests.json_body(request))
        name = asked.model or asked.name
        if not name:
            raise ApiError(400, "model is required", param="model")  # ollama's words
        _served_name(name, any_model, PULL_INSTEAD)
        if asked.stream is False:
            return PULLED
        return Response(_line(PULLED), media_type=NDJSON)

    for path, (methods, instead) in UNMANAGED.items():  # no route a 404 names as the nearest served
        refusal = _refusal(instead)
        app.add_api_route(
            path, refusal, methods=methods, dependencies=keyed, response_model=None, include_in_schema=False
        )

    @app.post("/api/chat", dependencies=keyed)
    async def chat(request: Request) -> Any:
        asked = parse(OllamaChat, await requests.json_body(request))
        return await _answered(request, asked)

    @app.post("/api/generate", dependencies=keyed)
    async def generate(request: Request) -> Any:
        asked = parse(OllamaGenerate, await requests.json_body(request))
        return await _answered(request, asked)

    @app.post("/api/embed", dependencies=keyed)
    async def embed(request: Request) -> dict[str, Any]:
        started = time.monotonic_ns()
        asked, tokens, vectors = await _embedded(request, OllamaEmbed)
        cut = asked.dimensions or None  # 0: the whole vector, as ollama's zero value says
        return {
            "model": asked.model,
            "embeddings": [normalized(vector[:cut]).tolist() for vector in vectors],
            "total_duration": time.monotonic_ns() - started,
            "load_duration": 0,
            "prompt_eval_count": sum(map(len, tokens)),
        }

    @app.post("/api/embeddings", dependencies=keyed)
    async def embeddings(request: Request) -> dict[str, Any]:
        _, _, vectors = await _embedded(request, OllamaEmbeddings)
        return {"embedding": vectors[0].tolist() if vectors else []}

    async def _embedded(
        request: Request, schema: type[Asked]
    ) -> tuple[Asked, list[list[int]], list[np.ndarray]]:
        """The request, its inputs' tokens (parsed and read on a preparing thread) and their vectors."""
        requests.embedder()  # a 501 before the body is read, without --embeddings

        def prepare(data: bytes) -> tuple[Asked, list[list[int]]]:
            asked = parse(schema, data)
            _served_name(asked.model, any_model)
            return asked, asked.tokens(requests.embedder())

        asked, tokens = await requests.prepared(prepare, await requests.json_body(request))
        return asked, tokens, await requests.embedded(request.url.path, tokens)

    async def _answered(request: Request, asked: OllamaChat | OllamaGenerate) -> Any:
        _served_name(asked.model, any_model)
        body = asked.openai_body(engine.n_ctx)
        chat = isinstance(asked, OllamaChat)
        piece = engine.runners[0].token_bytes
        if asked.loads_only():
            return _Answer(chat, asked.model, request.url.path, requests.log, piece).last("", None, {})
        data = json.dumps(body).encode()
        try:
            if "messages" in body:
                prepared, job = await requests.chat(data)
            else:
                prepared, [job] = await requests.text(data)  # ollama's one prompt
        except ApiError as error:
            raise _respelled(error) from None
        tools = prepared.tool_names() if isinstance(prepared, ChatRequest) else None
        if asked.think and job.thinking is None:  # ollama's 400 for a model that does not think
            raise ApiError(400, f"think: {quoted(asked.model)} does not support thinking", param="think")
        answer = _Answer(
            chat, asked.model, request.url.path, requests.log, piece, tools, job.prefill, job.thinking
        )
        ticket = requests.submit(job)
        seed = job.generation.sampling.seed
        if asked.stream is not False:
            return StreamingResponse(answer.lines(ticket, seed), media_type=NDJSON)
        return await answer.whole(ticket, seed, request)
