"""llama-server's ``POST /tokenize`` and ``POST /detokenize`` on ``ead serve``: a text's token ids and
back, by the smallest model's tokenizer (every model of the run shares it: ``compat.py``)."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from ..prompt import nth_special_token
from ..runner import Runner
from ..sampling import unknown_token
from .schemas import ApiError, TokenId, parse

# Special tokens a /tokenize content may hold (read as such): llama.cpp's tokenizer takes time quadratic
# in their number (20,000 ~0.5 s, 100,000 ~12 s, the ~400,000 of a 4 MiB body minutes).
MAX_SPECIAL_TOKENS = 16384


class TokenizeRequest(BaseModel):
    """llama-server's fields: ``add_special`` a BOS where the vocabulary wants one, ``parse_special``
    special tokens' texts read as those tokens, ``with_pieces`` each id with its text."""

    model_config = ConfigDict(extra="ignore", strict=True)
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    tokens: list[TokenId]


def known_tokens(ids: list[int], n_vocab: int, param: str) -> list[int]:
    """Token ids each in the vocabulary (ids 0 to ``n_vocab`` - 1), or a 400 naming the first that is not
    and the request's field ``param`` that holds it."""
    message = unknown_token(ids, n_vocab, param)
    if message is not None:
        raise ApiError(400, message, code="invalid_value", param=param)
    return ids


def tokenize(runner: Runner, specials: re.Pattern[str] | None, data: bytes) -> Response:
    """``{"tokens": [id, ...]}``, or with ``with_pieces`` ``[{"id": id, "piece": text}, ...]``, a piece that
    is no UTF-8 on its own (part of a character) as its bytes' values, as llama-server sends them. Written
    as JSON text from each distinct token's entry: a 4 MiB content's million entries as Python objects
    had taken a gigabyte."""
    body = parse(TokenizeRequest, data)
    if body.parse_special:
        special = nth_special_token(body.content, specials, MAX_SPECIAL_TOKENS + 1)
        if special is not None:
            message = (
                f"content: it holds more than {MAX_SPECIAL_TOKENS} special tokens "
                f"(such as {special.group()!r}): "
                'send "parse_special": false to read their texts as text'
            )
            raise ApiError(400, message, code="invalid_value", param="content")
    ids = runner.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
    if not body.with_pieces:
        return Response(json.dumps({"tokens": ids}), media_type="application/json")
    entries: dict[int, str] = {}
    for token in ids:
        if token not in entries:
            entries[token] = json.dumps(
                {"id": token, "piece": _shown_piece(runner.token_piece(token))}, ensure_ascii=False
            )
    return Response(
        '{"tokens": [' + ", ".join(entries[token] for token in ids) + "]}", media_type="application/json"
    )


def _shown_piece(piece: bytes) -> str | list[int]:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def detokenize(runner: Runner, data: bytes) -> dict[str, Any]:
    """``{"content": text}``: the tokens' bytes joined (special tokens as their texts), a character left
    unfinished as U+FFFD."""
    body = parse(DetokenizeRequest, data)
    return {"content": text_of(runner, known_tokens(body.tokens, runner.n_vocab, "tokens"))}


def text_of(runner: Runner, ids: list[int]) -> str:
    """The text of token ids (special tokens as their texts), a character left unfinished as U+FFFD."""
    return b"".join(map(runner.token_piece, ids)).decode("utf-8", errors="replace")
