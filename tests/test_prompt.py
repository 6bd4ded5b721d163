"""A prompt's token count bounded from its length, against llama.cpp's own count on tiny models."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from tiny_models import CHATML, LONG_TOKEN, write_tiny_model

from ead_cli.cli.groups import prompt_on_stdin, read_prompt
from ead_cli.errors import EadError
from ead_cli.prompt import (
    PAIR_BLOCK,
    TOKENIZED_OUTRIGHT_CHARS_PER_TOKEN,
    check_length_fits,
    encode_fitting,
    encode_rendered,
    fewest_tokens,
)
from ead_cli.runner import Runner, TokenReach
from ead_cli.text import process_escapes

TEXTS = [
    "word " * 400,
    "z" * 1000,
    "hello wörld 日本 " * 100,
    " " * 1000,
    "\n\t \r\n" * 200,
    "<|im_start|>user\n" * 100,
    "<|im_end|>" * 300,
    "<|im_end|>" + " " * 1000 + "<|im_start|>\n\n\n" * 50,
    "▁" * 1000,
    "a ▁▁ b" * 100,
]


def assert_a_lower_bound(runner: Runner) -> None:
    for text in TEXTS:
        count = len(encode_rendered(runner, text))
        assert fewest_tokens(runner, text, len(text)) <= count, text[:20]


def test_the_bound_never_exceeds_the_count(tiny_small: Path) -> None:
    runner = Runner(tiny_small, name="small", n_ctx=256, n_threads=1)
    assert runner.token_reach == TokenReach(len("<|endoftext|>"), strips_whitespace=False)
    assert_a_lower_bound(runner)
    longest = "<|endoftext|>" * 100  # the vocabulary's longest token, over and over: the bound is exact
    assert fewest_tokens(runner, longest, 1000) == len(encode_rendered(runner, longest)) == 100


def test_whitespace_a_special_token_swallows_is_not_counted(tmp_path: Path) -> None:
    """llama.cpp gives a Phi-3's control tokens RSTRIP (by the model's name): the spaces after one are
    dropped, so counting them would call a prompt that fits too long."""
    phi = write_tiny_model(tmp_path / "phi.gguf", vocab="phi-3")
    runner = Runner(phi, name="phi", n_ctx=256, n_threads=1)
    assert runner.token_reach is not None and runner.token_reach.strips_whitespace
    swallowed = "<|im_end|>" + " " * 10_000
    assert len(encode_rendered(runner, swallowed)) == 1
    assert fewest_tokens(runner, swallowed, 256) == 1
    assert_a_lower_bound(runner)


def test_pairs_of_bytes_bound_the_count_across_blocks(tmp_path: Path) -> None:
    """The bound from pairs of bytes, read PAIR_BLOCK bytes at a time, never exceeds llama.cpp's count,
    and is the count where each byte is a token."""
    long = write_tiny_model(tmp_path / "long.gguf", vocab="long")
    runner = Runner(long, name="long", n_ctx=256, n_threads=1)
    assert_a_lower_bound(runner)
    zs = "z" * (2 * PAIR_BLOCK + 5)
    assert fewest_tokens(runner, zs, len(zs)) == len(encode_rendered(runner, zs)) == len(zs)
    mixed = ("z" * 1000 + LONG_TOKEN * 3 + "<|im_end|> the " * 10) * 200
    assert len(mixed) > 3 * PAIR_BLOCK
    fewest = fewest_tokens(runner, mixed, len(mixed))
    assert len(mixed) // len(LONG_TOKEN) < fewest <= len(encode_rendered(runner, mixed))


def test_a_tokenizer_that_reads_a_marker_as_a_space_is_bounded_by_its_length(tmp_path: Path) -> None:
    """Gemma 4's BPE, as SPM, reads "▁" as a space: three bytes that its token spells as one (and the
    tiny vocabulary, which has no "▁", as none), which bytes taken in pairs would count as three tokens.
    Its prompts are bounded by their length alone."""
    gemma = write_tiny_model(tmp_path / "gemma.gguf", tokenizer_pre="gemma4")
    runner = Runner(gemma, name="gemma", n_ctx=256, n_threads=1)
    text = "z▁" * 500
    assert fewest_tokens(runner, text, len(text)) <= len(encode_rendered(runner, text)) < len(text.encode())
    assert runner.token_reach is not None and runner.token_reach.by_pair is None


def test_a_text_too_long_by_its_length_is_refused_before_tokenizing(tiny_small: Path) -> None:
    runner = Runner(tiny_small, name="small", n_ctx=256, n_threads=1)
    text = "z" * (TOKENIZED_OUTRIGHT_CHARS_PER_TOKEN * 256)
    message = (
        "the prompt is at least 631 tokens (8192 characters), too many for the context of 256 tokens: it "
        "takes at most 255, to leave room for the answer (raise --ctx or shorten the prompt)"
    )
    with pytest.raises(EadError, match=f"^{re.escape(message)}$"):
        check_length_fits(runner, text, [runner])
    check_length_fits(runner, text[1:], [runner])  # shorter: tokenized, which check_fits then refuses
    with pytest.raises(EadError, match=r"^the prompt is 8191 tokens, too many for the context of 256 tokens"):
        encode_fitting(runner, text[1:], [runner])
    assert encode_fitting(runner, "z" * 255, [runner]) == encode_rendered(runner, "z" * 255)


class CountingRunner(Runner):
    """A runner that keeps the texts its tokenizer is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokenized: list[str] = []

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        self.tokenized.append(text)
        return super().tokenize(text, add_special=add_special, parse_special=parse_special)


def test_a_long_piece_does_not_let_a_text_too_long_through_to_the_tokenizer(tmp_path: Path) -> None:
    """A piece 64 bytes long divides a text's length by 64: up to 64 characters a context token passed
    that bound and were tokenized whole (Qwen2's longest piece is 128 bytes: a 4 MB prompt for a 32k
    context). The longest piece that starts with each pair of bytes bounds it tighter: none starts
    with "zz", so every z is a token, and the prompt is refused untokenized."""
    long = write_tiny_model(tmp_path / "long.gguf", vocab="long")
    runner = CountingRunner(long, name="long", n_ctx=256, n_threads=1)
    assert runner.token_reach is not None and runner.token_reach.longest == len(LONG_TOKEN)
    text = "z" * (40 * 256)
    with pytest.raises(EadError, match=r"^the prompt is at least 256 tokens \(10240 characters\), too many"):
        encode_fitting(runner, text, [runner])
    assert text not in runner.tokenized
    fits = LONG_TOKEN * 254  # long pieces: as long by its length, but tokenized, and fitting
    assert len(encode_fitting(runner, fits, [runner])) == 254 and runner.tokenized[-1] == fits


def test_the_chat_template_is_read_once_when_the_model_loads(tmp_path: Path, tiny_small: Path) -> None:
    """``Runner.chat_template``, the GGUF's template (None without one), read at load: every prompt, and
    every request's split of its answer, takes it from there, with no call into llama.cpp (it is there
    after the model is freed)."""
    bare = write_tiny_model(tmp_path / "bare.gguf", chat_template=None)
    with (
        Runner(tiny_small, name="small", n_ctx=64) as templated,
        Runner(bare, name="bare", n_ctx=64) as untemplated,
    ):
        pass
    assert templated.chat_template == CHATML and untemplated.chat_template is None


# llama.cpp's string_process_escapes (common/common.cpp), sequence by sequence: what llama-cli's -e makes of
# a prompt and a reverse prompt given on its command line
ESCAPES = [
    ("a\\nb", "a\nb"),
    ("\\r\\t", "\r\t"),
    ("\\'\\\"", "'\""),
    ("\\\\n", "\\n"),  # an escaped backslash, then a plain n
    ("\\x41\\x7a", "Az"),
    ("\\xc3\\xa9", "é"),  # bytes, which make a character together
    ("\\x4", "\\x4"),  # \x needs two characters after it
    ("\\x4g", "\\x4g"),  # and strtol to read both as hex
    ("\\x 9\\x+9\\x-1", "\t\t\udcff"),  # strtol skips a blank and reads a sign: -1, the byte 0xff
    ("\\q\\0\\e", "\\q\\0\\e"),  # an escape llama.cpp does not know stays as it is, backslash and all
    ("a\\", "a\\"),  # so does a backslash that ends the text
    ("\\\\\\", "\\\\"),
    ("plain é 日本", "plain é 日本"),
]


@pytest.mark.parametrize(("given", "processed"), ESCAPES)
def test_escapes_are_processed_as_llama_cpp_does(given: str, processed: str) -> None:
    """A byte that is no UTF-8 is kept as Python keeps an argument's (surrogateescape), for check_text to
    refuse by its place."""
    assert process_escapes(given) == processed


@pytest.mark.parametrize(
    ("prompt", "option", "file"),
    [
        (None, None, None),
        ("-", None, None),
        (None, "-", None),
        (None, None, "-"),
        ("typed", None, None),
        (None, "typed", None),
        (None, None, "FILE"),
    ],
)
def test_the_prompt_reads_stdin_exactly_where_prompt_on_stdin_says(
    prompt: str | None, option: str | None, file: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prompt_on_stdin`` keeps a grammar file '-' off the prompt's stdin: for every way of giving the
    prompt it says stdin exactly where ``read_prompt`` reads it (one rule decides both)."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"from stdin")
    os.close(write_end)
    named = tmp_path / "prompt.txt"
    named.write_text("from a file")
    path = None if file is None else named if file == "FILE" else Path(file)
    with open(read_end, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        text = read_prompt(prompt, option, path, escape=True)
    assert (text == "from stdin") == prompt_on_stdin(prompt, option, path)
    assert text in ("from stdin", "typed", "from a file")
