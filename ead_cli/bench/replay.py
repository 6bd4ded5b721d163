"""``ead bench replay``: a bench's recorded schedules re-executed on other models of the same tokenizer.

The question it answers: what would each strategy have cost with another pair (a 14B large model, a
GPU, a random-weight twin of a model nobody can download here)? Every sample of a results file carries
its schedule (schedule.py); this re-executes them task by task (every strategy on a task, then the next
task, so machine noise spreads over all strategies alike) and reports wall-clock per strategy against
the large-only replay of the same tasks. The tokens are forced, so the quality figures stay those of
the recorded run; only the costs are new.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..compat import check_recorded_tokenizer
from ..engine import close_all, load_runners, role_names
from ..errors import EadError, cut, quoted, shown_path
from ..figures import is_amount, is_count, is_figure, is_share
from ..hardware import machine_record, machine_words, repack_choice
from ..options import ModelOptions
from ..paths import check_can_save, is_dir, read_file, save_json, unreadable
from ..prompt import context_size
from ..runner import Runner, warm_up
from .grid import LARGE_ONLY
from .report import paired_ratio, passes
from .results import (
    COUNT,
    GIVE_RESULTS,
    PHASES,
    SECONDS,
    Record,
    check_names,
    check_same_tasks,
    check_sample,
    read_results,
    tasks_by_strategy,
    unreadable_record,
)
from .schedule import BatchCounts, ScheduleError, batch_counts, check_schedule, replay

REPLAY_FILE = "replay.json"


@dataclass(frozen=True)
class ReplayedSample:
    strategy: str
    task_id: str
    wall_s: float
    recorded_wall_s: float
    generated: int
    models: dict[str, dict[str, float]]  # role -> {phase}_tokens / {phase}_s, as in a bench record


@dataclass(frozen=True)
class ReplayedStrategy:
    """One strategy's replays, with the recorded run's figures beside them."""

    strategy: str
    samples: int
    generated: int
    large_share: float
    pass_at_1: float | None
    passed: int | None  # the recorded samples that passed
    wall_s: float
    wall_rel: float | None  # against the large-only replay of the same tasks
    recorded_wall_s: float
    recorded_wall_rel: float | None
    tokens_per_s: float
    batches: dict[str, dict[str, dict[int, int]]]  # role -> phase -> batch size -> count


def select_records(path: Path, strategies: Sequence[str] | None) -> tuple[Record, list[Record]]:
    """The config and the samples to replay: every sample with a schedule, or the named strategies
    (each must have one); each read whole here, before any model loads."""
    if not path.exists():
        raise EadError(f"{shown_path(path)} does not exist: {GIVE_RESULTS}", 2)
    config, records = read_results(path, given=True)
    if config is None or not records:
        raise EadError(f"no samples in {shown_path(path)}", exit_code=2)
    if not config.get("tokenizer"):
        raise EadError(
            f"{shown_path(path)} was recorded without a tokenizer fingerprint (by an older ead): "
            "run the bench again",
            exit_code=2,
        )
    _check_config(path, config)
    _check_readable(path, records, check_names)
    if strategies is None:
        chosen = [record for record in records if record.get("schedule") is not None]
        if not chosen:
            raise EadError(f"no sample in {shown_path(path)} has a schedule to replay", exit_code=2)
    else:
        known = {record["strategy"] for record in records}
        for name in strategies:
            if name not in known:
                raise EadError(
                    f"--strategies: {quoted(name)} is not in {shown_path(path)} (it has: "
                    f"{', '.join(sorted(known))})",
                    2,
                )
        chosen = [record for record in records if record["strategy"] in set(strategies)]
        for record in chosen:
            if record.get("schedule") is None:
                raise EadError(
                    f"{record['strategy']} on {record['task_id']} has no schedule (a remote model, a native "
                    "server strategy, or an older ead recorded it): it cannot be replayed",
                    exit_code=2,
                )
    roles, tokens = list(config["models"]), config["tokenizer"]["tokens"]
    _check_readable(path, chosen, lambda record: _read_figures(record, roles, tokens))
    return config, chosen


def _check_config(path: Path, config: Record) -> None:
    """The config record's models and tokenizer, as a bench writes them: an edited tokenizer had been a
    traceback where it is compared, once the models had loaded."""
    models, tokenizer = config.get("models"), config["tokenizer"]
    if not isinstance(models, dict) or not models or not all(isinstance(m, dict) for m in models.values()):
        problem = f"models is {cut(json.dumps(models))}, not the models by role"
    elif not (
        isinstance(tokenizer, dict)
        and is_count(tokenizer.get("tokens"))
        and tokenizer["tokens"] >= 1
        and isinstance(tokenizer.get("sha256"), str)
    ):
        problem = f"tokenizer is {cut(json.dumps(tokenizer))}, not a token count and a fingerprint"
    else:
        return
    raise EadError(f"{shown_path(path)}'s config record is not one ead bench writes: {problem}", 2)


def _is_ratio(value: Any) -> bool:
    """A relative figure: None where there is no large-only to set it against, else above 0."""
    return value is None or (is_figure(value) and value > 0)


def _read_figures(record: Record, roles: Sequence[str], tokens: int) -> None:
    """What replaying a sample reads of it, each figure checked to be what it stands for, and its schedule:
    well formed for these models, of the recorded tokenizer's ``tokens`` (a token past them had been
    llama.cpp's failure to decode, mid-replay), and reading the tokens the record counts (else the replay's
    counts could not be set against the record's)."""
    check_sample(record)
    passes([record])
    where = f"{record['strategy']} on {record['task_id']}"
    try:
        steps = check_schedule(record["schedule"], len(roles))
    except ScheduleError as error:
        raise ValueError(f"{where}: {error}") from None
    fed = max((token for step in steps if step[1] != "t" for token in step[3]), default=0)
    if fed >= tokens:
        past = f"past the {tokens} tokens of the recorded tokenizer"
        raise ValueError(f"{where}: its schedule feeds token {fed}, {past}")
    for model, role in enumerate(roles):
        # Prefill and catch-up together: records made before a draft's batch counted the prompt's last
        # token as prefill (2026-11-26) have that token as catch-up.
        for codes, phases in (("pc", ("prefill", "catchup")), ("d", ("decode",))):
            read = sum(len(step[3]) for step in steps if step[0] == model and step[1] in codes)
            recorded = sum(record["models"][role][f"{phase}_tokens"] for phase in phases)
            if read != recorded:
                raise ValueError(
                    f"{where}: its schedule reads {read} {' and '.join(phases)} tokens with the {role} "
                    f"model, the record {recorded}"
                )


def _check_readable(path: Path, records: Sequence[Record], read: Callable[[Record], None]) -> None:
    """Read what a replay will read of each record, so an edited or damaged one is one line before any
    model loads, not a traceback after."""
    for record in records:
        try:
            read(record)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise unreadable_record(path, error) from None


def _by_task(records: Sequence[Record]) -> list[Record]:
    """Task by task, strategies in order of first appearance (the order a bench runs them in)."""
    order = {name: i for i, name in enumerate(dict.fromkeys(r["strategy"] for r in records))}
    tasks = {task: i for i, task in enumerate(dict.fromkeys(r["task_id"] for r in records))}
    return sorted(records, key=lambda r: (tasks[r["task_id"]], order[r["strategy"]]))


def check_models(config: Record, runners: Sequence[Runner]) -> None:
    """As many models as were recorded, each with the recorded tokenizer."""
    recorded = len(config["models"])
    if len(runners) != recorded:
        raise EadError(f"the schedules were recorded with {recorded} models; {len(runners)} were given", 2)
    for runner in runners:
        check_recorded_tokenizer(config["tokenizer"], runner.label, runner.model)


def _checked_steps(record: Record, n_ctx: int, n_batch: int) -> list:
    """A sample's schedule (checked as it was read), within these models' context, each step's rows of
    logits (a draft or a guess checked) within one batch of theirs: llama.cpp keeps only the last
    batch's."""
    steps = record["schedule"]
    rows = max((step[4] for step in steps if step[1] not in "td"), default=1)
    if rows > n_batch:
        raise EadError(
            f"{record['strategy']} on {record['task_id']} checks {rows} tokens in one batch, past "
            f"--batch-size {n_batch}: pass --batch-size {rows} or more",
            exit_code=2,
        )
    end = max((step[2] + len(step[3]) for step in steps if step[1] != "t"), default=0)
    if end > n_ctx:
        raise EadError(
            f"{record['strategy']} on {record['task_id']} reaches position {end}, past the context of "
            f"{n_ctx} tokens: pass --ctx",
            exit_code=2,
        )
    return steps


def replay_records(
    runners: Sequence[Runner],
    records: Sequence[Record],
    *,
    on_sample: Callable[[ReplayedSample], None] | None = None,
) -> list[ReplayedSample]:
    """Re-execute each record's schedule (its token counts checked against the record's as it was read)."""
    roles = role_names(len(runners))
    n_ctx, n_batch = context_size(runners), min(runner.n_batch for runner in runners)
    plan = [(record, _checked_steps(record, n_ctx, n_batch)) for record in _by_task(records)]
    first_prefill = next((step[3] for _, steps in plan for step in steps if step[1] == "p"), None)
    if first_prefill:
        warm_up(runners, first_prefill)
    samples = []
    for record, steps in plan:
        wall, stats = replay(runners, steps)
        models = {
            role: {
                key: value
                for phase in PHASES
                for key, value in (
                    (f"{phase}_tokens", getattr(stat, phase).tokens),
                    (f"{phase}_s", getattr(stat, phase).seconds),
                )
            }
            for role, stat in zip(roles, stats, strict=True)
        }
        sample = ReplayedSample(
            record["strategy"], record["task_id"], wall, record["wall_s"], record["generated"], models
        )
        samples.append(sample)
        if on_sample is not None:
            on_sample(sample)
    return samples


def summarise(
    records: Sequence[Record], samples: Sequence[ReplayedSample], n_batch: int
) -> list[ReplayedStrategy]:
    """Per strategy, in order of first appearance; relative figures need large-only among them."""
    by_key = {(r["strategy"], r["task_id"]): r for r in records}
    groups: dict[str, list[ReplayedSample]] = {}
    for sample in samples:
        groups.setdefault(sample.strategy, []).append(sample)
    reference = groups.get(LARGE_ONLY, [])
    ref_wall = {s.task_id: s.wall_s for s in reference}
    ref_recorded = {s.task_id: s.recorded_wall_s for s in reference}
    summary = []
    for name, group in groups.items():
        rs = [by_key[(s.strategy, s.task_id)] for s in group]
        roles = list(rs[0]["models"])
        counts = [BatchCounts() for _ in roles]
        for record in rs:
            for total, part in zip(
                counts, batch_counts(record["schedule"], len(roles), n_batch), strict=True
            ):
                total.merge(part)
        generated = sum(s.generated for s in group)
        wall = sum(s.wall_s for s in group)
        recorded = sum(s.recorded_wall_s for s in group)
        passed, pass_at_1 = passes(rs)
        summary.append(
            ReplayedStrategy(
                strategy=name,
                samples=len(group),
                generated=generated,
                large_share=sum(r["large_share"] * r["generated"] for r in rs) / generated
                if generated
                else 0.0,
                pass_at_1=pass_at_1,
                passed=passed,
                wall_s=wall,
                wall_rel=paired_ratio({s.task_id: s.wall_s for s in group}, ref_wall),
                recorded_wall_s=recorded,
                recorded_wall_rel=paired_ratio({s.task_id: s.recorded_wall_s for s in group}, ref_recorded),
                tokens_per_s=generated / wall if wall else 0.0,
                batches={role: count.sizes for role, count in zip(roles, counts, strict=True)},
            )
        )
    return summary


def model_record(runner: Runner) -> dict[str, Any]:
    """A replayed model: its file, size, and whether it is a random-weight twin (timing only)."""
    return {
        "file": runner.label,
        "bytes": runner.file_bytes,
        "params": runner.n_params,
        "twin": runner.twin_of,
    }


def replay_bench(
    path: Path,
    model_options: ModelOptions,
    out: Path,
    *,
    strategies: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    on_sample: Callable[[ReplayedSample], None] | None = None,
) -> dict[str, Any]:
    """Replay a results file's schedules on these models; write and return the report (replay.json)."""
    check_can_save(out / REPLAY_FILE, "the replay report", exit_code=2)  # now, not once the replay has run
    config, records = select_records(path, strategies)
    runners = load_runners(model_options, progress=progress, local_only=True)
    try:
        check_models(config, runners)
        samples = replay_records(runners, records, on_sample=on_sample)
        roles = role_names(len(runners))
        models = {role: model_record(runner) for role, runner in zip(roles, runners, strict=True)}
        threads = runners[0].n_threads
        threads_batch = runners[0].n_threads_batch
        n_batch = runners[0].n_batch
    finally:
        close_all(runners)
    twins = [m["file"] for m in models.values() if m["twin"]]
    report = {
        "kind": "schedule replay",
        "note": (
            f"schedule replays: the tokens of the recorded run forced on these models; {', '.join(twins)} "
            "random-weight twin(s) with the real shapes: the timings are real, the text is not theirs"
            if twins
            else "schedule replays: the tokens of the recorded run forced on these models"
        ),
        "source": str(path),
        "recorded_models": config["models"],
        "models": models,
        "threads": threads,
        "threads_batch": threads_batch,
        "machine": {
            "system": platform.platform(),
            "processor": platform.machine(),
            **machine_record(repack_choice(model_options.repack)),
        },
        "strategies": [asdict(s) for s in summarise(records, samples, n_batch)],
        "samples": [asdict(s) for s in samples],
    }
    save_json(out / REPLAY_FILE, report, "the replay report", indent=1)
    return report


def replay_file(path: Path) -> Path:
    """A replay report's file: ``path``, or the replay.json in the folder ``path`` names."""
    return path / REPLAY_FILE if is_dir(path) else path


def read_report(path: Path) -> tuple[dict[str, Any], list[ReplayedStrategy]]:
    """A replay report (replay.json, or the folder holding it) and its strategies' figures, each checked
    to be of its type: a report edited or damaged past reading is one line saying what is wrong, not a
    traceback where a table formats the figure."""
    file = replay_file(path)
    try:
        report = json.loads(read_file(file))
    except OSError as error:
        raise EadError(f"cannot read {shown_path(file)}: {unreadable(error)}", 2) from None
    except (ValueError, RecursionError) as error:
        raise EadError(
            f"{shown_path(file)} is not a replay report (ead bench replay): {unreadable(error)}", 2
        ) from None
    problem = _report_problem(report)
    if problem:
        raise EadError(f"{shown_path(file)} is not a replay report (ead bench replay): {problem}", 2)
    names = [field.name for field in fields(ReplayedStrategy)]
    rows = [_with_passes(row) for row in report["strategies"]]
    return report, [ReplayedStrategy(**{name: row[name] for name in names}) for row in rows]


def _with_passes(row: dict[str, Any]) -> dict[str, Any]:
    """A strategy of a report written before its passes were counted: pass@1 over its samples, exact
    there (every sample of a HumanEval bench is judged; a prompt list's none)."""
    if "passed" in row:
        return row
    return {**row, "passed": None if row["pass_at_1"] is None else round(row["pass_at_1"] * row["samples"])}


def check_repeats(runs: Sequence[tuple[Path, Mapping[str, Any]]]) -> None:
    """Repeats of one replay, as results.check_repeats holds repeats of a bench: replays on the same models
    (file and size) of the same recorded samples (strategy, task, recorded seconds and tokens), each
    strategy on the same tasks in every run that has it, on the same machine (CPU, cores, weight
    repacking) as the first that records one; else their medians would mix replays of another pair,
    another results file or another CPU. A hand-made report that names no models or samples, or one
    written before the machine was recorded, is held to nothing there."""
    first_path, first = runs[0]
    timed = [(path, machine) for path, report in runs if (machine := replay_machine(report)) is not None]
    for path, machine in timed[1:]:
        if machine != timed[0][1]:
            raise EadError(
                f"{shown_path(path)} is not a repeat of {shown_path(timed[0][0])} (replayed on {machine}, "
                f"not {timed[0][1]})",
                2,
            )
    for path, report in runs[1:]:
        models, theirs = replayed_models(first), replayed_models(report)
        if models is not None and theirs is not None and models != theirs:
            names, given = (" and ".join(str(name) for name, _ in pair) for pair in (theirs, models))
            raise EadError(
                f"{shown_path(path)} is not a repeat of {shown_path(first_path)} (replayed on {names}, "
                f"not {given})",
                2,
            )
    recorded: dict[tuple[str, str], tuple[Path, tuple[Any, Any]]] = {}
    for path, report in runs:
        for sample in report.get("samples", []):
            strategy, task = sample["strategy"], sample["task_id"]
            figures = (sample["recorded_wall_s"], sample["generated"])
            seen_path, seen = recorded.setdefault((strategy, task), (path, figures))
            if seen != figures:
                raise EadError(
                    f"{shown_path(path)} replays {strategy} on {task} as recorded otherwise than "
                    f"{shown_path(seen_path)}: "
                    "not a repeat",
                    exit_code=2,
                )
    check_same_tasks([(path, tasks_by_strategy(report.get("samples", []))) for path, report in runs])


def replay_machine(report: Mapping[str, Any]) -> str | None:
    """The machine a replay ran on, in a caption's words; None where its report does not record it."""
    return machine_words(report.get("machine"))


def replayed_models(report: Mapping[str, Any]) -> list[tuple[Any, Any]] | None:
    """(file, bytes) of each replayed model, or None where a hand-made report names none."""
    models = report.get("models")
    if not isinstance(models, dict) or not all(isinstance(model, dict) for model in models.values()):
        return None
    return [(model.get("file"), model.get("bytes")) for model in models.values()]


def _is_batch_counts(value: Any) -> bool:
    """role -> phase -> batch size (JSON's text of a number, at least 1) -> count."""
    if not isinstance(value, dict) or not all(isinstance(phases, dict) for phases in value.values()):
        return False
    phases = [(phase, sizes) for by_phase in value.values() for phase, sizes in by_phase.items()]
    return all(
        phase in PHASES
        and isinstance(sizes, dict)
        and all(size.isdecimal() and int(size) >= 1 and is_count(n) for size, n in sizes.items())
        for phase, sizes in phases
    )


# ReplayedStrategy's fields -> (check, what the figure must be): values no replay writes (negative
# seconds, a ratio of 0, a share of 2) had been shown as figures by the median table and bench speed.
_STRATEGY_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "strategy": (lambda value: isinstance(value, str), "text"),
    "samples": (lambda value: is_count(value) and value >= 1, "a count of at least 1"),
    "generated": COUNT,
    "large_share": (is_share, "a share (from 0 to 1)"),
    "pass_at_1": (lambda value: value is None or is_share(value), "a share (from 0 to 1) or null"),
    "passed": (lambda value: value is None or is_count(value), "a count or null"),
    "wall_s": SECONDS,
    "wall_rel": (_is_ratio, "a ratio (above 0) or null"),
    "recorded_wall_s": SECONDS,
    "recorded_wall_rel": (_is_ratio, "a ratio (above 0) or null"),
    "tokens_per_s": (is_amount, "a rate (a number, at least 0)"),
    "batches": (_is_batch_counts, "batch counts by model and phase"),
}


def _report_problem(report: Any) -> str | None:
    """What makes ``report`` no replay report ead can read, or None."""
    if not isinstance(report, dict) or not isinstance(report.get("strategies"), list):
        return "it holds no list of strategies"
    if not report["strategies"]:
        return "it holds no strategies"
    for number, row in enumerate(report["strategies"], 1):
        if not isinstance(row, dict):
            return f"its strategy {number} is not an object"
        for field in fields(ReplayedStrategy):
            if field.name not in row:
                if field.name == "passed":  # a report written before passes were counted: _with_passes
                    continue
                return f"its strategy {number} has no {field.name}"
            check, expected = _STRATEGY_FIELDS[field.name]
            if not check(row[field.name]):
                return f"its strategy {number}'s {field.name} is {row[field.name]!r}, not {expected}"
        if row.get("passed") is not None and row["passed"] > row["samples"]:
            return f"its strategy {number} passed {row['passed']} of its {row['samples']} samples"
    samples = report.get("samples", [])
    if not isinstance(samples, list):
        return "its samples are not a list"
    for number, sample in enumerate(samples, 1):
        if not (
            isinstance(sample, dict)
            and all(isinstance(sample.get(key), str) for key in ("strategy", "task_id"))
            and is_amount(sample.get("recorded_wall_s"))
            and is_count(sample.get("generated"))
        ):
            return f"its sample {number} is not a replayed sample (strategy, task_id, recorded s, generated)"
    return None
