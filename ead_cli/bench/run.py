"""Running a bench: every strategy on every item, recorded as it goes.

Timing. Models load once; every strategy runs over the same runners, and each sample starts with empty
KV caches, so every strategy pays its own prefill. One warm-up prefill per model before the first sample
pages the weights in. Samples run task by task (every strategy on a task, then the next task), so an
interrupted bench leaves comparable partial results.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

from ..decoder import Summary
from ..engine import build_decoder, close_all, load_runners, model_refs, runnable_policy
from ..errors import EadError, shown_path
from ..options import (
    SAMPLE_TIMEOUT_S,
    GenerationOptions,
    ModelOptions,
    PolicyOptions,
    check_max_tokens,
    check_timeout,
)
from ..paths import check_can_save, lookup
from ..registry import is_remote
from ..runner import Runner, warm_up
from ..sampling import SamplingParams
from .grid import NativeOptions, Strategy
from .native import NativePeers, check_peers
from .replay import REPLAY_FILE
from .report import aggregate_read, check_report_files
from .results import (
    RESULTS_FILE,
    HeldResults,
    Record,
    Results,
    check_model_files,
    check_setup,
    config_record,
    held_results,
    read_results,
    setup_record,
)
from .sandbox import check_solution, sandbox_note
from .schedule import ScheduleRecorder, Step
from .tasks import (
    PREFILL,
    STOP,
    USER_MESSAGE,
    Item,
    Task,
    completion_code,
    humaneval_items,
    humaneval_path,
    prompt_items,
    read_prompts,
)


def generate(
    runners: Sequence[Runner], policy: PolicyOptions, generation: GenerationOptions, prompt: Sequence[int]
) -> tuple[str, Summary, list[Step] | None]:
    """One sample from empty caches, so every strategy pays its own prefill; with its schedule (None
    when a model is remote)."""
    for runner in runners:
        runner.truncate(0)
    decoder = build_decoder(runners, policy, generation, entropy="needed")  # a record keeps no entropies
    with ScheduleRecorder(runners) as recorder:
        response = decoder.generate(prompt)
        text = response.text()
    return text, response.summary(), recorder.steps


_MODEL_STATIC = ("role", "path", "params")  # the same in every sample: in the config record


def sample_record(
    strategy: Strategy, task_id: str, summary: Summary, text: str, schedule: list[Step] | None = None
) -> Record:
    """Every figure of the summary (new Summary/ModelReport fields included) and the schedule, not yet
    judged."""
    figures = {f.name: getattr(summary, f.name) for f in fields(summary) if f.name != "models"}
    figures.setdefault("acceptance_rate", None)
    models = {
        report.role: {f.name: getattr(report, f.name) for f in fields(report) if f.name not in _MODEL_STATIC}
        for report in summary.models
    }
    return {
        "type": "sample",
        "strategy": strategy.name,
        "params": json.loads(json.dumps(asdict(strategy.policy))),  # as stored: tuples become lists
        "task_id": task_id,
        "passed": None,
        "outcome": None,
        "error": None,
        **figures,
        "models": models,
        "text": text,
        "code": None,
        "schedule": schedule,
    }


def run_plan(
    runners: Sequence[Runner],
    plan: Iterable[tuple[Strategy, Item]],
    generation: GenerationOptions,
    results: Results,
    *,
    timeout_s: float = SAMPLE_TIMEOUT_S,
    peers: NativePeers | None = None,
) -> Iterator[Record]:
    """Generate (and for HumanEval, check) each planned sample, appending its record as it finishes.
    Server strategies run on ``peers``: no schedule (no llama.cpp call of ours to replay), the
    server's own timings in ``server``."""
    for strategy, item in plan:
        if isinstance(strategy.policy, NativeOptions):
            if peers is None:
                raise EadError(f"{strategy.name} needs the bench's llama-servers")
            text, summary, server = peers.generate(strategy.policy, item.prompt)
            record = sample_record(strategy, item.task_id, summary, text) | {"server": server}
        else:
            text, summary, schedule = generate(runners, strategy.policy, generation, item.prompt)
            record = sample_record(strategy, item.task_id, summary, text, schedule)
        if item.task is not None:
            code = completion_code(item.task, text)
            outcome = check_solution(item.task, code, timeout_s=timeout_s)
            record |= {
                "passed": outcome.passed,
                "outcome": outcome.status,
                "error": outcome.error,
                "code": code,
            }
        results.append(record)
        yield record


@dataclass(frozen=True)
class Bench:
    """One bench: strategies, generation options, the items (made once the tokenizer is loaded), the
    task file (hashed into the config) and the prompt format, the folder the results go to, and a note
    shown before the first sample runs (the sandbox's, where its programs run as root). ``held``: its
    results file, locked by ``hold_out`` as the bench is made and held until ``run_bench`` ends (it runs
    once)."""

    name: str
    strategies: Sequence[Strategy]
    generation: GenerationOptions
    items_for: Callable[[Sequence[Runner]], list[Item]]
    source_sha256: str
    prompt_format: dict[str, Any]
    out: Path
    held: HeldResults = field(repr=False, compare=False)
    timeout_s: float = SAMPLE_TIMEOUT_S
    note: str | None = None

    @property
    def runs_servers(self) -> bool:
        """Whether a strategy is one of llama.cpp's own loops, in a llama-server (``native.py``)."""
        return any(isinstance(strategy.policy, NativeOptions) for strategy in self.strategies)


def hold_out(out: Path, setup: Record) -> HeldResults:
    """Refused before any model loads: an --out that cannot take results, or whose results are of another
    ``setup`` (``setup_record``). Its results file, made empty in a new --out, is locked from now
    (``check_resumable``): the last check, so that no refusal after it leaves the file locked."""
    # a replay's own folder: results.jsonl beside it would make the replay unreportable; beside results
    # (where bench replay writes by default) it is no bar to resuming them
    if lookup(out / REPLAY_FILE) is not None and lookup(out / RESULTS_FILE) is None:
        raise EadError(f"{shown_path(out)} holds a replay ({REPLAY_FILE}): use another --out", exit_code=2)
    check_can_save(out / RESULTS_FILE, "the results", exit_code=2)
    check_report_files(out)
    return check_resumable(out / RESULTS_FILE, setup)


def check_resumable(path: Path, setup: Record) -> HeldResults:
    """The results a resume would add to read back as the report reads them: a record edited or damaged
    past reading is one line naming the file now, not a traceback as the models load or after every new
    sample has run; results of another ``setup``, and a file that cannot take more (read-only) or that
    another bench is writing, are one line now, not once the models have loaded (a FIFO, a folder or a
    device there: ``read_results``). The file, made empty where there is none, is held locked from now
    into the bench's ``Results``, so that a second bench on the same --out, a first run's too, is refused
    before its models load (a filesystem without locks: warned of as they open); a bench that ends before
    it writes its config takes an empty file away (``HeldResults.close``)."""
    stored, records = read_results(path)
    if stored is not None:
        check_setup(path, setup, {key: stored.get(key) for key in setup})
    aggregate_read(path, records)
    return replace(held_results(path), stored=stored)


def humaneval_bench(
    tasks: Sequence[Task],
    strategies: Sequence[Strategy],
    *,
    sampling: SamplingParams,
    max_tokens: int,
    out: Path,
    timeout_s: float = SAMPLE_TIMEOUT_S,
) -> Bench:
    """Checked before the models load: a time limit the sandbox refuses, answers of no tokens, --out."""
    check_timeout(timeout_s, "--timeout")  # not mid-bench in the sandbox
    check_max_tokens(max_tokens)  # before the options, which take -1 (no limit): answers are measured
    generation = GenerationOptions(sampling, max_tokens, (STOP,))
    note = sandbox_note()  # decided now, before the models load: whom the programs will run as
    return held_bench(
        "humaneval",
        strategies,
        generation,
        partial(humaneval_items, tasks=tasks),
        hashlib.sha256(humaneval_path().read_bytes()).hexdigest(),
        {"user": USER_MESSAGE, "prefill": PREFILL},
        out,
        timeout_s,
        note,
    )


def prompts_bench(
    path: Path,
    strategies: Sequence[Strategy],
    *,
    limit: int | None = None,
    sampling: SamplingParams,
    max_tokens: int,
    out: Path,
) -> Bench:
    """Checked before the models load: the prompts file (read once), answers of no tokens, --out."""
    prompts, source_sha256 = read_prompts(path, limit)
    generation = GenerationOptions(sampling, max_tokens)
    check_max_tokens(max_tokens)
    return held_bench(
        "prompts",
        strategies,
        generation,
        partial(prompt_items, prompts=prompts),
        source_sha256,
        {"chat_template": True},
        out,
    )


def held_bench(
    name: str,
    strategies: Sequence[Strategy],
    generation: GenerationOptions,
    items_for: Callable[[Sequence[Runner]], list[Item]],
    source_sha256: str,
    prompt_format: dict[str, Any],
    out: Path,
    timeout_s: float = SAMPLE_TIMEOUT_S,
    note: str | None = None,
) -> Bench:
    """A ``Bench`` of these fields, its --out checked and its results held (``hold_out``) against the setup
    they give."""
    setup = setup_record(name, generation, source_sha256, prompt_format, timeout_s)
    held = hold_out(out, setup)
    return Bench(
        name, strategies, generation, items_for, source_sha256, prompt_format, out, held, timeout_s, note
    )


Plan = Sequence[tuple[Strategy, Item]]


def check_strategies(bench: Bench, models: ModelOptions) -> None:
    """Refuse, before any model loads (and not after hours of samples), a strategy that cannot run on
    ``models``: known from the models as given (how many, which are on a llama-server), as ``--temp`` and
    the built llama-server for the server strategies (``check_peers``)."""
    refs = model_refs(models)
    served = refs[-1] if is_remote(refs[-1]) else None
    for strategy in bench.strategies:
        if isinstance(strategy.policy, PolicyOptions):
            runnable_policy(strategy.policy, len(refs), served)
    if bench.runs_servers:
        check_peers(bench.generation, refs)


def run_bench(
    bench: Bench,
    models: ModelOptions,
    *,
    watch: Callable[[Plan, Iterator[Record]], None],
    progress: Callable[[str], None] | None = None,
) -> list[Record]:
    """Load the models once, run what the results file lacks, return every sample record the file holds:
    the folder's report is of them all (as ``bench report`` of it), not of this run's tasks and strategies
    alone, which had left it disagreeing with the file and a strategy added to it without its large-only.

    What needs no model loaded is refused before any loads (``check_strategies``, the results'
    ``check_model_files``); the tokenizers' match, the prompts' fit in the context (their tokens) and the
    rest of the results' setup (``Results``) once they have.

    ``watch`` gets the plan (the samples still to run, task by task) and the iterator that runs them
    (one record per finished sample); it must exhaust the iterator (showing progress as it goes).
    """
    # the check's lock let go where the bench ends before its results open (Results close it otherwise)
    with contextlib.closing(bench.held):
        check_strategies(bench, models)
        check_files = partial(check_model_files, bench.held, models=models)
        runners = load_runners(models, progress=progress, before_load=check_files)
        try:
            items = bench.items_for(runners)
            config = config_record(
                bench.name,
                runners,
                bench.generation,
                bench.source_sha256,
                bench.prompt_format,
                bench.timeout_s,
                models=models,
            )
            servers = NativePeers(runners, bench.generation) if bench.runs_servers else None
            with (
                servers or contextlib.nullcontext(),
                Results(bench.out / RESULTS_FILE, config, bench.held) as results,
            ):
                if results.unlocked is not None and progress is not None:
                    progress(results.unlocked)
                plan = results.pending(bench.strategies, items)
                # a bench refused says that alone
                if plan and bench.note is not None and progress is not None:
                    progress(bench.note)
                if plan:
                    warm_up(runners, plan[0][1].prompt)
                samples = run_plan(
                    runners, plan, bench.generation, results, timeout_s=bench.timeout_s, peers=servers
                )
                watch(plan, samples)
                return results.records
        finally:
            close_all(runners)
