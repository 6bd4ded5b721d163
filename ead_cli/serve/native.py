"""llama-server's own routes besides ``/tokenize``, ``/detokenize`` and ``/metrics``, for the scripts and
tools written for it: ``POST /completion`` (its native completion, over the same engine, checks and
preparation as ``/v1/completions``: a native request is spelled as the OpenAI request it means, as
ollama.py does, and its answer written in llama-server's shapes), ``POST /infill`` (its
fill-in-the-middle completion: ``/completion`` with the code before and after the cursor and other
files, spelled as a text completion with a suffix), ``GET /props`` (the
server's settings, as llama.cpp's web UI and tools read them) and ``POST /apply-template`` (the chat
template applied to ``messages``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import llama_cpp
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse

from .. import __version__
from ..decoder import Summary, TokenEvent
from ..options import GenerationOptions
from ..prompt import check_text
from ..sampling import SamplingParams
from .app import (
    MODEL_ID,
    Defaults,
    Requests,
    Scored,
    ScoredText,
    answer_messages,
    choice_jobs,
    collected,
    error_of,
    in_turn,
    log_answered,
    queued_in_turn,
    token_fields,
    usage_checked,
    wholes_in_turn,
)
from .engine import Engine, Failed, Job, Log, PromptProgress, Ticket, Token
from .metrics import cached_tokens, generation_seconds, prompt_seconds
from .schemas import (
    CHAIN_ORDERS,
    LLAMA_SAMPLERS,
    MAX_COUNT,
    MAX_TOP_LOGPROBS,
    ApiError,
    CompletionRequest,
    either,
    parse,
    refuse_unless_off,
)
from .tokens import text_of

if TYPE_CHECKING:
    from ..runner import Runner
    from . import ServeOptions

# llama-server's /completion fields of an answer's shape that ead serve does not write, with the values
# that leave the shape as it is; any other is a 400 (the OpenAI check refuses the sampling ones).
SHAPES_NOT_WRITTEN: dict[str, tuple[Any, ...]] = {
    "post_sampling_probs": (None, False),
    "return_progress": (None, False),
    "echo": (None, False),
}
NOT_WRITTEN_WHY = {
    "post_sampling_probs": "the probabilities are the model's, before sampling (n_probs gives them)",
    "echo": "llama-server's answer is its content alone: /v1/completions echoes the prompt",
}
SAMPLERS = list(CHAIN_ORDERS[0])  # ead's one sampler chain, in llama-server's names
LLAMA_SERVER_ORDER = CHAIN_ORDERS[2]  # llama-server's default chain, the one ead's samplers run in
# The samplers and switches of llama-server's generation_settings that ead's chain does not have
# (schemas.UNSUPPORTED refuses them unless off), at the values, of llama-server's types, that leave them off
NOT_RUN: dict[str, Any] = {
    "dynatemp_range": 0.0,
    "min_keep": 0,
}
UNNAMED_FILE = "tmp"  # llama-server's name for an extra file of /infill given without one


class NativeCompletion(BaseModel):
    """The fields of llama-server's /completion that OpenAI's request spells otherwise (``n_predict``,
    ``json_schema``, ``n_probs``) or that only its answer has (``return_tokens``, ``response_fields``:
    the last object's fields, as llama-server picks them). Every other field goes on to the OpenAI
    request as it is, whose checks take it (``prompt``, ``stream``, ``temperature``,
    ``top_k``, ``top_p``, ``min_p``, ``seed``, ``stop``, ``ead``), refuse it (samplers ead does not run,
    unless off) or ignore it (``cache_prompt``, ``id_slot``...)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    n_predict: Annotated[int, Field(ge=-1, le=MAX_COUNT)] | None = None  # -1: as far as the context goes
    json_schema: dict[str, Any] | None = None
    n_probs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # a text completion's logprobs
    return_tokens: bool | None = None
    response_fields: Annotated[list[str], Field(max_length=MAX_COUNT)] | None = None

    def openai_body(self, n_ctx: int) -> dict[str, Any]:
        """The OpenAI text completion's fields this request means."""
        fields = dict(self.model_extra or {})
        refuse_unless_off(fields, SHAPES_NOT_WRITTEN, NOT_WRITTEN_WHY)
        if self.n_predict is not None:
            either("n_predict", self.n_predict, "max_tokens", fields.get("max_tokens"))
            # -1: as far as the context goes (clamped there); 0, which editors send to have other files
            # read into the cache: one token, as llama-server writes one before it checks its limit
            fields["max_tokens"] = {-1: n_ctx, 0: 1}.get(self.n_predict, self.n_predict)
        if self.n_probs:
            fields["logprobs"] = either("n_probs", self.n_probs, "logprobs", fields.get("logprobs"))
        if self.json_schema is not None:
            if fields.get("response_format") is not None:
                message = "json_schema and response_format each give the answer's format: give one"
                raise ApiError(400, message, code="invalid_value", param="json_schema")
            schema = {"name": "json_schema", "schema": self.json_schema}
            fields["response_format"] = {"type": "json_schema", "json_schema": schema}
        return fields

    def respelled(self, error: ApiError) -> ApiError:
        """An OpenAI check's error naming the field as this request spelled it, where it gave the field
        under llama-server's name."""
        spelling = {"max_tokens": "n_predict"} if self.n_predict is not None else {}
        spelling |= {"logprobs": "n_probs"} if self.n_probs else {}
        spelling |= {"response_format": "json_schema"} if self.json_schema is not None else {}
        return error.respelled(spelling, "json_schema")


class ExtraFile(BaseModel):
    """A file of the project beside the one edited, which /infill puts before the code (``input_extra``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    filename: str = UNNAMED_FILE
    text: str


class NativeInfill(NativeCompletion):
    """llama-server's /infill: /completion's fields, with the code before the cursor (``input_prefix``)
    and after it (``input_suffix``), other files (``input_extra``) and the text that follows the prefix
    (``prompt``): the text completion of the prefix with the suffix it means."""

    input_prefix: str
    input_suffix: str
    input_extra: Annotated[list[ExtraFile], Field(max_length=MAX_COUNT)] | None = None
    prompt: str = ""

    def openai_body(self, n_ctx: int) -> dict[str, Any]:
        return {**super().openai_body(n_ctx), "prompt": self.input_prefix, "suffix": self.input_suffix}

    def fim_parts(self) -> tuple[list[tuple[str, str]], str]:
        """The extra files (name and text) and the text after the prefix; a 400 naming one that no model
        can read."""
        files = self.input_extra or []
        for i, file in enumerate(files):
            _readable(file.filename, f"input_extra.{i}.filename")
            _readable(file.text, f"input_extra.{i}.text")
        _readable(self.prompt, "prompt")
        return [(file.filename, file.text) for file in files], self.prompt

    def respelled(self, error: ApiError) -> ApiError:
        """The prefix and suffix are the text completion's prompt and suffix; a prompt too long for the
        context is this request's own (the code around the cursor is trimmed to fit, the prompt is not)."""
        respelled = super().respelled(error)
        if error.code == "context_length_exceeded":
            return respelled
        return respelled.respelled({"prompt": "input_prefix", "suffix": "input_suffix"}, "json_schema")


def _readable(text: str, field: str) -> None:
    usage_checked(lambda: check_text(text, field), field)


def picked(answer: dict[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """The fields of ``answer`` that ``paths`` name, each under its path, keys split at '/' (llama-server's
    ``response_fields``, its json_get_nested_values); a path the answer lacks is left out. The whole
    answer where none is named, as llama-server writes it."""
    if not paths:
        return answer
    found = {}
    for path in paths:
        value: Any = answer
        for key in path.split("/"):
            if not (isinstance(value, dict) and key in value):
                break
            value = value[key]
        else:
            found[path] = value
    return found


def generation_settings(
    generation: GenerationOptions,
    seed: int,
    stream: bool,
    n_probs: int = 0,
    *,
    samplers: Sequence[str] = SAMPLERS,
    n_predict: int | None = None,
) -> dict[str, Any]:
    """llama-server's ``generation_settings`` (a /completion answer's; ``/props``' defaults) of the ones
    ead's decoding has, under its names and of its JSON types, so that its clients read them: the
    ``samplers`` run (one left out at the value that leaves it off, as ead runs it), ``n_predict`` as
    asked (0 and -1 too, where ead writes one token or as far as the context goes), and the samplers ead
    never runs, off; ``seed`` -1 where each request draws a fresh one."""
    sampling = generation.sampling
    limit = generation.max_tokens if n_predict is None else n_predict
    return {
        "seed": seed,
        "temperature": float(sampling.temp),
        "top_k": sampling.top_k,
        "top_p": float(sampling.top_p),
        "min_p": float(sampling.min_p),
        "repeat_last_n": sampling.repeat_last_n,
        "repeat_penalty": float(sampling.repeat_penalty),
        "presence_penalty": float(sampling.presence_penalty),
        "frequency_penalty": float(sampling.frequency_penalty),
        "ignore_eos": generation.ignore_eos,
        **{name: float(getattr(sampling, name)) for name in LLAMA_SAMPLERS},
        # integers and a list in llama-server's, over the floats above
        **{
            name: getattr(sampling, name) for name in ("mirostat", "dry_allowed_length", "dry_penalty_last_n")
        },
        "dry_sequence_breakers": list(sampling.dry_sequence_breakers),
        "stop": list(generation.stop),
        "max_tokens": limit,
        "n_predict": limit,
        "stream": stream,
        "logit_bias": [{"bias": float(bias), "token": token} for token, bias in sampling.logit_bias],
        "n_probs": n_probs,
        "grammar": sampling.grammar or "",
        "samplers": samplers_run(samplers, sampling),
        **NOT_RUN,
    }


def samplers_run(samplers: Sequence[str], sampling: SamplingParams) -> list[str]:
    """The samplers an answer runs, in llama-server's names and chain order (``LLAMA_SERVER_ORDER``):
    those ``samplers`` names, with DRY, typical, top-n-sigma and XTC where their settings turn them on."""
    on = {
        "dry": sampling.dry_on,
        "top_n_sigma": sampling.top_n_sigma > 0,
        "typ_p": sampling.typical_p < 1,
        "xtc": sampling.xtc_probability > 0,
    }
    named = set(samplers) | {name for name, runs in on.items() if runs}
    chain = [name for name in LLAMA_SERVER_ORDER if name in named]
    return ["penalties"] * ("penalties" in named) + chain + ["infill"] * ("infill" in named)


def _timings(summary: Summary) -> dict[str, Any]:
    """llama-server's ``timings`` of an answer: the prompt tokens read (those the caches kept aside) and
    the tokens generated, in milliseconds, from the figures /metrics adds up."""
    cached = cached_tokens(summary)
    read = summary.prompt_tokens - cached
    prompt_ms, predicted_ms = prompt_seconds(summary) * 1000, generation_seconds(summary) * 1000
    return {
        "cache_n": cached,
        "prompt_n": read,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / read if read else 0.0,
        "prompt_per_second": read * 1000 / prompt_ms if prompt_ms else 0.0,
        "predicted_n": summary.generated,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / summary.generated if summary.generated else 0.0,
        "predicted_per_second": summary.generated * 1000 / predicted_ms if predicted_ms else 0.0,
    }


def stop_of(
    runner: Runner, stops: Sequence[str], events: Sequence[TokenEvent], summary: Summary
) -> tuple[str, str]:
    """How an answer of these token ``events`` ended, as llama-server's ``stop_type`` says it (``limit``,
    ``eos``, ``word``, ``none``), and the stop string of ``stops`` that ended it ("" but for a word): the
    one the tokens wrote right after the answer's text (Anthropic's ``stop_sequence`` too)."""
    ids = [event.token for event in events]
    if summary.finish_reason == "length":
        return "limit", ""
    if summary.finish_reason != "stop":
        return "none", ""
    if ids and runner.is_end_of_generation(ids[-1]):
        return "eos", ""
    after = text_of(runner, ids)[len("".join(event.text for event in events)) :]
    return "word", next((stop for stop in stops if after.startswith(stop)), "")


class _Completion:
    """One /completion answer (one of its ``n_cmpl`` choices, the ``index``-th) in llama-server's shapes:
    whole, or a server-sent event per token (its text and id) and a last one with the figures, without
    OpenAI's ``[DONE]``."""

    def __init__(
        self,
        engine: Engine,
        job: Job,
        body: CompletionRequest,
        asked: NativeCompletion,
        path: str,
        log: Log,
        index: int = 0,
    ) -> None:
        self.engine, self.job, self.path, self.log, self.index = engine, job, path, log, index
        self.finished = False  # its last object sent (streamed): not failed
        self.stream, self.return_tokens = body.stream is True, asked.return_tokens is True
        self.samplers, self.n_predict = body.sampler_names(), asked.n_predict
        self.respelled = asked.respelled
        self.fields = asked.response_fields or []
        self.scored = ScoredText(engine.runners[0].token_bytes)  # n_probs: each token's, once it shows

    def _probabilities(self, scored: list[Scored]) -> dict[str, Any]:
        """llama-server's ``completion_probabilities`` of these tokens (none where the request asked for
        none, or none is released yet): each its id, text (a character's bytes begun, not finished, left
        out), bytes and log-probability, and its n likeliest alternatives'."""
        piece = self.engine.runners[0].token_bytes

        def entry(token: int, logprob: float) -> dict[str, Any]:
            data = piece(token)
            return {
                "id": token,
                "token": data.decode("utf-8", "ignore"),
                "bytes": list(data),
                "logprob": logprob,
            }

        listed = [
            {**entry(event.token, scores.logprob), "top_logprobs": [entry(t, lp) for t, lp in scores.top]}
            for event, scores, _ in scored
        ]
        return {"completion_probabilities": listed} if listed else {}

    def _final(
        self, events: list[TokenEvent], summary: Summary, scored: list[Scored], **ead: Any
    ) -> dict[str, Any]:
        """The answer's last object, with the probabilities of the ``scored`` tokens; streamed, its text
        and tokens are the events' (llama-server's empty ``content`` and ``tokens`` here)."""
        log_answered(self.log, self.path, summary)
        runner = self.engine.runners[0]  # every model's vocabulary
        content = "".join(event.text for event in events)
        ids = [event.token for event in events]
        stop_type, word = stop_of(runner, self.job.generation.stop, events, summary)
        generation = self.job.generation
        return {
            "index": self.index,
            "content": "" if self.stream else content,
            "tokens": ids if self.return_tokens and not self.stream else [],
            "id_slot": 0,
            "stop": True,
            "model": MODEL_ID,
            "tokens_predicted": summary.generated,
            "tokens_evaluated": summary.prompt_tokens,
            "generation_settings": generation_settings(
                generation,
                generation.sampling.seed,
                self.stream,
                self.job.logprobs or 0,
                samplers=self.samplers,
                n_predict=self.n_predict,
            ),
            "prompt": text_of(runner, self.job.prompt),
            "has_new_line": "\n" in content,
            "truncated": False,  # ead serve never shifts the context
            "stop_type": stop_type,
            "stopping_word": word,
            "stopped_eos": stop_type == "eos",  # llama-server's older spellings of stop_type
            "stopped_word": stop_type == "word",
            "stopped_limit": stop_type == "limit",
            "tokens_cached": cached_tokens(summary),
            "timings": _timings(summary),
            **self._probabilities(scored),
            "ead": {**ead, "summary": asdict(summary), "seed": generation.sampling.seed},
        }

    async def events(self, ticket: Ticket) -> AsyncIterator[dict[str, str] | bytes]:
        """A ``data: {...}`` event per token (``content``, ``tokens``, ``stop: false``), then the last
        object; a failure mid-answer ends it with an error event."""
        events: list[TokenEvent] = []
        async with contextlib.aclosing(answer_messages(ticket)) as messages:
            async for message in messages:
                if isinstance(message, Token):
                    event = message.event
                    events.append(event)
                    part = {
                        "index": self.index,
                        "content": event.text,
                        "tokens": [event.token],
                        "stop": False,
                        "id_slot": 0,
                        "tokens_predicted": event.index + 1,
                        "tokens_evaluated": len(self.job.prompt),
                        **self._probabilities(self.scored.add(message)),
                        "ead": token_fields(event),
                    }
                    yield {"data": json.dumps(part, ensure_ascii=False)}
                elif isinstance(message, PromptProgress):
                    continue
                elif isinstance(message, Failed):
                    error = self.respelled(error_of(message))
                    self.log(f"error: POST {self.path}: {error.message}")
                    yield error.sse_event()
                else:
                    last = self._final(events, message.summary, self.scored.finish())
                    self.finished = True
                    yield {"data": json.dumps(picked(last, self.fields), ensure_ascii=False)}

    async def whole(self, ticket: Ticket, request: Request) -> dict[str, Any] | None:
        """The answer's one object; None where the client left while it waited (the job cancelled)."""
        try:
            answer = await collected(ticket, request)
        except ApiError as error:  # the generation failed (a schema no answer meets)
            raise self.respelled(error) from None
        if answer is None:
            return None
        tokens, summary = answer
        events = [token.event for token in tokens]
        scored = [entry for token in tokens for entry in self.scored.add(token)] + self.scored.finish()
        ead_tokens = [token_fields(event) for event in events]
        return picked(self._final(events, summary, scored, tokens=ead_tokens), self.fields)


def add_routes(app: FastAPI, engine: Engine, defaults: Defaults, options: ServeOptions) -> None:
    """llama-server's routes on ``app``, with its ``Requests``; a key (--api-key) is asked of them as of
    /v1, as llama-server asks it of every route but /health."""
    requests: Requests = app.state.requests
    keyed = [Depends(requests.authorized)]

    @app.post("/completion", dependencies=keyed)
    async def completion(request: Request) -> Any:
        asked = parse(NativeCompletion, await requests.json_body(request))
        try:
            body, jobs = await requests.text(json.dumps(asked.openai_body(engine.n_ctx)).encode())
        except ApiError as error:
            raise asked.respelled(error) from None
        return await _answered(request, asked, body, jobs)

    @app.post("/infill", dependencies=keyed)
    async def infill(request: Request) -> Any:
        asked = parse(NativeInfill, await requests.json_body(request))
        parts = asked.fim_parts()
        try:
            data = json.dumps(asked.openai_body(engine.n_ctx)).encode()
            body, jobs = await requests.infill(data, parts)
        except ApiError as error:
            raise asked.respelled(error) from None
        return await _answered(request, asked, body, jobs)

    async def _answered(
        request: Request, asked: NativeCompletion, body: CompletionRequest, prompts: list[Job]
    ) -> Any:
        """The answer in llama-server's shapes: whole, or server-sent events; of several prompts (a batch)
        or choices (``n_cmpl``, or ``n``), drawn one after the other as OpenAI's, a list of the objects in
        order (prompt i's choice j at i * n_cmpl + j, as llama-server), or each one's events in turn (each
        object indexed)."""
        jobs = [each for job in prompts for each in choice_jobs(job, body.choices())]
        answers = [
            _Completion(engine, each, body, asked, request.url.path, requests.log, index)
            for index, each in enumerate(jobs)
        ]
        tickets = queued_in_turn(jobs, requests.submit)
        if body.stream:
            streams = [answer.events for answer in answers]
            events = in_turn(tickets, streams, lambda index: answers[index].finished)
            return EventSourceResponse(events, ping=15)
        objects = await wholes_in_turn(tickets, lambda index, ticket: answers[index].whole(ticket, request))
        if objects is None:
            return JSONResponse({}, status_code=499)
        return JSONResponse(objects[0] if len(objects) == 1 else objects)

    @app.api_route("/props", methods=["GET", "HEAD"], dependencies=keyed)
    async def props() -> dict[str, Any]:
        """The server's settings as llama-server's /props gives them, ead's values: a request's defaults
        (the command line's), the context, the models (the largest's path as ``model_path``, each in
        ``ead.models``), the smallest model's chat template, which renders every prompt."""
        generation = defaults.generation
        seed = generation.sampling.seed if "seed" in defaults.policy.given else -1
        settings = {"n_ctx": engine.n_ctx, "params": generation_settings(generation, seed, stream=False)}
        return {
            "default_generation_settings": settings,
            "total_slots": 1,  # one generation at a time
            "model_alias": MODEL_ID,
            "model_path": engine.runners[-1].location,
            "modalities": {"vision": False, "audio": False},
            "endpoint_metrics": options.metrics,
            "chat_template": engine.runners[0].chat_template or "",
            "build_info": f"ead-cli {__version__} (llama-cpp-python {llama_cpp.__version__})",
            "is_sleeping": False,
            "ead": requests.served_model()["ead"],
        }

    @app.post("/apply-template", dependencies=keyed)
    async def apply_template(request: Request) -> dict[str, Any]:
        """``{"prompt": TEXT}``: the chat's prompt as /v1/chat/completions gives the model it."""
        return {"prompt": await requests.template(await requests.json_body(request))}
