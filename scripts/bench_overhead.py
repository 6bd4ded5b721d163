#!/usr/bin/env python3
"""What the EAD loop costs over a bare llama-cpp-python decode loop, on one model, in one process.

Both loops decode the same prompt greedily for the same number of tokens on the same llama.cpp
context (same model, threads, batch and attention settings), so the ratio is the cost of the loop
alone: entropy, policy, sampling, detokenising and events. The bare loop is the least Python a
greedy decode can have: llama_decode on a one-token batch, argmax over the logits view. Runs
alternate (bare, ead, bare, ead, ...) so machine noise hits both alike. Prints one JSON object;
``ratio`` is the median EAD loop throughput over the median bare loop throughput (goal: >= 0.97).

    .venv/bin/python scripts/bench_overhead.py [--model qc0.5b] [--tokens 128] [--runs 5] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from time import perf_counter

import llama_cpp
import numpy as np

from ead_cli import registry
from ead_cli.decoder import Decoder
from ead_cli.options import default_threads
from ead_cli.policies import Fixed
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


def bare_loop(runner: Runner, prompt: list[int], count: int) -> float:
    """Tokens per second of decode: llama_decode one token at a time, argmax over the logits view."""
    runner.truncate(0)
    ctx, n_vocab = runner.ctx, runner.n_vocab
    prompt_array = (llama_cpp.llama_token * len(prompt))(*prompt)
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(prompt_array, len(prompt))) != 0:
        raise SystemExit("llama_decode failed on the prompt")
    token = (llama_cpp.llama_token * 1)()
    began = perf_counter()
    for _ in range(count):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        token[0] = int(np.argmax(logits))
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(token, 1)) != 0:
            raise SystemExit("llama_decode failed")
    elapsed = perf_counter() - began
    runner.truncate(0)  # the runner's own cursor did not see these tokens
    return count / elapsed


def ead_loop(runner: Runner, prompt: list[int], count: int) -> float:
    """Tokens per second of decode through the Decoder with a policy that never switches."""
    runner.truncate(0)
    decoder = Decoder([runner], ("small",), Fixed(0), SamplingParams(), max_tokens=count + 1)
    events = decoder.run(prompt)
    next(events)  # the prompt's prefill and the first token, as the bare loop's prompt decode
    began = perf_counter()
    produced = sum(1 for _ in events)
    elapsed = perf_counter() - began
    if produced != count:
        raise SystemExit(f"the model stopped after {produced} tokens; use a prompt that runs longer")
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qc0.5b", help="alias or .gguf path")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=default_threads())
    args = parser.parse_args()
    path = registry.resolve(args.model, registry.load_catalog(), allow_download=False)
    threads = args.threads
    runner = Runner(path, name="small", n_ctx=1024, n_threads=threads)
    prompt = encode_prompt(runner, PROMPT)
    bare, ead = [], []
    bare_loop(runner, prompt, 16)  # warm both: page in the weights, allocate buffers
    ead_loop(runner, prompt, 16)
    for _ in range(args.runs):
        bare.append(bare_loop(runner, prompt, args.tokens))
        ead.append(ead_loop(runner, prompt, args.tokens))
    result = {
        "model": str(path.name),
        "tokens": args.tokens,
        "runs": args.runs,
        "threads": threads,
        "machine": platform.machine(),
        "bare_tok_s": [round(x, 2) for x in bare],
        "ead_tok_s": [round(x, 2) for x in ead],
        "bare_median_tok_s": round(statistics.median(bare), 2),
        "ead_median_tok_s": round(statistics.median(ead), 2),
        "ratio": round(statistics.median(ead) / statistics.median(bare), 4),
    }
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
