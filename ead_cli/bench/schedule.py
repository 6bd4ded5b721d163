"""Recorded schedules: every call a generation made into llama.cpp, in order, enough to run it again.

Decode and prefill time depend on shapes and batch sizes, not on the weights' values, so a schedule
recorded with one pair of models can be re-executed on any models of the same tokenizer (other sizes,
random-weight twins, another machine) with the tokens forced: the policy and the sampler are replaced
by the record, every llama.cpp batch is paid again, and the wall-clock says what that strategy would
cost there. A schedule is a list of steps, each one a JSON array:

* ``[model, "p" | "d" | "c", start, tokens, rows]``: model ``model`` (0 = smallest) read ``tokens`` at
  positions ``start``… as prefill, decode or catch-up, with logits for the last ``rows``; consecutive
  one-token decodes of one model are merged into one ``"d"`` step (one llama_decode per token);
* ``[model, "t", n]``: model ``model`` dropped every position from ``n`` on (a rollback).

A replay computes, after every batch, what the loops compute from its logits (the entropy and the
argmax of the last row; the maximum of each row of a multi-row batch), so the Python work per step is
paid too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np

from ..runner import Phase, Runner, RunnerStats

Step = list[Any]
PHASE_CODES: dict[str, Phase] = {"p": "prefill", "d": "decode", "c": "catchup"}


class ScheduleRecorder:
    """Records the steps of the local runners it is attached to, while attached (a ``with`` block).

    A remote runner has no llama.cpp calls to record: with one among the runners, ``steps`` is None.
    """

    def __init__(self, runners: Sequence[Runner]) -> None:
        self.runners = tuple(runners)
        self._steps: list[Step] = []
        self.complete = all(hasattr(runner, "on_step") for runner in self.runners)

    def __enter__(self) -> ScheduleRecorder:
        for index, runner in enumerate(self.runners):
            if hasattr(runner, "on_step"):
                runner.on_step = lambda step, index=index: self._record(index, step)
        return self

    def __exit__(self, *exc: object) -> None:
        for runner in self.runners:
            if hasattr(runner, "on_step"):
                runner.on_step = None

    @property
    def steps(self) -> list[Step] | None:
        return self._steps if self.complete else None

    def _record(self, model: int, step: Step) -> None:
        code = step[0]
        if code == "t":
            self._steps.append([model, "t", step[1]])
            return
        _, start, tokens, rows = step
        last = self._steps[-1] if self._steps else None
        if (
            code == "d"
            and len(tokens) == 1
            and last is not None
            and last[:2] == [model, "d"]
            and last[2] + len(last[3]) == start
        ):
            last[3].append(tokens[0])
            return
        self._steps.append([model, code, start, tokens, rows])


class ScheduleError(ValueError):
    """A schedule that is not one: wrong shapes, unknown codes, models it does not have."""


def check_schedule(steps: Any, models: int) -> list[Step]:
    """The steps, if every one is well formed for ``models`` models (a results file may be edited), each
    feed starting where its model's tokens end: a gap had been an IndexError in the replay, an overlap
    llama.cpp's failure to decode."""
    if not isinstance(steps, list):
        raise ScheduleError("the schedule is not a list of steps")
    read = [0] * models  # each model's tokens so far
    for number, step in enumerate(steps):
        ok = isinstance(step, list) and len(step) >= 3 and isinstance(step[0], int) and 0 <= step[0] < models
        if ok and step[1] == "t":
            ok = len(step) == 3 and isinstance(step[2], int) and step[2] >= 0
        elif ok and step[1] in PHASE_CODES:
            ok = (
                len(step) == 5
                and isinstance(step[2], int)
                and step[2] >= 0
                and isinstance(step[3], list)
                and len(step[3]) > 0
                and all(isinstance(token, int) and token >= 0 for token in step[3])
                and isinstance(step[4], int)
                and 1 <= step[4] <= len(step[3])
            )
        else:
            ok = False
        if not ok:
            raise ScheduleError(f"step {number} is malformed: {str(step)[:80]}")
        model = step[0]
        if step[1] == "t":
            read[model] = min(read[model], step[2])
            continue
        if step[2] != read[model]:
            where = f"where model {model} has read {read[model]} tokens"
            raise ScheduleError(f"step {number} starts at position {step[2]}, {where}")
        read[model] += len(step[3])
    return steps


@dataclass
class BatchCounts:
    """How many llama.cpp batches of each size a model ran, per phase (what a cost model prices)."""

    sizes: dict[str, dict[int, int]] = field(default_factory=dict)

    def add(self, phase: Phase, size: int, count: int = 1) -> None:
        per_phase = self.sizes.setdefault(phase, {})
        per_phase[size] = per_phase.get(size, 0) + count

    def merge(self, other: BatchCounts) -> None:
        for phase, sizes in other.sizes.items():
            for size, count in sizes.items():
                self.add(phase, size, count)  # type: ignore[arg-type]


def batch_counts(steps: Sequence[Step], models: int, n_batch: int) -> list[BatchCounts]:
    """Per model, the batches a schedule runs (a feed longer than ``n_batch`` runs as several)."""
    counts = [BatchCounts() for _ in range(models)]
    for step in steps:
        model, code = step[0], step[1]
        if code == "t":
            continue
        tokens = step[3]
        if code == "d":
            counts[model].add("decode", 1, len(tokens))
            continue
        full, rest = divmod(len(tokens), n_batch)
        if full:
            counts[model].add(PHASE_CODES[code], n_batch, full)
        if rest:
            counts[model].add(PHASE_CODES[code], rest)
    return counts


def replay(runners: Sequence[Runner], steps: Sequence[Step]) -> tuple[float, list[RunnerStats]]:
    """Re-execute a schedule from empty caches on these runners; return its wall-clock seconds and
    what each runner did (the token counts equal the recorded ones by construction, on any models)."""
    for runner in runners:
        runner.truncate(0)
        runner.stats = RunnerStats.empty()
    sequences: list[list[int]] = [[] for _ in runners]
    # Where the prompt ends: the model evaluated first reads all of it as prefill. A catch-up step that
    # starts inside it (a draft checked from the prompt's last token) counts that part as prefill, as live.
    prompt_len = max((step[2] + len(step[3]) for step in steps if step[1] == "p"), default=0)
    began = perf_counter()
    for step in steps:
        runner, tokens = runners[step[0]], sequences[step[0]]
        code = step[1]
        if code == "t":
            runner.truncate(step[2])
            continue
        start, fed, rows = step[2], step[3], step[4]
        del tokens[start:]
        tokens.extend(fed)
        if code == "d":
            for position in range(start, start + len(fed)):
                runner.feed(tokens, position, position + 1, "decode")
                _read_row(runner)
            continue
        runner.feed(tokens, start, start + len(fed), PHASE_CODES[code], rows=rows, prompt_len=prompt_len)
        if rows == 1:
            _read_row(runner)
        else:
            _read_rows(runner, rows)
    elapsed = perf_counter() - began
    return elapsed, [runner.stats for runner in runners]


def _read_row(runner: Runner) -> None:
    """What a loop does with a step's logits: the entropy and the greedy choice."""
    logits = runner.logits()
    runner.entropy(logits)
    int(np.argmax(logits))


def _read_rows(runner: Runner, rows: int) -> None:
    """What a check does with a batch's rows: each row's top logit, and the last row's entropy."""
    view = runner.rows(rows)
    view.max(axis=1)
    runner.entropy(view[-1])
