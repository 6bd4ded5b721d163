#!/usr/bin/env python3
"""What the EAD loop costs over a bare llama-cpp-python decode loop, on one model, in one process.

Both loops decode the same prompt greedily for the same number of tokens; runs alternate (bare, ead,
bare, ead, ...) so machine noise hits both alike. Prints one JSON object; ``ratio`` is the median EAD
loop throughput over the median bare loop throughput (goal: >= 0.97).

    .venv/bin/python scripts/bench_overhead.py [--model qc0.5b] [--tokens 128] [--runs 5]
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
from ead_cli.policies import Fixed
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner, default_threads
from ead_cli.sampling import SamplingParams

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


def bare_loop(llm: llama_cpp.Llama, prompt: list[int], count: int) -> float:
    """Tokens per second of decode: Llama.eval one token at a time, argmax over the last logits row."""
    llm.reset()
    llm.eval(prompt)
    n_vocab = llm.n_vocab()
    began = perf_counter()
    for _ in range(count):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        llm.eval([int(np.argmax(logits))])
    return count / (perf_counter() - began)


def ead_loop(runner: Runner, prompt: list[int], count: int) -> float:
    """Tokens per second of decode through the Decoder with a policy that never switches."""
    runner.truncate(0)
    decoder = Decoder([runner], ("small",), Fixed(0), SamplingParams(), max_tokens=count + 1)
    events = decoder.run(prompt)
    next(events)  # the prompt's prefill and the first token, as the bare loop's llm.eval(prompt)
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
    args = parser.parse_args()
    path = registry.resolve(args.model, registry.load_catalog(), allow_download=False)
    threads = default_threads()
    runner = Runner(path, name="small", n_ctx=1024, n_threads=threads)
    prompt = encode_prompt(runner, PROMPT)
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=1024, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    bare, ead = [], []
    bare_loop(llm, prompt, 16)  # warm both: page in the weights, allocate buffers
    ead_loop(runner, prompt, 16)
    for _ in range(args.runs):
        bare.append(bare_loop(llm, prompt, args.tokens))
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
