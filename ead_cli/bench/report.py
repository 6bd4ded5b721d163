"""The figures of a bench and its report files (table, CSV, markdown, plot).

Per strategy: pass@1 and the passing samples counted; agreement with large-only's answer to the same
task (1.0: the same words in the same order; the quality proxy of ``ead bench prompts``); large-model
share and parameter-weighted cost, weighted by generated tokens; total FLOPs and wall-clock seconds,
also as a ratio to large-only's totals on the same tasks; tokens per second over all samples; mean
switches per sample; mean acceptance rate; mean rollbacks per sample (--verify, lookahead);
seconds per model in prefill, decode and catch-up; for server strategies, tokens per second by the
server's own generation time; and how many texts are exactly large-only's.
"""

from __future__ import annotations

import csv
import difflib
import io
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ..options import tokens_taken_back_by
from ..paths import check_can_save, save_text
from .grid import LARGE_ONLY
from .results import PHASES, Record, check_sample, unreadable_record

_WORD = re.compile(r"\w+|[^\w\s]")


def agreement(text: str, reference: str) -> float:
    """difflib's ratio between the word sequences of two texts (1.0: the same words in the same order)."""
    matcher = difflib.SequenceMatcher(None, _WORD.findall(text), _WORD.findall(reference), autojunk=False)
    return matcher.ratio()


@dataclass(frozen=True)
class Aggregate:
    """One strategy's figures over its samples (see the module docstring)."""

    strategy: str
    samples: int
    pass_at_1: float | None
    passed: int | None  # the samples that passed (None: none judged)
    agreement: float | None
    large_share: float
    param_cost: float
    generated: int
    flops: float
    flops_rel: float | None
    wall_s: float
    wall_rel: float | None
    tokens_per_s: float
    switches: float
    acceptance_rate: float | None
    rollbacks: float | None  # None: a strategy that takes no written token back
    model_s: dict[str, float]  # "<role>_<phase>_s": seconds, e.g. "large_catchup_s"
    server_tokens_per_s: float | None = None  # server strategies: generated tokens over the server's own time
    same_text: int | None = None  # samples whose text is exactly large-only's for the task

    def row(self) -> dict[str, Any]:
        """Flat, for the CSV."""
        flat = asdict(self)
        return flat | flat.pop("model_s")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(value: float, reference: float | None) -> float | None:
    return value / reference if reference else None


def paired_ratio(by_task: Mapping[str, float], reference: Mapping[str, float]) -> float | None:
    """A strategy's total over large-only's on the tasks both ran: a bench or replay cut short holds one
    strategy on a task the other has not reached, and totals over different tasks are no ratio."""
    shared = [task for task in by_task if task in reference]
    return _ratio(sum(by_task[task] for task in shared), sum(reference[task] for task in shared))


def passes(records: Sequence[Record]) -> tuple[int | None, float | None]:
    """How many samples passed, and pass@1 over those judged (None, None: none judged, a prompt list)."""
    judged = [record["passed"] for record in records if record["passed"] is not None]
    for value in judged:
        if not isinstance(value, bool):  # an edited record: a 2 or a 0.5 had been summed into pass@1
            raise TypeError(f"passed is {value!r}, not true, false or null")
    return (sum(judged), sum(judged) / len(judged)) if judged else (None, None)


def _token_weighted(records: Sequence[Record], key: str) -> float:
    """A per-sample share averaged over generated tokens, as if all samples were one long generation."""
    generated = sum(r["generated"] for r in records)
    return sum(r[key] * r["generated"] for r in records) / generated if generated else 0.0


def _model_seconds(records: Sequence[Record]) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for record in records:
        for role, report in record["models"].items():
            for phase in PHASES:
                key = f"{role}_{phase}_s"
                seconds[key] = seconds.get(key, 0.0) + report[f"{phase}_s"]
    return seconds


def _rollbacks(records: Sequence[Record]) -> float | None:
    """Rollbacks per sample where the strategy takes back tokens it wrote (--verify's rejections, a
    lookahead policy's dropped drafts), 0 a count there; None where it takes none back (spec's rejected
    drafts are never written: its acceptance rate counts them), unless a sample says otherwise."""
    params = records[0].get("params") or {}
    taker = tokens_taken_back_by(params.get("mode"), params.get("verify"), params.get("policy"))
    if taker in (None, "--mode spec") and not any(r.get("rollbacks") for r in records):
        return None
    return sum(r.get("rollbacks", 0) for r in records) / len(records)


def _server_rate(records: Sequence[Record]) -> float | None:
    """Tokens per second of generation as llama-server timed it (its prompt processing aside)."""
    timed = [r["server"] for r in records if r.get("server")]
    seconds = sum(t["predicted_ms"] for t in timed) / 1000
    return sum(t["predicted_n"] for t in timed) / seconds if seconds else None


def aggregate(records: Sequence[Record]) -> list[Aggregate]:
    """Per strategy, in order of first appearance; relative figures need a large-only strategy."""
    groups: dict[str, list[Record]] = {}
    for record in records:
        groups.setdefault(record["strategy"], []).append(record)
    large = groups.get(LARGE_ONLY, [])
    reference = {r["task_id"]: r["text"] for r in large}
    ref_flops = {r["task_id"]: r["flops"] for r in large}
    ref_wall = {r["task_id"]: r["wall_s"] for r in large}
    aggregates = []
    for name, rs in groups.items():
        generated = sum(r["generated"] for r in rs)
        flops = sum(r["flops"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        passed, pass_at_1 = passes(rs)
        agreeing = [agreement(r["text"], reference[r["task_id"]]) for r in rs if r["task_id"] in reference]
        accepted = [r["acceptance_rate"] for r in rs if r.get("acceptance_rate") is not None]
        aggregates.append(
            Aggregate(
                strategy=name,
                samples=len(rs),
                pass_at_1=pass_at_1,
                passed=passed,
                agreement=_mean(agreeing),
                large_share=_token_weighted(rs, "large_share"),
                param_cost=_token_weighted(rs, "param_cost"),
                generated=generated,
                flops=flops,
                flops_rel=paired_ratio({r["task_id"]: r["flops"] for r in rs}, ref_flops),
                wall_s=wall,
                wall_rel=paired_ratio({r["task_id"]: r["wall_s"] for r in rs}, ref_wall),
                tokens_per_s=generated / wall if wall else 0.0,
                switches=sum(r["switches"] for r in rs) / len(rs),
                acceptance_rate=_mean(accepted),
                rollbacks=_rollbacks(rs),
                model_s=_model_seconds(rs),
                server_tokens_per_s=_server_rate(rs),
                same_text=sum(r["text"] == reference[r["task_id"]] for r in rs if r["task_id"] in reference)
                if reference
                else None,
            )
        )
    return aggregates


def aggregate_read(path: Path, records: Sequence[Record]) -> list[Aggregate]:
    """``aggregate`` of the records read from ``path``: one edited or damaged past reading (a figure
    missing, of another type or a value no bench writes, an object made a number) is one line naming the
    file, not a traceback or a report of it."""
    try:
        for record in records:
            check_sample(record)
        return aggregate(records)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise unreadable_record(path, error) from None


# --------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Aggregate], Any]
    spec: str  # format spec; strings are shown as they are

    def cell(self, aggregate: Aggregate) -> str:
        value = self.value(aggregate)
        if value is None:
            return "-"
        return value if isinstance(value, str) else format(value, self.spec)


COLUMNS = (
    Column("strategy", lambda a: a.strategy, ""),
    Column("n", lambda a: a.samples, "d"),
    Column("pass@1", lambda a: a.pass_at_1, ".1%"),
    Column("agreement", lambda a: a.agreement, ".3f"),
    Column("large share", lambda a: a.large_share, ".1%"),
    Column("param cost", lambda a: a.param_cost, ".3f"),
    Column("TFLOP", lambda a: a.flops / 1e12, ",.2f"),
    Column("FLOPs vs large", lambda a: a.flops_rel, ".2f"),
    Column("wall s", lambda a: a.wall_s, ",.1f"),
    Column("wall vs large", lambda a: a.wall_rel, ".2f"),
    Column("tok/s", lambda a: a.tokens_per_s, ".1f"),
    Column("server tok/s", lambda a: a.server_tokens_per_s, ".1f"),
    Column("switches", lambda a: a.switches, ".1f"),
    Column("acceptance", lambda a: a.acceptance_rate, ".1%"),
    Column("rollbacks", lambda a: a.rollbacks, ".2f"),
    Column("same text", lambda a: a.same_text, "d"),
)


def report_table(aggregates: Sequence[Aggregate]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows, without the columns no strategy has a value for."""
    columns = [c for c in COLUMNS if any(c.value(a) is not None for a in aggregates)]
    return [c.header for c in columns], [[c.cell(a) for c in columns] for a in aggregates]


def markdown_table(aggregates: Sequence[Aggregate]) -> str:
    return _markdown(*report_table(aggregates))


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table, the first column left-aligned and the figures right-aligned."""
    align = ["---"] + ["---:"] * (len(headers) - 1)
    return "".join("| " + " | ".join(cells) + " |\n" for cells in (headers, align, *rows))


def _by_run(values: Sequence[int | float | None], spec: str) -> str:
    return "/".join("-" if value is None else format(value, spec) for value in values)


class RunFigures(Protocol):
    """What a repeat contributes per strategy: a bench's Aggregate or a replay's ReplayedStrategy."""

    strategy: str
    samples: int
    pass_at_1: float | None
    passed: int | None
    wall_rel: float | None


def repeats_table(runs: Sequence[Sequence[RunFigures]]) -> str:
    """Markdown over repeated runs of a bench or of a replay: per strategy, the median of its wall-clock
    ratios to the same run's large-only with their range (a ratio is taken within one run, where the
    machine's load is shared; "over N" where fewer runs than it ran in gave one), in how many runs it ran,
    and per run its passes (a replay's: the recorded run's) and, for a bench, its texts equal to
    large-only's. Fastest median first."""
    texts = all(isinstance(a, Aggregate) for run in runs for a in run)
    names = list(dict.fromkeys(a.strategy for run in runs for a in run))
    rows = []
    for name in names:
        found = [a for run in runs for a in run if a.strategy == name]
        ratios = sorted(a.wall_rel for a in found if a.wall_rel is not None)
        median = statistics.median(ratios) if ratios else None
        spread = f"{median:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})" if ratios else "-"
        if ratios and len(ratios) < len(found):  # a run without large-only (or no task in common) has none
            spread += f" over {len(ratios)}"
        cells = [name, spread, str(len(found)), _by_run([a.passed for a in found], "d")]
        if texts:
            cells.append(_by_run([a.same_text for a in found if isinstance(a, Aggregate)], "d"))
        rows.append((median, cells))
    rows.sort(key=lambda row: float("inf") if row[0] is None else row[0])
    headers = ["strategy", "wall vs large-only, median (range)", "runs", "passed"]
    return _markdown(headers + ["same text"] * texts, [cells for _, cells in rows])


@dataclass(frozen=True)
class ReportFiles:
    csv: Path
    markdown: Path
    plot: Path | None
    note: str | None  # why there is no plot


REPORT_FILES = {"report.csv": "the report", "report.md": "the report", "plot.png": "the plot"}  # name: what


def check_report_files(folder: Path) -> None:
    """Each report file checked (``check_can_save``) before any is written and before a bench runs: a
    folder in the place of one had left the report written in part, the rest said after every sample."""
    for name, what in REPORT_FILES.items():
        check_can_save(folder / name, what, exit_code=2)


def write_report(folder: Path, aggregates: Sequence[Aggregate]) -> ReportFiles:
    """report.csv (every figure, full precision), report.md (the table) and plot.png (if matplotlib)."""
    check_report_files(folder)
    rows = [a.row() for a in aggregates]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
    writer.writeheader()
    writer.writerows(rows)
    csv_name, markdown_name, plot_name = REPORT_FILES
    csv_path = save_text(folder / csv_name, table.getvalue(), "the report")
    markdown = save_text(folder / markdown_name, markdown_table(aggregates), "the report")
    plot, note = _plot(folder / plot_name, aggregates)
    return ReportFiles(csv_path, markdown, plot, note)


def _plot(path: Path, aggregates: Sequence[Aggregate]) -> tuple[Path | None, str | None]:
    """Quality against relative wall-clock and against parameter-weighted cost, one labelled point each."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None, "matplotlib is not installed (pip install 'ead-cli[plot]'): no plot"
    if any(a.pass_at_1 is not None for a in aggregates):
        quality, label = (lambda a: a.pass_at_1), "pass@1"
    elif any(a.agreement is not None for a in aggregates):
        quality, label = (lambda a: a.agreement), "agreement with large-only"
    else:
        return None, "no pass@1 or agreement to plot (run the large-only strategy)"
    relative = all(a.wall_rel is not None for a in aggregates)
    panels = (
        ((lambda a: a.wall_rel), "wall-clock relative to large-only")
        if relative
        else ((lambda a: a.wall_s), "wall-clock seconds"),
        ((lambda a: a.param_cost), "parameter-weighted cost"),
    )
    figure = Figure(figsize=(12, 5), layout="constrained")
    axes = figure.subplots(1, 2, sharey=True)
    for ax, (x, xlabel) in zip(axes, panels, strict=True):
        for a in aggregates:
            if quality(a) is None:
                continue
            ax.scatter(x(a), quality(a))
            ax.annotate(a.strategy, (x(a), quality(a)), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(label)
    image = io.BytesIO()  # rendered first, then written whole: a Ctrl-C midway had left half a PNG
    figure.savefig(image, format="png", dpi=150)
    return save_text(path, image.getvalue(), "the plot"), None
