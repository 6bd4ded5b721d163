"""Turning a token stream into printable text: whole UTF-8 characters, stop strings held back, and
llama-server's indentation rule for code completion; and llama-cli's escapes in text typed for it."""

from __future__ import annotations

import codecs
import string
from collections.abc import Sequence


class TextStream:
    """Incremental detokenizer with stop strings.

    Bytes of a character split over tokens (or over a model switch) wait until the character is whole.
    Text that could be the start of a stop string is held back until it is clearly not one, so a stop
    string never reaches the output. ``min_indent`` (llama-server's ``n_indent``, editors' code
    completion: 0 is off): a line after the first that starts with fewer blanks ends the text after its
    blanks (``cut_short``: llama-server's stop type "limit", not a stop string's "word").
    """

    def __init__(self, stop: Sequence[str] = (), min_indent: int = 0) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._min_indent = min_indent
        self._indent: int | None = None  # a line's blanks after a newline, till another character
        self._pending = ""
        self.stopped = False
        self.cut_short = False

    def push(self, data: bytes) -> str:
        """Add a token's bytes; return the text that is now safe to show (nothing once stopped)."""
        if self.stopped:
            return ""
        start = len(self._pending)
        self._pending += self._decoder.decode(data)
        if not self._stop and not self._min_indent:  # nothing to hold back: every token's common case
            released, self._pending = self._pending, ""
            return released
        # The earliest match ends the text: one token can bring two stop strings (``xon``, --stop n
        # --stop o), and the first one given may be the later one in the text.
        found = min((at for at in map(self._pending.find, self._stop) if at >= 0), default=-1)
        short = self._short_line(start)
        if short >= 0 and (found < 0 or short < found):
            found, self.cut_short = short, True
        if found >= 0:
            self.stopped = True
            released, self._pending = self._pending[:found], ""
            return released
        keep = self._held_back()
        released = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return released

    def copy(self) -> TextStream:
        """An independent stream in the same state: to look ahead without committing."""
        twin = TextStream(self._stop, self._min_indent)
        twin._decoder.setstate(self._decoder.getstate())
        twin._pending, twin.stopped, twin.cut_short = self._pending, self.stopped, self.cut_short
        twin._indent = self._indent
        return twin

    def flush(self) -> str:
        """At the end: release what was held back (a partial stop string, an unfinished character)."""
        if self.stopped:
            return ""
        released = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return released

    def _short_line(self, start: int) -> int:
        """Where, in the pending text from ``start`` on (the text before it already read), a line after
        a newline has its first character other than a space or tab with fewer of them before it than
        ``min_indent`` (a newline too: a blank line); -1 if none (llama-server's n_indent check)."""
        if not self._min_indent:
            return -1
        for at in range(start, len(self._pending)):
            char = self._pending[at]
            if self._indent is not None and char in " \t":
                self._indent += 1
            elif self._indent is not None and self._indent < self._min_indent:
                return at
            else:
                self._indent = 0 if char == "\n" else None
        return -1

    def _held_back(self) -> int:
        """Length of the longest tail of pending text that is a proper prefix of a stop string."""
        pending = self._pending
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(pending)), longest, -1):
                if pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest


# llama.cpp's string_process_escapes (common/common.cpp): the escapes llama-cli's -e/--escape turns into
# what they stand for in a prompt and a reverse prompt given on its command line
SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "'": "'", '"': '"', "\\": "\\"}
STRTOL_BLANKS = " \t\n\v\f\r"  # what strtol skips before a number


def process_escapes(text: str) -> str:
    """``text`` with llama-cli's escapes processed, so a prompt or a stop string typed as llama.cpp's users
    type them (``-p 'a\\nb'``, ``-r '\\n'``) means what it means there. ``\\xHH`` is a byte, which makes a
    character with those beside it (``\\xc3\\xa9``: é) or stays one that is no UTF-8, kept as Python keeps
    an argument's bytes (surrogateescape) for ``check_text`` to refuse; an escape llama.cpp does not know,
    and a backslash that ends the text, stay as they are."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        escaped = text[i + 1]
        byte = _hex_byte(text[i + 2 : i + 4]) if escaped == "x" else None
        if escaped in SIMPLE_ESCAPES:
            out.append(SIMPLE_ESCAPES[escaped])
        elif byte is not None:
            out.append(chr(byte) if byte < 0x80 else chr(0xDC00 + byte))  # surrogateescape's byte
            i += 2
        else:
            out.append(char + escaped)
        i += 2
    return "".join(out).encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")


def _hex_byte(digits: str) -> int | None:
    """The byte ``\\x`` takes from the two characters after it as llama.cpp reads them, with strtol in base
    16, which must use both: two hex digits, or one after a blank it skips or a sign (``-1`` is 0xff)."""
    if len(digits) != 2 or digits[1] not in string.hexdigits:
        return None
    if digits[0] in string.hexdigits:
        return int(digits, 16)
    if digits[0] in STRTOL_BLANKS + "+":
        return int(digits[1], 16)
    return -int(digits[1], 16) & 0xFF if digits[0] == "-" else None
