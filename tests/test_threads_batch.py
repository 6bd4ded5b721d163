"""-tb/--threads-batch, llama.cpp's threads for batches of several tokens (a prompt, a catch-up, a draft's
or a guess's check): made by llama.cpp as asked, --threads where not given, and the same greedy text."""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
from test_cli import ead, pair_args

from ead_cli.embedding import Embedder
from ead_cli.runner import Runner


def test_a_runner_reads_batches_with_its_batch_threads_and_decodes_with_its_threads(tiny_large: Path) -> None:
    with Runner(tiny_large, name="large", n_ctx=64, n_threads=1, n_threads_batch=2) as runner:
        assert (llama_cpp.llama_n_threads(runner.ctx), llama_cpp.llama_n_threads_batch(runner.ctx)) == (1, 2)
        assert runner.n_threads_batch == 2
        embedder = Embedder(runner)  # an embedding reads batches: the runner's batch threads
        try:
            assert llama_cpp.llama_n_threads_batch(embedder._ctx) == 2
        finally:
            embedder.close()
    with Runner(tiny_large, name="large", n_ctx=64, n_threads=2) as runner:  # llama.cpp's default: --threads
        assert (llama_cpp.llama_n_threads(runner.ctx), llama_cpp.llama_n_threads_batch(runner.ctx)) == (2, 2)


def test_generate_with_other_batch_threads_writes_the_same_greedy_answer(
    tiny_pair: tuple[Path, Path],
) -> None:
    """The pair's prompt and catch-ups read on two threads, its decodes on one: the same tokens, models
    and entropies as one thread for both."""
    args = [
        "generate",
        *pair_args(tiny_pair),
        "--mode",
        "ead",
        "--tau",
        "0.5",
        "-n",
        "24",
        "--format",
        "jsonl",
    ]
    answers = []
    for threads in (["-t", "1"], ["-t", "1", "-tb", "2"], ["--threads", "1", "--threads-batch", "2"]):
        result = ead(*args, *threads, "def add(a, b):")
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        records = [json.loads(line) for line in result.stdout.decode().splitlines()]
        answers.append([(r["token"], r["model"], r["entropy"]) for r in records if r["type"] == "token"])
    assert answers[0] == answers[1] == answers[2]
    assert {model for _, model, _ in answers[0]} == {"small", "large"}  # catch-ups were read
