"""llama-server's utility routes on a real `ead serve` with the tiny pair: POST /tokenize and /detokenize
by the models' tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serve_process import Server
from test_cli import pair_args
from test_serve import CTX, JSON, TAU, serving

from ead_cli.runner import Runner

TEXT = "hello wörld 日本<|im_end|>\n"  # a character split across tokens, and a special token


@pytest.fixture(scope="module")
def server(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = [*pair_args(tiny_pair), *TAU, *CTX]
    with serving(args, tmp_path_factory.mktemp("serve") / "server.log") as running:
        yield running


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_tokenize_gives_the_models_ids_and_detokenize_gives_the_text_back(
    server: Server, tiny_pair: tuple[Path, Path]
) -> None:
    with Runner(tiny_pair[0], name="small", n_ctx=64) as runner:
        expected = runner.tokenize(TEXT, add_special=False)
        as_text = runner.tokenize(TEXT, add_special=False, parse_special=False)
        im_end = runner.tokenize("<|im_end|>", add_special=False)
    assert len(im_end) == 1 and im_end[0] in expected and len(as_text) > len(expected)

    ids = post(server, "/tokenize", {"content": TEXT}).json()["tokens"]
    assert ids == expected
    assert post(server, "/tokenize", {"content": TEXT, "parse_special": False}).json()["tokens"] == as_text
    for tokens in (ids, as_text):
        assert post(server, "/detokenize", {"tokens": tokens}).json() == {"content": TEXT}
    assert post(server, "/detokenize", {"tokens": []}).json() == {"content": ""}

    pieces = post(server, "/tokenize", {"content": TEXT, "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == ids
    # as llama-server: a piece that is no UTF-8 on its own (part of a character) as its bytes' values
    split = [piece["piece"] for piece in pieces if isinstance(piece["piece"], list)]
    assert split and all(isinstance(byte, int) for part in split for byte in part)
    spelled = b"".join(
        bytes(piece) if isinstance(piece, list) else piece.encode()
        for piece in (entry["piece"] for entry in pieces)
    )
    assert spelled.decode() == TEXT
    assert {"id": im_end[0], "piece": "<|im_end|>"} in pieces


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/tokenize", {}, "content: Field required"),
        ("/tokenize", {"content": 5}, "content: Input should be a valid string"),
        (
            "/tokenize",
            {"content": "hi", "with_pieces": "yes"},
            "with_pieces: Input should be a valid boolean",
        ),
        ("/detokenize", {"tokens": "hi"}, "tokens: Input should be a valid array"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens.1: Input should be greater than or equal to 0"),
        ("/detokenize", {"tokens": [1, 267]}, "tokens: token id 267 is not in the vocabulary (ids 0-266)"),
        # llama.cpp's tokenizer takes time quadratic in the special tokens it reads: bounded
        (
            "/tokenize",
            {"content": "<|im_end|>" * 16385},
            "content: it holds more than 16384 special tokens (such as '<|im_end|>'): "
            'send "parse_special": false to read their texts as text',
        ),
    ],
)
def test_bad_bodies_get_a_400_error_object_and_one_log_line(
    server: Server, path: str, body: dict, message: str
) -> None:
    before = server.log().splitlines()
    reply = post(server, path, body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["message"] == message and error["type"] == "invalid_request_error"
    assert error["param"] == message.partition(":")[0]
    assert server.log().splitlines()[len(before) :] == [f"error: POST {path} 400: {message}"]
    assert post(server, "/tokenize", {"content": "hi"}).status_code == 200  # and it keeps serving


def test_special_tokens_past_the_bound_are_tokenized_as_text(server: Server) -> None:
    content = "<|im_end|>" * 16385
    reply = post(server, "/tokenize", {"content": content, "parse_special": False})
    assert reply.status_code == 200
    assert post(server, "/detokenize", reply.json()).json()["content"] == content


def test_tokenize_and_detokenize_take_the_api_key(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """As llama-server: with --api-key they need the key as /v1 does."""
    with serving([*pair_args(tiny_pair), "--api-key", "s3cret"], tmp_path / "server.log") as server:
        for path in ("/tokenize", "/detokenize"):
            reply = httpx.post(f"{server.url}{path}", json={"content": "hi"}, timeout=60)
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
        keyed = {**JSON, "Authorization": "Bearer s3cret"}
        tokens = httpx.post(f"{server.url}/tokenize", json={"content": "hi"}, headers=keyed).json()["tokens"]
        back = httpx.post(f"{server.url}/detokenize", json={"tokens": tokens}, headers=keyed)
        assert back.json() == {"content": "hi"}
