"""A prompt's token count bounded from its length, against llama.cpp's own count on tiny models."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tiny_models import write_tiny_model

from ead_cli.errors import EadError
from ead_cli.prompt import (
    TOKENIZED_OUTRIGHT_CHARS_PER_TOKEN,
    check_length_fits,
    encode_fitting,
    encode_rendered,
    fewest_tokens,
)
from ead_cli.runner import Runner, TokenReach

TEXTS = [
    "word " * 400,
    "z" * 1000,
    "hello wörld 日本 " * 100,
    " " * 1000,
    "\n\t \r\n" * 200,
    "<|im_start|>user\n" * 100,
    "<|im_end|>" * 300,
    "<|im_end|>" + " " * 1000 + "<|im_start|>\n\n\n" * 50,
]


def assert_a_lower_bound(runner: Runner) -> None:
    for text in TEXTS:
        assert fewest_tokens(runner, text) <= len(encode_rendered(runner, text)), text[:20]


def test_the_bound_never_exceeds_the_count(tiny_small: Path) -> None:
    runner = Runner(tiny_small, name="small", n_ctx=256, n_threads=1)
    assert runner.token_reach == TokenReach(len("<|endoftext|>"), strips_whitespace=False)
    assert_a_lower_bound(runner)
    longest = "<|endoftext|>" * 100  # the vocabulary's longest token, over and over: the bound is exact
    assert fewest_tokens(runner, longest) == len(encode_rendered(runner, longest)) == 100


def test_whitespace_a_special_token_swallows_is_not_counted(tmp_path: Path) -> None:
    """llama.cpp gives a Phi-3's control tokens RSTRIP (by the model's name): the spaces after one are
    dropped, so counting them would call a prompt that fits too long."""
    phi = write_tiny_model(tmp_path / "phi.gguf", vocab="phi-3")
    runner = Runner(phi, name="phi", n_ctx=256, n_threads=1)
    assert runner.token_reach is not None and runner.token_reach.strips_whitespace
    swallowed = "<|im_end|>" + " " * 10_000
    assert len(encode_rendered(runner, swallowed)) == 1
    assert fewest_tokens(runner, swallowed) == 1
    assert_a_lower_bound(runner)


def test_a_text_too_long_by_its_length_is_refused_before_tokenizing(tiny_small: Path) -> None:
    runner = Runner(tiny_small, name="small", n_ctx=256, n_threads=1)
    text = "z" * (TOKENIZED_OUTRIGHT_CHARS_PER_TOKEN * 256)
    message = (
        "the prompt is at least 631 tokens (8192 characters), too many for the context of 256 tokens: it "
        "takes at most 255, to leave room for the answer (raise --ctx or shorten the prompt)"
    )
    with pytest.raises(EadError, match=f"^{re.escape(message)}$"):
        check_length_fits(runner, text, 256)
    check_length_fits(runner, text[1:], 256)  # shorter: tokenized, which check_fits then refuses
    with pytest.raises(EadError, match=r"^the prompt is 8191 tokens, too many for the context of 256 tokens"):
        encode_fitting(runner, text[1:], 256)
    assert encode_fitting(runner, "z" * 255, 256) == encode_rendered(runner, "z" * 255)
