"""Tool calling through `ead serve`: the reader of the model's tool-call markup, the tools rendered by the
GGUF's own template (tiny models), and the openai client's full round trip on the real demo pair."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama as ollama_client
import openai
import pytest
from bench_serve import TOOLS
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageToolCall
from openai.types.chat.chat_completion import Choice
from serve_process import EAD, Server
from test_cli import pair_args
from test_serve import HI, JSON, serving
from tiny_models import write_tiny_model

from ead_cli.serve.app import _Reply
from ead_cli.serve.tools import (
    ArgumentsDelta,
    CallStart,
    ToolCall,
    ToolCallReader,
    opens_call,
    split_answer,
    whole,
)

NAMES = frozenset({"get_weather", "multiply"})
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def read(pieces: list[str]) -> list[str | ToolCall]:
    reader = ToolCallReader(NAMES)
    out = [piece for text in pieces for piece in reader.push(text)]
    return [*out, *reader.finish()]


def test_a_tagged_call_split_across_tokens_is_one_call_and_the_text_around_it_stays() -> None:
    text = f"Let me look.\n<tool_call>\n{CALL}\n</tool_call>\nDone."
    pieces = read([text[i : i + 3] for i in range(0, len(text), 3)])
    calls = [piece for piece in pieces if isinstance(piece, ToolCall)]
    assert calls == [ToolCall("get_weather", '{"city": "Paris"}')]
    shown = "".join(piece for piece in pieces if isinstance(piece, str))
    assert shown == "Let me look.\n\nDone."
    assert "<tool" not in shown


def test_text_that_only_looks_like_the_markup_is_shown_as_written() -> None:
    assert "".join(map(str, read(["a <tool", "box> b <", "tool_c"]))) == "a <toolbox> b <tool_c"
    bad = "<tool_call>{not json}</tool_call>"
    assert read(["x ", bad]) == ["x ", bad]  # never a call the model did not make


def test_calls_alike_stream_each_at_its_own_index() -> None:
    """A coin flipped twice, in one token and across two: the two equal calls were both streamed at index
    0, which the openai client's accumulator merged into one call with the arguments '{"a": 6}{"a": 6}'."""
    reply = _Reply("chat.completion", "/v1/chat/completions", print, seed=0, piece=bytes, tools=NAMES)
    block = '<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>'
    for tokens in ([f"{block}\n{block}"], [block, f"\n{block}"], [f"{block}\n{block[:-3]}", block[-3:]]):
        reader = ToolCallReader(NAMES)
        state = ChatCompletionStreamState()
        for text in tokens:  # as the stream sends them: each token's chunks once it is read
            for chunk in reply._piece_chunks(reader.push(text), {}):
                state.handle_chunk(ChatCompletionChunk.model_validate_json(chunk))
        calls = state.current_completion_snapshot.choices[0].message.tool_calls
        assert [(call.function.name, call.function.arguments) for call in calls] == [
            ("multiply", '{"a": 6}'),
            ("multiply", '{"a": 6}'),
        ]
        assert calls[0].id != calls[1].id


def test_parallel_tool_calls_false_keeps_the_first_call_alone() -> None:
    """``parallel_tool_calls: false`` promises the client one call at most (an agent that runs one tool a
    turn); the model, which no grammar binds, may still write two: both had been sent, whole and streamed.
    The first is the answer's call, a later one is left out (neither a call nor markup in the text)."""
    block = '<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>'
    other = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    text = f"Two.\n{block}\n{other}"
    assert split_answer(text, NAMES, parallel=False) == ("Two.", [ToolCall("multiply", '{"a": 6}')])
    assert len(split_answer(text, NAMES)[1]) == 2  # parallel calls, the default, all kept
    reply = _Reply(
        "chat.completion", "/v1/chat/completions", print, seed=0, piece=bytes, tools=NAMES, parallel=False
    )
    reader = reply.reader()
    state = ChatCompletionStreamState()
    for i in range(0, len(text), 5):
        for chunk in reply._piece_chunks(reader.push(text[i : i + 5]), {}):
            state.handle_chunk(ChatCompletionChunk.model_validate_json(chunk))
    for chunk in reply._piece_chunks(reader.finish(), {}):
        state.handle_chunk(ChatCompletionChunk.model_validate_json(chunk))
    message = state.current_completion_snapshot.choices[0].message
    assert [(call.function.name, call.function.arguments) for call in message.tool_calls] == [
        ("multiply", '{"a": 6}')
    ]
    assert "<tool_call>" not in (message.content or "")


def test_a_bare_json_answer_is_a_call_only_if_it_names_a_tool_offered() -> None:
    assert split_answer(f"  {CALL}\n", NAMES) == ("", [ToolCall("get_weather", '{"city": "Paris"}')])
    data = '{"name": "Ada", "age": 36}'  # JSON the user asked for, not a call
    assert split_answer(data, NAMES) == (data, [])
    two = f"<tool_call>{CALL}</tool_call><tool_call>{CALL}</tool_call>"
    assert len(split_answer(two, NAMES)[1]) == 2


@pytest.mark.parametrize(
    ("text", "opens"),
    [
        ("", None),
        ("\n ", None),
        ('{"na', None),
        ('{"name": "get_', None),
        ('{"name": "multiply"', True),
        ('\n{ "name" :"get_weather", "arguments"', True),
        ('{"name": "Ada"', False),  # JSON the user asked for: the name of no tool offered
        ('{"name": "multiply_all"', False),
        ('{"city": "Paris"}', False),
        ("Sure", False),
        ("<tool_call>", False),  # a tagged call: bound from its own token on
        ("``", None),
        ("```json", None),
        ('```json\n{"name": "multiply"', True),  # in a fenced code block, as the demo 0.5B writes it
        ('\n```\n  {\n  "name": "get_weather"', True),
        ('```xml\n{"name": "multiply"', True),
        ('```json\n{"name": "Ada"', False),
        ('```json {"name": "multiply"', False),  # a fence's opening ends its line
        ("```python\n", False),
        ("```json\n```json\n", False),
    ],
)
def test_a_bare_call_opens_with_the_name_of_a_tool_offered(text: str, opens: bool | None) -> None:
    """The bare call's trigger (llama.cpp's pattern trigger of its older Hermes handler): the answer opens
    with ``{"name": "<a tool offered>"``, alone or in a fenced code block; undecided (None) while the text
    may still become that."""
    assert opens_call(text, NAMES) is opens


def test_a_fenced_code_block_is_a_call_only_if_it_opens_one_of_a_tool_offered() -> None:
    """An answer that opens with a fenced code block holding a call's object (llama.cpp's older Hermes 2
    Pro handler read it so) is that call; any other code block is text, as written, and is let go as soon
    as it cannot be one: JSON that names no tool, another language, text before the fence, a block that
    never closes and holds no begun call."""
    for size in (1, 3, 1000):
        assert whole(streamed(f"```\n{CALL}```", size)) == [ToolCall("get_weather", '{"city": "Paris"}')]
        assert whole(streamed('```json\n{"name": "multiply"}\n```', size)) == [ToolCall("multiply", "{}")]
        for text in [
            '```json\n{"name": "Ada", "age": 36}\n```',
            '```python\nprint({"name": "multiply", "arguments": {}})\n```',
            f"Here it is:\n```json\n{CALL}\n```",
            '```json\n{"name": "multiply", "arguments": "6"',
            '```json\n{"arguments": {"a": 6}, "name": "multiply"}\n```',
            "``",
        ]:
            pieces = streamed(text, size)
            assert all(isinstance(piece, str) for piece in pieces) and "".join(pieces) == text
            assert split_answer(text, NAMES) == (text, [])
    reader = ToolCallReader(NAMES)
    assert reader.push('```json\n{"name": "mul') == []
    assert reader.push('e"') == ['```json\n{"name": "mule"']  # no tool's: let go at once


def test_a_call_the_prefill_opens_is_read_with_the_answer() -> None:
    """An assistant prefill that opens a call, which the answer finishes: the two are read as one text,
    so the call comes back whole; the prefill's own text is the client's, never shown again (a text
    piece released while it was read, or one that reaches back into it)."""
    prefill = 'Let me look.\n<tool_call>\n{"name": "get_w'
    answer = 'eather", "arguments": {"city": "Paris"}}\n</tool_call>\nDone.'
    call = ToolCall("get_weather", '{"city": "Paris"}')
    assert split_answer(answer, NAMES, prefill=prefill) == ("Done.", [call])
    reader = ToolCallReader(NAMES, prefill=prefill)
    pieces = [piece for i in range(0, len(answer), 3) for piece in reader.push(answer[i : i + 3])]
    pieces = whole([*pieces, *reader.finish()])
    assert pieces[0] == call and "".join(map(str, pieces[1:])) == "\nDone."
    assert split_answer("box> b", NAMES, prefill="a <tool") == ("box> b", [])
    assert split_answer(' "arguments": {"a": 6}}', NAMES, prefill='{"name": "multiply",') == (
        "",
        [ToolCall("multiply", '{"a": 6}')],
    )


def test_a_call_the_prefill_holds_whole_is_the_clients_not_the_answers() -> None:
    """A call the prefill holds whole (its closing tag, or the bare object, in the client's text) is the
    client's, as the rest of its text is: it had come back as the answer's call, and without parallel
    calls it had been the one kept, the call the model made left out."""
    mine = '<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>'
    answer = '\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    call = ToolCall("get_weather", '{"city": "Paris"}')
    for parallel in (True, False):
        assert split_answer(answer, NAMES, parallel, prefill=mine) == ("", [call])
    reader = ToolCallReader(NAMES, parallel=False, prefill=mine)
    pieces = [piece for i in range(0, len(answer), 4) for piece in reader.push(answer[i : i + 4])]
    assert whole([*pieces, *reader.finish()]) == ["\n", call]
    assert split_answer(" ", NAMES, prefill=CALL) == ("", [])  # a bare call, the answer space alone


# The arguments of a call streamed as the model writes them (ToolCallReader's CallStart and ArgumentsDelta)


def streamed(text: str, size: int, **reader: object) -> list[object]:
    """The pieces of ``text`` read ``size`` characters at a time, then the reader's finish."""
    reading = ToolCallReader(NAMES, **reader)
    pieces = [piece for i in range(0, len(text), size) for piece in reading.push(text[i : i + size])]
    return [*pieces, *reading.finish()]


def deltas(pieces: list[object]) -> list[str]:
    return [piece.text for piece in pieces if isinstance(piece, ArgumentsDelta)]


# Each as the model may write it, and json.dumps of what json.loads reads from it (no NaN, Infinity or
# number past a float: test_nan_infinity_and_numbers_past_a_float_are_where_the_json_stops)
ARGUMENTS = [
    '{"city":"Paris"}',
    '{ "a" : 6 ,"b":-7.50e1, "c": [1, 2.0, -0, 1E300, {"d": []}], "e": {}, "f": true, "g": null }',
    '{"text": "line\\none \\"quoted\\" tab\\t \\u00e9\\u0001 \\ud83d\\ude00 \\/ back\\\\slash", "é": "ü"}',
    '{"deep": {"deeper": [[{"x": "]}"}]]}, "big": 123456789012345678901234567890}',
]


@pytest.mark.parametrize("arguments", ARGUMENTS)
@pytest.mark.parametrize("size", [1, 2, 7, 1000])
@pytest.mark.parametrize("form", ["tagged", "bare", "fenced"])
def test_a_calls_arguments_stream_as_written_and_add_up_to_the_call(
    arguments: str, size: int, form: str
) -> None:
    """Once the name is read, the arguments come out as they grow, in several pieces where the model
    writes them across tokens, each a piece of the call's final arguments (json.dumps of the JSON written,
    as a whole answer's call has them): the pieces added up are those arguments exactly. A fenced call's
    fences are its markup, never text; what follows its closing fence is."""
    call = f'{{"name": "multiply", "arguments": {arguments}}}'
    text, shown_text = {
        "tagged": (f"Let me see.\n<tool_call>\n{call}\n</tool_call>\nDone.", "Let me see.\n\nDone."),
        "bare": (f" {call}\n", ""),
        "fenced": (f"\n```json\n{call}\n```\nDone.", "\nDone."),
    }[form]
    pieces = streamed(text, size)
    expected = ToolCall("multiply", json.dumps(json.loads(arguments), ensure_ascii=False))
    calls = [piece for piece in pieces if isinstance(piece, ToolCall)]
    assert calls == [expected]
    assert [p for p in pieces if isinstance(p, CallStart)] == [CallStart(0, "multiply")]
    start, end = pieces.index(CallStart(0, "multiply")), pieces.index(expected)
    assert all(isinstance(piece, ArgumentsDelta) for piece in pieces[start + 1 : end])
    assert "".join(deltas(pieces)) == expected.arguments
    if size < 8:
        assert len(deltas(pieces)) >= 3
    shown = "".join(piece for piece in pieces if isinstance(piece, str))
    assert shown == shown_text
    assert split_answer(text, NAMES) == (shown.strip(), [expected])  # the whole answer reads the same


def test_a_call_cut_off_mid_arguments_is_closed_where_it_stopped() -> None:
    """An answer that ends inside the arguments (max_tokens, a stop string): the call was begun and its
    arguments sent as written, so it stays the call, its arguments closed where they stopped (a string
    closed, a value not yet whole and a key without its value left out), valid JSON, whole and streamed."""
    begun = '<tool_call>{"name": "multiply", "arguments": '
    for written, closed in [
        ('{"a": 6, "b": [1, {"c": "Par', '{"a": 6, "b": [1, {"c": "Par"}]}'),
        ('{"a": 6, "b": 12', '{"a": 6}'),
        ('{"a": 6, "b', '{"a": 6}'),
        ('{"a": 6, "b": ', '{"a": 6}'),
        ('{"a": "\\u00', '{"a": ""}'),
        ("{", "{}"),
    ]:
        for size in (1, 5, 100):
            pieces = streamed(begun + written, size)
            assert [p for p in pieces if isinstance(p, ToolCall)] == [ToolCall("multiply", closed)]
            assert "".join(deltas(pieces)) == closed
            assert not [p for p in pieces if isinstance(p, str)]
        assert split_answer(begun + written, NAMES) == ("", [ToolCall("multiply", closed)])
    for arguments in ARGUMENTS:  # every cut: a JSON object, the pieces sent its text
        for cut in range(1, len(arguments)):
            pieces = streamed(begun + arguments[:cut], 3)
            (call,) = [piece for piece in pieces if isinstance(piece, ToolCall)]
            assert isinstance(json.loads(call.arguments), dict) and "".join(deltas(pieces)) == call.arguments


def test_arguments_nested_past_what_json_reads_stop_there() -> None:
    """Arguments nested deeper than Python's JSON parser can recurse: a begun call's arguments stop being
    read there and are closed, so ollama's and Anthropic's replies, which load them as an object, can."""
    deep = '{"a": ' * 2000 + "1" + "}" * 2000
    text = f'<tool_call>{{"name": "multiply", "arguments": {deep}}}</tool_call>'
    for size in (7, 100_000):
        pieces = streamed(text, size, objects_only=True)
        (call,) = [piece for piece in pieces if isinstance(piece, ToolCall)]
        assert isinstance(json.loads(call.arguments), dict) and "".join(deltas(pieces)) == call.arguments


def test_what_follows_a_calls_arguments_is_its_markup() -> None:
    """After the arguments, the rest of the block to its closing tag is the call's markup, however the
    model wrote it (a brace too many, a key more, JSON that breaks off); a bare call's, the answer's rest."""
    call = ToolCall("multiply", '{"a": 6}')
    for block in [
        '<tool_call>{"name": "multiply", "arguments": {"a": 6}}}</tool_call>',
        '<tool_call>{"name": "multiply", "arguments": {"a": 6}, "id": 1}</tool_call>',
        '<tool_call>{"name": "multiply", "arguments": {"a": 6,, "b": 7}}</tool_call>',
    ]:
        for size in (1, 4, 200):
            assert [
                p for p in streamed(f"x{block}y", size) if not isinstance(p, CallStart | ArgumentsDelta)
            ] == [
                "x",
                call,
                "y",
            ]
    assert split_answer('{"name": "multiply", "arguments": {"a": 6}}\n{"x": 1}', NAMES) == ("", [call])


def shown_and_calls(pieces: list[object]) -> tuple[str, list[ToolCall]]:
    """The text shown (stripped, as a whole answer's with calls) and the calls."""
    calls = [piece for piece in pieces if isinstance(piece, ToolCall)]
    shown = "".join(piece for piece in pieces if isinstance(piece, str))
    return (shown.strip() if calls else shown), calls


def test_an_answer_reads_the_same_however_its_tokens_cut_it() -> None:
    """The same text and calls whatever pieces the answer comes in (a whole answer is read in one), each
    call's pieces adding up to its arguments: a block is begun or not by its text before its closing tag."""
    for text in [
        '<tool_call>{"name": "</tool_call>", "arguments": {"a": 6}}</tool_call> after',
        '<tool_call>{"name": "multiply"}</tool_call>, "arguments": {"a": 6}}',
        'a <tool_call>{"name": "multiply", "arguments": {"a": "</tool_call>"}}</tool_call> b',
        '<tool_call>{"name": "multiply", "arguments": {"a": 6}} <tool_call>{"name": "x", "arguments": {}}',
        '{"name": "multiply", "arguments": {"a": 6}}</tool_call>',
        '{"name": "multiply", "arguments": {"a": 6}',
    ]:
        read = [streamed(text, size) for size in (1, 2, 3, 5, 1000)]
        assert all(shown_and_calls(pieces) == shown_and_calls(read[-1]) for pieces in read), text
        assert shown_and_calls(read[-1]) == split_answer(text, NAMES)
        for pieces in read:
            for call in [piece for piece in pieces if isinstance(piece, ToolCall)]:
                index = [piece for piece in pieces if isinstance(piece, ToolCall)].index(call)
                sent = [
                    piece.text
                    for piece in pieces
                    if isinstance(piece, ArgumentsDelta) and piece.index == index
                ]
                assert "".join(sent) == call.arguments


def test_calls_read_whole_come_as_a_start_one_delta_and_the_call() -> None:
    """A call that cannot be read before its end (its arguments a JSON text, or written before its name;
    one a prefill began) still comes as a start, its arguments in one piece and the call: the three APIs
    send every call one way. A bare object naming no tool offered is text, never begun."""
    for text in [
        '<tool_call>{"arguments": {"a": 6}, "name": "multiply"}</tool_call>',
        '<tool_call>{"name": "multiply", "arguments": "{\\"a\\": 6}"}</tool_call>',
    ]:
        for size in (1, 100):
            assert streamed(text, size) == [
                CallStart(0, "multiply"),
                ArgumentsDelta(0, '{"a": 6}'),
                ToolCall("multiply", '{"a": 6}'),
            ]
    pieces = streamed(' "arguments": {"a": 6}}', 2, prefill='{"name": "multiply",')
    assert pieces == [
        CallStart(0, "multiply"),
        ArgumentsDelta(0, '{"a": 6}'),
        ToolCall("multiply", '{"a": 6}'),
    ]
    data = '{"name": "dance", "arguments": {"a": 6}}'
    assert streamed(data, 3) == [data]


def test_nan_infinity_and_numbers_past_a_float_are_where_the_json_stops() -> None:
    """Python's json reads NaN, Infinity and 1e999 (as inf) and writes them back, which no JSON reader
    takes: a begun call's arguments stop before them, closed there; a block read whole stays text."""
    for arguments, closed in (
        ('{"a": NaN}', "{}"),
        ('{"a": 1, "b": -Infinity}', '{"a": 1}'),
        ('{"a": 1, "b": 1e999}', '{"a": 1}'),
    ):
        block = f'<tool_call>{{"name": "multiply", "arguments": {arguments}}}</tool_call>'
        for size in (1, len(block)):
            assert whole(streamed(block, size)) == [ToolCall("multiply", closed)]
        named_last = f'<tool_call>{{"arguments": {arguments}, "name": "multiply"}}</tool_call>'
        assert split_answer(named_last, NAMES) == (named_last, [])


def test_a_second_call_without_parallel_calls_is_never_begun() -> None:
    block = '<tool_call>{"name": "multiply", "arguments": {"a": 6}}</tool_call>'
    pieces = streamed(f"{block}\n{block}", 3, parallel=False)
    assert [p for p in pieces if isinstance(p, CallStart)] == [CallStart(0, "multiply")]
    assert [p for p in pieces if isinstance(p, ToolCall)] == [ToolCall("multiply", '{"a": 6}')]
    assert [p.index for p in streamed(f"{block}\n{block}", 3) if isinstance(p, ArgumentsDelta)][-1] == 1


TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>{{ call.function | tojson }}"
    "</tool_call>{% endfor %}{% else %}{{ message.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tools_server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("serve-tools")
    small = write_tiny_model(folder / "tools.gguf", seed=0, chat_template=TOOLS_TEMPLATE, n_ctx_train=4096)
    args = [*pair_args((small, tiny_pair[1])), "--ctx", "4096"]  # room for deeply nested arguments
    with serving(args, folder / "server.log") as running:
        yield running


def chat(server: Server, **body: object) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=60)


def test_tools_and_earlier_calls_are_rendered_by_the_template(tools_server: Server) -> None:
    """The tools reach the prompt (it grows by their JSON), an assistant's earlier call and the tool's
    answer are taken, with tool_choice 'none' the tools are left out."""
    plain = chat(tools_server, messages=HI, max_tokens=2).json()
    offered = chat(tools_server, messages=HI, tools=TOOLS, max_tokens=2).json()
    declined = chat(tools_server, messages=HI, tools=TOOLS, tool_choice="none", max_tokens=2).json()
    tools_tokens = len(json.dumps(TOOLS[0]).encode())  # the tiny vocabulary: a token per byte at most
    assert offered["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"] >= tools_tokens // 4
    assert declined["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
    }
    turn = [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}]
    turn.append({"role": "tool", "tool_call_id": "call_1", "content": "42"})
    answered = chat(tools_server, messages=turn, tools=TOOLS, max_tokens=2)
    assert answered.status_code == 200, answered.text


def test_json_nested_past_the_parsers_recursion_limit_stays_text(tools_server: Server) -> None:
    """Arguments nested deeper than Python's JSON parser can recurse are no call in an answer, and the
    text the client sent in a request (as for arguments that are not JSON at all): never a 500."""
    deep = "[" * 1100 + "]" * 1100
    block = f'<tool_call>{{"name": "multiply", "arguments": {deep}}}</tool_call>'
    assert split_answer(block, NAMES) == (block, [])
    unclosed = '{"name": "multiply", "arguments": ' + "[" * 1100
    assert split_answer(unclosed, NAMES) == (unclosed, [])
    call = {"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": deep}}
    turn = [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}]
    turn.append({"role": "tool", "tool_call_id": "call_1", "content": "42"})
    answered = chat(tools_server, messages=turn, tools=TOOLS, max_tokens=2)
    assert answered.status_code == 200, answered.text
    assert answered.json()["usage"]["prompt_tokens"] > len(deep) // 4  # the text reached the prompt


CALL_SCHEMA = {  # a bare call of multiply, JSON mode makes the tiny model write it
    "type": "object",
    "properties": {
        "name": {"const": "multiply"},
        "arguments": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def test_a_call_alone_has_no_content_streamed_as_whole(tools_server: Server) -> None:
    """An answer that is a call alone has ``content: null`` (OpenAI's shape), and the openai client's
    stream helper adds the stream up to the same message: an empty content delta, sent for the tokens
    held while the call was still open, had made it ``""``. The call, its finish reason and the tokens'
    log-probabilities are the same both ways; ``parallel_tool_calls: false`` and ``logprobs`` go along.
    The stream sends the arguments as they are written: several deltas, the whole answer's arguments."""
    client = openai.OpenAI(base_url=tools_server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {
        "model": "ead",
        "messages": [{"role": "user", "content": "What is 6 times 7?"}],
        "tools": TOOLS,
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}},
        "temperature": 0,
        "max_tokens": 60,
        "logprobs": True,
    }
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    (call,) = whole.message.tool_calls
    assert call.function.name == "multiply" and set(json.loads(call.function.arguments)) == {"a", "b"}
    with client.chat.completions.stream(**request) as stream:
        events = list(stream)
        streamed = stream.get_final_completion().choices[0]
    assert "content.delta" not in [event.type for event in events]
    # the arguments as the model writes them, in pieces that add up to the whole answer's
    pieces = [
        event.arguments_delta for event in events if event.type == "tool_calls.function.arguments.delta"
    ]
    assert len(pieces) >= 3 and "".join(pieces) == call.function.arguments
    assert streamed.finish_reason == "tool_calls" and streamed.message.content is None
    assert streamed.message.role == "assistant"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (call.function.name, call.function.arguments)
    ]
    assert [e.bytes for e in streamed.logprobs.content] == [e.bytes for e in whole.logprobs.content]


def test_a_call_the_prefill_begins_comes_back_whole_streamed_and_whole(tools_server: Server) -> None:
    """An assistant prefill that begins the call, which JSON mode makes the tiny model finish: the call is
    read over prefill and answer together, ``tool_calls`` whole and no content, both ways. The answer
    alone had been read, and its end of the call came back as content (finish_reason 'stop')."""
    client = openai.OpenAI(base_url=tools_server.base_url, api_key="unused", max_retries=0, timeout=60)
    prefill = '{"name": "multiply", "arguments": {"a": 6'
    request = {
        "model": "ead",
        "messages": [
            {"role": "user", "content": "What is 6 times 7?"},
            {"role": "assistant", "content": prefill},
        ],
        "tools": TOOLS,
        "response_format": {"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}},
        "temperature": 0,
        "max_tokens": 60,
    }
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    (call,) = whole.message.tool_calls
    assert call.function.name == "multiply"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"a", "b"} and str(arguments["a"]).startswith("6")
    with client.chat.completions.stream(**request) as stream:
        events = [event.type for event in stream]
        streamed = stream.get_final_completion().choices[0]
    assert "content.delta" not in events
    assert streamed.finish_reason == "tool_calls" and streamed.message.content is None
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (call.function.name, call.function.arguments)
    ]


# a request whose JSON schema makes the tiny model write a call
FORCED_CALL = {
    "model": "ead",
    "messages": [{"role": "user", "content": "What is 6 times 7?"}],
    "tools": TOOLS,
    "response_format": {"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}},
    "temperature": 0,
}


def test_a_call_cut_off_at_max_tokens_finishes_by_length(tools_server: Server) -> None:
    """An answer cut off at max_tokens says ``length`` though a whole call came before the cut, as
    llama-server says (``tool_calls`` only where the model ended its answer) and as OpenAI does: the
    model may have had more to write, which a client that runs the calls would never learn. The call
    is still sent, whole and streamed."""
    client = openai.OpenAI(base_url=tools_server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = FORCED_CALL
    ended = client.chat.completions.create(**request, max_tokens=60)
    assert ended.choices[0].finish_reason == "tool_calls"
    (call,) = ended.choices[0].message.tool_calls
    # the same tokens up to the end-of-generation one, which the count includes: cut off before it
    cut = {**request, "max_tokens": ended.usage.completion_tokens - 1}
    cut_off = client.chat.completions.create(**cut)
    assert cut_off.model_extra["ead"]["summary"]["finish_reason"] == "length"
    whole = cut_off.choices[0]
    assert whole.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [
        (call.function.name, call.function.arguments)
    ]
    with client.chat.completions.stream(**cut) as stream:
        for _ in stream:
            pass
        # the helper's final completion refuses an answer cut off (no JSON to parse): the deltas added up
        streamed = stream.current_completion_snapshot.choices[0]
    assert streamed.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (call.function.name, call.function.arguments)
    ]


def test_a_call_cut_off_inside_its_arguments_is_closed_where_it_stopped(tools_server: Server) -> None:
    """max_tokens that cuts the answer inside the call's arguments (the tiny model writes a token per
    character here: cut after the 3 of ``"b": 3``, a number not yet whole): the call's arguments are
    those written so far, closed, whole and streamed alike, and the finish is ``length``."""
    client = openai.OpenAI(base_url=tools_server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = FORCED_CALL
    ended = client.chat.completions.create(**request, max_tokens=60, logprobs=True).choices[0]
    (call,) = ended.message.tool_calls
    written = [bytes(entry.bytes).decode() for entry in ended.logprobs.content]
    # b's number begun (JSON's blank, llama.cpp's, may come before and after its colon), not known whole
    # before what follows it
    cut = next(i for i in range(len(written)) if re.search(r'"b"\s*:\s*\d$', "".join(written[: i + 1]))) + 1
    closed = json.dumps({"a": json.loads(call.function.arguments)["a"]})
    whole = client.chat.completions.create(**request, max_tokens=cut).choices[0]
    assert whole.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [
        ("multiply", closed)
    ]
    with client.chat.completions.stream(**request, max_tokens=cut) as stream:
        events = list(stream)
        streamed = stream.current_completion_snapshot.choices[0]
    assert streamed.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        ("multiply", closed)
    ]
    pieces = [
        event.arguments_delta for event in events if event.type == "tool_calls.function.arguments.delta"
    ]
    assert len(pieces) >= 3 and "".join(pieces) == closed


PICK = [
    {
        "type": "function",
        "function": {
            "name": "pick",
            "parameters": {
                "type": "object",
                "properties": {"colour": {"$ref": "#/$defs/colour"}, "count": {"type": "integer"}},
                "required": ["colour", "count"],
                "additionalProperties": False,
                "$defs": {"colour": {"type": "string", "enum": ["red", "green"]}},
            },
        },
    }
]


@pytest.fixture(scope="module")
def tags_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A model whose vocabulary has <tool_call> as one token, as Qwen2.5's has: the calls' grammar is
    triggered by it."""
    folder = tmp_path_factory.mktemp("serve-tags")
    pair = [
        write_tiny_model(folder / f"{name}.gguf", seed=seed, vocab="tool-tags", chat_template=TOOLS_TEMPLATE)
        for seed, name in enumerate(("small", "large"))
    ]
    with serving(pair_args((pair[0], pair[1])), folder / "server.log") as running:
        yield running


def assert_one_bound_pick(client: openai.OpenAI, request: dict) -> tuple[Choice, Choice]:
    """The answer is one call of ``pick`` whose arguments its schema allows (an enum's value, an integer),
    and the streamed answer the same call, with no text beside it either way: the two answers' choices."""
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None, whole
    (call,) = whole.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "pick" and set(arguments) == {"colour", "count"}
    assert arguments["colour"] in ("red", "green") and type(arguments["count"]) is int
    return whole, assert_streamed_alike(client, request, call)


def assert_streamed_alike(
    client: openai.OpenAI, request: dict, call: ChatCompletionMessageToolCall
) -> Choice:
    """The streamed answer to ``request`` is ``call`` alone, as the whole answer was: its choice."""
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls" and streamed.message.content is None
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (call.function.name, call.function.arguments)
    ]
    return streamed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_calls_arguments_are_bound_by_its_schema_as_llama_servers(tags_server: Server, seed: int) -> None:
    """From the <tool_call> token on, a grammar binds the answer to calls of the tools offered, their
    arguments as each schema allows (llama-server's lazy grammar): a prefill that opens the call, the tiny
    model's random draws, and the arguments are still an enum's value (through a $ref) and an integer,
    whole and streamed alike. Unbound, the tiny model wrote no JSON there: the block stayed text, cut off
    at max_tokens."""
    client = openai.OpenAI(base_url=tags_server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {
        "model": "ead",
        "messages": [
            {"role": "user", "content": "Pick a colour."},
            {"role": "assistant", "content": '<tool_call>\n{"name": "pick", "arguments": {'},
        ],
        "tools": PICK,
        "parallel_tool_calls": False,
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": 200,
    }
    assert_one_bound_pick(client, request)


# After a prefill that ends inside the tool's name ('{"name": "pi'), a bigram script draws its end (the
# prompt's last token, "i", then "c", "k" and the closing quote), and the model's random rows the rest
BARE_SCRIPT = ["i", "c", "k", '"']


@pytest.fixture(scope="module", params=["tool-tags", "base"])
def bare_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A pair that writes the end of a bare call's name, mid-answer, in a vocabulary with <tool_call> as
    one token (Qwen2.5's) and in one without it (where no tagged call can be bound)."""
    folder = tmp_path_factory.mktemp(f"serve-bare-{request.param}")
    pair = [
        write_tiny_model(
            folder / f"{name}.gguf",
            seed=seed,
            vocab=request.param,
            chat_template=TOOLS_TEMPLATE,
            script=BARE_SCRIPT,
        )
        for seed, name in enumerate(("small", "large"))
    ]
    with serving(pair_args((pair[0], pair[1])), folder / "server.log") as running:
        yield running


# A bare call's opening as the 0.5B writes it: on one line after a system prompt, or in a fenced code block
# and indented as json.dumps(indent=2) writes it without one (test_the_real_small_models_bare_call_...)
BARE_OPENINGS = ['{"name": "pi', '```json\n{\n  "name": "pi']


@pytest.mark.parametrize("opening", BARE_OPENINGS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bare_calls_arguments_are_bound_once_it_names_a_tool(
    bare_server: Server, seed: int, opening: str
) -> None:
    """A bare ``{"name": ..., "arguments": ...}`` answer (no <tool_call> tags, as Qwen2.5 0.5B often
    writes), alone or in a fenced code block (as it writes too, its JSON over several lines), is bound by
    the calls' grammar once its text names a tool offered: from there the random draws are the call's
    arguments as its schema allows (and a fence's closing fence), whole and streamed alike, the fences
    never text. Unbound, the tiny model wrote no JSON after the name: the answer stayed text, cut off at
    max_tokens."""
    client = openai.OpenAI(base_url=bare_server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {
        "model": "ead",
        "messages": [
            {"role": "user", "content": "Pick a colour."},
            {"role": "assistant", "content": opening},
        ],
        "tools": PICK,
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": 200,
    }
    assert_one_bound_pick(client, request)


LONG_NOTE = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 5000}}}


def test_a_schema_no_grammar_holds_leaves_the_calls_unbound(tags_server: Server) -> None:
    """A tool's schema the converter cannot make a grammar of (a maxLength past what llama.cpp's parser
    takes) is no 400: the calls are read as the model writes them, as before any grammar bound them."""
    tools = [{"type": "function", "function": {"name": "note", "parameters": LONG_NOTE}}]
    reply = chat(tags_server, messages=HI, tools=tools, max_tokens=4)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] == "length"


FLIP = [
    {
        "type": "function",
        "function": {
            "name": "flip",
            "parameters": {
                "type": "object",
                "properties": {"side": {"type": "string", "enum": ["heads", "tails"]}},
                "required": ["side"],
                "additionalProperties": False,
            },
        },
    }
]


def forced(client: openai.OpenAI, request: dict) -> list[tuple[str, dict]]:
    """The calls of a forced answer, whole and streamed alike (each its name and arguments), its
    finish_reason tool_calls both ways, as OpenAI's for a call."""
    whole = client.chat.completions.create(**request).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls"
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == calls
    return [(name, json.loads(arguments)) for name, arguments in calls]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tool_choice_required_forces_a_call_from_the_answers_first_token(
    tags_server: Server, seed: int
) -> None:
    """``required``: the calls' grammar binds the answer from its first token (llama-server's, not lazy),
    so the tiny model's random draws are a call of a tool offered, its arguments as the schema allows;
    with auto, the same draws are text."""
    client = openai.OpenAI(base_url=tags_server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {
        "model": "ead",
        "messages": [{"role": "user", "content": "Pick a colour or flip a coin."}],
        "tools": PICK + FLIP,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": 300,
    }
    ((name, arguments),) = forced(client, request)
    if name == "pick":
        assert arguments["colour"] in ("red", "green") and type(arguments["count"]) is int
    else:
        assert name == "flip" and arguments in ({"side": "heads"}, {"side": "tails"})
    free = client.chat.completions.create(**{**request, "tool_choice": "auto", "max_tokens": 20})
    assert free.choices[0].message.tool_calls is None and free.choices[0].finish_reason == "length"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_named_tool_choice_forces_a_call_of_that_tool(tags_server: Server, seed: int) -> None:
    """A named function: the grammar over that tool alone (both rendered for the model, as OpenAI's)."""
    client = openai.OpenAI(base_url=tags_server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {
        "model": "ead",
        "messages": [{"role": "user", "content": "Flip a coin."}],
        "tools": PICK + FLIP,
        "tool_choice": {"type": "function", "function": {"name": "flip"}},
        "temperature": 1.0,
        "seed": seed,
        "max_tokens": 300,
    }
    calls = forced(client, request)
    assert calls and all(call in [("flip", {"side": "heads"}), ("flip", {"side": "tails"})] for call in calls)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "'nope' is not among the tools",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format, whose grammar"),
        ({"tools": None, "tool_choice": "required"}, "none are"),
        ({"ead": {"mode": "spec"}}, "--mode spec, which takes tokens back"),
        ({"tools": [{"type": "function", "function": {"name": "note", "parameters": LONG_NOTE}}]}, "grammar"),
        (
            {"messages": [*HI, {"role": "assistant", "content": "Sure."}]},
            "the grammar rules out token 0",
        ),
    ],
)
def test_a_forced_call_the_answer_cannot_be_bound_to_is_a_400_saying_why(
    tags_server: Server, body: dict, fragment: str
) -> None:
    reply = chat(tags_server, **{"messages": HI, "tools": PICK, "tool_choice": "required", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "tool_choice" and fragment in error["message"], error
    answered = chat(tags_server, messages=HI, tools=PICK, tool_choice="required", max_tokens=300)
    assert answered.status_code == 200, answered.text  # the server still serves, the call still forced


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools.0.function.name", ""),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}},
            "tool_choice.function.name",
            "Field required",
        ),
    ],
)
def test_tool_requests_that_cannot_be_honoured_are_a_400(
    tools_server: Server, body: dict, param: str, fragment: str
) -> None:
    reply = chat(tools_server, messages=HI, **body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param and fragment in error["message"]


def test_two_tools_of_one_name_are_a_400_naming_it_on_every_route(tools_server: Server) -> None:
    """A call names its tool, so two tools of one name are refused, as OpenAI and Anthropic refuse them:
    a 400 in each API's shape naming the name, through each route's own client; the server serves on."""
    function = TOOLS[0]["function"]
    said = "tools: the function 'multiply' is offered twice (a call names its tool: one name, one tool)"
    api = openai.OpenAI(base_url=tools_server.base_url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as chat_refused:
        api.chat.completions.create(model="ead", messages=HI, tools=[*TOOLS, *TOOLS])
    with pytest.raises(openai.BadRequestError) as responses_refused:
        flat = {"type": "function", **function}
        api.responses.create(model="ead", input="hi", tools=[flat, flat])
    for refused in (chat_refused, responses_refused):
        assert refused.value.body["message"] == said and refused.value.body["param"] == "tools"
    messages = anthropic.Anthropic(base_url=tools_server.url, api_key="unused", max_retries=0, timeout=60)
    tool = {
        "name": "multiply",
        "description": function["description"],
        "input_schema": function["parameters"],
    }
    with pytest.raises(anthropic.BadRequestError) as messages_refused:
        messages.messages.create(model="ead", max_tokens=4, messages=HI, tools=[tool, tool])
    assert messages_refused.value.body["error"] == {"type": "invalid_request_error", "message": said}
    with pytest.raises(ollama_client.ResponseError) as ollama_refused:
        ollama_client.Client(host=tools_server.url).chat(model="ead", messages=HI, tools=[*TOOLS, *TOOLS])
    assert ollama_refused.value.status_code == 400 and ollama_refused.value.error == said
    answered = api.chat.completions.create(model="ead", messages=HI, tools=TOOLS, max_tokens=2)
    assert answered.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_template_without_tools_refuses_them_by_name(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    with Server(pair_args(tiny_pair), tmp_path / "server.log") as server:
        reply = chat(server, messages=HI, tools=TOOLS)
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "unsupported_parameter" and error["param"] == "tools"
        assert "has no tool support" in error["message"]
        completion = httpx.post(
            f"{server.base_url}/completions", json={"prompt": "hi", "tools": TOOLS}, headers=JSON, timeout=60
        )
        assert completion.status_code == 400 and completion.json()["error"]["param"] == "tools"
        said = completion.json()["error"]["message"]
        assert said == "tools: tools are taken by /v1/chat/completions, not here"
        assert server.stop() == 0


SYSTEM = (
    "Call a tool when you need one. "
    "Once a tool's result is in, answer the user in one sentence that states it."
)
QUESTION = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 1234 times 5678?"}]


def multiply(arguments: str) -> str:
    values = json.loads(arguments)
    return str(values["a"] * values["b"])


@pytest.mark.real
def test_the_openai_client_round_trip_on_the_real_pair(real_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Ask, get a call (streamed as deltas, its arguments in pieces as written, and whole, the same), run
    the tool, send its result, get the answer that states it; both models write along the way."""
    with Server([*pair_args(real_pair), "--mode", "ead"], tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
        asked = client.chat.completions.create(
            model="ead", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=60
        )
        assert asked.choices[0].finish_reason == "tool_calls"
        (call,) = asked.choices[0].message.tool_calls
        assert call.function.name == "multiply" and json.loads(call.function.arguments) == {
            "a": 1234,
            "b": 5678,
        }

        chunks = list(
            client.chat.completions.create(
                model="ead", messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=60, stream=True
            )
        )
        deltas = [d for chunk in chunks for d in (chunk.choices[0].delta.tool_calls or [])]
        # the call's name first, then its arguments as the model writes them, in pieces
        assert (deltas[0].index, deltas[0].function.name, deltas[0].function.arguments) == (0, "multiply", "")
        assert {(d.index, d.id, d.function.name) for d in deltas[1:]} == {(0, None, None)}
        assert len(deltas) > 3 and "".join(d.function.arguments for d in deltas) == call.function.arguments
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        tokens = [chunk.model_extra["ead"] for chunk in chunks if "model" in chunk.model_extra.get("ead", {})]
        assert len(tokens) == chunks[-1].usage.completion_tokens  # every token still attributed, once

        result = multiply(call.function.arguments)
        turn = [
            *QUESTION,
            asked.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]
        answer = client.chat.completions.create(
            model="ead", messages=turn, tools=TOOLS, temperature=0, max_tokens=60
        )
        assert answer.choices[0].finish_reason == "stop"
        assert "7006652" in answer.choices[0].message.content.replace(",", "")
        writers = {token["model"] for token in answer.model_extra["ead"]["tokens"]}
        assert writers == {"small", "large"}
        assert server.stop() == 0


@pytest.mark.real
def test_llm_calls_a_python_tool_through_the_server(real_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Simon Willison's llm as the agent: a Python function as its tool, the call made by the pair,
    run by llm, its result sent back, the answer stating it (llm streams, so the deltas are read)."""
    llm = shutil.which("llm", path=str(Path(EAD).parent))
    assert llm is not None, "llm is in the test extra"
    with Server([*pair_args(real_pair), "--mode", "ead"], tmp_path / "server.log") as server:
        (tmp_path / "extra-openai-models.yaml").write_text(
            f"- model_id: ead-real\n  model_name: ead\n  api_base: {server.base_url}\n"
            "  supports_tools: true\n"
        )
        functions = tmp_path / "tools.py"
        functions.write_text(
            'def multiply(a: int, b: int) -> int:\n    "Multiply two integers exactly"\n    return a * b\n'
        )
        env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused"}
        args = [llm, "-m", "ead-real", "--functions", str(functions), "--td", "-o", "temperature", "0"]
        result = subprocess.run(
            [*args, "-s", SYSTEM, "What is 1234 times 5678?"], capture_output=True, env=env, timeout=600
        )
        assert result.returncode == 0, result.stderr
        debug = result.stderr.decode()  # --td: the tool calls llm ran, and what they returned
        assert "multiply({'a': 1234, 'b': 5678})" in debug and "7006652" in debug
        assert "7006652" in result.stdout.decode().replace(",", "")
        assert server.stop() == 0
    assert server.log().count("POST /v1/chat/completions 200") == 2


TIMER = [
    {
        "type": "function",
        "function": {
            "name": "set_timer",
            "description": "Start a kitchen timer",
            "parameters": {
                "type": "object",
                "properties": {"minutes": {"type": "integer"}},
                "required": ["minutes"],
                "additionalProperties": False,
            },
        },
    }
]


@pytest.mark.real
def test_the_real_small_models_bare_call_is_bound_by_its_schema(
    real_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """Qwen2.5-Coder 0.5B, greedy, answers with the bare call object (no <tool_call> tags) after the system
    prompt, and in a fenced ``json`` code block without it; unbound it wrote ``{"minutes": 2.5}`` for an
    integer both ways. Bound from its opening, the minutes are an integer, whole and streamed, and the
    fences are no content (the tiny models' test above checks the stream's pieces)."""
    with Server(["-m", str(real_pair[0])], tmp_path / "server.log") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
        for system, opening in [
            ([{"role": "system", "content": SYSTEM}], '{"name": "set_timer"'),
            ([], '```json\n{\n  "name": "set_timer"'),
        ]:
            request = {
                "model": "ead",
                "messages": [*system, {"role": "user", "content": "Set a timer for 2.5 minutes"}],
                "tools": TIMER,
                "temperature": 0,
                "max_tokens": 60,
                "logprobs": True,
            }
            whole = client.chat.completions.create(**request).choices[0]
            assert "".join(entry.token for entry in whole.logprobs.content).startswith(opening)
            assert whole.finish_reason == "tool_calls" and whole.message.content is None
            (call,) = whole.message.tool_calls
            assert call.function.name == "set_timer"
            assert type(json.loads(call.function.arguments)["minutes"]) is int, call.function.arguments
            assert_streamed_alike(client, request, call)
        assert server.stop() == 0
