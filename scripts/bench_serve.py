#!/usr/bin/env python3
"""`ead serve` under load, as clients see it: requests per second and time to first token, whether every
answer is complete and right, whether a full queue refuses, whether memory and descriptors stay flat, and
what prompt reuse saves at the fifth turn of a chat.

Starts `ead serve` (the models and options given, ``--port 0``) and runs, in order:

1. references: each prompt once, alone and not streamed (greedy): the answer every later request must get;
2. a warm-up round (every client once), then the server's RSS, descriptors and threads (scripts/soak.py's
   measures, read from /proc/PID);
3. load: ``--clients`` threads, each streaming ``--requests`` requests over the prompts (the first
   ``--tool-clients`` of them as agents: the same tools offered, an ask and a turn after a tool's result;
   skipped where the template has no tools); each answer is checked token for token, with its models,
   against its reference; requests/s and time to first token;
4. the server's figures again: growth past ``--rss-bound-mib``, or any new descriptor or thread, fails;
5. overflow: one long stream holds the engine while ``--queue`` + 2 more requests arrive: the queue's
   places are taken and the rest must get 503; the long stream then leaves and the queued ones complete;
6. reuse: a five-turn chat, time to first token of turn 5 as sent (the caches hold turn 4) and after an
   unrelated request has taken the caches (everything read again), ``--repeats`` times each.

Prints one JSON object; exits 1 when an answer was incomplete or missing (or, with ``--exact``, differed
from its reference by a token), the overflow did not refuse, or anything grew. An answer computed on a
cached prefix can differ from its reference where two tokens nearly tie (llama.cpp's logits are not
bit-for-bit the same for another batch split); ``-- --no-reuse`` serves every prompt read whole. Timings
are only comparable within one run; hold /tmp/ead-bench.lock while it runs.

    .venv/bin/python scripts/bench_serve.py [--small qc0.5b] [--large qc1.5b] [--threads 1]
        [--clients 16] [--tool-clients 4] [--requests 3] [--max-tokens 16] [--queue 32] [--repeats 3]
        [--exact] [-- more serve options]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import httpx
from serve_process import Server
from soak import Sample, failures, figures, sample

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "hi",
    "Explain in two sentences why the sky is blue.",
    "Übersetze ins Japanische: guten Morgen, 世界",
    "def fibonacci(n):",
)
TURNS = (  # the user's side of the reuse chat; each answer is the model's own
    "Write a Python function that reverses a string.",
    "Now make it reverse the words instead.",
    "Add a docstring.",
    "Add type hints.",
    "Write one test for it.",
)
UNRELATED = "A list of ten colours, one per line:"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two integers exactly",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}
ASK = [{"role": "user", "content": "What is 6 times 7?"}]
AGENT_TURNS = {  # an agent's two requests: the ask, and the turn after the tool's result
    "tool ask": ASK,
    "tool result": [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ],
}


@dataclass(frozen=True)
class Answer:
    """One request as its client saw it."""

    status: int
    tokens: tuple[tuple[int, str], ...]  # (token, model) per chunk
    text: str
    finish: str | None
    ttft_s: float | None
    total_s: float
    summary: dict | None


def chat(
    http: httpx.Client, url: str, messages: list[dict], max_tokens: int, tools: list[dict] | None = None
) -> Answer:
    """A streamed chat request, read to its end (a tool call's delta counts as its JSON text)."""
    began = perf_counter()
    ttft = None
    tokens: list[tuple[int, str]] = []
    text, finish, summary = "", None, None
    body = {"messages": messages, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    if tools:
        body["tools"] = tools
    with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            return Answer(response.status_code, (), "", None, None, perf_counter() - began, None)
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choice = chunk["choices"][0]
            if choice["finish_reason"] is not None:
                finish, summary = choice["finish_reason"], chunk["ead"]["summary"]
                continue
            if ttft is None:
                ttft = perf_counter() - began
            if "ead" in chunk:  # a token's first chunk (with tools, a token may complete several)
                tokens.append((chunk["ead"]["token"], chunk["ead"]["model"]))
            text += choice["delta"].get("content") or json.dumps(choice["delta"].get("tool_calls"))
    return Answer(200, tuple(tokens), text, finish, ttft, perf_counter() - began, summary)


def ask(http: httpx.Client, url: str, name: str, max_tokens: int) -> Answer:
    """One of the prompts, or one of the agent's turns with the tools."""
    if name in AGENT_TURNS:
        return chat(http, url, AGENT_TURNS[name], max_tokens, TOOLS)
    return chat(http, url, [{"role": "user", "content": name}], max_tokens)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 4),
        "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 4),
        "max": round(ordered[-1], 4),
    }


def first_difference(answer: Answer, reference: Answer) -> dict:
    """Where an answer leaves its reference: the token index, and each side's (token, model) there."""
    pairs = zip(answer.tokens, reference.tokens, strict=False)
    index = next((i for i, (got, wanted) in enumerate(pairs) if got != wanted), len(reference.tokens))
    return {
        "index": index,
        "got": answer.tokens[index] if index < len(answer.tokens) else None,
        "reference": reference.tokens[index] if index < len(reference.tokens) else None,
    }


def load(
    url: str, clients: int, requests: int, max_tokens: int, references: dict[str, Answer], agents: int
) -> dict:
    """``clients`` threads at once, each streaming ``requests`` requests; every answer checked. The
    first ``agents`` clients send the agent's turns, with the tools."""
    answers: list[tuple[str, Answer]] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        names = list(AGENT_TURNS) if index < agents else list(PROMPTS)
        with httpx.Client(timeout=600) as http:
            for number in range(requests):
                name = names[(index + number) % len(names)]
                answer = ask(http, url, name, max_tokens)
                with lock:
                    answers.append((name, answer))

    began = perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = perf_counter() - began
    incomplete = sum(answer.status != 200 or answer.finish is None for _, answer in answers)
    differing = [
        {"prompt": name, **first_difference(answer, references[name])}
        for name, answer in answers
        if answer.finish is not None and answer.tokens != references[name].tokens
    ]
    ttfts = [answer.ttft_s for _, answer in answers if answer.ttft_s is not None]
    return {
        "requests": len(answers),
        "agent_requests": sum(name in AGENT_TURNS for name, _ in answers),
        "expected": clients * requests,
        "incomplete": incomplete,
        "differing": len(differing),  # complete, but not the reference's tokens (see the module's note)
        "differences": differing[:8],
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(answers) / seconds, 3),
        "tokens_per_s": round(sum(len(answer.tokens) for _, answer in answers) / seconds, 1),
        "ttft_s": quantiles(ttfts) if ttfts else None,
        "latency_s": quantiles([answer.total_s for _, answer in answers]),
    }


def overflow(url: str, queue: int, hold_tokens: int) -> dict:
    """Hold the engine with one long stream; send ``queue`` + 2 more: the queue takes ``queue``, the rest
    get 503; then the long stream leaves and the queued requests must complete."""
    holder = httpx.Client(timeout=600)
    body = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": hold_tokens, "stream": True}
    held = holder.send(holder.build_request("POST", f"{url}/v1/chat/completions", json=body), stream=True)
    lines = held.iter_lines()
    next(line for line in lines if line.startswith("data: "))  # the engine is generating it
    openers = [httpx.Client(timeout=600) for _ in range(queue + 2)]
    responses = []
    for http in openers:
        request = http.build_request(
            "POST",
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
        )
        responses.append(http.send(request, stream=True))
    refused = [r for r in responses if r.status_code == 503]
    retry_after = sorted({r.headers.get("Retry-After") for r in refused})
    held.close()  # the client goes away: its generation stops, the queue moves
    holder.close()
    completed = 0
    for response in responses:
        if response.status_code == 200:
            completed += "data: [DONE]" in list(response.iter_lines())
        response.close()
    for http in openers:
        http.close()
    return {
        "queue": queue,
        "sent": len(responses),
        "accepted": sum(r.status_code == 200 for r in responses),
        "refused_503": len(refused),
        "retry_after": retry_after,
        "accepted_completed": completed,
    }


def reuse(url: str, max_tokens: int, repeats: int) -> dict:
    """Time to first token at turn 5, with the caches as turn 4 left them and after an unrelated request."""
    with httpx.Client(timeout=600) as http:
        messages: list[dict] = []
        for turn in TURNS[:-1]:
            messages.append({"role": "user", "content": turn})
            answer = chat(http, url, messages, max_tokens)
            messages.append({"role": "assistant", "content": answer.text})
        fourth = messages[:-1]  # the conversation as turn 4 asked it
        fifth = [*messages, {"role": "user", "content": TURNS[-1]}]
        runs: dict[str, list[Answer]] = {"reuse": [], "no_reuse": []}
        for _ in range(repeats):
            chat(http, url, fourth, max_tokens)  # the caches hold turn 4 and its answer (greedy: the same)
            runs["reuse"].append(chat(http, url, fifth, 1))
            chat(http, url, [{"role": "user", "content": UNRELATED}], 2)  # now they hold something else
            runs["no_reuse"].append(chat(http, url, fifth, 1))
    result: dict = {"turn": 5, "repeats": repeats}
    for name, answers in runs.items():
        first = answers[0].summary or {}
        result[name] = {
            "ttft_s": quantiles([answer.ttft_s or 0.0 for answer in answers]),
            "prompt_tokens": first.get("prompt_tokens"),
            "read_by_model": {m["role"]: m["prefill_tokens"] for m in first.get("models", [])},
        }
    result["ttft_ratio_p50"] = round(
        result["no_reuse"]["ttft_s"]["p50"] / max(result["reuse"]["ttft_s"]["p50"], 1e-9), 2
    )
    return result


def settled(pid: int, start: Sample, wait_s: float = 5.0) -> Sample:
    """The server's figures once the connections its clients closed are closed on its side too (a
    descriptor is freed when the server has read the client's end, a moment after the client left)."""
    deadline = perf_counter() + wait_s
    while True:
        now = sample(pid)
        if now.fds <= start.fds or perf_counter() > deadline:
            return now
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small")
    parser.add_argument("--large")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=3, help="requests per client")
    parser.add_argument("--tool-clients", type=int, default=4, help="clients that are agents with tools")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--queue", type=int, default=32, help="the server's --queue (at least --clients)")
    parser.add_argument("--repeats", type=int, default=3, help="turn-5 measurements with and without reuse")
    parser.add_argument("--hold-tokens", type=int, default=1024, help="the overflow phase's long stream")
    parser.add_argument("--rss-bound-mib", type=float, default=64.0)
    parser.add_argument(
        "--exact", action="store_true", help="fail if an answer differs from its reference by a token"
    )
    parser.add_argument("serve_args", nargs="*", help="more `ead serve` options (after --)")
    args = parser.parse_args()
    if args.queue < args.clients or min(args.clients, args.requests, args.max_tokens, args.repeats) < 1:
        parser.error("--queue must be at least --clients, and counts at least 1")
    if not 0 <= args.tool_clients <= args.clients:
        parser.error("--tool-clients must be in [0, --clients]")
    models = [f"--{name}={value}" for name, value in (("small", args.small), ("large", args.large)) if value]
    serve_args = [*models, "--threads", str(args.threads), "--queue", str(args.queue), *args.serve_args]
    with tempfile.TemporaryDirectory() as folder, Server(serve_args, Path(folder) / "server.log") as server:
        url, pid = server.url, server.process.pid
        with httpx.Client(timeout=600) as http:
            references = {name: ask(http, url, name, args.max_tokens) for name in (*PROMPTS, *AGENT_TURNS)}
            info = http.get(f"{url}/v1/models").json()["data"][0]["ead"]
        agents = args.tool_clients if references["tool ask"].status == 200 else 0  # 400: no tool template
        load(url, args.clients, 1, args.max_tokens, references, agents)  # warm-up
        start = sample(pid)
        measured = load(url, args.clients, args.requests, args.max_tokens, references, agents)
        end = settled(pid, start)
        grew = failures(start, end, args.rss_bound_mib)
        flood = overflow(url, args.queue, min(args.hold_tokens, info["n_ctx"] - 64))
        chat_reuse = reuse(url, args.max_tokens, args.repeats)
        code = server.stop()
        log = server.log()
    problems = [*grew]
    if measured["incomplete"] or measured["requests"] != measured["expected"]:
        problems.append(f"{measured['incomplete']} answers incomplete or missing")
    if measured["differing"] and args.exact:
        problems.append(f"{measured['differing']} answers differ from their reference")
    if flood["refused_503"] != 2 or flood["accepted_completed"] != flood["accepted"]:
        problems.append(f"overflow: {flood}")
    if code != 0 or "Traceback" in log:
        traceback = " after a traceback" if "Traceback" in log else ""
        problems.append(f"the server exited with {code}{traceback}")
    result = {
        "models": info["models"],
        "n_ctx": info["n_ctx"],
        "serve_args": serve_args,
        "clients": args.clients,
        "tool_clients": agents,
        "requests_per_client": args.requests,
        "max_tokens": args.max_tokens,
        "load": measured,
        "server": figures(start, end, args.rss_bound_mib),
        "overflow": flood,
        "reuse": chat_reuse,
        "failures": problems,
    }
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
