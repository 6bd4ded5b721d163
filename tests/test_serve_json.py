"""JSON mode through `ead serve`: `response_format` as llama.cpp's grammar in the one sampler chain the
models share, so whichever model writes a token, the answer stays valid JSON (of the schema's shape)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Literal

import httpx
import openai
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, HI, JSON, TAU, serving
from tiny_models import SPM_PIECES, write_tiny_model

from ead_cli.errors import quoted
from ead_cli.runner import Runner
from ead_cli.serve.converter import LARGEST, integer_bounds
from ead_cli.serve.patterns import portable_pattern, portable_patterns
from ead_cli.serve.schemas import ApiError, ResponseFormat

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        [*pair_args(tiny_pair), *TAU, *CTX], tmp_path_factory.mktemp("serve-json") / "server.log"
    ) as running:
        yield running


def chat(server: Server, **body: object) -> dict:
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_json_object_and_schema_answers_parse_while_both_models_write(server: Server) -> None:
    """The tiny models write noise, yet under the grammar every finished answer is a JSON object, of the
    schema's keys and types when a schema is given; tokens of both models make it up."""
    writers: set[str] = set()
    for seed in range(6):
        for response_format, check in (
            ({"type": "json_object"}, lambda value: isinstance(value, dict)),
            (SCHEMA_FORMAT, lambda value: set(value) == {"name", "age"} and isinstance(value["age"], int)),
        ):
            reply = chat(
                server,
                messages=HI,
                response_format=response_format,
                max_tokens=400,
                temperature=0.8,
                seed=seed,
            )
            choice = reply["choices"][0]
            if choice["finish_reason"] == "length":
                continue  # cut off by max_tokens, as OpenAI's JSON mode warns; the grammar held to there
            # strict=False: the tiny vocabulary's byte tokens may put control characters in strings
            assert check(json.loads(choice["message"]["content"], strict=False)), choice
            writers |= {token["model"] for token in reply["ead"]["tokens"]}
    assert writers == {"small", "large"}


def test_free_text_differs_from_json_mode(server: Server) -> None:
    body = {"messages": HI, "max_tokens": 24, "temperature": 0}
    free = chat(server, **body)["choices"][0]["message"]["content"]
    assert not free.lstrip().startswith("{")  # the tiny models would not write JSON by themselves
    constrained = chat(server, **body, response_format={"type": "json_object"})["choices"][0]["message"]
    assert constrained["content"].lstrip().startswith("{")
    text = chat(server, **body, response_format={"type": "text"})["choices"][0]["message"]["content"]
    assert text == free


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"response_format": {"type": "json_object"}, "ead": {"mode": "spec"}}, "takes tokens back"),
        ({"response_format": {"type": "json_object"}, "ead": {"verify": 0.5}}, "takes tokens back"),
        ({"response_format": {"type": "json_object"}, "ead": {"policy": "lookahead"}}, "takes tokens back"),
        ({"response_format": {"type": "json_schema"}}, "needs its json_schema object"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}},
            "grammar",
        ),
    ],
)
def test_json_mode_that_cannot_hold_is_a_400(server: Server, body: dict, fragment: str) -> None:
    reply = httpx.post(
        f"{server.base_url}/chat/completions", json={"messages": HI, **body}, headers=JSON, timeout=60
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert fragment in error["message"]
    assert error["code"] == "invalid_value" and error["param"] is not None, error


def schema_named(schema: dict, *, strict: bool | None) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": strict}}


def only_strict_refused(schema: dict, where: str) -> None:
    """A strict ``schema`` is a 400 naming ``where`` (the first keyword the grammar drops); the same schema
    not strict is a grammar, a guide."""
    with pytest.raises(ApiError) as refused:
        ResponseFormat.model_validate(schema_named(schema, strict=True)).grammar()
    assert f"response_format.json_schema.{where}: the grammar does not hold" in str(refused.value)
    assert ResponseFormat.model_validate(schema_named(schema, strict=False)).grammar()


def refused_strict(server: Server, body: dict, schema: dict) -> str:
    """A strict request for ``schema`` is a 400 naming response_format: its message."""
    reply = httpx.post(
        f"{server.base_url}/chat/completions",
        json={**body, "response_format": schema_named(schema, strict=True)},
        headers=JSON,
        timeout=60,
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "invalid_value"
    return str(error["message"])


def test_a_strict_schema_keyword_the_grammar_cannot_hold_is_a_400(server: Server) -> None:
    """strict: true promises an answer that meets the whole schema (OpenAI's structured outputs), and the
    converter drops some keywords (a number's bounds, formats but date, time and uuid, uniqueItems...).
    A strict schema with one is a 400 naming it; without strict the schema guides the answer as before,
    as OpenAI's and llama-server's best effort."""
    bounded = {
        "type": "object",
        "properties": {"n": {"type": "number", "minimum": 5, "maximum": 6}},
        "required": ["n"],
    }
    body = {"messages": HI, "max_tokens": 8, "temperature": 0}
    message = refused_strict(server, body, bounded)
    assert "json_schema.schema.properties.n.minimum" in message and "strict" in message
    for strict in (None, False):
        chat(server, **body, response_format=schema_named(bounded, strict=strict))
    # names of properties and definitions are not keywords; what the grammar holds is taken
    held = {
        "type": "object",
        "properties": {
            "minimum": {"type": "string", "format": "date"},
            "format": {"type": "array", "items": {"$ref": "#/$defs/not"}, "maxItems": 2},
        },
        "$defs": {"not": {"type": "string", "maxLength": 3}},
        "required": ["minimum"],
    }
    chat(server, **body, response_format=schema_named(held, strict=True))


BOUNDED_INTEGERS = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 5, "maximum": 6},
        "m": {"type": "integer", "exclusiveMinimum": -40, "exclusiveMaximum": -29},
        "big": {"type": "integer", "minimum": 1000, "maximum": 2**31 - 1},
    },
    "required": ["n", "m", "big"],
    "additionalProperties": False,
}


def finished_answers(
    server: Server, response_format: dict, seeds: int, max_tokens: int, prefill: str | None = None
) -> list:
    """The tiny models' noise (temperature 0.8, one answer per seed) in ``response_format``, after an
    assistant message ``prefill`` if one is given (an empty one too): the values that finished (not cut
    by max_tokens), prefill and answer parsed as one (strict=False: the tiny vocabulary's byte tokens may
    put control characters in strings)."""
    opened = [] if prefill is None else [{"role": "assistant", "content": prefill}]
    answers = []
    for seed in range(seeds):
        reply = chat(
            server,
            messages=[*HI, *opened],
            max_tokens=max_tokens,
            temperature=0.8,
            seed=seed,
            response_format=response_format,
        )
        choice = reply["choices"][0]
        if choice["finish_reason"] == "stop":
            answers.append(json.loads((prefill or "") + choice["message"]["content"], strict=False))
    return answers


def within_bounds(value: dict) -> bool:
    return 5 <= value["n"] <= 6 and -40 < value["m"] < -29 and 1000 <= value["big"] < 2**31


def test_a_strict_schema_with_integer_bounds_is_taken_and_its_answers_keep_within_them(
    server: Server,
) -> None:
    """The converter dropped an integer's bounds: strict schemas with them were a 400, others could
    answer 73 for an integer between 5 and 6. The grammar now holds them: the tiny models' noise, which
    writes any digits it may, keeps every finished answer within the bounds."""
    answers = finished_answers(server, schema_named(BOUNDED_INTEGERS, strict=True), seeds=6, max_tokens=80)
    assert answers
    for answer in answers:
        assert within_bounds(answer), answer


@pytest.mark.parametrize(
    ("bounds", "low", "high"),
    [
        ({"minimum": 4.5, "maximum": 9.5}, 5, 9),
        ({"exclusiveMinimum": 4.5, "exclusiveMaximum": 9}, 5, 8),
        ({"minimum": 4, "exclusiveMinimum": True, "maximum": 9, "exclusiveMaximum": False}, 5, 9),  # draft 4
        ({"minimum": 3, "exclusiveMinimum": 5}, 6, LARGEST),  # the tighter of two
        ({"maximum": 10**30}, -LARGEST, LARGEST),  # the converter's integers have 16 digits at most
    ],
)
def test_an_integer_schemas_bounds_are_read_as_json_schema_means_them(
    bounds: dict, low: int, high: int
) -> None:
    """Bounds that are not integers round inwards, exclusive ones step in by one, draft 4's flags make
    their bound exclusive."""
    assert integer_bounds({"type": "integer", **bounds}) == (low, high)


@pytest.mark.parametrize(
    ("bounds", "reason"),
    [
        ({"minimum": 7, "maximum": 5}, "no integer of up to 16 digits is within minimum 7, maximum 5"),
        ({"maximum": -(10**30)}, "no integer of up to 16 digits is within maximum"),
        ({"minimum": "5"}, "minimum must be a finite number, got '5'"),
        ({"maximum": False}, "maximum must be a finite number, got False"),  # a flag is draft 4's exclusive
    ],
)
def test_integer_bounds_no_answer_can_meet_are_a_400(bounds: dict, reason: str) -> None:
    response_format = ResponseFormat.model_validate(schema_named({"type": "integer", **bounds}, strict=False))
    with pytest.raises(ApiError) as refused:
        response_format.grammar()
    assert reason in str(refused.value) and refused.value.param == "response_format"


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "string", "minLength": 3, "maxLength": 1}, "no string is within minLength 3, maxLength 1"),
        (
            {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 1},
            "no array is within minItems 2, maxItems 1",
        ),
        ({"type": "array", "items": False, "minItems": 1}, "no array is within minItems 1, maxItems 0"),
    ],
)
def test_counts_no_answer_can_meet_are_a_400(schema: dict, reason: str) -> None:
    """The converter wrote the least count alone where it passes the greatest (a string of exactly 3
    characters for maxLength 1): the grammar held answers the schema refuses."""
    response_format = ResponseFormat.model_validate(schema_named(schema, strict=False))
    with pytest.raises(ApiError) as refused:
        response_format.grammar()
    assert str(refused.value) == f"response_format.json_schema.schema cannot be a grammar: {reason}"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": ["integer", "null"], "minimum": 1},  # the converter keeps the list's types alone
        {"type": "integer", "enum": [1, 9], "maximum": 5},  # an enum is read first
        {"type": "number", "maximum": 5},  # a number's bounds are not held
    ],
)
def test_bounds_the_grammar_does_not_hold_stay_refused_in_a_strict_schema(schema: dict) -> None:
    with pytest.raises(ApiError) as refused:
        ResponseFormat.model_validate(schema_named(schema, strict=True)).grammar()
    assert re.search(r"response_format\.json_schema\.schema\.(minimum|maximum): ", str(refused.value))


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"enum": []}, "enum"),
        ({"type": "string", "enum": []}, "enum"),
        ({"type": []}, "type"),
        ({"anyOf": []}, "anyOf"),
        ({"type": "object", "properties": {"a": {"oneOf": []}}}, "oneOf"),
    ],
)
def test_an_empty_list_of_alternatives_is_a_400_that_says_so(schema: dict, keyword: str) -> None:
    """The converter wrote an empty rule for it, which llama.cpp's parser refused in its own words
    (``expecting newline or end at ::= " "?``): no value meets the schema, and the 400 says which."""
    with pytest.raises(ApiError) as refused:
        ResponseFormat.model_validate(schema_named(schema, strict=False)).grammar()
    assert str(refused.value) == (
        f"response_format.json_schema.schema cannot be a grammar: {keyword}: [] allows no value"
    )


@pytest.mark.parametrize(
    ("schema", "got"),
    [
        ({"type": "object", "properties": {"a": 5}}, "5"),
        ({"type": "array", "items": "integer"}, '"integer"'),
        ({"anyOf": [{"type": "string"}, None]}, "null"),
        ({"$ref": "#/$defs/a", "$defs": {"a": False}}, "false"),
    ],
)
def test_a_part_of_a_schema_that_is_no_schema_is_a_400_that_says_so(schema: dict, got: str) -> None:
    """The converter's complaint was Python's (``'int' object has no attribute 'get'``)."""
    with pytest.raises(ApiError) as refused:
        ResponseFormat.model_validate(schema_named(schema, strict=False)).grammar()
    assert str(refused.value) == (
        f"response_format.json_schema.schema cannot be a grammar: a schema is an object or true, got {got}"
    )


@pytest.mark.parametrize("schema", ['{"const": 1e400}', '{"enum": [2, {"a": [-1e999]}]}', '{"const": NaN}'])
def test_a_constant_nan_or_number_past_a_floats_range_is_a_400_not_an_answer_of_infinity(
    server: Server, schema: str
) -> None:
    """The request's parser reads 1e400 as a float's infinity and takes NaN, which the converter wrote
    back as ``Infinity`` and ``NaN``: the answer held to them was no JSON (as RFC 8259 has it)."""
    body = (
        '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30, "response_format": '
        f'{{"type": "json_schema", "json_schema": {{"name": "x", "schema": {schema}}}}}}}'
    )
    reply = httpx.post(f"{server.base_url}/chat/completions", content=body, headers=JSON, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == (
        "response_format.json_schema.schema cannot be a grammar: a const or an enum value holds NaN or a "
        "number past a float's range (1e400), which no JSON answer can hold"
    )


def test_json_object_with_llama_servers_schema_and_json_schema_without_one_are_taken(server: Server) -> None:
    """llama-server's ``{"type": "json_object", "schema": {...}}`` binds the answer to its schema (it was
    ignored: any object came back), and a ``json_schema`` with no ``schema`` (OpenAI's field is optional;
    llama-server reads none as ``{}``) is any JSON value, as a schema ``{}`` is (it was a 400)."""
    body = {"messages": HI, "max_tokens": 20, "temperature": 0}
    digit = {"type": "integer", "minimum": 1, "maximum": 9}
    choice = chat(server, **body, response_format={"type": "json_object", "schema": digit})["choices"][0]
    assert choice["finish_reason"] == "stop" and json.loads(choice["message"]["content"]) in range(1, 10)
    unnamed = chat(server, **body, response_format={"type": "json_schema", "json_schema": {"name": "any"}})
    empty = chat(server, **body, response_format=schema_named({}, strict=False))
    assert unnamed["choices"][0]["message"] == empty["choices"][0]["message"]
    json.loads(unnamed["choices"][0]["message"]["content"], strict=False)


def test_an_array_of_any_items_or_of_none_is_held(server: Server) -> None:
    """``items: {}`` (any item: pydantic's ``list[Any]``) and ``items: false`` (no item) were a 400 in
    Python's words ("'prefixItems'"): the converter took an empty or false ``items`` for none given."""
    for items, check in (({}, lambda value: isinstance(value, list)), (False, lambda value: value == [])):
        schema = {"type": "object", "properties": {"a": {"type": "array", "items": items}}, "required": ["a"]}
        values = finished_answers(server, schema_named(schema, strict=True), seeds=4, max_tokens=60)
        assert values and all(check(value["a"]) for value in values), values


def test_a_schema_true_is_any_value() -> None:
    """JSON Schema's ``true`` (any value), as a property's schema: it was a 400, Python's complaint."""
    schema = {"type": "object", "properties": {"a": True}, "required": ["a"]}
    assert ResponseFormat.model_validate(schema_named(schema, strict=False)).grammar()


@pytest.mark.parametrize("any_value", [True, {}])
def test_a_schema_true_or_empty_holds_any_value_not_only_an_object(server: Server, any_value: object) -> None:
    """The converter wrote ``{}`` (and so ``true``) as an object alone, as llama.cpp's converter does: a
    property of any value, or pydantic's ``list[Any]`` items, could only be an object."""
    schema = {
        "type": "object",
        "properties": {"a": any_value, "b": {"type": "array", "items": any_value}},
        "required": ["a", "b"],
    }
    prefill = '{"a": 1, "b": ["x", null, [true]'
    values = finished_answers(server, schema_named(schema, strict=False), 4, 60, prefill)
    assert values and all(value["a"] == 1 and value["b"][:3] == ["x", None, [True]] for value in values)


def test_a_ref_reads_json_pointers_escapes() -> None:
    """A $ref is a JSON pointer: ``~1`` stands for "/" and ``~0`` for "~" in a name (RFC 6901), which the
    lookup read as they stand (a 400: the ref named no part of the schema)."""
    schema = {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/a~0b"}, "y": {"$ref": "#/$defs/c~1d"}},
        "$defs": {"a~b": {"type": "integer"}, "c/d": {"type": "boolean"}},
    }
    grammar = ResponseFormat.model_validate(schema_named(schema, strict=True)).grammar()
    assert grammar is not None and "integer" in grammar and "boolean" in grammar


def test_a_ref_key_that_is_a_name_or_data_is_no_ref(server: Server) -> None:
    """A $ref is a keyword of a schema only: a property named "$ref" (a map of names, not a schema) was a
    400 in Python's words ("unhashable type: 'dict'"), and a const or an enum holding an object with a
    "$ref" key (a value, not a schema) was a 400 saying the ref named no part of the schema."""
    schema = {
        "type": "object",
        "properties": {"$ref": {"type": "boolean"}, "c": {"const": {"$ref": "#/nowhere"}}},
        "required": ["$ref", "c"],
        "additionalProperties": False,
    }
    values = finished_answers(server, schema_named(schema, strict=True), seeds=4, max_tokens=60)
    assert values and all(
        isinstance(value["$ref"], bool) and value["c"] == {"$ref": "#/nowhere"} for value in values
    ), values


@pytest.mark.parametrize(
    ("response_format", "prefill", "check"),
    [
        ({"type": "json_object"}, '{"answer": "', lambda value: isinstance(value["answer"], str)),
        (SCHEMA_FORMAT, '{"name": "Al', lambda value: value["name"].startswith("Al") and "age" in value),
        (schema_named(BOUNDED_INTEGERS, strict=True), '{"n": 6, "m": -3', within_bounds),
        ({"type": "json_object"}, "", lambda value: isinstance(value, dict)),
        # written over indented lines, a blank one between, as llama.cpp's converter lets JSON be written
        (SCHEMA_FORMAT, '{\n  "name": "Al",\n\n  "age": 3', lambda value: value["name"] == "Al"),
        ({"type": "json_object"}, '{\n\n\t"answer": [\n\t\t1,\n', lambda value: value["answer"][0] == 1),
    ],
)
def test_an_assistant_prefill_opens_the_json_answer_the_grammar_finishes(
    server: Server, response_format: dict, prefill: str, check: Callable[[dict], bool]
) -> None:
    """The grammar bound the continuation alone: after a prefill it opened a second object (``{"a": "{``).
    It now follows the prefill's text first, so prefill and answer are one value of the format."""
    values = finished_answers(server, response_format, seeds=6, max_tokens=80, prefill=prefill)
    assert values
    for value in values:
        assert isinstance(value, dict) and check(value), value


@pytest.mark.parametrize(
    ("response_format", "prefill", "rest"),
    [
        ({"type": "json_object"}, "Sure! Here it is", "Sure! Here it is"),
        ({"type": "json_object"}, '{"a": 1}}', "}"),
        (SCHEMA_FORMAT, '{"name": "Al", "height": 2', 'height": 2'),
        (schema_named(BOUNDED_INTEGERS, strict=True), '{"n": 7', "7"),
        # è's first byte, which é shares, is allowed: the character it begins is where the prefill breaks
        (schema_named({"enum": ["é"]}, strict=True), '"è', "è"),
    ],
)
def test_an_assistant_prefill_the_format_rules_out_is_a_400_and_the_server_lives(
    server: Server, response_format: dict, prefill: str, rest: str
) -> None:
    """llama.cpp aborts the process on a token its grammar rules out: the prefill is checked token by
    token, each allowed before it is taken, and one that breaks the format is a 400 saying where."""
    messages = [*HI, {"role": "assistant", "content": prefill}]
    body = {"messages": messages, "response_format": response_format, "max_tokens": 4}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "messages.1.content" and error["code"] == "invalid_value", error
    where = len(prefill) - len(rest)
    assert error["message"] == (
        f"messages.1.content: the assistant prefill breaks response_format at character {where} "
        f"({rest[:20]!r}): an answer of the format cannot start with it"
    )
    assert chat(server, messages=messages, max_tokens=2)["choices"][0]["finish_reason"] == "length"


@pytest.mark.real
def test_json_schema_on_the_real_pair(real_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server([*pair_args(real_pair)], tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
        reply = client.chat.completions.create(
            model="ead",
            messages=[{"role": "user", "content": "Make up a person: a name and an age."}],
            response_format=SCHEMA_FORMAT,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=60,
        )
        assert reply.choices[0].finish_reason == "stop"
        person = json.loads(reply.choices[0].message.content)
        assert set(person) == {"name", "age"} and isinstance(person["age"], int)
        assert {token["model"] for token in reply.model_extra["ead"]["tokens"]} <= {"small", "large"}
        assert server.stop() == 0


WIDE_BOUNDS = {"minimum": -123456789012345, "maximum": 987654321098765}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        # llama.cpp's grammar parser recursed once per nested optional copy and overflowed its stack:
        # each of these had killed the server
        ({"type": "string", "maxLength": 30000}, "repeats an item 30000 times"),
        ({"type": "string", "pattern": "^a{0,30000}$"}, "repeats an item 30000 times"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": -30000, "maxItems": 5}, "30000 times"),
        # a 20 MB grammar: the item's rule is named after the long key, and spelled out 1000 times
        (
            {
                "type": "object",
                "properties": {
                    "k" * 20000: {"type": "array", "items": {"type": "integer"}, "minItems": 1000}
                },
            },
            "its grammar, which spells each copy out, would be over",
        ),
        # 2 MB of bounded integers, a 19 MB grammar (their digits spelled out): parsed, each held ~300 MB
        (
            {
                "type": "object",
                "properties": {f"n{i}": {"type": "integer", **WIDE_BOUNDS} for i in range(24000)},
                "required": [f"n{i}" for i in range(24000)],
            },
            "the grammar written is 19",
        ),
    ],
)
def test_a_schema_whose_grammar_would_not_fit_is_a_400_and_the_server_lives(
    server: Server, schema: dict, fragment: str
) -> None:
    reply = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"messages": HI, "max_tokens": 2, "response_format": schema_format(schema)},
        headers=JSON,
        timeout=60,
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "response_format"
    assert fragment in reply.json()["error"]["message"]
    at_the_bound = {"type": "string", "minLength": 1, "maxLength": 1000}
    answer = chat(
        server, messages=HI, max_tokens=3, temperature=0, response_format=schema_format(at_the_bound)
    )
    assert answer["choices"][0]["message"]["content"].startswith('"')


def test_a_schema_whose_grammar_llama_cpp_cannot_parse_names_response_format(server: Server) -> None:
    """The converter copies a pattern's unknown escape (``\\x``, ``\\b``) into the grammar, which llama.cpp's
    parser refuses: the 400 had ``param`` null, and llama.cpp printed the whole grammar to the server's
    stderr, a client's newline starting a line of the log. The 400 names llama.cpp's reason instead, and
    the log has the request's one line."""
    for pattern, reason in (
        ("^\\x$", 'expecting 2 hex chars at " "\\"" space'),
        ("^\\b\nFORGED$", "unknown escape at \\b"),
    ):
        before = server.log()
        body = {"messages": HI, "max_tokens": 2, "response_format": schema_format({"pattern": pattern})}
        reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "response_format"
        assert error["message"] == f"llama.cpp could not parse the grammar: {reason}"
        [line] = server.log()[len(before) :].splitlines()
        assert line.startswith("error: POST /v1/chat/completions 400: llama.cpp could not parse the grammar")
    assert chat(server, messages=HI, max_tokens=2)["choices"][0]["finish_reason"] == "length"


LONG_VALUE = "x" * 100000


@pytest.mark.parametrize(
    ("schema", "start"),
    [
        ({"type": "integer", "minimum": LONG_VALUE}, "minimum must be a finite number, got 'xxx"),
        ({"type": "integer", "minimum": 10**200, "maximum": 5}, "no integer of up to 16 digits is within"),
        ({"$ref": "#/$defs/" + LONG_VALUE, "$defs": {"b": {}}}, "$ref '#/$defs/xxx"),
        ({"$ref": "http://" + LONG_VALUE}, "$ref 'http://xxx"),
    ],
)
def test_a_converter_complaint_that_quotes_the_schema_is_cut(
    server: Server, schema: dict, start: str
) -> None:
    """The converter's complaints (its own, and the bounds') quote the schema: a 100 kB value came back
    whole in the 400 and the log line. They are cut as llama.cpp's parser's are, their length said."""
    before = server.log()
    body = {"messages": HI, "max_tokens": 2, "response_format": schema_format(schema)}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=60)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    prefix = "response_format.json_schema.schema cannot be a grammar: "
    assert message.startswith(prefix + start) and re.search(r"\.\.\. \(\d+ characters\)$", message), message
    assert len(message) < len(prefix) + 150
    [line] = server.log()[len(before) :].splitlines()
    assert line.endswith(message)
    assert chat(server, messages=HI, max_tokens=2)["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"ead": {"k" * 12000: 1}}, "ead."),  # pydantic's path to an unknown key
        (  # the path to a keyword a strict schema's grammar does not hold
            {"response_format": schema_named({"properties": {"k" * 12000: {"not": {}}}}, strict=True)},
            "response_format.json_schema.schema.properties.",
        ),
    ],
)
def test_a_long_key_on_the_path_to_a_bad_value_is_cut(server: Server, body: dict, where: str) -> None:
    """The path a 400 names its value by holds the client's keys: a 12 kB one came back whole (twice where
    it is the param too), in the 400 and the log line."""
    reply = httpx.post(
        f"{server.base_url}/chat/completions", json={"messages": HI, **body}, headers=JSON, timeout=60
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["message"].startswith(where + quoted("k" * 12000)) and len(reply.text) < 1000, error


def test_a_schema_no_answer_can_meet_is_a_400_and_the_server_lives(server: Server) -> None:
    """After the opening quote, the empty class [b-a] leaves the grammar no token: llama.cpp took one it
    had ruled out, and its grammar's exception aborted the server."""
    body = {"max_tokens": 8, "response_format": schema_format({"pattern": "^[b-a]$"})}
    for temperature in (0, 0.8):
        reply = httpx.post(
            f"{server.base_url}/chat/completions",
            json={**body, "messages": HI, "temperature": temperature},
            headers=JSON,
            timeout=60,
        )
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "response_format" and "allows no token" in error["message"]
    with httpx.stream(
        "POST", f"{server.base_url}/completions", json={**body, "prompt": "x", "stream": True}, headers=JSON
    ) as streamed:
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-1])["error"]["param"] == "response_format"
    assert "[DONE]" not in events
    assert server.log().count("allows no token") == 3
    assert chat(server, messages=HI, max_tokens=2)["choices"][0]["finish_reason"] == "length"


PATTERNS = [
    r"^\d{3}-\d{4}$",
    r"^[\w.-]+@[\w-]+\.[a-z]{2,3}$",
    r"^\(\d{3}\) \d{3}-\d{4}$",
    r"^\D\W\S\s$",
    r"^[^\s,]+\+?$",
    r"^[A-Z]{2}\/\d+\$$",
    r"^a\.b\x41\u00e9\t\\$",
]
PROBES = [
    "555-1234", "555-12345", "a5-1234", "me.x@my-host.org", "me@host.com", "me@host.comm", "@h.io",
    "(555) 123-4567", "(555)123-4567", "x!a ", "x! \t", "1!a ", "x!  ", "abc+", "ab,c", "a b", "",
    "NY/12$", "NY/12", "ny/12$", "a.bAé\t\\", "aXbAé\t\\", "a.bAe\t\\",
]  # fmt: skip


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_patterns_escapes_are_respelled_for_the_grammar_meaning_the_same(pattern: str) -> None:
    """llama.cpp's grammar knows no \\d, \\w, \\s or escaped marks (llama-cpp-python's converter copies
    them, so ^\\d+$ was a 400): they become classes and codes that match exactly the same strings."""
    spelled = portable_pattern(pattern)
    assert not re.search(r"\\[dDwWsS./()+$]", spelled.replace("\\\\", ""))  # an escaped backslash aside
    assert [bool(re.fullmatch(spelled, probe)) for probe in PROBES] == [
        bool(re.fullmatch(pattern, probe, re.ASCII))
        for probe in PROBES  # ECMA's classes are ASCII
    ]
    assert any(re.fullmatch(pattern, probe) for probe in PROBES)
    # a "pattern" inside a value (const, enum) is data, not a pattern
    schema = {
        "type": "object",
        "properties": {"p": {"pattern": pattern}, "c": {"const": {"pattern": pattern}}},
    }
    assert portable_patterns(schema)["properties"] == {
        "p": {"pattern": spelled},
        "c": {"const": {"pattern": pattern}},
    }


def test_a_pattern_with_class_escapes_holds_the_answer(server: Server) -> None:
    """``^\\d{3}-\\d{4}$``, a 400 before, now holds every finished answer of the tiny models' noise."""
    answers = finished_answers(server, schema_format({"type": "string", "pattern": PATTERNS[0]}), 4, 40)
    assert answers
    for answer in answers:
        assert re.fullmatch(PATTERNS[0], answer), answer


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": ["string", "null"], "enum": ["a", "b", None]}, "schema.enum"),
        ({"type": ["string", "null"], "maxLength": 3}, "schema.maxLength"),
        (
            {
                "type": "object",
                "properties": {
                    "who": {
                        "type": ["object", "null"],
                        "properties": {"x": {"type": "integer"}},
                        "required": ["x"],
                    }
                },
            },
            "schema.properties.who.properties",
        ),
    ],
)
def test_a_strict_schema_with_a_list_of_types_and_what_the_grammar_drops_beside_it_is_a_400(
    schema: dict, where: str
) -> None:
    """The converter reads a list of types ("type": ["string", "null"], OpenAI's way to make a strict field
    optional) before anything else and keeps only the types: an enum, properties or lengths beside it are
    dropped (any string, any object came back). strict: true had let them through."""
    response_format = ResponseFormat.model_validate(schema_named(schema, strict=True))
    with pytest.raises(ApiError) as refused:
        response_format.grammar()
    assert f"response_format.json_schema.{where}:" in str(refused.value)
    nullable = {
        "type": "object",
        "properties": {"n": {"type": ["integer", "null"], "description": "a count"}},
    }
    assert ResponseFormat.model_validate(schema_named(nullable, strict=True)).grammar()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "minItems": 2},
        {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 3},
    ],
)
def test_a_strict_array_count_without_one_items_schema_is_a_400(schema: dict) -> None:
    """The converter counts items (minItems, maxItems) only where one schema is given for them all; an
    array of any items or a tuple drops the count (an empty array came back for minItems 2)."""
    response_format = ResponseFormat.model_validate(schema_named(schema, strict=True))
    with pytest.raises(ApiError) as refused:
        response_format.grammar()
    assert "response_format.json_schema.schema.minItems:" in str(refused.value)
    counted = {"type": "array", "items": {"type": "integer"}, "minItems": 2}
    assert ResponseFormat.model_validate(schema_named(counted, strict=True)).grammar()


COLOR_DEFS = {
    "$defs": {"color": {"enum": ["red", "green"]}, "named": {"properties": {"name": {"type": "string"}}}}
}


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "schema.allOf.0.type"),  # `{}` came back
        ({"allOf": [{"type": "string", "maxLength": 2}]}, "schema.allOf.0.type"),
        ({"allOf": [{"minimum": 3, "type": "integer"}]}, "schema.allOf.0.minimum"),  # held elsewhere
        # an allOf beside what the converter reads instead of it
        ({"type": "integer", "allOf": [{"minimum": 3}]}, "schema.allOf"),
        ({"properties": {"n": {"type": "integer"}}, "allOf": [{"required": ["n"]}]}, "schema.allOf"),
        ({"enum": [1, 9], "allOf": [{"maximum": 5}]}, "schema.allOf"),
        # a $ref part: only its target's properties are read (an enum's field came back as `{}`)
        (
            {"properties": {"c": {"allOf": [{"$ref": "#/$defs/color"}]}}, **COLOR_DEFS},
            "schema.properties.c.allOf.0.$ref",
        ),
        # an anyOf part's alternatives are optional: what they require is not held, nor the part's other keys
        (
            {"allOf": [{"anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}]},
            "schema.allOf.0.anyOf.0.required",
        ),
        ({"allOf": [{"anyOf": [{"properties": {}}], "properties": {"b": {}}}]}, "schema.allOf.0.properties"),
        # the object holds the parts' properties and no others, one schema each: the last part's
        (
            {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"type": "null"}}}]},
            "schema.allOf.0.properties.a",
        ),
        (
            {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]},
            "schema.allOf.0.additionalProperties",
        ),
        ({"allOf": [{"properties": {"a": {}}, "required": ["b"]}]}, "schema.allOf.0.required"),
        ({"allOf": [{"properties": {"a": {}}, "required": [["a"]]}]}, "schema.allOf.0.required"),
        ({"allOf": [{"properties": {"a": {}}}], "required": ["a", "b"]}, "schema.required"),
        (
            {"allOf": [{"properties": {"a": {"type": "integer", "multipleOf": 2}}}]},
            "schema.allOf.0.properties.a.multipleOf",
        ),
    ],
)
def test_a_strict_all_of_the_converter_does_not_read_whole_is_a_400(schema: dict, where: str) -> None:
    """The converter reads an allOf only as an object's, and of each part only its properties (all of them
    required; an anyOf part's alternatives' none): a part's type, bounds or lengths, an enum behind a $ref,
    were dropped (an integer's allOf came back `{}`), and strict: true had let them through. Without strict
    the schema still guides the answer."""
    only_strict_refused(schema, where)


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "allOf": [
                {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]},
                {"$ref": "#/$defs/named", "description": "a name too"},
                {"anyOf": [{"properties": {"note": {"type": "string"}}}]},
            ],
            "required": ["name"],
            "title": "counted and named",
            **COLOR_DEFS,
        },
        {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {}}]},
        # a part may require what another part gives: every answer has it
        {
            "allOf": [
                {"properties": {"a": {}}},
                {"type": "object", "properties": {"b": {}}, "required": ["a", "b"]},
            ]
        },
    ],
)
def test_a_strict_all_of_of_objects_the_converter_reads_is_taken(schema: dict) -> None:
    """Parts that are objects of properties (a $ref to one, an anyOf of optional ones), whose required
    names are among the properties every answer has, are held whole."""
    assert ResponseFormat.model_validate(schema_named(schema, strict=True)).grammar()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
        {"type": "object", "required": ["a"]},  # any object
        {"type": "object", "additionalProperties": {"type": "integer"}, "required": ["a"]},
    ],
)
def test_a_strict_required_name_no_property_gives_is_a_400(schema: dict) -> None:
    """The converter requires only the properties it is given (its grammar let ``{}`` through for a name
    required but not given): a strict schema's required list with another name is refused, a schema that
    is not strict served, and a name an array is required to have means nothing."""
    with pytest.raises(ApiError) as refused:
        ResponseFormat.model_validate(schema_named({"properties": {"p": schema}}, strict=True)).grammar()
    assert "response_format.json_schema.schema.properties.p.required: " in str(refused.value)
    assert ResponseFormat.model_validate(schema_named(schema, strict=False)).grammar()
    vacuous = {"type": "array", "items": {"type": "integer"}, "required": ["a"]}
    assert ResponseFormat.model_validate(schema_named(vacuous, strict=True)).grammar()


def test_a_strict_all_of_is_refused_or_taken_over_http_as_the_converter_reads_it(server: Server) -> None:
    """The allOf the converter drops (an integer's: `{}` came back) is a 400 naming it when strict, and
    served as a guide when not; an allOf of objects it reads whole is served strict."""
    body = {"messages": HI, "max_tokens": 8, "temperature": 0}
    integer = {"type": "object", "properties": {"n": {"allOf": [{"type": "integer"}, {"minimum": 3}]}}}
    message = refused_strict(server, body, integer)
    assert message.startswith("response_format.json_schema.schema.properties.n.allOf.0.type: ")
    chat(server, **body, response_format=schema_named(integer, strict=False))
    objects = {"allOf": [{"properties": {"n": {"type": "integer"}}}, {"properties": {"s": {"enum": ["a"]}}}]}
    chat(server, **body, response_format=schema_named(objects, strict=True))


def test_a_strict_tuple_beside_one_items_schema_is_a_400() -> None:
    """The converter reads ``items`` before ``prefixItems``: beside one, the tuple's schemas were dropped
    (the grammar took integers alone for a string then integers). Without strict the items still guide it;
    a tuple alone is held."""
    schema = {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}
    only_strict_refused(schema, "schema.prefixItems")
    pair = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}
    assert ResponseFormat.model_validate(schema_named(pair, strict=True)).grammar()


STRING_DEFS = {"$defs": {"s": {"type": "string", "maxLength": 3}}}


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"$ref": "#/$defs/s", "minLength": 2, **STRING_DEFS}, "schema.minLength"),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}], "type": "integer"}, "schema.type"),
        (
            {"type": "object", "properties": {"a": {}}, "required": ["a"], "anyOf": [{"type": "object"}]},
            "schema.properties",
        ),
        ({"anyOf": [{"type": "string"}], "oneOf": [{"type": "integer"}]}, "schema.anyOf"),  # oneOf is read
        ({"type": "string", "enum": ["a", "bb"], "maxLength": 1}, "schema.maxLength"),
        ({"type": "string", "enum": ["a", 1]}, "schema.type"),
        ({"const": 2, "enum": [1, 3]}, "schema.enum"),
    ],
)
def test_a_strict_keyword_beside_one_the_converter_reads_instead_is_a_400(schema: dict, where: str) -> None:
    """The converter reads a $ref, a oneOf (else an anyOf), a const or an enum before all else and drops
    what is beside it (its grammar took an empty string for a minLength beside a $ref, any object for
    properties beside an anyOf): strict: true took those. A type every value it reads has still holds,
    and a keyword JSON Schema does not know says nothing."""
    only_strict_refused(schema, where)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "enum": ["a", "b"], "description": "a letter"},
        {"const": "a", "enum": ["a"], "type": "string"},  # pydantic's Literal["a"]
        {"anyOf": [{"type": "string"}, {"type": "null"}], "type": ["string", "null"], "default": None},
        {"$ref": "#/$defs/s", "type": "string", "title": "short", **STRING_DEFS},
        {"anyOf": [{"enum": [1, 2]}, {"const": 2.5}], "type": "number", "x-order": 1},
        {"allOf": [{"properties": {"a": {}}, "x-order": 1}]},
    ],
)
def test_what_beside_the_keyword_the_converter_reads_first_holds_is_taken_strict(schema: dict) -> None:
    assert ResponseFormat.model_validate(schema_named(schema, strict=True)).grammar()


def test_a_strict_draft_7_dependencies_keyword_is_a_400() -> None:
    """draft 7's spelling of dependentRequired and dependentSchemas, which the converter drops as it drops
    those (its grammar let an answer with a and no b through)."""
    schema = {"type": "object", "properties": {"a": {}, "b": {}}, "dependencies": {"a": ["b"]}}
    only_strict_refused(schema, "schema.dependencies")


OVERLAPPING = {  # 4 meets both alternatives: JSON Schema's oneOf refuses it, the converter's anyOf takes it
    "type": "object",
    "properties": {"n": {"oneOf": [{"type": "integer"}, {"type": "integer", "enum": [4, 5]}]}},
    "required": ["n"],
    "additionalProperties": False,
}


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):  # a plain union: the openai helper writes anyOf
    pet: Cat | Dog


class Owner(BaseModel):  # a discriminated union: pydantic writes oneOf, the helper keeps it
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


def test_a_strict_one_of_whose_alternatives_may_overlap_is_a_400_naming_it(server: Server) -> None:
    """The converter writes a oneOf as an anyOf, so an answer may meet several alternatives (4 here),
    which JSON Schema's oneOf refuses; OpenAI's strict mode refuses oneOf for it. Strict, it is a 400 at
    its path that says to send anyOf; not strict, the grammar guides as llama.cpp's does."""
    body = {"messages": HI, "max_tokens": 8, "temperature": 0}
    message = refused_strict(server, body, OVERLAPPING)
    assert message == (
        "response_format.json_schema.schema.properties.n.oneOf: the grammar holds oneOf as anyOf (an answer "
        "may meet more than one of its alternatives), and strict: true asks for every keyword to hold: send "
        "anyOf, or strict: false for an answer it guides"
    )
    chat(server, **body, response_format=schema_named(OVERLAPPING, strict=False))
    anyway = json.loads(json.dumps(OVERLAPPING).replace("oneOf", "anyOf"))
    chat(server, **body, response_format=schema_named(anyway, strict=True))


@pytest.mark.parametrize("model", [Pet, Owner])
def test_the_openai_helpers_unions_are_taken_strict(server: Server, model: type[BaseModel]) -> None:
    """The openai client's parse helper writes a union as anyOf, and a discriminated one as pydantic's
    oneOf, whose alternatives each require a kind of their own const: no answer meets two, so the
    converter's anyOf holds it, and strict takes it; every finished answer is one pet."""
    schema = to_strict_json_schema(model)
    assert ("oneOf" in json.dumps(schema)) == (model is Owner)
    response_format = schema_named(schema, strict=True)
    values = finished_answers(server, response_format, seeds=4, max_tokens=120)
    assert values
    for value in values:
        model.model_validate(value)


def test_an_assistant_prefill_opens_the_json_answer_on_a_sentencepiece_vocabulary(
    tmp_path: Path,
) -> None:
    """A SentencePiece tokenizer puts a space before a text and reads a "▁" as one, so the prefill's own
    tokens spelled ' {"name"' and JSON mode with a prefill was a 400 on such models (Llama 2, Mistral,
    Phi-3). The grammar now follows tokens that spell the prefill exactly, as on a byte-level BPE: the
    prefill opens the value, "▁" and all, and one the format rules out is still a 400 saying where."""
    pair = tuple(write_tiny_model(tmp_path / f"spm{seed}.gguf", seed=seed, vocab="spm") for seed in (0, 1))
    with serving([*pair_args(pair), *TAU], tmp_path / "server.log") as running:
        client = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
        for response_format, prefill, check in (
            (SCHEMA_FORMAT, '{"name": "Al', lambda value: value["name"].startswith("Al") and "age" in value),
            ({"type": "json_object"}, '{"a▁b": "▁é', lambda value: value["a▁b"].startswith("▁é")),
        ):
            finished = []
            for seed in range(6):
                reply = client.chat.completions.create(
                    model="ead",
                    messages=[*HI, {"role": "assistant", "content": prefill}],
                    response_format=response_format,  # type: ignore[arg-type]
                    max_tokens=80,
                    temperature=0.8,
                    seed=seed,
                )
                if reply.choices[0].finish_reason == "stop":
                    finished.append(json.loads(prefill + reply.choices[0].message.content, strict=False))
            assert finished and all(check(value) for value in finished), finished
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="ead",
                messages=[*HI, {"role": "assistant", "content": '{"a▁b": 1}}'}],
                response_format={"type": "json_object"},
                max_tokens=4,
            )
        assert refused.value.body["message"] == (  # type: ignore[index]
            "messages.1.content: the assistant prefill breaks response_format at character 10 "
            "('}'): an answer of the format cannot start with it"
        )


def test_a_prefill_on_a_sentencepiece_vocabulary_is_spelled_in_its_pieces_not_its_byte_tokens(
    tmp_path: Path,
) -> None:
    """SentencePiece writes a character as a <0xNN> byte token only where no piece spells it; the spelling
    that the grammar follows had taken the byte token wherever one had a piece's bytes ("{" as <0x7B>,
    the byte tokens' ids coming first): tokens the model never reads for that text."""
    path = write_tiny_model(tmp_path / "spm.gguf", seed=0, vocab="spm")

    def piece(text: str) -> int:
        return 256 + SPM_PIECES.index(text)  # after the 256 byte tokens

    with Runner(path, name="spm", n_ctx=256, n_threads=1) as runner:
        assert runner.spelling('{"the": "né') == [
            *map(piece, ["{", '"', "th", "e", '"', ":", '▁"']),  # "▁" reads as a space
            *"né".encode(),  # no piece spells them
        ]


ODD_STRINGS = ['a"b', "c\\d", "e\nf", "\u0001", "名前", ""]


def test_keys_and_constants_with_quotes_backslashes_and_control_characters_are_held_as_json(
    server: Server,
) -> None:
    """The converter wrote a key's or a constant's JSON text into the grammar without escaping its
    backslashes: a quote or a backslash in it was a 400 from llama.cpp's parser, a newline's ``\\n`` let
    the answer hold a raw newline (not JSON), and a key "" took the root's rule (the answer a bare
    constant). Every finished answer is now JSON (parsed strictly) of the values asked."""
    keyed = {
        "type": "object",
        "properties": {text: {"const": text} for text in ODD_STRINGS},
        "required": ODD_STRINGS,
        "additionalProperties": False,
    }
    for schema, check in (
        ({"enum": ODD_STRINGS}, lambda value: value in ODD_STRINGS),
        (keyed, lambda value: value == {text: text for text in ODD_STRINGS}),
    ):
        finished = []
        for seed in range(4):
            choice = chat(
                server,
                messages=HI,
                response_format=schema_named(schema, strict=True),
                max_tokens=200,
                temperature=0.8,
                seed=seed,
            )["choices"][0]
            if choice["finish_reason"] == "stop":
                finished.append(json.loads(choice["message"]["content"]))
        assert finished and all(check(value) for value in finished), finished
    # characters beyond ASCII as they are, as llama-server writes them: a model seldom writes \u540d
    raw = chat(server, messages=HI, response_format=schema_named({"const": {"名前": "é"}}, strict=True))
    assert raw["choices"][0]["message"]["content"].strip() == '{"名前": "é"}'


class Tree(BaseModel):
    value: int
    children: list[Tree]


def is_tree(value: object) -> bool:
    return isinstance(Tree.model_validate(value), Tree)


def is_chain(value: object) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"value", "next"}
        and (value["next"] is None or is_chain(value["next"]))
    )


def test_recursive_schemas_are_grammars(server: Server) -> None:
    """pydantic writes a recursive model as a $ref to its $defs beside them at the root, and OpenAI's
    structured outputs take "#" for the root itself: the converter read no further into a node with a
    $ref (the $defs' own refs left unresolved, a 400 naming '#/$defs/Tree') and did not take "#". Both
    are grammars: a prefill three levels deep is followed (the tiny models' noise nests without end),
    one that breaks the shape at depth is a 400, and a $ref that names only itself is a 400."""
    chain = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
        "required": ["value", "next"],
        "additionalProperties": False,
    }
    tree = Tree.model_json_schema()  # as instructor and LangChain send it (the openai helper unwraps it)
    assert tree["$ref"] == "#/$defs/Tree"
    # pydantic names a generic model's definition Node_int_: no rule name spells it, and the converter
    # had named the rule of a recursive ref by it as it stands
    node = json.loads(json.dumps(chain).replace('"#"', '"#/$defs/Node_int_"'))
    generic = {"$ref": "#/$defs/Node_int_", "$defs": {"Node_int_": node}}
    chained = '{"value": 1, "next": {"value": 2, "next": {"value": 3, "next": null}}'
    nested = '{"value": 1, "children": [{"value": 2, "children": [{"value": 3, "children": []}]}]'
    for schema, prefill, check in (
        (tree, nested, is_tree),
        (chain, chained, is_chain),
        (generic, chained, is_chain),
    ):
        values = finished_answers(server, schema_named(schema, strict=True), 6, 40, prefill)
        assert values and all(check(value) for value in values), values
        broken = [*HI, {"role": "assistant", "content": prefill.replace("3", '"3"')}]
        for messages, status in ((broken, 400), ([*HI], 200)):
            body = {
                "messages": messages,
                "response_format": schema_named(schema, strict=True),
                "max_tokens": 8,
            }
            reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=60)
            assert reply.status_code == status, reply.text
    # llama.cpp refuses a grammar whose rule reaches itself before any text (a $ref that does) without
    # its parser's words: the 400 had said "could not parse the grammar" alone
    for looped in (
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
        {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
    ):
        reply = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"messages": HI, "response_format": schema_named(looped, strict=False)},
            headers=JSON,
            timeout=60,
        )
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "response_format", reply.text
        assert reply.json()["error"]["message"] == (
            "llama.cpp could not parse the grammar: it has no rule 'root', or a rule that reaches itself "
            "before any text (left recursion)"
        )


def test_a_ref_is_its_definition_whatever_else_shares_its_name(server: Server) -> None:
    """The converter wrote a $ref's target under the ref's last part unless a rule had that name, and
    a property's rule may: "t", a $ref to the integer Tree, was held as the object of the property Tree."""
    schema = {
        "type": "object",
        "properties": {
            "Tree": {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
            "t": {"$ref": "#/$defs/Tree"},
        },
        "required": ["Tree", "t"],
        "additionalProperties": False,
        "$defs": {"Tree": {"type": "integer"}},
    }
    values = finished_answers(server, schema_named(schema, strict=False), seeds=6, max_tokens=60)
    assert values and all(isinstance(value["t"], int) for value in values), values
