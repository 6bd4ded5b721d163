"""Tool calling through the GGUF's own chat template: the tools and earlier calls rendered by it, the
model's tool-call markup read back out of the answer as OpenAI's ``tool_calls``, whole or as deltas.

The markup is the Hermes convention that Qwen2.5's template teaches its models (and many others use):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; small models often write the object alone,
as the whole answer, or in a fenced code block that opens it (a "```json" line before it, "```" after,
as llama.cpp's older Hermes 2 Pro handler read it), which counts when it names a tool offered. A block
that is not valid JSON with a name stays in the text, as the model wrote it: never a call the model did
not make.

A call is begun once the model has written its name and the ``{`` of its arguments (``CallStart``): from
there its arguments are read as JSON as they are written and given out as they grow (``ArgumentsDelta``),
respelled as ``json.dumps`` spells the JSON read (a whole answer's call has them so), so an agent shows the
call's progress; what the model writes after them, to the block's closing tag, is the call's markup, and
arguments the answer cuts off (or that stop being JSON) are closed where they stopped (``_JsonEcho``).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import string
import uuid
from dataclasses import dataclass
from typing import Any

from ..runner import Runner
from .converter import SCHEMAS_BY_NAME, VALUES, json_schema_grammar

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# The openings of a fenced code block that a call may be written in (llama.cpp's older Hermes 2 Pro
# handler's: a fence, ``json`` or ``xml`` or nothing, the line's end), and its closing fence
FENCES = ("```\n", "```json\n", "```xml\n")
FENCE_CLOSE = "```"
# A call's object up to its arguments' ``{``: its name read (group 1, a JSON string), then the arguments
_BEGUN = re.compile(
    r'[ \t\n\r]*\{[ \t\n\r]*"name"[ \t\n\r]*:[ \t\n\r]*("(?:[^"\\\x00-\x1f]|\\.)*")'
    r'[ \t\n\r]*,[ \t\n\r]*"arguments"[ \t\n\r]*:[ \t\n\r]*(?=\{)'
)


def call_grammar(tools: list[dict[str, Any]], parallel: bool, bare: bool = False) -> str:
    """The GBNF grammar of an answer's calls from its first ``<tool_call>`` on, as llama-server's binds
    them: each block a call of a tool offered, its arguments those its JSON schema allows (an ``enum``, an
    integer where it says integer; blank between its tokens as llama.cpp's converter allows it, a line
    break and an indent too), then the answer's end (or, with ``parallel``, another block). Used
    lazily (``call_trigger``), the text before the first block free; or, where ``tool_choice`` forces a
    call, from the answer's first token, over the tools it may call. With ``bare``, the answer may also be
    one call's object alone, blank around it (bound from the answer's start once ``opens_call``: the
    reader takes what follows a bare call's arguments as its markup, so one call only), or in a fenced code
    block (``FENCES``), then the answer's end, as after a tagged call. A usage error for a schema the
    converter cannot express."""
    calls, definitions = [], {}
    for index, tool in enumerate(tools):
        function = tool["function"]
        parameters = function.get("parameters") or {"type": "object"}
        ref = f"#/$defs/tool-{index}"
        definitions[f"tool-{index}"] = _rebased(parameters, ref)
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": function["name"]}, "arguments": {"$ref": ref}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = {"$defs": definitions, "anyOf": calls}
    one = json_schema_grammar(schema, "tools' function.parameters")
    space = "tool-call-space"
    tagged = f"tool-call{f' ({space} tool-call)*' if parallel else ''}"
    fenced = f'{space} tool-call-fence {space} tool-call-object {space} "{FENCE_CLOSE}"'
    return "\n".join(
        [
            f"root ::= {tagged}{f' | {space} tool-call-object {space} | {fenced}' if bare else ''}",
            f'tool-call ::= "{OPEN}" {space} tool-call-object {space} "{CLOSE}"',
            f"tool-call-fence ::= {' | '.join(map(json.dumps, FENCES))}",
            f"{space} ::= [ \\t\\n]{{0,20}}",
            re.sub(r"^root ::=", "tool-call-object ::=", one, count=1, flags=re.MULTILINE),
        ]
    )


def call_trigger(runner: Runner) -> int | None:
    """The vocabulary's token for ``<tool_call>``, which the calls' grammar binds from (llama-server
    triggers its grammar on a trigger word that is one token so); None where the tag is no one token
    (Qwen2.5's vocabulary has it): a pattern trigger would feed the grammar from inside the token that
    completes the tag, and llama.cpp aborts the process where that token goes on past the tag with text
    the grammar rules out."""
    tokens = runner.tokenize(OPEN, add_special=False, parse_special=True)
    return tokens[0] if len(tokens) == 1 else None


def opens_call(text: str, names: frozenset[str]) -> bool | None:
    """Whether an answer's text so far opens a bare call of a tool offered, ``{"name": "<tool>"`` after
    blank space, alone or after a code block's fence (the pattern llama.cpp's older Hermes handler
    triggered its grammar on; 0.3.36's triggers on ``<tool_call>`` alone): None while more text may still
    make it one. JSON that names no tool offered stays free, as the reader leaves it text."""
    rest = text.lstrip(_SPACE)
    fence = _fence(rest)
    if fence is None:
        return None
    rest = rest[len(fence) :]
    for part in ("{", '"name"', ":"):
        rest = rest.lstrip(_SPACE)
        if not rest.startswith(part):
            return None if part.startswith(rest) else False
        rest = rest[len(part) :]
    rest = rest.lstrip(_SPACE)
    quoted = [json.dumps(name, ensure_ascii=False) for name in names]
    if any(rest.startswith(name) for name in quoted):
        return True
    return None if any(name.startswith(rest) for name in quoted) else False


def _fence(text: str) -> str | None:
    """The fence of ``FENCES`` that ``text`` opens with (``""``: none), or None while more text may still
    make it one."""
    for fence in FENCES:
        if text.startswith(fence):
            return fence
    return None if text and any(fence.startswith(text) for fence in FENCES) else ""


def _answer_start(text: str) -> str | None:
    """How an answer opens, read from its text so far: ``"bare"`` (a JSON object), ``"fenced"`` (a code
    block's fence), else ``"text"``; None while it is blank, or may still be a fence."""
    head = text.lstrip()
    if not head:
        return None
    if head.startswith("{"):
        return "bare"
    fence = _fence(head)
    return None if fence is None else "fenced" if fence else "text"


def _rebased(schema: Any, base: str) -> Any:
    """A tool's parameters with their local ``$ref``s (``#/...``, from the parameters' root) pointing where
    the parameters are put in the calls' schema (``base``): values (an ``enum``'s) and the names of
    properties left as they are."""
    if isinstance(schema, list):
        return [_rebased(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rebased: dict[str, Any] = {}
    for key, value in schema.items():
        if key in VALUES:
            rebased[key] = value
        elif key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rebased[key] = base + value[1:]
        elif key in SCHEMAS_BY_NAME and isinstance(value, dict):
            rebased[key] = {name: _rebased(item, base) for name, item in value.items()}
        else:
            rebased[key] = _rebased(value, base)
    return rebased


def template_takes_tools(runner: Runner) -> bool:
    """Whether the chat template renders a ``tools`` list at all (a template that never reads it would
    drop the tools silently, and the model would never learn it may call them)."""
    return "tools" in (runner.chat_template or "")


def new_call_id() -> str:
    """A call's id as OpenAI spells one."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as a JSON text."""

    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": new_call_id(),
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class CallStart:
    """A call begun: its place among the answer's calls and its name, before its arguments (``ArgumentsDelta``
    pieces, then the ``ToolCall`` whole, whose arguments are the pieces added up)."""

    index: int
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """The next piece of the arguments of the call at ``index``, as the model writes them."""

    index: int
    text: str


Piece = str | CallStart | ArgumentsDelta | ToolCall


def _read_call(body: str, names: frozenset[str] | None = None, objects_only: bool = False) -> ToolCall | None:
    """The call a block of JSON makes; with ``names``, only a call of one of them (a bare JSON answer is
    a call only if it names a tool offered: otherwise it is text, e.g. JSON the user asked for); with
    ``objects_only``, only one whose arguments are an object (or a JSON text of one): ollama's calls
    have no place for others, which stay text, as ollama leaves them."""
    try:
        parsed = _json(body)
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


def _json(text: str) -> Any:
    """``json.loads`` of JSON alone: ``NaN``, ``Infinity`` and a number past a float's range (which Python
    reads as infinite) are no JSON value, so no client could read them back (a ``ValueError``)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    def finite(number: str) -> float:
        value = float(number)
        if not math.isfinite(value):
            refuse(number)
        return value

    return json.loads(text, parse_constant=refuse, parse_float=finite)


def _loaded(text: str) -> Any:
    """The JSON value ``text`` holds; None where it holds none."""
    try:
        return _json(text)
    except (ValueError, RecursionError):  # nested past Python's recursion limit
        return None


class ToolCallReader:
    """The answer's text as it streams in, split into text to show and calls. Text that may be the start
    of a ``<tool_call>`` is held until it is one or is not; an answer that opens with ``{`` is held until
    it begins a call of a tool offered, else to its end, where it is a call if it is the bare
    ``{"name", "arguments"}`` object small models often write without the markup; one that opens with a
    code block's fence, until it cannot open a call of a tool offered (``opens_call``), else as a
    ``<tool_call>`` block is, its closing fence for the tag (the fences the call's markup). Each call comes
    as a ``CallStart``, its arguments' pieces and the ``ToolCall``: begun calls as they are written (see the
    module), others once read whole (arguments given as a JSON text, or before the name), in one piece.
    Without ``parallel`` (``parallel_tool_calls: false``) a call after the first is left out: the client
    asked for one at most, and no grammar kept the model from writing more.
    A ``prefill`` (the assistant message the answer continues) is read first, as the answer's start, so a
    call it opens and the answer finishes is one call (as llama-server reads it, whole); its own text, and
    a call it holds whole, are the client's: not shown again, nor the answer's call."""

    def __init__(
        self, names: frozenset[str], parallel: bool = True, prefill: str = "", objects_only: bool = False
    ) -> None:
        self.names = names
        self.parallel = parallel
        self.objects_only = objects_only  # a call's arguments an object, or it is text (_read_call)
        self._pending = prefill
        self._unshown = len(prefill)  # the characters of the text read that are the prefill's
        self._released = 0  # the characters of the text read that are out of _pending
        self._start: str | None = None  # how the answer opens (_answer_start): None while undecided
        self._begun: _BegunCall | None = None  # the call whose arguments are being written
        self.calls: list[ToolCall] = []

    def push(self, text: str) -> list[Piece]:
        """Text pieces and calls' pieces that ``text`` completes, in order."""
        self._pending += text
        if self._start is None:
            self._start = _answer_start(self._pending)
        out: list[Piece] = []
        while True:
            if self._begun is not None:
                out += self._write_begun()
                if self._begun is not None:
                    return out
                continue
            start = len(self._pending) - len(self._pending.lstrip())
            if self._start in (None, "bare"):
                begun = self._begin(start, start, self.names) if self._start else None
                if begun is None:
                    return out
                self._start = "text"  # a bare call: the rest of the answer is its markup
                out.append(begun)
                continue
            if self._start == "fenced":
                opens = opens_call(self._pending, self.names)
                if opens is None:
                    return out
                at = self._pending.index("{", start)  # the call's object, after the fence
                block = self._block(start, at, FENCE_CLOSE, self.names) if opens else []
                if block is None:
                    return out
                self._start = "text"  # text after it (or all of it, where it opens no call)
                out += block
                continue
            start = self._pending.find(OPEN)
            if start < 0:
                cut = len(self._pending) - _partial_suffix(self._pending, OPEN)
                return [*out, *self._release(cut)]
            out += self._release(start)
            block = self._block(0, len(OPEN), CLOSE)
            if block is None:
                return out
            out += block

    def finish(self) -> list[Piece]:
        """What is still held at the end: a begun call's end (its arguments closed where they stopped), a
        bare call, or text (an unclosed block stays text)."""
        if self._begun is not None:
            self._take(len(self._pending))  # the call's markup
            return self._end_begun()
        bare = self._start == "bare"
        call = _read_call(self._pending.strip(), self.names, self.objects_only) if bare else None
        if call is not None:
            whole_in_prefill = self._released + len(self._pending.rstrip()) <= self._unshown
            self._take(len(self._pending))
            return [] if whole_in_prefill else self._read_whole(call)  # the client's call, as its text is
        if bare:  # held whole: it may still hold tagged calls after all
            self._start = "text"
            return [*self.push(""), *self.finish()]
        return self._release(len(self._pending))  # an unclosed block, a fence or blank alone: text

    def _begin(self, start: int, at: int, names: frozenset[str] | None, end: str = "") -> CallStart | None:
        """The start of a call whose object is at ``at`` of the text held, its markup starting at ``start``
        (its name one of ``names``, where given), if it is begun there: its markup to its arguments taken.
        Not one a prefill began (read whole), nor a call after the first without parallel calls. ``end``:
        what ends its markup after its arguments (none: the answer's end); a block is begun or not by its
        text before the first one, so however tokens cut the answer, it reads the same."""
        if self._released + start < self._unshown or (self.calls and not self.parallel):
            return None
        until = self._pending.find(end, at) if end else -1
        begun = _BEGUN.match(self._pending, at, until if until >= 0 else len(self._pending))
        name = _loaded(begun[1]) if begun else None
        if begun is None or not isinstance(name, str) or (names is not None and name not in names):
            return None
        self._take(begun.end())
        self._begun = _BegunCall(CallStart(len(self.calls), name), end)
        return self._begun.start

    def _block(
        self, start: int, at: int, close: str, names: frozenset[str] | None = None
    ) -> list[Piece] | None:
        """A block of markup from ``start`` of the text held, its object at ``at``, closed by ``close``: its
        call begun, or once closed read whole (a call of one of ``names``, where given), or its text where
        it holds none; None while it is neither begun nor closed."""
        begun = self._begin(start, at, names, close)
        if begun is not None:
            return [begun]
        end = self._pending.find(close, at)
        if end < 0:
            return None
        call = _read_call(self._pending[at:end].strip(), names, self.objects_only)
        if call is None:
            return self._release(end + len(close))
        self._take(end + len(close))
        if self._released <= self._unshown:
            return []  # the prefill holds it whole: the client's call, as its text is
        if self.calls and not self.parallel:
            return []  # one call at most: a later one is neither a call nor text
        return self._read_whole(call)

    def _write_begun(self) -> list[Piece]:
        """The begun call's arguments that the text held adds, and its end once its markup ends."""
        begun = self._begun
        assert begun is not None
        out: list[Piece] = []
        if not begun.arguments.ended:
            self._take(begun.arguments.feed(self._pending))
            out += begun.delta(begun.arguments.take_out())
            if not begun.arguments.ended:
                return out
        end = self._pending.find(begun.end) if begun.end else -1
        if end < 0:  # all markup, but the start of its end
            self._take(len(self._pending) - (_partial_suffix(self._pending, begun.end) if begun.end else 0))
            return out
        self._take(end + len(begun.end))
        return [*out, *self._end_begun()]

    def _end_begun(self) -> list[Piece]:
        """The begun call's last piece (what closes its arguments, if they stopped short) and the call."""
        begun = self._begun
        assert begun is not None
        self._begun = None
        closing = begun.arguments.closing()
        call = ToolCall(begun.start.name, begun.arguments.text + closing)
        self.calls.append(call)
        return [*begun.delta(closing), call]

    def _read_whole(self, call: ToolCall) -> list[Piece]:
        """A call read whole, as the answer's: its start, its arguments in one piece, the call."""
        start = CallStart(len(self.calls), call.name)
        self.calls.append(call)
        return [start, *([ArgumentsDelta(start.index, call.arguments)] if call.arguments else []), call]

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


class _BegunCall:
    """A call begun: its start, its arguments as they are written, what ends its markup after them."""

    def __init__(self, start: CallStart, end: str) -> None:
        self.start, self.end = start, end
        self.arguments = _JsonEcho()

    def delta(self, text: str) -> list[ArgumentsDelta]:
        return [ArgumentsDelta(self.start.index, text)] if text else []


_SPACE = " \t\n\r"
# A number's or a literal's characters: read whole, then refused if they are not JSON (NaN, Infinity, 1e999)
_SCALAR = frozenset(string.ascii_letters + string.digits + "+-.")
# The deepest nesting read: Python's JSON parser recurses per level, within the recursion limit (1,000)
# less its caller's frames, and ollama's and Anthropic's replies load a call's arguments as an object
_DEPTH = 500
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _JsonEcho:
    """One JSON object read as it is written, respelled as ``json.dumps(json.loads(...), ensure_ascii=False)``
    spells it, its text given out as it grows (``take_out``) and always closable (``closing``): a string's
    characters as they come, a number or literal once whole, a separator and a key once the value after
    them starts. It stops (``ended``) at the object's end or at what is not JSON (or nested past
    ``_DEPTH``)."""

    def __init__(self) -> None:
        self.text = ""  # all given out
        self._out = ""  # given out, not yet taken
        self._held = ""  # separators and a key, given out with the value that follows them
        self._open: list[str] = []  # the containers open, "}" or "]" each
        self._expect = "value"  # value, first (key or close), key, colon, more (comma or close)
        self._string: str | None = None  # "key" or "value" while in a string
        self._escape = ""  # an escape under way, from its backslash
        self._high = ""  # a high surrogate, until the escape after it says whether it pairs
        self._scalar = ""  # a number or literal under way
        self.ended = False

    def feed(self, text: str) -> int:
        """How many characters of ``text`` are read, up to the object's end or to what is not JSON."""
        for used, char in enumerate(text):
            if self.ended or not self._read(char):
                self.ended = True
                return used
        return len(text)

    def take_out(self) -> str:
        out, self._out = self._out, ""
        return out

    def closing(self) -> str:
        """What closes the text given out: its string, then its containers (nothing once it ended whole)."""
        return ('"' if self._string == "value" else "") + "".join(reversed(self._open))

    def _give(self, text: str) -> None:
        text, self._held = self._held + text, ""
        self.text += text
        self._out += text

    def _read(self, char: str) -> bool:
        """Whether ``char`` goes on the JSON (read), else it is not JSON here."""
        if self._string is not None:
            return self._read_string(char)
        if self._scalar:
            if char in _SCALAR:
                self._scalar += char
                return True
            scalar, self._scalar = self._scalar, ""
            value = _loaded(scalar)
            if value is None and scalar != "null":
                return False
            self._give(json.dumps(value))
            self._expect = "more"
        if char in _SPACE:
            return True
        if self._expect in ("value", "first", "key") and char not in "}]":
            return self._start_value(char)
        if self._expect in ("first", "more") and self._open and char == self._open[-1]:
            self._give(self._open.pop())
            self._expect = "more"
            self.ended = not self._open
            return True
        if self._expect == "more" and char == ",":
            self._held = ", "
            self._expect = "key" if self._open[-1] == "}" else "value"
            return True
        if self._expect == "colon" and char == ":":
            self._held += ": "
            self._expect = "value"
            return True
        return False

    def _start_value(self, char: str) -> bool:
        if self._open and self._open[-1] == "}" and self._expect == "first":
            self._expect = "key"  # an object's first member: a key
        if self._expect == "key":
            if char != '"':
                return False
            self._string, self._held = "key", self._held + '"'
            return True
        if char in "{[":
            if len(self._open) >= _DEPTH:
                return False
            self._give(char)
            self._open.append("}" if char == "{" else "]")
            self._expect = "first"
            return True
        if char == '"':
            self._string = "value"
            self._give('"')
            return True
        if char in _SCALAR:
            self._scalar = char
            return True
        return False

    def _read_string(self, char: str) -> bool:
        if self._escape:
            self._escape += char
            if self._escape[1] != "u":
                decoded = _ESCAPES.get(char)
                return decoded is not None and self._string_char(decoded)
            if char not in "0123456789abcdefABCDEF" and len(self._escape) > 2:
                return False
            return len(self._escape) < 6 or self._string_char(chr(int(self._escape[2:], 16)))
        if char == "\\":
            self._escape = char
            return True
        if char == '"':
            self._flush_high()
            self._emit_string('"')
            self._expect = "colon" if self._string == "key" else "more"
            self._string = None
            return True
        return char >= " " and self._string_char(char)

    def _string_char(self, char: str) -> bool:
        """A character of the string (its escape, if any, read)."""
        escaped, self._escape = bool(self._escape), ""
        if self._high and escaped and "\udc00" <= char <= "\udfff":
            char, self._high = (self._high + char).encode("utf-16", "surrogatepass").decode("utf-16"), ""
        self._flush_high()
        if escaped and "\ud800" <= char <= "\udbff":
            self._high = char  # json.loads pairs it with a low surrogate's escape right after it
            return True
        self._emit_string(json.dumps(char, ensure_ascii=False)[1:-1])
        return True

    def _flush_high(self) -> None:
        if self._high:
            high, self._high = self._high, ""
            self._emit_string(json.dumps(high, ensure_ascii=False)[1:-1])

    def _emit_string(self, text: str) -> None:
        if self._string == "key":
            self._held += text
        else:
            self._give(text)


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class HeldBlank:
    """Blank text where an API that gives text and calls as items in order would open a text item (the
    answer's start, after its reasoning or a call): held until text follows, which it opens the item with,
    and dropped at a call, so that the space between calls is no item of its own."""

    def __init__(self) -> None:
        self.held = ""

    def opening(self, text: str) -> str:
        """The text that opens an item: none while it is blank (held)."""
        if not text.strip():
            self.held += text
            return ""
        text, self.held = self.held + text, ""
        return text

    def drop(self) -> str:
        """The text held, let go (at a call: dropped; at the answer's end: an answer of blank text)."""
        held, self.held = self.held, ""
        return held


def whole(pieces: list[Piece]) -> list[str | ToolCall]:
    """The text pieces and each call whole, its start and its arguments' pieces left out (for an API that
    sends a call once it is read: ollama's, and a whole answer)."""
    return [piece for piece in pieces if isinstance(piece, str | ToolCall)]


def split_answer(
    text: str, names: frozenset[str], parallel: bool = True, prefill: str = "", objects_only: bool = False
) -> tuple[str, list[ToolCall]]:
    """A whole answer: its text outside the calls (stripped of the blank lines around them), and its calls,
    read after the ``prefill`` it continues (``objects_only``: as ``_read_call``)."""
    reader = ToolCallReader(names, parallel, prefill, objects_only)
    pieces = whole([*reader.push(text), *reader.finish()])
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
