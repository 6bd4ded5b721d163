#!/usr/bin/env python3
"""What the EAD loop costs over a bare llama-cpp-python decode loop, on one model, in one process.

Both loops decode the same prompt greedily for the same number of tokens on the same llama.cpp
context (same model, threads, batch and attention settings), so the ratio is the cost of the loop
alone: entropy, policy, sampling, detokenising and events. The bare loop is the least Python a
greedy decode can have: llama_decode on a one-token batch, llama_synchronize (a GPU backend's decode
returns before the device is done, and the EAD loop's read of the row waits for it; on the CPU it
returns at once), argmax over a numpy view of the logits made once (llama.cpp keeps the row in place
for one-token batches). A third loop, the EAD loop with its entropy pass replaced by a constant (the
policy never switches, so nothing else changes), splits the overhead into the entropy pass and the rest.
Runs alternate (bare, ead, ead without entropy, ...) so machine noise hits all alike. Each run is timed
by the wall clock and by the process's CPU time (which a shared machine's descheduling does not inflate).
Prints one JSON object; ``ratio`` is the median EAD loop throughput over the median bare loop
throughput, by the wall clock (goal: >= 0.97), ``cpu_ratio`` the same by CPU time, ``overhead_us`` the
EAD loop's extra microseconds per token.

The gate loops (``gate``, ``gate_needed``) name the one context twice: one decode a token, the large
model's sync finds the row at hand. With ``--pair`` a second context of the same model is the large
model, as in a real pair, where each model decodes every token: ``gate_pair_needed`` (the gate, its
entropy measured where needed) against ``bare_pair`` (both contexts decode every token, the argmax of
both rows: the least reading a switching loop does), ``gate_pair_needed_ratio``; and against
``bare_pair_serial``, the same with each decode waited for before the next is launched, as a switching
loop must (on a GPU the plain pair loop has both contexts' decodes in flight at once; on a CPU the two
are the same), ``gate_pair_needed_serial_ratio``.

On a GPU the decoder launches the next step's decode before it hands out a token's event
(``Runner.reads_ahead``), so the loop's work after a token overlaps the device's decode; the loops named
``*_in_turn`` (``ead_in_turn``, ``ead_needed_in_turn``, ``gate_pair_needed_in_turn``) turn that off, for
the same run's comparison. ``ead`` measures every token's exact entropy, as ``ead serve`` and ``ead chat``
do; reading ahead, the decoder finishes that pass (on its copy of the row) after the next decode is
launched. On a CPU, where a decode returns when it is done, reading ahead is off in every loop.

``--no-decode`` times every loop with llama_decode a no-op after the prompt (the rows stay as the prompt
left them; ``decodes_skipped`` counts the calls): each loop's own Python and numpy work alone, with the
CPU's caches warm. A decode on the CPU sweeps the weights through them, so the loop's work after it runs
cold (slower); on a GPU the weights stay on the device. Then ``*_overhead_us`` is what matters, the
ratios only compare loops without their decodes. ``--time-decodes`` times each llama_decode call
(``*_decode_us``: a token's median microseconds inside them; ``*_outside_us``: the rest of its time). On
a GPU backend the decode returns before the device is done and the wait falls in the next read of the
row: there the split says what the CPU did, not where the time went.

    .venv/bin/python scripts/bench_overhead.py [--model qc0.5b] [--tokens 128] [--runs 5] [--threads N]
        [--pair] [--no-decode | --time-decodes]

A model with Qwen's real vocabulary that decodes at over 1,000 tokens a second on one CPU core:

    .venv/bin/python scripts/write_twin.py --shape qwen2.5-micro --tokenizer-from <qwen2.5 gguf> --out m.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from time import perf_counter, process_time

import llama_cpp
import numpy as np

from ead_cli import registry
from ead_cli.decoder import Decoder
from ead_cli.hardware import this_cpu
from ead_cli.options import default_threads
from ead_cli.policies import Fixed, Gate, Policy
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."
LOOPS = (
    "bare", "ead", "ead_in_turn", "ead_needed", "ead_needed_in_turn", "ead_without_entropy", "gate",
    "gate_needed",
)  # fmt: skip
DECODES = {"skipped": 0, "seconds": 0.0}  # --no-decode's no-op calls; --time-decodes' seconds inside


@contextmanager
def decoding(mode: str) -> Iterator[None]:
    """llama_decode in a loop's timed part: as it is ("real"), each call timed into DECODES["seconds"]
    ("timed"), or a no-op counted in DECODES["skipped"] ("none")."""
    if mode == "real":
        yield
        return
    llama_decode = llama_cpp.llama_decode

    def skipped(_ctx: llama_cpp.llama_context_p, _batch: llama_cpp.llama_batch) -> int:
        DECODES["skipped"] += 1
        return 0

    def timed(ctx: llama_cpp.llama_context_p, batch: llama_cpp.llama_batch) -> int:
        began = perf_counter()
        status = llama_decode(ctx, batch)
        DECODES["seconds"] += perf_counter() - began
        return status

    llama_cpp.llama_decode = timed if mode == "timed" else skipped
    try:
        yield
    finally:
        llama_cpp.llama_decode = llama_decode


def prefilled(runner: Runner, prompt: list[int]) -> np.ndarray:
    """The runner's context emptied and fed the prompt by llama_decode; a view of the last row's logits."""
    runner.truncate(0)
    prompt_array = (llama_cpp.llama_token * len(prompt))(*prompt)
    if llama_cpp.llama_decode(runner.ctx, llama_cpp.llama_batch_get_one(prompt_array, len(prompt))) != 0:
        raise SystemExit("llama_decode failed on the prompt")
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(runner.ctx, -1), shape=(runner.n_vocab,))


def bare_loop(
    runners: Sequence[Runner], prompt: list[int], count: int, *, serial: bool = False, decode: str = "real"
) -> tuple[float, float]:
    """Seconds (wall, CPU) to decode ``count`` tokens: llama_decode one token at a time on every
    context, the argmax of every row once its decode is done; the last context's argmax is the token.
    ``serial``: each context's decode is waited for before the next one's is launched, the order of a
    switching loop (the large model's input follows the small one's row); otherwise, on a GPU, both are
    launched before either is waited for. ``decode``: a decoding mode."""
    rows = [prefilled(runner, prompt) for runner in runners]
    token = (llama_cpp.llama_token * 1)()
    batch = llama_cpp.llama_batch_get_one(token, 1)
    with decoding(decode):
        began, began_cpu = perf_counter(), process_time()
        for _ in range(count):
            for runner, row in zip(runners, rows, strict=True):
                llama_cpp.llama_synchronize(runner.ctx)
                token[0] = int(np.argmax(row))
            for runner in runners:
                if llama_cpp.llama_decode(runner.ctx, batch) != 0:
                    raise SystemExit("llama_decode failed")
                if serial:
                    llama_cpp.llama_synchronize(runner.ctx)
        elapsed = perf_counter() - began, process_time() - began_cpu
    for runner in runners:
        runner.truncate(0)  # the runner's own cursor did not see these tokens
    return elapsed


def ead_loop(
    runners: Sequence[Runner],
    prompt: list[int],
    count: int,
    *,
    entropy: str = "exact",
    gate: bool = False,
    decode: str = "real",
    in_turn: bool = False,
) -> tuple[float, float]:
    """Seconds (wall, CPU) to decode ``count`` tokens through the Decoder with a policy that never
    switches on the first context, or with the gate (``gate``) on the two contexts given, or on the
    one context named twice (then the large model's sync finds the row at hand: one decode a token).
    ``decode``: a decoding mode. ``in_turn``: with ``Runner.reads_ahead`` off (on a GPU it is on: the
    next step's decode is launched before a token's event is handed out), each event handed out before
    the next decode is launched."""
    given, ahead = list(runners), [runner.reads_ahead for runner in runners]
    for runner in runners:
        runner.truncate(0)
        runner.reads_ahead = runner.reads_ahead and not in_turn
    if gate:
        runners, roles = [runners[0], runners[-1]], ("small", "large")
    else:
        runners, roles = [runners[0]], ("small",)
    policy: Policy = Gate(1.0) if gate else Fixed(0)
    decoder = Decoder(runners, roles, policy, SamplingParams(), max_tokens=count + 1, entropy=entropy)
    events = decoder.run(prompt)
    next(events)  # the prompt's prefill and the first token, as the bare loop's prompt decode
    with decoding(decode):
        began, began_cpu = perf_counter(), process_time()
        produced = sum(1 for _ in events)
        elapsed = perf_counter() - began, process_time() - began_cpu
    for runner, reads_ahead in zip(given, ahead, strict=True):
        runner.reads_ahead = reads_ahead
    if produced != count:
        raise SystemExit(f"the model stopped after {produced} tokens; use a prompt that runs longer")
    return elapsed


def ead_loop_without_entropy(
    runner: Runner, prompt: list[int], count: int, *, decode: str = "real"
) -> tuple[float, float]:
    """The EAD loop with a constant for the entropy: what the loop costs besides the entropy pass."""
    meter = runner.entropy
    runner.entropy = lambda _row: 0.0
    try:
        return ead_loop([runner], prompt, count, decode=decode)
    finally:
        runner.entropy = meter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qc0.5b", help="alias or .gguf path")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--pair", action="store_true", help="also the gate on two contexts of the model")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--no-decode", action="store_true", help="llama_decode a no-op: the loops' own work")
    modes.add_argument("--time-decodes", action="store_true", help="time each llama_decode call")
    args = parser.parse_args()
    path = registry.resolve(args.model, registry.load_catalog(), allow_download=False)
    runner = Runner(path, name="small", n_ctx=1024, n_threads=args.threads)
    pair = [runner, Runner(path, name="large", n_ctx=1024, n_threads=args.threads)] if args.pair else []
    prompt = encode_prompt(runner, PROMPT)
    one, decode = [runner], "none" if args.no_decode else "timed" if args.time_decodes else "real"
    loops: dict[str, Callable[[list[int], int], tuple[float, float]]] = dict(
        zip(
            LOOPS,
            (
                partial(bare_loop, one, decode=decode),
                partial(ead_loop, one, decode=decode),
                partial(ead_loop, one, decode=decode, in_turn=True),
                partial(ead_loop, one, entropy="needed", decode=decode),
                partial(ead_loop, one, entropy="needed", decode=decode, in_turn=True),
                partial(ead_loop_without_entropy, runner, decode=decode),
                partial(ead_loop, one, gate=True, decode=decode),
                partial(ead_loop, one, gate=True, entropy="needed", decode=decode),
            ),
            strict=True,
        )
    )
    if pair:
        loops["bare_pair"] = partial(bare_loop, pair, decode=decode)
        loops["bare_pair_serial"] = partial(bare_loop, pair, serial=True, decode=decode)
        loops["gate_pair_needed"] = partial(ead_loop, pair, gate=True, entropy="needed", decode=decode)
        loops["gate_pair_needed_in_turn"] = partial(
            ead_loop, pair, gate=True, entropy="needed", decode=decode, in_turn=True
        )
    names = list(loops)
    load_before = os.getloadavg()
    for loop in loops.values():  # warm all: page in the weights, allocate buffers
        loop(prompt, 16)
    wall: dict[str, list[float]] = {name: [] for name in names}  # tokens per second, run by run
    cpu: dict[str, list[float]] = {name: [] for name in names}
    inside: dict[str, list[float]] = {name: [] for name in names}  # --time-decodes: us a token inside
    for _ in range(args.runs):
        for name, loop in loops.items():
            decoding_s = DECODES["seconds"]
            wall_s, cpu_s = loop(prompt, args.tokens)
            wall[name].append(args.tokens / wall_s)
            cpu[name].append(args.tokens / cpu_s)
            inside[name].append((DECODES["seconds"] - decoding_s) / args.tokens * 1e6)
    wall_median = {name: statistics.median(rates) for name, rates in wall.items()}
    cpu_median = {name: statistics.median(rates) for name, rates in cpu.items()}

    def extra_us(rates: dict[str, float], loop: str, base: str) -> float:
        """Microseconds per token that ``loop`` spends beyond ``base``, from the medians."""
        return round(1e6 / rates[loop] - 1e6 / rates[base], 1)

    result = {
        "model": str(path.name),
        "tokens": args.tokens,
        "runs": args.runs,
        "threads": args.threads,
        "no_decode": args.no_decode,
        "time_decodes": args.time_decodes,
        "decodes_skipped": DECODES["skipped"],
        "repack": runner.repack.word,  # llama.cpp's weight repacking, as ead decided it (EAD_REPACK, the CPU)
        "cpu": this_cpu()[0],
        "cpus_allowed": sorted(os.sched_getaffinity(0)),  # taskset -c 1: [1]
        "load_avg_before": [round(x, 2) for x in load_before],  # 1, 5, 15 minutes (os.getloadavg)
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        **{f"{name}_tok_s": [round(x, 2) for x in wall[name]] for name in names},
        **{f"{name}_median_tok_s": round(wall_median[name], 2) for name in names},
        **{f"{name}_cpu_tok_s": [round(x, 2) for x in cpu[name]] for name in names},
        **{f"{name}_cpu_median_tok_s": round(cpu_median[name], 2) for name in names},
        "ratio": round(wall_median["ead"] / wall_median["bare"], 4),
        "cpu_ratio": round(cpu_median["ead"] / cpu_median["bare"], 4),
        **{f"{name}_ratio": round(wall_median[name] / wall_median["bare"], 4) for name in LOOPS[2:]},
        **{f"{name}_cpu_ratio": round(cpu_median[name] / cpu_median["bare"], 4) for name in LOOPS[2:]},
        "overhead_us": extra_us(wall_median, "ead", "bare"),
        **{f"{name}_overhead_us": extra_us(wall_median, name, "bare") for name in LOOPS[2:]},
        "cpu_overhead_us": extra_us(cpu_median, "ead", "bare"),
        "cpu_entropy_us": extra_us(cpu_median, "ead", "ead_without_entropy"),
    }
    if args.time_decodes:  # a token's median us inside llama_decode, and outside it (the run's rest)
        for name in names:
            outside = [1e6 / rate - us for rate, us in zip(wall[name], inside[name], strict=True)]
            result[f"{name}_decode_us"] = round(statistics.median(inside[name]), 1)
            result[f"{name}_outside_us"] = round(statistics.median(outside), 1)
    if pair:  # a pair's loop against the bare pair loop (each token: two decodes, two argmaxes)
        for key, rates in (("ratio", wall_median), ("cpu_ratio", cpu_median)):
            result[f"gate_pair_needed_{key}"] = round(rates["gate_pair_needed"] / rates["bare_pair"], 4)
        result["gate_pair_needed_overhead_us"] = extra_us(wall_median, "gate_pair_needed", "bare_pair")
        # against the bare pair loop in a switching loop's order (the same as bare_pair on a CPU)
        for loop in ("gate_pair_needed", "gate_pair_needed_in_turn"):
            result[f"{loop}_serial_ratio"] = round(wall_median[loop] / wall_median["bare_pair_serial"], 4)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
