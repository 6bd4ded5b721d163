#!/usr/bin/env python3
"""``Decoder(entropy="needed")`` against ``"exact"`` on a real pair: the same tokens and models, how many
steps the cheap bounds settle, and what the entropy costs a step either way on the rows the loop met.

For each policy and prompt the pair answers greedily twice, measuring every step's entropy and only
where needed; the tokens, the writing models and the measured entropies must agree. Every row the small
model evaluated in the exact run is kept, and afterwards timed (the row warm, on one core) through the
exact pass and through the bounds ``EntropyMeter.settle`` tries for that policy. Prints one JSON object.

    .venv/bin/python scripts/check_needed_entropy.py --out docs/results/overhead/needed-real-pair.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from time import perf_counter

import numpy as np

from ead_cli import registry
from ead_cli.decoder import Decoder
from ead_cli.entropy import EntropyMeter
from ead_cli.policies import EAD, Gate, Policy
from ead_cli.prompt import encode_prompt
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    'def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    """Merge two sorted lists."""',
)
POLICIES = {
    "gate tau=1": lambda: Gate(1.0),
    "gate tau=0.5": lambda: Gate(0.5),
    "ead tau=0.5": lambda: EAD(0.5),
}


def answer(runners: list[Runner], policy: Policy, prompt: list[int], tokens: int, mode: str) -> list:
    for runner in runners:
        runner.truncate(0)
    decoder = Decoder(runners, ("small", "large"), policy, SamplingParams(), max_tokens=tokens, entropy=mode)
    return list(decoder.run(prompt))


class Keeper:
    """An entropy meter that keeps a copy of every row it meters (the exact path, as the decoder calls
    a meter that is not an EntropyMeter)."""

    def __init__(self, meter: EntropyMeter) -> None:
        self.meter, self.rows = meter, []

    def __call__(self, row: np.ndarray) -> float:
        self.rows.append(row.copy())
        return self.meter(row)


def needed_step(meter: EntropyMeter, policy: Policy, row: np.ndarray) -> None:
    """What ``entropy="needed"`` computes for a row: the bounds, then the exact pass if they do not
    settle the step."""
    top = row[int(row.argmax())]
    if not policy.may_settle or meter.settle(row, top, policy.settled) is None:
        meter(row, top)


def costs(meter: EntropyMeter, policy: Policy, rows: list[np.ndarray]) -> tuple[list[float], list[float]]:
    """Microseconds per row: the exact pass (from the argmax, as a greedy step), and the needed path."""
    exact = [timed(lambda row=row: meter(row, row[int(row.argmax())])) for row in rows]
    needed = [timed(lambda row=row: needed_step(meter, policy, row)) for row in rows]
    return exact, needed


def timed(call, repeats: int = 5) -> float:
    """The fastest of ``repeats`` calls, in microseconds."""
    best = math.inf
    for _ in range(repeats):
        began = perf_counter()
        call()
        best = min(best, perf_counter() - began)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    catalog = registry.load_catalog()
    paths = [
        registry.resolve(alias, catalog, allow_download=False) for alias in (catalog.small, catalog.large)
    ]
    runners = [Runner(path, name=path.stem, n_ctx=2048, n_threads=args.threads) for path in paths]
    report: dict = {"models": [p.name for p in paths], "tokens": args.tokens, "policies": {}}
    try:
        for name, make in POLICIES.items():
            same, steps, unmeasured, rows = True, 0, 0, []
            for text in PROMPTS:
                prompt = encode_prompt(runners[0], text)
                meter = runners[0].entropy
                runners[0].entropy = keeper = Keeper(meter)
                try:
                    exact = answer(runners, make(), prompt, args.tokens, "exact")
                finally:
                    runners[0].entropy = meter
                needed = answer(runners, make(), prompt, args.tokens, "needed")
                same &= [(e.token, e.model) for e in exact] == [(e.token, e.model) for e in needed]
                pairs = zip(needed, exact, strict=True)
                same &= all(n.entropy == e.entropy for n, e in pairs if not math.isnan(n.entropy))
                steps += len(needed)
                unmeasured += sum(math.isnan(e.entropy) for e in needed)
                rows += keeper.rows
            exact_us, needed_us = costs(runners[0].entropy, make(), rows)
            report["policies"][name] = {
                "same_tokens_models_and_measured_entropies": same,
                "steps": steps,
                "steps_not_measured": unmeasured,
                "small_model_rows_timed": len(rows),
                "exact_us_per_row_median": round(statistics.median(exact_us), 1),
                "needed_us_per_row_median": round(statistics.median(needed_us), 1),
                "exact_us_per_row_mean": round(statistics.fmean(exact_us), 1),
                "needed_us_per_row_mean": round(statistics.fmean(needed_us), 1),
            }
    finally:
        for runner in runners:
            runner.close()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
