"""The request bodies of ``ead serve``: OpenAI's fields and ead's own options, as pydantic models, and
OpenAI's error object for whatever is wrong with them."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    create_model,
)
from sse_starlette import ServerSentEvent

from ..errors import ECHOED_CHARS, EadError, quoted
from ..option_table import OPTIONS, SERVE, DecodingOption, on, respell
from ..options import NO_LIMIT, PolicyOptions
from ..paths import BOM
from ..policies import BURST_KINDS, parse_tau
from ..sampling import MAX_DRY_BREAKER_BYTES, MAX_DRY_BREAKERS, MAX_LOGIT_BIAS
from ..thinking import REASONING_FORMATS
from .converter import (
    BOUNDS,
    JSON_OBJECT_GRAMMAR,
    SCHEMAS_BY_NAME,
    holds_bounds,
    json_schema_grammar,
    local_target,
    read_first,
)

MAX_COUNT = 2**20  # the bound of every count in a request: far past any use, far below an overflow
MAX_CHOICES = 16  # OpenAI's n: each choice is one more answer, drawn after the one before
# a text completion's batch of prompts (a list of them, as OpenAI and llama-server take it), and its
# answers in all (each prompt's n choices), each drawn in turn
MAX_ANSWERS = 64
MAX_STOPS = 16  # stop strings a request may give (OpenAI takes 4, llama-server any number)
MAX_STOP_CHARS = 512
MAX_TOP_LOGPROBS = 20  # OpenAI's bound
SCHEMA_PATH = "response_format.json_schema.schema"  # where a JSON schema sits in a request
Positive = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Fraction = Annotated[float, Field(ge=0, le=1)]
NAMED_PATTERNS = ("@code",)


def _checked_limit(limit: int, lowest: int) -> int:
    """``max_tokens``: -1, no limit, as llama-server 0.3.36 takes it (its n_predict's alias), or a count
    from ``lowest`` (0: an echoed prompt alone)."""
    if limit != NO_LIMIT and limit < lowest:
        zero = ", 0 (with echo: the prompt alone)" if lowest == 0 else ""
        raise ValueError(
            f"Input should be -1 (no limit: to the context's end){zero} or at least 1, got {limit}"
        )
    return limit


# Validators of one parameter each: pydantic (2.7, the serve extra's floor) passes its ValidationInfo to
# a second one, a default or not.
def _token_limit(limit: int) -> int:
    return _checked_limit(limit, 1)


def _echo_token_limit(limit: int) -> int:
    return _checked_limit(limit, 0)


TokenLimit = Annotated[int, AfterValidator(_token_limit)]
# a text completion's: 0 reads (and with logprobs scores) an echoed prompt and writes nothing, as OpenAI's
# legacy completions and vLLM take it
EchoTokenLimit = Annotated[int, AfterValidator(_echo_token_limit)]


def _named(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        if pattern not in NAMED_PATTERNS:
            raise ValueError(
                f"over HTTP only named patterns ({', '.join(NAMED_PATTERNS)}) are taken, "
                f"got {quoted(pattern)}: "
                "a client's regular expression could run unbounded on every token"
            )
    return patterns


# A request's own types for the options whose command-line text is parsed (named patterns only: a
# client's regular expression could run unbounded on every token).
HTTP_TYPES: dict[str, Any] = {
    "tau": float | Annotated[list[float], Field(max_length=64)] | Annotated[str, Field(max_length=1024)],
    "burst": Positive | Literal[BURST_KINDS],  # type: ignore[valid-type]
    "pattern": Annotated[list[str], Field(max_length=len(NAMED_PATTERNS)), AfterValidator(_named)],
    "tau_range": tuple[float, float],
}


def _http_type(option: DecodingOption) -> Any:
    """A request field of the option table: its choices, or its type with the table's bounds (an integer
    also held under MAX_COUNT, before it reaches a C call), so a value past them is a 400 that names its
    field. Numbers' other checks are the options' own, so a bad value is the command line's message."""
    if option.name in HTTP_TYPES:
        return HTTP_TYPES[option.name]
    if option.choices:
        return Literal[option.choices]  # type: ignore[valid-type]
    if option.kind is int:
        high = MAX_COUNT if option.maximum is None else min(option.maximum, MAX_COUNT)
        return Annotated[int, Field(ge=option.minimum, le=high)]
    if option.kind is float:
        return Annotated[float, Field(ge=option.minimum, le=option.maximum)]
    return option.kind


class _EadBase(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    def policy_changes(self) -> dict[str, Any]:
        """The policy options given, as PolicyOptions takes them (sampling ones aside)."""
        given = self.model_dump(exclude_none=True, exclude=_SAMPLING)
        if isinstance(given.get("tau"), str):
            try:
                given["tau"] = parse_tau(given["tau"])
            except ValueError:
                message = f"ead.tau must be a number of bits or a list, got {quoted(given['tau'])}"
                raise EadError(message) from None
        elif isinstance(given.get("tau"), list):
            given["tau"] = tuple(given["tau"])
        if "pattern" in given:
            given["patterns"] = tuple(given.pop("pattern"))
        return given

    def policy_options(
        self, base: PolicyOptions, levels: int, models_take: Callable[[PolicyOptions], object]
    ) -> PolicyOptions:
        """These options over ``base`` (the command line's), checked by its rules and by ``models_take``
        (the loaded models': a cascade runs no speculative decoding, a llama-server no --verify). A 400
        names the field at fault, as the client spelled it: the one that alone over ``base`` gets the
        same complaint (the rules check the options as a whole), or ``ead`` where only fields together
        do."""
        changed = self._changed(base, levels, models_take)
        if isinstance(changed, PolicyOptions):
            return changed
        given = self.model_dump(exclude_none=True, exclude=_SAMPLING)
        at_fault = next(
            (
                f"ead.{name}"
                for name, value in given.items()
                if type(self).model_construct(**{name: value})._changed(base, levels, models_take) == changed
            ),
            "ead",
        )
        raise ApiError(400, changed, code="invalid_value", param=at_fault)

    def _changed(
        self, base: PolicyOptions, levels: int, models_take: Callable[[PolicyOptions], object]
    ) -> PolicyOptions | str:
        """These options over ``base``, or the command line's complaint about them, naming fields as a
        request spells them."""
        try:
            changed = base.changed(**self.policy_changes(), levels=levels)
            models_take(changed)
        except EadError as error:
            return respell(str(error), SERVE, lambda option: f"ead.{option.name}")
        return changed


_SAMPLING = {option.name for option in on(SERVE) if option.target != "policy"}
# The ``ead`` object of a request: the option table's SERVE options, checked by the command line's rules.
# Every number is bounded before any reaches a C call; patterns are named ones only (the server's own
# ``--pattern`` is its operator's: any regular expression).
EadOptions = create_model(
    "EadOptions",
    __base__=_EadBase,
    **{option.name: (_http_type(option) | None, None) for option in on(SERVE)},
)


# Sampling fields llama-server takes at a request's top level that ead's ``ead`` object takes too: one
# type for both spellings, so the same bounds and the same 400s (CompletionBase.sampling_value).
TopK = _http_type(OPTIONS["top_k"])
MinP = _http_type(OPTIONS["min_p"])
TypicalP = Annotated[float, Field(gt=0, le=1)]  # 1: off
Mirostat = Annotated[int, Field(ge=0, le=2)]  # 0: off, 1: Mirostat, 2: Mirostat 2.0
MirostatRate = Annotated[float, Field(ge=0)]  # its tau (target entropy) and eta (learning rate)
DryMultiplier = Annotated[float, Field(ge=0)]  # 0: off
DryLength = Annotated[int, Field(ge=0, le=2**31 - 1)]  # its allowed length and window, as llama-server's


def _dry_breaker(text: str) -> str:
    if not 0 < len(text.encode("utf-8", "surrogateescape")) <= MAX_DRY_BREAKER_BYTES:
        raise ValueError(f"a sequence breaker must be 1 to {MAX_DRY_BREAKER_BYTES} bytes (llama.cpp's limit)")
    return text


# a list of one at least, as llama-server's, of strings that fit llama.cpp's bytes
DryBreakers = Annotated[
    list[Annotated[str, AfterValidator(_dry_breaker)]], Field(min_length=1, max_length=MAX_DRY_BREAKERS)
]
# The penalties, at a request's top level as OpenAI, llama-server and ollama's options spell them (llama.cpp
# takes any repeat_penalty above 0; OpenAI bounds the other two to [-2, 2]), over the command line's.
RepeatPenalty = Annotated[float, Field(gt=0)]
RepeatLastN = _http_type(OPTIONS["repeat_last_n"])
Penalty = _http_type(OPTIONS["presence_penalty"])
PENALTIES = ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")
# llama-server's fields of llama.cpp's samplers that ead's chain runs besides top-k, top-p and min-p, each a
# SamplingParams field of the same name
MIROSTAT = ("mirostat", "mirostat_tau", "mirostat_eta")
DRY = ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n")
LLAMA_SAMPLERS = ("typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold", *MIROSTAT, *DRY)
# SamplingParams.chain_only's flags as these fields
CHAIN_ONLY_FIELDS = {
    "--dry-multiplier": "dry_multiplier",
    "--mirostat": "mirostat",
    "--typical": "typical_p",
    "--top-n-sigma": "top_n_sigma",
    "--xtc-probability": "xtc_probability",
}
MAX_LOGIT_BIASES = 1024  # tokens a logit_bias may name: each is applied to every row the answer reads
Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]
LogitBias = Annotated[dict[str, Bias], Field(max_length=MAX_LOGIT_BIASES)]

# The sampler orders that are ead's chain: its own, and llama-server's defaults (the lists its /completion
# docs give, its --samplers and --sampler-seq), which run top-k, top-p, min-p, then temperature, as ead
# does, once the samplers ead does not run are off (UNSUPPORTED refuses them otherwise); each with
# llama.cpp's penalties first, or without them (then off, as llama-server runs only the samplers named).
CHAIN_ORDERS = (
    ["top_k", "top_p", "min_p", "temperature"],
    ["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    ["dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "dskypmxt",
)
EAD_SAMPLER_ORDERS = (
    *CHAIN_ORDERS,
    *(["penalties", *order] if isinstance(order, list) else "e" + order for order in CHAIN_ORDERS),
)


# What leaving out a sampler of ead's chain from ``samplers`` sets (llama-server runs only those named):
# each SamplingParams field at its value that changes nothing
UNNAMED_OFF = {
    "top_k": ("top_k", 0),
    "top_p": ("top_p", 1.0),
    "min_p": ("min_p", 0.0),
    "temperature": ("temp", 1.0),
}


# llama.cpp's samplers of ead's chain that only llama-server's default orders name, by name and by
# --sampler-seq's letter: the SamplingParams field and value that a ``samplers`` leaving one out sets
NAMED_BY_DEFAULT_ORDERS = {
    "dry": ("d", "dry_multiplier", 0.0),
    "top_n_sigma": ("s", "top_n_sigma", -1.0),
    "typ_p": ("y", "typical_p", 1.0),
    "xtc": ("x", "xtc_probability", 0.0),
}


def chain_named(samplers: Any) -> list[str] | None:
    """The samplers of ead's chain that a request's ``samplers`` runs, with "infill" last where it
    names it: one of ``EAD_SAMPLER_ORDERS`` runs them all; a list may name fewer of them, in ead's order,
    after "penalties" and before "infill" (llama.vim's ``["top_k", "top_p", "infill"]``). None: samplers
    that ead's chain cannot run as named."""
    if samplers in EAD_SAMPLER_ORDERS:
        return list(CHAIN_ORDERS[0])
    if not isinstance(samplers, list):
        return None
    names = samplers[1:] if samplers[:1] == ["penalties"] else samplers
    infill = names[-1:] == ["infill"]
    names = names[:-1] if infill else names
    if names != [name for name in CHAIN_ORDERS[0] if name in names]:
        return None
    return names + ["infill"] * infill


def runs_penalties(samplers: list[str] | str) -> bool:
    """Whether a ``samplers`` of ``EAD_SAMPLER_ORDERS`` (names, or --sampler-seq's letters, where 'e' is
    the penalties) runs llama.cpp's penalties sampler."""
    return "e" in samplers if isinstance(samplers, str) else "penalties" in samplers


# Fields of OpenAI's API, and of llama-server's (its /completion options, which its OpenAI endpoints take
# too), that would change the answer and that ead serve does not do, with the values that change nothing
# (what clients send when they mean "off"): any other value is a 400, never silence. llama-server's fields
# that only tune one of these (dynatemp_exponent), or that
# do not change the answer (cache_prompt, id_slot, n_probs, timings_per_token, n_keep: ead never shifts
# the context), are ignored.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),  # text completions take it (CompletionRequest): fill-in-the-middle
    "echo": (None, False),  # text completions take it (CompletionRequest)
    "best_of": (None, 1),
    "tools": (None, []),  # chat completions take them (ChatRequest); text completions do not
    "top_logprobs": (None, 0),  # chat's count (ChatRequest); text completions give theirs as logprobs: N
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "n_predict": (None, -1),  # llama-server's max_tokens; -1: no limit
    "dynatemp_range": (None, 0),
    "min_keep": (None, 0, 1),  # ead's chain keeps one token at least, as llama.cpp's does with 0
    "grammar": (None, ""),
    "json_schema": (None,),  # {} is any JSON, not off; response_format takes a schema
    "lora": (None, []),
}
# What a request says of the fields that another endpoint takes, not 'not supported' alone
ELSEWHERE = {
    "tools": "tools are taken by /v1/chat/completions, not here",
    "top_logprobs": "a text completion asks for N alternatives with logprobs: N",
    "suffix": "fill-in-the-middle is a text completion's: send the prompt and suffix to /v1/completions",
    "echo": "a text completion echoes its prompt (/v1/completions), not a chat",
}


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    name: Annotated[str, Field(max_length=64)] | None = None
    description: str | None = None
    # OpenAI's is optional, and llama-server reads none as {}: any JSON value
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


# Keywords llama-cpp-python's schema converter drops, so an answer may break them (bounds too, but an
# integer's: converter.py holds those); the formats it holds; the keys whose values are schemas, by name or
# in a list.
UNHELD_KEYWORDS = frozenset(
    {
        *("multipleOf", "uniqueItems", "dependencies"),
        *("contains", "minContains", "maxContains", "minProperties", "maxProperties", "patternProperties"),
        *("propertyNames", "dependentRequired", "dependentSchemas", "unevaluatedProperties"),
        *("unevaluatedItems", "not", "if", "then", "else"),
    }
)
HELD_FORMATS = frozenset({"date", "time", "date-time", "uuid", *(f"uuid{n}" for n in range(1, 6))})
SCHEMAS = ("items", "additionalProperties", "anyOf", "oneOf", "allOf", "prefixItems")
# Keywords that say what an answer may be; any other (an annotation, a word JSON Schema does not know)
# says nothing, so the converter may drop it
CONSTRAINTS = frozenset(
    {
        *UNHELD_KEYWORDS,
        *BOUNDS,
        *SCHEMAS,
        *("type", "$ref", "const", "enum", "properties", "required", "minItems", "maxItems"),
        *("pattern", "format", "minLength", "maxLength"),
    }
)
# The JSON types of the values a const or an enum gives, by Python's type (an integral float is an integer)
JSON_TYPES: dict[type, str] = {
    bool: "boolean",
    int: "integer",
    str: "string",
    type(None): "null",
    list: "array",
    dict: "object",
}


def _unheld(node: Any, where: str, root: Any) -> str | None:
    """Where the first keyword of a schema that its grammar would not hold is (a format other than
    HELD_FORMATS, lengths beside a pattern or a format, which take their place, counts of items without
    one schema for them, a tuple beside one, what is beside a keyword the converter reads first, a
    required name no property gives, a oneOf an answer may meet twice, and what an allOf's parts say
    besides their properties, included).
    ``root`` is the whole schema, which a $ref names a part of."""
    if isinstance(node, list):
        found = (_unheld(item, f"{where}.{i}", root) for i, item in enumerate(node))
        return next(filter(None, found), None)
    if not isinstance(node, dict):
        return None
    shaped = "pattern" in node or node.get("format") in HELD_FORMATS
    first = read_first(node)
    for key, value in node.items():
        if (
            key in UNHELD_KEYWORDS
            or (key in BOUNDS and not holds_bounds(node))
            or (first not in (None, key) and key in CONSTRAINTS and not _held_beside(node, first, key, root))
            or (key == "format" and (value not in HELD_FORMATS or "pattern" in node))
            or (key == "prefixItems" and node.get("items"))  # the converter reads items first
            or (key == "oneOf" and not _told_apart(value, root))  # written as an anyOf
        ):
            return f"{where}.{key}"
        if key in ("minLength", "maxLength") and shaped:
            return f"{where}.{key}"
        if key in ("minItems", "maxItems") and not isinstance(node.get("items"), dict):  # counts one schema's
            return f"{where}.{key}"
        if key == "required" and _drops_required(node):
            return f"{where}.{key}"
        found = None
        if key == "allOf" and isinstance(value, list):
            found = _all_of_unheld(node, where, root)
        elif key in SCHEMAS_BY_NAME and isinstance(value, dict):
            named = (_unheld(schema, f"{where}.{key}.{_step(name)}", root) for name, schema in value.items())
            found = next(filter(None, named), None)
        elif key in SCHEMAS:
            found = _unheld(value, f"{where}.{key}", root)
        if found is not None:
            return found
    return None


def _told_apart(alternatives: Any, root: Any) -> bool:
    """Whether no answer can meet two of a oneOf's alternatives, so the anyOf the converter writes for it
    holds it: each requires a property that all of them give a const, none the same (pydantic's
    discriminated union)."""
    consts = [_required_consts(one, root) for one in alternatives] if isinstance(alternatives, list) else []
    shared = set.intersection(*(set(given) for given in consts)) if consts else set()
    return any(
        not any(_same_json(a[name], b[name]) for i, a in enumerate(consts) for b in consts[i + 1 :])
        for name in shared
    )


def _required_consts(schema: Any, root: Any) -> dict[str, Any]:
    """The const of each required property of an object schema that gives one (a $ref's target's)."""
    if isinstance(schema, dict) and "$ref" in schema:
        schema = local_target(root, schema["$ref"])
    if not isinstance(schema, dict) or not isinstance(schema.get("required"), list):
        return {}
    properties = _properties(schema)
    return {
        name: properties[name]["const"]
        for name in schema["required"]
        if isinstance(name, str) and isinstance(properties.get(name), dict) and "const" in properties[name]
    }


def _same_json(a: Any, b: Any) -> bool:
    """Whether two values are one JSON value (Python's True == 1 is not; 1 == 1.0 is)."""
    return a == b and _json_type(a) == _json_type(b)


def _held_beside(node: dict[str, Any], first: str, key: str, root: Any) -> bool:
    """Whether a keyword beside the one the converter reads first (``read_first``), which it drops, holds
    all the same: a type every answer to that one has, an enum that holds the const."""
    if key == "enum" and first == "const":
        enum, const = node["enum"], node["const"]
        return isinstance(enum, list) and any(_same_json(one, const) for one in enum)
    types = _type_names(node["type"]) if key == "type" else None
    answers = _answer_types({first: node[first]}, root)
    return (
        types is not None
        and answers is not None
        and all(kind in types or (kind == "integer" and "number" in types) for kind in answers)
    )


def _answer_types(schema: Any, root: Any, follow: bool = True) -> set[str] | None:
    """The JSON types of every answer the converter writes for a schema (None: any, or not known); a $ref
    is followed once (``follow``), as one may name itself."""
    if not isinstance(schema, dict):
        return None
    first = read_first(schema)
    if first == "$ref":
        return _answer_types(local_target(root, schema["$ref"]), root, follow=False) if follow else None
    if first in ("oneOf", "anyOf"):
        alternatives = schema[first] if isinstance(schema[first], list) else [None]
        found = [_answer_types(one, root, follow) for one in alternatives]
        return None if any(kinds is None for kinds in found) else set().union(*found)
    if first in ("const", "enum"):
        values = [schema["const"]] if first == "const" else schema["enum"]
        return {_json_type(value) for value in values} if isinstance(values, list) else None
    return _type_names(schema.get("type"))


def _type_names(type_: Any) -> set[str] | None:
    """The names a schema's type gives, one or a list (None: none, or not names)."""
    names = [type_] if isinstance(type_, str) else type_
    if not (isinstance(names, list) and names and all(isinstance(name, str) for name in names)):
        return None
    return set(names)


def _json_type(value: Any) -> str:
    """The JSON type of a value as JSON parsed it."""
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    return JSON_TYPES[type(value)]


def _reads_properties(node: dict[str, Any]) -> bool:
    """Whether the converter reads this schema, in which nothing is read first, as an object of the
    properties it gives (before an allOf): ``properties``, or ``additionalProperties`` other than true."""
    return node.get("type") in (None, "object") and (
        "properties" in node or node.get("additionalProperties", True) is not True
    )


def _drops_required(node: dict[str, Any]) -> bool:
    """Whether the converter drops a name of this object's required list, in which nothing is read first:
    one its properties do not give (an object of no properties: any)."""
    if not _reads_properties(node) and (node.get("type") != "object" or "allOf" in node):
        return False  # not an object, or an allOf's: _all_of_unheld's
    return not _names_within(node.get("required"), _properties(node))


def _names_within(names: Any, given: Collection[str]) -> bool:
    """Whether a required list names only these (an item JSON may send that is no name: not)."""
    return isinstance(names, list) and all(isinstance(name, str) and name in given for name in names)


def _all_of_unheld(node: dict[str, Any], where: str, root: Any) -> str | None:
    """Where the first keyword of a schema with an allOf that the converter drops is, its parts' properties'
    own schemas aside (``_unheld`` walks those). The converter reads an allOf only as an object's, when
    nothing it reads first is beside it, and makes it the object of its parts' properties and no others:
    of each part (an anyOf part's alternatives, a $ref part's target) it reads the properties alone, each
    required (an alternative's, none), the last schema of a name repeated. So a part holds only what says
    no more: type object, a required list of names every answer has, additionalProperties that no other
    part's properties meet, and what says nothing (not in CONSTRAINTS)."""
    if node.get("type") not in (None, "object") or _reads_properties(node):
        return f"{where}.allOf"
    parts: list[tuple[str, Any, bool]] = [(where, {k: v for k, v in node.items() if k != "allOf"}, True)]
    for i, part in enumerate(node["allOf"]):
        if isinstance(part, dict) and "anyOf" in part:
            if extra := next((key for key in part if key in CONSTRAINTS and key != "anyOf"), None):
                return f"{where}.allOf.{i}.{extra}"
            alternatives = part["anyOf"] if isinstance(part["anyOf"], list) else []
            parts += [(f"{where}.allOf.{i}.anyOf.{j}", one, False) for j, one in enumerate(alternatives)]
        else:
            parts.append((f"{where}.allOf.{i}", part, True))
    read: list[tuple[dict[str, Any], bool, str, bool]] = []  # the schema, required, its path, behind a $ref
    for at, part, required in parts:
        behind_ref = isinstance(part, dict) and "$ref" in part
        if behind_ref:
            if extra := next((key for key in part if key in CONSTRAINTS and key != "$ref"), None):
                return f"{at}.{extra}"
            part, at = local_target(root, part["$ref"]), f"{at}.$ref"  # what its target drops, the $ref drops
        if isinstance(part, dict):  # anything else the converter refuses
            read.append((part, required, at, behind_ref))
    first_of: dict[str, str] = {}  # each property name, where it is first given
    for part, _, at, behind_ref in read:
        for name in _properties(part):
            if name in first_of:
                return first_of[name]
            first_of[name] = at if behind_ref else f"{at}.properties.{_step(name)}"
    every = {name for part, required, _, _ in read if required for name in _properties(part)}
    for part, _, at, behind_ref in read:
        own = set(_properties(part))
        for key, value in part.items():
            if not (
                key not in CONSTRAINTS
                or key == "properties"
                or (key == "type" and value == "object")
                or (key == "required" and _names_within(value, every))
                or (key == "additionalProperties" and (value is True or first_of.keys() <= own))
            ):
                return at if behind_ref else f"{at}.{key}"
    found = (
        _unheld(schema, f"{at}.properties.{_step(name)}", root)
        for part, _, at, behind_ref in read
        if not behind_ref  # a target's properties are walked where it is
        for name, schema in _properties(part).items()
    )
    return next(filter(None, found), None)


def _properties(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema's properties by name (none where they are not an object, which the converter refuses)."""
    properties = schema.get("properties")
    return properties if isinstance(properties, dict) else {}


def _check_strict(schema: dict[str, Any]) -> None:
    """A 400 for a strict schema (every keyword to hold, as OpenAI's structured outputs promise) with a
    keyword the grammar would not hold; a schema that is not strict guides the answer as far as it can."""
    where = _unheld(schema, "response_format.json_schema.schema", schema)
    if where is None:
        return
    keyword = where.rpartition(".")[2]
    if keyword == "oneOf":
        held = "holds oneOf as anyOf (an answer may meet more than one of its alternatives)"
        advice = "send anyOf, or strict: false"
    else:
        held, advice = f"does not hold {keyword}", "leave it out, or send strict: false"
    message = (
        f"{where}: the grammar {held}, and strict: true asks for every keyword to hold: {advice} for an "
        "answer it guides"
    )
    raise ApiError(400, message, code="invalid_value", param="response_format")


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None
    object_schema: dict[str, Any] | None = Field(None, alias="schema")  # llama-server's, of a json_object

    def grammar(self) -> str | None:
        """The GBNF grammar every token must keep the answer within (None: free text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            if self.object_schema is None:
                return JSON_OBJECT_GRAMMAR
            return _schema_grammar(self.object_schema, "response_format.schema")
        if self.json_schema is None:
            message = "response_format: json_schema needs its json_schema object"
            raise ApiError(400, message, code="invalid_value", param="response_format")
        if self.json_schema.strict:
            _check_strict(self.json_schema.json_schema)
        return _schema_grammar(self.json_schema.json_schema, SCHEMA_PATH)


def _schema_grammar(schema: dict[str, Any], where: str) -> str:
    """A schema's grammar, or the 400 saying why it cannot be one."""
    try:
        return json_schema_grammar(schema, where)
    except EadError as error:
        raise ApiError(400, str(error), code="invalid_value", param="response_format") from None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool | None = None  # OpenAI's usage chunk (no choices) before [DONE]


class CompletionBase(BaseModel):
    """What both completion endpoints take. Fields not named here are ignored (clients send ``user``,
    ``metadata``...), except those of ``UNSUPPORTED``."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: Annotated[str, Field(max_length=256)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: TokenLimit | None = None  # clamped to the context, as llama-server does
    max_completion_tokens: TokenLimit | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Fraction | None = None
    stop: (
        Annotated[str, Field(max_length=MAX_STOP_CHARS)]
        | Annotated[list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]], Field(max_length=MAX_STOPS)]
        | None
    ) = None
    seed: Annotated[int, Field(ge=-1, le=2**32 - 2)] | None = None  # -1: a fresh one, as llama-server
    n: Positive | None = None
    n_cmpl: Positive | None = None  # llama-server's name of n
    response_format: ResponseFormat | None = None
    top_k: TopK | None = None  # llama-server's spelling of ead.top_k
    min_p: MinP | None = None
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: RepeatLastN | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None  # OpenAI's: token ids (as the object's keys) to biases
    ignore_eos: bool | None = None  # llama-server's: every end-of-generation token banned (--ignore-eos)
    # llama-server's samplers of ead's chain, over the command line's --typical, --top-n-sigma, --xtc-*,
    # --mirostat*
    typical_p: TypicalP | None = None
    top_n_sigma: float | None = None  # 0 or less: off, as llama.cpp reads it
    xtc_probability: Fraction | None = None
    xtc_threshold: Fraction | None = None
    mirostat: Mirostat | None = None  # in place of the rest of the chain and the penalties, as llama.cpp's
    mirostat_tau: MirostatRate | None = None
    mirostat_eta: MirostatRate | None = None
    dry_multiplier: DryMultiplier | None = None
    dry_base: float | None = None  # below 1: the server's, as llama-server reads it
    dry_allowed_length: DryLength | None = None
    dry_penalty_last_n: DryLength | None = None
    dry_sequence_breakers: DryBreakers | None = None
    n_indent: Annotated[int, Field(ge=0, le=MAX_COUNT)] | None = None  # llama-server's code-completion
    t_max_predict_ms: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None  # stop rules (0, -1: off)
    return_progress: bool | None = None  # llama-server's: a streamed chunk per batch of the prompt read
    ead: EadOptions | None = None

    def sampling_value(self, name: str) -> Any:
        """``top_k`` or ``min_p``, given at the top level (llama-server's spelling) or in ``ead``; None if
        neither."""
        inner = None if self.ead is None else getattr(self.ead, name)
        return either(name, getattr(self, name), f"ead.{name}", inner)

    def llama_samplers(self) -> dict[str, Any]:
        """The fields of llama.cpp's samplers (``LLAMA_SAMPLERS``, ``dry_sequence_breakers``) the request
        gives: the server's stand for the rest."""
        given = {name: getattr(self, name) for name in LLAMA_SAMPLERS if getattr(self, name) is not None}
        if given.get("dry_base", 1) < 1:  # llama-server's stand-in for a base that would reward a repeat
            del given["dry_base"]
        if self.dry_sequence_breakers is not None:
            given["dry_sequence_breakers"] = tuple(self.dry_sequence_breakers)
        return given

    def penalties(self) -> dict[str, Any]:
        """The penalties the request gives (the server's stand for the rest); none (``repeat_last_n``
        0) where its ``samplers`` leaves "penalties" out, as llama-server runs only the samplers named."""
        samplers = (self.model_extra or {}).get("samplers")
        if samplers is not None and not runs_penalties(samplers):
            return {"repeat_last_n": 0}
        return {name: getattr(self, name) for name in PENALTIES if getattr(self, name) is not None}

    def biases(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as (token id, bias) pairs; a key that is no token id is a 400 (whether the ids
        are in the vocabulary is the caller's check, ``tokens.known_tokens``)."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                message = f"logit_bias: its keys are token ids, got {quoted(key)}"
                raise ApiError(400, message, code="invalid_value", param="logit_bias")
            pairs.append((int(key), bias))
        return tuple(pairs)

    def token_limit(self) -> int | None:
        """``max_tokens`` or OpenAI's newer ``max_completion_tokens``, one limit; None if neither."""
        return either("max_tokens", self.max_tokens, "max_completion_tokens", self.max_completion_tokens)

    def logprobs_count(self) -> int | None:
        """How many alternatives each token's log-probabilities list; None: no log-probabilities."""
        raise NotImplementedError  # each endpoint asks in its own fields

    def reasoning_budget(self, default: int, default_message: str) -> tuple[int, str]:
        """The thinking's budget and message: none for a text completion, as llama-server budgets a
        chat's thinking alone (its template's tags)."""
        return -1, default_message

    def choices(self) -> int:
        """How many choices the answer has: ``n``, or llama-server's ``n_cmpl`` (both: the same)."""
        return either("n", self.n, "n_cmpl", self.n_cmpl) or 1

    def check_supported(self, choices: int = 1) -> None:
        """A 400 naming the first field given that ead serve would otherwise ignore: ``n`` past the
        ``choices`` the route writes (OpenAI's write up to ``MAX_CHOICES``, the others one)."""
        if self.choices() > choices:
            said = (
                "one choice per request (n: 1)" if choices == 1 else f"at most {choices} choices per request"
            )
            raise unsupported("n" if self.n is not None else "n_cmpl", said)
        if self.stream_options is not None and not self.stream:  # OpenAI's 400, in its words
            message = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
            raise ApiError(400, message, code="invalid_value", param="stream_options")
        refuse_unless_off(self.model_extra or {}, UNSUPPORTED, ELSEWHERE)
        samplers = (self.model_extra or {}).get("samplers")
        if samplers is not None and chain_named(samplers) is None:
            raise unsupported("samplers", "samplers is not supported")

    def sampler_names(self) -> list[str]:
        """The samplers this request runs, in llama-server's names, as its generation_settings lists them:
        those its ``samplers`` (checked) names, in ead's order; ead's chain where it gives none."""
        samplers = (self.model_extra or {}).get("samplers")
        if samplers is None:
            return list(CHAIN_ORDERS[0])
        return ["penalties"] * runs_penalties(samplers) + (chain_named(samplers) or [])

    def chain_settings(self) -> dict[str, Any]:
        """The SamplingParams fields that the request's ``samplers`` (checked) sets: each sampler of
        ead's chain it leaves out off, the infill sampler on where it names it."""
        samplers = (self.model_extra or {}).get("samplers")
        if samplers is None:
            return {}
        named = chain_named(samplers) or []
        settings = dict(off for name, off in UNNAMED_OFF.items() if name not in named)
        for name, (letter, field, off) in NAMED_BY_DEFAULT_ORDERS.items():
            if (letter if isinstance(samplers, str) else name) not in samplers:
                settings[field] = off
        return settings | ({"infill": True} if "infill" in named else {})


def either(name: str, value: Any, other_name: str, other: Any) -> Any:
    """The value of a field two names spell, ``value`` or ``other``; None if neither is given. Two
    different values are a 400 naming both: neither is guessed to win."""
    if value is not None and other is not None and value != other:
        message = f"{name} {value!r} and {other_name} {other!r} differ: give one, or the same value in both"
        raise ApiError(400, message, code="invalid_value", param=name)
    return other if value is None else value


def refuse_unless_off(
    given: dict[str, Any], table: dict[str, tuple[Any, ...]], reasons: dict[str, str] | None = None
) -> None:
    """A 400 naming the first field of ``table`` given a value other than those that mean "off" (a
    boolean is no number here: ``true`` is not 1), said as ``reasons`` says it where it does."""
    for name, neutral in table.items():
        value = given.get(name)
        if not any(value == off and isinstance(value, bool) == isinstance(off, bool) for off in neutral):
            if reasons and name in reasons:
                raise ApiError(400, f"{name}: {reasons[name]}", param=name, code="unsupported_parameter")
            raise unsupported(name, f"{name} is not supported")


def unsupported(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message} by ead serve", param=param, code="unsupported_parameter")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Annotated[str, Field(max_length=64)]
    text: str | None = None
    refusal: str | None = None  # an assistant's refusal, as OpenAI writes it in a part


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: Annotated[str, Field(max_length=256)]
    arguments: str


class ToolCallMessage(BaseModel):
    """A call an assistant made in an earlier turn, as the client sends it back."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: Annotated[str, Field(max_length=256)] | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["function"]
    function: FunctionDefinition


def _one_tool_per_name(tools: list[Tool]) -> list[Tool]:
    """Tools whose names are all different: a call names its tool, so a second of one name could never be
    the one called (OpenAI and Anthropic refuse it too). Every route's tools are checked here, as chat's."""
    seen: set[str] = set()
    for tool in tools:
        name = tool.function.name
        if name in seen:
            raise ValueError(
                f"the function {quoted(name)} is offered twice (a call names its tool: one name, one tool)"
            )
        seen.add(name)
    return tools


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: Annotated[list[ToolCallMessage], Field(max_length=128)] | None = None
    tool_call_id: Annotated[str, Field(max_length=256)] | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    refusal: str | None = None  # an assistant's refusal, where OpenAI answers it (content null)
    # an assistant's reasoning in an earlier turn, sent back as llama-server takes it: the template's
    # (Qwen3's writes it in its block)
    reasoning_content: str | None = None

    def text(self, where: str) -> str:
        """The message's text; a part that is not text (an image, audio, a file) is a 400. An assistant's
        refusal, in its field or a part, is what it said: its text."""
        assistant = self.role == "assistant"
        if not isinstance(self.content, list):
            return self.content or (self.refusal if assistant else None) or ""
        fields = {"text": "text", "refusal": "refusal"} if assistant else {"text": "text"}
        texts = []
        for part in self.content:
            field = fields.get(part.type)
            if field is None:
                # the client's text: quoted unless a plain name, so a newline in it cannot split the line
                kind = part.type if part.type.isidentifier() else repr(part.type)
                message = f"{kind} parts are not supported (the models read text)"
                raise unsupported(f"{where}.content", message)
            text = getattr(part, field)
            if text is None:
                message = f"{where}.content: a {part.type} part needs its {field}"
                raise ApiError(400, message, code="invalid_value", param=f"{where}.content")
            texts.append(text)
        return "".join(texts)

    def as_template_message(self, where: str) -> dict[str, Any]:
        """As the chat template takes it: OpenAI's ``developer`` role is the older ``system`` one; an
        assistant's calls and a tool's answer keep the fields templates read."""
        message = {"role": "system" if self.role == "developer" else self.role, "content": self.text(where)}
        extra = self.model_dump(
            include={"tool_calls", "tool_call_id", "name", "reasoning_content"}, exclude_none=True
        )
        return {**message, **extra}


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["function"]
    function: NamedFunction


class ChatRequest(CompletionBase):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    # OpenAI's chat takes a boolean (the count is top_logprobs'): an integer, text completions' count, is a
    # 400, not a guess at what it meant (llama-server ignores one)
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[Tool], Field(max_length=128), AfterValidator(_one_tool_per_name)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # llama-server's: how a thinking model's answer is given (REASONING_FORMATS: the server's default
    # 'auto'), and more variables for the chat template (Qwen3's enable_thinking)
    reasoning_format: Literal[REASONING_FORMATS] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # llama-server's --reasoning-budget and --reasoning-budget-message for this answer (-1: the server's)
    reasoning_budget_tokens: Annotated[int, Field(ge=-1, le=MAX_COUNT)] | None = None
    reasoning_budget_message: Annotated[str, Field(max_length=4096)] | None = None

    def reasoning_budget(self, default: int, default_message: str) -> tuple[int, str]:
        """The request's budget and message over the server's, as llama-server takes them."""
        asked = self.reasoning_budget_tokens
        budget = default if asked is None or asked == -1 else asked
        return (
            budget,
            default_message if self.reasoning_budget_message is None else self.reasoning_budget_message,
        )

    def logprobs_count(self) -> int | None:
        """Chat asks with ``logprobs: true`` and ``top_logprobs: N``."""
        if not self.logprobs:
            if self.top_logprobs:
                message = "top_logprobs needs logprobs: true"
                raise ApiError(400, message, code="invalid_value", param="top_logprobs")
            return None
        return self.top_logprobs or 0

    def tool_names(self) -> frozenset[str] | None:
        """The names of the tools offered, None if none are."""
        return (
            None
            if self.tools_offered() is None
            else frozenset(tool.function.name for tool in self.tools or ())
        )

    def tools_offered(self) -> list[dict[str, Any]] | None:
        """The tools the template is to render (all of them, whatever the choice forces, as OpenAI and
        llama-server render them): none with ``tool_choice: none``. A choice of no tool offered is a 400
        wherever they are read (``forced_tools``)."""
        self.forced_tools()
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    def forced_tools(self) -> list[dict[str, Any]] | None:
        """The tools the answer must call one of, where ``tool_choice`` forces a call: all offered
        (``required``), or the one it names; None where the model may answer in text. A 400 for a choice
        with no tool to call (none offered, or a name not among them)."""
        choice = self.tool_choice
        if choice is None or choice in ("none", "auto"):
            return None
        offered = [tool.model_dump(exclude_none=True) for tool in self.tools or ()]
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            offered = [tool for tool in offered if tool["function"]["name"] == name]
            if not offered:
                message = f"tool_choice: the function {quoted(name)} is not among the tools offered"
                raise ApiError(400, message, code="invalid_value", param="tool_choice")
        if not offered:
            message = "tool_choice: a call is forced only from the tools offered, and none are"
            raise ApiError(400, message, code="invalid_value", param="tool_choice")
        return offered


TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]  # llama.cpp's llama_token: an int32_t
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


def _prompt_form(value: Any) -> str:
    """Which form of a prompt a value is meant as, by its first item: so a complaint is about that form
    alone (token ids with a 3.5 among them had been told a list of strings takes at most one item)."""
    if not isinstance(value, list):
        return "str"
    first = value[0] if value else None
    if isinstance(first, list):
        return "list[list]"
    return "list[str]" if isinstance(first, str) else "list[int]"


class CompletionRequest(CompletionBase):
    """A text completion's prompt: a string, or token ids as llama-server and OpenAI take them; a list of
    several is a batch (strings, or lists of ids), each prompt answered in turn."""

    prompt: Annotated[
        Annotated[str, Tag("str")]
        | Annotated[list[str], Field(min_length=1, max_length=MAX_ANSWERS), Tag("list[str]")]
        | Annotated[TokenIds, Tag("list[int]")]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_ANSWERS), Tag("list[list]")],
        Discriminator(_prompt_form),
    ]
    # the text after the cursor, where the prompt is the text before it: a fill-in-the-middle completion
    suffix: str | None = None
    # OpenAI's legacy count of alternatives (chat's is a boolean and top_logprobs): a boolean here is a
    # 400, not the count 0 that Python's bool, an int, had passed for
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    # the prompt before the answer, in its text and, with logprobs, its log-probabilities (the first
    # token's null): how lm-eval's local-completions scores a continuation
    echo: bool | None = None
    max_tokens: EchoTokenLimit | None = None

    def check_supported(self, choices: int = 1) -> None:
        """Besides the fields ignored, ``max_tokens`` 0 without ``echo``: nothing to answer."""
        super().check_supported(choices)
        if self.max_tokens == 0 and not self.echo:
            message = (
                "max_tokens: 0 writes no answer: it is taken with echo "
                "(the prompt alone, scored with logprobs)"
            )
            raise ApiError(400, message, code="invalid_value", param="max_tokens")

    def logprobs_count(self) -> int | None:
        """Text completions ask with ``logprobs: N``."""
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The batch's prompts, each a text or token ids (a single prompt: a batch of one)."""
        prompt = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]


MAX_EMBEDDING_INPUTS = 2048  # inputs one embedding request may give (OpenAI's bound)
# An input to embed: a text, or token ids (OpenAI's and llama-server's); several, a list of them.
EmbeddingInput = str | TokenIds
EmbeddingInputs = (
    EmbeddingInput | Annotated[list[EmbeddingInput], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
)


class EmbeddingRequest(BaseModel):
    """OpenAI's ``/v1/embeddings`` and llama-server's ``/embedding`` and ``/embeddings``: ``input`` (or
    llama-server's ``content``), ``encoding_format`` (OpenAI's ``base64``: the float32 bytes),
    ``dimensions`` (the model's own count alone) and llama-server's ``embd_normalize``. Other fields are
    ignored (``user``)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: Annotated[str, Field(max_length=256)] | None = None
    input: EmbeddingInputs | None = None
    content: EmbeddingInputs | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Positive | None = None
    embd_normalize: Annotated[int, Field(ge=-1, le=MAX_COUNT)] = 2  # llama.cpp's norms (embedding.py)

    def inputs(self) -> list[tuple[str, str | list[int]]]:
        """Each input, with where the request gives it (``input``, or ``input.N`` in a list; ``input`` is
        read first, as llama-server reads it)."""
        field, given = ("input", self.input) if self.input is not None else ("content", self.content)
        if given is None:
            raise ApiError(400, "input: Field required (or llama-server's content)", param="input")
        return listed_inputs(field, given)

    def check_dimensions(self, n_embd: int) -> None:
        """A 400 for ``dimensions`` other than the model's own: its vectors cannot be shortened (a
        Matryoshka-trained model's could), as OpenAI refuses them of its older models."""
        if self.dimensions not in (None, n_embd):
            message = f"dimensions: the model's embeddings have {n_embd} dimensions, and it takes no other"
            raise ApiError(400, message, param="dimensions", code="unsupported_parameter")


def listed_inputs(field: str, given: Any) -> list[tuple[str, str | list[int]]]:
    """Inputs to embed, one or a list, each with where the request gives it: ``field``, or ``field.N``."""
    if isinstance(given, str) or (given and isinstance(given[0], int)):
        return [(field, given)]
    return [(f"{field}.{i}", one) for i, one in enumerate(given)]


def loggable(text: str) -> str:
    """A client's text (a path, a header, a value in an error) as a log line or an error shows it: control
    characters escaped (an escape sequence would drive a terminal, a newline or backspace forge a line)."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


Api = Literal["openai", "ollama", "anthropic"]  # whose shapes a route answers in (its errors' too)
# Anthropic's error types by status (its API's list); another 4xx is an invalid request, a 5xx an api_error
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """An HTTP error with OpenAI's error object; its message one printable line, whatever client text it
    holds (an Origin, a schema converter's complaint that quotes the pattern), in the answer and the log."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        message = loggable(message)
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.param, self.headers = param, headers

    def body(self) -> dict[str, Any]:
        """OpenAI's error object (the value of the response's ``error``)."""
        return {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}

    def ndjson_line(self) -> str:
        """The error as ollama ends a stream it cannot finish: a line ``{"error": "message"}``."""
        return json.dumps({"error": self.message}, ensure_ascii=False) + "\n"

    def sse_event(self) -> bytes:
        """The error as a stream of server-sent events ends when it cannot finish (OpenAI's and
        llama-server's): ``data: {"error": {...}}``, framed as sse-starlette frames every event, so the
        replies' own streams and the Guard's cut of one (a stop) end alike."""
        return ServerSentEvent(data=json.dumps({"error": self.body()})).encode()

    def anthropic_body(self) -> dict[str, Any]:
        """The error as Anthropic's Messages API sends it, ``{"type": "error", "error": {"type": ...,
        "message": ...}}``, its type Anthropic's word for the status."""
        kind = ANTHROPIC_ERROR_TYPES.get(
            self.status, "api_error" if self.status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def anthropic_event(self) -> bytes:
        """The error as Anthropic ends a stream it cannot finish: an event named ``error``."""
        return ServerSentEvent(data=json.dumps(self.anthropic_body()), event="error").encode()

    def respelled(self, spelling: dict[str, str], schema_as: str) -> ApiError:
        """This error of the OpenAI checks naming the field as another API's request spelled it
        (``spelling``: an OpenAI field's name, or a path into it such as ``messages.2``, to its own, the
        longest that the error's field starts with read; the schema inside response_format as
        ``schema_as``), for that API's routes, which are prepared as the OpenAI request they mean."""
        asked = self.param or ""
        named = [name for name in spelling if asked == name or asked.startswith(f"{name}.")]
        if not named:
            return self
        field = max(named, key=len)
        param = spelling[field] + asked[len(field) :]
        # the schema's own complaints name where in response_format it sits: the other API's field itself
        message = self.message.replace(SCHEMA_PATH, schema_as).replace(asked, param, 1)
        return ApiError(
            self.status, message, kind=self.kind, code=self.code, param=param, headers=self.headers
        )

    def response(self, api: Api = "openai") -> JSONResponse:
        """The error as ``api`` sends it: OpenAI's object, ollama's ``{"error": "message"}``, or
        Anthropic's."""
        if api == "anthropic":
            body = self.anthropic_body()
        else:
            body = {"error": self.message if api == "ollama" else self.body()}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def _step(part: str | int) -> str:
    """A step of the path to a bad value, as its 400 names it: a client's key past ECHOED_CHARS quoted and
    cut (errors.quoted), as a value is; a 12 kB key had come back whole, in the message and the param."""
    text = str(part)
    return text if len(text) <= ECHOED_CHARS else quoted(text)


def _is_field(part: str | int) -> bool:
    """Whether a part of pydantic's error location names a field or an index, not a union's member: a
    type's name ("str"), or a model's (CamelCase, where every field's name is lower case)."""
    return isinstance(part, int) or (
        part.isidentifier() and not part[0].isupper() and part not in {"str", "int", "float", "bool", "list"}
    )


def _most_telling(errors: list[Any]) -> Any:
    """Of pydantic's complaints about the first field it names, the one that says most: a field of several
    types (``stop``: a string or a list) gets one per type, the first of them "should be a valid string"
    for a list that has too many items; so a complaint about the value goes before one about its type,
    and a deeper one (an item of the list) before its field's."""
    field = errors[0]["loc"][:1]
    own = [error for error in errors if error["loc"][:1] == field]
    about_values = [error for error in own if not error["type"].endswith("_type")]
    return max(about_values or own, key=lambda error: len(error["loc"]))


def parse(model: type[BaseModel], data: bytes) -> Any:
    """A request body into its schema; pydantic's first complaint as one line otherwise. A byte-order mark
    at its start (a file saved as "UTF-8 with BOM", sent as it is) marks the encoding, as llama-server's
    parser takes it: pydantic's had refused it as no JSON value."""
    try:
        return model.model_validate_json(data.removeprefix(BOM))
    except ValidationError as error:
        first = _most_telling(error.errors())
        if first["type"] == "json_invalid":
            message = f"the body is not valid JSON: {first['ctx']['error']}"
            raise ApiError(400, message, code="invalid_json") from None
        where = ".".join(_step(part) for part in first["loc"] if _is_field(part))
        if first["type"] == "model_type" and not where:
            raise ApiError(400, "the body must be a JSON object", code="invalid_json") from None
        # a check's own ValueError, as it worded it (pydantic's msg puts "Value error, " before it)
        said = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
        message = f"{where}: {said}" if where else said
        raise ApiError(400, message, code="invalid_value", param=where or None) from None
