"""A JSON Schema's ``pattern`` (an ECMA-262 regular expression) in the subset that llama.cpp's grammar reads.

llama-cpp-python's schema converter copies a pattern's escapes into the grammar as they are, and
llama.cpp's parser knows only its own (``\\t \\n \\r \\\\ \\" \\[ \\] \\- \\xHH \\uHHHH``): ``^\\d+$``,
``\\w``, ``\\s`` and ``a\\.b`` were 400s (llama-server refuses the class escapes too). Here the class
escapes become the classes they stand for (``\\d`` is ``[0-9]``; ``\\D``, ``\\W``, ``\\S`` outside a class
``[^...]``) and an escaped mark its code, in a class of its own outside a class (the converter would
join it to the literal before it, and a ``+`` after it would repeat them both). Escapes with no such
spelling (``\\b`` as a word boundary, back references, ``\\p{...}``) are left for the parser to refuse.
"""

from __future__ import annotations

from typing import Any

CLASS_ESCAPES = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r\\x0B\\x0C"}  # ECMA's, ASCII
CONTROL_ESCAPES = {"v": 0x0B, "f": 0x0C}
KEPT = set('tnr\\"[]-')  # escapes llama.cpp's grammar reads as a regular expression does
HEX_DIGITS = {"x": 2, "u": 4}
NOT_SCHEMAS = {"const", "enum", "default", "examples"}  # values, where a "pattern" key is data


def portable_patterns(node: Any) -> Any:
    """The schema with every ``pattern`` spelled for llama.cpp's grammar (a copy; values untouched)."""
    if isinstance(node, list):
        return [portable_patterns(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: (
            portable_pattern(value)
            if key == "pattern" and isinstance(value, str)
            else value
            if key in NOT_SCHEMAS
            else portable_patterns(value)
        )
        for key, value in node.items()
    }


def portable_pattern(pattern: str) -> str:
    """One pattern, its escapes spelled as llama.cpp's grammar reads them (the rest as it was)."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):  # a trailing backslash stays, for the parser to refuse
            spelled, used = _escape(pattern, i, in_class)
        else:
            if char == "[":
                in_class = True
            elif char == "]":
                in_class = False
            spelled, used = char, 1
        out.append(spelled)
        i += used
    return "".join(out)


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """The escape at ``pattern[i]`` (a backslash and more) as the grammar spells it, and its length."""
    escaped = pattern[i + 1]
    width = HEX_DIGITS.get(escaped, 0)
    if width and _is_hex(pattern[i + 2 : i + 2 + width], width):
        return pattern[i : i + 2 + width], 2 + width  # \xHH, \uHHHH: the grammar's own
    if escaped in KEPT:
        return pattern[i : i + 2], 2
    if escaped.lower() in CLASS_ESCAPES and (escaped.islower() or not in_class):
        members = CLASS_ESCAPES[escaped.lower()]
        if in_class:
            return members, 2
        return f"[{'' if escaped.islower() else '^'}{members}]", 2
    if escaped in CONTROL_ESCAPES or not (escaped.isascii() and escaped.isalnum()):  # \v, \f, a mark
        code = _code(CONTROL_ESCAPES.get(escaped, ord(escaped)))
        return (code if in_class else f"[{code}]"), 2
    return pattern[i : i + 2], 2  # \b, \1, \p, \D in a class...: no spelling in the grammar


def _is_hex(digits: str, width: int) -> bool:
    return len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits)


def _code(point: int) -> str:
    """A character as the grammar's escape: \\xHH, or \\uHHHH past ASCII (\\UHHHHHHHH past the BMP)."""
    if point < 0x80:
        return f"\\x{point:02X}"
    return f"\\u{point:04X}" if point <= 0xFFFF else f"\\U{point:08X}"
