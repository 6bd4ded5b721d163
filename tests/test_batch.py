"""--batch-size/-b and --ubatch-size/-ub, as llama.cpp's tools take them: checked when given, made by
llama.cpp as it clamps them, and every path that reads a batch of rows at once (a speculative draft, a
lookup guess, a lookahead or --verify check) split to fit a small batch, the greedy text unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_cli import assert_one_line_error, ead, pair_args

from ead_cli.embedding import Embedder, normalized
from ead_cli.runner import Runner, made_batches

# Some 60 tokens: a prompt read in several batches of 8
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\n" * 2


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["-b", "-3"], "--batch-size must be at least 1, got -3"),
        (["--ubatch-size", "0"], "--ubatch-size must be at least 1, got 0"),
        (["-ub", "4294967296"], "--ubatch-size must be at most 2147483647 (llama.cpp's 32 bits)"),
    ],
)
def test_a_bad_batch_size_is_refused_before_any_model_is_looked_for(
    tmp_path: Path, args: list[str], fragment: str
) -> None:
    absent = (tmp_path / "small.gguf", tmp_path / "large.gguf")
    assert_one_line_error(ead("generate", *pair_args(absent), *args, "hi"), 2, fragment)


@pytest.mark.parametrize(
    "command",
    [
        ("chat",),
        ("serve", "--port", "0"),
        ("calibrate",),
        ("bench", "humaneval"),
        ("bench", "replay", "missing.jsonl"),
        ("bench", "speed"),
    ],
)
def test_every_command_that_loads_models_takes_the_batch_sizes(command: tuple[str, ...]) -> None:
    """The options reach every command that loads models, refused alike before a model is looked for."""
    models = ("--small", "missing.gguf", "--large", "missing.gguf")
    result = ead(*command, *models, "-b", "8", "-ub", "0")
    assert_one_line_error(result, 2, "--ubatch-size must be at least 1, got 0")


@pytest.mark.parametrize("command", [("generate",), ("calibrate",), ("eval", "--no-timing")])
def test_ead_depth_takes_the_batch_sizes_refused_before_its_model_is_looked_for(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    prompt = ["hi"] if command[0] == "generate" else []
    result = ead(
        "depth", command[0], str(tmp_path / "missing.gguf"), *prompt, *command[1:], "-b", "8", "-ub", "0"
    )
    assert_one_line_error(result, 2, "--ubatch-size must be at least 1, got 0")


def test_depth_generate_in_small_batches_exits_where_it_did(tiny_large: Path) -> None:
    """ead depth reads its prompt's last micro-batch with its probes on, so the first token's exit reads
    the prompt's last row; in micro-batches of 4 the first one's had been read (another first token)."""

    def answer(*batches: str) -> list[dict]:
        args = ("depth", "generate", str(tiny_large), "--raw", "--fixed-depth", "1", "--threads", "1")
        result = ead(*args, "--max-tokens", "24", "--format", "jsonl", *batches, PROMPT)
        assert result.returncode == 0, result.stderr
        return [json.loads(line) for line in result.stdout.splitlines()]

    default, small = answer(), answer("-b", "16", "-ub", "4")
    assert small[-1]["prompt_tokens"] % 16 > 4  # the last batch is read in more than one micro-batch
    assert [token["token"] for token in small[:-1]] == [token["token"] for token in default[:-1]]
    assert small[-1]["depths"] == default[-1]["depths"] == [1] * 24


def test_depth_calibrate_in_small_batches_saves_the_same_profile(tmp_path: Path, tiny_large: Path) -> None:
    """Teacher forcing reads 256-token windows: in batches of 64 (micro-batches of 32) every part's rows
    are kept, so the profile is the default batch's (it had been the last micro-batch's rows alone)."""

    def profile(name: str, *batches: str) -> dict:
        config = tmp_path / name / "calibration.json"
        args = ("depth", "calibrate", str(tiny_large), "--corpus", "prose", "--tokens", "256")
        result = ead(*args, "--probe-every", "1", "--threads", "1", *batches, env={"EAD_CONFIG": str(config)})
        assert result.returncode == 0, result.stderr
        (saved,) = (config.parent / "depth").iterdir()
        return json.loads(saved.read_text())

    default, small = profile("default"), profile("small", "-b", "64", "-ub", "32")
    assert small["tokens"] == default["tokens"] == 224  # one window, its first 32 tokens the prompt
    np.testing.assert_allclose(small["raw"], default["raw"], rtol=1e-3)


@pytest.mark.parametrize(
    "mode",
    [
        ["--mode", "large"],
        ["--mode", "spec", "--draft", "16"],  # a draft longer than a batch: cut to what one batch checks
        ["--mode", "spec", "--lookup", "2", "--lookup-draft", "64"],  # a guess longer than a batch
        ["--policy", "lookahead", "--tau", "0", "--draft", "12"],
        ["--mode", "ead", "--verify", "1", "--tau", "3"],  # held runs longer than a batch, checked in parts
    ],
)
def test_a_small_batch_changes_no_greedy_token(tiny_pair: tuple[Path, Path], mode: list[str]) -> None:
    """Batches of 8 tokens (micro-batches of 4) read the prompt in parts and every draft, guess or check
    in as many batches as it needs: the large model's greedy text as with the default batch."""
    common = ["generate", *pair_args(tiny_pair), *mode, "--max-tokens", "48", PROMPT]
    default = ead(*common)
    small = ead(*common, "-b", "8", "-ub", "4")
    assert default.returncode == 0, default.stderr
    assert small.returncode == 0, small.stderr
    assert small.stdout == default.stdout
    assert small.stdout.strip()


@pytest.mark.parametrize(
    ("asked", "made"),
    [
        ((8, 16), (8, 8)),  # a micro-batch larger than the batch: llama.cpp makes it the batch
        ((8, None), (8, 8)),
        ((None, 4), (512, 4)),
        ((2048, None), (256, 256)),  # no batch larger than the context (causal attention)
        ((1, 1), (1, 1)),
    ],
)
def test_a_runner_takes_the_batches_llama_cpp_makes(
    tiny_small: Path, asked: tuple[int | None, int | None], made: tuple[int, int]
) -> None:
    n_batch, n_ubatch = asked
    n_ctx = 256 if n_batch == 2048 else 1024
    with Runner(
        tiny_small, name="small", n_ctx=n_ctx, n_threads=1, n_batch=n_batch, n_ubatch=n_ubatch
    ) as runner:
        assert (runner.n_batch, runner.n_ubatch) == made
        # what ead bench compares a resume's batches by before any model loads
        assert made_batches(n_batch, n_ubatch, runner.n_ctx) == {"n_batch": made[0], "n_ubatch": made[1]}


def test_an_embedding_reads_in_the_runners_smaller_batches_the_same_vector(tiny_large: Path) -> None:
    """The embedding context takes the runner's batch (up to its 128 tokens): the same mean, up to the
    rounding of smaller matrix products (2.6e-4 apart with batches of 8)."""
    text = "hello wörld 日本, " * 10
    vectors = []
    for n_batch in (None, 8):
        with Runner(tiny_large, name="large", n_ctx=512, n_threads=1, n_batch=n_batch) as runner:
            embedder = Embedder(runner)
            try:
                assert embedder.n_batch == min(128, runner.n_batch)
                vectors.append(embedder.embed(embedder.tokens(text)))
            finally:
                embedder.close()
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-3)
    assert np.dot(normalized(vectors[0]), normalized(vectors[1])) > 0.99999


def test_a_draft_longer_than_the_batch_is_cut_to_what_one_batch_checks(tiny_pair: tuple[Path, Path]) -> None:
    """--batch-size 8 reaches the models: a draft of 16 is cut to 7 tokens and the next token's row, so
    the small model drafts as it does for --draft 7 at the default batch."""

    def small_model(*args: str) -> dict:
        common = [
            "generate",
            *pair_args(tiny_pair),
            "--mode",
            "spec",
            "--max-tokens",
            "48",
            "--format",
            "jsonl",
        ]
        result = ead(*common, *args, PROMPT)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1])["models"][0]

    cut = small_model("--draft", "16", "-b", "8")
    assert cut["decode_tokens"] == small_model("--draft", "7")["decode_tokens"]
    assert cut["decode_tokens"] < small_model("--draft", "16")["decode_tokens"]
