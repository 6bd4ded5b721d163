"""`logprobs` / `top_logprobs` through `ead serve`: each token's log-probability under the model that wrote
it, from the logits it was drawn from, in OpenAI's chat and text-completion shapes."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, HI, JSON, PROMPT, TAU, serving


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(
        [*pair_args(tiny_pair), *TAU, *CTX, "--no-reuse"],
        tmp_path_factory.mktemp("serve-logprobs") / "server.log",
    ) as running:
        yield running


MESSAGES = [{"role": "user", "content": PROMPT}]


def test_chat_logprobs_whole_and_streamed(server: Server) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {"model": "ead", "messages": MESSAGES, "max_tokens": 16, "temperature": 0, "logprobs": True}
    whole = client.chat.completions.create(**request, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    tokens = whole.model_extra["ead"]["tokens"]
    assert len(content) == len(tokens) == 16
    assert {token["model"] for token in tokens} == {"small", "large"}  # both models' logits are read
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        values = [top.logprob for top in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and sum(math.exp(v) for v in values) <= 1 + 1e-6
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy: the likeliest
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token

    streamed = list(client.chat.completions.create(**request, top_logprobs=3, stream=True))
    streamed_content = [
        e for chunk in streamed if chunk.choices[0].logprobs for e in chunk.choices[0].logprobs.content
    ]
    assert [e.bytes for e in streamed_content] == [e.bytes for e in content]
    assert [e.logprob for e in streamed_content] == pytest.approx([e.logprob for e in content], abs=1e-4)

    without_top = client.chat.completions.create(**request)
    assert all(entry.top_logprobs == [] for entry in without_top.choices[0].logprobs.content)
    plain = client.chat.completions.create(**{**request, "logprobs": False})
    assert plain.choices[0].logprobs is None


def test_text_completion_logprobs(server: Server) -> None:
    body = {"prompt": "def fib(n):", "max_tokens": 8, "temperature": 0.7, "seed": 3, "logprobs": 2}
    reply = httpx.post(f"{server.base_url}/completions", json=body, headers=JSON, timeout=60).json()
    logprobs = reply["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 8
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"]) and logprobs["text_offset"][0] == 0
    assert all(len(top) in (2, 3) and max(top.values()) <= 0 for top in logprobs["top_logprobs"])
    assert all(lp <= 0 for lp in logprobs["token_logprobs"])


def test_text_completion_top_logprobs_always_hold_the_token_drawn(server: Server) -> None:
    """OpenAI's legacy ``logprobs: N`` lists the N likeliest and always the token drawn, up to N + 1 (a
    client reading a row's best, ``max(top, key=top.get)``, met an empty row at ``logprobs: 0``, and a
    sampled token past the N was missing): each row holds its token with its logprob, whole and streamed."""
    for asked, sampling in ((0, {"temperature": 0}), (1, {"temperature": 2, "seed": 4})):
        body = {"prompt": "def fib(n):", "max_tokens": 24, "logprobs": asked, **sampling}
        whole = httpx.post(f"{server.base_url}/completions", json=body, headers=JSON, timeout=60).json()
        logprobs = whole["choices"][0]["logprobs"]
        columns = (logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"])
        rows = list(zip(*columns, strict=True))
        assert len(rows) == 24 and all(top[name] == value for name, value, top in rows), rows
        assert all(len(top) in (asked, asked + 1) for _, _, top in rows)
        streamed = [
            chunk.choices[0].logprobs.top_logprobs
            for chunk in openai.OpenAI(base_url=server.base_url, api_key="x").completions.create(
                model="ead", stream=True, **body
            )
            if chunk.choices and chunk.choices[0].logprobs
        ]
        assert [row for rows in streamed for row in rows] == logprobs["top_logprobs"]
    assert any(len(top) == 2 for _, _, top in rows)  # a token drawn past the likeliest did arise


def _named_bytes(name: str) -> bytes:
    """The bytes a text completion's token name stands for (``bytes:\\xNN``, ``token_id:N``, or text)."""
    if name.startswith("bytes:"):
        escapes = name.removeprefix("bytes:")
        assert re.fullmatch(r"(\\x[0-9a-f]{2})+", escapes), name
        return bytes(int(escapes[i + 2 : i + 4], 16) for i in range(0, len(escapes), 4))
    return b"" if re.fullmatch(r"token_id:\d+", name) else name.encode()


def test_text_completion_logprobs_name_each_token_apart(server: Server) -> None:
    """Keyed by text, the tiny vocabulary's byte tokens (half of its first 256) had all read U+FFFD and
    shared one key: of 20 asked, rows held fewer. A token whose bytes are not text on their own is
    named ``bytes:\\xNN`` as OpenAI names it, so every row holds 20, and the names spell the text."""
    body = {"prompt": "def fib(n):", "max_tokens": 24, "temperature": 1, "seed": 5, "logprobs": 20}
    reply = httpx.post(f"{server.base_url}/completions", json=body, headers=JSON, timeout=60).json()
    logprobs = reply["choices"][0]["logprobs"]
    assert all(len(top) in (20, 21) for top in logprobs["top_logprobs"])  # 21: the token drawn past them
    names = [name for top in logprobs["top_logprobs"] for name in top]
    assert any(name.startswith("bytes:") for name in names)  # the case this is about did arise
    for name in names:
        assert "\ufffd" not in name
        if name.startswith("bytes:"):
            with pytest.raises(UnicodeDecodeError):
                _named_bytes(name).decode("utf-8")
    spelled = b"".join(_named_bytes(name) for name in logprobs["tokens"])
    assert spelled.decode("utf-8", errors="replace") == reply["choices"][0]["text"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"logprobs": True, "ead": {"verify": 0.5}}, "takes tokens back"),
        ({"logprobs": True, "ead": {"mode": "spec"}}, "takes tokens back"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_logprobs_that_cannot_be_given_are_a_400(server: Server, body: dict, fragment: str) -> None:
    reply = httpx.post(
        f"{server.base_url}/chat/completions", json={"messages": HI, **body}, headers=JSON, timeout=60
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert fragment in error["message"]
    assert error["code"] == "invalid_value" and error["param"] is not None, error


BOOLEAN = "Input should be a valid boolean"
INTEGER = "Input should be a valid integer"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"logprobs": 1}, "logprobs", f"logprobs: {BOOLEAN}"),
        ({"logprobs": 0}, "logprobs", f"logprobs: {BOOLEAN}"),
        ({"logprobs": "true"}, "logprobs", f"logprobs: {BOOLEAN}"),
        ({"logprobs": True, "top_logprobs": True}, "top_logprobs", f"top_logprobs: {INTEGER}"),
        ({"logprobs": True, "top_logprobs": 2.5}, "top_logprobs", f"top_logprobs: {INTEGER}"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "top_logprobs: Input should be greater"),
    ],
)
def test_chat_logprobs_is_a_boolean_and_top_logprobs_a_count(
    server: Server, body: dict, param: str, message: str
) -> None:
    """Chat's logprobs is OpenAI's boolean: an integer (text completions' count) had been taken as the
    count of alternatives."""
    reply = httpx.post(
        f"{server.base_url}/chat/completions", json={"messages": HI, **body}, headers=JSON, timeout=60
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, "invalid_value")
    assert error["message"].startswith(message)


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"logprobs": True}, "logprobs", f"logprobs: {INTEGER}"),
        (
            {"logprobs": 2, "top_logprobs": 3},
            "top_logprobs",
            "top_logprobs: a text completion asks for N alternatives with logprobs: N",
        ),
    ],
)
def test_text_completions_count_their_logprobs_in_logprobs_alone(
    server: Server, body: dict, param: str, message: str
) -> None:
    """A text completion's logprobs is OpenAI's legacy count: ``true`` had passed for the count 0 (Python's
    bool is an int), and chat's top_logprobs beside it had been taken, or left unread beside a count."""
    reply = httpx.post(
        f"{server.base_url}/completions",
        json={"prompt": "hi", "max_tokens": 2, **body},
        headers=JSON,
        timeout=60,
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["message"].startswith(message), error


def test_a_mode_alone_leaves_the_steps_that_take_tokens_back_unused(server: Server) -> None:
    """A request's mode small leaves its switching fields unused: nothing takes a token back."""
    ead = {"mode": "small", "verify": 0.5, "policy": "lookahead"}
    body = {"messages": HI, "max_tokens": 4, "temperature": 0, "logprobs": True, "ead": ead}
    reply = httpx.post(f"{server.base_url}/chat/completions", json=body, headers=JSON, timeout=60)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"][0]["logprobs"]["content"]) == 4


def stop_inside(text: str) -> tuple[str, int]:
    """Two characters of ``text`` past its start, found there first, as a stop string: (it, where)."""
    for where in range(4, len(text) - 2):
        stop = text[where : where + 2]
        if "\ufffd" not in stop and text.find(stop) == where:
            return stop, where
    raise AssertionError(f"no stop string to cut {text!r} at")


def test_logprobs_cover_the_text_shown_when_a_stop_string_cuts_it(server: Server) -> None:
    """The stop string's tokens are never shown, so they get no log-probabilities (as in llama-server);
    the tokens given cover the text exactly, in the whole answer and the stream alike, and a text
    completion's ``text_offset`` says where each token's text starts although text near a possible stop
    string was held back while it streamed."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
    request = {"model": "ead", "messages": MESSAGES, "max_tokens": 24, "temperature": 0, "logprobs": True}
    free = client.chat.completions.create(**request).choices[0].message.content
    stop, where = stop_inside(free)
    cut = client.chat.completions.create(**request, stop=[stop]).choices[0]
    assert cut.message.content == free[:where] and cut.finish_reason == "stop"
    entries = cut.logprobs.content

    def joined(entries: list) -> str:
        return b"".join(bytes(entry.bytes) for entry in entries).decode("utf-8", errors="replace")

    assert joined(entries).startswith(cut.message.content)
    assert len(joined(entries[:-1])) < len(cut.message.content)  # the last token given is shown, in part
    streamed = list(client.chat.completions.create(**request, stop=[stop], stream=True))
    scored = [chunk.choices[0].logprobs for chunk in streamed if chunk.choices and chunk.choices[0].logprobs]
    in_stream = [entry for logprobs in scored for entry in logprobs.content]
    assert [e.bytes for e in in_stream] == [e.bytes for e in entries]

    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 0}
    free_text = httpx.post(f"{server.base_url}/completions", json=body, headers=JSON, timeout=60).json()
    stop, where = stop_inside(free_text["choices"][0]["text"])
    reply = httpx.post(
        f"{server.base_url}/completions", json={**body, "stop": [stop]}, headers=JSON, timeout=60
    ).json()["choices"][0]
    text, logprobs = reply["text"], reply["logprobs"]
    assert text == free_text["choices"][0]["text"][:where]
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] < len(text)
    named = zip(offsets, tokens, strict=True)  # a token that is not text alone is named by its bytes
    whole = [(offset, token) for offset, token in named if not token.startswith(("bytes:", "token_id:"))]
    assert whole and all(text[offset:].startswith(token) for offset, token in whole)


def test_text_offset_after_a_broken_character_is_where_the_token_s_text_starts(server: Server) -> None:
    """A byte that opens a character the next token does not finish shows as U+FFFD once that token
    comes: the U+FFFD is the byte's, so the next token's text starts after it. Its offset had been the
    U+FFFD's (one character early), and the text there was not the token's."""
    arose = False
    for seed in range(8):
        body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 1, "seed": seed, "logprobs": 1}
        reply = httpx.post(f"{server.base_url}/completions", json=body, headers=JSON, timeout=60).json()
        text, logprobs = reply["choices"][0]["text"], reply["choices"][0]["logprobs"]
        named = list(zip(logprobs["text_offset"], logprobs["tokens"], strict=True))
        for (offset, token), (_, before) in zip(named[1:], named, strict=False):
            if token.startswith(("bytes:", "token_id:")):
                continue
            arose |= before.startswith("bytes:") and text[offset - 1 : offset] == "\ufffd"
            assert text[offset:].startswith(token), (seed, offset, token, text)
    assert arose  # the case this is about did arise
