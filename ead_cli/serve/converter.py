"""A JSON schema as a llama.cpp grammar: llama-cpp-python's converter, which drops an integer's bounds (an
integer of minimum 5 and maximum 6 came back 73), with those bounds held by a grammar of digit ranges.

The construction is llama.cpp's own (``_generate_min_max_int`` in its examples/json_schema_to_grammar.py,
``build_min_max_int`` in common/json-schema-to-grammar.cpp, which llama-server uses), written afresh: the
lengths the range holds whole together, each other length apart, and within one length a digit string
split where the bounds part. An open
side ends where the converter's own integers do, at 16 digits. Numbers that are not integers keep their
bounds unheld, as in llama.cpp.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from llama_cpp.llama_grammar import (
    INVALID_RULE_CHARS_RE,
    JSON_GBNF,
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    BuiltinRule,
    SchemaConverter,
)

from ..errors import EadError, cut
from .patterns import portable_patterns

MAX_DIGITS = 16  # the converter's integral-part rule: an integer of up to 16 digits
LARGEST = 10**MAX_DIGITS - 1
LOWER_BOUNDS = ("minimum", "exclusiveMinimum")
UPPER_BOUNDS = ("maximum", "exclusiveMaximum")
BOUNDS = frozenset({*LOWER_BOUNDS, *UPPER_BOUNDS})
# Keywords whose value maps names to schemas (a "$ref" there is a name), and those whose value is an
# answer's value, not a schema (a "$ref" there is data)
SCHEMAS_BY_NAME = ("properties", "patternProperties", "dependentSchemas", "$defs", "definitions")
VALUES = ("const", "enum", "default", "examples")
COUNTS = (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"))  # least, greatest, of
# The blank between JSON's tokens in llama.cpp's own converter (common/json-schema-to-grammar.cpp's
# SPACE_RULE, which llama-server's response_format, json_schema and tool calls and llama-cli's -j are
# bound by): a space, or a line's end or two and an indent, as JSON written over several lines has
# (llama-cpp-python's converter takes one space at most, its JSON grammar's ws one line's end)
LLAMA_CPP_SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'
# json_object's grammar: any object, llama.cpp's grammars/json.gbnf (its strings without raw control
# characters, as llama-server's), between its tokens the blank above; ws is its last rule
JSON_OBJECT_GRAMMAR = f"{JSON_GBNF.rpartition('ws ::=')[0]}ws ::= {LLAMA_CPP_SPACE}\n"
# A character of a JSON string, as llama.cpp's converter and json.gbnf write one: no raw control character
# (llama-cpp-python's converter took a raw line break, tab or NUL there, which a JSON parser refuses, and
# "\\/", which they do not write)
JSON_STRING_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4})', [])


# llama-cpp-python's converter spells out a schema's repetitions in the grammar: minLength 5 is five
# copies of a character's rule, maxLength 5 five optional ones nested in each other.
REPEAT_KEYS = ("minLength", "maxLength", "minItems", "maxItems")
QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")  # a pattern's {m}, {m,}, {m,n}
MAX_REPEAT = 1000  # llama.cpp's grammar parser refuses a longer optional run (maxLength 1100), and one
# of ~20,000 overflows its stack: the process dies
MAX_GRAMMAR_CHARS = 2**24  # the repetitions times the schema's size (each copy is at most a rule's name),
# and the grammar written: llama.cpp holds ~15 bytes a character of it while it is parsed and kept


def json_schema_grammar(schema: Any, where: str) -> str:
    """The grammar of a parsed JSON schema, its patterns spelled as llama.cpp reads them: the one path
    from a schema to a grammar (ead serve's JSON mode and tool calls, generate's --json-schema), the blank
    between the JSON's tokens llama.cpp's (``LLAMA_CPP_SPACE``). A usage error, its message opened by
    ``where`` (the schema's field or option), for a schema whose grammar would be too large for llama.cpp
    or that the converter cannot express."""
    schema = portable_patterns(schema)
    text = json.dumps(schema)
    _check_repetitions(schema, text, where)
    try:
        grammar = schema_grammar(text)
    except Exception as error:  # the converter's own complaint about a schema it cannot express
        raise EadError(f"{where} cannot be a grammar: {cut(' '.join(str(error).split()))}", 2) from None
    if len(grammar) > MAX_GRAMMAR_CHARS:  # bounded integers (~800 characters each) pass the check above
        message = (
            f"{where}: the grammar written is {len(grammar)} characters, over the {MAX_GRAMMAR_CHARS} taken "
            "(an integer's bounds spell its digits out)"
        )
        raise EadError(message, 2)
    return grammar


def _repetitions(node: Any) -> Iterator[int]:
    """How many copies of an item each repetition of a schema (at any depth) spells out. A negative
    count counts as its size: a negative minItems lengthens the nested run up to maxItems."""
    if isinstance(node, list):
        for item in node:
            yield from _repetitions(item)
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in REPEAT_KEYS and type(value) is int:
            yield abs(value)
        elif key == "pattern" and isinstance(value, str):
            yield from (max(_quantity(digits) for digits in bounds) for bounds in QUANTIFIER.findall(value))
        else:
            yield from _repetitions(value)


def _quantity(digits: str) -> int:
    """A pattern quantifier's number (none: 0); past nine digits, any number over the bounds will do
    (int() refuses more than 4300)."""
    return int(digits or 0) if len(digits) < 10 else 10**9


def _check_repetitions(schema: Any, text: str, where: str) -> None:
    """A usage error for a schema whose grammar would be too large for llama.cpp (a run past MAX_REPEAT,
    or more than MAX_GRAMMAR_CHARS of copies), before the converter writes it: maxLength 30000 had killed
    the server in llama.cpp's parser, minLength 10**9 asked for a 5 GB grammar."""
    counts = list(_repetitions(schema))
    if counts and max(counts) > MAX_REPEAT:
        message = (
            f"{where} repeats an item {max(counts)} times (minLength, maxLength, minItems, maxItems or a "
            f"pattern's {{m,n}}): at most {MAX_REPEAT} are taken, as the grammar spells each copy out"
        )
        raise EadError(message, 2)
    if sum(counts) * len(text) > MAX_GRAMMAR_CHARS:
        message = (
            f"{where} has {sum(counts)} repetitions in {len(text)} characters: its grammar, which spells "
            f"each copy out, would be over {MAX_GRAMMAR_CHARS} characters"
        )
        raise EadError(message, 2)


def schema_grammar(text: str) -> str:
    """The GBNF grammar of a JSON schema's text, as llama-cpp-python's ``json_schema_to_gbnf`` writes it,
    but for integers' bounds, which it holds, and the blank's rule, llama.cpp's (``LLAMA_CPP_SPACE``)."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    converter._rules["space"] = LLAMA_CPP_SPACE
    converter.visit(converter.resolve_refs(json.loads(text), "stdin"), "")
    return converter.format_grammar()


def holds_bounds(schema: dict[str, Any]) -> bool:
    """Whether the grammar holds this schema's bounds: an integer's, unless the converter reads something
    else of it first."""
    return schema.get("type") == "integer" and read_first(schema) is None


def read_first(schema: dict[str, Any]) -> str | None:
    """The keyword the converter reads of a schema before all else, dropping every other beside it: a
    $ref, a oneOf (else an anyOf), a list of types, a const, an enum; None where it reads none of them."""
    if "$ref" in schema:
        return "$ref"
    if "oneOf" in schema or "anyOf" in schema:
        return "anyOf" if "anyOf" in schema and not schema.get("oneOf") else "oneOf"
    if isinstance(schema.get("type"), list):
        return "type"
    return next((key for key in ("const", "enum") if key in schema), None)


def local_target(root: Any, ref: Any) -> Any:
    """The part of the schema ``root`` that a local $ref names: "#" the whole (the root's recursion, which
    OpenAI's structured outputs take), "#/$defs/a" a part, a JSON pointer (``~1`` a "/" in a name, ``~0``
    a "~"); None where it names none."""
    if ref == "#":
        return root
    if not (isinstance(ref, str) and ref.startswith("#/")):
        return None
    target = root
    for name in (part.replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/")):
        if not (isinstance(target, dict) and name in target):
            return None
        target = target[name]
    return target


class _Converter(SchemaConverter):  # type: ignore[misc]
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._ref_rules: dict[str, str] = {}  # each $ref's rule
        self._root_named = False  # whether the root's visit has begun: a property "" is visited as ""

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        """A builtin rule, a string's character JSON's own (``JSON_STRING_CHAR``): every string the
        converter writes (a value, a key, one of a bounded length) is made of it."""
        return super()._add_primitive(name, JSON_STRING_CHAR if name == "char" else rule)

    def resolve_refs(self, schema: dict[str, Any], url: str) -> dict[str, Any]:
        """Each local $ref's target noted, wherever the $ref sits: the converter's own walk read no further
        into a node with one (a root $ref beside the $defs it names, as pydantic writes a recursive model,
        left the $defs' own refs unresolved), and did not take "#". Only a schema's "$ref" is one: not a
        property's name, nor a key of a const's value. Nothing is fetched (``url`` unused)."""

        def walk(node: Any, names: bool = False) -> None:
            if isinstance(node, list):
                for item in node:
                    walk(item)
            elif isinstance(node, dict) and names:
                for value in node.values():
                    walk(value)
            elif isinstance(node, dict):
                ref = node.get("$ref")
                if ref is not None and not (isinstance(ref, str) and ref in self._refs):
                    target = local_target(schema, ref)
                    if target is None:
                        raise ValueError(f"$ref {ref!r} names no part of the schema ('#' or '#/...')")
                    self._refs[ref] = target
                for key, value in node.items():
                    if key not in VALUES:
                        walk(value, names=key in SCHEMAS_BY_NAME)

        walk(schema)
        return schema

    def _resolve_ref(self, ref: str) -> str:
        """The rule of a $ref's target, written once under a name of its own: the converter named it by the
        ref's last part as it stands, so a recursive one that a rule name cannot spell ("#", pydantic's
        "Node_int_") broke the grammar, and a rule of that name written before stood in for it."""
        rule = self._ref_rules.get(ref)
        if rule is None:
            base = "ref-" + INVALID_RULE_CHARS_RE.sub("-", ref.rpartition("/")[2].strip("#") or "root")
            taken = {*self._rules, *self._ref_rules.values()}
            rule = next(f"{base}{i or ''}" for i in range(len(taken) + 1) if f"{base}{i or ''}" not in taken)
            self._ref_rules[ref] = rule  # before the visit: a recursive ref names it within
            # the rule the visit writes: a primitive's own (integer), never one a recursive ref names
            rule = self._ref_rules[ref] = self.visit(self._refs[ref], rule)
        return rule

    def _format_literal(self, literal: str) -> str:
        """A key's or a constant's JSON text (the converter's only literals) as the grammar reads it: its
        characters beyond ASCII as they are, as llama-server writes them (a model writes 名前, seldom
        \\u540d\\u524d), and its backslashes escaped too, as llama.cpp's own converter escapes them (the
        grammar read the text's escapes as its own: an escaped quote ended the literal, a newline's \\n
        put a raw newline in the answer). A NaN or a number past a float's range (1e400, read as infinity),
        which the request's parser takes, is refused: it had been written ``NaN`` or ``Infinity``, no JSON."""
        try:
            text = json.dumps(json.loads(literal), ensure_ascii=False, allow_nan=False)
        except ValueError:
            raise ValueError(
                "a const or an enum value holds NaN or a number past a float's range (1e400), which no "
                "JSON answer can hold"
            ) from None
        return super()._format_literal(text.replace("\\", "\\\\"))  # type: ignore[no-any-return]

    def visit(self, schema: Any, name: str) -> str:
        if schema is True:  # JSON Schema's any value
            schema = {}
        elif not isinstance(schema, dict):  # the converter's complaint was Python's ('int' object has...)
            raise ValueError(f"a schema is an object or true, got {json.dumps(schema)}")
        items = schema.get("items")
        if (items == {} or items is False) and "prefixItems" not in schema:  # the converter read a falsy
            # items as none given (Python's KeyError 'prefixItems'): any item, or none
            schema = {**schema, "items": True, **({"maxItems": 0} if items is False else {})}
        for least, greatest, kind in COUNTS:  # the converter wrote the least alone
            low, high = schema.get(least), schema.get(greatest)
            if type(low) is int and type(high) is int and low > high:
                raise ValueError(f"no {kind} is within {least} {low}, {greatest} {high}")
        if name == "":  # the root's; a property "" of the root would take the root's rule
            name, self._root_named = ("-" if self._root_named else ""), True
        first = read_first(schema)
        if first in ("anyOf", "oneOf", "type", "enum") and schema[first] == []:  # an empty rule, which
            raise ValueError(f"{first}: [] allows no value")  # llama.cpp's parser refuses in its words
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"  # as the converter names it
        if not schema:  # any value: the converter wrote an object alone, as llama.cpp's does
            value = self._add_primitive("value", PRIMITIVE_RULES["value"])
            return self._add_rule(rule_name, value)  # type: ignore[no-any-return]
        if not (BOUNDS & schema.keys() and holds_bounds(schema)):
            return super().visit(schema, name)  # type: ignore[no-any-return]
        low, high = integer_bounds(schema)
        return self._add_rule(rule_name, f"({integer_range(low, high)}) space")  # type: ignore[no-any-return]


def integer_bounds(schema: dict[str, Any]) -> tuple[int, int]:
    """The least and greatest integer an integer schema's bounds allow, within the converter's 16 digits.
    ``exclusiveMinimum: true`` beside ``minimum`` is draft 4's spelling of an exclusive one."""
    low, high = -LARGEST, LARGEST
    for key in (*LOWER_BOUNDS, *UPPER_BOUNDS):
        value = schema.get(key)
        if value is None or (isinstance(value, bool) and key.startswith("exclusive")):  # draft 4's flags
            continue  # are read with their bound
        if not (type(value) is int or (type(value) is float and math.isfinite(value))):
            raise ValueError(f"{key} must be a finite number, got {value!r}")
        exclusive = key.startswith("exclusive") or schema.get(f"exclusive{key.capitalize()}") is True
        if key in LOWER_BOUNDS:
            low = max(low, math.floor(value) + 1 if exclusive else math.ceil(value))
        else:
            high = min(high, math.ceil(value) - 1 if exclusive else math.floor(value))
    if low > high:
        bounds = ", ".join(f"{key} {schema[key]}" for key in (*LOWER_BOUNDS, *UPPER_BOUNDS) if key in schema)
        raise ValueError(f"no integer of up to {MAX_DIGITS} digits is within {bounds}")
    return low, high


def integer_range(low: int, high: int) -> str:
    """GBNF alternatives for the integers from ``low`` to ``high`` as JSON writes them (no leading zeros,
    no ``-0``)."""
    alternatives = []
    if low < 0:
        alternatives.append(f'"-" ({_naturals(max(1, -high), -low)})')
    if high >= 0:
        alternatives.append(_naturals(max(0, low), high))
    return " | ".join(alternatives)


def _naturals(low: int, high: int) -> str:
    """The numbers from ``low`` to ``high`` (0 <= low <= high): the lengths they hold whole in one
    alternative (one count of digits each would give llama.cpp's grammar a stack per length to follow),
    and the lengths they cut one each."""
    lengths = range(len(str(low)), len(str(high)) + 1)
    whole = [
        length for length in lengths if length > 1 and low <= 10 ** (length - 1) and high >= 10**length - 1
    ]
    alternatives = []
    if whole:
        counts = f"{whole[0] - 1}" if len(whole) == 1 else f"{whole[0] - 1},{whole[-1] - 1}"
        alternatives.append(f"[1-9] [0-9]{{{counts}}}")
    for length in lengths:
        if length not in whole:
            shortest = 10 ** (length - 1) if length > 1 else 0
            alternatives.append(_same_length(str(max(low, shortest)), str(min(high, 10**length - 1))))
    return " | ".join(alternatives)


def _same_length(low: str, high: str) -> str:
    """The digit strings of one length from ``low`` to ``high``: their shared prefix, then the first
    digit where they part, with the rest from ``low``'s onwards, any rest, or the rest up to ``high``'s."""
    shared = next((i for i, (a, b) in enumerate(zip(low, high, strict=True)) if a != b), len(low))
    prefix = f'"{low[:shared]}"' if shared else ""
    if shared == len(low):
        return prefix
    first, last = low[shared], high[shared]
    low_rest, high_rest = low[shared + 1 :], high[shared + 1 :]
    width = len(low_rest)
    if width == 0:
        return f"{prefix} [{first}-{last}]".lstrip()
    zeros, nines = "0" * width, "9" * width
    any_from = first if low_rest == zeros else chr(ord(first) + 1)
    any_to = last if high_rest == nines else chr(ord(last) - 1)
    alternatives = []
    if low_rest != zeros:
        alternatives.append(f"[{first}] ({_same_length(low_rest, nines)})")
    if any_from <= any_to:
        alternatives.append(f"[{any_from}-{any_to}] [0-9]{{{width}}}")
    if high_rest != nines:
        alternatives.append(f"[{last}] ({_same_length(zeros, high_rest)})")
    return f"{prefix} ({' | '.join(alternatives)})".lstrip()
