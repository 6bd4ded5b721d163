"""``ead bench``: the sweep options, and the bench, replay and speed commands' tables."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..bench.grid import NGRAM_TYPES, Strategy, all_families, build_strategies, families, parse_grid
from ..errors import EadError, counted, quoted, shown_path
from ..hardware import machine_words
from ..option_table import BENCH, OPTIONS, DecodingOption, listed, on
from ..options import SAMPLE_TIMEOUT_S, ModelOptions
from ..policies import POLICY_KINDS, PolicyKind
from ..signals import Terminated
from .groups import (
    CHAT_MODEL_OPTIONS,
    LOCAL_MODEL_OPTIONS,
    MaxTokens,
    OptionGroup,
    Pattern,
    Seed,
    TauRange,
    Temp,
    given_file,
    given_path,
    show_help,
    with_options,
)
from .output import check_stdout, live_progress, print_figures, print_rows, progress_bar, say_progress, stderr

if TYPE_CHECKING:
    from ..bench.report import Aggregate
    from ..bench.results import Record
    from ..bench.run import Bench, Plan

bench_app = typer.Typer(
    help="Compare strategies on HumanEval (pass@1) or a prompt list: quality against cost and time.",
)


@bench_app.callback(invoke_without_command=True)
def _bench(context: typer.Context) -> None:
    if context.invoked_subcommand is None:  # which bench is the user's choice: the help lists them
        show_help(context)


Strategies = Annotated[
    str,
    typer.Option(
        "--strategies",
        metavar=listed("NAME"),
        help=f"Comma-separated families: {', '.join(families())} (or small-only, large-only, as reported).",
    ),
]
OLDER_TAU_SPELLING = {"ead": "--tau"}  # before each policy's thresholds had their own option


def _tau_option(kind: PolicyKind) -> tuple[str, Any, str]:
    """``--NAME-tau``: one policy's thresholds, a parameter of the sweep for each registered policy."""
    older = OLDER_TAU_SPELLING.get(kind.name)
    note = f" ({older} is the older spelling)" if older else ""
    spellings = [f"--{kind.name}-tau", *([older] if older else [])]
    option = typer.Option(
        *spellings, metavar=listed("X"), help=f"{kind.name} thresholds in bits, comma-separated{note}."
    )
    default = ",".join(f"{tau:g}" for tau in kind.swept_taus)
    return f"{_identifier(kind.name)}_tau", Annotated[str, option], default


def _identifier(name: str) -> str:
    return name.replace("-", "_")


def _sweep_option(option: DecodingOption) -> tuple[str, Any, str | None]:
    """A decoding option the bench sweeps (``option_table``'s BENCH surface): its values, comma-separated,
    under its one spelling (and any older one)."""
    declared = typer.Option(option.flag, *option.older, metavar=listed(option.placeholder), help=option.sweep)
    default = option.bench_list
    return option.name, Annotated[str if default is not None else str | None, declared], default


ServerDraftList = Annotated[
    str,
    typer.Option(
        "--server-draft", metavar=listed("N"), help="server-spec: llama.cpp's draft lengths, comma-separated."
    ),
]
ServerNgramList = Annotated[
    str,
    typer.Option(
        "--server-ngram",
        metavar=listed("NAME"),
        help=f"server-ngram: llama.cpp's n-gram types, comma-separated: {', '.join(NGRAM_TYPES)}.",
    ),
]
TasksLimit = Annotated[int | None, typer.Option(help="Run at most this many tasks.")]
PromptsLimit = Annotated[int | None, typer.Option(help="Run the file's first N prompts alone.")]


def _bench_out(default: str) -> Any:
    """--out, naming the command's own default folder (each bench's help had named both)."""
    return Annotated[
        Path | None,
        typer.Option(
            "--out", help=f"Folder for results and reports (default: {default}).", parser=given_path
        ),
    ]


HumanevalOut = _bench_out("bench-results/humaneval-SPLIT")
PromptsOut = _bench_out("bench-results/prompts-STEM, STEM the file's name without its suffix")


Sweep = list[Strategy]


def _sweep(strategies: str, pattern: list[str] | None, tau_range: str | None, **grid: str | None) -> Sweep:
    taus = {name: grid.pop(f"{_identifier(name)}_tau") for name in POLICY_KINDS}
    swept = parse_grid(taus, **grid)  # type: ignore[arg-type]
    tau_range_value = None if tau_range is None else OPTIONS["tau_range"].read(tau_range)
    shared = replace(swept, patterns=tuple(pattern or ()), tau_range=tau_range_value)
    return build_strategies(strategies, shared)


SWEEP_OPTIONS = OptionGroup(
    "sweep",
    (
        ("strategies", Strategies, all_families()),
        *(_tau_option(kind) for kind in POLICY_KINDS.values()),
        *(_sweep_option(option) for option in on(BENCH)),
        ("server_draft", ServerDraftList, "3"),
        ("server_ngram", ServerNgramList, "ngram-mod"),
        ("pattern", Pattern, None),
        ("tau_range", TauRange, None),
    ),
    _sweep,
)


@bench_app.command("humaneval")
@with_options(CHAT_MODEL_OPTIONS)
@with_options(SWEEP_OPTIONS)
def bench_humaneval(
    model_options: ModelOptions,
    sweep: Sweep,
    ids: Annotated[
        str | None, typer.Option(metavar=listed("N"), help="Task numbers, e.g. 1,3,10-20 (default: all).")
    ] = None,
    split: Annotated[
        str, typer.Option(metavar="even|odd|all", help="even (tuning thresholds), odd (reporting) or all.")
    ] = "all",
    limit: TasksLimit = None,
    max_tokens: MaxTokens = 512,
    temp: Temp = 0.0,
    seed: Seed = 0,
    timeout: Annotated[float, typer.Option(help="Seconds each solution's tests may run.")] = SAMPLE_TIMEOUT_S,
    out: HumanevalOut = None,
) -> None:
    """HumanEval pass@1 of each strategy, against its cost and wall-clock time (resumable)."""
    from ..bench.run import humaneval_bench
    from ..bench.tasks import load_humaneval, select_tasks
    from ..sampling import SamplingParams

    tasks = select_tasks(load_humaneval(), ids=ids, split=split, limit=limit)
    job = humaneval_bench(
        tasks,
        sweep,
        sampling=SamplingParams(temp=temp, seed=seed),
        max_tokens=max_tokens,
        out=out or Path("bench-results") / f"humaneval-{split}",
        timeout_s=timeout,
    )
    _run_bench(job, model_options)


@bench_app.command("prompts")
@with_options(CHAT_MODEL_OPTIONS)
@with_options(SWEEP_OPTIONS)
def bench_prompts(
    file: Annotated[
        Path,
        typer.Argument(help='Prompts, one per line, or a .jsonl file of {"prompt": ...}.', parser=given_path),
    ],
    model_options: ModelOptions,
    sweep: Sweep,
    limit: PromptsLimit = None,
    max_tokens: MaxTokens = 512,
    temp: Temp = 0.0,
    seed: Seed = 0,
    out: PromptsOut = None,
) -> None:
    """Each strategy's agreement with the large model's text, against its cost and time (resumable)."""
    from ..bench.run import prompts_bench
    from ..sampling import SamplingParams

    job = prompts_bench(
        file,
        sweep,
        limit=limit,
        sampling=SamplingParams(temp=temp, seed=seed),
        max_tokens=max_tokens,
        out=out or Path("bench-results") / f"prompts-{file.stem}",
    )
    _run_bench(job, model_options)


@bench_app.command("report")
def bench_report(
    folders: Annotated[
        list[Path],
        typer.Argument(
            help="A bench's or a replay's --out folder; several: repeats of one bench or replay, compared.",
            parser=given_path,
        ),
    ],
) -> None:
    """Rewrite the table, CSV and plot from every sample in a folder's results.jsonl (a replay's folder:
    show its table); given repeats of a bench (or of a replay: folders with a replay.json), also the
    median of each strategy's wall-clock ratio over them, with the range (median-of-N.md in the first
    folder)."""
    from ..bench.replay import REPLAY_FILE, read_report, replay_machine
    from ..bench.replay import check_repeats as check_replay_repeats
    from ..bench.report import aggregate_read, repeats_table, write_report
    from ..bench.results import RESULTS_FILE, check_distinct, check_repeats, read_results
    from ..paths import is_dir, is_file, lookup, save_text

    for folder in folders:
        if not is_dir(folder):
            raise EadError(
                f"{shown_path(folder)} is not a folder: give a bench's or a replay's --out", exit_code=2
            )
        if lookup(folder / RESULTS_FILE) is None and lookup(folder / REPLAY_FILE) is None:
            # said of the folder: it had been "no samples in FOLDER/results.jsonl", a file it does not hold
            what = f"{RESULTS_FILE} or {REPLAY_FILE}"
            raise EadError(
                f"{shown_path(folder)} holds no {what}: give a bench's or a replay's --out", exit_code=2
            )
    check_distinct(folders)
    kinds = {is_file(f / REPLAY_FILE) and lookup(f / RESULTS_FILE) is None for f in folders}
    if len(kinds) > 1:
        raise EadError("give repeats of one kind: bench folders (results.jsonl) or replay folders", 2)
    replays = kinds.pop()
    source = REPLAY_FILE if replays else RESULTS_FILE
    machine = None  # the repeats' machine, where their files record it
    if replays:
        reports = [read_report(folder) for folder in folders]
        if len(reports) == 1:  # one run: its own figures, not a median of one with a range of none
            _show_replay(reports[0][0])
            return
        check_replay_repeats([(folder, report) for folder, (report, _) in zip(folders, reports, strict=True)])
        runs = [strategies for _, strategies in reports]
        machine = next((words for report, _ in reports if (words := replay_machine(report))), None)
    else:
        read = [(folder / RESULTS_FILE, *read_results(folder / RESULTS_FILE)) for folder in folders]
        runs = []
        for path, _, records in read:
            if not records:
                raise EadError(f"no samples in {shown_path(path)}", exit_code=2)
            runs.append(aggregate_read(path, records))
        check_repeats(read)
        machine = next(
            (words for _, config, _ in read if (words := machine_words((config or {}).get("machine")))), None
        )
        if len(runs) == 1:
            _show_report(folders[0], runs[0])
            return
        for folder, run in zip(folders, runs, strict=True):
            write_report(folder, run)
    table = repeats_table(runs)
    median = folders[0] / f"median-of-{len(runs)}.md"
    # before the table: a reader gone (`| head`) ends the run where it is shown
    heading = "".join(f"{folder / source}\n" for folder in folders) + (f"{machine}\n" if machine else "")
    save_text(median, heading + table, "the median table")
    typer.echo(table, nl=False)
    also = "" if replays else " and each folder's report"
    stderr.print(f"wrote {shown_path(median)}{also}", style="dim", soft_wrap=True)


@bench_app.command("replay")
@with_options(LOCAL_MODEL_OPTIONS)
def bench_replay(
    results: Annotated[
        Path, typer.Argument(help="A bench's results.jsonl, or its --out folder.", parser=given_path)
    ],
    model_options: ModelOptions,
    strategies: Annotated[
        str | None,
        typer.Option(
            metavar=listed("NAME"), help="Strategy names to replay, comma-separated (default: all recorded)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for replay.json (default: beside results).", parser=given_path)
    ] = None,
) -> None:
    """Re-execute a bench's recorded schedules on other models of the same tokenizer (e.g. twins):
    the recorded tokens forced, every batch paid again; wall-clock per strategy against large-only."""
    from ..bench.replay import REPLAY_FILE, replay_bench
    from ..bench.results import RESULTS_FILE

    path = results / RESULTS_FILE if results.is_dir() else results
    names = None if strategies is None else [name.strip() for name in strategies.split(",") if name.strip()]
    if names == []:  # not all of them: that is the option left out
        raise EadError(f"--strategies: {quoted(strategies)} names no strategy", exit_code=2)
    with progress_bar() as (progress, bar):
        report = replay_bench(
            path,
            model_options,
            out or path.parent,
            strategies=names,
            progress=say_progress,
            on_sample=lambda sample: progress.update(
                bar, description=f"{sample.strategy} · {sample.task_id}"
            ),
        )
    _show_replay(report)
    stderr.print(f"wrote {shown_path((out or path.parent) / REPLAY_FILE)}", style="dim", soft_wrap=True)


REPLAY_COLUMNS = (
    ("strategy", "strategy", ""),
    ("n", "samples", "d"),
    ("pass@1", "pass_at_1", ".1%"),
    ("large share", "large_share", ".1%"),
    ("recorded s", "recorded_wall_s", ",.1f"),
    ("recorded vs large", "recorded_wall_rel", ".2f"),
    ("replay s", "wall_s", ",.1f"),
    ("replay vs large", "wall_rel", ".2f"),
    ("replay tok/s", "tokens_per_s", ".1f"),
)


def _show_replay(report: dict[str, Any]) -> None:
    """A replay's table and its note, as ``bench replay`` shows them and ``bench report`` of its folder."""
    print_rows(REPLAY_COLUMNS, report["strategies"])
    stderr.print(report["note"], style="dim")


@bench_app.command("speed")
@with_options(LOCAL_MODEL_OPTIONS)
def bench_speed(
    model_options: ModelOptions,
    context: Annotated[int, typer.Option(help="Tokens in the cache when rates are measured.")] = 256,
    check: Annotated[
        Path | None,
        typer.Option(
            help="A replay.json (ead bench replay) to check the cost model against.", parser=given_path
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write every figure to this file.", parser=given_file)
    ] = None,
) -> None:
    """This machine's decode and prefill rates for the pair, the speed each large-model share should
    give against the large model alone, and the share below which switching pays."""
    from ..bench.speed import ANSWER_TOKENS, PROMPT_TOKENS, speed_report
    from ..paths import check_can_save, save_json

    if json_out is not None:
        check_can_save(json_out, "the speed figures", exit_code=2)
    else:  # the tables are all it leaves
        check_stdout("the speed figures")
    report = speed_report(
        model_options, context=context, replay_path=check, json_out=json_out, progress=say_progress
    )
    if json_out is not None:  # before the tables: a reader gone (`| head`) ends the run where they are shown
        save_json(json_out, report.as_json(), "the speed figures", indent=1)
    sizes = sorted(report.rates[0].tokens_per_s)
    print_figures(
        ["model", "params", *(("decode" if size == 1 else f"batch {size}") for size in sizes)],
        [
            [
                rates.model,
                f"{rates.params / 1e9:.2f}B",
                *(f"{rates.tokens_per_s[size]:.1f}" for size in sizes),
            ]
            for rates in report.rates
        ],
    )
    decode, batch = report.threads["decode"], report.threads["batch"]
    used = counted(decode, "thread") + (f" ({batch} for batches)" if batch != decode else "")
    print(f"tokens per second at {context} tokens of context, {used}, {machine_words(report.machine)}")
    for rates in report.rates:
        if rates.out_of_order:
            sizes = ", ".join(str(size) for size in rates.out_of_order)
            print(f"{rates.model}: batches of {sizes} stayed slower per token than smaller ones, timed again")
    print()
    print_rows(
        (
            ("large share", "share", ".0%"),
            ("catch-up batch", "catchup_batch", "d"),
            ("ms/token", "seconds_per_token", ".3f"),
            ("speed vs large alone", "speedup", ".2f"),
            (f"answer (prompt {PROMPT_TOKENS}, {ANSWER_TOKENS} tokens)", "answer_speedup", ".2f"),
        ),
        [{**asdict(row), "seconds_per_token": row.seconds_per_token * 1000} for row in report.expectations],
    )
    print(report.verdict)
    if report.checks is not None:
        print()
        print_rows(
            (
                ("strategy", "strategy", ""),
                ("large share", "large_share", ".1%"),
                ("measured s", "measured_s", ",.1f"),
                ("batches priced s", "priced_s", ",.1f"),
                ("formula s", "formula_s", ",.1f"),
                ("measured vs large", "measured_rel", ".2f"),
                ("formula vs large", "formula_rel", ".2f"),
            ),
            [asdict(row) for row in report.checks],
        )


def _run_bench(job: Bench, model_options: ModelOptions) -> None:
    """Run with a progress bar on stderr (ETA included), then show the table and write the reports."""
    from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..bench.report import aggregate
    from ..bench.results import RESULTS_FILE
    from ..bench.run import run_bench

    def label(plan: Plan, index: int) -> str:
        return f"{plan[index][0].name} · {plan[index][1].task_id}" if index < len(plan) else "done"

    def watch(plan: Plan, records: Iterator[Record]) -> None:
        if not plan:
            stderr.print(f"every sample is already in {job.out / RESULTS_FILE}", style="dim")
        columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), "ETA", TimeRemainingColumn())
        done = 0
        try:
            with live_progress("{task.description}", *columns, disable=not plan) as progress:
                bar = progress.add_task(label(plan, 0), total=len(plan))
                for done, _ in enumerate(records, 1):
                    progress.update(bar, completed=done, description=label(plan, done))
        except (KeyboardInterrupt, Terminated):  # say what a stop kept, then stop as any command does
            kept = f"kept {done} of the {counted(len(plan), 'sample')} to run in {job.out / RESULTS_FILE}"
            stderr.print(f"{kept}: the same command resumes", style="dim", soft_wrap=True)
            raise

    records = run_bench(job, model_options, watch=watch, progress=say_progress)
    _show_report(job.out, aggregate(records))


def _show_report(folder: Path, aggregates: list[Aggregate]) -> None:
    from ..bench.report import report_table, write_report

    files = write_report(folder, aggregates)
    print_figures(*report_table(aggregates))
    written = [files.csv, files.markdown, *([files.plot] if files.plot else [])]
    stderr.print(f"wrote {', '.join(shown_path(path) for path in written)}", style="dim", soft_wrap=True)
    if files.note:
        stderr.print(files.note, style="dim")
