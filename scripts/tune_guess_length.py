"""Tuning run for the lookup guess length (HumanEval even ids only): guesses fixed at 16 tokens against
guesses that grow 16 -> 64 while followed (``lookup.GuessLength``), and the large model alone without
lookup, task by task in one process so that the three share the machine's load.

    .venv/bin/python scripts/tune_guess_length.py --ids 0-22 --threads 1 \
      --out docs/results/lookup/guess-length-even.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ead_cli.bench.run import generate
from ead_cli.bench.tasks import humaneval_prompt, load_humaneval, select_tasks
from ead_cli.engine import load_runners
from ead_cli.hardware import this_cpu
from ead_cli.lookup import FIRST_GUESS, GuessLength
from ead_cli.options import GenerationOptions, ModelOptions, PolicyOptions


class FixedGuessLength(GuessLength):
    """The length before guesses grew: always ``FIRST_GUESS``."""

    def ended(self, kept: int, guessed: int) -> None:
        self.limit = FIRST_GUESS


VARIANTS = {"fixed16": (6, FixedGuessLength), "growing": (6, GuessLength), "no lookup": (0, GuessLength)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", default="0-22")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runners = load_runners(ModelOptions(small="qc0.5b", large="qc1.5b", threads=args.threads))
    generation = GenerationOptions(max_tokens=512, stop=("```",))
    samples = []
    for task in select_tasks(load_humaneval(), ids=args.ids, split="even"):
        prompt = humaneval_prompt(runners[0], task)
        for variant, (lookup, length) in VARIANTS.items():
            for runner in runners:
                runner.guess_length = length()
            started = time.perf_counter()
            policy = PolicyOptions(mode="large", lookup=lookup)
            text, summary, _ = generate(runners, policy, generation, prompt)
            wall = time.perf_counter() - started
            samples.append(
                {"task_id": task.task_id, "variant": variant, "wall_s": wall, "generated": summary.generated}
                | {"text": text}
            )
            print(task.task_id, variant, f"{wall:.2f} s", summary.generated, flush=True)
    totals = {variant: sum(s["wall_s"] for s in samples if s["variant"] == variant) for variant in VARIANTS}
    ratios = {variant: total / totals["no lookup"] for variant, total in totals.items()}
    texts = {variant: [s["text"] for s in samples if s["variant"] == variant] for variant in VARIANTS}
    same = sum(a == b for a, b in zip(texts["fixed16"], texts["growing"], strict=True))
    tasks = len(texts["growing"])
    report = {"cpu": this_cpu()[0], "threads": args.threads, "ids": args.ids, "wall_vs_no_lookup": ratios}
    report |= {"same_text_fixed_vs_growing": same, "tasks": tasks, "samples": samples}
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print({variant: round(ratio, 3) for variant, ratio in ratios.items()}, f"same text {same}/{tasks}")


if __name__ == "__main__":
    main()
