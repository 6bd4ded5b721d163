"""The fill-in-the-middle prompt (``prompt.encode_infill``) on tiny models with FIM tokens: llama-server's
layout token by token (the repository-level one where the vocabulary has a file separator, snippets
where it has none), its trimming to the batch and the context, the texts read without special tokens,
and a model without FIM tokens refused; ``ead generate --suffix``. llama-server's own prompt is compared
in test_serve_fim.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from test_cli import assert_one_line_error, ead, large_args, pair_args
from test_prompt import CountingRunner
from tiny_models import write_tiny_model

import ead_cli
from ead_cli.errors import EadError
from ead_cli.prompt import encode_infill, head_tokens, line_end_after, line_start_before, tail_tokens
from ead_cli.runner import Runner
from ead_cli.sampling import Sampler, SamplingParams

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("fim") / "fim.gguf", vocab="fim")


@pytest.fixture(scope="module")
def fim(fim_model: Path) -> Iterator[Runner]:
    """A context larger than the batch (512), which leaves room for extra files."""
    with Runner(fim_model, name="small", n_ctx=1024, n_threads=1) as runner:
        yield runner


def plain(runner: Runner, text: str) -> list[int]:
    """A text's tokens with no special token read in it."""
    return runner.tokenize(text, add_special=False, parse_special=False)


def special(runner: Runner, text: str) -> int:
    (token,) = runner.tokenize(text, add_special=False, parse_special=True)
    return token


def test_the_repository_level_layout_of_llama_server(fim: Runner) -> None:
    """Extra files after the repository's name, each after a file separator and its name; then the
    current file's, the prefix with the prompt after it, the suffix, and the middle token to write at."""
    pre, suf, mid, rep, sep = (
        special(fim, f"<|{name}|>")
        for name in ("fim_prefix", "fim_suffix", "fim_middle", "repo_name", "file_sep")
    )
    extra = [("util.py", "X = 1\n"), ("", "Y = 2\n")]
    prompt = encode_infill(fim, PREFIX, SUFFIX, extra=extra, middle="ret", answer_tokens=16, runners=[fim])
    assert prompt == [
        *(rep, *plain(fim, "myproject\n")),
        *(sep, *plain(fim, "util.py\n"), *plain(fim, "X = 1\n")),
        *(sep, *plain(fim, "\n"), *plain(fim, "Y = 2\n")),
        *(sep, *plain(fim, "filename\n")),
        *(pre, *plain(fim, PREFIX), *plain(fim, "ret")),
        *(suf, *plain(fim, SUFFIX)),
        mid,
    ]


def test_special_tokens_in_the_code_are_text_and_in_the_prompt_tokens(fim: Runner) -> None:
    """The code around the cursor is read as text (a file that holds ``<|im_end|>`` ends nothing), as
    llama-server reads it; the prompt after the prefix is read as its prompts are, specials and all."""
    prompt = encode_infill(fim, "<|im_end|>", "", middle="<|im_end|>", answer_tokens=16, runners=[fim])
    pre, im_end = special(fim, "<|fim_prefix|>"), special(fim, "<|im_end|>")
    start = prompt.index(pre) + 1
    assert prompt[start : start + len(plain(fim, "<|im_end|>")) + 1] == [*plain(fim, "<|im_end|>"), im_end]
    assert len(plain(fim, "<|im_end|>")) > 1


def test_the_code_is_trimmed_to_the_batch_and_the_extra_files_to_the_context(fim_model: Path) -> None:
    """As llama-server: the prefix's last three quarters of a batch, the suffix's first quarter less the
    prompt and two, and the extra files' last tokens that leave the context a batch and twice the answer."""
    with Runner(fim_model, name="small", n_ctx=256, n_threads=1, n_batch=32) as runner:
        code = "".join(f"x{i} = {i}\n" for i in range(100))
        extra = [("a.py", code)]
        prompt = encode_infill(
            runner, code, code, extra=extra, middle="y", answer_tokens=20, runners=[runner]
        )
        pre, suf, mid = (special(runner, f"<|fim_{name}|>") for name in ("prefix", "suffix", "middle"))
        sep = special(runner, "<|file_sep|>")
        extras = [
            special(runner, "<|repo_name|>"),
            *plain(runner, "myproject\n"),
            *(sep, *plain(runner, "a.py\n"), *plain(runner, code)),
            *(sep, *plain(runner, "filename\n")),
        ]
        middle = plain(runner, "y")
        suffix_take = 32 // 4 - 2 - len(middle)
        assert prompt == [
            *extras[-(256 - 32 - 2 * 20) :],
            *(pre, *plain(runner, code)[-24:], *middle),
            *(suf, *plain(runner, code)[:suffix_take]),
            mid,
        ]
        no_room = encode_infill(runner, "", "", extra=extra, answer_tokens=112, runners=[runner])
        assert no_room == [pre, suf, mid]  # 256 - 32 - 2 * 112 leaves no extra token


def test_extra_files_past_the_room_are_read_only_as_far_as_it_reaches(fim_model: Path) -> None:
    """The extra files' tokens are those of each file read whole, their last ones that fit taken (as
    llama-server's n_extra_take takes them), but only what is kept is tokenized: a long file's end, and
    no file before it (where everything fits, each is read whole: the layout's test above)."""
    code = long_text(1000)
    extra = [("old.py", "a = 1\n"), ("big.py", code), ("util.py", "X = 1\n")]
    with CountingRunner(fim_model, name="small", n_ctx=1024, n_threads=1, n_batch=32) as runner:
        sep = special(runner, "<|file_sep|>")
        extras = [
            special(runner, "<|repo_name|>"),
            *plain(runner, "myproject\n"),
            *(sep, *plain(runner, "old.py\n"), *plain(runner, "a = 1\n")),
            *(sep, *plain(runner, "big.py\n"), *plain(runner, code)),
            *(sep, *plain(runner, "util.py\n"), *plain(runner, "X = 1\n")),
            *(sep, *plain(runner, "filename\n")),
        ]
        pre, suf, mid = (special(runner, f"<|fim_{name}|>") for name in ("prefix", "suffix", "middle"))
        runner.tokenized.clear()
        room = 1024 - 32 - 2 * 20
        prompt = encode_infill(runner, "", "", extra=extra, answer_tokens=20, runners=[runner])
        assert len(extras) > room
        assert prompt == [*extras[-room:], pre, suf, mid]
        assert code not in runner.tokenized
        assert not {"a = 1\n", "old.py\n"} & set(runner.tokenized)


def test_a_cut_falls_at_a_lines_start_or_end_far_enough_from_the_texts_edge() -> None:
    """Where llama.cpp's pre-tokenizers always split: after a newline, before a printable ASCII character
    (a blank that starts an indented line is no such place), or after an ASCII letter or digit, before
    a newline; none near enough, the whole text."""
    text = "a\nb\n  c\nd"
    assert [line_start_before(text, chars) for chars in (1, 3, 8)] == [8, 2, 0]
    text = "ab\n\ncd\n  x\n"
    assert [line_end_after(text, chars) for chars in (1, 3, 7, 11)] == [2, 6, 10, len(text)]


# A long text of lines with runs of letters and blanks the tokenizer reads as one piece, crossing every
# place a cut by characters alone could fall: the whole text's tokens there are no cut text's.
LINES = [
    *(f"\tthe{'e' * i} = other({'x' * (i % 7)}, '{i}') \\\r\n" for i in range(40)),
    *(f"{' ' * (i % 9)}{'t' * i}hin {i}{i}{i}\n" for i in range(40)),
    *("class Intern:\n", "    return other\n"),
]


def long_text(lines: int) -> str:
    return "".join(LINES[i % len(LINES)] for i in range(lines))


@pytest.mark.parametrize("vocab", ["fim", "long"])
def test_a_long_texts_kept_tokens_are_its_whole_tokenizations(vocab: str, tmp_path: Path) -> None:
    """The prefix's last tokens and the suffix's first, read from the text's end or start alone where the
    vocabulary cuts at lines, are those of the whole text, which llama-server tokenizes. ("long" has a
    user-defined token of 64 '=', which llama.cpp finds in a text before it splits it: where a cut fell
    inside the run of them that ends the text, the run's last tokens were others.)"""
    model = write_tiny_model(tmp_path / "model.gguf", vocab=vocab)
    text = long_text(4000) + "=" * 1000
    with Runner(model, name="small", n_ctx=256, n_threads=1) as runner:
        whole = plain(runner, text)
        longest = runner.token_reach.longest
        assert runner.cuts_at_lines
        for keep in (1, 5, 100, 384, 1536):
            assert line_start_before(text, keep * longest) > 0  # only the end is read
            assert line_end_after(text, keep * longest) < len(text)
            assert tail_tokens(runner, text, keep) == (whole[-keep:], True)
            assert head_tokens(runner, text, keep) == (whole[:keep], True)
        assert tail_tokens(runner, text, 0) == head_tokens(runner, text, 0) == ([], True)
        assert tail_tokens(runner, "", 0) == ([], False)
        short = text[:200]  # read whole: cut only where it has more tokens than kept
        assert tail_tokens(runner, short, 10_000) == (plain(runner, short), False)
        assert head_tokens(runner, short, 1) == (plain(runner, short)[:1], True)


@pytest.mark.parametrize(
    ("vocab", "pre"), [("spm", "default"), ("base", "gemma4"), ("line-token", "default")]
)
def test_other_tokenizers_read_the_whole_text(vocab: str, pre: str, tmp_path: Path) -> None:
    """A SentencePiece vocabulary (no pre-tokenizer: a merge may cross a line), a pre-tokenizer not
    known to split at lines, and one whose user-defined token holds a newline (found in the text before
    it is split) cut nothing: their kept tokens are read from the whole text."""
    model = write_tiny_model(tmp_path / "model.gguf", vocab=vocab, tokenizer_pre=pre)
    with Runner(model, name="small", n_ctx=256, n_threads=1) as runner:
        assert not runner.cuts_at_lines
        text = long_text(300)
        assert tail_tokens(runner, text, 50) == (plain(runner, text)[-50:], True)


@pytest.mark.real
def test_the_demo_coders_kept_tokens_are_its_whole_tokenizations(real_pair: tuple[Path, Path]) -> None:
    """Qwen2's pre-tokenizer on real code (this project's, with lines ended by CRLF and characters
    beyond ASCII mixed in), ended by a line of one letter, a piece whose last tokens a cut inside it
    changes: the kept ends are those of the whole text."""
    code = "".join(path.read_text() for path in sorted(Path(ead_cli.__file__).parent.rglob("*.py")))
    text = code[:200_000] + code[200_000:400_000].replace("\n", "\r\n") + "é ünïcode\n".join(LINES) * 50
    text += "a" * 50_003
    with Runner(real_pair[0], name="small", n_ctx=512, n_threads=1) as runner:
        whole = plain(runner, text)
        assert runner.cuts_at_lines
        for keep in (7, 384, 1536):
            longest = runner.token_reach.longest
            assert line_start_before(text, keep * longest) > 0 and line_end_after(text, keep * longest) < len(
                text
            )
            assert tail_tokens(runner, text, keep) == (whole[-keep:], True)
            assert head_tokens(runner, text, keep) == (whole[:keep], True)


def test_without_a_file_separator_extra_files_are_snippets(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "bare.gguf", vocab="fim-bare")
    with Runner(model, name="small", n_ctx=1024, n_threads=1) as runner:
        prompt = encode_infill(runner, "a", "b", extra=[("x.py", "X")], answer_tokens=8, runners=[runner])
        pre, suf, mid = (special(runner, f"<|fim_{name}|>") for name in ("prefix", "suffix", "middle"))
        snippet = plain(runner, "\n\n--- snippet ---\n\n")
        assert prompt == [
            *snippet,
            *plain(runner, "X"),
            pre,
            *plain(runner, "a"),
            suf,
            *plain(runner, "b"),
            mid,
        ]


def test_fim_pad_and_the_separators_end_a_generation(fim: Runner) -> None:
    ends = {
        text: fim.is_end_of_generation(special(fim, text))
        for text in ("<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|fim_middle|>")
    }
    assert ends == {"<|fim_pad|>": True, "<|repo_name|>": True, "<|file_sep|>": True, "<|fim_middle|>": False}


def test_a_model_without_fim_tokens_is_named(tiny_small: Path) -> None:
    with (
        Runner(tiny_small, name="small", n_ctx=512, n_threads=1) as runner,
        pytest.raises(EadError) as refused,
    ):
        encode_infill(runner, "a", "b", answer_tokens=8, runners=[runner])
    assert str(refused.value) == (
        "small.gguf has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>): "
        "it cannot complete code at a cursor"
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"prefix": "a\x00"}, "the prefix contains a NUL byte"),
        ({"suffix": "\udcff"}, "the suffix is not valid UTF-8 (byte 0)"),
        ({"extra": [("x.py", "\x00")]}, "the extra file 'x.py' contains a NUL byte"),
        ({"middle": "x" * 1100}, "the prompt is 1125 tokens, too many for the context of 1024 tokens"),
    ],
)
def test_bad_text_is_one_line(fim: Runner, given: dict, message: str) -> None:
    texts = {"prefix": "a", "suffix": "b"} | given
    with pytest.raises(EadError) as refused:
        encode_infill(fim, texts.pop("prefix"), texts.pop("suffix"), answer_tokens=8, runners=[fim], **texts)
    assert str(refused.value).startswith(message)


@pytest.fixture(scope="module")
def fim_pair(fim_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return fim_model, write_tiny_model(tmp_path_factory.mktemp("fim") / "large.gguf", seed=1, vocab="fim")


def test_generate_with_a_suffix_writes_the_middle(fim_pair: tuple[Path, Path]) -> None:
    """``ead generate --suffix``: the answer to the FIM prompt, the same as to its text given raw."""
    args = [*pair_args(fim_pair), "--max-tokens", "8", "--temp", "0"]
    middle = ead("generate", *args, "--suffix", SUFFIX, PREFIX)
    opening = "<|repo_name|>myproject\n<|file_sep|>filename\n"
    raw = f"{opening}<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    assert middle.returncode == 0, middle.stderr.decode()
    assert middle.stdout == ead("generate", *args, "--raw", raw).stdout
    assert len(middle.stdout.decode()) > 1


def test_a_suffix_typed_with_escapes_is_the_code_they_mean(fim_pair: tuple[Path, Path]) -> None:
    """--suffix is processed as the prompt is (llama.cpp's -e escapes --in-suffix, llama-infill's code
    after the cursor): a suffix typed with \\n holds newlines; --no-escape sends it as typed."""
    args = ["generate", *pair_args(fim_pair), "--max-tokens", "8", "--temp", "0", "--format", "jsonl"]
    typed = SUFFIX.replace("\n", "\\n")
    meant = ead(*args, "--suffix", SUFFIX, PREFIX)
    escaped = ead(*args, "--suffix", typed, PREFIX)
    literal = ead(*args, "--no-escape", "--suffix", typed, PREFIX)
    summaries = [json.loads(result.stdout.decode().splitlines()[-1]) for result in (meant, escaped, literal)]
    assert escaped.stdout.splitlines()[:-1] == meant.stdout.splitlines()[:-1]
    assert summaries[1]["prompt_tokens"] == summaries[0]["prompt_tokens"] < summaries[2]["prompt_tokens"]


def test_a_prefix_of_5_mb_answers_as_its_kept_end_does(fim_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Past the 4 MiB a request's body holds, from a file: the middle written after 5 MB of code is the one
    written after its last lines alone, which hold the tokens kept (the last 384)."""
    end = long_text(200)
    prefix = tmp_path / "prefix.py"
    prefix.write_text("x = 1\n" * 850_000 + end)
    args = [*pair_args(fim_pair), "--max-tokens", "8", "--temp", "0", "--suffix", SUFFIX]
    middle = ead("generate", *args, "-f", str(prefix))
    assert middle.returncode == 0, middle.stderr.decode()
    assert middle.stdout == ead("generate", *args, end).stdout and middle.stdout


def test_generate_says_where_it_cuts_the_code_to_the_batch(fim_pair: tuple[Path, Path]) -> None:
    """The code before the cursor is cut to three quarters of a batch, after it to a quarter less two, as
    llama-server's /infill cuts them: a note says so, where the code had been cut unsaid (with the
    default batch of 512, past 384 tokens before the cursor and 126 after it)."""
    code = "".join(f"x{i} = {i}\n" for i in range(100))
    args = [*large_args(fim_pair), "--max-tokens", "4", "--batch-size", "32"]
    cut = ead("generate", *args, "--suffix", code, code)
    assert cut.returncode == 0, cut.stderr.decode()
    assert cut.stderr.decode().splitlines() == [
        "note: the code before the cursor is cut to its last 24 tokens, and the code after it to its first "
        "6 tokens, as llama-server's /infill does (--batch-size 32: a larger one keeps more)"
    ]
    after = ead("generate", *args, "--suffix", code, PREFIX)
    assert after.stderr.decode().splitlines() == [
        "note: the code after the cursor is cut to its first 6 tokens, as llama-server's /infill does "
        "(--batch-size 32: a larger one keeps more)"
    ]
    whole = ead("generate", *args[:-2], "--suffix", SUFFIX, PREFIX)  # the default batch: 512
    assert whole.returncode == 0 and whole.stderr == b""


def test_generate_with_a_suffix_refuses_what_has_no_place(tiny_pair: tuple[Path, Path]) -> None:
    system = ead("generate", *pair_args(tiny_pair), "--suffix", ")", "--system", "be brief", "def f(")
    assert assert_one_line_error(system, 2) == (
        "error: --system needs the chat template, which --suffix leaves out (fill-in-the-middle)"
    )
    no_fim = ead("generate", *pair_args(tiny_pair), "--suffix", ")", "def f(")
    assert assert_one_line_error(no_fim, 2) == (
        "error: large.gguf has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
        "<|fim_middle|>): it cannot complete code at a cursor"
    )


def llama_server_infill_chain(seed: int, vocab: llama_cpp.llama_vocab_p) -> llama_cpp.llama_sampler_p:
    """llama-server's chain for llama.vim's ``samplers: ["top_k", "top_p", "infill"]`` (top_k 40, top_p
    0.9, min_keep 0): those three, then the draw (common_sampler_init)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for sampler in (
        llama_cpp.llama_sampler_init_top_k(40),
        llama_cpp.llama_sampler_init_top_p(0.9, 0),
        llama_cpp.llama_sampler_init_infill(vocab),
        llama_cpp.llama_sampler_init_dist(seed),
    ):
        llama_cpp.llama_sampler_chain_add(chain, sampler)
    return chain


def test_the_infill_sampler_draws_as_llama_cpps_chain(fim_model: Path) -> None:
    """ead's chain with the infill sampler (min-p and temperature off, as llama-server leaves samplers
    unnamed) draws llama.cpp's tokens, draw for draw from several rows; without it, other tokens."""
    model = llama_cpp.Llama(model_path=str(fim_model), n_ctx=512, n_threads=1, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    params = SamplingParams(temp=1.0, top_k=40, top_p=0.9, min_p=0.0, infill=True)
    differs = False
    texts = ["def add(a, b):\n    ", "x = [1, 2", "print(", "<|fim_prefix|>a<|fim_suffix|>"]
    for seed, text in enumerate(texts):
        model.reset()
        model.eval(model.tokenize(text.encode(), add_bos=False, special=True))
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(model.ctx, -1), (n_vocab,))
        ours = Sampler(replace(params, seed=seed), vocab=vocab)
        plain = Sampler(replace(params, seed=seed, infill=False))
        theirs = llama_server_infill_chain(seed, vocab)
        drawn = [ours.sample(model.ctx, row) for _ in range(40)]
        assert drawn == [llama_cpp.llama_sampler_sample(theirs, model.ctx, -1) for _ in range(40)], text
        differs |= drawn != [plain.sample(model.ctx, row) for _ in range(40)]
        for sampler in (ours, plain):
            sampler.close()
        llama_cpp.llama_sampler_free(theirs)
    assert differs
    model.close()
