#!/usr/bin/env python3
"""Many generations in one process, as chat and bench run them: does anything pile up?

Loads the pair once, then runs ``--count`` generations back to back on the same runners, each through
a fresh decoder as ``ead chat`` and ``ead bench`` build them, cycling through prompts, policies (gate,
the paper's rule, --verify 0.1, speculative decoding, each model alone) and greedy or seeded sampling.
A leak per generation (a llama.cpp sampler chain or batch never freed, a file left open, a thread never
joined) is invisible in one run and fatal in a long chat.

The baseline comes after ``--warmup`` generations (by default every prompt and policy pairing once), so
that every path has allocated its buffers: llama.cpp keeps its output buffers as large as the most logits
rows a batch has asked for (600 KB a row for Qwen), so they grow until the largest --verify check comes round.
It then records resident memory (VmRSS, and apart its anonymous share RssAnon, where a leak shows
without the models' mapped file pages), open file descriptors and threads (the kernel's count and
Python's), tracks the peak RSS after each generation, and compares at the end.

Prints one JSON object; exits 1 if RSS grew by more than ``--rss-bound-mib`` or the descriptors or threads
grew at all.

    .venv/bin/python scripts/soak.py [--small qc0.5b] [--large qc1.5b] [--count 200] [--max-tokens 32]
                                     [--threads 1] [--rss-bound-mib 64] [--warmup 30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from dataclasses import dataclass
from time import perf_counter

from ead_cli.engine import build_decoder, load_runners
from ead_cli.errors import EadError
from ead_cli.options import GenerationOptions, ModelOptions, PolicyOptions
from ead_cli.prompt import check_fits, encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "hi",
    "Explain in two sentences why the sky is blue.",
    "Übersetze ins Japanische: guten Morgen, 世界",  # multi-byte text across tokens and switches
    "def fibonacci(n):",
)
# Five prompts and six policies: coprime, so every pairing comes round within thirty generations (the
# default warm-up), each policy greedy in one round of six and sampled in the next.
POLICIES = (
    PolicyOptions(mode="ead"),  # the default policy, switching
    PolicyOptions(policy="ead", window=3, min_run=2),
    PolicyOptions(verify=0.1),
    PolicyOptions(mode="spec", draft=4),
    PolicyOptions(mode="small"),
    PolicyOptions(mode="large"),
)


@dataclass(frozen=True)
class Sample:
    """What the process holds at one moment."""

    rss_mib: float
    anon_mib: float  # the part of RSS not backed by a file: the mapped model files' pages are not in it
    fds: int
    threads: int  # the kernel's count: llama.cpp's and OpenBLAS's threads included
    python_threads: int


def sample(pid: int | str = "self") -> Sample:
    """This process's figures, or another's (``pid``: its Python threads are not visible, counted 0)."""
    status: dict[str, list[str]] = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as lines:
        for line in lines:
            key, _, value = line.partition(":")
            status[key] = value.split()
    return Sample(
        rss_mib=int(status["VmRSS"][0]) / 1024,  # kB
        anon_mib=int(status["RssAnon"][0]) / 1024,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(status["Threads"][0]),
        python_threads=threading.active_count() if pid == "self" else 0,
    )


def failures(start: Sample, end: Sample, rss_bound_mib: float) -> list[str]:
    """What grew past its bound between the baseline and the end (empty when nothing did)."""
    found = []
    if end.rss_mib - start.rss_mib > rss_bound_mib:
        found.append(f"RSS grew by {end.rss_mib - start.rss_mib:.1f} MiB (bound {rss_bound_mib} MiB)")
    if end.fds > start.fds:
        found.append(f"open file descriptors grew from {start.fds} to {end.fds}")
    if end.threads > start.threads or end.python_threads > start.python_threads:
        found.append(
            f"threads grew from {start.threads} to {end.threads} "
            f"(Python: {start.python_threads} to {end.python_threads})"
        )
    return found


def figures(start: Sample, end: Sample, rss_bound_mib: float) -> dict[str, float]:
    """The baseline and the end, side by side, for the JSON report."""
    return {
        "rss_start_mib": round(start.rss_mib, 1),
        "rss_end_mib": round(end.rss_mib, 1),
        "rss_growth_mib": round(end.rss_mib - start.rss_mib, 1),
        "rss_anon_growth_mib": round(end.anon_mib - start.anon_mib, 1),
        "rss_bound_mib": rss_bound_mib,
        "fds_start": start.fds,
        "fds_end": end.fds,
        "threads_start": start.threads,
        "threads_end": end.threads,
    }


def generate(runners: list[Runner], index: int, max_tokens: int) -> int:
    """Generation ``index`` of the cycle, start to end, as the CLI runs one; returns its token count."""
    sampling = SamplingParams(temp=0.8, seed=index) if index // len(POLICIES) % 2 else SamplingParams()
    decoder = build_decoder(
        runners, POLICIES[index % len(POLICIES)], GenerationOptions(sampling, max_tokens=max_tokens)
    )
    tokens = encode_prompt(runners[0], PROMPTS[index % len(PROMPTS)])
    check_fits(tokens, runners)
    for _ in decoder.run(tokens):
        pass
    return decoder.summary().generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", help="alias or .gguf path (default: the models.toml default)")
    parser.add_argument("--large", help="alias or .gguf path (default: the models.toml default)")
    parser.add_argument("--count", type=int, default=200, help="generations measured after the warm-up")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rss-bound-mib", type=float, default=64.0)
    parser.add_argument(
        "--warmup", type=int, default=len(PROMPTS) * len(POLICIES), help="generations before the baseline"
    )
    args = parser.parse_args()
    if args.count < 1 or args.warmup < 0:
        parser.error("--count must be at least 1 and --warmup at least 0")
    try:
        runners = load_runners(
            ModelOptions(small=args.small, large=args.large, threads=args.threads, allow_download=False)
        )
    except EadError as error:
        sys.exit(f"error: {error}")
    for index in range(args.warmup):
        generate(runners, index, args.max_tokens)
    start = sample()
    peak = start.rss_mib
    tokens = 0
    began = perf_counter()
    for index in range(args.warmup, args.warmup + args.count):
        tokens += generate(runners, index, args.max_tokens)
        peak = max(peak, sample().rss_mib)
    seconds = perf_counter() - began
    end = sample()
    peak = max(peak, end.rss_mib)  # the end is a sample too: RSS can grow a page or two after the last one
    for runner in runners:
        runner.close()
    found = failures(start, end, args.rss_bound_mib)
    result = {
        "small": runners[0].path.name,
        "large": runners[1].path.name,
        "generations": args.count,
        "warmup": args.warmup,
        "max_tokens": args.max_tokens,
        "threads_option": args.threads,
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "rss_max_mib": round(peak, 1),
        **figures(start, end, args.rss_bound_mib),
        "python_threads_start": start.python_threads,
        "python_threads_end": end.python_threads,
        "failures": found,
    }
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
