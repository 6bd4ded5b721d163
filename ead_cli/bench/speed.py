"""``ead bench speed``: this machine's decode and prefill rates for a pair, and where switching pays.

Switching writes most tokens with the small model, but the large model must still read every one of
them (its catch-up, a prefill in batches) before it can judge or write the next. So per token:

    time/token ~ (1 - f) (1/d_small + 1/p_large) + f (1/d_large + 1/p_small)

with f the large model's share, d a model's decode rate and p its prefill rate *at the batch size the
schedule gives it*: catch-up batches are about 1/f tokens long (the small tokens since the large model
last read), and a CPU's matrix kernels change speed with the batch size (on a 2-core x86 machine,
batches under 16 tokens ran at ~1.5x the decode rate, 16 and more at ~2.8x). Against the large model
alone (1/d_large per token) that gives the speed-up at each share and the share below which switching
is faster at all; where even f = 0 costs more than the large model's own decode
(1/d_small + 1/p_large >= 1/d_large), it never is. The rates are measured here, at a realistic context
length; a replay's batch counts (replay.py) can be priced with them to check the model against a
measured wall-clock. A whole answer also pays its prompt: both models read it (the pair) against the
large model alone, which moves the break-even of short answers (``answer_seconds``).

Rates should not fall as batches grow: a size timed slower per token than a smaller one (by more than
5%) is timed again, keeping its fastest timing (a busy machine only ever slows a timing down); sizes
still out of order are reported, since some CPUs' kernels really do change speed at a size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from ..engine import close_all, load_runners
from ..errors import EadError, shown_path
from ..gguf_files import shard_paths
from ..hardware import machine_record, repack_choice
from ..options import ModelOptions
from ..paths import same_file
from ..prompt import context_size
from ..runner import Runner
from .replay import read_report, replay_file, replayed_models

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
SHARES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
CATCHUP_LIMIT = 512  # the largest catch-up batch the cost model prices (Runner's n_batch)
DECODE_STEPS = 8  # one-token decodes timed for the decode rate
MIN_TIMED_S = 0.25  # a batch size is timed again until this much time was measured (at most 5 times)
MONOTONE_TOLERANCE = 0.05  # a bigger batch this much slower per token than a smaller one is out of order
ROUNDS = 2  # timings of every size, the fastest kept: the decode rate moved by a third between runs
EXTRA_ROUNDS = 3  # re-timings of the sizes out of order
# A HumanEval answer by the demo pair's 1.5B: median prompt and answer tokens over the 82 odd ids.
PROMPT_TOKENS = 183
ANSWER_TOKENS = 186
FILLER = "def mean(values):\n    return sum(values) / len(values)  # any text: speed does not depend on it\n"


@dataclass(frozen=True)
class Rates:
    """Tokens per second of one model by batch size (1: decode), after ``context`` tokens."""

    model: str
    params: int
    context: int
    tokens_per_s: dict[int, float]
    out_of_order: tuple[int, ...] = ()  # sizes still slower per token than a smaller one (see falls)

    def seconds(self, size: int) -> float:
        """Time for one batch of ``size`` tokens: per-token time interpolated in log2(size) between the
        measured sizes, flat beyond the largest."""
        sizes = sorted(self.tokens_per_s)
        per_token = [1.0 / self.tokens_per_s[s] for s in sizes]
        if size <= sizes[0]:
            return size * per_token[0]
        for (low, t_low), (high, t_high) in zip(
            zip(sizes, per_token, strict=True), zip(sizes[1:], per_token[1:], strict=True), strict=False
        ):
            if size <= high:
                weight = (math.log2(size) - math.log2(low)) / (math.log2(high) - math.log2(low))
                return size * (t_low + weight * (t_high - t_low))
        return size * per_token[-1]

    @property
    def decode(self) -> float:
        return self.tokens_per_s[1]

    def prefill(self, size: int) -> float:
        """Tokens per second in batches of ``size``."""
        return size / self.seconds(size)


def check_context(context: int, n_ctx: int) -> None:
    largest = context + max(BATCH_SIZES, default=1) + DECODE_STEPS
    if context < 1 or largest > n_ctx:
        raise ValueError(f"--context must be in [1, {n_ctx - largest + context}], got {context}")


def measure(runner: Runner, *, context: int = 256) -> Rates:
    """Decode and prefill rates at ``context`` tokens of cache: each batch size is fed after the
    context and rolled back, once to warm up, then timed until ``MIN_TIMED_S``, in ``ROUNDS`` rounds;
    sizes out of order are timed again (up to ``EXTRA_ROUNDS``); each keeps its fastest rate. Sizes up to
    the runner's batch (--batch-size) alone: a larger one runs as several, priced flat past the largest."""
    check_context(context, runner.n_ctx)
    tokens = filler_tokens(runner, context + max(max(BATCH_SIZES), DECODE_STEPS))
    runner.truncate(0)
    runner.feed(tokens, 0, context, "prefill")
    sizes = [size for size in BATCH_SIZES if size <= runner.n_batch]  # a larger one runs as several
    rates = {size: max(batch_rate(runner, tokens, context, size) for _ in range(ROUNDS)) for size in sizes}
    for _ in range(EXTRA_ROUNDS):
        for size in falls(rates):
            rates[size] = max(rates[size], batch_rate(runner, tokens, context, size))
    runner.truncate(0)
    return Rates(runner.label, runner.n_params, context, rates, tuple(falls(rates)))


def filler_tokens(runner: Runner, count: int) -> list[int]:
    """``count`` tokens of ``FILLER`` repeated, to time batches with."""
    text = runner.tokenize(FILLER, add_special=False)
    return (text * (count // len(text) + 1))[:count]


def batch_rate(runner: Runner, tokens: Sequence[int], context: int, size: int, rows: int = 1) -> float:
    """Tokens per second of batches of ``size`` after ``context`` tokens (a warm-up batch first), with
    logits at the last ``rows`` rows: one for a catch-up, every row for a lookup guess being checked."""
    steps = DECODE_STEPS if size == 1 else 1
    timed, fed = 0.0, 0
    for attempt in range(6):
        began = perf_counter()
        for step in range(steps):
            runner.feed(tokens, context + step * size, context + (step + 1) * size, "catchup", rows=rows)
        elapsed = perf_counter() - began
        runner.truncate(context)
        if attempt == 0:
            continue  # warm-up: the first batch of a new shape pays for buffers
        timed, fed = timed + elapsed, fed + steps * size
        if timed >= MIN_TIMED_S:
            break
    return fed / timed


def falls(tokens_per_s: Mapping[int, float]) -> list[int]:
    """Batch sizes whose rate is more than ``MONOTONE_TOLERANCE`` below that of a smaller size."""
    fallen, best = [], 0.0
    for size in sorted(tokens_per_s):
        if tokens_per_s[size] < best * (1 - MONOTONE_TOLERANCE):
            fallen.append(size)
        best = max(best, tokens_per_s[size])
    return fallen


def catchup_batch(share: float) -> int:
    """The large model's catch-up batch at a large share f: the ~1/f tokens since it last read."""
    return max(1, min(CATCHUP_LIMIT, round(1.0 / share))) if share > 0 else CATCHUP_LIMIT


def seconds_per_token(small: Rates, large: Rates, share: float) -> float:
    """The cost model: (1 - f)(1/d_small + 1/p_large) + f(1/d_large + 1/p_small)."""
    batch = catchup_batch(share)
    p_large = large.prefill(batch)
    return (1 - share) * (1 / small.decode + 1 / p_large) + share * (1 / large.decode + 1 / small.prefill(1))


def break_even(small: Rates, large: Rates) -> float | None:
    """The largest share (to 0.1%) at which switching is still faster than the large model alone;
    None if it never is."""
    alone = 1 / large.decode
    faster = [f / 1000 for f in range(0, 1001) if seconds_per_token(small, large, f / 1000) < alone]
    return max(faster) if faster else None


def answer_seconds(small: Rates, large: Rates, share: float | None) -> float:
    """A whole answer: the prompt (``PROMPT_TOKENS``) read by each model that takes part, then
    ``ANSWER_TOKENS`` tokens at ``share`` (None: the large model alone, decoding every token)."""
    reads = large.seconds(PROMPT_TOKENS)
    if share is None:
        return reads + ANSWER_TOKENS / large.decode
    return reads + small.seconds(PROMPT_TOKENS) + ANSWER_TOKENS * seconds_per_token(small, large, share)


@dataclass(frozen=True)
class Expectation:
    share: float
    catchup_batch: int
    seconds_per_token: float
    speedup: float  # against the large model alone, per generated token
    answer_speedup: float  # the same for a whole answer, prompt included (PROMPT_TOKENS, ANSWER_TOKENS)


def expectations(small: Rates, large: Rates) -> list[Expectation]:
    alone = 1 / large.decode
    answer_alone = answer_seconds(small, large, None)
    return [
        Expectation(f, catchup_batch(f), t, alone / t, answer_alone / answer_seconds(small, large, f))
        for f in SHARES
        for t in (seconds_per_token(small, large, f),)
    ]


def price_batches(batches: Mapping[str, Mapping[str, Mapping[Any, int]]], rates: Sequence[Rates]) -> float:
    """Seconds a schedule's batches cost at these rates (roles in order, smallest first)."""
    total = 0.0
    for role_rates, phases in zip(rates, batches.values(), strict=True):
        for sizes in phases.values():
            total += sum(count * role_rates.seconds(int(size)) for size, count in sizes.items())
    return total


@dataclass(frozen=True)
class Check:
    """A replayed strategy: its measured wall-clock against the cost model's two predictions."""

    strategy: str
    large_share: float
    generated: int
    measured_s: float
    priced_s: float  # its recorded batches at the measured rates
    formula_s: float  # the cost model at its large share
    measured_rel: float | None  # against the large-only replay
    formula_rel: float | None


def formula_seconds(row: Mapping[str, Any], small: Rates, large: Rates) -> float:
    """The cost model's price of a replayed strategy. One whose small model read nothing (large-only,
    with or without lookup) is the large model alone, decoding every token, as ``expectations`` prices
    it: the formula at a share of 1 would charge the small model a read of every token it never made."""
    small_batches = next(iter(row["batches"].values()))
    if not any(small_batches.values()):
        return row["generated"] / large.decode
    return row["generated"] * seconds_per_token(small, large, row["large_share"])


def check_replay(replay: Mapping[str, Any], small: Rates, large: Rates) -> list[Check]:
    """Predicted against measured for every strategy of a replay report (replay.json)."""
    rows = replay["strategies"]
    reference = next((row for row in rows if row["strategy"] == "large-only"), None)
    # no ratio to a large-only of no tokens (priced 0 s), as to none at all
    reference_s = formula_seconds(reference, small, large) if reference else 0.0
    checks = []
    for row in rows:
        formula = formula_seconds(row, small, large)
        checks.append(
            Check(
                strategy=row["strategy"],
                large_share=row["large_share"],
                generated=row["generated"],
                measured_s=row["wall_s"],
                priced_s=price_batches(row["batches"], (small, large)),
                formula_s=formula,
                measured_rel=row["wall_rel"],
                formula_rel=formula / reference_s if reference_s else None,
            )
        )
    return checks


def verdict(small: Rates, large: Rates) -> str:
    """One line: where switching pays on this machine, or why it never does."""
    floor = 1 / small.decode + 1 / large.prefill(512)
    alone = 1 / large.decode
    even = break_even(small, large)
    if even is None:
        return (
            f"switching never beats {large.model} alone here: even with no large tokens, the small model's "
            f"decode plus the large model's catch-up cost {floor * 1000:.1f} ms/token against "
            f"{alone * 1000:.1f} ms for its own decode (its prefill is only "
            f"{large.prefill(512) / large.decode:.1f}x its decode rate)"
        )
    return (
        f"switching beats {large.model} alone below a {even:.1%} large share; at 0% it would be "
        f"{alone / floor:.2f}x faster"
    )


def measure_pair(
    runners: Sequence[Runner], context: int, progress: Callable[[str], None] | None = None
) -> list[Rates]:
    rates = []
    for runner in runners:
        if progress is not None:
            progress(f"measuring {runner.label}…")
        rates.append(measure(runner, context=context))
    return rates


@dataclass(frozen=True)
class SpeedReport:
    rates: list[Rates]
    expectations: list[Expectation]
    break_even: float | None
    verdict: str
    checks: list[Check] | None  # with a replay report to check the cost model against
    machine: dict[str, Any]  # where the rates were measured (hardware.machine_record)
    threads: dict[str, int]  # with how many threads: a decode's (--threads), a batch's (--threads-batch)

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))


def speed_report(
    model_options: ModelOptions,
    *,
    context: int = 256,
    replay_path: Path | None = None,
    json_out: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> SpeedReport:
    """Measure a pair's rates here; the cost model's expectations; with a replay.json, its check.
    ``json_out``, where the figures will go, is checked to be none of the files read."""
    replay_report = read_replay(replay_path) if replay_path is not None else None
    runners = load_runners(model_options, progress=progress, local_only=True)
    try:
        if len(runners) != 2:
            raise EadError("ead bench speed measures a pair of local models: give --small and --large", 2)
        try:
            check_context(context, context_size(runners))
        except ValueError as error:
            raise EadError(str(error), exit_code=2) from None
        if replay_report is not None and replay_path is not None:
            check_replayed_models(replay_path, replay_report, runners)
        if json_out is not None:
            read = [shard for runner in runners for shard in shard_paths(runner.path)]
            check_not_read(json_out, [*read, *([replay_file(replay_path)] if replay_path else [])])
        small, large = measure_pair(runners, context, progress)
        threads = {"decode": runners[0].n_threads, "batch": runners[0].n_threads_batch}
    finally:
        close_all(runners)
    checks = check_replay(replay_report, small, large) if replay_report is not None else None
    return SpeedReport(
        [small, large],
        expectations(small, large),
        break_even(small, large),
        verdict(small, large),
        checks,
        machine_record(repack_choice(model_options.repack)),
        threads,
    )


def check_replayed_models(path: Path, report: Mapping[str, Any], runners: Sequence[Runner]) -> None:
    """A replay is checked against the rates of the models it ran on (file name and size, as its record
    says): other models' rates had priced its batches beside its wall-clock, a comparison of nothing."""
    replayed = replayed_models(report)
    if replayed is None:
        return  # a hand-made report that names no models: nothing to hold the pair to
    measured = [(runner.label, runner.file_bytes) for runner in runners]
    if replayed != measured:
        file = replay_file(path)
        sized = [name for name, _ in replayed] == [name for name, _ in measured]  # another file, same name
        names, given = (
            " and ".join(f"{name} ({size} bytes)" if sized else str(name) for name, size in pair)
            for pair in (replayed, measured)
        )
        raise EadError(
            f"{shown_path(file)} is a replay on {names}, not {given}: check it with the models it ran on", 2
        )


def check_not_read(out: Path, read: Sequence[Path]) -> None:
    """--json naming a model or the replay checked would replace it with the figures: refused."""
    if any(same_file(out, path) for path in read):
        raise EadError(
            f"--json {shown_path(out)} is a file ead bench speed reads: write the figures to another", 2
        )


def read_replay(path: Path) -> dict[str, Any]:
    """A replay report (replay.json, or the folder holding it) of a pair: what the cost model prices."""
    report, strategies = read_report(path)
    if any(len(row.batches) != 2 for row in strategies):
        raise EadError(
            f"{shown_path(path)} is a replay of {len(strategies[0].batches)} models, not of a pair", 2
        )
    return report
