#!/usr/bin/env python3
"""Seconds per batch at every size from 1 to 40 tokens (and 44, 48, 56, 64), for one model.

``ead bench speed`` times powers of two; prompt lookup's guesses make batches of any size, and
llama.cpp's CPU kernels do not cost a linear amount between them: on the 2-core AMD EPYC a batch of 16
rows takes less time than one of 15, and one of 33 10% longer than one of 32. Each size is fed after
``--context`` tokens and rolled back, with logits at the last row only (a catch-up) and at every row (a
lookup guess being checked), timed as ``ead bench speed`` times a size (``batch_rate``: a warm-up batch,
then batches until a quarter second was timed) in each of ``--rounds`` rounds, the fastest kept. The
JSON has the rates with logits at every row in ``ead bench speed --json``'s shape, so
``scripts/lookup_sim.py --speed`` prices guesses with them, and the seconds of both kinds.

    taskset -c 0 .venv/bin/python scripts/batch_curve.py --model qc1.5b --threads 1 --out curve.json
"""

from __future__ import annotations

import argparse
import json
import os

from ead_cli import registry
from ead_cli.bench.speed import batch_rate, filler_tokens
from ead_cli.hardware import this_cpu
from ead_cli.runner import Runner

SIZES = (*range(1, 41), 44, 48, 56, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qc1.5b", help="alias or .gguf path")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    path = registry.resolve(args.model, registry.load_catalog(), allow_download=False)
    runner = Runner(path, name="large", n_ctx=args.context + max(SIZES) + 64, n_threads=args.threads)
    tokens = filler_tokens(runner, args.context + max(SIZES))
    runner.feed(tokens, 0, args.context, "prefill")
    load_before = os.getloadavg()
    seconds: dict[str, dict[int, float]] = {"last_row": {}, "every_row": {}}
    for _ in range(args.rounds):  # rounds go through every size, so a busy spell hits all sizes alike
        for kind, best in seconds.items():
            for size in SIZES:
                rows = size if kind == "every_row" else 1
                took = size / batch_rate(runner, tokens, args.context, size, rows)
                best[size] = min(best.get(size, took), took)
    result = {
        "rates": [{
            "model": path.name, "params": runner.n_params, "context": args.context,
            "tokens_per_s": {size: size / s for size, s in seconds["every_row"].items()},
        }],
        "seconds": seconds, "threads": args.threads, "cpu": this_cpu()[0],
        "cpus_allowed": sorted(os.sched_getaffinity(0)), "repack": runner.repack.word,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
        out.write("\n")
    print("size  last row s  every row s  per token vs one decode (every row)")
    one = seconds["every_row"][1]
    for size in SIZES:
        every = seconds["every_row"][size]
        print(f"{size:4}  {seconds['last_row'][size]:10.4f}  {every:11.4f}  {size * one / every:.2f}")


if __name__ == "__main__":
    main()
