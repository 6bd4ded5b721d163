"""The one exception type the CLI turns into a one-line message and a non-zero exit, the one way a
message echoes a bad value (and passes on another library's complaint), the one way it shows a path, and
the one check every layer shares: a number llama.cpp keeps in 32 bits."""

import os
import shlex
import unicodedata


class EadError(Exception):
    """A problem the user can fix: bad input, a missing model, an incompatible pair.

    The message is a single line meant for a person; the CLI prints it as ``error: <message>``
    and exits with ``exit_code`` (2 for usage errors, 1 otherwise).
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


ECHOED_CHARS = 80  # of a bad value, at most, in the message that refuses it


def quoted(value: str) -> str:
    """``value`` as a message that refuses it echoes it: quoted as Python quotes it, and past
    ECHOED_CHARS printed characters cut, with its full length (``'xxx'... (100000 characters)``): a 100 kB
    argument, request field or chat command had been echoed whole, a line of error no one could read.
    Cut where it prints, not where it has characters: an escape prints as four (``\\x1b``), and 80 of
    them had been a 320-character echo. Every surface echoes through this: the command line's options,
    chat's commands, serve's errors."""
    shown = repr(value)
    if len(shown) <= ECHOED_CHARS + 2:  # the quotes besides
        return shown
    kept = next(end for end in range(ECHOED_CHARS, -1, -1) if len(repr(value[:end])) <= ECHOED_CHARS + 2)
    return f"{value[:kept]!r}... ({len(value)} characters)"


# What a shell takes unquoted in a word (shlex's set): a path of only these is shown bare
_SHELL_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")
_BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_C_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def acted_on(char: str) -> bool:
    """A character a terminal acts on or breaks the line at (C0/C1 controls, DEL, line and paragraph
    separators, bidi embeddings, overrides and isolates), or a lone surrogate (a name's undecodable byte)."""
    return unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp") or char in _BIDI_CONTROLS


def shown_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a message shows it: as a shell would need it typed, never cut (a Hugging Face cache
    path runs to 150 characters). Bare when it has only safe characters, the common case; else quoted as
    shlex.quote quotes it ('/tmp/my figures.json'), or, where it holds a character a terminal acts on (a
    newline would split the one-line message in two), in bash's $'...' with that character escaped
    ($'/tmp/a\\nb'; a byte that is not UTF-8, kept by Python as a lone surrogate, as \\xNN)."""
    text = os.fspath(path)
    if text and all(char in _SHELL_SAFE for char in text):
        return text
    if not any(acted_on(char) for char in text):
        return shlex.quote(text)
    return "$'" + "".join(_c_escaped(char) for char in text) + "'"


def _c_escaped(char: str) -> str:
    """One character as bash's $'...' spells it: a quote, a backslash and what a terminal acts on
    escaped, the rest as it is."""
    if char in _C_ESCAPES:
        return _C_ESCAPES[char]
    if not acted_on(char):
        return char
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte surrogateescape kept
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"  # U+0080 and on as characters


REASON_CHARS = 120  # of another library's complaint, at most, in the message that passes it on


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """'1 answer', '2 answers': a count reads as a sentence."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def cut(reason: str) -> str:
    """Another library's complaint as a message passes it on: past REASON_CHARS characters cut, its full
    length said. llama.cpp's grammar parser and the schema converter quote a client's text in theirs, a
    100 kB value whole."""
    if len(reason) <= REASON_CHARS:
        return reason
    return f"{reason[:REASON_CHARS]}... ({len(reason)} characters)"


# The most llama.cpp's 32-bit fields hold (a context's positions, offloaded layers, top-k): a larger value
# wraps around to another, silently (2**32 + 16 is a context of 16)
MAX_INT32 = 2**31 - 1


def check_int32(value: int | None, flag: str) -> None:
    """A usage error for an option's value past llama.cpp's 32 bits."""
    if value is not None and value > MAX_INT32:
        raise EadError(f"{flag} must be at most {MAX_INT32} (llama.cpp's 32 bits), got {value}", exit_code=2)
