"""llama-server's ``POST /tokenize`` and ``POST /detokenize`` on ``ead serve``: a text's token ids and
back, by the smallest model's tokenizer (every model of the run shares it: ``compat.py``)."""

from __future__ import annotations

import json
import re
from typing import Any

import llama_cpp
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from ..prompt import nth_special_token
from ..runner import Runner
from ..sampling import unknown_token
from .schemas import ApiError, TokenId, either, parse

# Special tokens a /tokenize content may hold (read as such): llama.cpp's tokenizer takes time quadratic
# in their number (20,000 ~0.5 s, 100,000 ~12 s, the ~400,000 of a 4 MiB body minutes).
MAX_SPECIAL_TOKENS = 16384


class TokenizeRequest(BaseModel):
    """llama-server's fields: ``add_special`` a BOS where the vocabulary wants one, ``parse_special``
    special tokens' texts read as those tokens, ``with_pieces`` each id with its text; or vLLM's, which
    lm-eval's remote tokenizer sends: ``prompt`` for ``content``, ``add_special_tokens`` (true unless
    given) for ``add_special``."""

    model_config = ConfigDict(extra="ignore", strict=True)
    content: str | None = None
    prompt: str | None = None
    add_special: bool | None = None
    add_special_tokens: bool | None = None
    parse_special: bool = True
    with_pieces: bool = False

    def text(self) -> str:
        text = either("content", self.content, "prompt", self.prompt)
        if text is None:
            raise ApiError(400, "content: Field required (or vLLM's prompt)", param="content")
        return text

    def adds_special(self) -> bool:
        given = either("add_special", self.add_special, "add_special_tokens", self.add_special_tokens)
        return given if given is not None else self.vllm  # each server's default

    @property
    def vllm(self) -> bool:
        """Whether the request is vLLM's (its answer then counts the tokens, as vLLM's does)."""
        return self.content is None


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
    content, field = body.text(), "prompt" if body.vllm else "content"
    if body.parse_special:
        special = nth_special_token(content, specials, MAX_SPECIAL_TOKENS + 1)
        if special is not None:
            message = (
                f"{field}: it holds more than {MAX_SPECIAL_TOKENS} special tokens "
                f"(such as {special.group()!r}): "
                'send "parse_special": false to read their texts as text'
            )
            raise ApiError(400, message, code="invalid_value", param=field)
    ids = runner.tokenize(content, add_special=body.adds_special(), parse_special=body.parse_special)
    if not body.with_pieces:
        counted = {"count": len(ids), "max_model_len": runner.n_ctx} if body.vllm else {}
        return Response(json.dumps({**counted, "tokens": ids}), media_type="application/json")
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
    unfinished as U+FFFD; the text under vLLM's name too (``prompt``), which its clients read."""
    body = parse(DetokenizeRequest, data)
    text = text_of(runner, known_tokens(body.tokens, runner.n_vocab, "tokens"))
    return {"content": text, "prompt": text}


def tokenizer_info(runner: Runner) -> dict[str, Any]:
    """vLLM's ``GET /tokenizer_info``, which lm-eval reads (with ``/tokenize``) to tokenize through the
    server: the special tokens' texts (null where the vocabulary has none), the chat template, the
    context."""

    def text(token: int) -> str | None:
        return runner.token_piece(token).decode("utf-8", errors="replace") if token >= 0 else None

    vocab = runner.vocab
    return {
        "tokenizer_class": "llama.cpp",
        "bos_token": text(llama_cpp.llama_vocab_bos(vocab)),
        "eos_token": text(llama_cpp.llama_vocab_eos(vocab)),
        "pad_token": text(llama_cpp.llama_vocab_pad(vocab)),
        "add_bos_token": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "chat_template": runner.chat_template,
        "model_max_length": runner.n_ctx,
    }


def text_of(runner: Runner, ids: list[int]) -> str:
    """The text of token ids (special tokens as their texts), a character left unfinished as U+FFFD."""
    return b"".join(map(runner.token_piece, ids)).decode("utf-8", errors="replace")
