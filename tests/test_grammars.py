"""llama.cpp's grammar parser, as ead serve's JSON mode uses it: each distinct grammar parsed once, with
the process's stderr taken for the parse (see ead_cli/shared_stderr.py)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from ead_cli import shared_stderr
from ead_cli.engine import close_all
from ead_cli.errors import EadError
from ead_cli.runner import Runner
from ead_cli.sampling import GrammarRefusal, ParsedGrammars
from ead_cli.serve.converter import LARGEST, MAX_DIGITS, integer_range, json_schema_grammar
from ead_cli.serve.engine import Engine
from ead_cli.serve.schemas import ResponseFormat

DIGITS = 'root ::= [0-9]+ "."'


@pytest.fixture(scope="module")
def runner(tiny_small: Path) -> Iterator[Runner]:
    with Runner(tiny_small, name="small", n_ctx=256, n_threads=1) as runner:
        yield runner


@pytest.fixture(scope="module")
def grammars(runner: Runner) -> ParsedGrammars:
    return runner.grammars


def finishes_while_stderr_is_held(call: threading.Thread, wait: float = 5) -> bool:
    """Whether ``call`` ends while another thread holds the lock every parse takes with stderr."""
    with shared_stderr.LOCK:
        call.start()
        call.join(timeout=wait)
        finished = not call.is_alive()
    call.join()
    return finished


def test_a_grammar_checked_once_is_not_parsed_again_for_its_answers(grammars: ParsedGrammars) -> None:
    """ead serve checked a request's grammar when it came and parsed it again when it ran: two parses
    (each with stderr taken) per request. The answers now get copies of the one parse."""
    grammars.check(DIGITS)
    samplers: list[llama_cpp.llama_sampler_p] = []
    for _ in range(2):  # each answer has its own copy: a grammar sampler holds one answer's state
        copy = threading.Thread(target=lambda: samplers.append(grammars.sampler(DIGITS)))
        assert finishes_while_stderr_is_held(copy)
    assert len(samplers) == 2 and samplers[0] != samplers[1]
    for sampler in samplers:
        llama_cpp.llama_sampler_free(sampler)
    new = threading.Thread(target=grammars.check, args=('root ::= "new"',))
    assert not finishes_while_stderr_is_held(new, wait=0.5)  # a grammar not seen before: parsed, stderr taken


def kept(grammars: ParsedGrammars, grammar: str) -> bool:
    """Whether ``grammar`` is among those kept parsed: a check of it does not wait for stderr (a parse
    takes it). One that is not kept is parsed, and kept, by the check."""
    return finishes_while_stderr_is_held(threading.Thread(target=grammars.check, args=(grammar,)), wait=0.5)


def test_the_grammars_kept_parsed_are_bounded_by_their_size_as_well_as_their_count(runner: Runner) -> None:
    """Sixteen grammars were kept whatever their size: a few near the 16 MiB a schema's grammar may reach
    held hundreds of MB between requests. Those kept now add up to KEPT_CHARS at most, the least recently
    used let go first, except the last used, kept whatever its size (its request checks it, then samples
    with it)."""
    grammars = ParsedGrammars(runner.vocab)
    try:
        small = 'root ::= "small"'
        first, second = (f'root ::= "{letter * (ParsedGrammars.KEPT_CHARS * 3 // 5)}"' for letter in "ab")
        for grammar in (first, small, second):
            grammars.check(grammar)
        assert kept(grammars, small) and kept(grammars, second)  # the two most recent fit
        assert not kept(grammars, first)  # three of sixteen, but over KEPT_CHARS together
        huge = f'root ::= "{"c" * ParsedGrammars.KEPT_CHARS}"'
        grammars.check(huge)
        assert kept(grammars, huge)
        assert not kept(grammars, small)  # the huge one is kept alone
    finally:
        grammars.close()


# a line as uvicorn's access log writes one, with llama.cpp's words in another client's path
OTHER_THREADS_LINE = 'INFO:     10.0.0.9:5555 - "GET /v1/error parsing grammar: secret HTTP/1.1" 404'


def written_while_parsing(grammars: ParsedGrammars, grammar: str) -> tuple[bool, str]:
    """Parse ``grammar`` while another thread writes OTHER_THREADS_LINE to descriptor 2 as soon as the
    parse has taken it; whether the line came inside that window, and the parse's error ('' if none)."""
    log = os.fstat(2)
    inside: list[bool] = []

    def write() -> None:
        while os.fstat(2).st_ino == log.st_ino:
            pass
        os.write(2, OTHER_THREADS_LINE.encode() + b"\n")
        inside.append(os.fstat(2).st_ino != log.st_ino)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        grammars.check(grammar)
        error = ""
    except EadError as refused:
        error = str(refused)
    writer.join()
    return inside[0], error


@pytest.mark.parametrize("refused", [False, True])
def test_another_threads_line_during_a_parse_goes_to_the_log_not_to_the_reason(
    grammars: ParsedGrammars, capfd: pytest.CaptureFixture[str], refused: bool
) -> None:
    """uvicorn's handlers, warnings and other threads write to stderr without the lock: such a line in
    the window was dropped with the parse's file, and the 400's reason was whatever followed llama.cpp's
    words first in it, another request's path included. A long grammar keeps the window open."""
    for tries in range(5):  # a fresh text each time: a parsed one is not parsed again
        grammar = "root ::= " + '"a" ' * (1_000_000 + tries) + ("\\x" if refused else "")
        inside, error = written_while_parsing(grammars, grammar)
        if inside:
            break
    assert inside, "the other thread never wrote while the parse had stderr"
    expected = "llama.cpp could not parse the grammar: expecting newline or end at \\x" if refused else ""
    assert error == expected
    log = capfd.readouterr().err
    assert log == OTHER_THREADS_LINE + "\n"  # and not the refused grammar, which the parser prints whole


def test_a_stop_frees_the_models_after_the_request_being_prepared(tiny_small: Path) -> None:
    """A forced stop (a second Ctrl-C, --shutdown-timeout) cancels a request's task, not the thread that
    prepares it: ead serve freed the models while that thread went on to parse the request's grammar
    (llama.cpp's parser given a freed vocabulary) or tokenize its prompt. The engine's close waits."""
    runner = Runner(tiny_small, name="small", n_ctx=256, n_threads=1)
    engine = Engine([runner], queue=1, log=lambda line: None)
    preparing, release = threading.Event(), threading.Event()

    def prepare() -> None:  # as the app's _check_grammar, late in a request's preparation
        preparing.set()
        release.wait(timeout=60)
        runner.grammars.check('root ::= "late"')

    prepared = engine.preparing.submit(prepare)
    assert preparing.wait(timeout=60)
    stop = threading.Thread(target=lambda: (engine.close(), close_all([runner])))  # as serve, then the CLI
    stop.start()
    stop.join(timeout=0.5)
    freed_first = not stop.is_alive()
    release.set()
    stop.join()
    prepared.result()  # parsed while its model was there
    assert not freed_first


def test_no_grammar_is_parsed_for_a_closed_model(tiny_small: Path) -> None:
    """Runner.close freed the parsed grammars, then the model; a check that came later parsed with the
    freed vocabulary and kept its grammar, which nothing would free. It is refused."""
    with Runner(tiny_small, name="small", n_ctx=256, n_threads=1) as runner:
        runner.grammars.check(DIGITS)
    for use in (runner.grammars.check, runner.grammars.sampler):
        with pytest.raises(EadError, match="the model is closed"):
            use(DIGITS)
        with pytest.raises(EadError, match="the model is closed"):
            use('root ::= "new"')


def answers(runner: Runner, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar takes ``text`` (the tiny vocabulary's byte tokens) as a whole answer."""
    end = llama_cpp.llama_vocab_eos(runner.vocab)
    try:
        runner.grammars.check(grammar, [*runner.tokenize(text, add_special=False, parse_special=False), end])
    except GrammarRefusal:
        return False
    return True


BOUND_PAIRS = [
    (5, 6), (0, 0), (0, 9), (1, 10), (9, 10), (10, 99), (5, 73), (7, 1000), (99, 101), (123, 4567),
    (1000, 1999), (2000, 2999), (2019, 2021), (305, 330), (909, 9090), (-12, 7), (-100, -3), (-9, -1),
    (-1, 0), (-1000, 1000), (-73, -5), (0, LARGEST), (-LARGEST, LARGEST), (LARGEST - 3, LARGEST),
    (-LARGEST, -LARGEST + 12), (10**15, 10**15 + 11), (4_294_967_000, 4_294_967_295),
]  # fmt: skip


def probes(low: int, high: int) -> set[int]:
    """The numbers on either side of the bounds and of each power of ten between them, a few inside."""
    edges = {low, high, 0, *(sign * 10**n for n in range(MAX_DIGITS) for sign in (1, -1))}
    near = {edge + step for edge in edges for step in (-2, -1, 0, 1, 2)}
    inside = {low + (high - low) * part // 7 for part in range(8)}
    return {n for n in near | inside if abs(n) <= LARGEST}


@pytest.mark.parametrize(("low", "high"), BOUND_PAIRS)
def test_an_integer_range_grammar_takes_exactly_the_integers_within_its_bounds(
    runner: Runner, low: int, high: int
) -> None:
    """llama-cpp-python's converter dropped an integer's bounds (minimum 5, maximum 6 came back 73): the
    range grammar, parsed and followed by llama.cpp itself, takes each integer within them and none
    beyond, nor a leading zero or a sign JSON does not write."""
    grammar = f"root ::= {integer_range(low, high)}"
    wrong = [n for n in sorted(probes(low, high)) if answers(runner, grammar, str(n)) != (low <= n <= high)]
    assert not wrong, (grammar, wrong)
    for spelled in (f"0{low}", f"+{low}", "-0", f"{low}.0", f"{low} "):
        assert not answers(runner, grammar, spelled), spelled


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "tags"],
}
JSON_MODE_FORMATS = {
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    "json_object's schema": {"type": "json_object", "schema": PERSON},
}
JSON_MODE_GRAMMARS = {
    **{name: ResponseFormat.model_validate(format).grammar() for name, format in JSON_MODE_FORMATS.items()},
    "generate -j": json_schema_grammar(PERSON, "-j"),
}


@pytest.mark.parametrize("grammar", JSON_MODE_GRAMMARS.values(), ids=JSON_MODE_GRAMMARS.keys())
def test_json_mode_takes_the_blank_between_tokens_that_llama_cpps_converter_takes(
    runner: Runner, grammar: str | None
) -> None:
    """llama.cpp's converter (``SPACE_RULE``, which llama-server's json_schema and llama-cli's -j are bound
    by) takes a space, or one or two line breaks and an indent of up to 20 spaces or tabs, between JSON's
    tokens: JSON mode took one space at most (json_object one line break), so a model writing its JSON over
    indented lines was held to one line. No more than llama.cpp's: two spaces, three breaks, a deeper
    indent stay refused."""
    assert grammar is not None
    taken = [
        '{"name": "Al", "tags": ["a", "b"]}',
        '{\n  "name": "Al",\n  "tags": [\n    "a",\n    "b"\n  ]\n}',
        '{\n\t"name" : "Al",\n\n\t"tags": [\n\n\t\t"a"\n\t]\n}\n',
        '{"name":"Al","tags":[]}',
    ]
    refused = [
        '{  "name": "Al", "tags": []}',
        '{\n\n\n"name": "Al", "tags": []}',
        "{\n" + " " * 21 + '"name": "Al", "tags": []}',
        '{"name": "Al", "tags": []} \n',
    ]
    assert [text for text in taken if not answers(runner, grammar, text)] == []
    assert [text for text in refused if answers(runner, grammar, text)] == []


BOUNDED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "tags"],
    "additionalProperties": {"type": "string"},
}
STRING_GRAMMARS = {**JSON_MODE_GRAMMARS, "a bounded string, other keys": json_schema_grammar(BOUNDED, "-j")}


@pytest.mark.parametrize("grammar", STRING_GRAMMARS.values(), ids=STRING_GRAMMARS.keys())
def test_json_mode_strings_hold_no_raw_control_character(runner: Runner, grammar: str | None) -> None:
    """A JSON string holds a line break, a tab or any character below U+0020 only escaped: the schema's
    strings (llama-cpp-python's converter's) took them raw, so an answer held to a schema, a tool call's
    arguments among them, could be JSON no parser reads. Now every string, a value's, a key's or one of a
    bounded length, is llama.cpp's: JSON's escapes taken but for \\/, and DEL refused, as there."""
    assert grammar is not None
    taken = [
        '{"name": "A\\nl", "tags": ["\\t", "\\u001f"]}',
        '{"name": "\\"\\\\", "tags": ["\\b\\f\\r"]}',
    ]
    refused = [
        '{"name": "A\nl", "tags": []}',
        '{"name": "Al", "tags": ["\t"]}',
        '{"name": "A\x01", "tags": []}',
        '{"name": "Al", "tags": [], "a\x1fb": "c"}',
    ]
    assert [json.loads(text)["name"] for text in taken] == ["A\nl", '"\\']
    for text in refused:
        with pytest.raises(json.JSONDecodeError, match="Invalid control character"):
            json.loads(text)
    assert [text for text in taken if not answers(runner, grammar, text)] == []
    assert [
        text
        for text in [*refused, '{"name": "A\x7f", "tags": []}', '{"name": "\\/", "tags": []}']
        if answers(runner, grammar, text)
    ] == []
