#!/usr/bin/env python3
"""How prompt-lookup guesses (``--lookup``) would fare on recorded answers, before spending bench time.

Whether a guess is followed depends only on the token sequence, so it can be counted exactly on the
sequences a bench recorded (each sample's schedule holds every token a model read). For each policy
(minimum match, guess length) and each recorded one-model answer, the loop is walked as ``Runner.sync``
runs it: each read either follows the outstanding guess (a free row) or is a new batch of the read token
plus a fresh guess (or a one-token decode when lookup finds nothing). Counts are exact; seconds are a
**model**: the batches priced with the rates of an ``ead bench speed --json`` file (``Rates.seconds``),
against one decode per token. Tune on even task ids only. Beside them, llama.cpp's ngram-mod drafter,
emulated (``NgramMod``) over the same answers in bench order with one table for all, as llama-server keeps
it across requests, and priced alike: the peer's drafts, counted where its server was never run.

    .venv/bin/python scripts/lookup_sim.py docs/results/humaneval-even-native/results.jsonl \
        --speed docs/results/where-it-pays/speed-demo-pair.json --split even --out /tmp/sim.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ead_cli.bench.speed import Rates
from ead_cli.lookup import propose

MATCHES = (1, 2, 3, 4, 6, 8, 12, 16)
LIMITS = (4, 8, 15, 16, 31, 32, 47, 63)  # 15, 31, 47, 63: the read token and the guess fill 16k rows
# llama-server's ngram-mod defaults here: --spec-ngram-mod-n-match 24, -n-min 48, -n-max 64.
NGRAM_MOD = {"n_match": 24, "n_min": 48, "n_max": 64}


def sequences(path: Path, strategy: str, model: int, split: str) -> Iterator[tuple[str, list[int], int]]:
    """(task id, every token the model read, prompt length) of each sample of one strategy."""
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") != "sample" or record["strategy"] != strategy or not record.get("schedule"):
            continue
        number = int(record["task_id"].split("/")[-1])
        if split != "all" and number % 2 != (0 if split == "even" else 1):
            continue
        tokens: list[int] = []
        for step in record["schedule"]:
            if step[0] != model:
                continue
            if step[1] == "t":
                del tokens[step[2] :]
                continue
            del tokens[step[2] :]
            tokens.extend(step[3])
        yield record["task_id"], tokens, record["prompt_tokens"]


def walk(
    tokens: Sequence[int], prompt_len: int, guess: Callable[[list[int], int], list[int]], rates: Rates
) -> dict:
    """One answer read as the runner reads it with guesses: batches, guessed and followed tokens, seconds.
    ``guess(tokens so far, how many of the previous guess the text followed)`` gives the next guess."""
    remaining: list[int] = []
    guessed = kept = batches = decodes = followed = 0
    seconds = 0.0
    for i in range(prompt_len + 1, len(tokens)):  # read tokens[i - 1] to predict tokens[i]
        if remaining and remaining[0] == tokens[i - 1]:
            remaining = remaining[1:]
            kept += 1
            followed += 1
            continue
        remaining, followed = guess(list(tokens[:i]), followed), 0
        if remaining:
            batches += 1
            guessed += len(remaining)
            seconds += rates.seconds(len(remaining) + 1)
        else:
            decodes += 1
            seconds += rates.seconds(1)
    plain = max(len(tokens) - prompt_len - 1, 0) * rates.seconds(1)
    return {"guessed": guessed, "kept": kept, "batches": batches, "decodes": decodes, "seconds": seconds,
            "plain_seconds": plain}  # fmt: skip


def summed(walks: Sequence[dict]) -> dict:
    """``walk``'s counts and seconds over many answers, and the modelled time against plain decoding."""
    total = {key: sum(w[key] for w in walks) for key in walks[0]}
    return {**total, "ratio": total["seconds"] / total["plain_seconds"]}


def walk_all(
    answers: Sequence[tuple[list[int], int]], guess: Callable[[list[int], int], list[int]], rates: Rates
) -> dict:
    """``walk`` over every (tokens, prompt length) answer with one guesser, ``summed``."""
    return summed([walk(tokens, prompt_len, guess, rates) for tokens, prompt_len in answers])


def lookup_guess(min_match: int, limit: int) -> Callable[[list[int], int], list[int]]:
    """Prompt lookup as ``walk`` asks for guesses (it keeps no state)."""
    return lambda tokens, _followed: propose(tokens, min_match=min_match, limit=limit)


def trimmed_guess(min_match: int, limit: int, rows: int = 16) -> Callable[[list[int], int], list[int]]:
    """Prompt lookup with each guess of ``rows - 1`` tokens or more cut so that the read token and the
    guess fill a multiple of ``rows`` rows: the cheap sizes of ``scripts/batch_curve.py``'s sawtooth."""

    def guess(tokens: list[int], _followed: int) -> list[int]:
        found = propose(tokens, min_match=min_match, limit=limit)
        return found[: (len(found) + 1) // rows * rows - 1] if len(found) >= rows - 1 else found

    return guess


class NgramMod:
    """llama.cpp's ngram-mod drafter (common/speculative.cpp, common/ngram-mod.cpp), as llama-server runs it
    across a bench's requests: each ``n_match``-token window of the text read maps to the token that
    followed it last (a table kept from request to request); a draft chains lookups from the last
    ``n_match`` tokens and counts only at ``n_min`` tokens or more, up to ``n_max``; three drafts in a row
    with under half accepted empty the table. (llama.cpp hashes windows into 4M slots; a dict has no
    collisions.)"""

    def __init__(self, n_match: int, n_min: int, n_max: int) -> None:
        self.n_match, self.n_min, self.n_max = n_match, n_min, n_max
        self.table: dict[tuple[int, ...], int] = {}
        self.low_streak = 0
        self._added = 0  # where the next windows of the request at hand start
        self._drafted = 0  # the last draft's length (0: the last guess was none of this drafter's)

    def add(self, tokens: Sequence[int], start: int) -> int:
        """Add the windows from ``start`` that have a following token; return where the next add starts."""
        end = len(tokens) - self.n_match
        for i in range(max(start, 0), end):
            self.table[tuple(tokens[i : i + self.n_match])] = tokens[i + self.n_match]
        return max(end, start)

    def draft(self, tokens: Sequence[int]) -> list[int]:
        key = list(tokens[-self.n_match :])
        drafted: list[int] = []
        while len(drafted) < self.n_max:
            found = self.table.get(tuple(key[-self.n_match :]))
            if found is None:
                break
            drafted.append(found)
            key.append(found)
        return drafted if len(drafted) >= self.n_min else []

    def accepted(self, kept: int, drafted: int) -> None:
        self.low_streak = self.low_streak + 1 if kept < drafted / 2 else 0
        if self.low_streak >= 3:
            self.table.clear()
            self.low_streak = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request: its prompt's windows join the table (llama.cpp's ``begin``)."""
        self._added = self.add(prompt, 0)
        self._drafted = 0

    def guess(self, tokens: list[int], followed: int) -> list[int]:
        """``walk``'s guess: the last draft's acceptance told, new windows added in chunks of 32 (as
        llama.cpp adds them), then a draft."""
        if self._drafted:
            self.accepted(followed, self._drafted)
        if len(tokens) - self.n_match > self._added + 32:
            self._added = self.add(tokens, self._added)
        drafted = self.draft(tokens)
        self._drafted = len(drafted)
        return drafted

    def end(self, tokens: Sequence[int]) -> None:
        """The request's answer: its remaining windows join the table."""
        self.add(tokens, self._added)


def walk_ngram_mod(
    answers: Sequence[tuple[list[int], int]],
    rates: Rates,
    drafter: NgramMod,
    *,
    lookup: tuple[int, int] | None = None,
    one_table: bool = True,
) -> dict:
    """The answers in bench order through one drafter (as one llama-server serves a bench's tasks),
    each walked as ``walk`` walks prompt lookup. ``lookup`` (min match, limit): where the drafter has no
    draft, a prompt-lookup guess (the two stacked); ``one_table`` False: emptied for each answer."""
    fallback = lookup_guess(*lookup) if lookup is not None else None

    def guess(tokens: list[int], followed: int) -> list[int]:
        drafted = drafter.guess(tokens, followed)
        return drafted or (fallback(tokens, followed) if fallback is not None else [])

    walks = []
    for tokens, prompt_len in answers:
        if not one_table:
            drafter.table.clear()
        drafter.begin(tokens[:prompt_len])
        walks.append(walk(tokens, prompt_len, guess, rates))
        drafter.end(tokens)
    return summed(walks)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--speed", type=Path, required=True,
                        help="an ead bench speed --json file, or scripts/batch_curve.py's")  # fmt: skip
    parser.add_argument("--strategy", default="large-only")
    parser.add_argument("--model", type=int, default=1, help="schedule index: 0 small, 1 large")
    parser.add_argument("--split", choices=("even", "odd", "all"), default="even")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    measured = json.loads(args.speed.read_text())["rates"]
    speed = measured[args.model] if len(measured) > 1 else measured[0]  # scripts/batch_curve.py: one model
    rates = Rates(speed["model"], speed["params"], speed["context"],
                  {int(size): rate for size, rate in speed["tokens_per_s"].items()})  # fmt: skip
    answers = {task: (tokens, n) for path in args.results for task, tokens, n in
               sequences(path, args.strategy, args.model, args.split)}  # fmt: skip
    rows = []
    for min_match, limit in itertools.product(MATCHES, LIMITS):
        walked = walk_all(list(answers.values()), lookup_guess(min_match, limit), rates)
        rows.append({**walked, "min_match": min_match, "limit": limit})
    rows.sort(key=lambda row: row["ratio"])
    in_order = sorted(answers.items(), key=lambda item: int(item[0].rsplit("/", 1)[-1]))  # as a bench runs
    ordered = [answer for _, answer in in_order]
    peer = {**walk_ngram_mod(ordered, rates, NgramMod(**NGRAM_MOD)), **NGRAM_MOD}
    best = (rows[0]["min_match"], rows[0]["limit"])
    stacked = {  # ngram-mod's long drafts first, the best lookup where it has none
        f"ngram-mod then lookup {best[0]}/{best[1]}, {table}": walk_ngram_mod(
            ordered, rates, NgramMod(**NGRAM_MOD), lookup=best, one_table=table == "one table"
        )
        for table in ("one table", "a table per answer")
    }
    trimmed = {  # does cutting every guess to a cheap batch gain more than capping it there?
        f"lookup {best[0]}/{limit}, guesses cut to batches of 16k rows": walk_all(
            list(answers.values()), trimmed_guess(best[0], limit), rates
        )
        for limit in (32, 63)
    }
    report = {
        "results": [str(path) for path in args.results], "strategy": args.strategy, "split": args.split,
        "model": speed["model"], "speed": str(args.speed), "tasks": sorted(answers), "policies": rows,
        "llama_cpp_ngram_mod": peer, "stacked": stacked, "trimmed": trimmed,
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(answers)} answers of {args.strategy} ({args.split} ids), {speed['model']}")
    print("min_match  limit  guessed   kept  batches  decodes  modelled time vs one decode per token")
    for row in rows[:12]:
        counts = f"{row['guessed']:7}  {row['kept']:5}  {row['batches']:7}  {row['decodes']:7}"
        print(f"{row['min_match']:9}  {row['limit']:5}  {counts}  {row['ratio']:.3f}")
    peers = {"llama.cpp ngram-mod (emulated: match 24, drafts 48-64, one table)": peer, **stacked, **trimmed}
    for name, row in peers.items():
        counts = f"{row['guessed']:7}  {row['kept']:5}  {row['batches']:7}  {row['decodes']:7}"
        print(f"{name}: {counts}  {row['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
