"""How well the top-k entropy estimate (a remote model's only view of its distribution) tracks the exact
entropy, on real models: each model answers prompts greedily; at every step the exact entropy of the
full softmax is compared with the top-k lower bound (what ``RemoteRunner.entropy`` returns), the upper
bound and their midpoint, for several k. Also counts how often the gate's decision at tau would differ.

    .venv/bin/python scripts/topk_entropy.py --tokens 96 --out docs/results/topk-entropy.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ead_cli import registry
from ead_cli.decoder import Decoder
from ead_cli.policies import Fixed
from ead_cli.prompt import encode_prompt
from ead_cli.remote import topk_entropy
from ead_cli.runner import Runner
from ead_cli.sampling import SamplingParams

PROMPTS = (
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences why the sky is blue.",
    "What is 17 * 23? Show your steps.",
    "Write a haiku about compilers.",
    'def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    """Merge two sorted lists."""',
    "List three differences between TCP and UDP.",
)
WITHIN_NATS = (10, 20, 30)


def measure(path: Path, ks: list[int], tokens: int, threads: int, tau: float) -> dict:
    runner = Runner(path, name="model", n_ctx=1024, n_threads=threads)
    exact: list[float] = []
    within: dict[int, list[int]] = {nats: [] for nats in WITHIN_NATS}
    bounds: dict[int, list[tuple[float, float]]] = {k: [] for k in ks}
    try:
        for prompt in PROMPTS:
            runner.truncate(0)
            decoder = Decoder([runner], ("model",), Fixed(0), SamplingParams(), max_tokens=tokens)
            prompt_tokens = encode_prompt(runner, prompt)
            # replay the answer to read every step's full row of logits
            answer = [event.token for event in decoder.run(prompt_tokens)]
            runner.truncate(0)
            sequence = list(prompt_tokens)
            for token in answer:
                row = runner.sync(sequence, prompt_len=len(prompt_tokens), own_tail=True).astype(np.float64)
                probs = np.exp(row - row.max())
                probs /= probs.sum()
                nonzero = probs[probs > 0]
                exact.append(float(-(nonzero * np.log2(nonzero)).sum()))
                for nats in WITHIN_NATS:
                    within[nats].append(int(np.count_nonzero(row > row.max() - nats)))
                ordered = np.sort(probs)[::-1]
                for k in ks:
                    bounds[k].append(topk_entropy(ordered[:k], runner.n_vocab))
                sequence.append(token)
    finally:
        runner.close()
    truth = np.array(exact)
    report: dict = {"model": path.name, "steps": len(exact), "mean_entropy_bits": float(truth.mean())}
    report["logits_within_nats_of_top"] = {
        str(nats): {"median": float(np.median(counts)), "max": max(counts)} for nats, counts in within.items()
    }
    for k in ks:
        lower = np.array([b[0] for b in bounds[k]])
        upper = np.array([b[1] for b in bounds[k]])
        middle = (lower + upper) / 2
        report[f"k={k}"] = {
            name: {
                "mean_abs_error_bits": float(np.abs(estimate - truth).mean()),
                "p95_abs_error_bits": float(np.percentile(np.abs(estimate - truth), 95)),
                "max_abs_error_bits": float(np.abs(estimate - truth).max()),
                f"gate_decisions_differing_at_tau_{tau:g}": float(
                    np.mean((estimate >= tau) != (truth >= tau))
                ),
            }
            for name, estimate in (("lower", lower), ("upper", upper), ("middle", middle))
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tau", type=float, default=1.0)
    parser.add_argument("--k", default="5,20,100")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    catalog = registry.load_catalog()
    ks = [int(k) for k in args.k.split(",")]
    reports = [
        measure(
            registry.resolve(alias, catalog, allow_download=False), ks, args.tokens, args.threads, args.tau
        )
        for alias in (catalog.small, catalog.large)
    ]
    text = json.dumps(reports, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
