"""Tool calling through the GGUF's own chat template: the tools and earlier calls rendered by it, the
model's tool-call markup read back out of the answer as OpenAI's ``tool_calls``, whole or as deltas.

The markup is the Hermes convention that Qwen2.5's template teaches its models (and many others use):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; small models often write the object alone,
as the whole answer, which counts when it names a tool offered. A block that is not valid JSON with a
name stays in the text, as the model wrote it: never a call the model did not make.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from ..runner import Runner

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def template_takes_tools(runner: Runner) -> bool:
    """Whether the chat template renders a ``tools`` list at all (a template that never reads it would
    drop the tools silently, and the model would never learn it may call them)."""
    return "tools" in (runner.chat_template or "")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as a JSON text."""

    name: str
    arguments: str

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def _read_call(body: str, names: frozenset[str] | None = None, objects_only: bool = False) -> ToolCall | None:
    """The call a block of JSON makes; with ``names``, only a call of one of them (a bare JSON answer is
    a call only if it names a tool offered: otherwise it is text, e.g. JSON the user asked for); with
    ``objects_only``, only one whose arguments are an object (or a JSON text of one): ollama's calls
    have no place for others, which stay text, as ollama leaves them."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # nested past Python's recursion limit: not a call either
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    if names is not None and (parsed["name"] not in names or set(parsed) - {"name", "arguments"}):
        return None
    arguments = parsed.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    if objects_only and not isinstance(_loaded(text), dict):
        return None
    return ToolCall(parsed["name"], text)


def _loaded(text: str) -> Any:
    """The JSON value ``text`` holds; None where it holds none."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # nested past Python's recursion limit
        return None


class ToolCallReader:
    """The answer's text as it streams in, split into text to show and calls. Text that may be the start
    of a ``<tool_call>`` is held until it is one or is not; an answer that opens with ``{`` is held to its
    end, where it is a call if it is the bare ``{"name", "arguments"}`` object small models often write
    without the markup. Without ``parallel`` (``parallel_tool_calls: false``) a call after the first is
    left out: the client asked for one at most, and no grammar kept the model from writing more.
    A ``prefill`` (the assistant message the answer continues) is read first, as the answer's start, so a
    call it opens and the answer finishes is one call (as llama-server reads it); its own text, and a call
    it holds whole, are the client's: not shown again, nor the answer's call."""

    def __init__(
        self, names: frozenset[str], parallel: bool = True, prefill: str = "", objects_only: bool = False
    ) -> None:
        self.names = names
        self.parallel = parallel
        self.objects_only = objects_only  # a call's arguments an object, or it is text (_read_call)
        self._pending = prefill
        self._unshown = len(prefill)  # the characters of the text read that are the prefill's
        self._released = 0  # the characters of the text read that are out of _pending
        self._bare: bool | None = None  # undecided until the answer's first character that is not space
        self.calls: list[ToolCall] = []

    def push(self, text: str) -> list[str | ToolCall]:
        """Text pieces and calls that ``text`` completes, in order."""
        self._pending += text
        if self._bare is None and self._pending.strip():
            self._bare = self._pending.lstrip().startswith("{")
        if self._bare is not False:
            return []
        out: list[str | ToolCall] = []
        while True:
            start = self._pending.find(OPEN)
            if start < 0:
                cut = len(self._pending) - _partial_suffix(self._pending, OPEN)
                return [*out, *self._release(cut)]
            end = self._pending.find(CLOSE, start + len(OPEN))
            if end < 0:
                return [*out, *self._release(start)]
            out += self._release(start)
            block = self._pending[len(OPEN) : end - start]
            call = _read_call(block.strip(), objects_only=self.objects_only)
            if call is None:
                out += self._release(end - start + len(CLOSE))
                continue
            self._take(end - start + len(CLOSE))
            if self._released <= self._unshown:
                continue  # the prefill holds it whole: the client's call, as its text is
            if self.calls and not self.parallel:
                continue  # one call at most: a later one is neither a call nor text
            self.calls.append(call)
            out.append(call)

    def finish(self) -> list[str | ToolCall]:
        """What is still held at the end: a bare call, or text (an unclosed block stays text)."""
        call = _read_call(self._pending.strip(), self.names, self.objects_only) if self._bare else None
        if call is not None:
            whole_in_prefill = self._released + len(self._pending.rstrip()) <= self._unshown
            self._take(len(self._pending))
            if whole_in_prefill:  # the client's call, as its text is
                return []
            self.calls.append(call)
            return [call]
        if self._bare:  # held whole: it may still hold tagged calls after all
            self._bare = False
            return [*self.push(""), *self.finish()]
        return self._release(len(self._pending))

    def _release(self, count: int) -> list[str]:
        """The text of the first ``count`` characters held, taken out of them: none of it the prefill's."""
        unshown = max(0, self._unshown - self._released)
        shown = self._take(count)[unshown:]
        return [shown] if shown else []

    def _take(self, count: int) -> str:
        """The first ``count`` characters held, out of them (shown, or a call's markup)."""
        text, self._pending = self._pending[:count], self._pending[count:]
        self._released += count
        return text


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def split_answer(
    text: str, names: frozenset[str], parallel: bool = True, prefill: str = "", objects_only: bool = False
) -> tuple[str, list[ToolCall]]:
    """A whole answer: its text outside the calls (stripped of the blank lines around them), and its calls,
    read after the ``prefill`` it continues (``objects_only``: as ``_read_call``)."""
    reader = ToolCallReader(names, parallel, prefill, objects_only)
    pieces = [*reader.push(text), *reader.finish()]
    shown = "".join(piece for piece in pieces if isinstance(piece, str))
    return (shown.strip() if reader.calls else shown), reader.calls


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message as chat templates take it: a call's arguments as an object (Qwen2.5's template,
    like transformers', writes them with ``tojson``; a JSON text there would be quoted twice)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    rendered = []
    for call in calls:
        function = dict(call["function"])
        # Not JSON, or nested past Python's recursion limit: the template gets the text the client sent.
        with contextlib.suppress(ValueError, RecursionError):
            function["arguments"] = json.loads(function["arguments"])
        rendered.append({**call, "function": function})
    return {**message, "tool_calls": rendered}
